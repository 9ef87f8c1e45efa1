"""Diagnostics of deep residual stacks: gradient norms per layer (Chapter 5).

Shape legend: B batch, T length, D model size, V vocabulary, L number of layers.

The model of the depth experiments is :class:`StackLM`, a small causal
language model made of :class:`companion.blocks.TransformerBlock` s in either
placement of the norm. :func:`grad_profile` measures, at initialisation,

* the gradient norm of each block's parameters (all of them, and the second
  FFN matrix ``W2`` alone, the quantity Xiong et al. (2020) bound in their
  Theorem 1), and
* the gradient norm with respect to the residual stream between blocks,
  ``||dL/dx_l||``, which shows whether the gradient reaches the lower layers
  unchanged ("the identity path") or is rescaled on the way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ._checks import ShapeChecker, check_positive_int, check_token_ids
from .blocks import NormKind, TransformerBlock, make_norm
from .data import random_batch
from .training import TrainConfig, lm_loss, train  # lm_loss re-exported

__all__ = [
    "StackConfig",
    "StackLM",
    "lm_loss",
    "block_grad_norms",
    "GradProfile",
    "grad_profile",
    "warmup_run",
    "load_warmup_results",
]

Init = Literal["torch", "xavier"]


@dataclass(frozen=True)
class StackConfig:
    vocab_size: int  # V
    max_positions: int  # longest input T the position table holds
    n_layers: int = 6  # L
    d_model: int = 64  # D
    n_heads: int = 4  # H
    d_ff: int = 256  # F, hidden size of the FFN
    norm_first: bool = True  # pre-LN if True, post-LN if False
    norm: NormKind = "layernorm"  # "layernorm" or "rmsnorm"
    final_norm: bool | None = None  # norm after the last block; None = same as norm_first (GPT-2's ln_f)
    init: Init = "xavier"  # "xavier": N(0, 2/(fan_in+fan_out)) weights and zero biases; "torch": PyTorch defaults

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_positions", "n_layers", "d_model", "n_heads", "d_ff"):
            check_positive_int(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.init not in ("torch", "xavier"):
            raise ValueError(f"init must be 'torch' or 'xavier', got {self.init!r}")


class StackLM(nn.Module):
    """Token and learned position embeddings, ``n_layers`` causal blocks, optional final norm, a linear head.

    ``forward(idx, keep_hidden=True)`` keeps the residual stream
    ``x_0 (embeddings), x_1, ..., x_L`` in ``self.hidden`` with their
    gradients retained, for :func:`grad_profile`.
    """

    def __init__(self, cfg: StackConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_positions, cfg.d_model)
        self.blocks = nn.ModuleList(
            TransformerBlock(cfg.d_model, cfg.n_heads, cfg.d_ff, norm_first=cfg.norm_first, norm=cfg.norm)
            for _ in range(cfg.n_layers)
        )
        final = cfg.norm_first if cfg.final_norm is None else cfg.final_norm
        self.norm_f = make_norm(cfg.norm, cfg.d_model) if final else nn.Identity()
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size)
        self.hidden: list[torch.Tensor] = []
        if cfg.init == "xavier":
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    nn.init.xavier_normal_(m.weight)
                    nn.init.zeros_(m.bias)
                elif isinstance(m, nn.Embedding):
                    nn.init.normal_(m.weight, std=0.5 ** 0.5)  # token + position: unit variance, like a LN output

    def forward(self, idx: torch.Tensor, keep_hidden: bool = False) -> torch.Tensor:
        """``idx`` (B, T) token ids -> logits (B, T, V)."""
        check_token_ids("idx", idx, self.cfg.vocab_size)
        t = idx.shape[1]
        if t > self.cfg.max_positions:
            raise ValueError(f"idx has length T={t}, longer than max_positions={self.cfg.max_positions}")
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device))  # (B, T, D)
        self.hidden = []
        if keep_hidden:
            x.retain_grad()
            self.hidden.append(x)
        for block in self.blocks:
            x = block(x, is_causal=True)  # (B, T, D)
            if keep_hidden:
                x.retain_grad()
                self.hidden.append(x)
        return self.lm_head(self.norm_f(x))  # (B, T, V)


def block_grad_norms(model: StackLM, param: str | None = None) -> torch.Tensor:
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


def grad_profile(cfg: StackConfig, batch: tuple[torch.Tensor, torch.Tensor], seeds: int | tuple[int, ...] = 3) -> GradProfile:
    """Build :class:`StackLM` (cfg) once per seed, run one forward and backward on ``batch``, record the norms.

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
        model = StackLM(cfg)
        loss = lm_loss(lambda ids: model(ids, keep_hidden=True), (x, y))  # keeps the hidden states for their gradients
        loss.backward()
        block.append(block_grad_norms(model))
        w2.append(block_grad_norms(model, "ffn.down.weight"))
        stream.append(torch.stack([h.grad.norm() for h in model.hidden]))
        rms.append(torch.stack([h.detach().pow(2).mean().sqrt() for h in model.hidden]))
        losses.append(loss.detach())
    return GradProfile(torch.stack(block), torch.stack(w2), torch.stack(stream), torch.stack(rms), torch.stack(losses))


def warmup_run(
    cfg: StackConfig,
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
    """Train a fresh :class:`StackLM` with :func:`companion.training.train`; return its losses as plain lists.

    The model, the training batches and the (fixed) validation batches are all
    seeded by ``seed``, so two runs that differ only in ``warmup_steps`` see
    the same data in the same order. Returns ``{"train_loss", "eval_steps",
    "eval_loss", "diverged"}``; a run whose loss became NaN or infinite has
    ``diverged=True`` and empty losses.
    """
    torch.manual_seed(seed)
    model = StackLM(cfg)
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
