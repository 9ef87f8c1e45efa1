"""Tiled attention with an online softmax (companion.tiled_attention) against exact attention."""

from __future__ import annotations

import math

import pytest
import torch

from companion.attention import scaled_dot_product_attention
from companion.tiled_attention import tiled_attention

ATOL = 1e-5


def _qkv(b, h, t, s, d, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, d, generator=g, dtype=dtype) for n in (t, s, s))


def _naive(q, k, v, causal):
    scale = 1 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-1, -2) * scale
    if causal:
        t, s = q.shape[-2], k.shape[-2]
        scores = scores.masked_fill(torch.ones(t, s, dtype=torch.bool).tril(s - t).logical_not(), float("-inf"))
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("t,s,bq,bk", [(16, 16, 4, 4), (13, 13, 5, 3), (7, 29, 4, 8), (1, 17, 64, 64), (33, 33, 64, 7)])
def test_equal_to_exact_attention_and_lse(causal, t, s, bq, bk):
    q, k, v = _qkv(2, 3, t, s, 8, seed=t * 100 + s)
    out, lse = tiled_attention(q, k, v, causal=causal, block_q=bq, block_k=bk, return_lse=True)
    want = scaled_dot_product_attention(q, k, v, is_causal=causal, backend="manual")
    ref_out, ref_lse = _naive(q, k, v, causal)
    torch.testing.assert_close(out, want, atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(out, ref_out, atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(lse, ref_lse, atol=ATOL, rtol=ATOL)


def test_queries_that_see_no_key_give_zeros_and_minus_inf():
    q, k, v = _qkv(1, 1, 6, 3, 4, seed=1)  # causal with S < T: the first 3 queries see nothing
    out, lse = tiled_attention(q, k, v, causal=True, block_q=2, block_k=2, return_lse=True)
    assert torch.equal(out[..., :3, :], torch.zeros_like(out[..., :3, :]))
    assert torch.isinf(lse[..., :3]).all() and torch.isfinite(lse[..., 3:]).all()
    torch.testing.assert_close(out[..., 3:, :], _naive(q[..., 3:, :], k, v, True)[0], atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("causal", [False, True])
def test_backward_by_recomputation_equals_autograd(causal):
    q, k, v = (x.double().requires_grad_() for x in _qkv(2, 2, 11, 11, 6, seed=5))
    g = torch.randn(2, 2, 11, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    tiled_attention(q, k, v, causal=causal, block_q=4, block_k=3).backward(g)
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    _naive(q, k, v, causal)[0].backward(g)
    for got, x in zip(grads, (q, k, v)):
        torch.testing.assert_close(got, x.grad, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("causal,t,s", [(True, 5, 13), (False, 9, 4), (True, 1, 7)])
def test_float32_backward_with_a_kv_offset_and_odd_lengths_equals_autograd(causal, t, s):
    # Chapter 13: the gradients of the recomputing backward pass, float32, queries and keys of different odd lengths.
    q, k, v = (x.requires_grad_() for x in _qkv(2, 3, t, s, 5, seed=t * s))
    g = torch.randn(2, 3, t, 5, generator=torch.Generator().manual_seed(1))
    tiled_attention(q, k, v, causal=causal, block_q=2, block_k=3).backward(g)
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    _naive(q, k, v, causal)[0].backward(g)
    for got, x in zip(grads, (q, k, v)):
        torch.testing.assert_close(got, x.grad, atol=ATOL, rtol=ATOL)


def test_gradcheck_with_a_kv_offset():
    q, k, v = (x.double().requires_grad_() for x in _qkv(1, 1, 3, 7, 4, seed=7))
    assert torch.autograd.gradcheck(lambda a, b, c: tiled_attention(a, b, c, causal=True, block_q=2, block_k=3),
                                    (q, k, v))


@pytest.mark.parametrize("causal,t,s", [(False, 5, 7), (True, 7, 7), (True, 6, 3)])
def test_a_loss_through_the_log_sum_exp_gets_its_gradient(causal, t, s):
    # d lse_i / d s_ij = P_ij: before the fix a loss through the returned lse got a zero gradient.
    # (True, 6, 3): causal with S < T, the first 3 queries see no key (lse -inf, no gradient).
    q, k, v = (x.double().requires_grad_() for x in _qkv(1, 2, t, s, 4, seed=t + s))
    w = torch.randn(1, 2, t, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    seen = slice(max(t - s, 0), None) if causal else slice(None)

    def loss(out, lse):  # both outputs; the naive reference gets only the queries that see a key (no NaN rows)
        return (out[..., -out.shape[-2]:, :] * w[..., seen, :]).sum() + (lse[..., -lse.shape[-1]:] ** 2).sum()

    out, lse = tiled_attention(q, k, v, causal=causal, block_q=2, block_k=3, return_lse=True)
    got = torch.autograd.grad(loss(out[..., seen, :], lse[..., seen]), (q, k, v))
    want = torch.autograd.grad(loss(*_naive(q[..., seen, :], k, v, causal)), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    lse_only = torch.autograd.grad(tiled_attention(q, k, v, causal=causal, block_q=2, block_k=3,
                                                   return_lse=True)[1][..., seen].sum(), q)[0]
    assert lse_only.abs().max() > 0.1  # not the zero gradient of before
    assert torch.autograd.gradcheck(
        lambda a, b, c: tiled_attention(a, b, c, causal=causal, block_q=2, block_k=3, return_lse=True)[1][..., seen],
        (q, k, v))


def test_bad_inputs_say_what_is_wrong():
    q, k, v = _qkv(1, 1, 4, 4, 8, seed=0)
    with pytest.raises(ValueError, match="block_q"):
        tiled_attention(q, k, v, block_q=0)
    with pytest.raises(ValueError, match="shapes do not fit"):
        tiled_attention(q, k[..., :5], v)


def test_peak_memory_helper_counts_a_known_allocation():
    from companion.memory import peak_tensor_bytes

    x = torch.randn(100, 100)
    _, peak = peak_tensor_bytes(lambda a: (a @ a).sum(), x)
    assert peak == 100 * 100 * 4 + 4  # the (100, 100) product alive with the scalar sum
    _, peak_view = peak_tensor_bytes(lambda a: a.t().contiguous().t(), x)
    assert peak_view == 100 * 100 * 4  # one copy; views add nothing


def test_tiled_memory_grows_linearly_and_naive_quadratically():
    from companion.memory import peak_tensor_bytes

    peaks = {}
    for t in (512, 1024, 2048):
        q, k, v = _qkv(1, 1, t, t, 16, seed=t)
        peaks[t] = (peak_tensor_bytes(lambda: _naive(q, k, v, False)[0])[1],
                    peak_tensor_bytes(lambda: tiled_attention(q, k, v, block_q=64, block_k=64))[1])
    # the increments of a + b T double when T doubles; those of a + b T + c T^2 tend to quadruple
    def growth(i):
        return (peaks[2048][i] - peaks[1024][i]) / (peaks[1024][i] - peaks[512][i])

    assert 3.8 < growth(0) < 4.2, peaks  # naive: the T x T scores
    assert 1.8 < growth(1) < 2.2, peaks  # tiled: O(T) outputs and statistics, plus one fixed tile
    assert peaks[2048][1] < peaks[2048][0] / 10
