"""One small training loop for every chapter that trains a model.

The loop is deliberately plain: AdamW, optional linear warm-up then cosine
decay, gradient clipping, periodic evaluation and a progress bar. Chapters
pass a ``loss_fn(model, batch)`` and a ``get_batch(step)`` so the same loop
trains a GPT, an encoder-decoder or a positional-encoding experiment.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ._checks import check_positive_int

__all__ = ["TrainConfig", "History", "lr_at", "train", "lm_loss"]


def lm_loss(model: Callable[[torch.Tensor], torch.Tensor], batch: tuple[torch.Tensor, torch.Tensor], *, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy (nats per token) of a language model on ``(x, y)``, both ``(B, T)``.

    ``model(x)`` gives logits ``(B, T, V)``; ``y[b, t]`` is the token after ``x[b, t]``.
    ``reduction="none"`` gives the loss per position, shape ``(B, T)``. This is the
    ``loss_fn`` of :func:`train` for every language model of the course.
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    x, y = batch
    logits = model(x)  # (B, T, V)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction=reduction)
    return loss.view_as(y) if reduction == "none" else loss


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000  # optimizer steps
    lr: float = 3e-3  # peak learning rate
    warmup_steps: int = 0  # linear warm-up from 0 to lr
    cosine: bool = True  # cosine decay to min_lr_ratio * lr after warm-up
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float | None = 1.0  # max global gradient norm, None = no clipping
    eval_every: int = 100  # steps between evaluations (and at the last step)

    def __post_init__(self) -> None:
        check_positive_int("steps", self.steps)
        check_positive_int("eval_every", self.eval_every)
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not 0 <= self.warmup_steps <= self.steps:
            raise ValueError(f"warmup_steps must lie in [0, steps={self.steps}], got {self.warmup_steps}")


@dataclass
class History:
    """Losses recorded by :func:`train`."""

    steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)  # one per step
    eval_steps: list[int] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)  # before clipping

    @property
    def final_eval(self) -> float:
        if not self.eval_loss:
            raise ValueError("no evaluation was recorded: pass eval_fn to train()")
        return self.eval_loss[-1]


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate at ``step`` (0-based): linear warm-up, then cosine decay or constant."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if not cfg.cosine:
        return cfg.lr
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    ratio = cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return cfg.lr * ratio


def train(
    model: nn.Module,
    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
    get_batch: Callable[[int], Any],
    cfg: TrainConfig,
    *,
    eval_fn: Callable[[nn.Module], float] | None = None,
    progress: bool = True,
    desc: str = "training",
) -> History:
    """Train ``model`` for ``cfg.steps`` steps and return its :class:`History`.

    ``get_batch(step)`` returns a batch, ``loss_fn(model, batch)`` a scalar
    loss, ``eval_fn(model)`` (optional, called in eval mode without gradients)
    a held-out loss. A non-finite loss stops training with a ``FloatingPointError``.
    """
    from tqdm.auto import tqdm

    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=cfg.betas,
    )
    hist = History()
    bar = tqdm(range(cfg.steps), desc=desc, disable=not progress, mininterval=1.0)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        model.train()
        loss = loss_fn(model, get_batch(step))
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss became {loss.item()} at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        max_norm = cfg.grad_clip if cfg.grad_clip is not None else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        hist.steps.append(step)
        hist.train_loss.append(loss.item())
        hist.grad_norm.append(float(norm))
        if eval_fn is not None and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
            model.eval()
            with torch.no_grad():
                hist.eval_steps.append(step + 1)
                hist.eval_loss.append(float(eval_fn(model)))
            bar.set_postfix(train=f"{loss.item():.3f}", eval=f"{hist.eval_loss[-1]:.3f}")
    model.eval()
    return hist
