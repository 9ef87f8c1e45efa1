"""Chapter 12's measurements: how each family's forward pass grows with the sequence, and
teacher-forced training against token-by-token generation.

Three small models of one width (an encoder :class:`~companion.models.bert.BertModel`,
a decoder :class:`~companion.models.gpt.GPT`, an encoder-decoder
:class:`~companion.models.transformer.Transformer`) read ``T`` tokens in total (the
encoder-decoder: ``T/2`` source and ``T/2`` target tokens). For each ``T`` we record the
forward time (median of a few runs, one thread, CPU time of the process:
``time.process_time`` does not count the time other programs hold the cores), the peak memory of the tensors the
forward pass creates (:func:`companion.memory.peak_tensor_bytes`, attention computed
by the math backend, which materialises the score matrices) and the FLOPs of the
calculator (:func:`companion.calculators.forward_flops`). Times depend on the machine
and its load; memory and FLOPs do not. ``scripts/ch12_measure_scaling.py`` records a
longer run in ``companion/checkpoints/ch12_scaling.json``.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from .._checks import check_positive_int
from ..calculators import forward_flops
from ..generation import generate
from ..memory import peak_tensor_bytes
from ..models.bert import BertConfig, BertModel
from ..models.gpt import GPT, GPTConfig
from ..models.transformer import Transformer, TransformerConfig

__all__ = ["ScalingConfig", "family_models", "measure_scaling", "fit_exponent", "training_vs_generation",
           "load_scaling_results", "FAMILIES"]

FAMILIES = ("encoder", "decoder", "encoder-decoder")


@dataclass(frozen=True)
class ScalingConfig:
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2  # per stack: the encoder-decoder has 2 + 2
    d_ff: int = 512
    vocab_size: int = 256
    max_positions: int = 4096

    def configs(self) -> dict[str, Any]:
        c = self
        return {
            "encoder": BertConfig(vocab_size=c.vocab_size, d_model=c.d_model, n_layers=c.n_layers, n_heads=c.n_heads,
                                  d_ff=c.d_ff, max_positions=c.max_positions, dropout=0.0),
            "decoder": GPTConfig(vocab_size=c.vocab_size, max_positions=c.max_positions, d_model=c.d_model,
                                 n_layers=c.n_layers, n_heads=c.n_heads, d_ff=c.d_ff),
            "encoder-decoder": TransformerConfig(vocab_size=c.vocab_size, d_model=c.d_model, n_heads=c.n_heads,
                                                 d_ff=c.d_ff, n_encoder_layers=c.n_layers,
                                                 n_decoder_layers=c.n_layers, max_positions=c.max_positions,
                                                 dropout=0.0),
        }


def family_models(cfg: ScalingConfig = ScalingConfig(), seed: int = 0) -> dict[str, torch.nn.Module]:
    """The three models of ``cfg``, in eval mode, with weights from ``seed``."""
    torch.manual_seed(seed)
    builders = {"encoder": BertModel, "decoder": GPT, "encoder-decoder": Transformer}
    return {name: builders[name](c).eval() for name, c in cfg.configs().items()}


def _forward(name: str, model: torch.nn.Module, t: int) -> Callable[[], Any]:
    g = torch.Generator().manual_seed(t)  # drawn on the CPU (the same ids everywhere), then moved to the model
    vocab, device = model.cfg.vocab_size, next(model.parameters()).device
    if name == "encoder-decoder":
        src = torch.randint(1, vocab, (1, t // 2), generator=g).to(device)
        tgt = torch.randint(1, vocab, (1, t - t // 2), generator=g).to(device)
        return lambda: model(src, tgt)
    ids = torch.randint(1, vocab, (1, t), generator=g).to(device)
    return lambda: model(ids)


def _flops(name: str, cfg: Any, t: int) -> int:
    if name == "encoder-decoder":
        return forward_flops(cfg, t - t // 2, src_len=t // 2)
    return forward_flops(cfg, t)


def measure_scaling(lengths: list[int], *, repeats: int = 3, cfg: ScalingConfig = ScalingConfig(),
                    timing: bool = True) -> dict[str, dict[str, list]]:
    """``{family: {"length": [...], "seconds": [...], "peak_bytes": [...], "flops": [...]}}``.

    ``seconds`` is the median CPU time (``time.process_time``) of ``repeats`` forward passes after one warm-up
    (``None`` when ``timing`` is False); ``peak_bytes`` is measured once with the math
    attention backend; everything runs under ``torch.no_grad``.
    """
    if not lengths or any(isinstance(t, bool) or not isinstance(t, int) or t < 2 for t in lengths):
        raise ValueError(f"lengths must be a non-empty list of ints >= 2, got {lengths!r}")
    check_positive_int("repeats", repeats)
    if max(lengths) > cfg.max_positions:
        raise ValueError(f"lengths go up to {max(lengths)}, more than max_positions={cfg.max_positions}")
    models, configs = family_models(cfg), cfg.configs()
    out: dict[str, dict[str, list]] = {}
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        for name, model in models.items():
            rows: dict[str, list] = {"length": [], "seconds": [], "peak_bytes": [], "flops": []}
            for t in lengths:
                fn = _forward(name, model, t)
                _, peak = peak_tensor_bytes(fn)
                seconds = None
                if timing:
                    fn()  # warm-up
                    runs = []
                    for _ in range(repeats):
                        start = time.process_time()
                        fn()
                        runs.append(time.process_time() - start)
                    seconds = statistics.median(runs)
                for key, value in (("length", t), ("seconds", seconds), ("peak_bytes", peak),
                                   ("flops", _flops(name, configs[name], t))):
                    rows[key].append(value)
            out[name] = rows
    return out


def fit_exponent(lengths: list[float], values: list[float]) -> float:
    """Slope of the least-squares line through ``(log T, log value)``: ``value ~ T ** slope``."""
    if len(lengths) != len(values) or len(lengths) < 2:
        raise ValueError(f"need two or more (length, value) pairs of equal count, got {len(lengths)} and {len(values)}")
    if any(not v > 0 for v in [*lengths, *values]):
        raise ValueError("lengths and values must be positive to be fitted in log-log")
    xs, ys = [math.log(t) for t in lengths], [math.log(v) for v in values]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def _count_flops(fn: Callable[[], Any]) -> int:
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        fn()
    return counter.get_total_flops()


def training_vs_generation(model: GPT, n_tokens: int, *, timing: bool = True) -> dict[str, Any]:
    """One teacher-forced forward pass over ``n_tokens`` tokens against generating them one at a time.

    Returns forward calls, counted FLOPs and (if ``timing``) CPU seconds of: ``training``
    (one pass, every position at once), ``generation_cache`` (greedy, with a KV cache,
    from a one-token prompt) and ``generation_no_cache`` (each step re-reads the whole prefix).
    """
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a companion.models.gpt.GPT, got {type(model).__name__}")
    check_positive_int("n_tokens", n_tokens)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.cfg.vocab_size, (1, n_tokens), generator=g).to(next(model.parameters()).device)
    prompt = ids[:, :1]

    runs = {
        "training": (lambda: model(ids), 1),
        "generation_cache": (lambda: generate(model, prompt, n_tokens - 1), n_tokens - 1),
        "generation_no_cache": (lambda: generate(model, prompt, n_tokens - 1, use_cache=False), n_tokens - 1),
    }
    out: dict[str, Any] = {}
    with torch.no_grad():
        for name, (fn, calls) in runs.items():
            row = {"forward_calls": calls, "flops": _count_flops(fn)}
            if timing:
                fn()
                start = time.process_time()
                fn()
                row["seconds"] = time.process_time() - start
            out[name] = row
    return out


def load_scaling_results() -> dict[str, Any]:
    """The run recorded by ``scripts/ch12_measure_scaling.py`` (machine, load and settings included)."""
    path = resources.files("companion.checkpoints") / "ch12_scaling.json"
    return json.loads(path.read_text())
