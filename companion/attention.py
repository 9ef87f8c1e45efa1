"""Scaled dot-product attention and multi-head attention (Chapter 2).

Shape legend: B batch, H heads, T query length, S key length, Dh head size,
Dv value size, D model size (``D = H * Dh``).

Masks follow ``companion.masks``: boolean, ``True`` = may attend, broadcastable
to ``(B, H, T, S)``. A query whose every key is masked gets an output of zeros
(not NaN), whichever backend computes it.

Reference: Vaswani et al. (2017), "Attention Is All You Need", eq. (1) and
section 3.2.2.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import ShapeChecker, check_positive_int, check_probability

__all__ = [
    "scaled_dot_product_attention",
    "split_heads",
    "merge_heads",
    "MultiHeadAttention",
]

Backend = Literal["manual", "sdpa"]


def _check_qkv_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> None:
    sc = ShapeChecker()
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if q.dim() < 2:
        raise ValueError(f"q must have shape (..., T, Dh) with at least 2 dimensions, got {tuple(q.shape)}")
    lead = tuple(f"L{i}" for i in range(q.dim() - 2))
    sc.check("q", q, (*lead, "T", "Dh"))
    sc.check("k", k, (*lead, "S", "Dh"))
    sc.check("v", v, (*lead, "S", "Dv"))
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a boolean tensor (True = may attend), got {got}")
    target = (*q.shape[:-1], k.shape[-2])
    try:
        full = torch.broadcast_shapes(mask.shape, target)
    except RuntimeError:
        full = None
    if full != torch.Size(target):
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to scores of shape {target}")


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    backend: Backend = "manual",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``softmax(q k^T * scale) v`` with a boolean mask (eq. 1 of Vaswani et al., 2017).

    Args:
        q: queries, shape ``(..., T, Dh)`` (usually ``(B, H, T, Dh)``).
        k: keys, shape ``(..., S, Dh)``.
        v: values, shape ``(..., S, Dv)``.
        mask: boolean, ``True`` = may attend, broadcastable to ``(..., T, S)``.
        scale: multiplies the scores; default ``1 / sqrt(Dh)``.
        dropout_p: dropout on the attention weights (only pass > 0 in training).
        return_weights: also return the weights ``(..., T, S)`` (manual backend only).
        backend: ``"manual"`` computes every step in PyTorch code you can read;
            ``"sdpa"`` calls ``torch.nn.functional.scaled_dot_product_attention``.

    Returns:
        ``out`` of shape ``(..., T, Dv)``, and the weights if ``return_weights``.
        Rows whose keys are all masked give zeros, not NaN.
    """
    _check_qkv_mask(q, k, v, mask)
    check_probability("dropout_p", dropout_p)
    if backend not in ("manual", "sdpa"):
        raise ValueError(f"backend must be 'manual' or 'sdpa', got {backend!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    # A query with no visible key: its output is defined as zeros.
    empty_rows = None if mask is None else ~mask.any(dim=-1, keepdim=True)  # (..., T, 1)

    if backend == "sdpa":
        if return_weights:
            raise ValueError("return_weights=True needs backend='manual': the fused kernel never forms the weights")
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
        # Recent PyTorch returns zeros for such rows, older releases NaN: make it explicit.
        return out if empty_rows is None else out.masked_fill(empty_rows, 0.0)

    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T, S)
    if mask is not None:
        # finfo.min, not -inf: a fully masked row then softmaxes to a finite uniform row
        # (zeroed below) instead of 0/0 = NaN; and unlike -1e9 it cannot overflow in fp16.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)  # (..., T, S)
    if empty_rows is not None:
        weights = weights.masked_fill(empty_rows, 0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    out = weights @ v  # (..., T, Dv)
    return (out, weights) if return_weights else out


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``(B, T, D) -> (B, H, T, D // H)``: head ``h`` takes features ``h*Dh`` to ``(h+1)*Dh - 1``."""
    check_positive_int("n_heads", n_heads)
    ShapeChecker().check("x", x, ("B", "T", "D"))
    b, t, d = x.shape
    if d % n_heads:
        raise ValueError(f"model size D={d} is not divisible by n_heads={n_heads}")
    return x.view(b, t, n_heads, d // n_heads).transpose(1, 2)  # (B, H, T, Dh)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(B, H, T, Dh) -> (B, T, H * Dh)``, the inverse of :func:`split_heads`."""
    ShapeChecker().check("x", x, ("B", "H", "T", "Dh"))
    b, h, t, dh = x.shape
    return x.transpose(1, 2).reshape(b, t, h * dh)  # (B, T, D)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al., 2017, section 3.2.2).

    Self-attention projects ``x`` to queries, keys and values with **one fused**
    linear layer ``qkv`` of shape ``(3D, D)``: rows ``[0, D)`` are ``W_Q``,
    ``[D, 2D)`` are ``W_K`` and ``[2D, 3D)`` are ``W_V``, the same layout as
    ``nn.MultiheadAttention.in_proj_weight``. Cross-attention (``cross=True``)
    projects queries from ``x`` with ``q`` and keys and values from the
    ``context`` with a fused ``kv`` layer.

    Args:
        d_model: model size D.
        n_heads: number of heads H; must divide D.
        bias: whether the projections have biases.
        dropout: dropout on the attention weights during training.
        cross: build a cross-attention layer (queries from x, keys/values from context).
        backend: default backend of :func:`scaled_dot_product_attention`.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        bias: bool = True,
        dropout: float = 0.0,
        cross: bool = False,
        backend: Backend = "sdpa",
    ) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("n_heads", n_heads)
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.dropout = check_probability("dropout", dropout)
        self.cross, self.backend = cross, backend
        if cross:
            self.q = nn.Linear(d_model, d_model, bias=bias)
            self.kv = nn.Linear(d_model, 2 * d_model, bias=bias)
        else:
            self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        context: torch.Tensor | None = None,
        return_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend from ``x`` (B, T, D) to itself, or to ``context`` (B, S, D) if ``cross``.

        Returns ``(B, T, D)``, and the weights ``(B, H, T, S)`` if ``return_weights``.
        """
        sc = ShapeChecker()
        sc.check("x", x, ("B", "T", self.d_model))
        if self.cross:
            if context is None:
                raise ValueError("a cross-attention layer needs a context tensor of shape (B, S, D)")
            sc.check("context", context, ("B", "S", self.d_model))
            q = self.q(x)  # (B, T, D)
            k, v = self.kv(context).split(self.d_model, dim=-1)  # 2 x (B, S, D)
        else:
            if context is not None:
                raise ValueError("a self-attention layer takes no context; build it with cross=True")
            q, k, v = self.qkv(x).split(self.d_model, dim=-1)  # 3 x (B, T, D)
        q, k, v = (split_heads(t, self.n_heads) for t in (q, k, v))  # (B, H, T|S, Dh)
        result = scaled_dot_product_attention(
            q, k, v, mask,
            dropout_p=self.dropout if self.training else 0.0,
            return_weights=return_weights,
            backend="manual" if return_weights else self.backend,
        )
        out, weights = result if return_weights else (result, None)
        out = self.out(merge_heads(out))  # (B, T, D)
        return (out, weights) if return_weights else out

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention) -> "MultiHeadAttention":
        """Build a self-attention layer holding the same weights as an ``nn.MultiheadAttention``."""
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"expected nn.MultiheadAttention, got {type(mha).__name__}")
        if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("only nn.MultiheadAttention with kdim = vdim = embed_dim and no bias_k/add_zero_attn is supported")
        layer = cls(mha.embed_dim, mha.num_heads, bias=mha.in_proj_bias is not None, dropout=mha.dropout)
        with torch.no_grad():
            layer.qkv.weight.copy_(mha.in_proj_weight)
            layer.out.weight.copy_(mha.out_proj.weight)
            if mha.in_proj_bias is not None:
                layer.qkv.bias.copy_(mha.in_proj_bias)
                layer.out.bias.copy_(mha.out_proj.bias)
        return layer
