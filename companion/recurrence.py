"""Recurrence against self-attention: cost, sequential steps and path length (Chapter 1).

A recurrent layer computes ``h_t = f(x_t, h_{t-1})``: step ``t`` cannot start
before step ``t - 1`` has finished, so a sequence of length ``T`` costs ``T``
*sequential* operations, and information from position 0 reaches position
``T - 1`` through ``T - 1`` applications of the cell. Self-attention computes
all positions with a few matrix products whose size grows with ``T``: a
constant number of sequential operations and a path of length 1 between any
two positions, for ``O(T^2 D)`` work instead of ``O(T D^2)``.

This module counts those quantities analytically (Vaswani et al., 2017,
Table 1), checks the counts against measurements (FLOPs from
``torch.utils.flop_counter``, dependencies from autograd) and times the layers.

Shape legend: B batch, T sequence length, Din input size, D hidden (model) size.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import ShapeChecker, check_positive_int

__all__ = [
    "LAYER_TYPES",
    "LayerCost",
    "layer_cost",
    "sequential_steps",
    "max_path_length",
    "rnn_forward",
    "rnn_flops",
    "lstm_flops",
    "attention_flops",
    "count_flops",
    "count_matmul_calls",
    "gradient_by_distance",
    "rounds_to_connect",
    "layer_step",
    "time_call",
    "time_layers",
]

# The layer types of Table 1 of Vaswani et al. (2017), plus the contiguous
# convolution the paper describes in the text of section 4.
LAYER_TYPES = ("self-attention", "recurrent", "convolutional", "dilated convolutional")


def _check_layer(layer: str) -> str:
    if layer not in LAYER_TYPES:
        raise ValueError(f"layer must be one of {LAYER_TYPES}, got {layer!r}")
    return layer


def _check_kernel(kernel_size: int) -> int:
    check_positive_int("kernel_size", kernel_size)
    if kernel_size < 2:
        raise ValueError(f"a convolution connects neighbours only with kernel_size >= 2, got {kernel_size}")
    return kernel_size


def sequential_steps(layer: str, t: int) -> int:
    """Operations that must run one after another to compute one layer on ``t`` positions.

    Table 1, column "Sequential Operations": O(1) for self-attention and
    convolutions (every position is computed at once), O(n) for a recurrent
    layer (one cell application per position).
    """
    _check_layer(layer)
    check_positive_int("t", t)
    return t if layer == "recurrent" else 1


def max_path_length(layer: str, t: int, kernel_size: int = 3) -> int:
    """Longest shortest path (in layer applications) from input position 0 to output position ``t - 1``.

    * self-attention: 1 (one layer connects every pair; 0 when ``t == 1``);
    * recurrent: ``t - 1`` applications of the cell carry ``x_0`` to ``h_{t-1}``;
    * convolutional (contiguous kernel ``k``): each layer widens the receptive
      field by ``k - 1``, so ``ceil((t - 1) / (k - 1))`` layers are needed;
    * dilated convolutional (dilations ``1, k, k^2, ...``): ``ceil(log_k t)`` layers.
    """
    _check_layer(layer)
    check_positive_int("t", t)
    if t == 1:
        return 0
    if layer == "self-attention":
        return 1
    if layer == "recurrent":
        return t - 1
    k = _check_kernel(kernel_size)
    if layer == "convolutional":
        return -(-(t - 1) // (k - 1))  # ceil without floats
    depth, span = 0, 1  # span: receptive field after `depth` dilated layers, k**depth
    while span < t:
        depth, span = depth + 1, span * k
    return depth


@dataclass(frozen=True)
class LayerCost:
    """One row of Table 1 of Vaswani et al. (2017), evaluated at concrete sizes."""

    layer: str  # layer type, one of LAYER_TYPES
    complexity: int  # multiply-adds per layer up to constants: n^2 d, n d^2 or k n d^2
    sequential: int  # sequential operations
    path_length: int  # maximum path length between any two positions


def layer_cost(layer: str, t: int, d_model: int, kernel_size: int = 3) -> LayerCost:
    """Table 1 evaluated at ``n = t``, ``d = d_model``, ``k = kernel_size`` (no hidden constants)."""
    _check_layer(layer)
    check_positive_int("t", t)
    check_positive_int("d_model", d_model)
    if layer == "self-attention":
        work = t * t * d_model
    elif layer == "recurrent":
        work = t * d_model * d_model
    else:
        work = _check_kernel(kernel_size) * t * d_model * d_model
    return LayerCost(layer, work, sequential_steps(layer, t), max_path_length(layer, t, kernel_size))


# ------------------------------------------------------------------ the recurrent layer

def rnn_forward(
    x: torch.Tensor,
    weight_ih: torch.Tensor,
    weight_hh: torch.Tensor,
    bias_ih: torch.Tensor | None = None,
    bias_hh: torch.Tensor | None = None,
    h0: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Elman RNN, one step at a time: ``h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)``.

    The same equation and parameter layout as ``torch.nn.RNN`` (one layer,
    ``nonlinearity="tanh"``, ``batch_first=True``).

    Args:
        x: inputs ``(B, T, Din)``.
        weight_ih: ``(D, Din)``; weight_hh: ``(D, D)``; biases ``(D,)`` or None.
        h0: initial state ``(B, D)``; zeros if None.

    Returns:
        ``out`` ``(B, T, D)`` (every ``h_t``) and the last state ``h_T`` ``(B, D)``.
    """
    sc = ShapeChecker()
    sc.check("x", x, ("B", "T", "Din"))
    sc.check("weight_ih", weight_ih, ("D", "Din"))
    sc.check("weight_hh", weight_hh, ("D", "D"))
    for name, b in (("bias_ih", bias_ih), ("bias_hh", bias_hh)):
        if b is not None:
            sc.check(name, b, ("D",))
    if h0 is not None:
        sc.check("h0", h0, ("B", "D"))
    h = x.new_zeros(x.shape[0], weight_hh.shape[0]) if h0 is None else h0  # (B, D)
    outs = []
    for t in range(x.shape[1]):  # the loop that cannot be parallelised: h depends on the previous h
        pre = F.linear(x[:, t], weight_ih, bias_ih) + F.linear(h, weight_hh, bias_hh)  # (B, D)
        h = torch.tanh(pre)
        outs.append(h)
    return torch.stack(outs, dim=1), h  # (B, T, D), (B, D)


# ------------------------------------------------------------------ FLOPs

def rnn_flops(t: int, d_model: int, d_input: int | None = None, batch: int = 1) -> int:
    """Matrix-product FLOPs of an Elman RNN layer: ``2 B T (Din D + D^2)``.

    A product of an ``(m, k)`` and a ``(k, n)`` matrix costs ``2 m k n`` FLOPs
    (one multiply and one add per term), the count ``torch.utils.flop_counter``
    uses. Biases and ``tanh`` are ``O(B T D)`` and not counted.
    """
    for name, v in (("t", t), ("d_model", d_model), ("batch", batch)):
        check_positive_int(name, v)
    d_in = d_model if d_input is None else check_positive_int("d_input", d_input)
    return 2 * batch * t * (d_in * d_model + d_model * d_model)


def lstm_flops(t: int, d_model: int, d_input: int | None = None, batch: int = 1) -> int:
    """An LSTM has four gates, each an RNN-sized product: ``8 B T (Din D + D^2)``."""
    return 4 * rnn_flops(t, d_model, d_input, batch)


def attention_flops(t: int, d_model: int, batch: int = 1, *, projections: bool = True) -> int:
    """Matrix-product FLOPs of one self-attention layer (any number of heads).

    ``q k^T`` and ``weights @ v`` cost ``2 B T^2 D`` each (summed over heads,
    ``H * Dh = D``): the ``O(n^2 d)`` of Table 1. With ``projections`` the
    four ``D x D`` projections (q, k, v, out) add ``8 B T D^2``.
    """
    for name, v in (("t", t), ("d_model", d_model), ("batch", batch)):
        check_positive_int(name, v)
    mixing = 4 * batch * t * t * d_model
    return mixing + (8 * batch * t * d_model * d_model if projections else 0)


def count_flops(fn: Callable[..., object], *args: object, **kwargs: object) -> int:
    """FLOPs of the matrix products run by ``fn(*args, **kwargs)``, measured by ``torch.utils.flop_counter``."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        fn(*args, **kwargs)
    return int(counter.get_total_flops())


_MATMULS = {"linear", "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "addmm", "baddbmm", "einsum"}


def count_matmul_calls(fn: Callable[..., object], *args: object, **kwargs: object) -> int:
    """How many matrix products (``linear``, ``matmul``, ``@``, ``bmm``...) ``fn`` calls from Python.

    Counted with ``torch.overrides.TorchFunctionMode``, so a fused kernel such
    as ``nn.RNN``'s counts as one call however many steps it loops over inside:
    use it on code written in PyTorch operations, like :func:`rnn_forward`.
    """
    from torch.overrides import TorchFunctionMode

    class _Counter(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in _MATMULS:
                _Counter.calls += 1
            return func(*args, **(kwargs or {}))

    with _Counter(), torch.no_grad():
        fn(*args, **kwargs)
    return _Counter.calls


def gradient_by_distance(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``||d out[:, T-1] / d x[:, j]||`` for every input position ``j``: how strongly the last output depends on each input.

    Args:
        fn: maps ``(B, T, D)`` to ``(B, T, D')``.
        x: input ``(B, T, D)``.

    Returns:
        ``(T,)``: entry ``j`` is the Frobenius norm of the Jacobian block
        (summed over the batch) of the last output with respect to input ``j``.
    """
    ShapeChecker().check("x", x, ("B", "T", "D"))
    x = x.detach().clone().requires_grad_(True)
    out = fn(x)
    last = out[:, -1]  # (B, D')
    rows = []
    for i in range(last.shape[-1]):  # one backward pass per output feature: exact Jacobian rows
        (g,) = torch.autograd.grad(last[:, i].sum(), x, retain_graph=True)
        rows.append(g)  # (B, T, D)
    jac = torch.stack(rows)  # (D', B, T, D)
    return jac.pow(2).sum(dim=(0, 1, 3)).sqrt()  # (T,)


# ------------------------------------------------------------------ path length, measured

def rounds_to_connect(
    step: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
    x: torch.Tensor,
    max_rounds: int,
) -> int:
    """Smallest ``m`` such that, after ``m`` parallel rounds, output ``T - 1`` depends on input 0.

    A round updates every position at once: ``h <- step(x, h, m)`` for
    ``m = 1, 2, ...``, starting from ``h = x``. Dependence is measured by
    automatic differentiation: a random perturbation direction is attached to
    ``x[:, 0]`` only (forward-mode AD, so each round costs one forward pass),
    and output ``T - 1`` depends on input 0 once its derivative in that
    direction is non-zero. One round of self-attention mixes all positions; a
    recurrence computed in parallel rounds moves information one position per round.

    Args:
        step: ``(x, h, m) -> h_new``, all ``(B, T, D)``; ``m`` is the round number.
        x: input ``(B, T, D)``.
        max_rounds: give up after this many rounds (raises ``ValueError``).
    """
    import torch.autograd.forward_ad as fwAD

    ShapeChecker().check("x", x, ("B", "T", "D"))
    check_positive_int("max_rounds", max_rounds)
    if x.shape[1] == 1:
        return 0
    tangent = torch.zeros_like(x)
    tangent[:, 0] = torch.randn_like(x[:, 0])  # perturb position 0 only
    with torch.no_grad(), fwAD.dual_level():
        x_dual = fwAD.make_dual(x.detach(), tangent)
        h = x_dual
        for m in range(1, max_rounds + 1):
            h = step(x_dual, h, m)  # (B, T, D)
            derivative = fwAD.unpack_dual(h).tangent
            if derivative is not None and bool(derivative[:, -1].abs().gt(0).any()):
                return m
    raise ValueError(f"position {x.shape[1] - 1} still does not depend on position 0 after {max_rounds} rounds")


def layer_step(layer: str, d_model: int, kernel_size: int = 3, *, seed: int = 0) -> Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]:
    """A round ``(x, h, m) -> h_new`` of each layer type, with random weights, for :func:`rounds_to_connect`.

    * self-attention: ``h <- Attention(h)``, no mask;
    * recurrent: ``h_i <- tanh(x_i W_ih^T + h_{i-1} W_hh^T)`` for every ``i`` at
      once (``h_{-1} = 0``); after ``T`` rounds this equals the RNN's output
      exactly (a Jacobi iteration of the recurrence);
    * convolutional: a causal (left-padded) convolution of width ``k``;
    * dilated convolutional: the same with dilation ``k^(m-1)`` in round ``m``
      (WaveNet's schedule), so the receptive field after ``m`` rounds is ``k^m``.
    """
    from .attention import MultiHeadAttention

    _check_layer(layer)
    check_positive_int("d_model", d_model)
    gen = torch.Generator().manual_seed(seed)
    scale = d_model ** -0.5
    if layer == "self-attention":
        torch.manual_seed(seed)
        attn = MultiHeadAttention(d_model, 1, backend="manual")
        return lambda x, h, m: attn(h)
    if layer == "recurrent":
        w_ih = torch.randn(d_model, d_model, generator=gen) * scale
        w_hh = torch.randn(d_model, d_model, generator=gen) * scale

        def rnn_round(x: torch.Tensor, h: torch.Tensor, m: int) -> torch.Tensor:
            previous = F.pad(h, (0, 0, 1, 0))[:, :-1]  # (B, T, D): h_{i-1}, zeros at i = 0
            return torch.tanh(x @ w_ih.T + previous @ w_hh.T)

        return rnn_round
    k = _check_kernel(kernel_size)
    weight = torch.randn(d_model, d_model, k, generator=gen) * (scale / k**0.5)
    dilated = layer == "dilated convolutional"

    def conv_round(x: torch.Tensor, h: torch.Tensor, m: int) -> torch.Tensor:
        dilation = k ** (m - 1) if dilated else 1
        padded = F.pad(h.transpose(1, 2), ((k - 1) * dilation, 0))  # (B, D, T + pad): causal, left only
        return torch.tanh(F.conv1d(padded, weight, dilation=dilation)).transpose(1, 2)  # (B, T, D)

    return conv_round


# ------------------------------------------------------------------ timing

def time_call(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1, clock: str = "cpu") -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs (after ``warmup`` runs), without autograd.

    ``clock="cpu"`` measures the CPU time of this process (``time.process_time``):
    on a machine shared with other jobs, wall-clock time also counts the time
    the operating system gave the processor to someone else, and that varies
    far more than the work itself. ``clock="wall"`` measures wall-clock time
    (``time.perf_counter``), what a user waits for on an idle machine.
    """
    check_positive_int("repeats", repeats)
    clocks = {"cpu": time.process_time, "wall": time.perf_counter}
    if clock not in clocks:
        raise ValueError(f"clock must be 'cpu' or 'wall', got {clock!r}")
    now = clocks[clock]
    with torch.no_grad():
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            start = now()
            fn()
            times.append(now() - start)
    return statistics.median(times)


def time_layers(
    lengths: Sequence[int],
    d_model: int = 64,
    *,
    n_heads: int = 1,
    batch: int = 1,
    repeats: int = 5,
    threads: int | None = 1,
    clock: str = "cpu",
    seed: int = 0,
) -> dict[str, list[float]]:
    """Median seconds of one forward pass of ``nn.RNN``, ``nn.LSTM`` and self-attention per length.

    Self-attention is :class:`companion.attention.MultiHeadAttention` (fused
    kernel), so all three include their projections. ``threads`` fixes
    torch's thread count during the measurement (1 by default: on a shared
    machine several threads mostly wait for each other); None leaves it.
    ``clock`` is passed to :func:`time_call` (CPU time by default).
    Returns ``{"length": [...], "rnn": [...], "lstm": [...], "attention": [...]}``.
    """
    from .attention import MultiHeadAttention

    check_positive_int("d_model", d_model)
    torch.manual_seed(seed)
    layers = {
        "rnn": nn.RNN(d_model, d_model, batch_first=True),
        "lstm": nn.LSTM(d_model, d_model, batch_first=True),
        "attention": MultiHeadAttention(d_model, n_heads),
    }
    result: dict[str, list[float]] = {"length": [int(t) for t in lengths], **{name: [] for name in layers}}
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(check_positive_int("threads", threads))
    try:
        for t in result["length"]:
            x = torch.randn(batch, check_positive_int("length", t), d_model)  # (B, T, D)
            for name, layer in layers.items():
                result[name].append(time_call(lambda: layer(x), repeats=repeats, clock=clock))
    finally:
        torch.set_num_threads(previous_threads)
    return result
