"""Scaled dot-product attention and multi-head attention (Chapter 2).

Shape legend: B batch, H query heads, Hkv key/value heads, T query length,
S key length (cached + new), Dh head size, Dv value size, D model size (by
default ``D = H * Dh``).

Masks follow ``companion.masks``: boolean, ``True`` = may attend, broadcastable
to ``(B, H, T, S)``. A query whose every key is masked gets an output of zeros
(not NaN), whichever backend computes it.

The extension points every later model plugs into: an additive score
``bias`` (T5's relative bias, ALiBi), ``is_causal`` (bottom-right aligned),
``scale``, a head size independent of ``D``, fewer key/value heads (MQA/GQA),
a ``head_mask``, cross-attention, RoPE and a KV cache; and
:func:`record_attention` to read the weights of any model.

References: Vaswani et al. (2017), "Attention Is All You Need", eq. (1) and
section 3.2.2; Shazeer (2019) (multi-query); Ainslie et al. (2023) (grouped-query).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import ShapeChecker, check_positive_int, check_probability
from ._loading import copy_by_name_map
from .kv_cache import KVCache
from .masks import causal_mask
from .positional import apply_rope

__all__ = [
    "scaled_dot_product_attention",
    "split_heads",
    "merge_heads",
    "repeat_kv",
    "MultiHeadAttention",
    "record_attention",
]

Backend = Literal["manual", "sdpa"]


def _check_qkv_mask(q, k, v, mask, bias) -> None:
    sc = ShapeChecker()
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if mask is None and bias is None and q.dim() == k.dim() == v.dim() == 4:
        # The common case, (B, H, T, Dh) / (B, Hkv, S, Dh) / (B, Hkv, S, Dv), checked in a few comparisons
        # (every layer of every forward pass comes here); anything else takes the path with the messages.
        (b, h, _, dh), (bk, hk, s, dhk), (bv, hv, sv, _) = q.shape, k.shape, v.shape
        if b == bk == bv and hk == hv and s == sv and dh == dhk and h % hk == 0:
            return
    if q.dim() < 2:
        raise ValueError(f"q must have shape (..., T, Dh) with at least 2 dimensions, got {tuple(q.shape)}")
    lead = tuple(f"L{i}" for i in range(q.dim() - 3))
    if q.dim() == 2:
        sc.check("q", q, ("T", "Dh"))
        sc.check("k", k, ("S", "Dh"))
        sc.check("v", v, ("S", "Dv"))
    else:
        # Keys and values may have fewer heads than queries (MQA / GQA): Hkv must divide H.
        sc.check("q", q, (*lead, "H", "T", "Dh"))
        sc.check("k", k, (*lead, "Hkv", "S", "Dh"))
        sc.check("v", v, (*lead, "Hkv", "S", "Dv"))
        if q.shape[-3] % k.shape[-3]:
            raise ValueError(
                f"q has H={q.shape[-3]} heads and k, v have Hkv={k.shape[-3]}: H must be a multiple of Hkv "
                f"(grouped-query attention), expected q of shape (..., H, T, Dh) and k of shape (..., Hkv, S, Dh)"
            )
    target = (*q.shape[:-1], k.shape[-2])
    for name, m in (("mask", mask), ("bias", bias)):
        if m is None:
            continue
        if not isinstance(m, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(m).__name__}")
        if name == "mask" and m.dtype != torch.bool:
            raise TypeError(
                f"mask must be a boolean tensor (True = may attend), got {m.dtype}; "
                f"pass an additive float term as bias=..."
            )
        if name == "bias" and not m.dtype.is_floating_point:
            raise TypeError(f"bias must be a floating-point tensor added to the scores, got {m.dtype}")
        try:
            full = torch.broadcast_shapes(m.shape, target)
        except RuntimeError:
            full = None
        if full != torch.Size(target):
            raise ValueError(f"{name} of shape {tuple(m.shape)} does not broadcast to scores of shape {target}")


def _check_head_mask(head_mask: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor | None:
    """``head_mask`` ``(H,)`` or ``(B, H)`` -> a factor broadcastable to ``(B, H, T, Dv)``."""
    if head_mask is None:
        return None
    if q.dim() < 3:
        raise ValueError(f"head_mask needs q of shape (..., H, T, Dh), got {tuple(q.shape)}")
    h = q.shape[-3]
    if not isinstance(head_mask, torch.Tensor) or head_mask.dim() not in (1, 2) or head_mask.shape[-1] != h:
        got = tuple(head_mask.shape) if isinstance(head_mask, torch.Tensor) else type(head_mask).__name__
        raise ValueError(f"head_mask must have shape (H,) or (B, H) with H={h}, got {got}")
    return head_mask.to(q.dtype)[..., None, None]  # (H, 1, 1) or (B, H, 1, 1)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``(..., Hkv, S, Dh) -> (..., Hkv * n_rep, S, Dh)``: each key/value head serves ``n_rep`` query heads.

    Query head ``h`` reads key/value head ``h // n_rep`` (grouped-query attention,
    Ainslie et al., 2023; ``Hkv = 1`` is multi-query attention, Shazeer, 2019).
    """
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=-3)


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    bias: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    head_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    backend: Backend = "manual",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``softmax(q k^T * scale + bias) v`` with a boolean mask (eq. 1 of Vaswani et al., 2017).

    Args:
        q: queries, shape ``(..., H, T, Dh)`` (usually ``(B, H, T, Dh)``), or ``(T, Dh)``.
        k: keys, shape ``(..., Hkv, S, Dh)``; ``Hkv`` may divide ``H`` (grouped-query attention).
        v: values, shape ``(..., Hkv, S, Dv)``.
        mask: boolean, ``True`` = may attend, broadcastable to ``(..., H, T, S)``.
        bias: float, added to the scaled scores before the mask, broadcastable to
            ``(..., H, T, S)``: T5's relative bias, ALiBi, any additive term.
        is_causal: also apply the causal mask, aligned bottom-right (query ``i`` sees
            keys ``0 .. i + S - T``); the fast path then calls the kernel with
            ``is_causal=True`` when nothing else masks.
        scale: multiplies ``q k^T``; default ``1 / sqrt(Dh)`` (T5 uses 1).
        head_mask: ``(H,)`` or ``(B, H)`` factors on each head's weights (0 silences a head).
        dropout_p: dropout on the attention weights (only pass > 0 in training).
        return_weights: also return the weights ``(..., H, T, S)`` (manual backend only).
        backend: ``"manual"`` computes every step in PyTorch code you can read;
            ``"sdpa"`` calls ``torch.nn.functional.scaled_dot_product_attention``.

    Returns:
        ``out`` of shape ``(..., H, T, Dv)``, and the weights if ``return_weights``.
        Rows whose keys are all masked give zeros, not NaN.
    """
    _check_qkv_mask(q, k, v, mask, bias)
    check_probability("dropout_p", dropout_p)
    if backend not in ("manual", "sdpa"):
        raise ValueError(f"backend must be 'manual' or 'sdpa', got {backend!r}")
    factor = _check_head_mask(head_mask, q)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if q.dim() > 2:
        n_rep = q.shape[-3] // k.shape[-3]
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (..., H, S, Dh)
    t, s = q.shape[-2], k.shape[-2]
    plain_causal = False
    if is_causal and t > 1:  # one query (cached decoding) sees every key: nothing to mask
        # The fused kernel's own is_causal applies when nothing else masks: then no mask is built
        # and no row can be empty (the fast path of a GPT's training step).
        plain_causal = mask is None and bias is None and t == s and backend == "sdpa" and not return_weights
        if not plain_causal:
            causal = causal_mask(t, s, device=q.device)  # (T, S), bottom-right aligned
            mask = causal if mask is None else mask & causal
    # A query with no visible key: its output is defined as zeros.
    empty_rows = None if mask is None else ~mask.any(dim=-1, keepdim=True)  # (..., T, 1)

    if backend == "sdpa":
        if return_weights:
            raise ValueError("return_weights=True needs backend='manual': the fused kernel never forms the weights")
        if plain_causal:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale)
        else:
            attn_mask = mask
            if bias is not None:
                # One float mask: the bias where attending is allowed, finfo.min where not.
                min_value = torch.finfo(q.dtype).min
                attn_mask = bias.to(q.dtype).clamp(min=min_value)
                if mask is not None:
                    attn_mask = attn_mask.masked_fill(~mask, min_value)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)
        # Recent PyTorch returns zeros for such rows, older releases NaN: make it explicit.
        out = out if empty_rows is None else out.masked_fill(empty_rows, 0.0)
        return out if factor is None else out * factor

    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T, S)
    if bias is not None:
        # Clamp: finfo.min in the bias plus a negative score must not overflow to -inf.
        scores = (scores + bias).clamp(min=torch.finfo(scores.dtype).min)
    if mask is not None:
        # finfo.min, not -inf: a fully masked row then softmaxes to a finite uniform row
        # (zeroed below) instead of 0/0 = NaN; and unlike -1e9 it cannot overflow in fp16.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)  # (..., T, S)
    if empty_rows is not None:
        weights = weights.masked_fill(empty_rows, 0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    if factor is not None:
        weights = weights * factor  # (..., H, T, S): a silenced head contributes nothing
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
    """Multi-head attention (Vaswani et al., 2017, section 3.2.2), open for every model of the course.

    Self-attention projects ``x`` to queries, keys and values with **one fused**
    linear layer ``qkv`` of shape ``((H + 2 Hkv) Dh, D)``: rows ``[0, H Dh)`` are
    ``W_Q``, then ``W_K`` and ``W_V`` (with ``Hkv = H`` and ``Dh = D / H`` this is
    the layout of ``nn.MultiheadAttention.in_proj_weight``). Cross-attention
    (``cross=True``) projects queries from ``x`` with ``q`` and keys and values
    from the ``context`` with a fused ``kv`` layer. ``out`` maps ``H Dh`` back to ``D``.

    Args:
        d_model: model size D.
        n_heads: number of query heads H.
        d_head: per-head size Dh; default ``d_model // n_heads`` (then H must divide D).
        n_kv_heads: key/value heads Hkv (must divide H): ``H`` is multi-head,
            ``1`` multi-query, anything between grouped-query attention.
        scale: multiplies ``q k^T``; default ``1 / sqrt(Dh)`` (T5: 1.0).
        bias: whether the projections have biases.
        dropout: dropout on the attention weights during training.
        cross: build a cross-attention layer (queries from x, keys/values from context).
        d_context: size of the context vectors (cross-attention only); default D.
        layer_idx: this layer's slot in a :class:`~companion.kv_cache.KVCache`.
        backend: default backend of :func:`scaled_dot_product_attention`.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        d_head: int | None = None,
        n_kv_heads: int | None = None,
        scale: float | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        cross: bool = False,
        d_context: int | None = None,
        layer_idx: int = 0,
        backend: Backend = "sdpa",
    ) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("n_heads", n_heads)
        if d_head is None:
            if d_model % n_heads:
                raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}; pass d_head explicitly")
            d_head = d_model // n_heads
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        check_positive_int("d_head", d_head)
        check_positive_int("n_kv_heads", n_kv_heads)
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}")
        if d_context is not None and not cross:
            raise ValueError("d_context is only meaningful for cross-attention; build it with cross=True")
        if backend not in ("manual", "sdpa"):
            raise ValueError(f"backend must be 'manual' or 'sdpa', got {backend!r}")
        self.d_model, self.n_heads, self.d_head, self.n_kv_heads = d_model, n_heads, d_head, n_kv_heads
        self.d_context = d_model if d_context is None else check_positive_int("d_context", d_context)
        self.scale, self.layer_idx = scale, layer_idx
        self.dropout = check_probability("dropout", dropout)
        self.cross, self.backend = cross, backend
        self.recorded: list[torch.Tensor] | None = None  # set by record_attention()
        d_q, d_kv = n_heads * d_head, n_kv_heads * d_head
        if cross:
            self.q = nn.Linear(d_model, d_q, bias=bias)
            self.kv = nn.Linear(self.d_context, 2 * d_kv, bias=bias)
        else:
            self.qkv = nn.Linear(d_model, d_q + 2 * d_kv, bias=bias)
        self.out = nn.Linear(d_q, d_model, bias=bias)

    def project_kv(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of a cross-attention layer, each ``(B, Hkv, S, Dh)``."""
        k, v = self.kv(context).split(self.n_kv_heads * self.d_head, dim=-1)  # 2 x (B, S, Hkv Dh)
        return split_heads(k, self.n_kv_heads), split_heads(v, self.n_kv_heads)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        context: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        is_causal: bool = False,
        head_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        return_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend from ``x`` (B, T, D) to itself, or to ``context`` (B, S, Dc) if ``cross``.

        ``mask``, ``bias``, ``is_causal`` and ``head_mask`` go to
        :func:`scaled_dot_product_attention` (their last two axes are ``(T, S)``,
        with ``S`` counting cached keys). ``bias`` may also be a callable
        ``bias(q, k) -> tensor`` of the projected queries and keys, each
        ``(B, H, T, Dh)``, for a score term that depends on them (DeBERTa); it is added
        to the scaled scores like a tensor bias. ``rope`` is a ``(cos, sin)`` pair from
        :func:`companion.positional.rope_cos_sin` that rotates queries and keys.
        With a ``cache``, self-attention appends its new keys and values to slot
        ``layer_idx`` and attends over all of them; cross-attention computes the
        context's keys and values once and reuses them (``context`` may then be None).

        Returns ``(B, T, D)``, and the weights ``(B, H, T, S)`` if ``return_weights``.
        """
        sc = ShapeChecker()
        sc.check("x", x, ("B", "T", self.d_model))
        if self.cross:
            q = split_heads(self.q(x), self.n_heads)  # (B, H, T, Dh)
            if cache is not None and cache.has(self.layer_idx):
                k, v = cache.keys[self.layer_idx], cache.values[self.layer_idx]  # (B, Hkv, S, Dh)
            else:
                if context is None:
                    raise ValueError("a cross-attention layer needs a context tensor of shape (B, S, D)")
                sc.check("context", context, ("B", "S", self.d_context))
                k, v = self.project_kv(context)  # (B, Hkv, S, Dh)
                if cache is not None:
                    cache.append(self.layer_idx, k, v)
        else:
            if context is not None:
                raise ValueError("a self-attention layer takes no context; build it with cross=True")
            d_q, d_kv = self.n_heads * self.d_head, self.n_kv_heads * self.d_head
            q, k, v = self.qkv(x).split((d_q, d_kv, d_kv), dim=-1)  # (B, T, H Dh), 2 x (B, T, Hkv Dh)
            q, k, v = split_heads(q, self.n_heads), split_heads(k, self.n_kv_heads), split_heads(v, self.n_kv_heads)
            if rope is not None:
                q, k = apply_rope(q, *rope), apply_rope(k, *rope)
            if cache is not None:
                k, v = cache.append(self.layer_idx, k, v)  # (B, Hkv, S, Dh): cached + new
        if callable(bias):  # a bias that depends on the projected queries and keys (DeBERTa's position terms)
            bias = bias(q, k)
        kwargs = dict(bias=bias, is_causal=is_causal, scale=self.scale, head_mask=head_mask,
                      dropout_p=self.dropout if self.training else 0.0)
        result = scaled_dot_product_attention(
            q, k, v, mask, **kwargs, return_weights=return_weights, backend="manual" if return_weights else self.backend,
        )
        out, weights = result if return_weights else (result, None)
        if self.recorded is not None:  # inside record_attention(): keep the weights, leave the output untouched
            if weights is None:
                weights = scaled_dot_product_attention(q, k, v, mask, **kwargs, return_weights=True, backend="manual")[1]
            self.recorded.append(weights.detach())  # (B, H, T, S)
        out = self.out(merge_heads(out))  # (B, T, D)
        return (out, weights) if return_weights else out

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention, *, cross: bool = False) -> "MultiHeadAttention":
        """A layer holding the same weights as an ``nn.MultiheadAttention``.

        ``in_proj_weight`` rows ``[0, D)`` are ``W_Q``, ``[D, 2D)`` ``W_K``, ``[2D, 3D)``
        ``W_V``: the fused ``qkv`` layout, or split into ``q`` and ``kv`` with ``cross=True``.
        """
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"expected nn.MultiheadAttention, got {type(mha).__name__}")
        if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("only nn.MultiheadAttention with kdim = vdim = embed_dim and no bias_k/add_zero_attn is supported")
        d, has_bias = mha.embed_dim, mha.in_proj_bias is not None
        layer = cls(d, mha.num_heads, bias=has_bias, dropout=mha.dropout, cross=cross)
        source = dict(mha.state_dict())
        names = {"out.weight": "out_proj.weight"}
        if cross:  # the query rows and the key/value rows become two layers
            source.update({"q_rows.weight": mha.in_proj_weight[:d], "kv_rows.weight": mha.in_proj_weight[d:]})
            names.update({"q.weight": "q_rows.weight", "kv.weight": "kv_rows.weight"})
        else:
            names["qkv.weight"] = "in_proj_weight"
        if has_bias:
            names["out.bias"] = "out_proj.bias"
            if cross:
                source.update({"q_rows.bias": mha.in_proj_bias[:d], "kv_rows.bias": mha.in_proj_bias[d:]})
                names.update({"q.bias": "q_rows.bias", "kv.bias": "kv_rows.bias"})
            else:
                names["qkv.bias"] = "in_proj_bias"
        copy_by_name_map(layer, source, names, ignore=[r"^in_proj_(weight|bias)$"] if cross else [])
        return layer


@contextmanager
def record_attention(model: nn.Module, *, cross: bool | None = None) -> Iterator[dict[str, list[torch.Tensor]]]:
    """Record the attention weights of every :class:`MultiHeadAttention` inside ``model``.

    ``with record_attention(model) as weights: model(...)`` fills ``weights``,
    a dict from each attention layer's name in ``model`` (for example
    ``"blocks.0.self_attn"``) to the list of its weights ``(B, H, T, S)``, one
    per call. The forward pass computes exactly what it computes without
    recording; the weights are formed beside it with the manual backend.
    ``cross=True`` records only cross-attention layers, ``cross=False`` only
    self-attention, ``None`` both. The one way the course records attention.
    """
    layers = {name: m for name, m in model.named_modules() if isinstance(m, MultiHeadAttention)
              and (cross is None or m.cross == cross)}
    if isinstance(model, MultiHeadAttention) and "" in layers:
        layers = {"": model}
    records: dict[str, list[torch.Tensor]] = {name: [] for name in layers}
    for name, m in layers.items():
        m.recorded = records[name]
    try:
        yield records
    finally:
        for m in layers.values():
            m.recorded = None
