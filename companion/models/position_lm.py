"""A tiny causal character language model with a choice of positional scheme (Chapter 3).

Built for the length-extrapolation experiment: the same pre-LN decoder with
``position`` one of ``"none"`` (NoPE: only the causal mask tells order),
``"sinusoidal"``, ``"learned"`` (added to the embeddings), ``"rope"``
(queries and keys rotated), ``"t5"`` (learned bucketed bias, computed once
and shared by all layers, as in T5) or ``"alibi"`` (fixed linear bias).

The experiment itself (training, evaluation by length, the shipped results)
is :mod:`companion.experiments.extrapolation`.

Shape legend: B batch, T length, D model size, H heads, Dh head size, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from .._checks import check_token_ids
from ..attention import MultiHeadAttention, RotaryAttention
from ..blocks import Block, FeedForward, make_norm
from ..training import lm_loss  # re-exported: the one loss of every language model
from ..positional import (
    LearnedPositionalEmbedding,
    RelativePositionBias,
    alibi_bias,
    rope_cos_sin,
    sinusoidal_encoding,
)

__all__ = [
    "POSITION_SCHEMES",
    "PositionLMConfig",
    "PositionLM",
    "lm_loss",
]

PositionScheme = Literal["none", "sinusoidal", "learned", "rope", "t5", "alibi"]
POSITION_SCHEMES: tuple[str, ...] = ("none", "sinusoidal", "learned", "t5", "rope", "alibi")


@dataclass(frozen=True)
class PositionLMConfig:
    vocab_size: int  # V, characters of the corpus
    position: PositionScheme = "rope"  # how the model learns where tokens are
    d_model: int = 64  # D
    n_heads: int = 4  # H; d_head = D / H
    n_layers: int = 2  # decoder blocks
    d_ff: int = 256  # hidden size of the feed-forward network
    max_positions: int = 64  # rows of the learned table (only used by "learned")
    n_buckets: int = 32  # T5's defaults
    max_distance: int = 128
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        if self.position not in POSITION_SCHEMES:
            raise ValueError(f"position must be one of {POSITION_SCHEMES}, got {self.position!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(f"d_head={self.d_model // self.n_heads} must be even for RoPE and sinusoids")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


class _PositionBlock(Block):
    """The pre-LN block of :class:`PositionLM`."""

    def __init__(self, cfg: PositionLMConfig) -> None:
        norm1, norm2 = make_norm("layernorm", cfg.d_model), make_norm("layernorm", cfg.d_model)
        attn = (RotaryAttention if cfg.position == "rope" else MultiHeadAttention)(cfg.d_model, cfg.n_heads)
        ffn = FeedForward(cfg.d_model, cfg.d_ff, activation="gelu")
        super().__init__(attn, ffn, norm1, norm2, norm_first=True)


class PositionLM(nn.Module):
    """Token embedding, optional absolute positions, ``n_layers`` pre-LN blocks, final LN, LM head."""

    def __init__(self, cfg: PositionLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.position == "learned":
            self.pos_emb = LearnedPositionalEmbedding(cfg.max_positions, cfg.d_model)
        if cfg.position == "t5":
            self.rel_bias = RelativePositionBias(cfg.n_heads, bidirectional=False,
                                                 n_buckets=cfg.n_buckets, max_distance=cfg.max_distance)
            nn.init.zeros_(self.rel_bias.relative_attention_bias.weight)  # start as NoPE; unseen buckets stay 0
        self.blocks = nn.ModuleList(_PositionBlock(cfg) for _ in range(cfg.n_layers))
        self.norm_f = make_norm("layernorm", cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """``idx`` (B, T) token ids -> logits (B, T, V)."""
        check_token_ids("idx", idx, self.cfg.vocab_size)
        t, cfg, dev = idx.shape[1], self.cfg, idx.device
        x = self.tok_emb(idx)  # (B, T, D)
        if cfg.position == "sinusoidal":
            x = x + sinusoidal_encoding(t, cfg.d_model).to(dev)
        elif cfg.position == "learned":
            x = x + self.pos_emb(t)  # raises beyond max_positions
        attn_args = {}  # the same in every layer, computed once
        if cfg.position == "t5":
            attn_args["bias"] = self.rel_bias(t)  # (1, H, T, T), added to the scores
        elif cfg.position == "alibi":
            attn_args["bias"] = alibi_bias(cfg.n_heads, t, device=dev)[None]  # (1, H, T, T)
        elif cfg.position == "rope":
            attn_args["rope"] = rope_cos_sin(torch.arange(t, device=dev), cfg.d_head, base=cfg.rope_base)
        for block in self.blocks:
            x = block(x, is_causal=True, **attn_args)  # the attention adds the bias, then masks
        return self.lm_head(self.norm_f(x))  # (B, T, V)
