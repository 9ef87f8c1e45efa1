"""Building blocks around attention: normalisation, feed-forward, residual blocks.

Shape legend: B batch, T length, S context length, D model size, F hidden size of the FFN.
Defined in Chapter 4 (post-LN block, FFN) and Chapter 5 (pre-LN, RMSNorm).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import ShapeChecker, check_positive_int, check_probability
from .attention import MultiHeadAttention

__all__ = ["RMSNorm", "FeedForward", "TransformerBlock", "make_norm"]

Activation = Literal["relu", "gelu", "gelu_tanh"]
NormKind = Literal["layernorm", "rmsnorm"]


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich, 2019): ``x / sqrt(mean(x^2) + eps) * weight``.

    Unlike LayerNorm it neither subtracts the mean nor adds a bias. Same
    computation as ``torch.nn.RMSNorm(d, eps=eps)``.
    """

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(check_positive_int("d_model", d_model)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.weight.shape[0]:
            raise ValueError(f"x must have last dimension {self.weight.shape[0]}, got shape {tuple(x.shape)}")
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


def make_norm(kind: NormKind, d_model: int, eps: float = 1e-5) -> nn.Module:
    """``"layernorm"`` -> ``nn.LayerNorm``; ``"rmsnorm"`` -> :class:`RMSNorm`."""
    if kind == "layernorm":
        return nn.LayerNorm(d_model, eps=eps)
    if kind == "rmsnorm":
        return RMSNorm(d_model, eps=eps)
    raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {kind!r}")


_ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's approximation
}


class FeedForward(nn.Module):
    """Position-wise feed-forward network: ``W2 act(W1 x + b1) + b2`` (Vaswani et al., eq. 2).

    The original Transformer uses ReLU and ``d_ff = 4 * d_model`` (2048 for 512).
    """

    def __init__(self, d_model: int, d_ff: int, *, activation: Activation = "relu", dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
        self.activation = activation
        self.up = nn.Linear(check_positive_int("d_model", d_model), check_positive_int("d_ff", d_ff), bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.drop = nn.Dropout(check_probability("dropout", dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.drop(_ACTIVATIONS[self.activation](self.up(x))))  # (B, T, D)


class TransformerBlock(nn.Module):
    """One Transformer layer: self-attention, optional cross-attention, FFN, each with a residual.

    ``norm_first=False`` is the original **post-LN** layer,
    ``x = norm(x + sublayer(x))``; ``norm_first=True`` is **pre-LN**,
    ``x = x + sublayer(norm(x))`` (GPT-2 and most later models).

    Args:
        d_model, n_heads, d_ff: sizes D, H and F.
        norm_first: pre-LN if True, post-LN if False.
        cross: add a cross-attention sublayer (a decoder layer of an encoder-decoder).
        dropout: dropout on each sublayer's output and on the attention weights.
        activation: FFN activation.
        norm: ``"layernorm"`` or ``"rmsnorm"``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        *,
        norm_first: bool = True,
        cross: bool = False,
        dropout: float = 0.0,
        activation: Activation = "relu",
        norm: NormKind = "layernorm",
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.d_model, self.norm_first, self.cross = d_model, norm_first, cross
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.norm1 = make_norm(norm, d_model, norm_eps)
        if cross:
            self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout, cross=True)
            self.norm_cross = make_norm(norm, d_model, norm_eps)
        self.ffn = FeedForward(d_model, d_ff, activation=activation, dropout=0.0)
        self.norm2 = make_norm(norm, d_model, norm_eps)
        self.drop = nn.Dropout(check_probability("dropout", dropout))

    def _residual(self, x: torch.Tensor, norm: nn.Module, sublayer) -> torch.Tensor:
        if self.norm_first:
            return x + self.drop(sublayer(norm(x)))  # pre-LN
        return norm(x + self.drop(sublayer(x)))  # post-LN

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` (B, T, D); ``mask`` for self-attention; ``context`` (B, S, D) and ``context_mask`` for cross-attention."""
        ShapeChecker().check("x", x, ("B", "T", self.d_model))
        x = self._residual(x, self.norm1, lambda h: self.self_attn(h, mask=mask))
        if self.cross:
            if context is None:
                raise ValueError("this block has cross-attention: pass context of shape (B, S, D)")
            x = self._residual(x, self.norm_cross, lambda h: self.cross_attn(h, context_mask, context=context))
        elif context is not None:
            raise ValueError("this block has no cross-attention; build it with cross=True to pass a context")
        return self._residual(x, self.norm2, self.ffn)  # (B, T, D)
