"""Checks for the Chapter 15 exercises (practice: mixed precision, pruning, parallelism).

References: :func:`companion.precision.masked_softmax`,
:class:`companion.precision.DynamicLossScaler`, head importance computed by
autograd through a ``head_mask`` of :func:`companion.attention.scaled_dot_product_attention`
(Michel et al., 2019), and ``torch.nn.functional.linear`` on the unsplit layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..attention import scaled_dot_product_attention
from ..precision import DynamicLossScaler, masked_softmax
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, register


# ----------------------------------------------------------------- 15.1 a masked softmax safe in fp16

def _softmax_case(student, shape, mask_shape, dtype, seed, what, empty_row=True):
    g = torch.Generator().manual_seed(seed)
    scores = (6 * torch.randn(*shape, generator=g)).to(dtype)
    mask = torch.rand(*mask_shape, generator=g) < 0.6
    if empty_row:
        mask[(0,) * (len(mask_shape) - 2) + (mask_shape[-2] - 1,)] = False  # one query sees no key
    got = student(scores.clone(), mask.clone())
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}.get(dtype, 1e-6)
    expect_tensor(got, masked_softmax(scores, mask), name=f"weights ({what})", atol=tol, rtol=0)


register(Exercise(
    id="15.1",
    title="A masked softmax that is safe in fp16",
    targets=("safe_masked_softmax",),
    forbidden=("companion.precision", "companion.attention", "torch.nn.functional.scaled_dot_product_attention"),
    cases=(
        Case("fp32, every row has a visible key", 1,
             lambda s: _softmax_case(s, (2, 3, 5, 7), (2, 3, 5, 7), torch.float32, 0, "fp32", empty_row=False)),
        Case("fp16 with a fully masked row: zeros, not NaN", 2,
             lambda s: _softmax_case(s, (2, 3, 5, 7), (2, 3, 5, 7), torch.float16, 1, "fp16")),
        Case("bf16, a (T, S) mask broadcast over (B, H, T, S)", 1,
             lambda s: _softmax_case(s, (3, 2, 4, 9), (4, 9), torch.bfloat16, 2, "bf16, broadcast mask")),
        Case("large scores in fp16 (odd sizes)", 1,
             lambda s: _softmax_case(s, (1, 1, 3, 11), (1, 1, 3, 11), torch.float16, 3, "fp16, T=3, S=11")),
    ),
))


# ----------------------------------------------------------------- 15.2 one update of a dynamic loss scaler

def _scaler_case(student, flags, init_scale, growth_interval, what, growth_factor=2.0, backoff_factor=0.5):
    ref = DynamicLossScaler(init_scale, growth_factor, backoff_factor, growth_interval)
    scale, clean = float(init_scale), 0
    for i, found in enumerate(flags):
        stepped = ref.update(found)
        out = student(scale, clean, found, growth_factor=growth_factor, backoff_factor=backoff_factor,
                      growth_interval=growth_interval)
        expect_true(isinstance(out, tuple) and len(out) == 3,
                    f"update_scale must return (scale, clean_steps, step_taken), got {out!r}")
        scale, clean, took = out
        if (float(scale), int(clean), bool(took)) != (ref.scale, ref.clean_steps, stepped):
            raise CheckFailed(f"{what}, step {i} (overflow: {found}): expected (scale, clean_steps, step_taken) = "
                              f"({ref.scale}, {ref.clean_steps}, {stepped}), got ({scale}, {clean}, {took})")


register(Exercise(
    id="15.2",
    title="One update of a dynamic loss scaler",
    targets=("update_scale",),
    forbidden=("companion.precision", "torch.amp", "torch.cuda.amp", "torch._amp_update_scale_"),
    cases=(
        Case("clean steps grow the scale after growth_interval", 1,
             lambda s: _scaler_case(s, [False] * 7, 1024.0, 3, "7 clean steps, interval 3")),
        Case("an overflow halves the scale, skips the step and resets the count", 2,
             lambda s: _scaler_case(s, [False, False, True, False, False, False, True, True], 2.0**16, 3,
                                    "overflows at steps 2, 6, 7")),
        Case("other factors (growth 4, backoff 0.25, interval 1)", 1,
             lambda s: _scaler_case(s, [False, True, False, False, True], 8.0, 1, "growth 4, backoff 0.25",
                                    growth_factor=4.0, backoff_factor=0.25)),
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
