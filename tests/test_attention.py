"""companion.attention: manual attention vs PyTorch's kernels, masks, errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from companion.attention import (CrossAttention, MultiHeadAttention, RotaryAttention, merge_heads, record_attention,
                                 scaled_dot_product_attention, split_heads)
from companion.masks import causal_mask, padding_mask
from companion.kv_cache import KVCache

TOL = dict(rtol=1e-5, atol=1e-5)


def qkv(b=2, h=3, t=7, s=13, dh=8, dv=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, t, dh, generator=g), torch.randn(b, h, s, dh, generator=g),
            torch.randn(b, h, s, dv, generator=g))


def test_matches_equation_one_written_out():
    q, k, v = qkv()
    scores = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(q.shape[-1])
    want = torch.einsum("bhts,bhsv->bhtv", torch.exp(scores) / torch.exp(scores).sum(-1, keepdim=True), v)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v), want, **TOL)


@pytest.mark.parametrize("backend", ["manual", "sdpa"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 7, 13), (1, 2, 97, 31)])
def test_agrees_with_torch_sdpa(backend, shape):
    b, h, t, s = shape
    q, k, v = qkv(b, h, t, s)
    mask = torch.rand(b, 1, t, s, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[..., 0] = True  # no empty rows here; those are tested below
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask, backend=backend), want, **TOL)


def test_weights_are_a_distribution_and_zero_where_masked():
    q, k, v = qkv()
    mask = padding_mask(torch.tensor([[1] * 9 + [0] * 4, [1] * 13]))
    _, w = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 7), **TOL)
    assert (w[0, :, :, 9:] == 0).all()


@pytest.mark.parametrize("backend", ["manual", "sdpa"])
def test_fully_masked_rows_give_zeros_not_nan(backend):
    q, k, v = qkv(t=5, s=5)
    mask = causal_mask(5).clone()
    mask[3] = False
    out = scaled_dot_product_attention(q, k, v, mask, backend=backend)
    assert not torch.isnan(out).any()
    assert (out[:, :, 3] == 0).all()
    ref = scaled_dot_product_attention(q, k, v, causal_mask(5))
    torch.testing.assert_close(out[:, :, [0, 1, 2, 4]], ref[:, :, [0, 1, 2, 4]], **TOL)


def test_naive_minus_inf_gives_nan_which_is_what_we_avoid():
    """The trap the chapter describes: masked_fill(-inf) + softmax on an all-masked row."""
    scores = torch.zeros(1, 4).masked_fill(torch.ones(1, 4, dtype=torch.bool), float("-inf"))
    assert torch.isnan(scores.softmax(-1)).all()


def test_finfo_min_fill_is_safe_in_float16():
    q, k, v = (t.half() for t in qkv(t=4, s=4))
    out = scaled_dot_product_attention(q, k, v, causal_mask(4))
    assert torch.isfinite(out).all()
    assert torch.tensor(-1e9).half().isinf()  # why -1e9 is not used


def test_causal_output_ignores_the_future():
    q, k, v = qkv(t=6, s=6)
    out = scaled_dot_product_attention(q, k, v, causal_mask(6))
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 4:] += 3.0
    v2[:, :, 4:] -= 2.0
    out2 = scaled_dot_product_attention(q, k2, v2, causal_mask(6))
    torch.testing.assert_close(out[:, :, :4], out2[:, :, :4], **TOL)
    assert not torch.allclose(out[:, :, 4:], out2[:, :, 4:])


def test_split_merge_round_trip_and_layout():
    x = torch.randn(2, 7, 12)
    heads = split_heads(x, 3)
    assert heads.shape == (2, 3, 7, 4)
    torch.testing.assert_close(heads[:, 1], x[..., 4:8])  # head 1 holds features 4..7
    torch.testing.assert_close(merge_heads(heads), x)


@pytest.mark.parametrize("n_heads", [1, 2, 5])
def test_mha_matches_nn_multiheadattention(n_heads):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(10, n_heads, batch_first=True).eval()
    ours = MultiHeadAttention.from_torch(ref).eval()
    x = torch.randn(3, 7, 10)
    mask = causal_mask(7)
    want, want_w = ref(x, x, x, attn_mask=~mask, average_attn_weights=False)  # True = blocked there
    with record_attention(ours) as rec:
        got = ours(x, mask)  # sdpa backend
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(rec[""][0], want_w, **TOL)
    ours.backend = "manual"
    torch.testing.assert_close(ours(x, mask), want, **TOL)
    torch.testing.assert_close(ours(x, is_causal=True), want, **TOL)  # the kernel's own causal rule


def test_mha_backends_agree_and_cross_attention_runs():
    torch.manual_seed(0)
    layer = CrossAttention(16, 4).eval()
    x, ctx = torch.randn(2, 5, 16), torch.randn(2, 9, 16)
    mask = padding_mask(torch.tensor([[1] * 9, [1] * 6 + [0] * 3]))
    a = layer(x, ctx, mask)
    layer.backend = "manual"
    torch.testing.assert_close(layer(x, ctx, mask), a, **TOL)
    assert a.shape == (2, 5, 16)
    # By hand: queries from x, keys and values from the context, padded keys masked.
    q = split_heads(layer.q(x), 4)
    k, v = (split_heads(z, 4) for z in layer.kv(ctx).chunk(2, dim=-1))
    torch.testing.assert_close(a, layer.out(merge_heads(_reference(q, k, v, mask))), **TOL)
    with pytest.raises(ValueError, match="context"):
        layer(x, None)


def test_cross_attention_from_torch_matches_nn_multiheadattention():
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(12, 3, batch_first=True).eval()
    ours = MultiHeadAttention.from_torch(ref, cross=True)
    assert isinstance(ours, CrossAttention)
    x, ctx = torch.randn(2, 4, 12), torch.randn(2, 6, 12)
    want, _ = ref(x, ctx, ctx)
    torch.testing.assert_close(ours(x, ctx), want, **TOL)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: scaled_dot_product_attention(torch.zeros(2, 3, 4), torch.zeros(2, 5, 3), torch.zeros(2, 5, 4)), "Dh"),
        (lambda: scaled_dot_product_attention(torch.zeros(2, 3, 4), torch.zeros(2, 5, 4), torch.zeros(2, 6, 4)), "S"),
        (lambda: scaled_dot_product_attention(torch.zeros(2, 3, 4), torch.zeros(2, 5, 4), torch.zeros(2, 5, 4),
                                              torch.ones(4, 5, dtype=torch.bool)), "does not broadcast"),
        (lambda: scaled_dot_product_attention(torch.zeros(3, 4), torch.zeros(5, 4), torch.zeros(5, 4),
                                              torch.ones(3, 5)), "boolean"),
        (lambda: split_heads(torch.zeros(2, 3, 10), 3), "not divisible"),
        (lambda: MultiHeadAttention(10, 4), "not divisible"),
        (lambda: MultiHeadAttention(8, 2, n_kv_heads=3), "not divisible"),
        (lambda: CrossAttention(8, 2, d_context=0), "d_context"),
        # The public function checks what the layers trust (they are called by models that checked their inputs).
        (lambda: scaled_dot_product_attention(*qkv(), bias=torch.zeros(2, 3, 4)), "bias of shape"),
        (lambda: scaled_dot_product_attention(*qkv(), head_mask=torch.ones(5)), "head_mask must have shape"),
        (lambda: scaled_dot_product_attention(*qkv(t=7, s=5), is_causal=True), "at least as many keys"),
        (lambda: scaled_dot_product_attention(*qkv(), return_weights=True, backend="sdpa"), "manual"),
    ],
)
def test_bad_input_gets_a_clear_error(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


# ---------------------------------------------------------------- extension points (bias, GQA, head mask, cache)

def _reference(q, k, v, mask=None, bias=None, scale=None):
    """Eq. (1) in float64 with -inf where masked and 0 for rows with no visible key: written for clarity."""
    q, k, v = q.double(), k.double(), v.double()
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.einsum("...td,...sd->...ts", q, k) * scale
    if bias is not None:
        scores = scores + bias.double()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.nan_to_num(scores.softmax(-1), nan=0.0)  # all -inf -> NaN -> 0
    return torch.einsum("...ts,...sv->...tv", weights, v).float()


@pytest.mark.parametrize("backend", ["manual", "sdpa"])
def test_additive_bias_with_mask_and_a_fully_masked_row(backend):
    q, k, v = qkv(b=2, h=3, t=7, s=13)
    bias = torch.randn(1, 3, 7, 13, generator=torch.Generator().manual_seed(1))
    mask = padding_mask(torch.tensor([[1] * 13, [1] * 9 + [0] * 4])) & torch.rand(2, 1, 7, 13).gt(0.3)
    mask[1, 0, 2] = False  # query 2 of sequence 1 sees nothing
    out = scaled_dot_product_attention(q, k, v, mask, bias=bias, backend=backend)
    torch.testing.assert_close(out, _reference(q, k, v, mask, bias), **TOL)
    assert torch.equal(out[1, :, 2], torch.zeros(3, 5))


@pytest.mark.parametrize("backend", ["manual", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_bias_holding_finfo_min_never_overflows(backend, dtype):
    q, k, v = (x.to(dtype) for x in qkv(t=5, s=6))
    q = q * 30  # large negative scores too
    bias = torch.zeros(5, 6, dtype=dtype)
    bias[:, 0] = torch.finfo(dtype).min  # an additive mask as a bias, on top of a boolean one
    mask = torch.ones(5, 6, dtype=torch.bool)
    mask[:, 1] = False
    out = scaled_dot_product_attention(q, k, v, mask, bias=bias, backend=backend)
    assert torch.isfinite(out).all()
    keep = torch.ones(5, 6, dtype=torch.bool)
    keep[:, :2] = False  # both columns removed, one by the bias, one by the mask
    torch.testing.assert_close(out.float(), _reference(q.float(), k.float(), v.float(), keep),
                               rtol=1e-2 if dtype == torch.float16 else 1e-5, atol=1e-2 if dtype == torch.float16 else 1e-5)


@pytest.mark.parametrize("backend", ["manual", "sdpa"])
@pytest.mark.parametrize("t, s", [(7, 7), (4, 13), (1, 9)])
def test_is_causal_is_the_bottom_right_causal_mask(backend, t, s):
    q, k, v = qkv(t=t, s=s)
    want = _reference(q, k, v, causal_mask(t, s))
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, is_causal=True, backend=backend), want, **TOL)
    pad = padding_mask(torch.tensor([[1] * s, [0] * 2 + [1] * (s - 2)]))  # (B, 1, 1, S)
    got = scaled_dot_product_attention(q, k, v, pad, is_causal=True, backend=backend)
    torch.testing.assert_close(got, _reference(q, k, v, pad & causal_mask(t, s)), **TOL)


def test_is_causal_fast_path_equals_manual_and_explicit_mask():
    q, k, v = qkv(t=11, s=11)
    fast = scaled_dot_product_attention(q, k, v, is_causal=True, backend="sdpa")  # kernel's is_causal=True
    torch.testing.assert_close(fast, scaled_dot_product_attention(q, k, v, is_causal=True, backend="manual"), **TOL)
    torch.testing.assert_close(fast, scaled_dot_product_attention(q, k, v, causal_mask(11), backend="sdpa"), **TOL)


@pytest.mark.parametrize("backend", ["manual", "sdpa"])
def test_scale_head_mask_and_grouped_kv_heads(backend):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 6, 5, 4, generator=g)
    k, v = torch.randn(2, 2, 9, 4, generator=g), torch.randn(2, 2, 9, 3, generator=g)  # Hkv = 2 serves H = 6
    expanded = k[:, [0, 0, 0, 1, 1, 1]], v[:, [0, 0, 0, 1, 1, 1]]  # query heads 0-2 read kv head 0
    out = scaled_dot_product_attention(q, k, v, scale=1.0, backend=backend)
    torch.testing.assert_close(out, _reference(q, *expanded, scale=1.0), **TOL)
    head_mask = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 1.0])
    masked = scaled_dot_product_attention(q, k, v, scale=1.0, head_mask=head_mask, backend=backend)
    torch.testing.assert_close(masked, out * head_mask[:, None, None], **TOL)
    assert torch.equal(masked[:, 1], torch.zeros(2, 5, 3))
    with pytest.raises(ValueError, match="multiple of Hkv"):
        scaled_dot_product_attention(q, k[:, :1].expand(2, 4, 9, 4), v[:, :1].expand(2, 4, 9, 3))
    with pytest.raises(ValueError, match=r"head_mask must have shape \(H,\)"):
        scaled_dot_product_attention(q, k, v, head_mask=torch.ones(5))
    with pytest.raises(TypeError, match="bias=..."):
        scaled_dot_product_attention(q, k, v, torch.zeros(5, 9))
    with pytest.raises(ValueError, match="bias of shape"):
        scaled_dot_product_attention(q, k, v, bias=torch.zeros(5, 8))


def test_layer_with_own_head_size_and_fewer_kv_heads_equals_duplicated_heads():
    torch.manual_seed(0)
    gqa = MultiHeadAttention(10, 4, d_head=3, n_kv_heads=2).eval()  # D = 10 is not H * Dh = 12
    assert gqa.qkv.weight.shape == (4 * 3 + 2 * 2 * 3, 10) and gqa.out.weight.shape == (10, 12)
    full = MultiHeadAttention(10, 4, d_head=3).eval()
    with torch.no_grad():
        wq, wk, wv = gqa.qkv.weight.split((12, 6, 6))
        bq, bk, bv = gqa.qkv.bias.split((12, 6, 6))
        dup = lambda w: w.view(2, 3, *w.shape[1:]).repeat_interleave(2, dim=0).reshape(12, *w.shape[1:])
        full.qkv.weight.copy_(torch.cat([wq, dup(wk), dup(wv)]))
        full.qkv.bias.copy_(torch.cat([bq, dup(bk), dup(bv)]))
        full.out.load_state_dict(gqa.out.state_dict())
    x = torch.randn(2, 7, 10)
    torch.testing.assert_close(gqa(x, is_causal=True), full(x, is_causal=True), **TOL)
    with pytest.raises(ValueError, match="not divisible by n_kv_heads"):
        MultiHeadAttention(12, 4, n_kv_heads=3)


def test_cached_self_and_cross_attention_equal_full_computation():
    from companion.kv_cache import EncoderDecoderCache

    torch.manual_seed(0)
    self_attn = MultiHeadAttention(12, 3, n_kv_heads=1, layer_idx=1).eval()
    cross = CrossAttention(12, 3, d_context=8, layer_idx=1).eval()
    x, memory = torch.randn(2, 6, 12), torch.randn(2, 5, 8)
    full_self = self_attn(x, is_causal=True)
    full_cross = cross(x, memory)
    cache = EncoderDecoderCache(2)
    steps_self, steps_cross = [], []
    for i in range(6):
        steps_self.append(self_attn(x[:, i:i + 1], is_causal=True, cache=cache.self_attn))
        steps_cross.append(cross(x[:, i:i + 1], memory if i == 0 else None, cache=cache.cross_attn))
    torch.testing.assert_close(torch.cat(steps_self, 1), full_self, **TOL)
    torch.testing.assert_close(torch.cat(steps_cross, 1), full_cross, **TOL)
    assert cache.length == 6 and cache.cross_attn.length == 5
    assert cache.self_attn.keys[1].shape == (2, 1, 6, 4)  # one kv head cached, not three


def test_record_attention_keeps_outputs_and_records_every_call():
    from companion.blocks import TransformerDecoderBlock

    torch.manual_seed(0)
    block = TransformerDecoderBlock(12, 3, 20).eval()
    x, ctx = torch.randn(2, 7, 12), torch.randn(2, 5, 12)
    plain = block(x, ctx, is_causal=True)
    with record_attention(block) as rec:
        recorded_out = block(x, ctx, is_causal=True)
        block(x, ctx, is_causal=True)
    assert torch.equal(recorded_out, plain) and sorted(rec) == ["cross_attn", "self_attn"]
    assert len(rec["self_attn"]) == 2 and rec["cross_attn"][0].shape == (2, 3, 7, 5)
    # The weights by hand, from the layer's own projections of its input (post-LN: x itself).
    attn = block.self_attn
    q, k, v = (split_heads(z, 3) for z in attn.qkv(x if not block.norm_first else block.norm1(x)).chunk(3, dim=-1))
    _, want = scaled_dot_product_attention(q, k, v, causal_mask(7), return_weights=True)
    torch.testing.assert_close(rec["self_attn"][0], want, **TOL)
    assert "kernel" not in vars(attn)  # the class's kernel again after the block
    with record_attention(block, cross=False) as rec:
        block(x, ctx, is_causal=True)
    assert list(rec) == ["self_attn"]


def test_grouped_query_attention_with_rope_equals_hugging_face_llama():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    from companion.positional import rope_cos_sin

    cfg = transformers.LlamaConfig(hidden_size=20, num_attention_heads=4, num_key_value_heads=2, head_dim=6,
                                   attention_bias=False, attention_dropout=0.0, max_position_embeddings=32)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    hf = LlamaAttention(cfg, layer_idx=0).eval()
    ours = RotaryAttention(20, 4, d_head=6, n_kv_heads=2, bias=False).eval()  # D = 20, H * Dh = 24
    with torch.no_grad():
        ours.qkv.weight.copy_(torch.cat([hf.q_proj.weight, hf.k_proj.weight, hf.v_proj.weight]))
        ours.out.weight.copy_(hf.o_proj.weight)
    x = torch.randn(2, 9, 20)
    hf_rope = LlamaRotaryEmbedding(cfg)(x, torch.arange(9)[None])
    with torch.no_grad():
        want = hf(x, position_embeddings=hf_rope, attention_mask=None)[0]
        got = ours(x, is_causal=True, rope=rope_cos_sin(9, 6))
    torch.testing.assert_close(got, want, **TOL)


def test_unscaled_attention_with_relative_bias_and_padding_equals_hugging_face_t5():
    transformers = pytest.importorskip("transformers")
    from transformers.models.t5.modeling_t5 import T5Attention

    from companion.positional import RelativePositionBias

    cfg = transformers.T5Config(d_model=20, d_kv=6, num_heads=4, dropout_rate=0.0,
                                relative_attention_num_buckets=8, relative_attention_max_distance=16)
    torch.manual_seed(0)
    hf = T5Attention(cfg, has_relative_attention_bias=True).eval()
    ours = MultiHeadAttention(20, 4, d_head=6, scale=1.0, bias=False).eval()  # T5: no 1/sqrt(Dh), no biases
    rel = RelativePositionBias(4, bidirectional=True, n_buckets=8, max_distance=16)
    with torch.no_grad():
        ours.qkv.weight.copy_(torch.cat([hf.q.weight, hf.k.weight, hf.v.weight]))
        ours.out.weight.copy_(hf.o.weight)
        rel.relative_attention_bias.weight.copy_(hf.relative_attention_bias.weight)
    x = torch.randn(2, 11, 20)
    keep = torch.ones(2, 11, dtype=torch.bool)
    keep[1, 8:] = False
    hf_mask = torch.zeros(2, 1, 1, 11).masked_fill(~keep[:, None, None, :], torch.finfo(torch.float32).min)
    with torch.no_grad():
        want = hf(x, mask=hf_mask)[0]
        got = ours(x, padding_mask(keep), bias=rel(11))
    torch.testing.assert_close(got, want, **TOL)


def test_is_causal_fast_path_gradients_equal_the_masked_path():
    g = torch.Generator().manual_seed(11)
    base = [torch.randn(2, 3, 9, 8, generator=g, dtype=torch.float64) for _ in range(3)]
    grad = torch.randn(2, 3, 9, 8, generator=g, dtype=torch.float64)
    grads = {}
    for name, kwargs in {"fast": dict(is_causal=True, backend="sdpa"),
                         "masked": dict(mask=torch.ones(9, 9, dtype=torch.bool).tril(), backend="manual")}.items():
        q, k, v = (x.clone().requires_grad_() for x in base)
        scaled_dot_product_attention(q, k, v, **kwargs).backward(grad)
        grads[name] = [x.grad for x in (q, k, v)]
    for a, b in zip(grads["fast"], grads["masked"]):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("backend", ["manual", "sdpa"])
def test_is_causal_combines_once_with_a_padding_mask_and_a_bias(backend):
    # What a decoder passes: is_causal=True plus a padding mask and/or a bias (T5); the kernel adds the
    # causal rule once, bottom-right aligned when there are more keys than queries (a cache).
    q, k, v = qkv(b=2, h=3, t=6, s=6)
    bias = torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(2))
    pad = padding_mask(torch.tensor([[1] * 6, [0, 0] + [1] * 4]))  # queries 0, 1 of sequence 1 see nothing
    for mask, b in ((pad, None), (None, bias), (pad, bias)):
        want = _reference(q, k, v, causal_mask(6) if mask is None else mask & causal_mask(6), b)
        got = scaled_dot_product_attention(q, k, v, mask, bias=b, is_causal=True, backend=backend)
        torch.testing.assert_close(got, want, **TOL)
    q_new = q[:, :, 4:]  # two new queries over six keys
    want = _reference(q_new, k, v, causal_mask(2, 6), bias[..., 4:, :])
    got = scaled_dot_product_attention(q_new, k, v, bias=bias[..., 4:, :], is_causal=True, backend=backend)
    torch.testing.assert_close(got, want, **TOL)


def test_manual_path_keeps_two_score_sized_tensors_when_no_row_is_empty():
    # A mask with no empty row: the manual path holds the scores and the weights, no third (T, S) copy;
    # a mask that empties a row still zeroes it (the copy is then made).
    from companion.memory import peak_tensor_bytes

    t, d = 256, 8
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, t, d, generator=g) for _ in range(3))
    mask = causal_mask(t)
    out, peak = peak_tensor_bytes(lambda: scaled_dot_product_attention(q, k, v, mask, backend="manual"))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert peak < 2.5 * t * t * 4, peak / (t * t * 4)
    mask_empty = mask.clone()
    mask_empty[3] = False
    out = scaled_dot_product_attention(q, k, v, mask_empty, backend="manual")
    assert torch.equal(out[0, 0, 3], torch.zeros(d))
