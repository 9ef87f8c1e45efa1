"""Checks for the Chapter 11 exercises (T5 and BART).

References: the Viterbi search of :class:`companion.tokenizers.unigram.UnigramTokenizer`
(compared by total score, since ties may be broken either way),
:func:`companion.span_corruption.span_corrupt` and
:func:`companion.span_corruption.compute_input_and_target_lengths`,
:func:`companion.attention.scaled_dot_product_attention` with ``scale=1`` and a bias
(T5's attention), and a plain loop for BART's text infilling with given spans.
"""

from __future__ import annotations

import math
import random

import torch

from ..attention import scaled_dot_product_attention
from ..span_corruption import compute_input_and_target_lengths, random_spans_noise_mask, span_corrupt
from ..tokenizers.unigram import UnigramTokenizer, load_course_unigram
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, register


# ----------------------------------------------------------------- 11.1 Unigram segmentation (Viterbi)

def _seg_case(student, text, scores, what):
    ref = UnigramTokenizer(list(scores.items()), n_sentinels=0)
    best = sum(scores[p] for p in ref._viterbi(text))
    got = student(text, dict(scores))
    expect_true(isinstance(got, list) and all(isinstance(p, str) for p in got),
                f"{what}: unigram_segment must return a list of str, got {type(got).__name__}")
    expect_true("".join(got) == text, f"{what}: the pieces {got[:8]}... do not spell the text {text!r}")
    unknown = [p for p in got if p not in scores]
    expect_true(not unknown, f"{what}: pieces not in the vocabulary: {unknown[:5]}")
    total = sum(scores[p] for p in got)
    if not math.isclose(total, best, rel_tol=0, abs_tol=1e-9):
        raise CheckFailed(f"{what}: your segmentation scores {total:.4f}, the best one scores {best:.4f}")


_GREEDY_TRAP = {"a": -1.0, "b": -1.0, "c": -1.0, "ab": -1.5, "bc": -1.0, "abc": -5.0}


def _seg_random(student, seed):
    rng = random.Random(seed)
    alphabet = "abcd"
    scores = {c: -rng.uniform(2, 6) for c in alphabet}
    while len(scores) < 40:
        piece = "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 5)))
        scores[piece] = -rng.uniform(1, 9)
    for k in range(5):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 23)))
        _seg_case(student, text, scores, f"random vocabulary of 40 pieces, text {text!r}")


def _seg_course(student):
    tok = load_course_unigram()
    scores = dict(tok.pieces)
    for word in ("\u2581relative\u2581position\u2581buckets", "\u2581span\u2581corruption", "\u2581x"):
        _seg_case(student, word, scores, f"the course tokenizer's 1,997 pieces, text {word!r}")


register(Exercise(
    id="11.1",
    title="Unigram segmentation with Viterbi",
    targets=("unigram_segment",),
    forbidden=("sentencepiece", "tokenizers", "companion.tokenizers"),
    cases=(
        Case("longest match first is not the best", 2, lambda s: _seg_case(s, "abc", _GREEDY_TRAP, "text 'abc'")),
        Case("a single character and the empty text", 1, lambda s: (
            _seg_case(s, "b", _GREEDY_TRAP, "text 'b'"), _seg_case(s, "", _GREEDY_TRAP, "the empty text"))),
        Case("random vocabularies and texts", 2, lambda s: _seg_random(s, 0)),
        Case("the course tokenizer's vocabulary", 1, lambda s: _seg_course(s)),
    ),
))


# ----------------------------------------------------------------- 11.2 span corruption: T5's inputs and targets

def _sc_case(student, ids, mask, vocab_size, eos_id, what):
    want = span_corrupt(ids, torch.tensor(mask), vocab_size, eos_id)
    got = student(list(ids), list(mask), vocab_size, eos_id)
    expect_true(isinstance(got, tuple) and len(got) == 2,
                f"{what}: span_corrupt must return (inputs, targets), got {type(got).__name__}")
    for name, g, w in (("inputs", got[0], want[0]), ("targets", got[1], want[1])):
        g = [int(x) for x in g]
        if g != w:
            raise CheckFailed(f"{what}: {name} should be {w}, got {g}")


def _sc_random(student, length, seed, reference_mask):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 90, (length,), generator=g).tolist()
    if reference_mask:
        mask = random_spans_noise_mask(length, 0.15, 3.0, generator=g).tolist()
    else:
        mask = (torch.rand(length, generator=g) < 0.3).tolist()
    _sc_case(student, ids, mask, 100, 1, f"length {length}, {'T5' if reference_mask else 'arbitrary'} noise mask")


_DOG = [10, 11, 12, 13, 14, 15, 16, 17, 18]  # The quick brown fox jumps over the lazy dog


register(Exercise(
    id="11.2",
    title="Span corruption in T5's format",
    targets=("t5_span_corrupt",),
    forbidden=("companion.span_corruption",),
    cases=(
        Case("the sequence ends with a noise span (no final sentinel in the target)", 2, lambda s: _sc_case(
            s, _DOG, [0, 0, 0, 1, 0, 0, 0, 1, 1], 100, 1, "noise 'fox' and 'lazy dog'")),
        Case("the sequence ends with kept tokens (a final sentinel in the target)", 2, lambda s: _sc_case(
            s, _DOG, [0, 0, 1, 1, 0, 0, 1, 0, 0], 100, 1, "noise 'brown fox' and 'the'")),
        Case("no noise at all, and noise from the first token", 1, lambda s: (
            _sc_case(s, _DOG[:4], [0, 0, 0, 0], 50, 1, "no noise"),
            _sc_case(s, _DOG[:5], [1, 1, 0, 1, 0], 50, 2, "noise first, EOS id 2"))),
        Case("T5's noise masks on odd lengths", 1, lambda s: [_sc_random(s, n, n, True) for n in (7, 31, 101)]),
        Case("arbitrary masks", 1, lambda s: [_sc_random(s, n, n, False) for n in (13, 40)]),
    ),
))


# ----------------------------------------------------------------- 11.3 how many raw tokens for 512 inputs

def _len_case(student, inputs_length, density, mean_span):
    want = compute_input_and_target_lengths(inputs_length, density, mean_span)
    got = student(inputs_length, density, mean_span)
    expect_true(isinstance(got, tuple) and len(got) == 2,
                f"corruption_lengths must return (n_tokens, targets_length), got {got!r}")
    got = (int(got[0]), int(got[1]))
    if got != want:
        raise CheckFailed(f"inputs_length={inputs_length}, noise_density={density}, mean span {mean_span}: "
                          f"expected (n_tokens, targets_length) = {want}, got {got}")


register(Exercise(
    id="11.3",
    title="Raw tokens and target length for a span-corrupted input",
    targets=("corruption_lengths",),
    forbidden=("companion.span_corruption",),
    cases=(
        Case("T5's setting: 512 inputs", 2, lambda s: _len_case(s, 512, 0.15, 3.0)),
        Case("other lengths", 2, lambda s: [_len_case(s, n, 0.15, 3.0) for n in (64, 127, 1024)]),
        Case("other densities and span lengths", 2, lambda s: [
            _len_case(s, n, d, m) for n, d, m in ((512, 0.3, 8.0), (256, 0.25, 2.0), (100, 0.1, 1.0))]),
    ),
))


# ----------------------------------------------------------------- 11.4 T5's attention: no scaling, a bias

def _att_case(student, b, h, t, s, dh, seed, mask_kind, what):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, dh, generator=g) for n in (t, s, s))
    bias = torch.randn(1, h, t, s, generator=g)
    mask = None
    if mask_kind == "padding":
        lengths = torch.randint(1, s + 1, (b,), generator=g)
        mask = (torch.arange(s) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)
    elif mask_kind == "causal":
        mask = torch.ones(t, s, dtype=torch.bool).tril(s - t)
    want = scaled_dot_product_attention(q, k, v, mask, bias=bias, scale=1.0)
    got = student(q.clone(), k.clone(), v.clone(), bias.clone(), None if mask is None else mask.clone())
    expect_tensor(got, want, name=f"T5 attention ({what})")


register(Exercise(
    id="11.4",
    title="T5's attention: a position bias and no 1/sqrt(d) scaling",
    targets=("t5_attention",),
    forbidden=("companion.attention", "torch.nn.functional.scaled_dot_product_attention", "transformers"),
    cases=(
        Case("no mask (B=2, H=3, T=S=5, d_kv=64)", 2, lambda s: _att_case(s, 2, 3, 5, 5, 64, 0, None, "no mask")),
        Case("padding mask on the keys (B=3, T=4, S=7)", 2, lambda s: _att_case(
            s, 3, 2, 4, 7, 8, 1, "padding", "padding mask")),
        Case("causal mask (decoder self-attention, T=S=6)", 1, lambda s: _att_case(
            s, 1, 4, 6, 6, 16, 2, "causal", "causal mask")),
        Case("cross-attention shapes (T=3 queries, S=9 keys, d_kv=5)", 1, lambda s: _att_case(
            s, 2, 2, 3, 9, 5, 3, None, "T=3, S=9")),
    ),
))


# ----------------------------------------------------------------- 11.5 BART's text infilling with given spans

def _infill_reference(ids, spans, mask_id):
    out, pos = [], 0
    for start, length in spans:
        out.extend(ids[pos:start])
        out.append(mask_id)
        pos = start + length
    return out + ids[pos:]


def _infill_case(student, ids, spans, mask_id, what):
    want = _infill_reference(ids, spans, mask_id)
    got = student(list(ids), [tuple(x) for x in spans], mask_id)
    expect_true(isinstance(got, list), f"{what}: text_infill must return a list, got {type(got).__name__}")
    got = [int(x) for x in got]
    if got != want:
        raise CheckFailed(f"{what}: expected {want}, got {got}")


def _infill_random(student, n, seed):
    rng = random.Random(seed)
    ids = [rng.randrange(5, 60) for _ in range(n)]
    spans, pos = [], 0
    while pos < n:
        start = rng.randint(pos, n - 1)
        length = min(rng.choice([0, 1, 2, 3, 3, 4, 6]), n - start)
        spans.append((start, length))
        pos = start + max(length, 1)
        if rng.random() < 0.3:
            break
    _infill_case(student, ids, spans, 4, f"{n} tokens, spans {spans}")


register(Exercise(
    id="11.5",
    title="BART's text infilling with given spans",
    targets=("text_infill",),
    forbidden=("companion.noising",),
    cases=(
        Case("one span of 3 tokens becomes one mask", 2, lambda s: _infill_case(
            s, [10, 11, 12, 13, 14, 15], [(1, 3)], 4, "span (1, 3)")),
        Case("a span of length 0 inserts a mask", 2, lambda s: _infill_case(
            s, [10, 11, 12, 13], [(2, 0)], 4, "span (2, 0)")),
        Case("spans at both ends, adjacent spans", 1, lambda s: (
            _infill_case(s, [10, 11, 12, 13, 14], [(0, 2), (4, 1)], 4, "spans (0, 2), (4, 1)"),
            _infill_case(s, [10, 11, 12, 13, 14], [(1, 1), (2, 2)], 4, "adjacent spans (1, 1), (2, 2)"))),
        Case("random spans, no spans", 1, lambda s: (
            [_infill_random(s, n, n) for n in (9, 17, 30)], _infill_case(s, [7, 8], [], 4, "no spans"))),
    ),
))
