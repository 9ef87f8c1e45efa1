"""Checks for the Chapter 10 exercises (decoding and the KV cache).

Each case builds random inputs, runs the student's code and compares with the
reference in :mod:`companion.generation`, :mod:`companion.attention` and
:mod:`companion.masks`.
"""

from __future__ import annotations

import math

import torch

from ..attention import scaled_dot_product_attention
from ..generation import beam_search_step, generate, top_k_filter, top_p_filter
from ..kv_cache import KVCache, kv_cache_bytes
from ..masks import causal_mask
from ..models.gpt import GPT, GPTConfig
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, input_after_call, register, run_student, student_model_with


def _logits(*shape, seed=0, scale=2.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


# ----------------------------------------------------------------- 10.1 top-k with one k per row
#
# The chapter's top_k(logits, k) takes one int k for the whole batch. A server batches requests with different
# settings: here k is a LongTensor (B,), one k per row, 0 meaning "no top-k for this row" (transformers' top_k=0).
# The reference applies companion's top_k_filter row by row (a different route from the student's batched one).

def _per_row_top_k_reference(logits, k):
    v = logits.shape[-1]
    rows = [row if not 0 < int(kb) < v else top_k_filter(row, int(kb)) for row, kb in zip(logits, k)]
    return torch.stack(rows)


def _expect_filtered(got, want, what):
    """The kept set first (finite entries, a boolean comparison that names the first wrong token), then the values."""
    if isinstance(got, torch.Tensor) and got.shape == want.shape and got.is_floating_point():
        expect_tensor(torch.isfinite(got), torch.isfinite(want), name=f"the kept tokens of {what} (True = kept)")
    expect_tensor(got, want, name=what)


def _per_row_case(student, logits, k, what):
    _expect_filtered(student(logits.clone(), k.clone()), _per_row_top_k_reference(logits, k), what)


def _topk_random(student):
    logits = _logits(6, 13)
    k = torch.tensor([1, 3, 7, 2, 12, 5])
    _per_row_case(student, logits, k, "top_k(logits (6, 13), k=[1, 3, 7, 2, 12, 5])")


def _topk_no_filter(student):
    logits = _logits(4, 9, seed=1)
    k = torch.tensor([0, 2, 9, 15])
    _per_row_case(student, logits, k, "top_k(logits (4, 9), k=[0, 2, 9, 15]): k=0 and k >= V=9 keep their whole row")


def _topk_ties(student):
    logits = torch.tensor([[1.0, 3.0, 2.0, 2.0, 0.0], [0.5, 0.5, 0.5, 0.5, 0.5], [4.0, 4.0, 1.0, 1.0, 1.0]])
    k = torch.tensor([2, 1, 3])
    _per_row_case(student, logits, k, "top_k with ties, k=[2, 1, 3]: every logit equal to the k-th largest is kept")


def _topk_many_rows(student):
    logits = _logits(40, 50, seed=2)
    k = torch.randint(0, 60, (40,), generator=torch.Generator().manual_seed(3))
    _per_row_case(student, logits, k, "top_k(logits (40, 50), 40 random k in 0..59)")


def _topk_no_mutation(student):
    logits = _logits(3, 9, seed=3)
    after = run_student(input_after_call, student, logits.clone(), torch.tensor([2, 0, 4]))
    expect_true(torch.equal(after, logits), "top_k changed its input in place; return a new tensor")


register(Exercise(
    id="10.1",
    title="Top-k with one k per row",
    targets=("top_k",),
    forbidden=("companion.generation",),  # the reference itself
    cases=(
        Case("a different k in each row (B=6, V=13)", 3, _topk_random),
        Case("k = 0 and k >= V keep the whole row", 1, _topk_no_filter),
        Case("ties with the k-th largest are kept", 1, _topk_ties),
        Case("40 rows, random k from 0 to 59", 1, _topk_many_rows),
        Case("does not modify its input", 1, _topk_no_mutation),
    ),
))


# ----------------------------------------------------------------- 10.2 locally typical sampling
#
# Meister et al. (TACL 2023): keep the tokens whose surprisal -log p_i is closest to the entropy H, the smallest
# such set holding mass tau. The chapter's top_p with another order: |-log p_i - H| ascending instead of p_i
# descending; token (r) of that order is kept when the mass before it is below tau (transformers'
# TypicalLogitsWarper, tests/test_grading_ch10_redesign.py). The reference below is a plain float64 loop.

def typical_reference(logits: torch.Tensor, tau: float, *, keep_crossing: bool = True) -> torch.Tensor:
    """The typical set of every row of ``logits`` (..., V), the others set to -inf; a loop in float64.

    ``keep_crossing=False`` is a known mistake (the token whose mass crosses tau is dropped), for the hints.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    keep = torch.zeros(flat.shape, dtype=torch.bool)
    for b, row in enumerate(flat.double()):
        p = row.softmax(-1).tolist()
        h = -sum(q * math.log(q) for q in p if q > 0)  # 0 log 0 = 0: a -inf logit adds nothing
        gap = [abs(-math.log(q) - h) if q > 0 else math.inf for q in p]
        mass = 0.0
        for i in sorted(range(len(p)), key=lambda j: gap[j]):
            if mass >= tau or (not keep_crossing and mass + p[i] >= tau):
                break
            keep[b, i] = True
            mass += p[i]
    return logits.masked_fill(~keep.reshape(logits.shape), float("-inf"))


def _typical_hint(got, logits, tau):
    """A sentence naming a known mistake when the student's kept set is one of them, else ''."""
    if not (isinstance(got, torch.Tensor) and got.shape == logits.shape):
        return ""
    kept = torch.isfinite(got)
    if torch.equal(kept, torch.isfinite(top_p_filter(logits, tau))):
        return (" Your set is top-p's nucleus (tokens ordered by probability; so is an order by -log p_i - H "
                "without the absolute value). Order them by |-log p_i - H|, smallest first.")
    if torch.equal(kept, torch.isfinite(typical_reference(logits, tau, keep_crossing=False))):
        return (" Your set holds less than tau of the probability: keep the token whose mass crosses tau too "
                "(token (r) is kept when the mass before it is below tau).")
    return ""


def _typical_case(student, logits, tau, what):
    got = student(logits.clone(), tau)
    want = typical_reference(logits, tau)
    try:
        _expect_filtered(got, want, what)
    except CheckFailed as err:
        raise CheckFailed(str(err) + _typical_hint(got, logits, tau)) from None


def _typical_random(student):
    logits = _logits(5, 17, seed=4)
    for tau in (0.2, 0.5, 0.9):
        _typical_case(student, logits, tau, f"typical(logits (5, 17), tau={tau})")


def _typical_not_the_argmax(student):
    noise = 0.1 * torch.randn(2, 20, generator=torch.Generator().manual_seed(5))
    logits = torch.cat([torch.tensor([[2.0], [2.5]]), noise], dim=1)  # one likely token, a flat tail of 20
    _typical_case(student, logits, 0.5,
                  "typical(tau=0.5) on one likely token and a flat tail (the likely token is not typical)")


def _typical_filtered(student):
    logits = _logits(3, 12, seed=6)
    logits[0, 3:] = float("-inf")  # as after a top-k of 3
    logits[2, ::2] = float("-inf")
    try:
        _typical_case(student, logits, 0.6, "typical(tau=0.6) on logits with -inf entries")
    except CheckFailed as err:
        raise CheckFailed(f"{err} A -inf logit has p = 0 and log p = -inf, and PyTorch computes 0 * -inf as NaN: "
                          "count its term of the entropy as 0 (0 log 0 = 0).") from None


def _typical_tiny(student):
    logits = _logits(4, 10, seed=7)
    _typical_case(student, logits, 1e-4, "typical(tau=1e-4): only the most typical token survives")


def _typical_batch_dims(student):
    logits = _logits(2, 3, 11, seed=8)
    _typical_case(student, logits, 0.7, "typical on logits of shape (2, 3, 11), tau=0.7")


register(Exercise(
    id="10.2",
    title="Locally typical sampling",
    targets=("typical",),
    forbidden=("companion.generation", "transformers"),  # the references: companion's filters, transformers' warper
    cases=(
        Case("random logits (B=5, V=17), tau = 0.2, 0.5, 0.9", 3, _typical_random),
        Case("the most probable token can fall outside the set", 1, _typical_not_the_argmax),
        Case("logits already filtered to -inf", 1, _typical_filtered),
        Case("a tiny tau keeps the most typical token", 1, _typical_tiny),
        Case("works on any leading dimensions (..., V)", 1, _typical_batch_dims),
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


# ----------------------------------------------------------------- 10.5 your GPT with a KV cache
#
# The student's MyGPT (exercise 9.5, the names of Chapter 9's MiniGPT) gains a cache:
# model(idx) -> logits as before; model(idx, cache=[...]) -> (logits, cache), the cache a list with one
# (k, v) pair per layer, each (B, H, S, Dh), None for a layer with nothing cached yet (the chapter's
# forward_with_cache, returning the list so that it also comes back from another process).
# generate_greedy(model, idx, max_new_tokens, use_cache) is Chapter 10's greedy loop.
# The cases only call the student's objects, read attributes and pass plain data; the two that must see
# inside (what the loop feeds the model, whether the head is one tensor) run through run_student.

_GPT_CFG = GPTConfig(vocab_size=29, max_positions=24, d_model=20, n_layers=2, n_heads=5)  # Dh = 4: odd sizes


def _reference_gpt(cfg: GPTConfig = _GPT_CFG, seed: int = 0) -> GPT:
    """A random companion GPT; LayerNorms and biases moved off 1 and 0 so that a swapped tensor shows."""
    torch.manual_seed(seed)
    ref = GPT(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return ref


def _ids(b: int, t: int, seed: int, vocab: int = _GPT_CFG.vocab_size) -> torch.Tensor:
    return torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


def _student_gpt(cls, ref: GPT):
    """``cls(cfg)`` holding the reference's weights (the name map of the statement is the identity)."""
    return student_model_with(cls, ref.cfg, ref.state_dict(), what="MyGPT", like="Chapter 9's MiniGPT")


def _ref_logits(ref: GPT, idx: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return ref(idx)


def _ref_cache(ref: GPT, idx: torch.Tensor) -> KVCache:
    cache = KVCache(ref.cfg.n_layers)
    with torch.no_grad():
        ref(idx, cache=cache)
    return cache


def _list_forward(ref: GPT, idx, cache, *, restart_positions=False, ignore_past=False):
    """The chapter's forward_with_cache on the reference's modules (a new list is returned).

    ``restart_positions`` and ``ignore_past`` compute what two wrong caches give, to name the mistake.
    """
    past = [None] * ref.cfg.n_layers if cache is None or len(cache) == 0 else list(cache)
    start = 0 if past[0] is None or restart_positions else past[0][0].shape[2]
    x = ref.tok_emb(idx) + ref.pos_emb(torch.arange(start, start + idx.shape[1]))  # (B, T, D)
    new = []
    for i, block in enumerate(ref.blocks):
        attn = block.self_attn
        q, k, v = attn.qkv(block.norm1(x)).split(ref.cfg.d_model, dim=-1)  # 3 x (B, T, D)
        q, k, v = (z.unflatten(-1, (attn.n_heads, -1)).transpose(1, 2) for z in (q, k, v))  # (B, H, T, Dh)
        if past[i] is not None and not ignore_past:
            k, v = torch.cat([past[i][0], k], dim=2), torch.cat([past[i][1], v], dim=2)  # (B, H, S, Dh)
        new.append((k, v))
        t, s = q.shape[2], k.shape[2]
        scores = q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1])  # (B, H, T, S)
        causal = torch.ones(t, s, dtype=torch.bool).tril(s - t)  # bottom-right aligned
        out = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v  # (B, H, T, Dh)
        x = x + attn.out(out.transpose(1, 2).flatten(2))
        x = x + block.ffn(block.norm2(x))
    return ref.lm_head(ref.norm_f(x)), new


def _as_cached_result(result, b, t_new, s, cfg: GPTConfig, what):
    """Unpack ``model(idx, cache=...)``: a pair (logits, cache) with n_layers (k, v) pairs of the right shape."""
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise CheckFailed(f"{what}: model(idx, cache=...) should return a pair (logits, cache), "
                          f"got {type(result).__name__}")
    logits, cache = result
    if not isinstance(cache, (list, tuple)) or len(cache) != cfg.n_layers:
        got = f"a {type(cache).__name__} of {len(cache)}" if isinstance(cache, (list, tuple)) else type(cache).__name__
        raise CheckFailed(f"{what}: the cache should be a list of {cfg.n_layers} (k, v) pairs, one per layer, got {got}")
    shape = (b, cfg.n_heads, s, cfg.d_head)
    for i, pair in enumerate(cache):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2
                and all(isinstance(z, torch.Tensor) for z in pair)):
            raise CheckFailed(f"{what}: cache[{i}] should be a pair (k, v) of tensors, got {type(pair).__name__}")
        for name, z in zip("kv", pair):
            if tuple(z.shape) != shape:
                hint = ""
                if z.dim() == 4 and z.shape[2] == t_new and t_new != s:
                    hint = (f": it holds only the {t_new} new token(s); append the new keys and values to the "
                            f"cached ones (torch.cat along dim 2)")
                raise CheckFailed(f"{what}: cache[{i}] {name} should have shape (B, H, S, Dh) = {shape} after "
                                  f"{s} tokens, got {tuple(z.shape)}{hint}")
    return logits, cache


def _kv_no_cache(cls, generate_greedy):
    ref = _reference_gpt()
    model = _student_gpt(cls, ref)
    idx = _ids(2, 7, 1)
    want = _ref_logits(ref, idx)
    with torch.no_grad():  # the student's model gets copies of the inputs (in a notebook it is their own object)
        expect_tensor(model(idx.clone()), want, name="model(idx) without a cache, idx (2, 7)")


def _kv_prefill(cls, generate_greedy):
    ref = _reference_gpt()
    model = _student_gpt(cls, ref)
    idx = _ids(3, 5, 2)
    with torch.no_grad():
        logits, cache = _as_cached_result(model(idx.clone(), cache=[None] * _GPT_CFG.n_layers), 3, 5, 5, _GPT_CFG,
                                          "prefill of a (3, 5) prompt")
    expect_tensor(logits, _ref_logits(ref, idx), name="logits of the prefill (3, 5) (the full causal logits)")
    want = _ref_cache(ref, idx)
    for i in range(_GPT_CFG.n_layers):
        expect_tensor(cache[i][0], want.keys[i], name=f"cached keys of layer {i} after the prefill")
        expect_tensor(cache[i][1], want.values[i], name=f"cached values of layer {i} after the prefill")


def _step_message(got, ref, prefix, new_ids, past, step):
    """Name the mistake when a cached step's logits are wrong (positions restarted, past ignored)."""
    with torch.no_grad():
        for kwargs, what in (({"restart_positions": True}, "your positions restart at 0 for the new tokens: "
                              "they are S0, S0 + 1, ... with S0 the number of tokens already cached"),
                             ({"ignore_past": True}, "the new token attends only to itself: attend over the "
                              "cached keys and values with the new ones appended")):
            wrong, _ = _list_forward(ref, new_ids, past, **kwargs)
            if isinstance(got, torch.Tensor) and got.shape == wrong.shape and torch.allclose(got.float(), wrong, atol=1e-4):
                raise CheckFailed(f"step {step} after a prefill of {prefix} tokens: {what}")


def _kv_steps(cls, generate_greedy):
    ref = _reference_gpt()
    model = _student_gpt(cls, ref)
    seq = _ids(2, 11, 3)
    full = _ref_logits(ref, seq)
    with torch.no_grad():
        logits, cache = _as_cached_result(model(seq[:, :5].clone(), cache=[None] * _GPT_CFG.n_layers), 2, 5, 5, _GPT_CFG,
                                          "prefill of 5 tokens")
        _, ref_past = _list_forward(ref, seq[:, :5], None)
        steps = [logits]
        for t in range(5, 11):
            out, cache = _as_cached_result(model(seq[:, t:t + 1].clone(), cache=cache), 2, 1, t + 1, _GPT_CFG,
                                           f"step {t - 4} (token {t})")
            _step_message(out, ref, 5, seq[:, t:t + 1], ref_past, t - 4)
            expect_tensor(out, full[:, t:t + 1], name=f"logits of step {t - 4} (token {t}) after a prefill of 5")
            _, ref_past = _list_forward(ref, seq[:, t:t + 1], ref_past)
            steps.append(out)
    expect_tensor(torch.cat(steps, dim=1), full, name="prefill of 5 + 6 single-token steps, concatenated")


def _kv_chunk(cls, generate_greedy):
    ref = _reference_gpt()
    model = _student_gpt(cls, ref)
    seq = _ids(1, 10, 4)
    with torch.no_grad():
        _, cache = _as_cached_result(model(seq[:, :7].clone(), cache=[None] * _GPT_CFG.n_layers), 1, 7, 7, _GPT_CFG,
                                     "prefill of 7 tokens")
        out, _ = _as_cached_result(model(seq[:, 7:].clone(), cache=cache), 1, 3, 10, _GPT_CFG, "3 new tokens at once")
    expect_tensor(out, _ref_logits(ref, seq)[:, 7:],
                  name="logits of 3 new tokens after 7 cached (new token i sees the cache and new tokens 0..i)")


def _kv_memory(cls, generate_greedy):
    ref = _reference_gpt()
    model = _student_gpt(cls, ref)
    seq = _ids(2, 11, 5)
    with torch.no_grad():
        result = model(seq[:, :7].clone(), cache=[None] * _GPT_CFG.n_layers)
        for t in range(7, 11):
            result = model(seq[:, t:t + 1].clone(), cache=_as_cached_result(result, 2, 1 if t > 7 else 7, t, _GPT_CFG,
                                                                    f"after {t} tokens")[1])
    _, cache = _as_cached_result(result, 2, 1, 11, _GPT_CFG, "after 11 tokens")
    held = sum(z.numel() * z.element_size() for pair in cache for z in pair)
    c = _GPT_CFG
    want = kv_cache_bytes(c.n_layers, c.n_heads, c.d_head, 11, batch_size=2)
    expect_true(held == want, f"after 11 tokens of 2 sequences the cache should hold 2 * n_layers * H * Dh * T * B * 4 "
                              f"= 2 * {c.n_layers} * {c.n_heads} * {c.d_head} * 11 * 2 * 4 = {want:,} bytes (float32), "
                              f"it holds {held:,}")


def _greedy_ids(generate_greedy, model, idx, n, use_cache, what):
    out = generate_greedy(model, idx, n, use_cache=use_cache)
    want_shape = (idx.shape[0], idx.shape[1] + n)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want_shape:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise CheckFailed(f"{what}: generate_greedy should return the prompt and the {n} new token ids, "
                          f"a tensor of shape {want_shape}, got {got}")
    return out


def _kv_greedy(cls, generate_greedy, b=3, t=5, n=9, seed=6):
    ref = _reference_gpt(seed=seed)
    model = _student_gpt(cls, ref)
    idx = _ids(b, t, seed)
    want = generate(ref, idx, n, use_cache=False)
    with torch.no_grad():
        cached = _greedy_ids(generate_greedy, model, idx, n, True, "use_cache=True")
        plain = _greedy_ids(generate_greedy, model, idx, n, False, "use_cache=False")
    expect_tensor(plain, want, name=f"greedy ids without the cache, prompt ({b}, {t}), {n} new tokens "
                                    "(the reference's generate on the same weights)")
    expect_tensor(cached, plain, name=f"greedy ids with the cache against your own without it, prompt ({b}, {t})")


def _kv_lengths(cls, generate_greedy):
    n_pos = _GPT_CFG.max_positions
    _kv_greedy(cls, generate_greedy, b=2, t=1, n=6, seed=7)  # a one-token prompt: the first step is position 1
    _kv_greedy(cls, generate_greedy, b=1, t=n_pos - 4, n=4, seed=8)  # up to the last position of the table


class _SpyGPT(GPT):
    """The reference GPT behind the statement's interface, recording what each call is given."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__(cfg)
        self.calls: list[tuple[int, int | None]] = []  # (new tokens, cached tokens or None without a cache)

    def forward(self, idx, cache=None):  # noqa: D401 - the student's interface
        if cache is None:
            self.calls.append((int(idx.shape[1]), None))
            return super().forward(idx)
        cached = 0 if len(cache) == 0 or cache[0] is None else int(cache[0][0].shape[2])
        self.calls.append((int(idx.shape[1]), cached))
        return _list_forward(self, idx, cache)


def _spy_run(generate_greedy, state_dict, cfg, idx, n, use_cache):
    """Runs where the student's generate_greedy lives: drive it with the spy, return the ids and the calls."""
    spy = _SpyGPT(cfg).eval()
    spy.load_state_dict(state_dict)
    with torch.no_grad():
        out = generate_greedy(spy, idx, n, use_cache=use_cache)
    return out, list(spy.calls)


def _kv_feeds_new_token(cls, generate_greedy):
    ref = _reference_gpt(seed=9)
    idx, n = _ids(2, 6, 9), 5
    out, calls = run_student(_spy_run, generate_greedy, ref.state_dict(), _GPT_CFG, idx, n, True)
    expect_true(isinstance(calls, list) and len(calls) >= 1, "generate_greedy never called the model")
    expect_true(calls[0] == (6, 0), f"with use_cache=True the first call should be the prefill: the 6 prompt tokens "
                                    f"with an empty cache, got {calls[0][0]} tokens with "
                                    f"{'no cache' if calls[0][1] is None else f'{calls[0][1]} cached'}")
    for i, (t_new, cached) in enumerate(calls[1:], start=1):
        if cached is None:
            raise CheckFailed(f"with use_cache=True call {i + 1} passed no cache: pass the cache the previous call "
                              "returned")
        if t_new != 1:
            raise CheckFailed(f"with use_cache=True call {i + 1} fed {t_new} tokens: after the prefill feed only the "
                              "new token and the cache (you are recomputing the whole sequence)")
        if cached != 6 + i - 1:
            raise CheckFailed(f"with use_cache=True call {i + 1} got a cache of {cached} tokens, expected "
                              f"{6 + i - 1}: pass on the cache the previous call returned")
    expect_true(len(calls) in (n, n + 1), f"{n} new tokens need the prefill and {n - 1} single-token calls "
                                          f"(or {n}), got {len(calls)} calls")
    expect_tensor(out, generate(ref, idx, n), name="the ids generate_greedy returned with the reference model")


register(Exercise(
    id="10.5",
    title="Your GPT with a KV cache",
    targets=("MyGPT", "generate_greedy"),
    forbidden=("companion.models", "companion.generation", "companion.kv_cache", "companion.attention",
               "transformers"),  # the reference itself
    cases=(
        Case("without a cache: the reference's logits (B=2, T=7, D=20, H=5)", 1, _kv_no_cache),
        Case("prefill: logits and per-layer keys and values", 2, _kv_prefill),
        Case("single-token steps after a prefill equal the full logits", 2, _kv_steps),
        Case("three new tokens at once after a cached prefix", 1, _kv_chunk),
        Case("the cache holds 2 * n_layers * H * Dh * T * B * 4 bytes", 1, _kv_memory),
        Case("greedy with the cache = without it = the reference's generate", 2, _kv_greedy),
        Case("a one-token prompt, and a prompt up to the last position", 1, _kv_lengths),
        Case("with the cache each step feeds only the new token", 1, _kv_feeds_new_token),
    ),
))
