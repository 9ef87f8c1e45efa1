"""Attention masks: one convention for the whole course.

Convention (the one ``torch.nn.functional.scaled_dot_product_attention`` uses):
a mask is a **boolean** tensor, ``True`` where a query **may attend** to a key,
broadcastable to ``(B, H, T, S)``.

Beware: ``torch.nn.MultiheadAttention`` uses the *opposite* meaning for its
boolean ``attn_mask`` and ``key_padding_mask`` (``True`` = blocked). Convert
with ``~mask`` at that boundary and nowhere else.

Shape legend: B batch, H heads, T query length, S key length.
Defined in Chapter 2 (padding, causal) and Chapter 6 (prefix-LM, cross,
influence through a stack of layers); the sparse patterns of Chapter 13
(Longformer's sliding window with global tokens, BigBird's blocks).
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
    "sliding_window_mask",
    "bigbird_mask",
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


def sliding_window_mask(
    t: int,
    window: int,
    *,
    global_tokens: torch.Tensor | list[int] | tuple[int, ...] = (),
    causal: bool = False,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Longformer's pattern (Beltagy et al., 2020, section 3.1), boolean ``(T, T)``.

    Query ``i`` sees key ``j`` iff ``|i - j| <= window`` (``window`` keys on each
    side, so the paper's window size is ``2 window + 1``); with ``causal`` only
    ``i - window <= j <= i``. A global token (an index in ``global_tokens``)
    sees every key and is seen by every query (the paper's symmetric global
    attention), still within the causal limit when ``causal``.
    """
    check_positive_int("t", t)
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be an int >= 0 (keys on each side), got {window!r}")
    idx = torch.as_tensor(global_tokens, dtype=torch.long, device=device).reshape(-1)
    if idx.numel() and (idx.min() < 0 or idx.max() >= t):
        raise ValueError(f"global_tokens must lie in [0, {t}), got {idx.tolist()}")
    pos = torch.arange(t, device=device)
    rel = pos[None, :] - pos[:, None]  # (T, T): key - query
    mask = rel.abs() <= window
    mask[idx, :] = True  # global queries see everything
    mask[:, idx] = True  # every query sees the global keys
    if causal:
        mask &= rel <= 0
    return mask  # (T, T)


def bigbird_mask(
    n_blocks: int,
    block_size: int,
    *,
    n_random_blocks: int = 3,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """BigBird's block-sparse pattern (Zaheer et al., 2020, section 2 and appendix D), boolean ``(T, T)``.

    The sequence is cut into ``n_blocks`` blocks of ``block_size`` tokens
    (``T = n_blocks * block_size``). A query block sees: its own block and one
    block on each side (the window), the first and the last block (global, as
    in BigBird-ITC; these two blocks also see everything), and
    ``n_random_blocks`` other blocks drawn uniformly without replacement, per
    query block, among the blocks not already seen.
    """
    check_positive_int("n_blocks", n_blocks)
    check_positive_int("block_size", block_size)
    if isinstance(n_random_blocks, bool) or not isinstance(n_random_blocks, int) or n_random_blocks < 0:
        raise ValueError(f"n_random_blocks must be an int >= 0, got {n_random_blocks!r}")
    blocks = torch.arange(n_blocks, device=device)
    seen = (blocks[None, :] - blocks[:, None]).abs() <= 1  # (n_blocks, n_blocks): window of 3 blocks
    seen[:, [0, -1]] = True  # global key blocks
    seen[[0, -1], :] = True  # global query blocks
    for r in range(1, n_blocks - 1):
        free = (~seen[r]).nonzero().reshape(-1)  # blocks this query block does not see yet
        pick = torch.randperm(free.numel(), generator=generator)[:n_random_blocks].to(free.device)
        seen[r, free[pick]] = True
    ones = torch.ones(block_size, block_size, dtype=torch.bool, device=device)
    return torch.kron(seen.to(torch.int64), ones.to(torch.int64)).bool()  # (T, T)
