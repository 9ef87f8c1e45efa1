"""Efficient attention (Chapter 13): sparse patterns, low-rank keys, random features, fewer KV heads.

Shape legend: B batch, H query heads, Hkv key/value heads, T query length,
S key length, Dh head size, Dv value size, K projected length (Linformer),
M random features (Performer), W window (keys on each side), G global tokens.

Each method keeps the attention interface of :mod:`companion.attention`
(``q (B, H, T, Dh)``, ``k (B, H, S, Dh)``, ``v (B, H, S, Dv)``) so that it can
be compared with :func:`~companion.attention.scaled_dot_product_attention`:

* :func:`sliding_window_attention`: Longformer's window plus global tokens,
  computed by chunks in ``O(T W)`` memory; equal to full attention with
  :func:`~companion.masks.sliding_window_mask`.
* :func:`bigbird_attention`: BigBird's window + global + random blocks,
  computed **through the dense mask** (same cost as full attention here: the
  point is the pattern, the savings need block-sparse kernels).
* :func:`linformer_attention`: keys and values projected from length ``S`` to ``K``.
* :func:`performer_attention`: FAVOR+ positive orthogonal random features,
  an unbiased estimate of the softmax kernel in ``O(T M Dh)``.
* :func:`gqa_from_mha`: grouped-query attention from a multi-head layer by
  mean-pooling key/value heads.

Positions: RoPE rotates ``q`` and ``k`` before the call, so it works with every
method whose scores are ``q . k`` of single positions (sliding window, BigBird,
Performer; it is the RoFormer paper's point that it fits linear attention).
Linformer's projected keys mix all positions, so a rotation has no relative
meaning there. ALiBi adds ``-m |i - j|`` to the scores: the sliding window
(``slopes``) and BigBird (``bias``) take it; Performer and Linformer never form
the scores, so they cannot.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._checks import ShapeChecker, check_positive_int
from .attention import MultiHeadAttention, scaled_dot_product_attention
from .masks import bigbird_mask

__all__ = [
    "sliding_window_attention",
    "bigbird_attention",
    "linformer_projections",
    "linformer_attention",
    "orthogonal_random_features",
    "favor_features",
    "performer_attention",
    "gqa_from_mha",
]


def _check_qkv(q, k, v, *, same_length: bool = False) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ValueError(f"{name} must be a tensor of shape (B, H, L, Dh), got {getattr(x, 'shape', type(x).__name__)}")
    sc = ShapeChecker()
    sc.check("q", q, ("B", "H", "T", "Dh"))
    sc.check("k", k, ("B", "H", "S", "Dh"))
    sc.check("v", v, ("B", "H", "S", "Dv"))
    if same_length and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"self-attention needs T == S, got q {tuple(q.shape)} and k {tuple(k.shape)}")


# ---------------------------------------------------------------- Longformer

def sliding_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    *,
    global_tokens: torch.Tensor | list[int] | tuple[int, ...] = (),
    causal: bool = False,
    slopes: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Sliding-window attention with global tokens (Beltagy et al., 2020, sections 3.1 and 3.2).

    Query ``i`` attends to keys ``i - W .. i + W`` (``.. i`` when ``causal``);
    a global token attends to every key and every query attends to it. The
    band is computed by chunks of ``C = max(W, 1)`` queries against their
    ``C + 2W`` neighbouring keys (Longformer's own PyTorch version also
    works on overlapping chunks), so the scores take ``O(T (C + 2W))`` memory, not
    ``O(T^2)``; global tokens add ``O(T G)``.

    Args:
        q, k, v: ``(B, H, T, Dh)``, ``(B, H, T, Dh)``, ``(B, H, T, Dv)`` (self-attention).
        window: ``W``, keys on each side (the paper's window size ``w`` counts both sides: ``w = 2W``).
        global_tokens: positions with global attention.
        causal: only keys ``j <= i``.
        slopes: ALiBi slopes ``(H,)``: adds ``-m_h |i - j|`` to each score.
        scale: multiplies ``q k^T``; default ``1 / sqrt(Dh)``.

    Returns:
        ``(B, H, T, Dv)``, equal to full attention with
        :func:`~companion.masks.sliding_window_mask` (and :func:`~companion.positional.alibi_bias`).
    """
    _check_qkv(q, k, v, same_length=True)
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be an int >= 0 (keys on each side), got {window!r}")
    b, h, t, d = q.shape
    if slopes is not None and (not isinstance(slopes, torch.Tensor) or slopes.shape != (h,)):
        raise ValueError(f"slopes must be a tensor of shape (H,) = ({h},), got {getattr(slopes, 'shape', slopes)}")
    glob = torch.as_tensor(global_tokens, dtype=torch.long, device=q.device).reshape(-1).unique()
    if glob.numel() and (glob.min() < 0 or glob.max() >= t):
        raise ValueError(f"global_tokens must lie in [0, {t}), got {glob.tolist()}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    neg = torch.finfo(q.dtype).min
    w, c = window, max(window, 1)
    n = -(-t // c)  # number of query chunks
    pos = torch.arange(n * c, device=q.device)
    is_global = torch.zeros(t, dtype=torch.bool, device=q.device)
    is_global[glob] = True

    # Band: chunk n holds queries n*C .. n*C + C - 1 and keys n*C - W .. n*C + C + W - 1.
    qc = nn.functional.pad(q, (0, 0, 0, n * c - t)).unflatten(2, (n, c))  # (B, H, N, C, Dh)
    pad = (0, 0, w, n * c - t + w)
    kc = nn.functional.pad(k, pad).unfold(2, c + 2 * w, c).transpose(-1, -2)  # (B, H, N, C + 2W, Dh)
    vc = nn.functional.pad(v, pad).unfold(2, c + 2 * w, c).transpose(-1, -2)  # (B, H, N, C + 2W, Dv)
    scores = (qc @ kc.transpose(-1, -2)) * scale  # (B, H, N, C, C + 2W)
    qi = pos.view(n, c, 1)  # query position of each score
    kj = (pos[::c].view(n, 1, 1) - w) + torch.arange(c + 2 * w, device=q.device)  # key position
    rel = kj - qi  # (N, C, C + 2W)
    keep = (rel.abs() <= w) & (kj >= 0) & (kj < t)
    keep &= ~is_global[kj.clamp(0, t - 1)]  # a global key is scored once, in the global part below
    if causal:
        keep &= rel <= 0
    if slopes is not None:
        scores = scores - slopes.to(q.dtype).view(h, 1, 1, 1) * rel.abs().to(q.dtype)
    scores = scores.masked_fill(~keep, neg)  # (B, H, N, C, C + 2W)

    if not glob.numel():
        out = scores.softmax(dim=-1) @ vc  # (B, H, N, C, Dv)
        return out.flatten(2, 3)[:, :, :t]  # (B, H, T, Dv)
    # Every query also scores the G global keys.
    g = glob.numel()
    g_scores = (q @ k[:, :, glob].transpose(-1, -2)) * scale  # (B, H, T, G)
    g_rel = glob[None, :] - torch.arange(t, device=q.device)[:, None]  # (T, G)
    if slopes is not None:
        g_scores = g_scores - slopes.to(q.dtype).view(h, 1, 1) * g_rel.abs().to(q.dtype)
    if causal:
        g_scores = g_scores.masked_fill(g_rel > 0, neg)
    g_scores = nn.functional.pad(g_scores, (0, 0, 0, n * c - t)).unflatten(2, (n, c))  # (B, H, N, C, G)
    weights = torch.cat((scores, g_scores), dim=-1).softmax(dim=-1)  # (B, H, N, C, C + 2W + G)
    out = weights[..., :-g] @ vc + weights[..., -g:] @ v[:, :, None, glob]  # (B, H, N, C, Dv)
    out = out.flatten(2, 3)[:, :, :t]  # (B, H, T, Dv)
    # Global queries see every key: their rows are full attention.
    g_bias = None
    if slopes is not None:
        g_rel_q = torch.arange(t, device=q.device)[None, :] - glob[:, None]  # (G, S)
        g_bias = -slopes.to(q.dtype).view(h, 1, 1) * g_rel_q.abs().to(q.dtype)  # (H, G, S)
    g_mask = (torch.arange(t, device=q.device)[None, :] <= glob[:, None]) if causal else None  # (G, S)
    out[:, :, glob] = scaled_dot_product_attention(q[:, :, glob], k, v, g_mask, bias=g_bias, scale=scale)
    return out


# ---------------------------------------------------------------- BigBird

def bigbird_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_size: int,
    *,
    n_random_blocks: int = 3,
    generator: torch.Generator | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """BigBird's attention (Zaheer et al., 2020, section 2): window, global and random blocks.

    Computed here **through the dense mask** of :func:`~companion.masks.bigbird_mask`
    (``T`` must be a multiple of ``block_size``): exact for the pattern, but
    with the time and memory of full attention. BigBird's speed comes from
    gathering only the visible key blocks (appendix D), which needs
    block-sparse kernels. ``bias`` (ALiBi, T5) is added as in full attention.
    """
    _check_qkv(q, k, v, same_length=True)
    check_positive_int("block_size", block_size)
    t = q.shape[-2]
    if t % block_size:
        raise ValueError(f"T={t} is not a multiple of block_size={block_size}")
    mask = bigbird_mask(t // block_size, block_size, n_random_blocks=n_random_blocks, generator=generator,
                        device=q.device)  # (T, T)
    return scaled_dot_product_attention(q, k, v, mask, bias=bias)


# ---------------------------------------------------------------- Linformer

def linformer_projections(seq_len: int, k: int, *, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Two ``(K, S)`` projections ``E, F`` with entries ``N(0, 1/K)`` (Wang et al., 2020: the JL construction behind theorems 1 and 2, sections 3 and 4).

    In a Linformer layer they are learned parameters; this is their random
    (Johnson-Lindenstrauss) starting point.
    """
    check_positive_int("seq_len", seq_len)
    check_positive_int("k", k)
    e = torch.randn(k, seq_len, generator=generator) / math.sqrt(k)
    f = torch.randn(k, seq_len, generator=generator) / math.sqrt(k)
    return e, f


def linformer_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, e: torch.Tensor, f: torch.Tensor, *, scale: float | None = None
) -> torch.Tensor:
    """Linformer (Wang et al., 2020, section 4, eq. 7): ``softmax(q (E k)^T * scale) (F v)``.

    ``E`` and ``F`` ``(K, S)`` project the ``S`` keys and values to ``K``
    mixtures, so the scores are ``(T, K)``: linear in the length for a fixed
    ``K``. No causal mask is possible (each projected key mixes every position,
    future ones too), and no position bias (a projected key has no position).
    """
    _check_qkv(q, k, v)
    sc = ShapeChecker()
    sc.sizes["S"] = k.shape[-2]
    sc.check("e", e, ("K", "S"))
    sc.check("f", f, ("K", "S"))
    k_proj = e.to(k.dtype) @ k  # (B, H, K, Dh)
    v_proj = f.to(v.dtype) @ v  # (B, H, K, Dv)
    return scaled_dot_product_attention(q, k_proj, v_proj, scale=scale)


# ---------------------------------------------------------------- Performer

def orthogonal_random_features(n_features: int, d_head: int, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """``M`` random directions ``(M, Dh)`` for FAVOR+ (Choromanski et al., 2021, section 2.4).

    Blocks of ``Dh`` exactly orthogonal rows (QR of a Gaussian matrix), each row
    rescaled to the norm of an independent Gaussian vector, so every row is
    marginally ``N(0, I)`` while rows within a block are orthogonal (lower variance).
    The paper's variance result (section 3, theorem 2) is for one block, ``M <= Dh``;
    beyond that the blocks here are independent of each other.
    """
    check_positive_int("n_features", n_features)
    check_positive_int("d_head", d_head)
    blocks = []
    for _ in range(-(-n_features // d_head)):
        g = torch.randn(d_head, d_head, generator=generator, dtype=torch.float64)
        qmat, r = torch.linalg.qr(g)
        qmat = qmat * torch.sign(torch.diagonal(r))  # a uniformly random orthogonal matrix
        blocks.append(qmat.T)  # rows orthonormal
    w = torch.cat(blocks)[:n_features]  # (M, Dh)
    norms = torch.randn(n_features, d_head, generator=generator, dtype=torch.float64).norm(dim=-1)  # chi(Dh)
    return (w * norms[:, None]).float()


def favor_features(x: torch.Tensor, w: torch.Tensor, *, is_query: bool) -> torch.Tensor:
    """Positive random features ``phi(x) = exp(w x - |x|^2 / 2) / sqrt(M)`` (Choromanski et al., 2021, lemma 1).

    ``E[phi(x) . phi(y)] = exp(x . y)`` for ``w ~ N(0, I)``. Every entry is positive,
    so the estimated attention weights are too. For stability the largest
    exponent is subtracted: per row for queries (it cancels in each query's
    normalisation), once per (batch, head) for keys (a common factor of all keys).

    Args:
        x: ``(..., L, Dh)`` queries or keys, already multiplied by ``Dh^(-1/4)``.
        w: ``(M, Dh)`` from :func:`orthogonal_random_features`.
    """
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.shape[-1] != x.shape[-1]:
        raise ValueError(f"w must have shape (M, Dh) with Dh={x.shape[-1]}, got {getattr(w, 'shape', type(w).__name__)}")
    proj = x @ w.to(x.dtype).T  # (..., L, M)
    proj = proj - (x * x).sum(-1, keepdim=True) / 2
    stab = proj.amax(dim=-1, keepdim=True) if is_query else proj.amax(dim=(-1, -2), keepdim=True)
    return torch.exp(proj - stab.detach()) / math.sqrt(w.shape[0])


def performer_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor, *, causal: bool = False
) -> torch.Tensor:
    """Performer's FAVOR+ attention (Choromanski et al., 2021, sections 2.2 to 2.4).

    ``softmax(q k^T / sqrt(Dh)) v ~ D^-1 (phi(q) (phi(k)^T v))`` with
    ``D = diag(phi(q) phi(k)^T 1)``: the ``(T, S)`` matrix is never formed;
    time and memory are ``O((T + S) M Dh)``. ``causal`` uses running sums of
    ``phi(k_j) v_j^T`` (prefix sums, the paper's section 2.1 and appendix B.1; needs ``T == S``), ``O(T M Dv)`` memory here.
    """
    _check_qkv(q, k, v, same_length=causal)
    d = q.shape[-1]
    phi_q = favor_features(q * d ** -0.25, w, is_query=True)  # (B, H, T, M)
    phi_k = favor_features(k * d ** -0.25, w, is_query=False)  # (B, H, S, M)
    if not causal:
        kv = phi_k.transpose(-1, -2) @ v  # (B, H, M, Dv)
        num = phi_q @ kv  # (B, H, T, Dv)
        den = phi_q @ phi_k.sum(dim=-2)[..., None]  # (B, H, T, 1)
    else:
        kv = torch.cumsum(phi_k[..., :, None] * v[..., None, :], dim=2)  # (B, H, T, M, Dv)
        num = (phi_q[..., None, :] @ kv).squeeze(-2)  # (B, H, T, Dv)
        den = (phi_q * torch.cumsum(phi_k, dim=2)).sum(-1, keepdim=True)  # (B, H, T, 1)
    return num / den


# ---------------------------------------------------------------- MQA / GQA

def gqa_from_mha(mha: MultiHeadAttention, n_kv_heads: int) -> MultiHeadAttention:
    """A grouped-query layer from a multi-head one (Ainslie et al., 2023, section 2.1).

    Query and output weights are copied; the key and value heads of each group
    of ``H / Hkv`` consecutive heads are mean-pooled (the paper's conversion
    before uptraining). ``n_kv_heads = H`` gives back the same layer;
    ``n_kv_heads = 1`` is multi-query attention (Shazeer, 2019).
    """
    if not isinstance(mha, MultiHeadAttention):
        raise TypeError(f"mha must be a self-attention MultiHeadAttention, got {type(mha).__name__}")
    if mha.n_kv_heads != mha.n_heads:
        raise ValueError(f"mha must have n_kv_heads == n_heads, got {mha.n_kv_heads} and {mha.n_heads}")
    check_positive_int("n_kv_heads", n_kv_heads)
    h, dh = mha.n_heads, mha.d_head
    if h % n_kv_heads:
        raise ValueError(f"n_heads={h} is not divisible by n_kv_heads={n_kv_heads}")
    has_bias = mha.qkv.bias is not None
    out = MultiHeadAttention(mha.d_model, h, d_head=dh, n_kv_heads=n_kv_heads, scale=mha.scale, bias=has_bias,
                             dropout=mha.dropout, layer_idx=mha.layer_idx, backend=mha.backend)

    def pool(x: torch.Tensor) -> torch.Tensor:  # (H Dh, ...) -> (Hkv Dh, ...)
        return x.unflatten(0, (n_kv_heads, h // n_kv_heads, dh)).mean(dim=1).flatten(0, 1)

    with torch.no_grad():
        for name in ("weight", "bias") if has_bias else ("weight",):
            wq, wk, wv = getattr(mha.qkv, name).split(h * dh, dim=0)
            getattr(out.qkv, name).copy_(torch.cat((wq, pool(wk), pool(wv))))
            getattr(out.out, name).copy_(getattr(mha.out, name))
    return out
