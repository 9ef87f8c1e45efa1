"""companion.blocks: norms against torch and Hugging Face, residual forms, blocks against nn.Transformer*Layer."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from companion.blocks import (FeedForward, RMSNorm, TransformerBlock, TransformerDecoderBlock, layer_norm, make_norm,
                             residual, rms_norm)
from companion.masks import causal_mask, padding_mask

TOL = dict(rtol=1e-5, atol=1e-5)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------ LayerNorm

def test_layer_norm_by_hand_small_case():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    # mean 2.5, biased variance ((1.5^2 + 0.5^2) * 2) / 4 = 1.25
    want = (x - 2.5) / math.sqrt(1.25 + 1e-5)
    torch.testing.assert_close(layer_norm(x), want, **TOL)


@pytest.mark.parametrize("d", [1, 7, 13])
@pytest.mark.parametrize("eps", [1e-5, 1e-2, 0.5])
def test_layer_norm_matches_torch(d, eps):
    g = gen(d)
    x = torch.randn(3, 5, d, generator=g) * 3 + 1
    w, b = torch.randn(d, generator=g), torch.randn(d, generator=g)
    torch.testing.assert_close(layer_norm(x, w, b, eps), F.layer_norm(x, (d,), w, b, eps), **TOL)
    torch.testing.assert_close(layer_norm(x, eps=eps), F.layer_norm(x, (d,), eps=eps), **TOL)


def test_layer_norm_output_has_zero_mean_and_unit_variance():
    x = torch.randn(4, 7, 13, generator=gen()) * 5 - 2
    y = layer_norm(x, eps=0.0)
    torch.testing.assert_close(y.mean(-1), torch.zeros(4, 7), **TOL)
    torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(4, 7), **TOL)


def test_layer_norm_is_invariant_to_shift_and_scale_of_a_row():
    x = torch.randn(2, 7, 13, generator=gen())
    torch.testing.assert_close(layer_norm(3.0 * x + 11.0, eps=0.0), layer_norm(x, eps=0.0), **TOL)


def test_layer_norm_rejects_wrong_weight_shape():
    with pytest.raises(ValueError, match=r"weight must be a tensor of shape \(13,\)"):
        layer_norm(torch.randn(2, 13), torch.ones(12))


# ------------------------------------------------------------------ RMSNorm

@pytest.mark.parametrize("d", [1, 7, 13, 64])
@pytest.mark.parametrize("eps", [1e-6, 1e-2, 0.5])
def test_rmsnorm_module_equals_torch_rmsnorm(d, eps):
    torch.manual_seed(d)
    ours, ref = RMSNorm(d, eps=eps), nn.RMSNorm(d, eps=eps)
    with torch.no_grad():
        ref.weight.copy_(torch.randn(d))
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 7, d) * 4 + 0.5
    torch.testing.assert_close(ours(x), ref(x), **TOL)


def test_rms_norm_function_equals_formula_and_torch():
    x = torch.randn(3, 7, 13, generator=gen())
    w = torch.randn(13, generator=gen(1))
    want = x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(rms_norm(x, w), want, **TOL)
    torch.testing.assert_close(rms_norm(x, w, 1e-3), F.rms_norm(x, (13,), w, 1e-3), **TOL)


def test_rmsnorm_equals_layernorm_on_zero_mean_rows_and_differs_otherwise():
    x = torch.randn(5, 13, generator=gen())
    centred = x - x.mean(-1, keepdim=True)
    torch.testing.assert_close(rms_norm(centred, eps=1e-5), layer_norm(centred, eps=1e-5), **TOL)
    assert (rms_norm(x + 3.0, eps=1e-5) - layer_norm(x + 3.0, eps=1e-5)).abs().max() > 0.1


def test_rmsnorm_equals_hugging_face_t5_layer_norm():
    from transformers.models.t5.modeling_t5 import T5LayerNorm

    torch.manual_seed(0)
    hf = T5LayerNorm(13, eps=1e-6)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(13))
    ours = RMSNorm(13, eps=1e-6)
    ours.load_state_dict(hf.state_dict())
    x = torch.randn(2, 7, 13)
    torch.testing.assert_close(ours(x), hf(x), **TOL)


def test_rmsnorm_rejects_wrong_last_dimension():
    with pytest.raises(ValueError, match="last dimension 13"):
        RMSNorm(13)(torch.randn(2, 7, 12))


def test_make_norm_kinds_and_error():
    assert isinstance(make_norm("layernorm", 7), nn.LayerNorm)
    assert isinstance(make_norm("rmsnorm", 7), RMSNorm)
    with pytest.raises(ValueError, match="'layernorm' or 'rmsnorm'"):
        make_norm("batchnorm", 7)


# ------------------------------------------------------------------ residual forms

def test_residual_forms_match_their_equations():
    x = torch.randn(2, 7, 13, generator=gen())
    lin = nn.Linear(13, 13)
    ln = nn.LayerNorm(13)
    torch.testing.assert_close(residual(x, lin, ln, norm_first=True), x + lin(ln(x)), **TOL)
    torch.testing.assert_close(residual(x, lin, ln, norm_first=False), ln(x + lin(x)), **TOL)
    with pytest.raises(TypeError, match="norm_first must be a bool"):
        residual(x, lin, ln, norm_first="pre")


def test_pre_ln_jacobian_is_identity_plus_sublayer_and_post_ln_is_not():
    """Seed 003's two gradient formulas, checked with full Jacobians on one position."""
    torch.manual_seed(0)
    d = 7
    x = torch.randn(d)
    lin = nn.Linear(d, d)
    ln = nn.LayerNorm(d)
    jac = torch.autograd.functional.jacobian
    eye = torch.eye(d)
    # pre-LN: dy/dx = I + d f(LN(x)) / dx
    pre = jac(lambda v: residual(v, lin, ln, norm_first=True), x)
    torch.testing.assert_close(pre, eye + jac(lambda v: lin(ln(v)), x), **TOL)
    # post-LN: dy/dx = J_LN(x + f(x)) (I + J_f(x))
    post = jac(lambda v: residual(v, lin, ln, norm_first=False), x)
    torch.testing.assert_close(post, jac(ln, x + lin(x)) @ (eye + lin.weight), **TOL)
    # the LayerNorm Jacobian removes the mean direction: its rows sum to zero
    torch.testing.assert_close(post.sum(0), torch.zeros(d), **TOL)


# ------------------------------------------------------------------ FFN and blocks

def test_feedforward_is_two_linears_around_the_activation():
    torch.manual_seed(0)
    ffn = FeedForward(13, 29, activation="gelu_tanh")
    x = torch.randn(2, 7, 13)
    want = ffn.down(F.gelu(ffn.up(x), approximate="tanh"))
    torch.testing.assert_close(ffn(x), want, **TOL)


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_block_equals_torch_encoder_layer(norm_first, activation):
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(
        12, 3, 29, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    ).eval()
    with torch.no_grad():  # non-trivial norm parameters, so a swapped norm would show
        for p in (ref.norm1.weight, ref.norm1.bias, ref.norm2.weight, ref.norm2.bias):
            p.copy_(torch.randn_like(p))
    block = TransformerBlock.from_torch(ref).eval()
    assert block.norm_first is norm_first
    x = torch.randn(2, 7, 12)
    torch.testing.assert_close(block(x), ref(x), **TOL)
    mask = causal_mask(7)
    torch.testing.assert_close(block(x, mask=mask), ref(x, src_mask=~mask), **TOL)  # torch: True = blocked
    with torch.no_grad():  # torch's fused fast path, with a key padding mask
        keep = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
        got = block(x, mask=padding_mask(keep))
        want = ref(x, src_key_padding_mask=keep == 0)
        torch.testing.assert_close(got[0], want[0], **TOL)
        torch.testing.assert_close(got[1, :4], want[1, :4], **TOL)  # torch's fast path zeros padded rows


def test_post_ln_cross_block_equals_torch_decoder_layer():
    torch.manual_seed(0)
    ref = nn.TransformerDecoderLayer(12, 3, 29, dropout=0.0, batch_first=True, norm_first=False).eval()
    block = TransformerDecoderBlock(12, 3, 29, norm_first=False).eval()
    d = 12
    with torch.no_grad():
        block.self_attn.load_state_dict(
            {"qkv.weight": ref.self_attn.in_proj_weight, "qkv.bias": ref.self_attn.in_proj_bias,
             "out.weight": ref.self_attn.out_proj.weight, "out.bias": ref.self_attn.out_proj.bias})
        w, b = ref.multihead_attn.in_proj_weight, ref.multihead_attn.in_proj_bias
        block.cross_attn.load_state_dict(
            {"q.weight": w[:d], "q.bias": b[:d], "kv.weight": w[d:], "kv.bias": b[d:],
             "out.weight": ref.multihead_attn.out_proj.weight, "out.bias": ref.multihead_attn.out_proj.bias})
        block.ffn.up.load_state_dict(ref.linear1.state_dict())
        block.ffn.down.load_state_dict(ref.linear2.state_dict())
        for ours, theirs in ((block.norm1, ref.norm1), (block.norm_cross, ref.norm2), (block.norm2, ref.norm3)):
            theirs.weight.copy_(torch.randn(d))
            ours.load_state_dict(theirs.state_dict())
    x, ctx = torch.randn(2, 7, d), torch.randn(2, 13, d)
    mask = causal_mask(7)
    got = block(x, ctx, mask)
    want = ref(x, ctx, tgt_mask=~mask)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(block(x, ctx, is_causal=True), want, **TOL)  # the kernel's causal rule


def test_rmsnorm_block_uses_rmsnorm_and_keeps_shape():
    block = TransformerBlock(12, 3, 29, norm="rmsnorm")
    assert isinstance(block.norm1, RMSNorm) and isinstance(block.norm2, RMSNorm)
    assert block(torch.randn(2, 7, 12)).shape == (2, 7, 12)


def test_block_and_from_torch_errors():
    with pytest.raises(ValueError, match="needs a context"):
        TransformerDecoderBlock(12, 3, 29)(torch.randn(2, 7, 12), None)
    with pytest.raises(TypeError, match="norm_first must be a bool"):
        TransformerBlock(12, 3, 29, norm_first=1)
    with pytest.raises(ValueError, match="batch_first=True"):
        TransformerBlock.from_torch(nn.TransformerEncoderLayer(12, 3, 29, batch_first=False))
    with pytest.raises(TypeError, match="nn.TransformerEncoderLayer"):
        TransformerBlock.from_torch(nn.Linear(3, 3))


# ---------------------------------------------------------------- the open block

def test_make_norm_bias_switch_and_errors():
    assert make_norm("layernorm", 7, bias=False).bias is None
    assert make_norm("layernorm", 7).bias.shape == (7,)
    assert make_norm("layernorm", 7, 1e-6).eps == 1e-6
    with pytest.raises(ValueError, match="RMSNorm has no bias"):
        make_norm("rmsnorm", 7, bias=True)
    with pytest.raises(ValueError, match="eps must be positive"):
        make_norm("layernorm", 7, 0.0)


def _perturbed(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return module


def test_gated_feed_forward_equals_t5_v1_1_and_llama():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP
    from transformers.models.t5.modeling_t5 import T5DenseGatedActDense

    from companion.blocks import GatedFeedForward

    x = torch.randn(2, 7, 12)
    t5 = _perturbed(T5DenseGatedActDense(transformers.T5Config(d_model=12, d_ff=29, dropout_rate=0.0,
                                                                  feed_forward_proj="gated-gelu"))).eval()
    ours = GatedFeedForward(12, 29, activation="gelu_tanh")  # T5 v1.1: gelu_new on wi_0, times wi_1
    ours.load_state_dict({"gate.weight": t5.wi_0.weight, "up.weight": t5.wi_1.weight, "down.weight": t5.wo.weight})
    torch.testing.assert_close(ours(x), t5(x), **TOL)
    llama = _perturbed(LlamaMLP(transformers.LlamaConfig(hidden_size=12, intermediate_size=29, hidden_act="silu", num_attention_heads=3, num_key_value_heads=3))).eval()
    ours = GatedFeedForward(12, 29, activation="silu")  # SwiGLU
    ours.load_state_dict({"gate.weight": llama.gate_proj.weight, "up.weight": llama.up_proj.weight,
                          "down.weight": llama.down_proj.weight})
    torch.testing.assert_close(ours(x), llama(x), **TOL)


@pytest.mark.parametrize("norm_first", [True, False])
def test_block_composes_its_parts_and_passes_bias_and_mask(norm_first):
    from companion.attention import MultiHeadAttention
    from companion.blocks import Block, GatedFeedForward

    torch.manual_seed(0)
    attn = _perturbed(MultiHeadAttention(12, 3, d_head=5, backend="manual"), 1)
    ffn = _perturbed(GatedFeedForward(12, 17, activation="silu"), 2)
    n1, n2 = _perturbed(RMSNorm(12), 3), _perturbed(make_norm("layernorm", 12, bias=False), 4)
    block = Block(attn, ffn, n1, n2, norm_first=norm_first).eval()
    x = torch.randn(2, 7, 12)
    bias = torch.randn(1, 3, 7, 7)
    mask = padding_mask(torch.tensor([[1] * 7, [0, 0] + [1] * 5]))
    got = block(x, mask, bias=bias, is_causal=True)
    sub = lambda h: attn(h, mask, bias=bias, is_causal=True)
    if norm_first:
        h = x + sub(n1(x))
        want = h + ffn(n2(h))
    else:
        h = n1(x + sub(x))
        want = n2(h + ffn(h))
    torch.testing.assert_close(got, want, **TOL)
    with pytest.raises(TypeError, match="ffn must be an nn.Module"):
        Block(attn, lambda h: h, n1, n2)
    assert [name for name, _ in block.named_children()] == ["norm1", "self_attn", "norm2", "ffn", "drop"]  # forward order


def test_pre_ln_decoder_layer_from_torch_equals_torch():
    torch.manual_seed(0)
    ref = nn.TransformerDecoderLayer(12, 3, 29, dropout=0.0, batch_first=True, norm_first=True, activation="gelu").eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))  # LayerNorm biases and weights away from 0 and 1
    block = TransformerBlock.from_torch(ref).eval()
    assert isinstance(block, TransformerDecoderBlock) and block.norm_first
    x, ctx = torch.randn(2, 7, 12), torch.randn(2, 5, 12)
    mask = causal_mask(7)
    torch.testing.assert_close(block(x, ctx, mask), ref(x, ctx, tgt_mask=~mask), **TOL)
