"""Checks for the Chapter 2 exercises (attention and multi-head attention).

Each case builds random inputs, runs the student's code and compares with the
reference in :mod:`companion.attention` / :mod:`companion.masks`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..attention import merge_heads, scaled_dot_product_attention
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

def _heads_reference(qkv, n_heads, n_kv_heads, layout):
    """Written apart from the statement's recipe: head by head, with plain slices of the last axis."""
    b, t, width = qkv.shape
    dh = width // (n_heads + 2 * n_kv_heads)
    if layout == "blocks":  # [q_0 .. q_{H-1} | k_0 .. | v_0 ..]
        col = lambda i: qkv[..., i * dh:(i + 1) * dh]  # noqa: E731
        q = [col(h) for h in range(n_heads)]
        k = [col(n_heads + g) for g in range(n_kv_heads)]
        v = [col(n_heads + n_kv_heads + g) for g in range(n_kv_heads)]
    else:  # "per_head": [q_0 k_0 v_0 | q_1 k_1 v_1 | ...]
        col = lambda h, j: qkv[..., (3 * h + j) * dh:(3 * h + j + 1) * dh]  # noqa: E731
        q, k, v = ([col(h, j) for h in range(n_heads)] for j in range(3))
    return tuple(torch.stack(parts, dim=1) for parts in (q, k, v))  # (B, heads, T, dh)


def _triple(result):
    if not (isinstance(result, tuple) and len(result) == 3):
        raise CheckFailed(f"split_heads should return a triple (q, k, v), got {type(result).__name__}")
    return result


def _expect_qkv(got, want, what):
    for name, g, w in zip("qkv", got, want):
        expect_tensor(g, w, name=f"{name} of {what}")


def _split_mha(split, merge):
    qkv = torch.randn(2, 5, 3 * 12)  # H = 3 heads of 4, GPT-2's c_attn layout
    _expect_qkv(_triple(split(qkv, 3, 3, "blocks")), _heads_reference(qkv, 3, 3, "blocks"),
                "split_heads(qkv (2, 5, 36), 3, 3, 'blocks')")


def _split_gqa(split, merge):
    qkv = torch.randn(2, 3, (4 + 2 * 2) * 5)  # H = 4 query heads, 2 key/value heads of 5
    got = _triple(split(qkv, 4, 2, "blocks"))
    want = _heads_reference(qkv, 4, 2, "blocks")
    for name, g in zip("kv", got[1:]):
        if isinstance(g, torch.Tensor) and g.dim() == 4 and g.shape[1] != 2:
            raise CheckFailed(f"{name} should have n_kv_heads = 2 heads, shape (2, 2, 3, 5), got {tuple(g.shape)}: "
                              "with grouped-query attention the widths are H*dh, H_kv*dh, H_kv*dh, not three equal thirds")
    _expect_qkv(got, want, "split_heads(qkv (2, 3, 40), 4, 2, 'blocks')")


def _split_per_head(split, merge):
    qkv = torch.randn(2, 4, 3 * 3 * 2)  # H = 3 heads of 2, GPT-NeoX's layout
    got = _triple(split(qkv, 3, 3, "per_head"))
    want = _heads_reference(qkv, 3, 3, "per_head")
    blocks = _heads_reference(qkv, 3, 3, "blocks")
    if all(isinstance(g, torch.Tensor) and g.shape == b.shape and torch.allclose(g, b) for g, b in zip(got, blocks)):
        raise CheckFailed("for layout 'per_head' you cut [Q | K | V] blocks: in GPT-NeoX's layout each head's "
                          "q, k and v are side by side, [q_0 k_0 v_0 | q_1 k_1 v_1 | ...]")
    _expect_qkv(got, want, "split_heads(qkv (2, 4, 18), 3, 3, 'per_head')")


def _merge_values(split, merge):
    y = torch.randn(2, 4, 3, 5)
    expect_tensor(merge(y), merge_heads(y), name="merge_heads(y of shape (2, 4, 3, 5))")


register(Exercise(
    id="2.3",
    title="Splitting a fused projection into heads",
    targets=("split_heads", "merge_heads"),
    forbidden=("companion.attention",),  # the reference itself
    cases=(
        Case("'blocks' layout, as many key/value heads as query heads", 1, _split_mha),
        Case("'blocks' layout with fewer key/value heads (grouped-query)", 2, _split_gqa),
        Case("'per_head' layout (GPT-NeoX)", 2, _split_per_head),
        Case("merge_heads: values on random input", 1, _merge_values),
    ),
))


# ----------------------------------------------------------------- 2.4 module

def _build(cls, d_model, n_heads, d_head=None):
    torch.manual_seed(1)
    layer = cls(d_model, n_heads) if d_head is None else cls(d_model, n_heads, d_head)
    inner = n_heads * (d_model // n_heads if d_head is None else d_head)
    for name, shape in (("q", (inner, d_model)), ("kv", (2 * inner, d_model)), ("out", (d_model, inner))):
        sub = getattr(layer, name, None)
        if not isinstance(sub, nn.Linear):
            raise CheckFailed(f"the module must have an nn.Linear named {name}, got {type(sub).__name__}")
        if tuple(sub.weight.shape) != shape:
            raise CheckFailed(f"{name}.weight should have shape {shape}, got {tuple(sub.weight.shape)}")
    return layer


def _mha_reference(layer, n_heads, x, context=None, mask=None):
    """The expected output from the layer's own weights: queries from x, keys and values from context."""
    context = x if context is None else context
    lin = lambda sub, z: torch.nn.functional.linear(z, sub.weight.detach(), sub.bias.detach())  # noqa: E731
    heads = lambda z: z.view(z.shape[0], z.shape[1], n_heads, -1).transpose(1, 2)  # noqa: E731
    k, v = lin(layer.kv, context).chunk(2, dim=-1)
    y = scaled_dot_product_attention(heads(lin(layer.q, x)), heads(k), heads(v), mask)
    return lin(layer.out, y.transpose(1, 2).flatten(2))


def _mha_layout(cls):
    _build(cls, 12, 3, 8)


def _mha_self(cls):
    layer = _build(cls, 12, 3)
    x = torch.randn(2, 7, 12)
    with torch.no_grad():
        expect_tensor(layer(x), _mha_reference(layer, 3, x), name="self-attention output, x of shape (2, 7, 12)")


def _mha_causal(cls):
    layer = _build(cls, 8, 2)
    x = torch.randn(2, 6, 8)
    mask = causal_mask(6)
    with torch.no_grad():
        expect_tensor(layer(x, mask=mask), _mha_reference(layer, 2, x, mask=mask),
                      name="self-attention output with a causal mask")


def _padding(lengths, s):
    return (torch.arange(s) < torch.tensor(lengths)[:, None])[:, None, None, :]  # (B, 1, 1, S)


def _mha_torch_cross(cls):
    torch.manual_seed(2)
    torch_mha = nn.MultiheadAttention(10, 5, batch_first=True)
    layer = _build(cls, 10, 5)
    w, b = torch_mha.in_proj_weight.detach(), torch_mha.in_proj_bias.detach()  # rows: W_Q, W_K, W_V
    layer.load_state_dict({"q.weight": w[:10], "q.bias": b[:10], "kv.weight": w[10:], "kv.bias": b[10:],
                           "out.weight": torch_mha.out_proj.weight.detach(),
                           "out.bias": torch_mha.out_proj.bias.detach()})  # a call: works on a remote module too
    with torch.no_grad():
        x, context = torch.randn(3, 4, 10), torch.randn(3, 6, 10)
        keep = _padding([6, 2, 4], 6)
        want, _ = torch_mha(x, context, context, key_padding_mask=~keep[:, 0, 0], need_weights=False)
        got = layer(x, context, mask=keep)
        try:
            expect_tensor(got, want, name="cross-attention (T = 4, S = 6, padded context) vs nn.MultiheadAttention")
        except CheckFailed:
            if isinstance(got, torch.Tensor) and got.shape == want.shape and torch.allclose(
                    got, _mha_reference(layer, 5, x, context), atol=1e-4):
                raise CheckFailed("the output equals cross-attention without the mask: pass the padding mask "
                                  "(B, 1, 1, S) to the attention") from None
            raise


def _mha_d_head(cls):
    layer = _build(cls, 12, 3, 8)  # 3 heads of 8: 24 features inside, 12 outside
    x, context = torch.randn(2, 4, 12), torch.randn(2, 5, 12)
    keep = _padding([5, 3], 5)
    with torch.no_grad():
        want = _mha_reference(layer, 3, x, context, keep)
        got = layer(x, context, mask=keep)
        if isinstance(got, torch.Tensor) and got.shape == want.shape and not torch.allclose(got, want, atol=1e-4):
            lin = lambda sub, z: torch.nn.functional.linear(z, sub.weight.detach(), sub.bias.detach())  # noqa: E731
            q = lin(layer.q, x).view(2, 4, 3, 8).transpose(1, 2)
            k, v = (z.view(2, 5, 3, 8).transpose(1, 2) for z in lin(layer.kv, context).chunk(2, dim=-1))
            scores = q @ k.transpose(-2, -1) / math.sqrt(4)  # scaled by sqrt(d_model / n_heads)
            y = scores.masked_fill(~keep, torch.finfo(scores.dtype).min).softmax(-1) @ v
            if torch.allclose(got, lin(layer.out, y.transpose(1, 2).flatten(2)), atol=1e-4):
                raise CheckFailed("the scores are scaled by 1/sqrt(d_model / n_heads) = 1/sqrt(4); "
                                  "scale by 1/sqrt(d_head) = 1/sqrt(8)") from None
        expect_tensor(got, want, name="cross-attention with d_head = 8, d_model = 12, 3 heads")


def _mha_bad_heads(cls):
    try:
        cls(10, 3, 4)
    except NotImplementedError:
        raise  # the stub: reported as "not implemented yet"
    except Exception as err:  # noqa: BLE001
        raise CheckFailed(f"d_model=10, n_heads=3, d_head=4 is valid (d_head is given), "
                          f"but it raised {type(err).__name__}") from None
    try:
        cls(10, 3)
    except ValueError:
        return
    except Exception as err:  # noqa: BLE001
        raise CheckFailed(f"d_model=10, n_heads=3 should raise ValueError, raised {type(err).__name__}") from None
    raise CheckFailed("d_model=10, n_heads=3 without d_head should raise ValueError (10 is not divisible by 3), "
                      "nothing was raised")


register(Exercise(
    id="2.4",
    title="Multi-head attention over another sequence",
    targets=("MultiHeadAttention",),
    forbidden=("companion.attention", "companion.models"),  # the reference itself
    cases=(
        Case("has projections q, kv and out of the right shapes (d_head = 8)", 1, _mha_layout),
        Case("self-attention when no context is given", 2, _mha_self),
        Case("respects a causal mask", 1, _mha_causal),
        Case("cross-attention with a padded context matches nn.MultiheadAttention", 2, _mha_torch_cross),
        Case("a head size of its own: d_head = 8 with d_model = 12", 2, _mha_d_head),
        Case("d_head defaults to d_model / n_heads, else ValueError", 1, _mha_bad_heads),
    ),
))
