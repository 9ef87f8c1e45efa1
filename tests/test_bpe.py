"""Byte-level BPE (Chapter 9) against Hugging Face `tokenizers` and a naive reference."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from companion.data import load_pydoc_text
from companion.tokenizers import bytes_to_unicode, merge_pair, pair_counts, pretokenize, train_bpe


@pytest.fixture(scope="module")
def text() -> str:
    return load_pydoc_text()[:40_000]


def _hf_bpe(text: str, vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False, min_frequency=0)
    tok.train_from_iterator([text], trainer)
    return tok


def _printable(tok, i: int) -> str:
    b2u = bytes_to_unicode()
    return "".join(b2u[b] for b in tok.vocab[i])


def test_merge_pair_by_hand():
    assert merge_pair([5, 5, 5, 6], (5, 5), 9) == [9, 5, 6]  # left to right, no overlap
    assert merge_pair([1, 2, 3, 1, 2], (1, 2), 7) == [7, 3, 7]
    assert merge_pair([1], (1, 2), 7) == [1]
    assert merge_pair([], (1, 2), 7) == []


def test_pair_counts_by_hand():
    counts = pair_counts({(1, 2, 3): 2, (2, 3): 5})
    assert counts == Counter({(1, 2): 2, (2, 3): 7})


def test_pretokenize_matches_hf_byte_level():
    sample = "Hello  world's 3.14 café\n\n  x=1"
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    b2u = bytes_to_unicode()
    hf = [piece for piece, _ in pre.pre_tokenize_str(sample)]
    ours = ["".join(b2u[b] for b in w.encode("utf-8")) for w in pretokenize(sample)]
    assert ours == hf


def test_merges_vocab_and_encodings_equal_hf(text):
    ours = train_bpe(text, 300, tie_break="hf")
    hf = _hf_bpe(text, 300)
    hf_merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in json.loads(hf.to_str())["model"]["merges"]]
    ours_merges = [(_printable(ours, m.pair[0]), _printable(ours, m.pair[1])) for m in ours.merges]
    assert ours_merges == hf_merges
    assert {_printable(ours, i) for i in ours.vocab} == set(hf.get_vocab())
    probe = load_pydoc_text()[-3000:]  # text not used for training
    assert [_printable(ours, i) for i in ours.encode(probe)] == [hf.id_to_token(i) for i in hf.encode(probe).ids]


def test_default_tie_break_differs_only_on_ties(text):
    a, b = train_bpe(text, 300), train_bpe(text, 300, tie_break="hf")
    first = next((i for i, (x, y) in enumerate(zip(a.merges, b.merges)) if x.token != y.token), None)
    if first is not None:  # the runs part at a step where two pairs had the same count
        assert a.merges[first].count == b.merges[first].count


def test_incremental_training_equals_naive_recount(text):
    sample = text[:5000]
    tok = train_bpe(sample, 256 + 40)
    words = Counter(tuple(w.encode("utf-8")) for w in pretokenize(sample))
    next_id = 256
    for step in tok.merges:
        counts = pair_counts(words)
        best = max(counts.values())
        pair = min(p for p, c in counts.items() if c == best)  # smallest ids among ties
        assert (step.pair, step.count, step.new_id) == (pair, best, next_id)
        words = Counter({tuple(merge_pair(w, pair, next_id)): f for w, f in words.items()})
        next_id += 1


def test_roundtrip_and_compression(text):
    tok = train_bpe(text, 400)
    sample = "def f(x):\n    return x ** 2  # naïve ✓\n" + text[-500:]
    ids = tok.encode(sample)
    assert tok.decode(ids) == sample
    assert len(ids) < len(sample.encode("utf-8"))
    assert tok.vocab_size == 400
    word, steps = tok.encode_word(" function", return_steps=True)
    assert steps[0] == list(b" function") and steps[-1] == word
    assert all(len(s2) < len(s1) for s1, s2 in zip(steps, steps[1:]))


def test_errors():
    with pytest.raises(ValueError, match="256"):
        train_bpe("abc", 100)
    with pytest.raises(ValueError, match="tie_break"):
        train_bpe("abc", 260, tie_break="random")
    with pytest.raises(TypeError):
        pretokenize(b"bytes")
    tok = train_bpe("abab", 257)
    with pytest.raises(ValueError, match="vocabulary"):
        tok.decode([999])


def test_min_frequency_stops_training():
    tok = train_bpe("ab ab ab cd", 300, min_frequency=2)
    assert all(m.count >= 2 for m in tok.merges) and len(tok.merges) >= 1
