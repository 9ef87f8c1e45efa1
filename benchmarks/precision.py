"""Mixed-precision benchmark (Chapter 15): a GPT training step in fp32 against bf16 autocast on the CPU.

Both sides train the same companion GPT from the same weights (one copy each),
timed alternately (see ``common.paired_median_seconds``). Whether bf16 is
faster depends on the CPU: with bf16 instructions (AVX512-BF16, AMX) matrix
products speed up; without them autocast converts back and forth and can be slower.
"""

from __future__ import annotations

import copy

import torch

from .common import Row, Settings, paired_median_seconds

VOCAB, D_MODEL, N_LAYERS, N_HEADS, BLOCK = 256, 128, 4, 4, 128


def _step(model, optimizer, x, y, bf16: bool) -> None:
    from companion.training import lm_loss

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = lm_loss(model, (x, y))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def bench_autocast(settings: Settings) -> list[Row]:
    from companion.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    fp32 = GPT(GPTConfig(vocab_size=VOCAB, max_positions=BLOCK, d_model=D_MODEL, n_layers=N_LAYERS,
                         n_heads=N_HEADS, dropout=0.0)).train()
    bf16 = copy.deepcopy(fp32)
    batch = 8 if settings.quick else 16
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (batch, BLOCK), generator=g)
    y = torch.randint(0, VOCAB, (batch, BLOCK), generator=g)
    opt_a = torch.optim.AdamW(fp32.parameters(), lr=1e-4)
    opt_b = torch.optim.AdamW(bf16.parameters(), lr=1e-4)
    ta, tb = paired_median_seconds(lambda: _step(fp32, opt_a, x, y, False), lambda: _step(bf16, opt_b, x, y, True),
                                   settings)
    tokens = batch * BLOCK
    n_params = sum(p.numel() for p in fp32.parameters())
    return [Row("GPT training step, fp32 vs bf16 autocast", f"{n_params / 1e6:.2f}M params, B={batch}, T={BLOCK}",
                "fp32", tokens / ta, "bf16 autocast", tokens / tb, "tok/s")]


BENCHMARKS = {"autocast": bench_autocast}
