"""A small causal language model for the course's experiments (Chapters 3 and 5).

Token embedding, a choice of positional scheme, ``n_layers`` blocks of
:class:`companion.blocks.TransformerBlock`, an optional final norm and a
linear head. ``position`` is one of ``"none"`` (NoPE: only the causal mask
tells order), ``"sinusoidal"``, ``"learned"`` (both added to the embeddings),
``"rope"`` (queries and keys rotated), ``"t5"`` (learned bucketed bias,
computed once and shared by all layers, as in T5) or ``"alibi"`` (fixed
linear bias).

* Chapter 3's length-extrapolation experiment trains one per scheme
  (:mod:`companion.experiments.extrapolation`): pre-LN, GELU, PyTorch's
  initialisation, no bias in the head.
* Chapter 5's depth experiments (:mod:`companion.diagnostics`) use the
  defaults: learned positions, ReLU, Xavier initialisation, pre-LN or post-LN.

Shape legend: B batch, T length, D model size, H heads, Dh head size, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from .._checks import check_positive_int, check_token_ids
from ..attention import MultiHeadAttention, RotaryAttention
from ..blocks import Activation, NormKind, TransformerBlock, check_activation, make_norm
from ..positional import (
    LearnedPositionalEmbedding,
    RelativePositionBias,
    alibi_bias,
    rope_cos_sin,
    sinusoidal_encoding,
)

__all__ = ["POSITION_SCHEMES", "SmallLMConfig", "SmallLM"]

PositionScheme = Literal["none", "sinusoidal", "learned", "rope", "t5", "alibi"]
POSITION_SCHEMES: tuple[str, ...] = ("none", "sinusoidal", "learned", "t5", "rope", "alibi")


@dataclass(frozen=True)
class SmallLMConfig:
    vocab_size: int  # V
    max_positions: int = 64  # rows of the learned position table (only "learned" has a length limit)
    n_layers: int = 6  # L
    d_model: int = 64  # D
    n_heads: int = 4  # H; d_head = D / H
    d_ff: int = 256  # hidden size of the FFN
    position: PositionScheme = "learned"  # how the model learns where tokens are
    norm_first: bool = True  # pre-LN if True, post-LN if False
    norm: NormKind = "layernorm"  # "layernorm" or "rmsnorm"
    final_norm: bool | None = None  # norm after the last block; None = same as norm_first (GPT-2's ln_f)
    activation: Activation = "relu"  # of the FFN
    init: Literal["torch", "xavier"] = "xavier"  # "xavier": N(0, 2/(fan_in+fan_out)) weights, zero biases; "torch": PyTorch's
    head_bias: bool = True  # a bias in the LM head
    n_buckets: int = 32  # T5's bucket count and distance limit (only "t5")
    max_distance: int = 128
    rope_base: float = 10000.0  # only "rope"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_positions", "n_layers", "d_model", "n_heads", "d_ff"):
            check_positive_int(name, getattr(self, name))
        if self.position not in POSITION_SCHEMES:
            raise ValueError(f"position must be one of {POSITION_SCHEMES}, got {self.position!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.position in ("rope", "sinusoidal") and self.d_head % 2:
            raise ValueError(f"d_head={self.d_head} must be even for RoPE and sinusoids")
        if self.init not in ("torch", "xavier"):
            raise ValueError(f"init must be 'torch' or 'xavier', got {self.init!r}")
        check_activation(self.activation)

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


class SmallLM(nn.Module):
    """Token embedding, positions (``cfg.position``), ``n_layers`` causal blocks, optional final norm, LM head."""

    def __init__(self, cfg: SmallLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.position == "learned":
            self.pos_emb = LearnedPositionalEmbedding(cfg.max_positions, cfg.d_model)
        if cfg.position == "t5":
            self.rel_bias = RelativePositionBias(cfg.n_heads, bidirectional=False,
                                                 n_buckets=cfg.n_buckets, max_distance=cfg.max_distance)
        attention = RotaryAttention if cfg.position == "rope" else MultiHeadAttention
        self.blocks = nn.ModuleList(
            TransformerBlock(cfg.d_model, cfg.n_heads, cfg.d_ff, norm_first=cfg.norm_first, norm=cfg.norm,
                             activation=cfg.activation, attention=attention)
            for _ in range(cfg.n_layers)
        )
        final = cfg.norm_first if cfg.final_norm is None else cfg.final_norm
        self.norm_f = make_norm(cfg.norm, cfg.d_model) if final else nn.Identity()
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=cfg.head_bias)
        if cfg.init == "xavier":
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    nn.init.xavier_normal_(m.weight)
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)
                elif isinstance(m, (nn.Embedding, LearnedPositionalEmbedding)):
                    nn.init.normal_(m.weight, std=0.5 ** 0.5)  # token + position: unit variance, like a LN output
        if cfg.position == "t5":
            nn.init.zeros_(self.rel_bias.relative_attention_bias.weight)  # start as NoPE; unseen buckets stay 0

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
