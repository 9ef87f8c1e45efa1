"""A SentencePiece Unigram tokenizer with T5's special tokens (Chapter 11).

Training uses the ``sentencepiece`` library (the tokenizer library T5 itself
used, preinstalled on Colab): :func:`train_unigram` runs its Unigram trainer
(EM over a large seed vocabulary, then pruning to ``n_pieces``) with one
thread and a fixed seed, which gives the same vocabulary on every run.
Encoding is written here from scratch: a Unigram model scores a segmentation
by the sum of its pieces' log-probabilities, and :meth:`UnigramTokenizer.encode`
finds the best one with Viterbi over the characters (``tests/test_unigram.py``
checks it against ``sentencepiece`` on the course corpus).

Ids follow T5: ``<pad>`` = 0, ``</s>`` (EOS) = 1, ``<unk>`` = 2, then the
learned pieces, then ``n_sentinels`` sentinels appended at the end of the
vocabulary in reverse order, so ``<extra_id_0>`` is ``vocab_size - 1``
(as :func:`companion.span_corruption.sentinel_id` counts them).

Text is normalized as SentencePiece does with the ``identity`` rule and a
dummy prefix: each space becomes ``▁`` (U+2581) and one ``▁`` is put in
front, so ``decode(encode(text)) == text`` for text whose characters are all
in the vocabulary. A sentinel written in the text (``<extra_id_3>``) is one
token. A character never seen in training becomes ``<unk>``.
"""
from __future__ import annotations

import io
import json
import math
import re
from importlib import resources
from pathlib import Path
from typing import Iterable, Sequence

__all__ = [
    "PAD_ID", "EOS_ID", "UNK_ID", "SPECIAL_TOKENS", "SPACE", "UnigramTokenizer", "train_unigram",
    "load_course_unigram",
]

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")
SPACE = "\u2581"
SENTINEL_RE = re.compile(r"<extra_id_(\d+)>")
UNK_PENALTY = 10.0  # SentencePiece scores an unknown character min_score - 10
COURSE_FILE = "ch11_unigram.json"


class UnigramTokenizer:
    """Unigram tokenizer: ``pieces`` are ``(piece, log_prob)`` pairs for ids 3, 4, ...

    ``vocab_size = 3 + len(pieces) + n_sentinels``.
    """

    def __init__(self, pieces: Sequence[tuple[str, float]], n_sentinels: int = 100) -> None:
        if not isinstance(n_sentinels, int) or n_sentinels < 0:
            raise ValueError(f"n_sentinels must be an integer >= 0, got {n_sentinels!r}")
        if len(pieces) == 0:
            raise ValueError("pieces is empty: expected (piece, log_prob) pairs")
        self.pieces = [(str(p), float(s)) for p, s in pieces]
        self.n_sentinels = n_sentinels
        tokens = list(SPECIAL_TOKENS) + [p for p, _ in self.pieces]
        tokens += [f"<extra_id_{i}>" for i in reversed(range(n_sentinels))]
        if len(set(tokens)) != len(tokens):
            raise ValueError("pieces repeat a piece or a special token")
        self.id_to_token = tokens
        self.token_to_id = {t: i for i, t in enumerate(tokens)}
        self._score = {p: s for p, s in self.pieces}
        self._max_len = max(len(p) for p, _ in self.pieces)
        self._unk_score = min(s for _, s in self.pieces) - UNK_PENALTY

    @property
    def vocab_size(self) -> int:
        return len(self.id_to_token)

    def sentinel_id(self, i: int) -> int:
        """Id of ``<extra_id_i>``: ``vocab_size - 1 - i``."""
        if not isinstance(i, int) or not 0 <= i < self.n_sentinels:
            raise ValueError(f"sentinel index must be an integer in [0, {self.n_sentinels}), got {i!r}")
        return self.vocab_size - 1 - i

    def _viterbi(self, chars: str) -> list[str]:
        """Best segmentation of ``chars`` (already normalized) into pieces; unknown chars as one piece each."""
        n = len(chars)
        best = [-math.inf] * (n + 1)
        back: list[tuple[int, bool]] = [(0, False)] * (n + 1)
        best[0] = 0.0
        for end in range(1, n + 1):
            for start in range(max(0, end - self._max_len), end):
                if best[start] == -math.inf:
                    continue
                score = self._score.get(chars[start:end])
                if score is not None and best[start] + score > best[end]:
                    best[end], back[end] = best[start] + score, (start, False)
            if best[end] == -math.inf:  # no piece ends here: the last char is unknown
                best[end], back[end] = best[end - 1] + self._unk_score, (end - 1, True)
        out, end = [], n
        while end > 0:
            start, _ = back[end]
            out.append(chars[start:end])
            end = start
        return out[::-1]

    def tokenize(self, text: str) -> list[str]:
        """Pieces of ``text`` (unknown characters stay as themselves; :meth:`encode` maps them to ``<unk>``)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        normalized = SPACE + text.replace(" ", SPACE)
        out: list[str] = []
        pos = 0
        for m in SENTINEL_RE.finditer(normalized):
            if int(m.group(1)) >= self.n_sentinels:
                continue  # not a sentinel of this vocabulary: plain text
            out += self._viterbi(normalized[pos:m.start()])
            out.append(m.group(0))
            pos = m.end()
        return out + self._viterbi(normalized[pos:])

    def encode(self, text: str, add_eos: bool = False) -> list[int]:
        """Token ids of ``text`` (then EOS if ``add_eos``)."""
        ids = [self.token_to_id.get(p, UNK_ID) for p in self.tokenize(text)]
        return ids + [EOS_ID] if add_eos else ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of ``ids``; PAD and EOS are dropped when ``skip_special``, ``<unk>`` is written as ``\u2047``."""
        parts = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id must be in [0, {self.vocab_size}), got {i}")
            if i in (PAD_ID, EOS_ID):
                if not skip_special:
                    parts.append(self.id_to_token[i])
                continue
            parts.append(" \u2047 " if i == UNK_ID else self.id_to_token[i])
        text = "".join(parts).replace(SPACE, " ")
        return text[1:] if text.startswith(" ") else text

    def to_dict(self) -> dict:
        return {"pieces": [[p, s] for p, s in self.pieces], "n_sentinels": self.n_sentinels}

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), ensure_ascii=False), encoding="utf-8")

    @classmethod
    def from_dict(cls, d: dict) -> "UnigramTokenizer":
        return cls([tuple(x) for x in d["pieces"]], d["n_sentinels"])

    @classmethod
    def load(cls, path) -> "UnigramTokenizer":
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


def train_unigram(lines: Sequence[str], n_pieces: int = 2000, n_sentinels: int = 100,
                  return_model: bool = False):
    """Train SentencePiece Unigram on ``lines`` (one thread, seed 0); returns a :class:`UnigramTokenizer`.

    ``n_pieces`` counts SentencePiece's vocabulary (the 3 special tokens
    included), so ``vocab_size = n_pieces + n_sentinels``, like T5's
    32,000 + 100. With ``return_model`` also returns SentencePiece's
    serialized model (bytes).
    """
    try:
        import sentencepiece as spm
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("train_unigram needs the sentencepiece package: pip install sentencepiece") from e
    lines = [str(x) for x in lines if str(x).strip()]
    if not lines:
        raise ValueError("lines holds no text to train on")
    if not isinstance(n_pieces, int) or n_pieces <= len(SPECIAL_TOKENS):
        raise ValueError(f"n_pieces must be an integer > {len(SPECIAL_TOKENS)}, got {n_pieces!r}")
    spm.set_random_generator_seed(0)
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buf, vocab_size=n_pieces, model_type="unigram",
        num_threads=1, character_coverage=1.0, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=True, split_digits=False,
        pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1, input_sentence_size=0,
        shuffle_input_sentence=False, max_sentence_length=1 << 20, minloglevel=2,
    )
    model = buf.getvalue()
    sp = spm.SentencePieceProcessor(model_proto=model)
    pieces = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(len(SPECIAL_TOKENS), sp.get_piece_size())]
    tok = UnigramTokenizer(pieces, n_sentinels)
    return (tok, model) if return_model else tok


def course_lines() -> list[str]:
    """The lines of the course corpus (``companion.corpus``) that the course tokenizer is trained on."""
    from companion.corpus import load_text
    return [line for line in load_text().split("\n") if line.strip()]


def load_course_unigram() -> UnigramTokenizer:
    """The tokenizer shipped in ``companion/checkpoints/ch11_unigram.json`` (``scripts/ch11_unigram.py``)."""
    ref = resources.files("companion.checkpoints") / COURSE_FILE
    return UnigramTokenizer.from_dict(json.loads(ref.read_text(encoding="utf-8")))
