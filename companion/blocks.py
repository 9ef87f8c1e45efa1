"""Building blocks around attention: normalisation, feed-forward, residual blocks.

Shape legend: B batch, T length, S context length, D model size, F hidden size of the FFN.
Defined in Chapter 4 (post-LN block, FFN) and Chapter 5 (pre-LN, RMSNorm,
the normalisations written out, the residual forms).

References: Ba et al. (2016) "Layer Normalization"; Zhang & Sennrich (2019)
"Root Mean Square Layer Normalization"; Xiong et al. (2020) "On Layer
Normalization in the Transformer Architecture".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import ShapeChecker, check_positive_int, check_probability
from .attention import MultiHeadAttention

__all__ = ["layer_norm", "rms_norm", "residual", "RMSNorm", "FeedForward", "TransformerBlock", "make_norm"]

Activation = Literal["relu", "gelu", "gelu_tanh"]
NormKind = Literal["layernorm", "rmsnorm"]


def _check_affine(name: str, p: torch.Tensor | None, d: int) -> None:
    if p is not None and (not isinstance(p, torch.Tensor) or tuple(p.shape) != (d,)):
        got = tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__
        raise ValueError(f"{name} must be a tensor of shape ({d},) to match x's last dimension, got {got}")


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, eps: float = 1e-5
) -> torch.Tensor:
    """LayerNorm over the last dimension, written out (Ba et al., 2016).

    ``y = (x - mu) / sqrt(sigma^2 + eps) * weight + bias`` with ``mu`` the mean and
    ``sigma^2`` the *biased* variance (divide by D, not D - 1) of the D features
    of each position. Same result as ``F.layer_norm(x, (D,), weight, bias, eps)``.
    """
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError(f"x must be a tensor of shape (..., D), got {getattr(x, 'shape', type(x).__name__)}")
    d = x.shape[-1]
    _check_affine("weight", weight, d)
    _check_affine("bias", bias, d)
    mu = x.mean(dim=-1, keepdim=True)  # (..., 1)
    var = (x - mu).pow(2).mean(dim=-1, keepdim=True)  # (..., 1), biased
    y = (x - mu) * torch.rsqrt(var + eps)  # (..., D)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension (Zhang & Sennrich, 2019): ``x / sqrt(mean(x^2) + eps) * weight``.

    No mean is subtracted and there is no bias. Same result as
    ``F.rms_norm(x, (D,), weight, eps)``.
    """
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError(f"x must be a tensor of shape (..., D), got {getattr(x, 'shape', type(x).__name__)}")
    _check_affine("weight", weight, x.shape[-1])
    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)  # (..., D)
    return y * weight if weight is not None else y


def residual(
    x: torch.Tensor,
    sublayer: Callable[[torch.Tensor], torch.Tensor],
    norm: Callable[[torch.Tensor], torch.Tensor],
    *,
    norm_first: bool,
) -> torch.Tensor:
    """One residual sublayer in either placement of the norm.

    * post-LN (``norm_first=False``, Vaswani et al. 2017, BERT, GPT-1):
      ``y = norm(x + sublayer(x))``; the residual path passes through the norm.
    * pre-LN (``norm_first=True``, GPT-2 and later):
      ``y = x + sublayer(norm(x))``; the residual path is the identity.
    """
    if not isinstance(norm_first, bool):
        raise TypeError(f"norm_first must be a bool, got {type(norm_first).__name__}")
    if norm_first:
        return x + sublayer(norm(x))  # pre-LN
    return norm(x + sublayer(x))  # post-LN


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
        return rms_norm(x, self.weight, self.eps)


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
        return residual(x, lambda h: self.drop(sublayer(h)), norm, norm_first=self.norm_first)

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

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> "TransformerBlock":
        """A block holding the same weights as a ``batch_first`` ``nn.TransformerEncoderLayer``.

        Mapping: ``self_attn`` -> ``self_attn`` (fused q, k, v), ``linear1`` ->
        ``ffn.up``, ``linear2`` -> ``ffn.down``, ``norm1``/``norm2`` -> ``norm1``/``norm2``;
        ``norm_first`` and the norm's eps are copied. Dropout is set to 0.
        """
        if not isinstance(layer, nn.TransformerEncoderLayer):
            raise TypeError(f"expected nn.TransformerEncoderLayer, got {type(layer).__name__}")
        if not layer.self_attn.batch_first:
            raise ValueError("only batch_first=True layers are supported: build it with batch_first=True")
        act = layer.activation
        if act is F.relu or isinstance(act, nn.ReLU):
            activation = "relu"
        elif act is F.gelu or isinstance(act, nn.GELU):
            activation = "gelu"
        else:
            raise ValueError(f"only relu and gelu activations are supported, got {act!r}")
        if not isinstance(layer.norm1, nn.LayerNorm):
            raise ValueError(f"only LayerNorm layers are supported, got {type(layer.norm1).__name__}")
        d_model, d_ff = layer.linear1.in_features, layer.linear1.out_features
        block = cls(
            d_model, layer.self_attn.num_heads, d_ff,
            norm_first=layer.norm_first, activation=activation, norm_eps=layer.norm1.eps,
        )
        with torch.no_grad():
            block.self_attn.load_state_dict(MultiHeadAttention.from_torch(layer.self_attn).state_dict())
            block.ffn.up.load_state_dict(layer.linear1.state_dict())
            block.ffn.down.load_state_dict(layer.linear2.state_dict())
            block.norm1.load_state_dict(layer.norm1.state_dict())
            block.norm2.load_state_dict(layer.norm2.state_dict())
        return block
