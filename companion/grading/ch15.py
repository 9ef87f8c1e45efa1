"""Checks for the Chapter 15 exercises (practice: mixed precision, pruning, parallelism).

References: a masked log-softmax in float64 and Megatron-LM's loss-scale rule with hysteresis (both
written below), head importance computed by autograd through a ``head_mask`` of
:func:`companion.attention.scaled_dot_product_attention` (Michel et al., 2019), and
``torch.nn.functional.linear`` on the unsplit layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..attention import scaled_dot_product_attention
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, register


# ----------------------------------------------------------------- 15.1 a masked log-softmax safe in fp16
#
# The chapter grows safe_masked_softmax (weights). A loss, beam search or a sampler needs log-weights; taking
# the log of those weights loses every weight that underflowed (in fp16 below 2**-25 = 3e-8, a log-weight below
# about -17.3), so the student derives the log-sum-exp form, with -inf (log 0) where a weight is 0.

def masked_log_softmax_reference(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log-softmax over the visible keys, in float64; -inf at masked keys and on rows with no visible key."""
    s = scores.double().masked_fill(~mask, float("-inf"))  # (..., T, S)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)  # (..., T, 1): -inf on a row with no visible key
    empty = torch.isneginf(lse).expand_as(s)
    out = torch.where(empty, torch.full_like(s, float("-inf")), s - lse.masked_fill(torch.isneginf(lse), 0.0))
    return out.to(scores.dtype)


def _log_softmax_hint(got, want, mask):
    got = got.detach().to("cpu")
    visible = mask.expand_as(want)
    if got.is_floating_point() and bool(((got >= 0) & (got <= 1)).all()):
        return " These look like weights (between 0 and 1): return their logarithms, log-weights, instead."
    if bool((torch.isneginf(got) & torch.isfinite(want) & visible).any()):
        return (" A visible key got -inf: its weight underflowed before the log (log(softmax) loses it). "
                "Compute s - m - log(sum(exp(s - m))) over the visible keys, m their maximum.")
    if bool((torch.isfinite(got) & ~visible).any()):
        return (" A masked key got a finite log-weight (filling the scores with finfo.min leaves one): "
                "its weight is 0, so its log-weight is -inf.")
    if bool(torch.isnan(got).any()):
        return " A NaN: a row with no visible key has log-sum-exp -inf; give the whole row -inf."
    return ""


def _log_softmax_case(student, shape, mask_shape, dtype, seed, what, empty_row=True, scale=6.0):
    g = torch.Generator().manual_seed(seed)
    scores = (scale * torch.randn(*shape, generator=g)).to(dtype)
    mask = torch.rand(*mask_shape, generator=g) < 0.6
    mask[..., 0] = True  # every query sees key 0 ...
    if empty_row:
        mask[(0,) * (len(mask_shape) - 2) + (mask_shape[-2] - 1,)] = False  # ... except one, which sees no key
    got = student(scores.clone(), mask.clone())
    want = masked_log_softmax_reference(scores, mask)
    atol, rtol = {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}.get(dtype, (1e-5, 1e-5))
    try:
        if isinstance(got, torch.Tensor) and got.shape == want.shape:
            expect_tensor(torch.isneginf(got), torch.isneginf(want), name=f"the -inf entries (weight 0) ({what})")
        expect_tensor(got, want, name=f"log-weights ({what})", atol=atol, rtol=rtol)
    except CheckFailed as err:
        hint = _log_softmax_hint(got, want, mask) if isinstance(got, torch.Tensor) and got.shape == want.shape else ""
        raise CheckFailed(str(err) + hint) from None


register(Exercise(
    id="15.1",
    title="A masked log-softmax that is safe in fp16",
    targets=("safe_masked_log_softmax",),
    forbidden=("companion.precision", "companion.attention", "torch.nn.functional.scaled_dot_product_attention"),
    cases=(
        Case("fp32, every row has a visible key", 1,
             lambda s: _log_softmax_case(s, (2, 3, 5, 7), (2, 3, 5, 7), torch.float32, 0, "fp32", empty_row=False)),
        Case("fp16 with a fully masked row: -inf, not NaN", 1,
             lambda s: _log_softmax_case(s, (2, 3, 5, 7), (2, 3, 5, 7), torch.float16, 1, "fp16", scale=2.0)),
        Case("fp16, log-weights far below what a weight can hold", 2,
             lambda s: _log_softmax_case(s, (1, 2, 3, 11), (1, 2, 3, 11), torch.float16, 3, "fp16, scores up to 45 apart",
                                         scale=12.0)),
        Case("bf16, a (T, S) mask broadcast over (B, H, T, S)", 1,
             lambda s: _log_softmax_case(s, (3, 2, 4, 9), (4, 9), torch.bfloat16, 2, "bf16, broadcast mask")),
    ),
))


# ----------------------------------------------------------------- 15.2 a dynamic loss scaler with hysteresis
#
# The chapter grows update_scale (torch.amp.GradScaler's rule: every overflow halves the scale). Megatron-LM's
# DynamicGradScaler (megatron/core/optimizer/grad_scaler.py) waits for `hysteresis` overflows before it backs
# off, restores that count only when the scale grows, and never goes below min_scale. Every overflow skips
# the optimizer step. The reference is this state machine, written once here.

def hysteresis_reference(flags, *, scale, growth, backoff, interval, hysteresis, min_scale):
    """Yield (scale, clean_steps, hysteresis_left, step_taken) after each found_inf flag of ``flags``."""
    clean, left = 0, hysteresis
    for found_inf in flags:
        if found_inf:
            clean, left = 0, left - 1
            if left <= 0:
                scale = max(scale * backoff, min_scale)
            yield scale, clean, left, False
        else:
            clean += 1
            if clean == interval:
                clean, left, scale = 0, hysteresis, scale * growth
            yield scale, clean, left, True


def _hysteresis_hint(found, got, want):
    """A sentence naming the mistake when the first wrong step shows a known one, else ''."""
    (g_scale, _, g_left, g_took), (w_scale, _, w_left, w_took) = got, want
    if found and g_took != w_took:
        return " Every overflow skips the optimizer step, also one that only counts hysteresis_left down."
    if found and max(g_left, 0) > max(w_left, 0):
        return " An overflow counts hysteresis_left down by one."
    if not found and max(g_left, 0) != max(w_left, 0) and g_scale == w_scale:
        return (" A clean step leaves hysteresis_left as it is; it comes back to hysteresis only when the scale "
                "grows (Megatron-LM's rule).")
    if found and w_left > 0 and g_scale != w_scale:
        return " While hysteresis_left is still above 0 after counting down, the scale stays where it is."
    if found and g_scale < w_scale:
        return " Back off to max(scale * backoff, min_scale)."
    return ""


def _hysteresis_case(student, flags, what, *, scale=2.0**16, growth=2.0, backoff=0.5, interval=3, hysteresis=2,
                     min_scale=1.0):
    state = (float(scale), 0, hysteresis)
    want = hysteresis_reference(flags, scale=float(scale), growth=growth, backoff=backoff, interval=interval,
                                hysteresis=hysteresis, min_scale=min_scale)
    for i, (found, expected) in enumerate(zip(flags, want)):
        out = student(*state, found, growth=growth, backoff=backoff, interval=interval, hysteresis=hysteresis,
                      min_scale=min_scale)
        expect_true(isinstance(out, tuple) and len(out) == 4,
                    f"update_scale must return (scale, clean_steps, hysteresis_left, take_step), got {out!r}")
        try:
            got = (float(out[0]), int(out[1]), int(out[2]), bool(out[3]))
        except (TypeError, ValueError) as err:
            raise CheckFailed(f"update_scale returned {out!r}: expected a float, two ints and a bool ({err})") from None
        # hysteresis_left may go below 0 (Megatron-LM's does) or stop at 0: only whether it is <= 0 matters.
        w_scale, w_clean, w_left, w_took = expected
        if (got[0], got[1], max(got[2], 0), got[3]) != (w_scale, w_clean, max(w_left, 0), w_took):
            shown = w_left if got[2] < 0 else max(w_left, 0)
            raise CheckFailed(
                f"{what}, step {i} (overflow: {found}): expected (scale, clean_steps, hysteresis_left, take_step) = "
                f"({w_scale}, {w_clean}, {shown}, {w_took}), got {got}.{_hysteresis_hint(found, got, expected)}")
        state = got[:3]


register(Exercise(
    id="15.2",
    title="A dynamic loss scaler with hysteresis",
    targets=("update_scale",),
    forbidden=("companion.precision", "torch.amp", "torch.cuda.amp", "torch._amp_update_scale_", "megatron",
               "deepspeed"),
    cases=(
        Case("hysteresis=1: every overflow backs off, clean runs grow", 1,
             lambda s: _hysteresis_case(s, [False, True, False, False, False, True, True, False], "hysteresis=1",
                                        hysteresis=1, growth=4.0, backoff=0.25, interval=2)),
        Case("hysteresis=2: the second overflow backs off, and every overflow skips its step", 1,
             lambda s: _hysteresis_case(s, [True, True, True, False, False, False, True], "hysteresis=2")),
        Case("a clean step does not restore the count; growing the scale does", 1,
             lambda s: _hysteresis_case(s, [True, False, False, True, False, False, False, True], "interval=3")),
        Case("the scale never falls below min_scale", 1,
             lambda s: _hysteresis_case(s, [True] * 6 + [False, False], "min_scale=4", scale=32.0, min_scale=4.0,
                                        hysteresis=1, interval=2)),
    ),
))


# ----------------------------------------------------------------- 15.3 head importance from a head-gate gradient

def _importance_case(student, b, h, t, dv, seed, what):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(b, h, t, 4, generator=g), torch.randn(b, h, t, 4, generator=g)
    v = torch.randn(b, h, t, dv, generator=g)
    w = torch.randn(h * dv, 3, generator=g)

    def per_example_loss(out):  # (B, H, T, Dv) -> (B,): a nonlinear readout of the merged heads
        merged = out.transpose(1, 2).reshape(b, t, h * dv)
        return torch.tanh(merged @ w).pow(2).mean(dim=(1, 2))

    # The reference: Michel et al.'s gate, one per example and head, differentiated by autograd.
    xi = torch.ones(b, h, requires_grad=True)
    loss = per_example_loss(scaled_dot_product_attention(q, k, v, is_causal=True, head_mask=xi))
    want = torch.autograd.grad(loss.sum(), xi)[0].abs().mean(0)  # (H,)
    # The student's inputs: the head outputs and the gradient of each example's loss with respect to them.
    out = scaled_dot_product_attention(q, k, v, is_causal=True).detach().requires_grad_(True)
    grad = torch.autograd.grad(per_example_loss(out).sum(), out)[0]
    got = student(out.detach().clone(), grad.clone())
    expect_tensor(got, want, name=f"importance ({what})", atol=1e-6, rtol=1e-4)


register(Exercise(
    id="15.3",
    title="Head importance from the gradient with respect to a head gate",
    targets=("head_importance",),
    forbidden=("companion.pruning",),
    cases=(
        Case("B=4, H=3, T=5, Dv=6", 2, lambda s: _importance_case(s, 4, 3, 5, 6, 0, "B=4, H=3")),
        Case("the absolute value is taken per example, before the mean", 2,
             lambda s: _importance_case(s, 7, 2, 3, 5, 1, "B=7, H=2")),
        Case("one example, one head", 1, lambda s: _importance_case(s, 1, 1, 4, 3, 2, "B=1, H=1")),
    ),
))


# ----------------------------------------------------------------- 15.4 a linear layer split by output features

def _split_case(student, d_in, d_out, world, bias, seed, what):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(d_out, d_in, generator=g)
    b = torch.randn(d_out, generator=g) if bias else None
    x = torch.randn(3, 2, d_in, generator=g)
    shards = student(weight.clone(), None if b is None else b.clone(), world)
    expect_true(isinstance(shards, (list, tuple)) and len(shards) == world,
                f"split_columns must return {world} (weight, bias) pairs, got {type(shards).__name__} "
                f"of length {len(shards) if hasattr(shards, '__len__') else '?'}")
    outs = []
    for r, pair in enumerate(shards):
        expect_true(isinstance(pair, (list, tuple)) and len(pair) == 2, f"shard {r} must be a (weight, bias) pair")
        w_r, b_r = pair
        expect_tensor(w_r, weight[r * d_out // world:(r + 1) * d_out // world], name=f"weight of rank {r} ({what})")
        if b is None:
            expect_true(b_r is None, f"the layer has no bias: rank {r}'s bias must be None, got {type(b_r).__name__}")
        else:
            expect_tensor(b_r, b[r * d_out // world:(r + 1) * d_out // world], name=f"bias of rank {r} ({what})")
        outs.append(F.linear(x, w_r, b_r))
    expect_tensor(torch.cat(outs, dim=-1), F.linear(x, weight, b), name=f"concatenated outputs ({what})")


def _split_uneven(student):
    try:
        student(torch.zeros(10, 4), torch.zeros(10), 3)
    except ValueError:
        return
    except NotImplementedError:
        raise
    except Exception as err:  # noqa: BLE001 - any other error is the wrong one
        raise CheckFailed(f"10 output features over 3 ranks must raise ValueError, got {type(err).__name__}: {err}")
    raise CheckFailed("10 output features over 3 ranks must raise ValueError, nothing was raised")


register(Exercise(
    id="15.4",
    title="Split a linear layer by output features (column parallelism)",
    targets=("split_columns",),
    forbidden=("companion.distributed",),
    cases=(
        Case("two ranks, with bias", 1, lambda s: _split_case(s, 6, 8, 2, True, 0, "D_in=6, D_out=8, W=2")),
        Case("three ranks, no bias (odd sizes)", 1, lambda s: _split_case(s, 5, 9, 3, False, 1, "D_in=5, D_out=9, W=3")),
        Case("one rank is the whole layer", 1, lambda s: _split_case(s, 4, 7, 1, True, 2, "W=1")),
        Case("an uneven split raises ValueError", 1, _split_uneven),
    ),
))
