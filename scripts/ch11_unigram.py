"""Train the course's Unigram tokenizer (Chapter 11) and ship it.

Writes companion/checkpoints/ch11_unigram.json (pieces and log-probabilities,
2,000 SentencePiece pieces + 100 sentinels). Trains twice and stops if the two
vocabularies differ. Takes a few seconds on one thread.

    python scripts/ch11_unigram.py
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

from companion.tokenizers.unigram import COURSE_FILE, course_lines, train_unigram

OUT = Path(__file__).resolve().parents[1] / "companion" / "checkpoints" / COURSE_FILE


def main() -> None:
    lines = course_lines()
    t0 = time.perf_counter()
    tok, model = train_unigram(lines, n_pieces=2000, n_sentinels=100, return_model=True)
    seconds = time.perf_counter() - t0
    tok2, model2 = train_unigram(lines, n_pieces=2000, n_sentinels=100, return_model=True)
    if model != model2 or tok.pieces != tok2.pieces:
        raise SystemExit("two trainings gave different vocabularies")
    tok.save(OUT)
    print(f"trained in {seconds:.1f} s; vocab_size {tok.vocab_size}; "
          f"model sha256 {hashlib.sha256(model).hexdigest()[:16]}; wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
