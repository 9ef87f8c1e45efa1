"""Checks for the Chapter 3 exercises (positional information).

Each case builds inputs, runs the student's code and compares with the
reference in :mod:`companion.positional`.
"""

from __future__ import annotations

import torch

from ..positional import (
    alibi_slopes,
    apply_rope,
    relative_position_bucket,
    relative_positions,
    rope_cos_sin,
    sinusoidal_encoding,
    sinusoidal_shift_matrix,
)
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, register

# ----------------------------------------------------------------- 3.1 sinusoidal


def _sin_small(student):
    expect_tensor(student(7, 10), sinusoidal_encoding(7, 10), name="sinusoidal_encoding(7, 10)")


def _sin_layout(student):
    got = student(3, 4)
    want = sinusoidal_encoding(3, 4)
    if isinstance(got, torch.Tensor) and got.shape == want.shape:
        swapped = want[:, [1, 0, 3, 2]]
        if torch.allclose(got.float(), swapped, atol=1e-5):
            raise CheckFailed("sin and cos are swapped: even features 2i hold sin, odd features 2i+1 hold cos")
        halves = torch.cat((want[:, 0::2], want[:, 1::2]), dim=1)
        if torch.allclose(got.float(), halves, atol=1e-5):
            raise CheckFailed("all sines then all cosines: the paper interleaves them, sin at 2i and cos at 2i+1")
    expect_tensor(got, want, name="sinusoidal_encoding(3, 4)")


def _sin_long(student):
    got = student(1000, 16)
    expect_tensor(got, sinusoidal_encoding(1000, 16), name="sinusoidal_encoding(1000, 16)", atol=1e-4)


def _sin_rotation(student):
    pe = student(60, 12)
    expect_true(isinstance(pe, torch.Tensor) and pe.shape == (60, 12),
                f"expected a tensor of shape (60, 12), got {getattr(pe, 'shape', type(pe).__name__)}")
    r = sinusoidal_shift_matrix(9, 12)
    err = (pe[:51].float() @ r.T - pe[9:].float()).abs().max().item()
    expect_true(err < 1e-4, f"PE(p + 9) should equal R_9 PE(p) for every p; the largest error is {err:.3g}")


register(Exercise(
    id="3.1",
    title="The sinusoidal encoding",
    targets=("sinusoidal_encoding",),
    forbidden=("companion.positional",),  # the reference itself
    cases=(
        Case("values for 7 positions, D = 10", 2, _sin_small),
        Case("sin at even features, cos at odd features", 1, _sin_layout),
        Case("accurate up to position 999", 1, _sin_long),
        Case("PE(p + k) is a rotation of PE(p)", 1, _sin_rotation),
    ),
))


# ----------------------------------------------------------------- 3.2 T5 buckets


def _bucket_case(student, bidirectional, n_buckets, max_distance, rel):
    got = student(rel, bidirectional, n_buckets, max_distance)
    want = relative_position_bucket(rel, bidirectional=bidirectional, n_buckets=n_buckets, max_distance=max_distance)
    expect_tensor(got, want, name=f"buckets (bidirectional={bidirectional}, n_buckets={n_buckets}, "
                                  f"max_distance={max_distance})", atol=0, rtol=0)


def _bucket_encoder(student):
    _bucket_case(student, True, 32, 128, relative_positions(7, 301))


def _bucket_decoder(student):
    _bucket_case(student, False, 32, 128, relative_positions(301))


def _bucket_small_exact(student):
    rel = torch.arange(-7, 8)
    _bucket_case(student, True, 32, 128, rel)
    _bucket_case(student, False, 32, 128, rel)


def _bucket_other_sizes(student):
    rel = torch.arange(-500, 501)
    for nb, md in ((8, 20), (13, 7), (33, 100)):
        for bidirectional in (True, False):
            _bucket_case(student, bidirectional, nb, md, rel)


register(Exercise(
    id="3.2",
    title="T5's relative position buckets",
    targets=("t5_bucket",),
    forbidden=("companion.positional",),  # the reference itself
    cases=(
        Case("small distances get one bucket each", 1, _bucket_small_exact),
        Case("bidirectional (encoder), T = 7, S = 301", 2, _bucket_encoder),
        Case("causal (decoder), T = S = 301", 2, _bucket_decoder),
        Case("other sizes: n_buckets 8, 13, 33", 2, _bucket_other_sizes),
    ),
))


# ----------------------------------------------------------------- 3.3 RoPE


def _rope_ref(x, positions):
    return apply_rope(x, *rope_cos_sin(positions, x.shape[-1]))


def _rope_values(student):
    x = torch.randn(2, 3, 7, 12)
    pos = torch.arange(7)
    expect_tensor(student(x, pos), _rope_ref(x, pos), name="rope_half(x of shape (2, 3, 7, 12), positions 0..6)")


def _rope_positions(student):
    x = torch.randn(1, 2, 5, 8)
    pos = torch.tensor([3, 10, 11, 40, 99])
    expect_tensor(student(x, pos), _rope_ref(x, pos), name="rope_half with positions [3, 10, 11, 40, 99]")


def _rope_layout(student):
    x = torch.randn(4, 6)
    pos = torch.arange(1, 5)
    got = student(x, pos)
    inter = apply_rope(x, *rope_cos_sin(pos, 6, layout="interleaved"), layout="interleaved")
    if isinstance(got, torch.Tensor) and got.shape == inter.shape and torch.allclose(got, inter, atol=1e-5):
        raise CheckFailed("this is the interleaved layout (pairs 2i, 2i+1); the exercise asks for the half layout "
                          "(pairs i, i + Dh/2, as HF Llama's rotate_half)")
    expect_tensor(got, _rope_ref(x, pos), name="rope_half(x of shape (4, 6))")


def _rope_offset(student):
    q, k = torch.randn(1, 16), torch.randn(1, 16)

    def score(m, n):
        rq = student(q, torch.tensor([m]))
        rk = student(k, torch.tensor([n]))
        return (rq * rk).sum().item()

    a, b = score(2, 7), score(102, 107)
    expect_true(abs(a - b) < 1e-3, f"q.k should depend only on n - m: positions (2, 7) give {a:.5f}, (102, 107) give {b:.5f}")


register(Exercise(
    id="3.3",
    title="Rotary position embedding (half layout)",
    targets=("rope_half",),
    forbidden=("companion.positional",),  # the reference itself
    cases=(
        Case("random queries (B=2, H=3, T=7, Dh=12)", 2, _rope_values),
        Case("arbitrary positions", 1, _rope_positions),
        Case("half layout, one head (T=4, Dh=6)", 1, _rope_layout),
        Case("q . k depends only on the offset", 1, _rope_offset),
    ),
))


# ----------------------------------------------------------------- 3.4 ALiBi slopes


def _slopes_case(student, n):
    expect_tensor(student(n), alibi_slopes(n), name=f"alibi_slopes({n})")


def _slopes_eight(student):
    _slopes_case(student, 8)


def _slopes_powers(student):
    for n in (1, 2, 4, 16, 32):
        _slopes_case(student, n)


def _slopes_other(student):
    for n in (3, 5, 6, 12, 20):
        _slopes_case(student, n)


register(Exercise(
    id="3.4",
    title="ALiBi slopes",
    targets=("alibi_slopes",),
    forbidden=("companion.positional",),  # the reference itself
    cases=(
        Case("8 heads: 1/2, 1/4, ..., 1/256", 1, _slopes_eight),
        Case("other powers of two (1, 2, 4, 16, 32)", 2, _slopes_powers),
        Case("head counts that are not powers of two (3, 5, 6, 12, 20)", 2, _slopes_other),
    ),
))
