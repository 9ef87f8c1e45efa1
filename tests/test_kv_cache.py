"""KVCache (Chapter 9): bookkeeping, memory formula, errors, reorder/crop."""

from __future__ import annotations

import pytest
import torch

from companion.kv_cache import KVCache, kv_cache_bytes
from companion.models.gpt import GPT, GPTConfig


def test_append_concatenates_along_time():
    g = torch.Generator().manual_seed(0)
    cache = KVCache(2)
    k1, v1 = torch.randn(3, 4, 7, 5, generator=g), torch.randn(3, 4, 7, 6, generator=g)
    k2, v2 = torch.randn(3, 4, 1, 5, generator=g), torch.randn(3, 4, 1, 6, generator=g)
    for layer in range(2):
        cache.append(layer, k1, v1)
    assert cache.length == 7
    k_all, v_all = cache.append(0, k2, v2)
    assert torch.equal(k_all, torch.cat([k1, k2], 2)) and torch.equal(v_all, torch.cat([v1, v2], 2))
    cache.append(1, k2, v2)
    assert cache.length == 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_nbytes_matches_formula_after_model_forward(dtype):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=31, max_positions=32, d_model=24, n_layers=3, n_heads=4)
    model = GPT(cfg).eval().to(dtype)
    cache = KVCache(cfg.n_layers)
    with torch.no_grad():
        model(torch.randint(0, 31, (2, 13)), cache=cache)
    elem = torch.tensor([], dtype=dtype).element_size()
    # Independent count: every held tensor is (B, H, S, Dh).
    held = sum(t.numel() * t.element_size() for t in cache.keys + cache.values)
    assert cache.nbytes() == held
    assert cache.nbytes() == kv_cache_bytes(3, 4, 6, 13, batch_size=2, bytes_per_element=elem)
    assert kv_cache_bytes(3, 4, 6, 13, bytes_per_element=elem) == 2 * 3 * 4 * 6 * 13 * elem


def test_gpt2_small_cache_size_by_hand():
    # 2 (k and v) * 12 layers * 768 (= 12 heads * 64) * 1024 tokens * 2 bytes (fp16) = 36 MiB
    assert kv_cache_bytes(12, 12, 64, 1024, bytes_per_element=2) == 36 * 2**20


def test_errors():
    cache = KVCache(2)
    with pytest.raises(ValueError, match="layer must be an int"):
        cache.has(2)
    cache.append(0, torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    with pytest.raises(ValueError, match="layer 0"):
        cache.append(1, torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
    with pytest.raises(ValueError):
        KVCache(0)
    with pytest.raises(ValueError, match="seq_len"):
        kv_cache_bytes(1, 1, 1, -1)


def test_reorder_and_crop():
    cache = KVCache(1)
    k = torch.arange(3 * 1 * 5 * 2, dtype=torch.float32).view(3, 1, 5, 2)
    cache.append(0, k, k.clone())
    cache.reorder(torch.tensor([2, 0]))
    assert torch.equal(cache.keys[0], k[[2, 0]])
    cache.crop(3)
    assert cache.length == 3 and torch.equal(cache.values[0], k[[2, 0], :, :3])
    cache.crop(0)
    assert cache.length == 0 and cache.nbytes() == 0
