"""Tests of companion.tokenizers.unigram (Chapter 11's SentencePiece Unigram tokenizer)."""
from __future__ import annotations

import itertools
import math
import random

import pytest

from companion.span_corruption import sentinel_id
from companion.tokenizers.unigram import (
    EOS_ID, PAD_ID, UNK_ID, UnigramTokenizer, course_lines, load_course_unigram, train_unigram,
)


@pytest.fixture(scope="module")
def tok():
    return load_course_unigram()


def brute_force_best(tok, chars):
    """Best segmentation by enumerating every cut (independent of the Viterbi code)."""
    best, best_score = None, -math.inf
    for cuts in itertools.product([False, True], repeat=len(chars) - 1):
        pieces, start = [], 0
        for i, cut in enumerate(cuts, 1):
            if cut:
                pieces.append(chars[start:i])
                start = i
        pieces.append(chars[start:])
        scores = [tok._score.get(p) for p in pieces]
        if None in scores:
            continue
        if sum(scores) > best_score:
            best, best_score = pieces, sum(scores)
    return best, best_score


def test_special_ids_and_sentinels_at_the_end(tok):
    assert (tok.id_to_token[PAD_ID], tok.id_to_token[EOS_ID], tok.id_to_token[UNK_ID]) == ("<pad>", "</s>", "<unk>")
    assert tok.vocab_size == 2100
    assert tok.token_to_id["<extra_id_0>"] == tok.vocab_size - 1
    assert tok.token_to_id["<extra_id_99>"] == tok.vocab_size - 100
    for i in (0, 1, 57, 99):
        assert tok.sentinel_id(i) == sentinel_id(i, tok.vocab_size)
    with pytest.raises(ValueError, match="sentinel index"):
        tok.sentinel_id(100)


def test_sentinel_in_text_is_one_token(tok):
    ids = tok.encode("The quick brown <extra_id_0> jumps over the lazy <extra_id_1>", add_eos=True)
    assert ids.count(tok.vocab_size - 1) == 1 and ids.count(tok.vocab_size - 2) == 1
    assert ids[-1] == EOS_ID
    assert tok.decode(ids) == "The quick brown <extra_id_0> jumps over the lazy <extra_id_1>"
    # an index beyond the sentinels is plain text
    assert tok.vocab_size - 1 - 100 not in tok.encode("<extra_id_100>")


def test_round_trip_on_corpus_lines(tok):
    rng = random.Random(0)
    lines = course_lines()
    for line in rng.sample(lines, 300):
        ids = tok.encode(line)
        assert UNK_ID not in ids
        assert tok.decode(ids) == line


def test_unknown_character_is_unk(tok):
    ids = tok.encode("a\u4e2db")
    assert UNK_ID in ids
    assert "\u2047" in tok.decode(ids)


def test_viterbi_is_the_best_segmentation(tok):
    rng = random.Random(1)
    words = [w for w in " ".join(course_lines()[:400]).split() if 3 <= len(w) <= 11]
    for w in rng.sample(words, 60):
        chars = "\u2581" + w
        expected, score = brute_force_best(tok, chars)
        got = tok._viterbi(chars)
        assert sum(tok._score[p] for p in got) == pytest.approx(score, abs=1e-9), (w, got, expected)


def test_matches_sentencepiece_and_training_is_deterministic(tok):
    spm = pytest.importorskip("sentencepiece")
    lines = course_lines()
    trained, model = train_unigram(lines, n_pieces=2000, n_sentinels=100, return_model=True)
    _, model2 = train_unigram(lines, n_pieces=2000, n_sentinels=100, return_model=True)
    assert model == model2, "two trainings gave different models"
    # same pieces in the same order; scores to float32 precision (the shipped file is the reference)
    assert [p for p, _ in trained.pieces] == [p for p, _ in tok.pieces], "the shipped vocabulary is not what training gives"
    assert all(abs(a - b) <= 1e-4 * max(1.0, abs(b)) for (_, a), (_, b) in zip(trained.pieces, tok.pieces))
    sp = spm.SentencePieceProcessor(model_proto=model)
    rng = random.Random(2)
    sample = rng.sample(lines, 400)
    mismatches = [line for line in sample if sp.encode(line) != tok.encode(line)]
    assert not mismatches, mismatches[:3]


def test_input_validation(tok):
    with pytest.raises(TypeError, match="str"):
        tok.encode(["a"])
    with pytest.raises(ValueError, match="token id"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError, match="n_sentinels"):
        UnigramTokenizer([("a", -1.0)], n_sentinels=-1)
    with pytest.raises(ValueError, match="empty"):
        UnigramTokenizer([], n_sentinels=3)


def test_save_load(tok, tmp_path):
    tok.save(tmp_path / "t.json")
    again = UnigramTokenizer.load(tmp_path / "t.json")
    assert again.id_to_token == tok.id_to_token and again.pieces == tok.pieces
