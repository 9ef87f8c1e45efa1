"""Checks for the Chapter 10 exercises (decoding and the KV cache).

Each case builds random inputs, runs the student's code and compares with the
reference in :mod:`companion.generation`, :mod:`companion.attention` and
:mod:`companion.masks`.
"""

from __future__ import annotations

import torch

from ..attention import scaled_dot_product_attention
from ..generation import beam_search_step, top_k_filter, top_p_filter
from ..masks import causal_mask
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, input_after_call, register, run_student


def _logits(*shape, seed=0, scale=2.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


# ----------------------------------------------------------------- 10.1 top-k

def _topk_random(student):
    logits = _logits(4, 13)
    for k in (1, 3, 7):
        expect_tensor(student(logits.clone(), k), top_k_filter(logits, k), name=f"top_k_filter(logits (4, 13), k={k})")


def _topk_large_k(student):
    logits = _logits(2, 5, seed=1)
    for k in (5, 9):
        expect_tensor(student(logits.clone(), k), logits, name=f"top_k_filter with k={k} >= V=5 (keeps everything)")


def _topk_ties(student):
    logits = torch.tensor([[1.0, 3.0, 2.0, 2.0, 0.0], [0.5, 0.5, 0.5, 0.5, 0.5]])
    expect_tensor(student(logits.clone(), 2), top_k_filter(logits, 2),
                  name="top_k_filter(k=2) with ties: every logit equal to the 2nd largest is kept")


def _topk_batch_dims(student):
    logits = _logits(2, 3, 11, seed=2)
    expect_tensor(student(logits.clone(), 4), top_k_filter(logits, 4), name="top_k_filter on logits of shape (2, 3, 11)")


def _topk_no_mutation(student):
    logits = _logits(3, 9, seed=3)
    after = run_student(input_after_call, student, logits.clone(), 2)
    expect_true(torch.equal(after, logits), "top_k_filter changed its input in place; return a new tensor")


register(Exercise(
    id="10.1",
    title="Top-k filtering",
    targets=("top_k_filter",),
    forbidden=("companion.generation",),  # the reference itself
    cases=(
        Case("random logits (B=4, V=13), k = 1, 3, 7", 3, _topk_random),
        Case("k >= V keeps every token", 1, _topk_large_k),
        Case("ties with the k-th largest are kept", 1, _topk_ties),
        Case("works on any leading dimensions (..., V)", 1, _topk_batch_dims),
        Case("does not modify its input", 1, _topk_no_mutation),
    ),
))


# ----------------------------------------------------------------- 10.2 top-p

def _topp_random(student):
    logits = _logits(5, 17, seed=4)
    for p in (0.3, 0.6, 0.9):
        expect_tensor(student(logits.clone(), p), top_p_filter(logits, p), name=f"top_p_filter(logits (5, 17), p={p})")


def _topp_small(student):
    logits = _logits(3, 8, seed=5)
    expect_tensor(student(logits.clone(), 1e-4), top_p_filter(logits, 1e-4),
                  name="top_p_filter with p=1e-4 (only the most probable token survives)")


def _topp_one(student):
    logits = _logits(2, 6, seed=6)
    expect_tensor(student(logits.clone(), 1.0), logits, name="top_p_filter with p=1 (keeps everything)")


def _topp_peaked(student):
    logits = torch.tensor([[8.0, 1.0, 0.0, -1.0, 0.5, 0.2, -3.0]])
    expect_tensor(student(logits.clone(), 0.5), top_p_filter(logits, 0.5),
                  name="top_p_filter(p=0.5) when one token alone holds more than p")


def _topp_mass(student):
    logits = _logits(6, 23, seed=7)
    p = 0.8
    out = student(logits.clone(), p)
    if not isinstance(out, torch.Tensor) or out.shape != logits.shape:
        raise CheckFailed(f"top_p_filter should return a tensor of shape {tuple(logits.shape)}")
    kept = torch.isfinite(out)
    mass = (logits.softmax(-1) * kept).sum(-1)
    expect_true(bool((mass >= p - 1e-6).all()), f"the kept tokens hold only {mass.min():.3f} of the probability, less than p={p}")
    expect_tensor(out, top_p_filter(logits, p), name="top_p_filter(logits (6, 23), p=0.8)")


register(Exercise(
    id="10.2",
    title="Top-p (nucleus) filtering",
    targets=("top_p_filter",),
    forbidden=("companion.generation",),  # the reference itself
    cases=(
        Case("random logits (B=5, V=17), p = 0.3, 0.6, 0.9", 3, _topp_random),
        Case("tiny p keeps only the most probable token", 1, _topp_small),
        Case("p = 1 keeps every token", 1, _topp_one),
        Case("one dominant token", 1, _topp_peaked),
        Case("the nucleus holds at least p of the probability", 1, _topp_mass),
    ),
))


# ----------------------------------------------------------------- 10.3 one beam-search step

def _as_triple(result):
    if not (isinstance(result, tuple) and len(result) == 3):
        raise CheckFailed(f"beam_step should return a triple (scores, beam, token), got {type(result).__name__}")
    return result


def _beam_case(student, k, v, n, seed, first=False):
    log_probs = _logits(k, v, seed=seed).log_softmax(-1)
    beam_scores = -torch.rand(k, generator=torch.Generator().manual_seed(seed + 100)) * 5
    if first:
        beam_scores = torch.full((k,), -1e9)
        beam_scores[0] = 0.0
    scores, beam, token = _as_triple(student(log_probs, beam_scores, n))
    want_s, want_b, want_t = beam_search_step(log_probs, beam_scores, n)
    expect_tensor(scores, want_s, name=f"scores (K={k}, V={v}, n={n})")
    expect_tensor(beam, want_b, name=f"beam (K={k}, V={v}, n={n})")
    expect_tensor(token, want_t, name=f"token (K={k}, V={v}, n={n})")


register(Exercise(
    id="10.3",
    title="One step of beam search",
    targets=("beam_step",),
    forbidden=("companion.generation",),  # the reference itself
    cases=(
        Case("K=3 beams, V=11, keep 6", 3, lambda s: _beam_case(s, 3, 11, 6, seed=8)),
        Case("first step: only beam 0 is live", 2, lambda s: _beam_case(s, 4, 9, 8, seed=9, first=True)),
        Case("one beam (greedy-like), V=7, keep 2", 1, lambda s: _beam_case(s, 1, 7, 2, seed=10)),
        Case("keep every candidate (n = K * V)", 1, lambda s: _beam_case(s, 2, 5, 10, seed=11)),
    ),
))


# ----------------------------------------------------------------- 10.4 attention with a KV cache

def _qkv(b, h, t, dh, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, t, dh, generator=g) for _ in range(3))


def _cache_triple(result):
    if not (isinstance(result, tuple) and len(result) == 3):
        raise CheckFailed(f"attend_with_cache should return a triple (out, k_all, v_all), got {type(result).__name__}")
    return result


def _full_reference(q_all, k_all, v_all, t_new):
    s = k_all.shape[2]
    out = scaled_dot_product_attention(q_all, k_all, v_all, causal_mask(s))  # (B, H, S, Dh)
    return out[:, :, s - t_new:]


def _cache_empty(student):
    q, k, v = _qkv(2, 3, 5, 4, seed=12)
    out, k_all, v_all = _cache_triple(student(q, k, v, None, None))
    expect_tensor(k_all, k, name="k_all with an empty cache (equals k)")
    expect_tensor(v_all, v, name="v_all with an empty cache (equals v)")
    expect_tensor(out, _full_reference(q, k, v, 5), name="out for a prompt of 5 tokens (causal)")


def _cache_one_token(student):
    q, k, v = _qkv(2, 2, 13, 6, seed=13)
    out, k_all, v_all = _cache_triple(student(q[:, :, -1:], k[:, :, -1:], v[:, :, -1:], k[:, :, :-1], v[:, :, :-1]))
    expect_tensor(k_all, k, name="k_all after appending one token to 12 cached")
    expect_tensor(v_all, v, name="v_all after appending one token to 12 cached")
    expect_tensor(out, _full_reference(q, k, v, 1), name="out of the new token (sees all 13 keys)")


def _cache_several(student):
    q, k, v = _qkv(1, 3, 10, 4, seed=14)
    out, k_all, v_all = _cache_triple(student(q[:, :, 7:], k[:, :, 7:], v[:, :, 7:], k[:, :, :7], v[:, :, :7]))
    expect_tensor(k_all, k, name="k_all after appending 3 tokens to 7 cached")
    expect_tensor(out, _full_reference(q, k, v, 3),
                  name="out of 3 new tokens (new token i sees the cache and new tokens 0..i, not later ones)")


def _cache_loop(student):
    q, k, v = _qkv(2, 2, 9, 5, seed=15)
    past_k = past_v = None
    outs = []
    for t in range(9):
        out, past_k, past_v = _cache_triple(student(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], past_k, past_v))
        outs.append(out)
    if not all(isinstance(o, torch.Tensor) for o in outs):
        raise CheckFailed("attend_with_cache should return tensors")
    expect_tensor(torch.cat(outs, dim=2), _full_reference(q, k, v, 9),
                  name="9 single-token steps, concatenated (must equal full causal attention)")


register(Exercise(
    id="10.4",
    title="Attention with a KV cache",
    targets=("attend_with_cache",),
    forbidden=("companion.kv_cache", "companion.attention", "companion.generation"),  # the reference itself
    cases=(
        Case("empty cache: a causal prompt", 2, _cache_empty),
        Case("one new token after 12 cached", 2, _cache_one_token),
        Case("three new tokens at once (bottom-right causal mask)", 2, _cache_several),
        Case("token-by-token decoding equals full attention", 2, _cache_loop),
    ),
))
