"""Checks of Chapter 5's exercises: LayerNorm, RMSNorm, the two residual forms, a warm-up schedule."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..blocks import residual
from ..training import TrainConfig, lr_at
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, register, run_student

# ----------------------------------------------------------------- 5.1 LayerNorm's backward pass


def _ln_grads_autograd(x, gain, grad_out, eps):
    """(grad_x, grad_gain, grad_bias) of sum(LN(x) * grad_out), by autograd through F.layer_norm.

    Computed in float64 and returned in the dtype of ``x``.
    """
    dtype = x.dtype
    x = x.detach().to(torch.float64).requires_grad_(True)
    gain = gain.detach().to(torch.float64).requires_grad_(True)
    bias = torch.zeros_like(gain, requires_grad=True)
    with torch.enable_grad():
        (F.layer_norm(x, gain.shape, gain, bias, eps) * grad_out.to(torch.float64)).sum().backward()
    return x.grad.to(dtype), gain.grad.to(dtype), bias.grad.to(dtype)


def _backward_without_autograd(student, x, gain, grad_out, eps):
    """Run where the student's function lives, under no_grad: its result, or ("autograd", message)."""
    with torch.no_grad():
        try:
            return student(x, gain, grad_out, eps)
        except RuntimeError as err:
            if "grad" in str(err):
                return ("autograd", str(err).splitlines()[0] if str(err) else "")
            raise


def _ln_backward(student, x, gain, grad_out, eps, what, atol=1e-9, rtol=1e-7, only=("x", "gain", "bias")):
    got = run_student(_backward_without_autograd, student, x.clone(), gain.clone(), grad_out.clone(), eps)
    if isinstance(got, tuple) and len(got) == 2 and got[0] == "autograd":
        raise CheckFailed(f"{what}: your function relies on autograd, which the check turns off "
                          f"(torch.no_grad()): {got[1]}. Compute the three gradients from the formulas")
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        kind = f"a tuple of {len(got)}" if isinstance(got, (tuple, list)) else type(got).__name__
        raise CheckFailed(f"{what}: return a tuple (grad_x, grad_gain, grad_bias), got {kind}")
    want = _ln_grads_autograd(x, gain, grad_out, eps)
    names = {"x": "grad_x", "gain": "grad_gain", "bias": "grad_bias"}
    for key, g, w in zip(("x", "gain", "bias"), got, want):
        if key not in only:
            continue
        if key != "x" and isinstance(g, torch.Tensor) and g.shape == x.shape:
            raise CheckFailed(f"{what}: {names[key]} has the shape of x {tuple(x.shape)}; gain and bias are shared "
                              f"by every position, so sum their gradient over all leading dimensions, to shape {tuple(w.shape)}")
        if key == "x" and isinstance(g, torch.Tensor) and g.shape == w.shape:
            _explain_grad_x(g, x, gain, grad_out, eps, what)
        expect_tensor(g, w, name=f"{what}: {names[key]}", atol=atol, rtol=rtol)


def _explain_grad_x(g, x, gain, grad_out, eps, what):
    """Name the usual mistakes in grad_x (each a formula that differs from the right one)."""
    mu = x.mean(-1, keepdim=True)
    s = ((x - mu) ** 2).mean(-1, keepdim=True).add(eps).sqrt()
    xhat = (x - mu) / s
    d = grad_out * gain
    right = (d - d.mean(-1, keepdim=True) - xhat * (d * xhat).mean(-1, keepdim=True)) / s
    no_gain = (grad_out - grad_out.mean(-1, keepdim=True) - xhat * (grad_out * xhat).mean(-1, keepdim=True)) / s
    centred_only = (d - d.mean(-1, keepdim=True)) / s
    g = g.detach().to(right.dtype)
    close = lambda a: torch.allclose(g, a, atol=1e-6, rtol=1e-5) and not torch.allclose(a, right, atol=1e-6, rtol=1e-5)
    if close(no_gain):
        raise CheckFailed(f"{what}: grad_x ignores gain; the gradient reaching the normalised values is grad_out * gain")
    if close(centred_only):
        raise CheckFailed(f"{what}: grad_x misses the term -x_hat mean(g x_hat): the variance depends on x too, "
                          "not only the mean")
    if close(d / s):
        raise CheckFailed(f"{what}: grad_x is grad_out * gain / sqrt(var + eps), as if the mean and the variance "
                          "were constants; both depend on x")


def _ln_random(student):
    x = torch.randn(2, 7, 13, dtype=torch.float64) * 3 + 1
    gain, grad_out = torch.randn(13, dtype=torch.float64), torch.randn(2, 7, 13, dtype=torch.float64)
    _ln_backward(student, x, gain, grad_out, 1e-5, "x of shape (2, 7, 13), float64", only=("x",))


def _ln_params(student):
    x = torch.randn(3, 4, 5, 6, dtype=torch.float64)
    gain, grad_out = torch.randn(6, dtype=torch.float64), torch.randn(3, 4, 5, 6, dtype=torch.float64)
    _ln_backward(student, x, gain, grad_out, 1e-5, "x of shape (3, 4, 5, 6), float64")


def _ln_eps(student):
    x = torch.randn(4, 5, dtype=torch.float64) * 0.3
    gain, grad_out = torch.randn(5, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    _ln_backward(student, x, gain, grad_out, 0.5, "eps = 0.5 (it stays inside the square root in every term)")


def _ln_one_feature(student):
    x = torch.randn(5, 1, dtype=torch.float64)
    gain, grad_out = torch.full((1,), 2.0, dtype=torch.float64), torch.randn(5, 1, dtype=torch.float64)
    _ln_backward(student, x, gain, grad_out, 1e-5, "D = 1 (the output is the bias whatever x is, so grad_x is 0)")


def _ln_float32_offset(student):
    x = torch.randn(3, 9) + 1000.0
    gain, grad_out = torch.randn(9), torch.randn(3, 9)
    _ln_backward(student, x, gain, grad_out, 1e-5, "float32 rows near 1000 (centre x before squaring)",
                 atol=1e-3, rtol=1e-3)


register(Exercise(
    id="5.1",
    title="LayerNorm's backward pass by hand",
    targets=("layer_norm_backward",),
    # the reference itself, and autograd (the checks compare with it)
    forbidden=("companion.blocks", "torch.autograd", "torch.func"),
    cases=(
        Case("grad_x on random input (D = 13, float64)", 2, _ln_random),
        Case("grad_gain and grad_bias summed over every leading dimension", 1, _ln_params),
        Case("eps inside the square root", 1, _ln_eps),
        Case("one feature: grad_x is zero", 1, _ln_one_feature),
        Case("float32 rows far from zero", 1, _ln_float32_offset),
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
