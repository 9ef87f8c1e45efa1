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

from ._checks import check_positive_int, check_probability
from ._loading import copy_by_name_map
from .attention import CrossAttention, MultiHeadAttention

__all__ = [
    "layer_norm", "rms_norm", "residual", "RMSNorm", "make_norm", "ACTIVATIONS", "check_activation",
    "FeedForward", "GatedFeedForward", "Block", "DecoderBlock", "TransformerBlock", "TransformerDecoderBlock",
]

Activation = Literal["relu", "gelu", "gelu_tanh", "silu"]
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


def make_norm(kind: NormKind, d_model: int, eps: float = 1e-5, bias: bool | None = None) -> nn.Module:
    """``"layernorm"`` -> ``nn.LayerNorm``; ``"rmsnorm"`` -> :class:`RMSNorm`.

    ``bias`` switches LayerNorm's additive bias (default: on; GPT-2 without
    biases, T5 and LLaMA-style models have none). RMSNorm never has one.
    """
    check_positive_int("d_model", d_model)
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps!r}")
    if kind == "layernorm":
        return nn.LayerNorm(d_model, eps=eps, bias=True if bias is None else bias)
    if kind == "rmsnorm":
        if bias:
            raise ValueError("RMSNorm has no bias: call make_norm('rmsnorm', d, eps, bias=False)")
        return RMSNorm(d_model, eps=eps)
    raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {kind!r}")


ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's approximation
    "silu": F.silu,  # Swish with beta = 1; in a gated FFN: SwiGLU
}


def check_activation(activation: str) -> str:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    return activation


class FeedForward(nn.Module):
    """Position-wise feed-forward network: ``W2 act(W1 x + b1) + b2`` (Vaswani et al., eq. 2).

    The original Transformer uses ReLU and ``d_ff = 4 * d_model`` (2048 for 512).
    """

    def __init__(self, d_model: int, d_ff: int, *, activation: Activation = "relu", dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        self.activation = check_activation(activation)
        self.up = nn.Linear(check_positive_int("d_model", d_model), check_positive_int("d_ff", d_ff), bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.drop = nn.Dropout(check_probability("dropout", dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.drop(ACTIVATIONS[self.activation](self.up(x))))  # (B, T, D)


class GatedFeedForward(nn.Module):
    """Gated feed-forward network: ``W_down (act(W_gate x) * W_up x)`` (Shazeer, 2020, "GLU Variants").

    ``activation="gelu_tanh"`` is T5 v1.1's gated GELU (GEGLU), ``"silu"`` is
    SwiGLU (PaLM, LLaMA). Three matrices instead of two: at equal parameter
    count ``d_ff`` is usually ``2/3`` of the plain FFN's.
    """

    def __init__(self, d_model: int, d_ff: int, *, activation: Activation = "gelu_tanh", dropout: float = 0.0, bias: bool = False) -> None:
        super().__init__()
        self.activation = check_activation(activation)
        self.gate = nn.Linear(check_positive_int("d_model", d_model), check_positive_int("d_ff", d_ff), bias=bias)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.drop = nn.Dropout(check_probability("dropout", dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = ACTIVATIONS[self.activation](self.gate(x)) * self.up(x)  # (B, T, F)
        return self.down(self.drop(h))  # (B, T, D)


class Block(nn.Module):
    """One Transformer layer assembled from the parts it is given: self-attention, FFN and norms.

    Each sublayer sits in a residual connection: pre-LN ``x + drop(sublayer(norm(x)))``
    or post-LN ``norm(x + drop(sublayer(x)))`` (see :func:`residual`).

    Any module called as ``self_attn(x, mask, **attn_args)`` serves as attention
    (:class:`~companion.attention.MultiHeadAttention` and its subclasses), any
    ``(B, T, D) -> (B, T, D)`` module as FFN (:class:`FeedForward`,
    :class:`GatedFeedForward`, a mixture of experts), any norm (:func:`make_norm`)
    or ``nn.Identity`` as a norm. :class:`DecoderBlock` adds cross-attention.

    Args:
        self_attn: self-attention module.
        ffn: feed-forward module.
        norm1, norm2: norms of the attention and FFN sublayers.
        norm_first: pre-LN if True, post-LN if False.
        dropout: on each sublayer's output.
    """

    def __init__(self, self_attn: nn.Module, ffn: nn.Module, norm1: nn.Module, norm2: nn.Module, *,
                 norm_first: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self._register(norm_first, dropout, norm1=norm1, self_attn=self_attn, norm2=norm2, ffn=ffn)

    def _register(self, norm_first: bool, dropout: float, **parts: nn.Module) -> None:
        """Check the parts and register them in the order the forward pass uses them."""
        if not isinstance(norm_first, bool):
            raise TypeError(f"norm_first must be a bool, got {type(norm_first).__name__}")
        for name, m in parts.items():
            if not isinstance(m, nn.Module):
                raise TypeError(f"{name} must be an nn.Module, got {type(m).__name__}")
            setattr(self, name, m)
        self.norm_first = norm_first
        self.drop = nn.Dropout(check_probability("dropout", dropout))

    def sublayer(self, x: torch.Tensor, norm: nn.Module, layer: nn.Module, *args, **kwargs) -> torch.Tensor:
        """``x + drop(layer(norm(x), ...))`` (pre-LN) or ``norm(x + drop(layer(x, ...)))`` (post-LN)."""
        if self.norm_first:
            return x + self.drop(layer(norm(x), *args, **kwargs))
        return norm(x + self.drop(layer(x, *args, **kwargs)))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, **attn_args) -> torch.Tensor:
        """``x`` (B, T, D) -> (B, T, D); ``mask`` and ``attn_args`` (``is_causal``, ``cache``, and
        what other models add: ``bias``, ``rope``, ``head_mask``) go to the self-attention."""
        if self.norm_first:  # pre-LN: x + sublayer(norm(x))
            x = x + self.drop(self.self_attn(self.norm1(x), mask, **attn_args))
            return x + self.drop(self.ffn(self.norm2(x)))  # (B, T, D)
        x = self.norm1(x + self.drop(self.self_attn(x, mask, **attn_args)))  # post-LN: norm(x + sublayer(x))
        return self.norm2(x + self.drop(self.ffn(x)))  # (B, T, D)


class DecoderBlock(Block):
    """A :class:`Block` with cross-attention between its self-attention and its FFN (an encoder-decoder's decoder layer).

    Order: self-attention, cross-attention to the ``context`` (the encoder's
    output), FFN, each in its residual connection.
    """

    def __init__(self, self_attn: nn.Module, cross_attn: nn.Module, ffn: nn.Module, norm1: nn.Module,
                 norm_cross: nn.Module, norm2: nn.Module, *, norm_first: bool = True, dropout: float = 0.0) -> None:
        nn.Module.__init__(self)  # Block's parts and the cross-attention, registered in the order they run
        self._register(norm_first, dropout, norm1=norm1, self_attn=self_attn, norm_cross=norm_cross,
                       cross_attn=cross_attn, norm2=norm2, ffn=ffn)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None, mask: torch.Tensor | None = None,
                context_mask: torch.Tensor | None = None, *, cache=None, **attn_args) -> torch.Tensor:
        """``x`` (B, T, D) and ``context`` (B, S, Dc) -> (B, T, D).

        ``mask`` and ``attn_args`` go to the self-attention, ``context_mask`` to the
        cross-attention. ``cache`` is an :class:`~companion.kv_cache.EncoderDecoderCache`:
        its ``self_attn`` part grows, its ``cross_attn`` part holds the context's keys
        and values (``context`` may then be None).
        """
        self_cache = None if cache is None else cache.self_attn
        cross_cache = None if cache is None else cache.cross_attn
        x = self.sublayer(x, self.norm1, self.self_attn, mask, cache=self_cache, **attn_args)
        x = self.sublayer(x, self.norm_cross, self.cross_attn, context, context_mask, cache=cross_cache)
        return self.sublayer(x, self.norm2, self.ffn)  # (B, T, D)


def _sized_parts(d_model, n_heads, d_ff, cross, *, dropout, activation, norm, norm_eps, bias, gated, d_head,
                 n_kv_heads, layer_idx, attention=MultiHeadAttention) -> dict[str, nn.Module]:
    norm_bias = bias if norm == "layernorm" else None
    attn_kw = dict(d_head=d_head, n_kv_heads=n_kv_heads, bias=bias, dropout=dropout, layer_idx=layer_idx)
    # Creation order (self-attention, its norm, cross-attention, its norm, FFN, norm)
    # fixes the random initial weights of a seeded model: keep it.
    parts = dict(self_attn=attention(d_model, n_heads, **attn_kw), norm1=make_norm(norm, d_model, norm_eps, norm_bias))
    if cross:
        parts.update(cross_attn=CrossAttention(d_model, n_heads, **attn_kw),
                     norm_cross=make_norm(norm, d_model, norm_eps, norm_bias))
    ffn_cls = GatedFeedForward if gated else FeedForward
    parts.update(ffn=ffn_cls(d_model, d_ff, activation=activation, dropout=0.0, bias=bias),
                 norm2=make_norm(norm, d_model, norm_eps, norm_bias))
    return parts


class TransformerBlock(Block):
    """A :class:`Block` built from sizes: multi-head self-attention, FFN, norms (an encoder layer).

    ``norm_first=False`` is the original **post-LN** layer,
    ``x = norm(x + sublayer(x))``; ``norm_first=True`` is **pre-LN**,
    ``x = x + sublayer(norm(x))`` (GPT-2 and most later models).
    :class:`TransformerDecoderBlock` is the same with cross-attention.

    Args:
        d_model, n_heads, d_ff: sizes D, H and F.
        norm_first: pre-LN if True, post-LN if False.
        dropout: dropout on each sublayer's output and on the attention weights.
        activation: FFN activation.
        norm: ``"layernorm"`` or ``"rmsnorm"``.
        norm_eps: epsilon of every norm.
        bias: biases in the projections and in LayerNorms.
        gated: a :class:`GatedFeedForward` instead of :class:`FeedForward`.
        d_head, n_kv_heads: passed to :class:`~companion.attention.MultiHeadAttention`.
        layer_idx: this layer's slot in a KV cache.
        attention: the self-attention class (:class:`~companion.attention.RotaryAttention` for RoPE).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, norm_first: bool = True, dropout: float = 0.0,
                 activation: Activation = "relu", norm: NormKind = "layernorm", norm_eps: float = 1e-5,
                 bias: bool = True, gated: bool = False, d_head: int | None = None, n_kv_heads: int | None = None,
                 layer_idx: int = 0, attention: type[MultiHeadAttention] = MultiHeadAttention) -> None:
        p = _sized_parts(d_model, n_heads, d_ff, False, dropout=dropout, activation=activation, norm=norm,
                         norm_eps=norm_eps, bias=bias, gated=gated, d_head=d_head, n_kv_heads=n_kv_heads,
                         layer_idx=layer_idx, attention=attention)
        super().__init__(p["self_attn"], p["ffn"], p["norm1"], p["norm2"], norm_first=norm_first, dropout=dropout)

    @staticmethod
    def from_torch(layer: nn.TransformerEncoderLayer | nn.TransformerDecoderLayer) -> TransformerBlock | TransformerDecoderBlock:
        """A block holding the same weights as a ``batch_first`` ``nn.TransformerEncoderLayer``
        (a :class:`TransformerBlock`) or ``nn.TransformerDecoderLayer`` (a :class:`TransformerDecoderBlock`).

        Mapping: ``self_attn`` -> ``self_attn`` (fused q, k, v), ``multihead_attn`` ->
        ``cross_attn`` (decoder), ``linear1`` -> ``ffn.up``, ``linear2`` -> ``ffn.down``;
        norms in order of their sublayers: torch's ``norm1, norm2`` (encoder) or
        ``norm1, norm2, norm3`` (decoder) -> ``norm1, [norm_cross,] norm2``.
        ``norm_first`` and the norm's eps are copied. Dropout is set to 0.
        """
        if not isinstance(layer, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
            raise TypeError(f"expected nn.TransformerEncoderLayer or nn.TransformerDecoderLayer, got {type(layer).__name__}")
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
        decoder = isinstance(layer, nn.TransformerDecoderLayer)
        d_model, d_ff = layer.linear1.in_features, layer.linear1.out_features
        block = (TransformerDecoderBlock if decoder else TransformerBlock)(
            d_model, layer.self_attn.num_heads, d_ff,
            norm_first=layer.norm_first, activation=activation, norm_eps=layer.norm1.eps,
        )
        # Source: torch's own tensors, plus its attention layers converted to ours (under our names).
        source = dict(layer.state_dict())
        attn = {"self_attn": MultiHeadAttention.from_torch(layer.self_attn)}
        if decoder:
            attn["cross_attn"] = MultiHeadAttention.from_torch(layer.multihead_attn, cross=True)
        for prefix, module in attn.items():
            source.update({f"ours.{prefix}.{k}": v for k, v in module.state_dict().items()})
        names = {n: f"ours.{n}" for n in block.state_dict() if n.split(".")[0] in attn}
        torch_norms = ("norm1", "norm2", "norm3") if decoder else ("norm1", "norm2")
        our_norms = ("norm1", "norm_cross", "norm2") if decoder else ("norm1", "norm2")
        for ours, theirs in [("ffn.up", "linear1"), ("ffn.down", "linear2"), *zip(our_norms, torch_norms)]:
            names.update({f"{ours}.weight": f"{theirs}.weight", f"{ours}.bias": f"{theirs}.bias"})
        copy_by_name_map(block, source, names, ignore=[r"^(self_attn|multihead_attn)\."])
        return block


class TransformerDecoderBlock(DecoderBlock):
    """A :class:`DecoderBlock` built from sizes: self-attention, cross-attention, FFN, norms.

    Arguments as :class:`TransformerBlock`; the cross-attention is a
    :class:`~companion.attention.CrossAttention` with the same sizes.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, norm_first: bool = True, dropout: float = 0.0,
                 activation: Activation = "relu", norm: NormKind = "layernorm", norm_eps: float = 1e-5,
                 bias: bool = True, gated: bool = False, d_head: int | None = None, n_kv_heads: int | None = None,
                 layer_idx: int = 0) -> None:
        p = _sized_parts(d_model, n_heads, d_ff, True, dropout=dropout, activation=activation, norm=norm,
                         norm_eps=norm_eps, bias=bias, gated=gated, d_head=d_head, n_kv_heads=n_kv_heads,
                         layer_idx=layer_idx)
        super().__init__(p["self_attn"], p["cross_attn"], p["ffn"], p["norm1"], p["norm_cross"], p["norm2"],
                         norm_first=norm_first, dropout=dropout)

    from_torch = TransformerBlock.from_torch
