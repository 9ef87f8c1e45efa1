"""Diagnostics of deep residual stacks: gradient norms per layer (Chapter 5).

Shape legend: B batch, T length, D model size, V vocabulary, L number of layers.

The model of the depth experiments is :class:`companion.models.small_lm.SmallLM`
(its default configuration: learned positions, ReLU, Xavier initialisation) in
either placement of the norm. :func:`grad_profile` measures, at initialisation,

* the gradient norm of each block's parameters (all of them, and the second
  FFN matrix ``W2`` alone, the quantity Xiong et al. (2020) bound in their
  Theorem 1), and
* the gradient norm with respect to the residual stream between blocks,
  ``||dL/dx_l||``, which shows whether the gradient reaches the lower layers
  unchanged ("the identity path") or is rescaled on the way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ._checks import ShapeChecker
from .data import random_batch
from .models.small_lm import SmallLM, SmallLMConfig
from .training import TrainConfig, lm_loss, train  # lm_loss re-exported

__all__ = [
    "lm_loss",
    "block_grad_norms",
    "GradProfile",
    "grad_profile",
    "warmup_run",
    "load_warmup_results",
]

def block_grad_norms(model: SmallLM, param: str | None = None) -> torch.Tensor:
    """Gradient norm of each block after ``backward()``: shape (L,).

    ``param=None`` takes all parameters of the block together (one global L2
    norm); ``param="ffn.down.weight"`` takes that one tensor (``W2`` of the FFN).
    """
    norms = []
    for i, block in enumerate(model.blocks):
        params = dict(block.named_parameters())
        if param is not None and param not in params:
            raise ValueError(f"block {i} has no parameter {param!r}; it has {sorted(params)}")
        chosen = [params[param]] if param is not None else list(params.values())
        if any(p.grad is None for p in chosen):
            raise ValueError("no gradient found: call loss.backward() first")
        norms.append(torch.sqrt(sum(p.grad.pow(2).sum() for p in chosen)))
    return torch.stack(norms).detach()


@dataclass(frozen=True)
class GradProfile:
    """Gradient norms at initialisation, one row per seed (seeds, L) or (seeds, L + 1)."""

    block: torch.Tensor  # (seeds, L) gradient norm of all parameters of block l
    w2: torch.Tensor  # (seeds, L) gradient norm of the FFN's W2 of block l
    stream: torch.Tensor  # (seeds, L + 1) ||dL/dx_l||, x_0 = embeddings, x_L = last block's output
    stream_rms: torch.Tensor  # (seeds, L + 1) RMS of the activations x_l (forward pass)
    loss: torch.Tensor  # (seeds,) loss at initialisation


def grad_profile(cfg: SmallLMConfig, batch: tuple[torch.Tensor, torch.Tensor], seeds: int | tuple[int, ...] = 3) -> GradProfile:
    """Build :class:`SmallLM` (cfg) once per seed, run one forward and backward on ``batch``, record the norms.

    Dropout is off (the blocks have none) so the measurement is deterministic
    for a given seed.
    """
    seed_list = tuple(range(seeds)) if isinstance(seeds, int) else tuple(seeds)
    if not seed_list:
        raise ValueError("seeds must name at least one seed")
    x, y = batch
    ShapeChecker().check("x", x, ("B", "T"))
    block, w2, stream, rms, losses = [], [], [], [], []
    for seed in seed_list:
        torch.manual_seed(seed)
        model = SmallLM(cfg)
        hidden = []  # the residual stream x_0 (block 0's input), x_1, ..., x_L (each block's output)

        def keep(h: torch.Tensor) -> None:
            h.retain_grad()  # so that backward() leaves dL/dx_l in h.grad
            hidden.append(h)

        model.blocks[0].register_forward_pre_hook(lambda module, args: keep(args[0]))
        for layer in model.blocks:
            layer.register_forward_hook(lambda module, args, out: keep(out))
        loss = lm_loss(model, (x, y))
        loss.backward()
        block.append(block_grad_norms(model))
        w2.append(block_grad_norms(model, "ffn.down.weight"))
        stream.append(torch.stack([h.grad.norm() for h in hidden]))
        rms.append(torch.stack([h.detach().pow(2).mean().sqrt() for h in hidden]))
        losses.append(loss.detach())
    return GradProfile(torch.stack(block), torch.stack(w2), torch.stack(stream), torch.stack(rms), torch.stack(losses))


def warmup_run(
    cfg: SmallLMConfig,
    train_ids: torch.Tensor,
    val_ids: torch.Tensor,
    *,
    steps: int,
    lr: float,
    warmup_steps: int,
    seed: int = 0,
    batch_size: int = 16,
    eval_every: int = 25,
    eval_batches: int = 2,
    progress: bool = True,
) -> dict[str, object]:
    """Train a fresh :class:`SmallLM` with :func:`companion.training.train`; return its losses as plain lists.

    The model, the training batches and the (fixed) validation batches are all
    seeded by ``seed``, so two runs that differ only in ``warmup_steps`` see
    the same data in the same order. Returns ``{"train_loss", "eval_steps",
    "eval_loss", "diverged"}``; a run whose loss became NaN or infinite has
    ``diverged=True`` and empty losses.
    """
    torch.manual_seed(seed)
    model = SmallLM(cfg)
    g_train = torch.Generator().manual_seed(seed)
    g_val = torch.Generator().manual_seed(10_000 + seed)
    t = cfg.max_positions
    val = [random_batch(val_ids, t, 2 * batch_size, g_val) for _ in range(eval_batches)]

    def eval_fn(m: nn.Module) -> float:
        return sum(lm_loss(m, b).item() for b in val) / len(val)

    tcfg = TrainConfig(steps=steps, lr=lr, warmup_steps=warmup_steps, eval_every=eval_every)
    kind = "pre-LN" if cfg.norm_first else "post-LN"
    try:
        hist = train(model, lm_loss, lambda step: random_batch(train_ids, t, batch_size, g_train), tcfg,
                     eval_fn=eval_fn, progress=progress, desc=f"{kind}, L={cfg.n_layers}, warm-up {warmup_steps}")
    except FloatingPointError:
        return {"train_loss": [], "eval_steps": [], "eval_loss": [], "diverged": True}
    return {"train_loss": hist.train_loss, "eval_steps": hist.eval_steps, "eval_loss": hist.eval_loss, "diverged": False}


WARMUP_CHECKPOINT = "ch05_warmup"


def load_warmup_results() -> dict[str, object]:
    """The results of ``scripts/ch05_warmup.py``, shipped as ``companion/checkpoints/ch05_warmup.pt``."""
    from .checkpoints import load_checkpoint

    return load_checkpoint(WARMUP_CHECKPOINT)
