"""Checks for the Chapter 2 exercises (attention and multi-head attention).

Each case builds random inputs, runs the student's code and compares with the
reference in :mod:`companion.attention` / :mod:`companion.masks`.
"""

from __future__ import annotations

import torch
from torch import nn

from ..attention import MultiHeadAttention, merge_heads, scaled_dot_product_attention, split_heads
from ..masks import causal_mask
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, register


def _qkv(b=2, h=3, t=5, s=7, dh=4, dv=6):
    return torch.randn(b, h, t, dh), torch.randn(b, h, s, dh), torch.randn(b, h, s, dv)


def _pair(result, what="masked_attention"):
    if not (isinstance(result, tuple) and len(result) == 2):
        raise CheckFailed(f"{what} should return a pair (out, weights), got {type(result).__name__}")
    return result


# ----------------------------------------------------------------- 2.1 attention

def _attn_random(student):
    q, k, v = _qkv()
    out, weights = _pair(student(q, k, v))
    ref_out, ref_w = scaled_dot_product_attention(q, k, v, return_weights=True)
    expect_tensor(weights, ref_w, name="weights")
    expect_tensor(out, ref_out, name="out")


def _attn_scale(student):
    q, k, v = _qkv(b=1, h=1, t=3, s=4, dh=64, dv=2)
    _, weights = _pair(student(q, k, v))
    _, ref_w = scaled_dot_product_attention(q, k, v, return_weights=True)
    _, unscaled = scaled_dot_product_attention(q, k, v, scale=1.0, return_weights=True)
    try:
        expect_tensor(weights, ref_w, name="weights with d_k = 64")
    except CheckFailed:
        if weights.shape == unscaled.shape and torch.allclose(weights.to(unscaled.dtype), unscaled, atol=1e-4):
            raise CheckFailed("the weights equal softmax(q k^T) without scaling: divide the scores by sqrt(d_k)") from None
        raise


def _attn_padding(student):
    q, k, v = _qkv(t=5, s=7)
    valid = torch.tensor([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    mask = valid[:, None, None, :]  # (B, 1, 1, S)
    out, weights = _pair(student(q, k, v, mask))
    ref_out, ref_w = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    expect_tensor(weights, ref_w, name="weights with a padding mask (B, 1, 1, S)")
    expect_tensor(out, ref_out, name="out with a padding mask")


def _attn_empty_rows(student):
    q, k, v = _qkv(b=1, h=2, t=4, s=4)
    mask = causal_mask(4).clone()
    mask[2] = False  # query 2 may see nothing
    out, weights = _pair(student(q, k, v, mask))
    for name, x in (("out", out), ("weights", weights)):
        if isinstance(x, torch.Tensor) and torch.isnan(x).any():
            raise CheckFailed(f"{name} contains NaN for a query whose keys are all masked; such rows must be zeros")
    # Judged apart from the 1/sqrt(d_k) scale (its own case): either scaling of the other rows passes.
    ref_out, ref_w = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    un_out, un_w = scaled_dot_product_attention(q, k, v, mask, scale=1.0, return_weights=True)
    for name, x in (("weights", weights), ("out", out)):
        if isinstance(x, torch.Tensor) and x.dim() >= 2 and x.shape[-2] == 4 and x[..., 2, :].abs().amax() > 1e-6:
            raise CheckFailed(f"{name} of query 2, whose keys are all masked, should be zeros; "
                              f"got values up to {x[..., 2, :].abs().amax().item():.3g}")
    try:
        expect_tensor(weights, un_w, name="weights (row 2 fully masked)")
        expect_tensor(out, un_out, name="out (row 2 fully masked)")
    except CheckFailed:
        expect_tensor(weights, ref_w, name="weights (row 2 fully masked)")
        expect_tensor(out, ref_out, name="out (row 2 fully masked)")


def _attn_length_one(student):
    q, k, v = _qkv(b=3, h=1, t=1, s=1, dh=5, dv=2)
    out, weights = _pair(student(q, k, v))
    expect_tensor(weights, torch.ones(3, 1, 1, 1), name="weights for one key")
    expect_tensor(out, v, name="out for one key (must equal v)")


register(Exercise(
    id="2.1",
    title="Scaled dot-product attention with a mask",
    targets=("masked_attention",),
    forbidden=("companion.attention", "torch.nn.functional.scaled_dot_product_attention"),  # the reference itself
    cases=(
        Case("random q, k, v (B=2, H=3, T=5, S=7)", 2, _attn_random),
        Case("scales the scores by 1/sqrt(d_k)", 1, _attn_scale),
        Case("padding mask of shape (B, 1, 1, S)", 2, _attn_padding),
        Case("a fully masked row gives zeros, not NaN", 2, _attn_empty_rows),
        Case("length 1", 1, _attn_length_one),
    ),
))


# ----------------------------------------------------------------- 2.2 causal mask

def _causal_square(student):
    for t in (1, 4, 9):
        got = student(t, t)
        expect_tensor(got, causal_mask(t), name=f"causal_mask({t}, {t})")


def _causal_rectangular(student):
    for t, s in ((1, 6), (3, 8)):
        got = student(t, s)
        expect_tensor(got, causal_mask(t, s), name=f"causal_mask({t}, {s}) (bottom-right aligned)")


def _causal_no_future(student):
    t = 6
    q, k, v = _qkv(b=1, h=1, t=t, s=t)
    mask = student(t, t)
    expect_true(isinstance(mask, torch.Tensor) and mask.dtype == torch.bool,
                f"the mask must be a boolean tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
    out = scaled_dot_product_attention(q, k, v, mask)
    k2, v2 = k.clone(), v.clone()
    k2[..., -1, :] += 5.0
    v2[..., -1, :] += 5.0  # change only the last position
    out2 = scaled_dot_product_attention(q, k2, v2, mask)
    changed = (out2[..., :-1, :] - out[..., :-1, :]).abs().amax()
    expect_true(changed < 1e-6, f"changing the last token changed earlier outputs by {changed:.3g}: the mask lets queries see the future")


register(Exercise(
    id="2.2",
    title="A causal mask",
    targets=("causal_mask",),
    forbidden=("companion.masks",),  # the reference itself
    cases=(
        Case("square masks (T = S = 1, 4, 9)", 2, _causal_square),
        Case("more keys than queries: aligned bottom-right", 2, _causal_rectangular),
        Case("earlier outputs ignore a changed future token", 1, _causal_no_future),
    ),
))


# ----------------------------------------------------------------- 2.3 heads

def _split_values(split, merge):
    x = torch.randn(2, 5, 12)
    expect_tensor(split(x, 3), split_heads(x, 3), name="split_heads(x of shape (2, 5, 12), 3)")


def _split_odd(split, merge):
    x = torch.randn(3, 1, 7)
    expect_tensor(split(x, 7), split_heads(x, 7), name="split_heads(x of shape (3, 1, 7), 7)")


def _merge_values(split, merge):
    y = torch.randn(2, 4, 3, 5)
    expect_tensor(merge(y), merge_heads(y), name="merge_heads(y of shape (2, 4, 3, 5))")


def _round_trip(split, merge):
    x = torch.randn(2, 9, 20)
    expect_tensor(merge(split(x, 4)), x, name="merge_heads(split_heads(x, 4))")


register(Exercise(
    id="2.3",
    title="Splitting and merging heads",
    targets=("split_heads", "merge_heads"),
    forbidden=("companion.attention",),  # the reference itself
    cases=(
        Case("split_heads: values on random input", 2, _split_values),
        Case("split_heads: one position, one feature per head", 1, _split_odd),
        Case("merge_heads: values on random input", 2, _merge_values),
        Case("merge_heads undoes split_heads", 1, _round_trip),
    ),
))


# ----------------------------------------------------------------- 2.4 module

def _build(cls, d_model, n_heads):
    torch.manual_seed(1)
    layer = cls(d_model, n_heads)
    for name, shape in (("qkv", (3 * d_model, d_model)), ("out", (d_model, d_model))):
        sub = getattr(layer, name, None)
        if not isinstance(sub, nn.Linear):
            raise CheckFailed(f"the module must have an nn.Linear named {name}, got {type(sub).__name__}")
        if tuple(sub.weight.shape) != shape:
            raise CheckFailed(f"{name}.weight should have shape {shape}, got {tuple(sub.weight.shape)}")
    return layer


def _reference_for(layer, d_model, n_heads):
    ref = MultiHeadAttention(d_model, n_heads, backend="manual")
    ref.load_state_dict(layer.state_dict())
    return ref


def _mha_layout(cls):
    _build(cls, 12, 3)


def _mha_matches(cls):
    layer = _build(cls, 12, 3)
    ref = _reference_for(layer, 12, 3)
    x = torch.randn(2, 7, 12)
    with torch.no_grad():
        expect_tensor(layer(x), ref(x), name="output on x of shape (2, 7, 12)")


def _mha_torch(cls):
    torch.manual_seed(2)
    torch_mha = nn.MultiheadAttention(10, 5, batch_first=True)
    layer = _build(cls, 10, 5)
    layer.load_state_dict(MultiHeadAttention.from_torch(torch_mha).state_dict())
    x = torch.randn(3, 4, 10)
    with torch.no_grad():
        want, _ = torch_mha(x, x, x, need_weights=False)
        expect_tensor(layer(x), want, name="output vs nn.MultiheadAttention with the same weights")


def _mha_mask(cls):
    layer = _build(cls, 8, 2)
    ref = _reference_for(layer, 8, 2)
    x = torch.randn(2, 6, 8)
    mask = causal_mask(6)
    with torch.no_grad():
        expect_tensor(layer(x, mask), ref(x, mask=mask), name="output with a causal mask")


def _mha_bad_heads(cls):
    try:
        cls(10, 3)
    except ValueError:
        return
    except NotImplementedError:
        raise  # the stub: reported as "not implemented yet"
    except Exception as err:  # noqa: BLE001
        raise CheckFailed(f"d_model=10, n_heads=3 should raise ValueError, raised {type(err).__name__}") from None
    raise CheckFailed("d_model=10, n_heads=3 should raise ValueError (10 is not divisible by 3), nothing was raised")


register(Exercise(
    id="2.4",
    title="A multi-head self-attention module",
    targets=("MultiHeadAttention",),
    forbidden=("companion.attention", "companion.models"),  # the reference itself
    cases=(
        Case("has a fused qkv projection and an output projection", 1, _mha_layout),
        Case("matches the reference given the same weights", 3, _mha_matches),
        Case("matches nn.MultiheadAttention given the same weights", 2, _mha_torch),
        Case("respects a mask", 2, _mha_mask),
        Case("rejects d_model not divisible by n_heads", 1, _mha_bad_heads),
    ),
))
