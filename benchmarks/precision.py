"""Mixed-precision benchmark (Chapter 15): a GPT training step in fp32 against autocast.

On the CPU the autocast dtype is bf16; on a GPU it is what
:func:`companion.device.mixed_precision` picks (bf16 from compute capability
8.0, fp16 with a loss scale below).

Both sides train the same companion GPT from the same weights (one copy each),
timed alternately (see ``common.paired_median_seconds``). Whether bf16 is
faster depends on the CPU: with bf16 instructions (AVX512-BF16, AMX) matrix
products speed up; without them autocast converts back and forth and can be slower.
"""

from __future__ import annotations

import copy

import torch

from .common import Row, Settings, on_device, paired_median_seconds

DEVICES = ("cpu", "cuda")

VOCAB, D_MODEL, N_LAYERS, N_HEADS, BLOCK = 256, 128, 4, 4, 128


def _step(model, optimizer, x, y, precision, scaler) -> None:
    from companion.training import lm_loss

    with precision.autocast():
        loss = lm_loss(model, (x, y))
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()  # a disabled scaler (bf16, fp32) passes the loss through
    scaler.step(optimizer)
    scaler.update()


def bench_autocast(settings: Settings) -> list[Row]:
    from companion.device import mixed_precision
    from companion.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    fp32 = GPT(GPTConfig(vocab_size=VOCAB, max_positions=BLOCK, d_model=D_MODEL, n_layers=N_LAYERS,
                         n_heads=N_HEADS, dropout=0.0)).train()
    low = copy.deepcopy(fp32)
    fp32, low = on_device(settings, fp32, low)
    batch = 8 if settings.quick else 16
    if settings.device != "cpu":
        batch *= 4  # a GPU idles on the CPU's batch
    g = torch.Generator().manual_seed(0)
    x, y = on_device(settings, torch.randint(0, VOCAB, (batch, BLOCK), generator=g),
                     torch.randint(0, VOCAB, (batch, BLOCK), generator=g))
    none = mixed_precision("cpu")
    mixed = mixed_precision(settings.device, cpu_bf16=True)
    scalers = none.grad_scaler(), mixed.grad_scaler()
    opt_a = torch.optim.AdamW(fp32.parameters(), lr=1e-4)
    opt_b = torch.optim.AdamW(low.parameters(), lr=1e-4)
    ta, tb = paired_median_seconds(lambda: _step(fp32, opt_a, x, y, none, scalers[0]),
                                   lambda: _step(low, opt_b, x, y, mixed, scalers[1]), settings)
    tokens = batch * BLOCK
    n_params = sum(p.numel() for p in fp32.parameters())
    label = (f"{str(mixed.dtype).removeprefix('torch.')} autocast{' + loss scale' if mixed.loss_scale else ''}"
             if mixed.enabled else "fp32 (no autocast here)")
    return [Row(f"GPT training step, fp32 vs {label}", f"{n_params / 1e6:.2f}M params, B={batch}, T={BLOCK}, "
                f"{settings.device}", "fp32", tokens / ta, label, tokens / tb, "tok/s")]


BENCHMARKS = {"autocast": bench_autocast}
