"""Span corruption checked against T5's published numbers and a naive re-implementation."""
import random

import pytest
import torch

from companion.span_corruption import (compute_input_and_target_lengths, noise_counts,
                                       random_spans_noise_mask, span_corrupt)


def test_published_lengths():
    # T5 reference / paper setting: 568 raw tokens -> 512 inputs, 114 targets
    assert compute_input_and_target_lengths(512, 0.15, 3.0) == (568, 114)


@pytest.mark.parametrize("length", [2, 7, 20, 97, 512])
def test_mask_counts(length):
    g = torch.Generator().manual_seed(length)
    num_noise = min(max(round(length * 0.15), 1), length - 1)
    num_spans = max(round(num_noise / 3), 1)
    for _ in range(20):
        m = random_spans_noise_mask(length, 0.15, 3.0, generator=g)
        assert m.shape == (length,) and int(m.sum()) == num_noise
        starts = int((m[1:] & ~m[:-1]).sum()) + int(m[0])
        assert starts == num_spans
        assert not m[0] and m[-1]


def _naive_span_lengths(length, density, mean, rng):
    """Reference algorithm written with lists: cut num_noise items into num_spans segments."""
    num_noise = min(max(round(length * density), 1), length - 1)
    num_spans = max(round(num_noise / mean), 1)
    first = [True] * (num_spans - 1) + [False] * (num_noise - num_spans)
    rng.shuffle(first)
    lengths, cur = [], 1
    for f in first:
        if f:
            lengths.append(cur)
            cur = 1
        else:
            cur += 1
    return lengths + [cur]


def test_span_length_distribution_matches_reference():
    length, n = 200, 1500
    g = torch.Generator().manual_seed(0)
    ours = []
    for _ in range(n):
        m = random_spans_noise_mask(length, 0.15, 3.0, generator=g).tolist()
        run = 0
        for x in m + [False]:
            if x:
                run += 1
            elif run:
                ours.append(run)
                run = 0
    rng = random.Random(0)
    ref = [s for _ in range(n) for s in _naive_span_lengths(length, 0.15, 3.0, rng)]
    assert len(ours) == len(ref) == n * 10  # 30 noise tokens in 10 spans
    assert sum(ours) / len(ours) == pytest.approx(3.0)
    # chi-square over span-length bins 1..5 and >=6
    bins = lambda xs: [sum(1 for x in xs if x == k) for k in range(1, 6)] + [sum(1 for x in xs if x >= 6)]
    o, r = bins(ours), bins(ref)
    chi2 = sum((a - b) ** 2 / (a + b) for a, b in zip(o, r) if a + b)
    assert chi2 < 20.5  # 5 degrees of freedom, p ~ 0.001


def test_span_corrupt_format():
    vocab = 100
    ids = [10, 11, 12, 13, 14, 15, 16]
    mask = [False, True, True, False, False, True, False]
    inputs, targets = span_corrupt(ids, mask, vocab, eos_id=1)
    assert inputs == [10, 99, 13, 14, 98, 16, 1]
    assert targets == [99, 11, 12, 98, 15, 97, 1]


def test_errors():
    with pytest.raises(ValueError, match="noise_density"):
        noise_counts(10, 1.5, 3)
    with pytest.raises(ValueError, match="noise_mask"):
        span_corrupt([1, 2], [True], 10, 1)
