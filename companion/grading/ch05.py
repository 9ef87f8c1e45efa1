"""Checks of Chapter 5's exercises: LayerNorm's backward pass, partial RMSNorm, a ReZero block, a warm-up schedule."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import MultiHeadAttention
from ..blocks import FeedForward
from ..masks import causal_mask
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


# ----------------------------------------------------------------- 5.2 partial RMSNorm


def _prms_reference(x, weight, p, eps):
    """pRMSNorm written independently: the RMS of the first int(p * D) features, eps inside the root."""
    d = x.shape[-1]
    k = int(d * p)
    head = x.narrow(-1, 0, k)
    rms = torch.sqrt(torch.einsum("...i,...i->...", head, head)[..., None] / k + eps)
    return weight * x / rms


def _build_prms(cls, d, p, eps=None):
    norm = cls(d, p) if eps is None else cls(d, p, eps=eps)
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, nn.Parameter) or tuple(weight.shape) != (d,):
        raise CheckFailed(f"PartialRMSNorm({d}, p={p}) must have an nn.Parameter named weight of shape ({d},), "
                          f"got {type(weight).__name__}")
    return norm


def _set_weight(norm, weight):
    """Run where the student's module lives (a proxy's attribute is a copy)."""
    with torch.no_grad():
        norm.weight.copy_(weight)


def _prms_compare(cls, d, p, eps, x, what):
    norm = _build_prms(cls, d, p, eps)
    weight = torch.randn(d)
    run_student(_set_weight, norm, weight)
    with torch.no_grad():
        got = norm(x)
    want = _prms_reference(x, weight, p, 1e-6 if eps is None else eps)
    if isinstance(got, torch.Tensor) and got.shape == want.shape and not torch.allclose(got, want, atol=1e-4, rtol=1e-4):
        _explain_prms(got, x, weight, p, 1e-6 if eps is None else eps, what)
    expect_tensor(got, want, name=what, atol=1e-5, rtol=1e-5)


def _explain_prms(got, x, weight, p, eps, what):
    """Name the usual mistakes (each a formula that differs from the right one)."""
    d = x.shape[-1]
    k = int(d * p)
    close = lambda a: torch.allclose(got, a, atol=1e-4, rtol=1e-4)
    full = weight * x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps)
    if close(full):
        raise CheckFailed(f"{what}: the output is the full RMSNorm (the RMS over all {d} features); with p = {p} "
                          f"the RMS comes from the first int(p * D) = {k} features only")
    for name, kk in (("math.ceil", math.ceil(d * p)), ("round", round(d * p))):
        if kk != k and 1 <= kk <= d and close(_prms_reference(x, weight, kk / d, eps)):
            raise CheckFailed(f"{what}: the RMS uses the first {kk} features ({name}(p * D)); "
                              f"k is int(p * D) = {k}, truncated as in the authors' code")
    if close(weight * x / (torch.sqrt((x[..., :k] ** 2).mean(-1, keepdim=True)) + eps)):
        raise CheckFailed(f"{what}: eps is added to the RMS (as in the authors' code); here it sits inside the "
                          "square root: sqrt(mean of squares + eps)")
    by_d = weight * x / torch.sqrt((x[..., :k] ** 2).sum(-1, keepdim=True) / d + eps)
    if close(by_d):
        raise CheckFailed(f"{what}: the sum of squares of the first {k} features is divided by D = {d}; "
                          f"divide it by k = {k}, the number of features summed")
    head_only = torch.cat([_prms_reference(x, weight, p, eps)[..., :k], x[..., k:]], -1)
    if close(head_only) or close(torch.cat([head_only[..., :k], weight[k:] * x[..., k:]], -1)):
        raise CheckFailed(f"{what}: only the first {k} features were normalised; the RMS comes from them, "
                          "but every feature is divided by it")


def _prms_full(cls):
    x = torch.randn(2, 7, 13) * 3 + 0.5
    _prms_compare(cls, 13, 1.0, None, x, "PartialRMSNorm(13, p=1.0) (the full RMSNorm) on x of shape (2, 7, 13)")


def _prms_quarter(cls):
    x = torch.randn(3, 5, 16) * 2
    x[..., 4:] *= 10.0  # the features outside the first k are much larger: the full RMS is far off
    _prms_compare(cls, 16, 0.25, None, x, "PartialRMSNorm(16, p=0.25): RMS of the first 4 features")


def _prms_truncate(cls):
    x = torch.randn(4, 10) * torch.linspace(0.5, 5.0, 10)
    _prms_compare(cls, 10, 0.35, None, x, "PartialRMSNorm(10, p=0.35): p * D = 3.5, so k = 3")


def _prms_eps(cls):
    x = torch.randn(3, 8) * 0.1
    _prms_compare(cls, 8, 0.5, 0.5, x, "PartialRMSNorm(8, p=0.5, eps=0.5): eps inside the square root")


def _prms_grad(cls):
    norm = _build_prms(cls, 12, 0.5)
    weight = torch.randn(12, dtype=torch.float64)
    x, g = torch.randn(2, 3, 12, dtype=torch.float64), torch.randn(2, 3, 12, dtype=torch.float64)
    got = run_student(_prms_grads, norm, weight, x, g)
    if got is None:
        raise CheckFailed("the output does not depend on x and weight through autograd (did you use .data, "
                          "detach() or no_grad?)")
    w = weight.clone().requires_grad_(True)
    xx = x.clone().requires_grad_(True)
    with torch.enable_grad():
        (_prms_reference(xx, w, 0.5, 1e-6) * g).sum().backward()
    expect_tensor(got[0], xx.grad, name="gradient of x (float64; the first k features also reach every output "
                  "through the RMS)", atol=1e-8, rtol=1e-6)
    expect_tensor(got[1], w.grad, name="gradient of weight (float64)", atol=1e-8, rtol=1e-6)


def _prms_grads(norm, weight, x, g):
    """Run where the student's module lives: (d(out . g)/dx, d(out . g)/d weight), or None."""
    norm.double()
    with torch.no_grad():
        norm.weight.copy_(weight)
    x = x.clone().requires_grad_(True)
    with torch.enable_grad():
        out = norm(x)
        if not isinstance(out, torch.Tensor) or not out.requires_grad:
            return None
        (out * g).sum().backward()
    return x.grad, norm.weight.grad


register(Exercise(
    id="5.2",
    title="A partial RMSNorm module",
    targets=("PartialRMSNorm",),
    forbidden=("companion.blocks", "torch.nn.RMSNorm", "torch.nn.functional.rms_norm"),
    cases=(
        Case("p = 1: the full RMSNorm", 1, _prms_full),
        Case("p = 0.25: the RMS of the first D/4 features", 2, _prms_quarter),
        Case("p * D not an integer: k = int(p * D)", 1, _prms_truncate),
        Case("eps inside the square root", 1, _prms_eps),
        Case("gradients of x and weight", 1, _prms_grad),
    ),
))


# ----------------------------------------------------------------- 5.3 ReZero block

_RZ_D, _RZ_H, _RZ_FF = 12, 3, 29


def _rz_parts(seed):
    torch.manual_seed(seed)
    return MultiHeadAttention(_RZ_D, _RZ_H).eval(), FeedForward(_RZ_D, _RZ_FF).eval()


def _rz_reference(attn, ffn, alpha, x, mask):
    h = x + alpha * attn(x, mask)
    return h + alpha * ffn(h)


def _set_alpha(block, value):
    """Run where the student's block lives."""
    with torch.no_grad():
        block.alpha.fill_(value)


def _rz_build(cls, seed=0):
    attn, ffn = _rz_parts(seed)
    block = cls(attn, ffn, _RZ_D)
    alpha = getattr(block, "alpha", None)
    if not isinstance(alpha, nn.Parameter) or alpha.numel() != 1:
        shape = tuple(alpha.shape) if isinstance(alpha, torch.Tensor) else type(alpha).__name__
        raise CheckFailed(f"the block must have one learnable scalar, an nn.Parameter named alpha of shape (1,), got {shape}")
    return block, attn, ffn


def _rz_init(cls):
    block, attn, ffn = _rz_build(cls)
    expect_tensor(block.alpha.detach().reshape(1), torch.zeros(1), name="alpha at initialisation (ReZero starts at 0)")
    names = run_student(_param_names, block)
    extra = [n for n in names if n != "alpha" and not n.startswith(("attn.", "ffn."))]
    expect_true(not extra, f"the block's own parameters must be alpha alone (ReZero has no norm, and one alpha serves "
                           f"both sublayers), found {extra} besides attn's and ffn's")


def _param_names(block):
    return [name for name, _ in block.named_parameters()]


def _rz_identity(cls):
    block, attn, ffn = _rz_build(cls)
    x = torch.randn(2, 7, _RZ_D) * 4 + 1
    with torch.no_grad():
        got = block(x)
    if isinstance(got, torch.Tensor) and got.shape == x.shape and not torch.allclose(got, x):
        pre = _pre_ln(attn, ffn, x)
        if torch.allclose(got, pre, atol=1e-5):
            raise CheckFailed("at initialisation the block gives the pre-LN block's output; ReZero drops the norms "
                              "and scales each sublayer's output by alpha, which starts at 0")
    expect_tensor(got, x, name="at initialisation (alpha = 0) the block must return its input unchanged")


def _pre_ln(attn, ffn, x):
    ln = nn.LayerNorm(x.shape[-1])
    h = x + attn(ln(x), None)
    return h + ffn(ln(h))


def _rz_forward(cls):
    block, attn, ffn = _rz_build(cls, seed=1)
    run_student(_set_alpha, block, 0.5)
    x = torch.randn(2, 7, _RZ_D)
    mask = causal_mask(7)
    with torch.no_grad():
        got = block(x, mask)
        want = _rz_reference(attn, ffn, 0.5, x, mask)
        if isinstance(got, torch.Tensor) and got.shape == want.shape and not torch.allclose(got, want, atol=1e-5):
            _explain_rz(got, attn, ffn, x, mask)
    expect_tensor(got, want, name="alpha = 0.5, with a causal mask: x + alpha attn(x), then h + alpha ffn(h)")


def _explain_rz(got, attn, ffn, x, mask):
    a = 0.5
    close = lambda t: torch.allclose(got, t, atol=1e-5)
    if close(x + a * attn(x, mask) + a * ffn(x)):
        raise CheckFailed("the feed-forward reads x, not the stream after the attention sublayer: "
                          "h = x + alpha attn(x), then h + alpha ffn(h)")
    if close(_rz_reference(attn, ffn, a, x, None)):
        raise CheckFailed("the output ignores the mask: pass it to attn(x, mask)")
    h = a * (x + attn(x, mask))
    if close(a * (h + ffn(h))):
        raise CheckFailed("alpha scales the sum x + F(x); it scales only the sublayer's output: x + alpha F(x)")


def _rz_grad(cls):
    block, attn, ffn = _rz_build(cls, seed=2)
    x, g = torch.randn(2, 5, _RZ_D), torch.randn(2, 5, _RZ_D)
    got = run_student(_rz_grads, block, x, g)
    if got is None:
        raise CheckFailed("the output does not depend on alpha through autograd (did you use .data or no_grad?)")
    alpha_grad, sub_grad_max = got
    with torch.no_grad():
        want = ((attn(x, None) + ffn(x)) * g).sum().reshape(1)
    expect_tensor(alpha_grad.reshape(1) if isinstance(alpha_grad, torch.Tensor) else alpha_grad, want,
                  name="gradient of alpha at initialisation (sum of g . (attn(x) + ffn(x)): one alpha, both sublayers)",
                  atol=1e-4, rtol=1e-4)
    expect_true(sub_grad_max == 0.0, f"at initialisation the sublayers' weights must get zero gradient (alpha = 0 "
                                     f"multiplies their output), got a largest |grad| of {sub_grad_max:.3g}")


def _rz_grads(block, x, g):
    """Run where the student's block lives: (d(out . g)/d alpha, largest |grad| of the sublayers' weights)."""
    with torch.enable_grad():
        out = block(x)
        if not isinstance(out, torch.Tensor) or not out.requires_grad:
            return None
        (out * g).sum().backward()
    if block.alpha.grad is None:
        return None
    grads = [p.grad.abs().max().item() for n, p in block.named_parameters() if n != "alpha" and p.grad is not None]
    return block.alpha.grad.detach().clone(), max(grads, default=0.0)


register(Exercise(
    id="5.3",
    title="A ReZero block",
    targets=("ReZeroBlock",),
    forbidden=("companion.blocks",),
    cases=(
        Case("alpha: one Parameter, 0 at initialisation, and no norm", 1, _rz_init),
        Case("at initialisation the block is the identity", 1, _rz_identity),
        Case("alpha = 0.5 with a mask: both sublayers, in order", 2, _rz_forward),
        Case("at initialisation only alpha learns: its gradient from both sublayers", 2, _rz_grad),
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
