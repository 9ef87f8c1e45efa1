"""Chapter 5's exercise 5.1 (LayerNorm's backward pass): the reference answer scores full marks, the chapter's
layer_norm submitted verbatim does not, and each named wrong answer loses points with a message that names its
mistake, here and through the instructor's grader's worker (the checks call the student's function there)."""

import time

import pytest
import torch

from companion.grading import get_exercise, run_exercise
from companion.grading.ch05 import _ln_grads_autograd
from scoring import loses, remote_result, result, worker_session


def layer_norm(x, gain=1.0, bias=0.0, eps=1e-5):  # the chapter's code, verbatim
    mu = x.mean(-1, keepdim=True)  # mean over the D features of each position
    var = ((x - mu) ** 2).mean(-1, keepdim=True)  # the biased variance: divide by D
    return gain * (x - mu) / torch.sqrt(var + eps) + bias  # normalise, then scale and shift


def _parts(x, gain, grad_out, eps):
    mu = x.mean(-1, keepdim=True)
    s = torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps)
    return (x - mu) / s, s, grad_out * gain


def _params(x, grad_out, xhat):
    d = x.shape[-1]
    return (grad_out * xhat).reshape(-1, d).sum(0), grad_out.reshape(-1, d).sum(0)


def good_backward(x, gain, grad_out, eps=1e-5):
    xhat, s, g = _parts(x, gain, grad_out, eps)
    grad_x = (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True)) / s
    return (grad_x, *_params(x, grad_out, xhat))


def jacobian_backward(x, gain, grad_out, eps=1e-5):  # the chapter's J_LN as a D x D matrix per row: also right
    xhat, s, g = _parts(x, gain, grad_out, eps)
    d = x.shape[-1]
    eye = torch.eye(d, dtype=x.dtype)
    jac = (eye - 1 / d - xhat[..., :, None] * xhat[..., None, :] / d) / s[..., None]  # (..., D, D), symmetric
    return ((jac @ g[..., None])[..., 0], *_params(x, grad_out, xhat))


def autograd_backward(x, gain, grad_out, eps=1e-5):  # the chapter's layer_norm differentiated by autograd
    x = x.detach().requires_grad_(True)
    gain = gain.detach().requires_grad_(True)
    bias = torch.zeros_like(gain, requires_grad=True)
    (layer_norm(x, gain, bias, eps) * grad_out).sum().backward()
    return x.grad, gain.grad, bias.grad


def ignores_gain(x, gain, grad_out, eps=1e-5):
    xhat, s, _ = _parts(x, gain, grad_out, eps)
    grad_x = (grad_out - grad_out.mean(-1, keepdim=True) - xhat * (grad_out * xhat).mean(-1, keepdim=True)) / s
    return (grad_x, *_params(x, grad_out, xhat))


def mean_only(x, gain, grad_out, eps=1e-5):  # the variance treated as a constant
    xhat, s, g = _parts(x, gain, grad_out, eps)
    return ((g - g.mean(-1, keepdim=True)) / s, *_params(x, grad_out, xhat))


def constants(x, gain, grad_out, eps=1e-5):  # mean and variance treated as constants
    xhat, s, g = _parts(x, gain, grad_out, eps)
    return (g / s, *_params(x, grad_out, xhat))


def per_position_params(x, gain, grad_out, eps=1e-5):  # grad_gain and grad_bias not summed
    grad_x, _, _ = good_backward(x, gain, grad_out, eps)
    xhat, _, _ = _parts(x, gain, grad_out, eps)
    return grad_x, grad_out * xhat, grad_out


def eps_outside(x, gain, grad_out, eps=1e-5):  # sqrt(var) + eps
    mu = x.mean(-1, keepdim=True)
    s = ((x - mu) ** 2).mean(-1, keepdim=True).sqrt() + eps
    xhat, g = (x - mu) / s, grad_out * gain
    grad_x = (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True)) / s
    return (grad_x, *_params(x, grad_out, xhat))


def variance_by_squares(x, gain, grad_out, eps=1e-5):  # E[x^2] - mu^2: cancels catastrophically near 1000
    mu = x.mean(-1, keepdim=True)
    s = torch.sqrt((x * x).mean(-1, keepdim=True) - mu * mu + eps)
    xhat, g = (x - mu) / s, grad_out * gain
    grad_x = (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True)) / s
    return (grad_x, *_params(x, grad_out, xhat))


def test_autograd_reference_keeps_the_dtype():
    x = torch.randn(2, 5)
    got = _ln_grads_autograd(x, torch.randn(5), torch.randn(2, 5), 1e-5)
    assert [g.dtype for g in got] == [torch.float32] * 3 and got[0].shape == x.shape and got[1].shape == (5,)


def test_5_1_reference():
    for student in (good_backward, jacobian_backward):
        got, points, lost = result("5.1", student)
        assert got == points, (student.__name__, lost)


def test_5_1_the_chapters_code_does_not_pass():
    got, points, lost = result("5.1", layer_norm)  # verbatim: a forward pass
    assert got == 0 and all("return a tuple (grad_x, grad_gain, grad_bias)" in m for m in lost.values()), lost
    got, lost = loses("5.1", autograd_backward, "relies on autograd", "torch.no_grad()")
    assert got == 0, lost


@pytest.mark.parametrize("student, words", [
    (ignores_gain, ("ignores gain",)),
    (mean_only, ("the variance depends on x too",)),
    (constants, ("as if the mean and the variance were constants",)),
    (per_position_params, ("sum their gradient over all leading dimensions",)),
    (eps_outside, ("eps = 0.5",)),
    (variance_by_squares, ("centre x before squaring",)),
])
def test_5_1_wrong_answers(student, words):
    loses("5.1", student, *words)


# ----------------------------------------------------------------- through the instructor's grader

REMOTE_STUDENT = '''
import torch

def layer_norm_backward(x, gain, grad_out, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    s = torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps)
    xhat, g = (x - mu) / s, grad_out * gain
    grad_x = (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True)) / s
    d = x.shape[-1]
    return grad_x, (grad_out * xhat).reshape(-1, d).sum(0), grad_out.reshape(-1, d).sum(0)

def by_autograd(x, gain, grad_out, eps=1e-5):
    x = x.detach().requires_grad_(True)
    gain = gain.detach().requires_grad_(True)
    mu = x.mean(-1, keepdim=True)
    y = gain * (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps)
    (y * grad_out).sum().backward()
    return x.grad, gain.grad, grad_out.reshape(-1, x.shape[-1]).sum(0)
'''


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    with worker_session(tmp_path_factory.mktemp("work"), REMOTE_STUDENT) as s:
        yield s



def test_5_1_through_the_worker(session):
    got, points, lost = remote_result(session, "5.1", "layer_norm_backward")
    assert got == points, lost
    got, points, lost = remote_result(session, "5.1", "by_autograd")
    assert got == 0 and all("relies on autograd" in m for m in lost.values()), lost
