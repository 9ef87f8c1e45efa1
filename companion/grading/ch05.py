"""Checks of Chapter 5's exercises: LayerNorm, RMSNorm, the two residual forms, a warm-up schedule."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..blocks import layer_norm, residual
from ..training import TrainConfig, lr_at
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, register, run_student

# ----------------------------------------------------------------- 5.1 LayerNorm


def _ln_random(student):
    x = torch.randn(2, 7, 13) * 3 + 1
    w, b = torch.randn(13), torch.randn(13)
    expect_tensor(student(x, w, b), F.layer_norm(x, (13,), w, b, 1e-5), name="layer_norm(x of shape (2, 7, 13), w, b)")


def _ln_biased_variance(student):
    x = torch.tensor([[0.0, 2.0], [1.0, 5.0]])
    w, b = torch.ones(2), torch.zeros(2)
    got = student(x, w, b, 0.0)
    unbiased = (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True)
    if isinstance(got, torch.Tensor) and got.shape == unbiased.shape and torch.allclose(got, unbiased, atol=1e-4):
        raise CheckFailed("you divided by sqrt of the unbiased variance (D - 1); LayerNorm uses the biased one (divide by D)")
    expect_tensor(got, F.layer_norm(x, (2,), w, b, 0.0), name="layer_norm with D=2, eps=0")


def _ln_eps(student):
    x = torch.randn(3, 5) * 0.1
    w, b = torch.randn(5), torch.randn(5)
    expect_tensor(student(x, w, b, 0.5), F.layer_norm(x, (5,), w, b, 0.5), name="layer_norm with eps=0.5 (eps goes inside the square root)")


def _ln_one_feature(student):
    x = torch.randn(4, 1)
    w, b = torch.full((1,), 2.0), torch.full((1,), -0.25)
    expect_tensor(student(x, w, b), torch.full((4, 1), -0.25), name="layer_norm with D=1 (every row normalises to 0, so the output is the bias)")


def _ln_offset(student):
    x = torch.randn(3, 13) + 1000.0
    w, b = torch.ones(13), torch.zeros(13)
    expect_tensor(student(x, w, b), F.layer_norm(x, (13,), w, b, 1e-5), name="layer_norm of rows near 1000 "
                  "(compute the variance of the centred values, not E[x^2] - E[x]^2)", atol=1e-3, rtol=1e-3)


register(Exercise(
    id="5.1",
    title="LayerNorm by hand",
    targets=("layer_norm",),
    forbidden=("companion.blocks", "torch.nn.functional.layer_norm"),  # the reference itself
    cases=(
        Case("random input, weight and bias (D=13)", 2, _ln_random),
        Case("biased variance (divide by D)", 1, _ln_biased_variance),
        Case("eps inside the square root", 1, _ln_eps),
        Case("one feature: the output is the bias", 1, _ln_one_feature),
        Case("numerically stable for rows far from zero", 1, _ln_offset),
    ),
))


# ----------------------------------------------------------------- 5.2 RMSNorm


def _build_rms(cls, d, eps=None):
    norm = cls(d) if eps is None else cls(d, eps=eps)
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, nn.Parameter) or tuple(weight.shape) != (d,):
        raise CheckFailed(f"the module must have an nn.Parameter named weight of shape ({d},), got {type(weight).__name__}")
    return norm


def _set_weight(norm, weight):
    """Run where the student's module lives (a proxy's attribute is a copy)."""
    with torch.no_grad():
        norm.weight.copy_(weight)


def _reference_rms(norm, d, eps):
    ref = nn.RMSNorm(d, eps=eps)
    with torch.no_grad():
        ref.weight.copy_(norm.weight)
    return ref


def _rms_init(cls):
    norm = _build_rms(cls, 7)
    expect_tensor(norm.weight.detach(), torch.ones(7), name="weight at initialisation")


def _rms_random(cls):
    norm = _build_rms(cls, 13)
    run_student(_set_weight, norm, torch.randn(13))
    x = torch.randn(2, 7, 13) * 3 + 0.5
    expect_tensor(norm(x), _reference_rms(norm, 13, 1e-6)(x), name="output vs nn.RMSNorm(13, eps=1e-6) with the same weight")


def _rms_eps(cls):
    norm = _build_rms(cls, 5, eps=0.5)
    x = torch.randn(3, 5) * 0.1
    expect_tensor(norm(x), _reference_rms(norm, 5, 0.5)(x), name="output with eps=0.5")


def _rms_no_mean(cls):
    norm = _build_rms(cls, 6)
    x = torch.randn(4, 6) + 3.0
    got = norm(x)
    centred = F.layer_norm(x, (6,), eps=1e-6)
    if isinstance(got, torch.Tensor) and got.shape == centred.shape and torch.allclose(got, centred, atol=1e-3):
        raise CheckFailed("the output equals LayerNorm: RMSNorm must not subtract the mean")
    expect_tensor(got, _reference_rms(norm, 6, 1e-6)(x), name="output on rows with mean 3")


def _rms_grad(cls):
    norm = _build_rms(cls, 9)
    ref = _reference_rms(norm, 9, 1e-6)
    x = torch.randn(2, 5, 9)
    g = torch.randn(2, 5, 9)
    tracked, grad = run_student(_weight_grad, norm, x, g)
    if not tracked:
        raise CheckFailed("the output does not depend on weight through autograd (did you use .data or no_grad?)")
    (ref(x) * g).sum().backward()
    expect_tensor(grad, ref.weight.grad, name="gradient of weight")


def _weight_grad(norm, x, g):
    """Run where the student's module lives: (does the output track gradients?, d(out . g)/d weight)."""
    out = norm(x)
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        return False, None
    (out * g).sum().backward()
    return True, norm.weight.grad


register(Exercise(
    id="5.2",
    title="An RMSNorm module",
    targets=("RMSNorm",),
    forbidden=("companion.blocks", "torch.nn.RMSNorm"),  # the reference itself
    cases=(
        Case("weight is a Parameter of ones", 1, _rms_init),
        Case("equals nn.RMSNorm with the same weight (D=13)", 2, _rms_random),
        Case("eps inside the square root", 1, _rms_eps),
        Case("does not subtract the mean", 1, _rms_no_mean),
        Case("weight receives the right gradient", 1, _rms_grad),
    ),
))


# ----------------------------------------------------------------- 5.3 residual forms


def _sub_and_norm(d=13):
    return nn.Linear(d, d), nn.LayerNorm(d)


def _res_pre(student):
    lin, ln = _sub_and_norm()
    with torch.no_grad():
        ln.weight.copy_(torch.randn(13))
    x = torch.randn(2, 7, 13)
    with torch.no_grad():
        expect_tensor(student(x, lin, ln, True), residual(x, lin, ln, norm_first=True), name="pre-LN: x + sublayer(norm(x))")


def _res_post(student):
    lin, ln = _sub_and_norm()
    with torch.no_grad():
        ln.bias.copy_(torch.randn(13))
    x = torch.randn(2, 7, 13)
    with torch.no_grad():
        expect_tensor(student(x, lin, ln, False), residual(x, lin, ln, norm_first=False), name="post-LN: norm(x + sublayer(x))")


def _zero_sublayer(h):
    return torch.zeros_like(h)


def _res_identity(student):
    x = torch.randn(3, 5, 7) * 4 + 2
    ln = nn.LayerNorm(7)
    with torch.no_grad():
        expect_tensor(student(x, _zero_sublayer, ln, True), x, name="pre-LN with a sublayer that outputs 0 (must return x unchanged)")
        expect_tensor(student(x, _zero_sublayer, ln, False), ln(x), name="post-LN with a sublayer that outputs 0 (must return norm(x))")


def _res_jacobian(student):
    torch.manual_seed(3)
    lin, ln = _sub_and_norm(5)
    x = torch.randn(5)
    got = run_student(_pre_ln_jacobian, student, x, lin, ln)
    want = torch.eye(5) + torch.autograd.functional.jacobian(lambda v: lin(ln(v)), x)
    expect_tensor(got, want, name="pre-LN Jacobian (I + d f(LN(x))/dx)")


def _pre_ln_jacobian(student, x, lin, ln):
    """Run where the student's function lives: its Jacobian at x (autograd cannot cross processes)."""
    return torch.autograd.functional.jacobian(lambda v: student(v, lin, ln, True), x)


register(Exercise(
    id="5.3",
    title="The pre-LN and post-LN residual sublayer",
    targets=("residual_sublayer",),
    forbidden=("companion.blocks",),  # the reference itself
    cases=(
        Case("pre-LN on random input", 2, _res_pre),
        Case("post-LN on random input", 2, _res_post),
        Case("a zero sublayer: identity (pre) or norm (post)", 1, _res_identity),
        Case("pre-LN Jacobian is identity plus the sublayer's", 1, _res_jacobian),
    ),
))


# ----------------------------------------------------------------- 5.4 warm-up schedule


def _ref_lr(step, peak, warmup, total, min_ratio):
    return lr_at(step, TrainConfig(steps=total, lr=peak, warmup_steps=warmup, min_lr_ratio=min_ratio))


def _compare(student, steps, peak, warmup, total, min_ratio, what):
    for s in steps:
        got = student(s, peak, warmup, total, min_ratio)
        want = _ref_lr(s, peak, warmup, total, min_ratio)
        try:
            got_f = float(got)
        except (TypeError, ValueError):
            raise CheckFailed(f"the learning rate should be a number, got {type(got).__name__}") from None
        expect_true(math.isclose(got_f, want, rel_tol=1e-6, abs_tol=1e-12),
                    f"{what}: at step {s} (peak {peak}, warm-up {warmup}, total {total}, min ratio {min_ratio}) "
                    f"expected {want:.6g}, got {got_f:.6g}")


def _lr_warmup(student):
    _compare(student, range(10), 3e-3, 10, 100, 0.1, "warm-up")


def _lr_cosine(student):
    _compare(student, (10, 11, 37, 55, 99), 3e-3, 10, 100, 0.1, "cosine decay")


def _lr_no_warmup(student):
    _compare(student, (0, 1, 50, 96), 1e-3, 0, 97, 0.0, "without warm-up (warmup_steps=0)")


def _lr_shape(student):
    lrs = [float(student(s, 1.0, 7, 61, 0.2)) for s in range(61)]
    rising, falling = lrs[:7], lrs[6:]
    expect_true(all(a < b for a, b in zip(rising, rising[1:])), "the rate must rise strictly during warm-up")
    expect_true(all(a >= b for a, b in zip(falling, falling[1:])), "the rate must not rise after warm-up")
    expect_true(abs(lrs[6] - 1.0) < 1e-9, f"the last warm-up step must reach the peak 1.0, got {lrs[6]:.6g}")


register(Exercise(
    id="5.4",
    title="Linear warm-up then cosine decay",
    targets=("warmup_cosine_lr",),
    forbidden=("companion.training",),  # the reference itself
    cases=(
        Case("linear warm-up from peak/warmup to peak", 2, _lr_warmup),
        Case("cosine decay after warm-up", 2, _lr_cosine),
        Case("no warm-up: no division by zero", 1, _lr_no_warmup),
        Case("rises during warm-up, then never rises", 1, _lr_shape),
    ),
))
