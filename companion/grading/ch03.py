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
    rope_cos_sin,
    sinusoidal_encoding,
    sinusoidal_shift_matrix,
)
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, register

# ----------------------------------------------------------------- 3.1 shifting an encoding


def _pe_at(positions, d_model):
    """The sinusoidal encoding at any (float64) positions, shape (*positions.shape, D), in float64.

    Written from the formula, not with the package's table, so that fractional and negative
    positions are covered; tests/test_grading_ch03_redesign.py checks it against ``sinusoidal_encoding``.
    """
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (D/2,)
    angles = torch.as_tensor(positions, dtype=torch.float64)[..., None] * omega  # (..., D/2)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # sin at 2i, cos at 2i + 1


def _shifted_the_wrong_way(got, pe_back, name):
    if isinstance(got, torch.Tensor) and got.shape == pe_back.shape and \
            torch.allclose(got.detach().double(), pe_back.double(), atol=1e-4):
        raise CheckFailed(f"{name} equals PE(p - k): you rotated each pair by -k w_i. R_k acts on the pair "
                          "(sin, cos) as [[cos k w_i, sin k w_i], [-sin k w_i, cos k w_i]] (the chapter's shift_matrix)")


def _shift_table(student):
    pe = sinusoidal_encoding(40, 16)
    got = student(pe[:37], 3)
    _shifted_the_wrong_way(got, _pe_at(torch.arange(37) - 3, 16), "shift_encoding(PE(0..36), 3)")
    if isinstance(got, torch.Tensor) and got.shape == pe[3:].shape and \
            torch.allclose(got.detach().double(), (pe[:37] + pe[3]).double(), atol=1e-4):
        raise CheckFailed("shift_encoding(PE(0..36), 3) equals PE(p) + PE(3): a shift is a rotation, not an addition")
    expect_tensor(got, pe[3:], name="shift_encoding(PE(0..36), 3), expected PE(3..39) (D = 16)")


def _shift_float64(student):
    p = torch.tensor([0.5, 3.25, 10.0, 77.7, -4.0], dtype=torch.float64)
    pe = _pe_at(p, 12)
    for k in (-2.5, 1000.25):
        got = student(pe, k)
        _shifted_the_wrong_way(got, _pe_at(p - k, 12), f"shift_encoding(pe, {k})")
        expect_tensor(got, _pe_at(p + k, 12), name=f"shift_encoding of float64 encodings at positions "
                      f"{p.tolist()} by k = {k} (float64 in, float64 out; compute the angles k w_i in float64)",
                      atol=1e-9, rtol=0)


def _shift_per_vector(student):
    p = torch.arange(5)
    pe = _pe_at(p, 8).float().expand(3, 5, 8).contiguous()  # (B, T, D): three sequences at positions 0..4
    k = torch.tensor([[0], [7], [130]])  # (B, 1): each sequence moves by its own offset
    got = student(pe, k)
    expect_tensor(got, _pe_at(p + k, 8).float(), name="shift_encoding(pe of shape (3, 5, 8), k of shape (3, 1) "
                  "holding 0, 7 and 130): one offset per sequence, broadcast over its positions")


def _shift_any_vector(student):
    v = torch.randn(6, 10, dtype=torch.float64)
    a = student(v, 4)
    expect_tensor(a, v @ sinusoidal_shift_matrix(4, 10).double().T, name="shift_encoding(v, 4) for random "
                  "vectors v (not encodings): R_4 v, a linear map", atol=1e-6, rtol=0)
    b, c = student(a, -9), student(v, -5)
    expect_tensor(b, c, name="shift_encoding(shift_encoding(v, 4), -9), which must equal shift_encoding(v, -5)",
                  atol=1e-9, rtol=0)
    expect_tensor(a.norm(dim=-1), v.norm(dim=-1), name="the norm of each shifted vector (a rotation keeps it)",
                  atol=1e-9, rtol=0)


register(Exercise(
    id="3.1",
    title="Shifting a sinusoidal encoding",
    targets=("shift_encoding",),
    forbidden=("companion.positional",),  # the reference itself
    cases=(
        Case("a table shifted by k = 3 (D = 16)", 2, _shift_table),
        Case("negative, fractional and large offsets in float64", 1, _shift_float64),
        Case("one offset per sequence of a batch", 1, _shift_per_vector),
        Case("a rotation of any vector: linear, composes, keeps norms", 1, _shift_any_vector),
    ),
))


# ----------------------------------------------------------------- 3.2 T5's bias with a cache


def _t5_bias_ref(table, t, s, bidirectional, max_distance, query_start=None):
    """bias[0, h, i, j] = table[bucket(j - (query_start + i)), h]; the queries are the last t of s by default."""
    query_start = s - t if query_start is None else query_start
    rel = torch.arange(s)[None, :] - torch.arange(query_start, query_start + t)[:, None]  # (T, S): key - query
    buckets = relative_position_bucket(rel, bidirectional=bidirectional, n_buckets=table.shape[0],
                                       max_distance=max_distance)
    return table[buckets].permute(2, 0, 1)[None]  # (1, H, T, S)


def _same(got, want):
    return isinstance(got, torch.Tensor) and got.shape == want.shape and \
        torch.allclose(got.detach().double(), want.double(), atol=1e-6)


def _t5_bias_case(student, n_buckets, n_heads, t, s, bidirectional, max_distance, dtype=torch.float32):
    table = torch.randn(n_buckets, n_heads, dtype=dtype)
    what = (f"t5_bias(table of shape ({n_buckets}, {n_heads}), n_queries={t}, n_keys={s}, "
            f"bidirectional={bidirectional}, max_distance={max_distance})")
    try:
        got = student(table, t, s, bidirectional, max_distance)
    except IndexError as err:
        raise CheckFailed(f"{what} raised IndexError ({str(err).splitlines()[0] if str(err) else ''}): a bucket "
                          f"outside the table's {n_buckets} rows; take n_buckets from table.shape[0]") from None
    want = _t5_bias_ref(table, t, s, bidirectional, max_distance)
    if not _same(got, want):
        if s > t and _same(got, _t5_bias_ref(table, t, s, bidirectional, max_distance, query_start=0)):
            raise CheckFailed(f"{what} puts the queries at positions 0..{t - 1}; with {s - t} cached positions "
                              f"the {t} new queries are the last ones, at positions {s - t}..{s - 1}")
        flipped = table[relative_position_bucket(-(torch.arange(s)[None, :] - torch.arange(s - t, s)[:, None]),
                                                 bidirectional=bidirectional, n_buckets=n_buckets,
                                                 max_distance=max_distance)].permute(2, 0, 1)[None]
        if _same(got, flipped):
            raise CheckFailed(f"{what} uses query minus key; the relative position is key minus query, j - i "
                              "(negative for a key in the past)")
        if isinstance(got, torch.Tensor) and got.shape == (t, s, n_heads) and _same(got.permute(2, 0, 1)[None], want):
            raise CheckFailed(f"{what} has the values in the layout (T, S, H); return (1, H, T, S), "
                              "to be added to scores of shape (B, H, T, S)")
    expect_tensor(got, want, name=what)


def _t5_encoder(student):
    _t5_bias_case(student, 32, 4, 40, 40, True, 128)


def _t5_decoder_cache(student):
    _t5_bias_case(student, 32, 4, 7, 13, False, 128)


def _t5_one_token(student):
    _t5_bias_case(student, 32, 2, 1, 301, False, 128)


def _t5_other_buckets(student):
    _t5_bias_case(student, 8, 3, 5, 50, False, 20)


def _t5_odd_float64(student):
    _t5_bias_case(student, 13, 3, 9, 30, True, 7, dtype=torch.float64)


register(Exercise(
    id="3.2",
    title="T5's relative position bias with a cache",
    targets=("t5_bias",),
    forbidden=("companion.positional", "transformers"),  # the reference itself, and Hugging Face's compute_bias
    cases=(
        Case("encoder (bidirectional), T = S = 40, 32 buckets, 4 heads", 2, _t5_encoder),
        Case("decoder with 6 cached positions, T = 7, S = 13", 2, _t5_decoder_cache),
        Case("one new token after 300 cached ones (T = 1, S = 301)", 1, _t5_one_token),
        Case("the number of buckets comes from the table (8 buckets, max_distance 20)", 1, _t5_other_buckets),
        Case("odd sizes: 13 buckets, max_distance 7, a float64 table", 1, _t5_odd_float64),
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
