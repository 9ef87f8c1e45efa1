"""Checks for the Chapter 13 exercises (efficient attention).

References: softmax attention over the concatenated key blocks with
``torch.logsumexp`` (13.1, the online-softmax merge),
:func:`companion.masks.sliding_window_mask` (13.2),
:func:`companion.attention.scaled_dot_product_attention` with fewer key/value
heads (13.3) and the random-feature formula of FAVOR+ (13.4).
"""

from __future__ import annotations

import math

import torch

from ..attention import scaled_dot_product_attention
from ..masks import sliding_window_mask
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, register


# ----------------------------------------------------------------- 13.1 merge two partial softmaxes

def _block(q, k, v, keep):
    """Normalised output and log-sum-exp of one key block; a query with no visible key: zeros and -inf."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # (..., T)
    weights = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    return weights @ v, lse


def _merge_case(student, b, t, sa, sb, d, seed, what, hide=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, d, generator=g)
    k = torch.randn(b, sa + sb, d, generator=g)
    v = torch.randn(b, sa + sb, d + 1, generator=g)
    keep = torch.ones(b, t, sa + sb, dtype=torch.bool)
    if hide == "a":
        keep[:, : t // 2 + 1, :sa] = False  # some queries see nothing in block a
    elif hide == "both":
        keep[:, 0] = False  # query 0 sees no key at all
    out_a, lse_a = _block(q, k[:, :sa], v[:, :sa], keep[..., :sa])
    out_b, lse_b = _block(q, k[:, sa:], v[:, sa:], keep[..., sa:])
    want_out, want_lse = _block(q, k, v, keep)
    got = student(out_a.clone(), lse_a.clone(), out_b.clone(), lse_b.clone())
    expect_true(isinstance(got, tuple) and len(got) == 2,
                f"merge_blocks must return a tuple (out, lse), got {type(got).__name__}")
    expect_tensor(got[0], want_out, name=f"merged output ({what})")
    got_lse = got[1]
    expect_true(isinstance(got_lse, torch.Tensor) and got_lse.shape == want_lse.shape,
                f"merged lse ({what}) should have shape {tuple(want_lse.shape)}, got {getattr(got_lse, 'shape', type(got_lse).__name__)}")
    finite = torch.isfinite(want_lse)
    if not torch.equal(torch.isfinite(got_lse), finite) or (got_lse[~finite] > 0).any():
        raise CheckFailed(f"merged lse ({what}): a query that sees no key must have lse = -inf, and only those")
    expect_tensor(got_lse[finite], want_lse[finite], name=f"merged lse ({what})")


register(Exercise(
    id="13.1",
    title="Merge two blocks of an online softmax",
    targets=("merge_blocks",),
    forbidden=("companion.tiled_attention", "companion.attention"),
    cases=(
        Case("two blocks of keys (B=2, T=5, 3 + 4 keys)", 2, lambda s: _merge_case(s, 2, 5, 3, 4, 8, 0, "3 + 4 keys")),
        Case("odd sizes and large scores (T=7, 1 + 13 keys)", 2,
             lambda s: _merge_case(s, 3, 7, 1, 13, 5, 1, "1 + 13 keys")),
        Case("queries that see nothing in the first block (lse -inf)", 1,
             lambda s: _merge_case(s, 2, 6, 4, 5, 4, 2, "first block hidden", hide="a")),
        Case("a query that sees no key at all (zeros, lse -inf)", 1,
             lambda s: _merge_case(s, 1, 4, 3, 3, 4, 3, "a query sees nothing", hide="both")),
    ),
))


# ----------------------------------------------------------------- 13.2 sliding window + global mask

def _window_case(student, t, window, global_tokens, causal):
    want = sliding_window_mask(t, window, global_tokens=list(global_tokens), causal=causal)
    got = student(t, window, list(global_tokens), causal)
    what = f"t={t}, window={window}, global_tokens={list(global_tokens)}, causal={causal}"
    expect_true(isinstance(got, torch.Tensor) and got.dtype == torch.bool,
                f"window_mask({what}) must return a boolean tensor, got {getattr(got, 'dtype', type(got).__name__)}")
    expect_tensor(got, want, name=f"window_mask({what})")


register(Exercise(
    id="13.2",
    title="Longformer's sliding-window mask with global tokens",
    targets=("window_mask",),
    forbidden=("companion.masks", "companion.efficient_attention"),
    cases=(
        Case("a window, no global token", 2, lambda s: _window_case(s, 9, 2, (), False)),
        Case("global tokens (first and one in the middle), odd length", 2,
             lambda s: _window_case(s, 13, 1, (0, 6), False)),
        Case("causal with a global token", 1, lambda s: _window_case(s, 11, 3, (4,), True)),
        Case("edges: window 0, and a window longer than the sequence", 1,
             lambda s: (_window_case(s, 5, 0, (), False), _window_case(s, 4, 9, (), True))),
    ),
))


# ----------------------------------------------------------------- 13.3 grouped-query attention

def _gqa_case(student, b, h, hkv, t, s, d, causal, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t, d, generator=g)
    k = torch.randn(b, hkv, s, d, generator=g)
    v = torch.randn(b, hkv, s, d + 2, generator=g)
    want = scaled_dot_product_attention(q, k, v, is_causal=causal, backend="manual")
    got = student(q.clone(), k.clone(), v.clone(), causal)
    expect_tensor(got, want, name=f"GQA output (H={h}, Hkv={hkv}, T={t}, S={s}, causal={causal})")


register(Exercise(
    id="13.3",
    title="Grouped-query attention",
    targets=("grouped_query_attention",),
    forbidden=("companion.attention", "companion.efficient_attention", "torch.nn.functional.scaled_dot_product_attention"),
    cases=(
        Case("Hkv = H (multi-head attention)", 1, lambda s: _gqa_case(s, 2, 4, 4, 5, 5, 8, False, 0)),
        Case("Hkv = 1 (multi-query attention)", 2, lambda s: _gqa_case(s, 2, 6, 1, 7, 7, 4, False, 1)),
        Case("groups of 3 heads, causal", 2, lambda s: _gqa_case(s, 1, 6, 2, 9, 9, 8, True, 2)),
        Case("causal with a KV cache (T=3 new queries, S=11 keys)", 1,
             lambda s: _gqa_case(s, 2, 4, 2, 3, 11, 8, True, 3)),
    ),
))


# ----------------------------------------------------------------- 13.4 Performer's positive random features

def _features_case(student, shape, m, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 0.5
    w = torch.randn(m, shape[-1], generator=g)
    want = torch.exp(x @ w.T - (x * x).sum(-1, keepdim=True) / 2) / math.sqrt(m)
    got = student(x.clone(), w.clone())
    expect_tensor(got, want, name=f"phi(x) for x {tuple(shape)}, M={m}", rtol=1e-4, atol=1e-6)


def _features_kernel(student):
    # The point of the features: phi(x) . phi(y) estimates exp(x . y); with many features the average is close.
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(3, 4, generator=g) * 0.3, torch.randn(5, 4, generator=g) * 0.3
    w = torch.randn(20000, 4, generator=g)
    est = student(x.clone(), w.clone()) @ student(y.clone(), w.clone()).T
    exact = torch.exp(x @ y.T)
    err = ((est - exact).abs() / exact).max().item()
    if not err < 0.05:
        raise CheckFailed(f"phi(x) . phi(y) with 20,000 features should be within 5% of exp(x . y), off by {err:.1%}")


register(Exercise(
    id="13.4",
    title="Performer's positive random features",
    targets=("positive_features",),
    forbidden=("companion.efficient_attention",),
    cases=(
        Case("a matrix of vectors (T=7, Dh=4, M=16)", 2, lambda s: _features_case(s, (7, 4), 16, 0)),
        Case("batched heads (2, 3, 5, 8), M=33", 2, lambda s: _features_case(s, (2, 3, 5, 8), 33, 1)),
        Case("the features estimate exp(x . y)", 2, _features_kernel),
    ),
))
