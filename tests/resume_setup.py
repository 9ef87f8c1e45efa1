"""What the resumable-training tests share, in one process (tests/test_training.py) and under
torchrun (tests/distributed_worker.py): a tiny GPT, batches that depend on the step alone, and
an exception that stands for a killed process."""

from __future__ import annotations

import torch

from companion.models.gpt import GPT, GPTConfig
from companion.training import lm_loss


def tiny_gpt(seed: int) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=13, max_positions=8, d_model=16, n_layers=2, n_heads=2, dropout=0.0))


def step_batch(step: int):
    """The whole batch of a step, a function of the step only: what makes a resumed run equal an uninterrupted one."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, 13, (4, 8), generator=g)
    return x, torch.roll(x, -1, dims=1)


def evaluate(model) -> float:
    return lm_loss(model, step_batch(-1)).item()


class Killed(Exception):
    """Raised from a batch function to stop train() as a killed process would."""
