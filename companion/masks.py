"""Attention masks: one convention for the whole course.

Convention (the one ``torch.nn.functional.scaled_dot_product_attention`` uses):
a mask is a **boolean** tensor, ``True`` where a query **may attend** to a key,
broadcastable to ``(B, H, T, S)``.

Beware: ``torch.nn.MultiheadAttention`` uses the *opposite* meaning for its
boolean ``attn_mask`` and ``key_padding_mask`` (``True`` = blocked). Convert
with ``~mask`` at that boundary and nowhere else.

Shape legend: B batch, H heads, T query length, S key length.
Defined in Chapter 2 (padding, causal) and Chapter 6 (prefix-LM, cross,
influence through a stack of layers).
"""

from __future__ import annotations

import torch

from ._checks import ShapeChecker, check_positive_int

__all__ = [
    "causal_mask",
    "padding_mask",
    "prefix_lm_mask",
    "cross_attention_mask",
    "combine_masks",
    "additive_mask",
    "influence_matrix",
]


def causal_mask(t: int, s: int | None = None, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean causal mask of shape ``(T, S)``: query ``i`` may see key ``j`` iff ``j <= i + (S - T)``.

    With ``s=None`` (self-attention) ``S = T`` and this is the lower triangle.
    With ``S > T`` (decoding with a cache of ``S - T`` earlier keys) the
    triangle is aligned to the **bottom right**, so the last query sees every key.
    """
    check_positive_int("t", t)
    s = t if s is None else check_positive_int("s", s)
    if s < t:
        raise ValueError(f"a causal mask needs at least as many keys as queries, got t={t}, s={s}")
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(diagonal=s - t)  # (T, S)


def padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Turn a ``(B, S)`` padding indicator (1 or True = real token) into a ``(B, 1, 1, S)`` mask.

    The input follows the Hugging Face ``attention_mask`` convention, 1 for a
    real token and 0 for padding; the result is ``True`` where a key is real.
    """
    ShapeChecker().check("attention_mask", attention_mask, ("B", "S"))
    if attention_mask.dtype.is_floating_point or attention_mask.dtype.is_complex:
        raise TypeError(f"attention_mask must hold 0/1 integers or booleans, got dtype {attention_mask.dtype}")
    return attention_mask.bool()[:, None, None, :]  # (B, 1, 1, S)


def prefix_lm_mask(prefix_lengths: torch.Tensor | int, t: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Prefix-LM mask: the first ``prefix_length`` positions see each other both ways, the rest are causal.

    ``prefix_lengths`` is an int (one prefix for the batch, result ``(T, T)``)
    or a ``(B,)`` tensor (one per sequence, result ``(B, 1, T, T)``).
    """
    check_positive_int("t", t)
    causal = causal_mask(t, device=device)  # (T, T)
    pos = torch.arange(t, device=device)
    if isinstance(prefix_lengths, int):
        if not 0 <= prefix_lengths <= t:
            raise ValueError(f"prefix length must lie in [0, t={t}], got {prefix_lengths}")
        return causal | (pos[None, :] < prefix_lengths)  # (T, T): every query sees the prefix
    ShapeChecker().check("prefix_lengths", prefix_lengths, ("B",))
    if bool(((prefix_lengths < 0) | (prefix_lengths > t)).any()):
        raise ValueError(f"prefix lengths must lie in [0, t={t}], got {prefix_lengths.tolist()}")
    in_prefix = pos[None, :] < prefix_lengths.to(device=causal.device)[:, None]  # (B, S)
    return (causal[None] | in_prefix[:, None, :])[:, None]  # (B, 1, T, T)


def cross_attention_mask(encoder_attention_mask: torch.Tensor, t: int) -> torch.Tensor:
    """Mask for decoder queries attending to encoder keys: ``(B, 1, T, S)``, blocking encoder padding only."""
    check_positive_int("t", t)
    keys = padding_mask(encoder_attention_mask)  # (B, 1, 1, S)
    return keys.expand(-1, -1, t, -1)  # (B, 1, T, S)


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Logical AND of boolean masks with broadcasting; ``None`` entries are ignored."""
    present = [m for m in masks if m is not None]
    for i, m in enumerate(present):
        if m.dtype != torch.bool:
            raise TypeError(f"mask {i} must be boolean (True = may attend), got dtype {m.dtype}")
    if not present:
        return None
    out = present[0]
    for m in present[1:]:
        out = out & m
    return out


def additive_mask(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Boolean mask -> additive mask: 0 where allowed, ``torch.finfo(dtype).min`` where blocked.

    ``finfo(dtype).min`` is the most negative finite value of ``dtype``; unlike
    ``-1e9`` it does not overflow to ``-inf`` in float16 (whose minimum is -65504).
    """
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def influence_matrix(mask: torch.Tensor, n_layers: int = 1) -> torch.Tensor:
    """Which inputs can influence which outputs after ``n_layers`` self-attention layers with this mask.

    Entry ``[..., i, j]`` is True iff input position ``j`` can change output
    position ``i``. One layer lets query ``i`` read key ``j`` where the mask
    allows it, and the residual connection carries position ``i`` itself; a
    stack of layers composes these links (a boolean matrix power), so a
    sliding-window or prefix mask can reach further with depth than in one layer.

    Args:
        mask: boolean ``(..., T, T)``, True = may attend (a self-attention mask).
        n_layers: number of stacked layers.

    Returns:
        boolean ``(..., T, T)``.
    """
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a boolean tensor (True = may attend), got {got}")
    if mask.dim() < 2 or mask.shape[-1] != mask.shape[-2]:
        raise ValueError(f"a self-attention mask must have shape (..., T, T), got {tuple(mask.shape)}")
    check_positive_int("n_layers", n_layers)
    eye = torch.eye(mask.shape[-1], dtype=torch.bool, device=mask.device)
    step = (mask | eye).to(torch.int64)  # (..., T, T): attention plus the residual path
    reach = step
    for _ in range(n_layers - 1):
        reach = (reach @ step).clamp(max=1)  # (..., T, T): a path exists through one more layer
    return reach.bool()
