"""Exact attention three ways (Chapter 13): naive, tiled with an online softmax, and PyTorch's fused kernel.

* ``memory``: peak bytes of the tensors each computation creates
  (:func:`companion.memory.peak_tensor_bytes`), naive against tiled, at several
  lengths. Goal: the tiled version's memory grows linearly while it stays exact.
* ``time``: the tiled version (Python loops over 64 x 64 tiles) against the naive
  one and against ``F.scaled_dot_product_attention``. On a CPU, in plain PyTorch,
  the tiles buy memory, not speed: the real FlashAttention kernel is fast because
  it keeps tiles in a GPU's on-chip SRAM, which Python cannot do.

Outputs are compared before anything is measured.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from benchmarks.common import Row, Settings, paired_median_seconds
from companion.memory import peak_tensor_bytes
from companion.tiled_attention import tiled_attention


def _naive(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1) @ v


def _inputs(t, heads=4, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, heads, t, d, generator=g) for _ in range(3))


def memory(settings: Settings) -> list[Row]:
    rows = []
    for t in ((512, 1024) if settings.quick else (512, 1024, 2048, 4096)):
        q, k, v = _inputs(t)
        naive_out, naive_bytes = peak_tensor_bytes(_naive, q, k, v)
        tiled_out, tiled_bytes = peak_tensor_bytes(tiled_attention, q, k, v)
        torch.testing.assert_close(tiled_out, naive_out, atol=1e-5, rtol=1e-5)
        rows.append(Row("attention peak memory", f"T={t}, 4 heads x 32", "naive", naive_bytes / 2**20,
                        "tiled", tiled_bytes / 2**20, "MiB"))
    return rows


def time(settings: Settings) -> list[Row]:
    rows = []
    for t in ((256,) if settings.quick else (256, 1024)):
        q, k, v = _inputs(t)
        torch.testing.assert_close(tiled_attention(q, k, v), F.scaled_dot_product_attention(q, k, v),
                                   atol=1e-5, rtol=1e-5)
        ta, tb = paired_median_seconds(lambda: tiled_attention(q, k, v), lambda: _naive(q, k, v), settings)
        rows.append(Row("attention forward time", f"T={t}, 4 heads x 32", "tiled", 1e3 * ta, "naive", 1e3 * tb, "ms"))
        ta, tb = paired_median_seconds(lambda: tiled_attention(q, k, v),
                                       lambda: F.scaled_dot_product_attention(q, k, v), settings)
        rows.append(Row("attention forward time", f"T={t}, 4 heads x 32", "tiled", 1e3 * ta, "F.sdpa", 1e3 * tb, "ms"))
    return rows


BENCHMARKS = {"memory": memory, "time": time}
