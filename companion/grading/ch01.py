"""Checks for the Chapter 1 exercises (recurrence against attention).

Each case runs the student's code on several sizes, including odd ones and
the edge case of a single position, and compares with
:mod:`companion.recurrence` (itself tested against ``nn.RNN``, torch's FLOP
counter and autograd).
"""

from __future__ import annotations

import torch
from torch import nn

from ..recurrence import attention_flops, lstm_flops, max_path_length, rnn_flops
from .core import Case, CheckFailed, Exercise, expect_tensor, register


def _expect_int(got, want: int, what: str) -> None:
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, int):
        raise CheckFailed(f"{what} should be an int ({want}), got {type(got).__name__} {got!r}")
    if got != want:
        raise CheckFailed(f"{what}: expected {want}, got {got}")


# ----------------------------------------------------------------- 1.1 path length

def _path_attention(student):
    for t in (2, 7, 50):
        _expect_int(student("self-attention", t, 3), max_path_length("self-attention", t), f"self-attention, t={t}")


def _path_recurrent(student):
    for t in (2, 7, 50):
        _expect_int(student("recurrent", t, 3), max_path_length("recurrent", t), f"recurrent, t={t}")


def _path_conv(student):
    for t, k in ((7, 3), (13, 3), (13, 5), (10, 2), (4, 9)):
        _expect_int(student("convolutional", t, k), max_path_length("convolutional", t, k),
                    f"convolutional, t={t}, kernel_size={k}")


def _path_single(student):
    for layer in ("self-attention", "recurrent", "convolutional"):
        _expect_int(student(layer, 1, 3), 0, f"{layer}, t=1 (a single position needs no path)")


register(Exercise(
    id="1.1",
    title="Maximum path length",
    targets=("max_path_length",),
    forbidden=("companion.recurrence",),  # the reference itself
    cases=(
        Case("self-attention: one layer connects every pair", 1, _path_attention),
        Case("recurrent: one cell application per position", 1, _path_recurrent),
        Case("convolutional: contiguous kernels of width k", 2, _path_conv),
        Case("a single position (t = 1)", 1, _path_single),
    ),
))


# ----------------------------------------------------------------- 1.2 RNN loop

def _rnn_ref(b, t, d_in, d, *, bias=True, with_h0=True):
    torch.manual_seed(1)
    rnn = nn.RNN(d_in, d, batch_first=True, bias=bias)
    x = torch.randn(b, t, d_in)
    h0 = torch.randn(b, d) if with_h0 else None
    with torch.no_grad():
        out, h = rnn(x, None if h0 is None else h0[None])
    args = (x, rnn.weight_ih_l0.detach(), rnn.weight_hh_l0.detach(),
            rnn.bias_ih_l0.detach() if bias else None, rnn.bias_hh_l0.detach() if bias else None, h0)
    return args, out, h[0]


def _pair(result):
    if not (isinstance(result, tuple) and len(result) == 2):
        raise CheckFailed(f"rnn_forward should return a pair (out, h_last), got {type(result).__name__}")
    return result


def _rnn_random(student):
    args, out, h = _rnn_ref(3, 7, 5, 6)
    got_out, got_h = _pair(student(*args))
    expect_tensor(got_out, out, name="out (B=3, T=7, Din=5, D=6) vs nn.RNN")
    expect_tensor(got_h, h, name="h_last vs nn.RNN")


def _rnn_zero_state(student):
    args, out, h = _rnn_ref(2, 13, 4, 9, with_h0=False)
    got_out, got_h = _pair(student(*args))
    expect_tensor(got_out, out, name="out with h0=None (start from zeros)")
    expect_tensor(got_h, h, name="h_last with h0=None")


def _rnn_no_bias(student):
    args, out, _ = _rnn_ref(2, 5, 3, 4, bias=False)
    got_out, _ = _pair(student(*args))
    expect_tensor(got_out, out, name="out with bias_ih=bias_hh=None")


def _rnn_length_one(student):
    args, out, h = _rnn_ref(1, 1, 2, 3)
    got_out, got_h = _pair(student(*args))
    expect_tensor(got_out, out, name="out for T=1")
    expect_tensor(got_h, h, name="h_last for T=1")


register(Exercise(
    id="1.2",
    title="An RNN, one step at a time",
    targets=("rnn_forward",),
    forbidden=("companion.recurrence",),  # the reference itself
    cases=(
        Case("matches nn.RNN with an initial state", 2, _rnn_random),
        Case("h0=None starts from zeros", 1, _rnn_zero_state),
        Case("works without biases", 1, _rnn_no_bias),
        Case("a sequence of length 1", 1, _rnn_length_one),
    ),
))


# ----------------------------------------------------------------- 1.3 FLOPs

def _flops_rnn(student):
    for t, d, b in ((7, 12, 1), (13, 5, 3)):
        _expect_int(student("recurrent", t, d, b), rnn_flops(t, d, batch=b), f"recurrent, t={t}, d_model={d}, batch={b}")


def _flops_lstm(student):
    for t, d, b in ((7, 12, 1), (13, 5, 3)):
        _expect_int(student("lstm", t, d, b), lstm_flops(t, d, batch=b), f"lstm, t={t}, d_model={d}, batch={b}")


def _flops_attention(student):
    for t, d, b in ((7, 12, 1), (13, 5, 3), (100, 8, 2)):
        _expect_int(student("self-attention", t, d, b), attention_flops(t, d, b),
                    f"self-attention with projections, t={t}, d_model={d}, batch={b}")


def _flops_crossover(student):
    # The formulas must agree on where attention starts to cost more than an LSTM: T = 2 d_model.
    d = 16
    below, above = student("self-attention", 2 * d - 1, d, 1), student("lstm", 2 * d - 1, d, 1)
    if not (isinstance(below, int) and isinstance(above, int) and below < above):
        raise CheckFailed(f"at t = 2*d_model - 1 = {2 * d - 1} attention should cost fewer FLOPs than an LSTM, "
                          f"got attention={below!r}, lstm={above!r}")


register(Exercise(
    id="1.3",
    title="Counting FLOPs: RNN, LSTM and self-attention",
    targets=("layer_flops",),
    forbidden=("companion.recurrence",),  # the reference itself
    cases=(
        Case("recurrent (Elman) layer", 1, _flops_rnn),
        Case("LSTM layer", 1, _flops_lstm),
        Case("self-attention layer with its four projections", 2, _flops_attention),
        Case("attention is cheaper than an LSTM below t = 2 d_model", 1, _flops_crossover),
    ),
))
