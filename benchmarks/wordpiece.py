"""WordPiece training time (Chapter 7): the course's trainer against a naive loop and against `tokenizers`.

* ``train``: :func:`companion.tokenizers.train_wordpiece` (incremental pair
  counts, lazy heap) against a naive trainer that recounts every pair of every
  word after each merge. Same normalization, same ties, same vocabulary: checked
  before timing. Goal: the course's trainer at least 10x faster.
* ``hf``: the same trainer against Hugging Face ``tokenizers``' ``WordPieceTrainer``
  (Rust) on the same text, from raw text to vocabulary in both. Rust wins; the row
  says by how much. Before timing, the course's trainer given HF's numbering of
  the initial tokens (``tie_break=<HF vocabulary>``) must learn HF's vocabulary
  exactly; HF numbers its ``##c`` forms in a random hash order, so with the
  default tie-break the two may part at ties (see ``companion.tokenizers.wordpiece``).
"""

from __future__ import annotations

from collections import Counter

from benchmarks.common import Row, Settings, paired_median_seconds
from companion.data import load_pydoc_text
from companion.tokenizers.bpe import merge_pair
from companion.tokenizers import BERT_SPECIAL_TOKENS, bert_normalize, bert_pretokenize, train_wordpiece

DEVICES = ("cpu",)  # tokenizer training is string work in Python: the CPU only, by nature


def naive_train_wordpiece(text: str, vocab_size: int) -> dict[str, int]:
    """The textbook loop: after every merge, recount all pairs of all words from scratch."""
    words = Counter(bert_pretokenize(bert_normalize(text)))
    initial = list(BERT_SPECIAL_TOKENS) + sorted({c for w in words for c in w})
    initial += sorted({"##" + c for w in words for c in w[1:]})
    vocab = {t: i for i, t in enumerate(initial)}
    segs = {tuple(vocab[c if i == 0 else "##" + c] for i, c in enumerate(w)): f for w, f in words.items()}
    names = list(initial)
    while len(vocab) < vocab_size:
        counts: Counter = Counter()
        for seg, f in segs.items():
            for pair in zip(seg, seg[1:]):
                counts[pair] += f
        if not counts:
            break
        best = max(counts.values())
        pair = min(p for p, c in counts.items() if c == best)
        token = names[pair[0]] + names[pair[1]].removeprefix("##")
        if token not in vocab:
            vocab[token] = len(names)
            names.append(token)
        new_id = vocab[token]
        merged: Counter = Counter()
        for seg, f in segs.items():
            merged[tuple(merge_pair(seg, pair, new_id))] += f
        segs = merged
    return vocab


def _sizes(settings: Settings) -> tuple[int, int]:
    return (30_000, 500) if settings.quick else (100_000, 800)


def train(settings: Settings) -> list[Row]:
    n_chars, vocab_size = _sizes(settings)
    text = load_pydoc_text()[:n_chars]
    course = train_wordpiece(text, vocab_size)
    if naive_train_wordpiece(text, vocab_size) != course.vocab:
        raise AssertionError("the naive and the course's WordPiece trainers learned different vocabularies")
    t_naive, t_course = paired_median_seconds(lambda: naive_train_wordpiece(text, vocab_size),
                                              lambda: train_wordpiece(text, vocab_size), settings)
    return [Row("WordPiece training: naive / course", f"{n_chars:,} chars of the course corpus, vocab {vocab_size}",
                "naive recount", 1e3 * t_naive, "companion", 1e3 * t_course, "ms")]


def hf(settings: Settings) -> list[Row]:
    import os

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread, like the Python trainer (read at each call)

    n_chars, vocab_size = _sizes(settings)
    text = load_pydoc_text()[:n_chars]

    def hf_train() -> Tokenizer:
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(BERT_SPECIAL_TOKENS),
                                            show_progress=False)
        tok.train_from_iterator([text], trainer)
        return tok

    hf_vocab = hf_train().get_vocab()
    if train_wordpiece(text, vocab_size, tie_break=hf_vocab).vocab != hf_vocab:
        raise AssertionError("given tokenizers' numbering of the initial tokens, the vocabularies should be equal")
    t_course, t_hf = paired_median_seconds(lambda: train_wordpiece(text, vocab_size), hf_train, settings)
    return [Row("WordPiece training: course / tokenizers", f"{n_chars:,} chars, vocab {vocab_size}",
                "companion", 1e3 * t_course, "HF tokenizers (Rust)", 1e3 * t_hf, "ms")]


BENCHMARKS = {"train": train, "hf": hf}
