"""Scaled dot-product attention and multi-head attention (Chapter 2).

Shape legend: B batch, H query heads, Hkv key/value heads, T query length,
S key length (cached + new), Dh head size, Dv value size, D model size (by
default ``D = H * Dh``).

Masks follow ``companion.masks``: boolean, ``True`` = may attend, broadcastable
to ``(B, H, T, S)``. A query whose every key is masked gets an output of zeros
(not NaN), whichever backend computes it.

Layout: :func:`scaled_dot_product_attention` is the public function; it checks
its arguments once and calls the private kernel ``_attend``, which checks
nothing. The layers, :class:`MultiHeadAttention` (self-attention),
:class:`RotaryAttention` (the same with RoPE) and :class:`CrossAttention`
(queries from one sequence, keys and values from another), call the kernel
directly: their inputs were checked by the model that calls them.
:func:`record_attention` reads the weights of any model.

The extension points every later model plugs into: an additive score
``bias`` (T5's relative bias, ALiBi) and a ``head_mask``, passed through the
layers to the kernel; ``is_causal`` (bottom-right aligned), ``scale``, a head
size independent of ``D``, fewer key/value heads (MQA/GQA), RoPE (a subclass)
and a KV cache.

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
from .positional import apply_rope

__all__ = [
    "scaled_dot_product_attention",
    "split_heads",
    "merge_heads",
    "repeat_kv",
    "MultiHeadAttention",
    "RotaryAttention",
    "CrossAttention",
    "record_attention",
]

Backend = Literal["manual", "sdpa"]


# --------------------------------------------------------------------------- the kernel (checks nothing)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``(..., Hkv, S, Dh) -> (..., Hkv * n_rep, S, Dh)``: each key/value head serves ``n_rep`` query heads.

    Query head ``h`` reads key/value head ``h // n_rep`` (grouped-query attention,
    Ainslie et al., 2023; ``Hkv = 1`` is multi-query attention, Shazeer, 2019).
    """
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=-3)


def _prepare(q, k, v, mask, is_causal, can_fuse=False):
    """Shared by both backends: repeat grouped key/value heads, fold ``is_causal`` into the mask when needed.

    Returns ``k, v, mask, fused_causal, empty_rows``: ``fused_causal`` says the fused
    kernel may apply its own causal rule (``can_fuse``: no bias; no other mask, as many
    keys as queries); otherwise the causal rule is in the returned mask.
    """
    if q.dim() > 2 and q.shape[-3] != k.shape[-3]:
        n_rep = q.shape[-3] // k.shape[-3]
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (..., H, S, Dh)
    t, s = q.shape[-2], k.shape[-2]
    # A query with no visible key gets zeros; only a caller's mask can empty a row.
    empty_rows = None if mask is None else ~mask.any(dim=-1, keepdim=True)  # (..., T, 1)
    fused_causal = False
    if is_causal and t > 1:  # one query (cached decoding) sees every key: nothing to mask
        if can_fuse and mask is None and t == s:
            fused_causal = True
        else:
            causal = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(diagonal=s - t)  # (T, S), bottom-right
            mask = causal if mask is None else mask & causal
            empty_rows = ~mask.any(dim=-1, keepdim=True)
    return k, v, mask, fused_causal, empty_rows


def _weights(q, k, v, mask=None, *, bias=None, is_causal=False, scale=None, head_mask=None, dropout_p=0.0):
    """The manual computation, every step written out: ``(out, weights)``."""
    k, v, mask, _, empty_rows = _prepare(q, k, v, mask, is_causal)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T, S)
    if bias is not None:
        # Clamp: finfo.min in the bias plus a negative score must not overflow to -inf.
        scores = (scores + bias).clamp(min=torch.finfo(scores.dtype).min)
    if mask is not None:
        # finfo.min, not -inf: a fully masked row then softmaxes to a finite uniform row
        # (zeroed below) instead of 0/0 = NaN; and unlike -1e9 it cannot overflow in fp16.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)  # (..., T, S)
    if empty_rows is not None and empty_rows.any():
        # Only when a row is empty: masked_fill makes a copy (softmax's backward needs its output,
        # so it cannot be in place), a third (T, S) tensor while `scores` is still alive.
        weights = weights.masked_fill(empty_rows, 0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    if head_mask is not None:
        weights = weights * head_mask.to(q.dtype)[..., None, None]  # (H|B H, 1, 1): a silenced head contributes nothing
    return weights @ v, weights  # (..., T, Dv), (..., T, S)


def _attend(q, k, v, mask=None, *, bias=None, is_causal=False, scale=None, head_mask=None, dropout_p=0.0,
            backend="sdpa"):
    """The kernel behind every attention layer: no checks (the callers checked their inputs)."""
    if backend == "manual":
        return _weights(q, k, v, mask, bias=bias, is_causal=is_causal, scale=scale, head_mask=head_mask,
                        dropout_p=dropout_p)[0]
    t, s = q.shape[-2], k.shape[-2]
    if mask is None and bias is None and (not is_causal or t == s or t == 1) and (q.dim() == 2 or q.shape[-3] == k.shape[-3]):
        # The common case (a GPT's training step, an unpadded encoder): straight to the fused kernel.
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=is_causal and t > 1, scale=scale)
        return out if head_mask is None else out * head_mask.to(q.dtype)[..., None, None]
    k, v, mask, fused_causal, empty_rows = _prepare(q, k, v, mask, is_causal, can_fuse=bias is None)
    if bias is not None:
        # One float mask: the bias where attending is allowed, finfo.min where not.
        min_value = torch.finfo(q.dtype).min
        float_mask = bias.to(q.dtype).clamp(min=min_value)
        mask = float_mask if mask is None else float_mask.masked_fill(~mask, min_value)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=fused_causal,
                                         scale=scale)  # (..., T, Dv)
    if empty_rows is not None:  # recent PyTorch returns zeros for such rows, older releases NaN
        out = out.masked_fill(empty_rows, 0.0)
    return out if head_mask is None else out * head_mask.to(q.dtype)[..., None, None]


# --------------------------------------------------------------------------- the public function (checks once)


def _check_qkv_mask(q, k, v, mask, bias) -> None:
    sc = ShapeChecker()
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
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


def _check_head_mask(head_mask: torch.Tensor | None, q: torch.Tensor) -> None:
    """``head_mask`` must be ``(H,)`` or ``(B, H)``."""
    if head_mask is None:
        return
    if q.dim() < 3:
        raise ValueError(f"head_mask needs q of shape (..., H, T, Dh), got {tuple(q.shape)}")
    h = q.shape[-3]
    if not isinstance(head_mask, torch.Tensor) or head_mask.dim() not in (1, 2) or head_mask.shape[-1] != h:
        got = tuple(head_mask.shape) if isinstance(head_mask, torch.Tensor) else type(head_mask).__name__
        raise ValueError(f"head_mask must have shape (H,) or (B, H) with H={h}, got {got}")


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
            keys ``0 .. i + S - T``); the fused backend then uses its own causal
            rule when nothing else masks, and combines it with ``mask`` otherwise.
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
    _check_head_mask(head_mask, q)
    if is_causal and q.shape[-2] > k.shape[-2]:
        raise ValueError(f"is_causal needs at least as many keys as queries, got T={q.shape[-2]}, S={k.shape[-2]}")
    args = dict(bias=bias, is_causal=is_causal, scale=scale, head_mask=head_mask, dropout_p=dropout_p)
    if return_weights:
        if backend != "manual":
            raise ValueError("return_weights=True needs backend='manual': the fused kernel never forms the weights")
        return _weights(q, k, v, mask, **args)
    return _attend(q, k, v, mask, **args, backend=backend)


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


# --------------------------------------------------------------------------- the layers (call the kernel)


class _Attention(nn.Module):
    """What both attention layers share: sizes, scale, dropout, backend and the kernel they call.

    ``kernel`` is a class attribute, the private ``_attend``; :func:`record_attention`
    puts a recording kernel on one instance for the length of a ``with`` block.
    """

    kernel = staticmethod(_attend)

    def __init__(self, d_model, n_heads, d_head, n_kv_heads, scale, dropout, layer_idx, backend) -> None:
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
        if backend not in ("manual", "sdpa"):
            raise ValueError(f"backend must be 'manual' or 'sdpa', got {backend!r}")
        self.d_model, self.n_heads, self.d_head, self.n_kv_heads = d_model, n_heads, d_head, n_kv_heads
        self.scale, self.layer_idx, self.backend = scale, layer_idx, backend
        self.dropout = check_probability("dropout", dropout)

    def _attention(self, q, k, v, mask, **args) -> torch.Tensor:
        """The kernel with this layer's scale, dropout and backend; heads merged: ``(B, T, H Dh)``."""
        out = self.kernel(q, k, v, mask, scale=self.scale, dropout_p=self.dropout if self.training else 0.0,
                          backend=self.backend, **args)  # (B, H, T, Dh)
        return out.transpose(1, 2).flatten(2)  # (B, T, H Dh)


class MultiHeadAttention(_Attention):
    """Multi-head self-attention (Vaswani et al., 2017, section 3.2.2).

    One fused linear layer ``qkv`` of shape ``((H + 2 Hkv) Dh, D)`` projects ``x``
    to queries, keys and values: rows ``[0, H Dh)`` are ``W_Q``, then ``W_K`` and
    ``W_V`` (with ``Hkv = H`` and ``Dh = D / H`` the layout of
    ``nn.MultiheadAttention.in_proj_weight``). ``out`` maps ``H Dh`` back to ``D``.

    Args:
        d_model: model size D.
        n_heads: number of query heads H.
        d_head: per-head size Dh; default ``d_model // n_heads`` (then H must divide D).
        n_kv_heads: key/value heads Hkv (must divide H): ``H`` is multi-head,
            ``1`` multi-query, anything between grouped-query attention.
        scale: multiplies ``q k^T``; default ``1 / sqrt(Dh)`` (T5: 1.0).
        bias: whether the projections have biases.
        out_bias: whether ``out`` has a bias; default ``bias`` (Qwen2: biases on
            q, k, v only, ``bias=True, out_bias=False``).
        dropout: dropout on the attention weights during training.
        layer_idx: this layer's slot in a :class:`~companion.kv_cache.KVCache`.
        backend: ``"sdpa"`` (fused kernel) or ``"manual"`` (every step written out).
    """

    def __init__(self, d_model: int, n_heads: int, *, d_head: int | None = None, n_kv_heads: int | None = None,
                 scale: float | None = None, bias: bool = True, out_bias: bool | None = None, dropout: float = 0.0,
                 layer_idx: int = 0, backend: Backend = "sdpa") -> None:
        super().__init__(d_model, n_heads, d_head, n_kv_heads, scale, dropout, layer_idx, backend)
        d_q, d_kv = self.n_heads * self.d_head, self.n_kv_heads * self.d_head
        self.qkv_widths = (d_q, d_kv, d_kv)  # outputs of W_Q, W_K, W_V in the fused qkv
        self.qkv = nn.Linear(d_model, d_q + 2 * d_kv, bias=bias)
        self.out = nn.Linear(d_q, d_model, bias=bias if out_bias is None else out_bias)

    def forward(self, x, mask=None, *, is_causal=False, cache=None, **kernel_args):
        """``x`` (B, T, D) -> (B, T, D), every token attending to the tokens of ``x`` (and the cached ones).

        ``mask`` and ``is_causal`` go to the kernel (last two axes ``(T, S)``, ``S``
        counting cached keys), and so do the ``kernel_args`` other models add
        (``bias``, ``head_mask``); ``cache`` is a :class:`~companion.kv_cache.KVCache`
        to which this layer appends its new keys and values (slot ``layer_idx``).
        """
        q, k, v = self.heads(x)  # (B, H, T, Dh), 2 x (B, Hkv, T, Dh)
        if cache is not None:
            k, v = cache.append(self.layer_idx, k, v)  # (B, Hkv, S, Dh): cached + new
        return self.out(self._attention(q, k, v, mask, is_causal=is_causal, **kernel_args))  # (B, T, D)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of ``x`` (B, T, D), one slice per head: ``(B, H, T, Dh)``, 2 x ``(B, Hkv, T, Dh)``."""
        q, k, v = self.qkv(x).split(self.qkv_widths, dim=-1)  # (B, T, H Dh), 2 x (B, T, Hkv Dh)
        return tuple(z.unflatten(-1, (-1, self.d_head)).transpose(1, 2) for z in (q, k, v))

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention, *, cross: bool = False) -> MultiHeadAttention | CrossAttention:
        """A layer holding the same weights as an ``nn.MultiheadAttention``.

        ``in_proj_weight`` rows ``[0, D)`` are ``W_Q``, ``[D, 2D)`` ``W_K``, ``[2D, 3D)``
        ``W_V``: the fused ``qkv`` of a :class:`MultiHeadAttention`, or, with ``cross=True``,
        the ``q`` and ``kv`` of a :class:`CrossAttention`.
        """
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"expected nn.MultiheadAttention, got {type(mha).__name__}")
        if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("only nn.MultiheadAttention with kdim = vdim = embed_dim and no bias_k/add_zero_attn is supported")
        d, has_bias = mha.embed_dim, mha.in_proj_bias is not None
        layer = (CrossAttention if cross else cls)(d, mha.num_heads, bias=has_bias, dropout=mha.dropout)
        source = dict(mha.state_dict())
        names = {"out.weight": "out_proj.weight"}
        parts = (("weight", mha.in_proj_weight), ("bias", mha.in_proj_bias)) if has_bias else (("weight", mha.in_proj_weight),)
        for kind, rows in parts:
            if cross:  # the query rows and the key/value rows become two layers
                source.update({f"q_rows.{kind}": rows[:d], f"kv_rows.{kind}": rows[d:]})
                names.update({f"q.{kind}": f"q_rows.{kind}", f"kv.{kind}": f"kv_rows.{kind}"})
            else:
                names[f"qkv.{kind}"] = f"in_proj_{kind}"
            if kind == "bias":
                names["out.bias"] = "out_proj.bias"
        copy_by_name_map(layer, source, names, ignore=[r"^in_proj_(weight|bias)$"] if cross else [])
        return layer


class RotaryAttention(MultiHeadAttention):
    """Self-attention whose queries and keys are rotated by their positions (RoPE, Su et al., 2021).

    The layer of :class:`MultiHeadAttention` (same parameters); ``forward`` takes
    ``rope``, the ``(cos, sin)`` pair of :func:`~companion.positional.rope_cos_sin`
    for the positions of ``x`` (the new tokens only when keys are cached), in the
    half layout (GPT-NeoX, Hugging Face Llama). With a ``cache``, the keys are
    cached already rotated: a key's rotation depends on its own position only.
    """

    def forward(self, x, mask=None, *, rope, is_causal=False, cache=None, **kernel_args):
        q, k, v = self.heads(x)  # (B, H, T, Dh), 2 x (B, Hkv, T, Dh)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)  # position enters the scores as a rotation
        if cache is not None:
            k, v = cache.append(self.layer_idx, k, v)  # (B, Hkv, S, Dh): cached + new
        return self.out(self._attention(q, k, v, mask, is_causal=is_causal, **kernel_args))  # (B, T, D)


class CrossAttention(_Attention):
    """Cross-attention: queries from ``x``, keys and values from a ``context`` (an encoder's output).

    ``q`` projects ``x`` (D -> H Dh), a fused ``kv`` projects the context
    (Dc -> 2 Hkv Dh, keys first), ``out`` maps ``H Dh`` back to D. Arguments as
    :class:`MultiHeadAttention`, plus ``d_context``, the size Dc of the context
    vectors (default D).
    """

    def __init__(self, d_model: int, n_heads: int, *, d_head: int | None = None, n_kv_heads: int | None = None,
                 d_context: int | None = None, scale: float | None = None, bias: bool = True, dropout: float = 0.0,
                 layer_idx: int = 0, backend: Backend = "sdpa") -> None:
        super().__init__(d_model, n_heads, d_head, n_kv_heads, scale, dropout, layer_idx, backend)
        self.d_context = d_model if d_context is None else check_positive_int("d_context", d_context)
        d_q, d_kv = self.n_heads * self.d_head, self.n_kv_heads * self.d_head
        self.q = nn.Linear(d_model, d_q, bias=bias)
        self.kv = nn.Linear(self.d_context, 2 * d_kv, bias=bias)
        self.out = nn.Linear(d_q, d_model, bias=bias)

    def project_kv(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the context (B, S, Dc), each ``(B, Hkv, S, Dh)``."""
        b, s, _ = context.shape
        k, v = self.kv(context).view(b, s, 2, self.n_kv_heads, self.d_head).permute(2, 0, 3, 1, 4)  # 2 x (B, Hkv, S, Dh)
        return k, v

    def forward(self, x, context, mask=None, *, bias=None, head_mask=None, cache=None):
        """``x`` (B, T, D) attending to ``context`` (B, S, Dc) -> (B, T, D).

        With a ``cache`` (a :class:`~companion.kv_cache.KVCache`), the context's keys
        and values are computed at the first call and reused afterwards (``context``
        may then be None).
        """
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, Dh)
        if cache is not None and cache.has(self.layer_idx):
            k, v = cache.keys[self.layer_idx], cache.values[self.layer_idx]  # (B, Hkv, S, Dh)
        else:
            if context is None:
                raise ValueError("cross-attention needs a context tensor of shape (B, S, Dc) (none is cached yet)")
            k, v = self.project_kv(context)  # (B, Hkv, S, Dh)
            if cache is not None:
                cache.append(self.layer_idx, k, v)
        return self.out(self._attention(q, k, v, mask, bias=bias, head_mask=head_mask))  # (B, T, D)


@contextmanager
def record_attention(model: nn.Module, *, cross: bool | None = None) -> Iterator[dict[str, list[torch.Tensor]]]:
    """Record the attention weights of every attention layer inside ``model``.

    ``with record_attention(model) as weights: model(...)`` fills ``weights``,
    a dict from each attention layer's name in ``model`` (for example
    ``"blocks.0.self_attn"``) to the list of its weights ``(B, H, T, S)``, one
    per call. The forward pass computes exactly what it computes without
    recording; the weights are formed beside it with the manual computation.
    ``cross=True`` records only :class:`CrossAttention` layers, ``cross=False``
    only self-attention, ``None`` both. The one way the course records attention.

    How: each layer calls ``self.kernel``; inside the block, the recorded layers get
    a kernel of their own that also stores the weights, and lose it afterwards.
    """
    layers = {name: m for name, m in model.named_modules() if isinstance(m, _Attention)
              and (cross is None or isinstance(m, CrossAttention) == cross)}
    records: dict[str, list[torch.Tensor]] = {name: [] for name in layers}

    def recording_kernel(store: list[torch.Tensor]):
        def kernel(q, k, v, mask=None, *, backend="sdpa", **args):
            store.append(_weights(q, k, v, mask, **{**args, "dropout_p": 0.0})[1].detach())  # (B, H, T, S)
            return _attend(q, k, v, mask, backend=backend, **args)
        return kernel

    for name, m in layers.items():
        m.kernel = recording_kernel(records[name])  # an instance attribute hides the class's kernel
    try:
        yield records
    finally:
        for m in layers.values():
            del m.kernel
