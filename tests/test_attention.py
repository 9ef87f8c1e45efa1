"""companion.attention: manual attention vs PyTorch's kernels, masks, errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from companion.attention import MultiHeadAttention, merge_heads, scaled_dot_product_attention, split_heads
from companion.masks import causal_mask, padding_mask

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
    got, got_w = ours(x, mask, return_weights=True)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(got_w, want_w, **TOL)
    torch.testing.assert_close(ours(x, mask), want, **TOL)  # sdpa backend


def test_mha_backends_agree_and_cross_attention_runs():
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 4, cross=True).eval()
    x, ctx = torch.randn(2, 5, 16), torch.randn(2, 9, 16)
    mask = padding_mask(torch.tensor([[1] * 9, [1] * 6 + [0] * 3]))
    a = layer(x, mask, context=ctx)
    layer.backend = "manual"
    torch.testing.assert_close(layer(x, mask, context=ctx), a, **TOL)
    assert a.shape == (2, 5, 16)


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
        (lambda: MultiHeadAttention(8, 2)(torch.zeros(2, 3, 6)), "shape"),
        (lambda: scaled_dot_product_attention(*qkv(), return_weights=True, backend="sdpa"), "manual"),
    ],
)
def test_bad_input_gets_a_clear_error(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()
