"""Exact attention three ways (Chapter 13): naive, tiled with an online softmax, and PyTorch's fused kernel.

* ``memory``: peak bytes of the tensors each computation creates
  (:func:`companion.memory.peak_tensor_bytes`), naive against tiled and tiled against
  ``F.scaled_dot_product_attention``, at several lengths. Goal: the tiled version's memory grows linearly while it stays exact.
* ``time``: the tiled version (Python loops over 64 x 64 tiles) against the naive
  one and against ``F.scaled_dot_product_attention``. On a CPU, in plain PyTorch,
  the tiles buy memory, not speed: the real FlashAttention kernel is fast because
  it keeps tiles in a GPU's on-chip SRAM, which Python cannot do.

* ``efficient_time`` / ``efficient_memory``: each efficient attention of
  :mod:`companion.efficient_attention` (sliding window, BigBird through its
  mask, Linformer, Performer) against full attention at several lengths.

Outputs are compared before anything is measured.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from benchmarks.common import Row, Settings, paired_median_seconds
from companion.efficient_attention import (bigbird_attention, linformer_attention, linformer_projections,
                                           orthogonal_random_features, performer_attention, sliding_window_attention)
from companion.masks import sliding_window_mask
from companion.memory import peak_tensor_bytes
from companion.tiled_attention import tiled_attention

# The CPU only, by nature: peak_tensor_bytes counts the CPU allocator's tensors, and the Python-loop tiled
# attention says nothing about a GPU's fused kernels (benchmarks.gpt times attention on a GPU inside the model).
DEVICES = ("cpu",)


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
        _, sdpa_bytes = peak_tensor_bytes(F.scaled_dot_product_attention, q, k, v)
        rows.append(Row("attention peak memory", f"T={t}, 4 heads x 32", "tiled", tiled_bytes / 2**20,
                        "F.sdpa", sdpa_bytes / 2**20, "MiB"))
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


WINDOW, BLOCK, K_PROJ, N_FEATURES = 32, 32, 64, 64


def efficient_methods(t: int, seed: int = 0) -> dict:
    """Each efficient attention at length ``t`` as a function of ``(q, k, v)`` (Chapter 13's settings)."""
    g = torch.Generator().manual_seed(seed)
    e, f = linformer_projections(t, K_PROJ, generator=g)
    w = orthogonal_random_features(N_FEATURES, 32, generator=g)
    return {
        f"sliding window W={WINDOW}": lambda q, k, v: sliding_window_attention(q, k, v, WINDOW, global_tokens=[0]),
        f"BigBird (mask) block {BLOCK}": lambda q, k, v: bigbird_attention(
            q, k, v, BLOCK, n_random_blocks=2, generator=torch.Generator().manual_seed(seed)),
        f"Linformer K={K_PROJ}": lambda q, k, v: linformer_attention(q, k, v, e, f),
        f"Performer M={N_FEATURES}": lambda q, k, v: performer_attention(q, k, v, w),
    }


def _lengths(settings: Settings) -> tuple[int, ...]:
    return (512, 1024) if settings.quick else (512, 1024, 2048, 4096)


def efficient_memory(settings: Settings) -> list[Row]:
    rows = []
    for t in _lengths(settings):
        q, k, v = _inputs(t)
        mask = sliding_window_mask(t, WINDOW, global_tokens=[0])
        window_out = sliding_window_attention(q, k, v, WINDOW, global_tokens=[0])
        torch.testing.assert_close(window_out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                                   atol=1e-5, rtol=1e-5)
        _, full_bytes = peak_tensor_bytes(_naive, q, k, v)
        for name, fn in efficient_methods(t).items():
            _, nbytes = peak_tensor_bytes(fn, q, k, v)
            rows.append(Row("efficient attention peak memory", f"T={t}, 4 heads x 32", name, nbytes / 2**20,
                            "full (naive)", full_bytes / 2**20, "MiB"))
    return rows


def efficient_time(settings: Settings) -> list[Row]:
    rows = []
    for t in ((512,) if settings.quick else (512, 2048)):
        q, k, v = _inputs(t)
        for name, fn in efficient_methods(t).items():
            ta, tb = paired_median_seconds(lambda: fn(q, k, v), lambda: _naive(q, k, v), settings)
            rows.append(Row("efficient attention forward time", f"T={t}, 4 heads x 32", name, 1e3 * ta,
                            "full (naive)", 1e3 * tb, "ms"))
    return rows


BENCHMARKS = {"memory": memory, "time": time, "efficient_memory": efficient_memory, "efficient_time": efficient_time}
