"""Tests of companion.efficient_attention and the sparse masks (Chapter 13).

References are independent: full attention written out with the mask built by a
Python loop, HF-free formulas (exp(q . k) for the random-feature kernel), and
the cached-vs-uncached pair for a grouped-query GPT.
"""

import math

import pytest
import torch

from companion.attention import MultiHeadAttention, scaled_dot_product_attention
from companion.efficient_attention import (bigbird_attention, favor_features, gqa_from_mha, linformer_attention,
                                           linformer_projections, orthogonal_random_features, performer_attention,
                                           sliding_window_attention)
from companion.generation import generate
from companion.kv_cache import KVCache, kv_cache_bytes
from companion.masks import bigbird_mask, sliding_window_mask
from companion.models.gpt import GPT, GPTConfig
from companion.positional import alibi_bias, alibi_slopes, apply_rope, rope_cos_sin

ATOL = 1e-5


def _qkv(b, h, t, d, seed, s=None):
    g = torch.Generator().manual_seed(seed)
    s = t if s is None else s
    return torch.randn(b, h, t, d, generator=g), torch.randn(b, h, s, d, generator=g), torch.randn(b, h, s, d, generator=g)


def _loop_window_mask(t, window, global_tokens, causal):
    m = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):
        for j in range(t):
            ok = abs(i - j) <= window or i in global_tokens or j in global_tokens
            m[i, j] = ok and (j <= i or not causal)
    return m


def _full(q, k, v, mask, bias=None):
    """Full attention written out, -inf masking (no row is empty in these patterns)."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("t,window,global_tokens,causal", [
    (13, 2, (), False), (13, 2, (0, 5), False), (13, 3, (0, 12), True), (7, 0, (3,), False),
    (29, 4, (1,), True), (5, 9, (), False), (1, 1, (), True), (31, 5, (0, 7, 30), False)])
def test_sliding_window_equals_full_attention_with_the_mask(t, window, global_tokens, causal):
    mask = _loop_window_mask(t, window, global_tokens, causal)
    assert torch.equal(sliding_window_mask(t, window, global_tokens=list(global_tokens), causal=causal), mask)
    q, k, v = _qkv(2, 3, t, 8, seed=t + window)
    got = sliding_window_attention(q, k, v, window, global_tokens=global_tokens, causal=causal)
    torch.testing.assert_close(got, _full(q, k, v, mask), atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("causal", [False, True])
def test_sliding_window_with_alibi_and_with_rope(causal):
    t, h, window, glob = 17, 4, 3, [2]
    q, k, v = _qkv(1, h, t, 8, seed=5)
    mask = _loop_window_mask(t, window, glob, causal)
    rel = (torch.arange(t)[None, :] - torch.arange(t)[:, None]).abs()
    slopes = alibi_slopes(h)
    bias = -slopes[:, None, None] * rel  # ALiBi written out
    got = sliding_window_attention(q, k, v, window, global_tokens=glob, causal=causal, slopes=slopes)
    torch.testing.assert_close(got, _full(q, k, v, mask, bias), atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(bias, alibi_bias(h, t))
    cos, sin = rope_cos_sin(t, 8)
    qr, kr = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    got = sliding_window_attention(qr, kr, v, window, global_tokens=glob, causal=causal)
    torch.testing.assert_close(got, _full(qr, kr, v, mask), atol=ATOL, rtol=ATOL)


def test_sliding_window_scores_are_linear_in_length():
    from companion.memory import peak_tensor_bytes

    sizes = {}
    for t in (256, 512, 1024):
        q, k, v = _qkv(1, 1, t, 16, seed=0)
        _, sizes[t] = peak_tensor_bytes(sliding_window_attention, q, k, v, 16)
    assert 1.6 < sizes[1024] / sizes[512] < 2.4 and 1.6 < sizes[512] / sizes[256] < 2.4, sizes


def test_sliding_window_bad_inputs():
    q, k, v = _qkv(1, 2, 6, 4, seed=0)
    with pytest.raises(ValueError, match="window"):
        sliding_window_attention(q, k, v, -1)
    with pytest.raises(ValueError, match="global_tokens"):
        sliding_window_attention(q, k, v, 1, global_tokens=[6])
    with pytest.raises(ValueError, match="slopes"):
        sliding_window_attention(q, k, v, 1, slopes=torch.ones(3))
    with pytest.raises(ValueError, match="T == S"):
        sliding_window_attention(q, k[:, :, :5], v[:, :, :5], 1)


def test_bigbird_mask_pattern():
    g = torch.Generator().manual_seed(3)
    n, bs, r = 9, 3, 2
    mask = bigbird_mask(n, bs, n_random_blocks=r, generator=g)
    blocks = mask[::bs, ::bs]  # (n, n): one entry per block pair
    assert torch.equal(mask, blocks.repeat_interleave(bs, 0).repeat_interleave(bs, 1))
    assert blocks[[0, -1]].all() and blocks[:, [0, -1]].all()  # global blocks
    for i in range(1, n - 1):
        window = {max(i - 1, 0), i, min(i + 1, n - 1)}
        assert all(blocks[i, j] for j in window)
        extra = set(blocks[i].nonzero().flatten().tolist()) - window - {0, n - 1}
        assert len(extra) == r, (i, extra)  # exactly r random blocks outside window and global
    q, k, v = _qkv(1, 2, n * bs, 8, seed=1)
    got = bigbird_attention(q, k, v, bs, n_random_blocks=r, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(got, _full(q, k, v, mask), atol=ATOL, rtol=ATOL)
    bias = alibi_bias(2, n * bs)
    got = bigbird_attention(q, k, v, bs, n_random_blocks=r, generator=torch.Generator().manual_seed(3), bias=bias)
    torch.testing.assert_close(got, _full(q, k, v, mask, bias), atol=ATOL, rtol=ATOL)
    with pytest.raises(ValueError, match="multiple"):
        bigbird_attention(q[:, :, :-1], k[:, :, :-1], v[:, :, :-1], bs)


def test_linformer_identity_projection_is_full_attention_and_shapes():
    q, k, v = _qkv(2, 3, 11, 8, seed=2, s=11)
    eye = torch.eye(11)
    torch.testing.assert_close(linformer_attention(q, k, v, eye, eye), _full(q, k, v, torch.ones(11, 11, dtype=torch.bool)),
                               atol=ATOL, rtol=ATOL)
    e, f = linformer_projections(11, 4, generator=torch.Generator().manual_seed(0))
    assert e.shape == f.shape == (4, 11)
    assert abs(e.var().item() - 1 / 4) < 0.15
    want = torch.softmax(q @ (e @ k).transpose(-1, -2) / math.sqrt(8), -1) @ (f @ v)
    torch.testing.assert_close(linformer_attention(q, k, v, e, f), want, atol=ATOL, rtol=ATOL)
    with pytest.raises(ValueError, match="e"):
        linformer_attention(q, k, v, e[:, :10], f)


def test_orthogonal_features_are_orthogonal_within_blocks():
    w = orthogonal_random_features(20, 8, generator=torch.Generator().manual_seed(0))
    assert w.shape == (20, 8)
    block = w[:8] / w[:8].norm(dim=-1, keepdim=True)
    torch.testing.assert_close(block @ block.T, torch.eye(8), atol=1e-5, rtol=0)


def test_favor_kernel_is_unbiased_and_its_error_shrinks_with_features():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 16, generator=g) * 0.25, torch.randn(9, 16, generator=g) * 0.25  # |x|^2 ~ 1: modest variance
    exact = torch.exp(x @ y.T)

    def estimate(m, seed):
        w = orthogonal_random_features(m, 16, generator=torch.Generator().manual_seed(seed))
        # without stabilisers: phi(x) . phi(y) estimates exp(x . y) itself
        phi = lambda z: torch.exp(z @ w.T - (z * z).sum(-1, keepdim=True) / 2) / math.sqrt(m)  # noqa: E731
        return phi(x) @ phi(y).T

    mean = torch.stack([estimate(64, s) for s in range(200)]).mean(0)
    assert ((mean - exact).abs() / exact).max() < 0.1  # unbiased: the average converges
    err = {m: sum(((estimate(m, s) - exact).abs() / exact).mean() for s in range(20)) / 20 for m in (16, 64, 256)}
    assert err[256] < err[64] < err[16], err
    assert err[16] / err[256] > 2, err  # about 1/sqrt(M): 4x less error for 16x the features
    phi = favor_features(x, orthogonal_random_features(32, 16), is_query=True)
    assert (phi > 0).all()


@pytest.mark.parametrize("causal", [False, True])
def test_performer_approaches_softmax_attention(causal):
    q, k, v = _qkv(1, 2, 12, 8, seed=4)
    q, k = q * 0.5, k * 0.5
    mask = torch.ones(12, 12, dtype=torch.bool).tril() if causal else torch.ones(12, 12, dtype=torch.bool)
    exact = _full(q, k, v, mask)
    errs = []
    for m in (8, 512):
        e = [(performer_attention(q, k, v, orthogonal_random_features(m, 8, generator=torch.Generator().manual_seed(s)),
                                  causal=causal) - exact).abs().mean() for s in range(10)]
        errs.append(sum(e) / len(e))
    assert errs[1] < errs[0] / 3 and errs[1] < 0.05, errs


def test_performer_exact_when_kernel_is_exact():
    # With the feature map replaced by a check of the linear-attention algebra: causal prefix sums equal
    # the masked quadratic form phi(q) phi(k)^T.
    q, k, v = _qkv(2, 2, 9, 4, seed=6)
    w = orthogonal_random_features(16, 4, generator=torch.Generator().manual_seed(0))
    pq = favor_features(q * 4 ** -0.25, w, is_query=True)
    pk = favor_features(k * 4 ** -0.25, w, is_query=False)
    a = (pq @ pk.transpose(-1, -2)).tril()
    want = (a @ v) / a.sum(-1, keepdim=True)
    torch.testing.assert_close(performer_attention(q, k, v, w, causal=True), want, atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("bias", [True, False])
def test_gqa_from_mha_with_groups_equal_to_heads_is_the_same_layer(bias):
    torch.manual_seed(0)
    mha = MultiHeadAttention(24, 6, bias=bias).eval()
    x = torch.randn(2, 7, 24)
    torch.testing.assert_close(gqa_from_mha(mha, 6)(x, is_causal=True), mha(x, is_causal=True), atol=ATOL, rtol=ATOL)


def test_gqa_equals_mha_with_repeated_pooled_heads():
    torch.manual_seed(1)
    mha = MultiHeadAttention(24, 6).eval()
    gqa = gqa_from_mha(mha, 2)
    assert gqa.n_kv_heads == 2 and gqa.qkv.out_features == (6 + 2 * 2) * 4
    # the MHA that reads the pooled head of its group, written by hand
    ref = MultiHeadAttention(24, 6).eval()
    ref.load_state_dict(mha.state_dict())
    with torch.no_grad():
        for p in (ref.qkv.weight, ref.qkv.bias):
            _, wk, wv = p.split(24, dim=0)
            for w in (wk, wv):
                heads = w.unflatten(0, (6, 4)).clone()
                for g in range(2):
                    w.unflatten(0, (6, 4))[3 * g:3 * g + 3] = heads[3 * g:3 * g + 3].mean(0)
    x = torch.randn(3, 5, 24)
    torch.testing.assert_close(gqa(x), ref(x), atol=ATOL, rtol=ATOL)
    with pytest.raises(ValueError, match="divisible"):
        gqa_from_mha(mha, 4)


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_gqa_gpt_cached_generation_equals_uncached_and_cache_bytes(n_kv_heads):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=37, max_positions=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads)
    model = GPT(cfg).eval()
    idx = torch.randint(0, 37, (2, 5))
    with torch.no_grad():
        cached = generate(model, idx, 9, use_cache=True)
        plain = generate(model, idx, 9, use_cache=False)
        assert torch.equal(cached, plain)
        cache = KVCache(2)
        full = model(cached, cache=cache)
        steps = model(cached[:, :6], cache=KVCache(2))
        torch.testing.assert_close(steps, full[:, :6], atol=ATOL, rtol=ATOL)
    assert cache.keys[0].shape == (2, n_kv_heads, 14, 8)
    assert cache.nbytes() == kv_cache_bytes(2, n_kv_heads, 8, 14, batch_size=2) == 2 * 2 * n_kv_heads * 8 * 14 * 4 * 2


def test_gpt_config_rejects_bad_kv_heads():
    with pytest.raises(ValueError, match="n_kv_heads"):
        GPTConfig(vocab_size=10, max_positions=8, d_model=16, n_layers=1, n_heads=4, n_kv_heads=3)
