"""Exact attention computed tile by tile with an online softmax, in the loop order of FlashAttention-2.

Attention needs the softmax of a whole row of scores, yet the row never has to
exist at once: walk over the keys in blocks, keep for every query the running
maximum ``m``, the running sum of exponentials ``l`` and the running output
``o``, and rescale the old ``l`` and ``o`` by ``exp(m_old - m_new)`` whenever
the maximum grows. After the last block, ``o / l`` is exactly
``softmax(q k^T * scale) v`` (up to rounding), and ``L = m + log(l)`` is each
row's log-sum-exp.

Versions. FlashAttention (Dao et al., 2022; "FlashAttention-1" below), section
3.1, algorithm 1, puts the key/value blocks in the outer loop and the query
blocks in the inner one, and rewrites a normalised output block (with ``l`` and
``m``) after every step; its backward pass (appendix B.4, algorithm 4) starts
from the saved ``(m, l)``. What this module does is FlashAttention-2 (Dao,
2023), section 3.1: query blocks in the outer loop, an unnormalised ``o``
divided by ``l`` once at the end, and only ``L = m + log(l)`` saved for the
backward pass (forward: algorithm 1; backward: algorithm 2, which recomputes
each tile's probabilities as ``exp(s - L)``). The returned ``L`` is differentiable
too: a loss through it adds ``P * dL`` to the score gradient. Like FlashAttention-2 it skips
the key blocks a causal mask hides entirely. One difference: the backward pass
below loops over query blocks outside and key blocks inside, where
FlashAttention-2's algorithm 2 puts the key/value blocks outside.

Memory: the naive computation materialises the (T, S) score matrix; the tiled
one holds only a (block_q, block_k) tile at a time, so its extra memory is that
fixed tile plus the O(T) output and log-sum-exp. The FLOPs are the same; the
speed-up of the real kernels comes from keeping tiles in on-chip SRAM, which
plain PyTorch on a CPU cannot control, so here it is a statement about memory,
not time.

Shape legend: B batch, H heads, T queries, S keys, Dh head size.
"""

from __future__ import annotations

import math

import torch

__all__ = ["tiled_attention", "TiledAttention"]


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_q: int, block_k: int) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() < 2:
            raise ValueError(f"{name} must be a tensor of shape (..., L, Dh), got {getattr(x, 'shape', type(x).__name__)}")
    if k.shape[:-1] != v.shape[:-1] or q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                         "(expected (..., T, Dh), (..., S, Dh), (..., S, Dv))")
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(b, bool) or not isinstance(b, int) or b <= 0:
            raise ValueError(f"{name} must be a positive int, got {b!r}")


def _forward(q, k, v, causal: bool, scale: float, block_q: int, block_k: int):
    acc = torch.promote_types(q.dtype, torch.float32)  # accumulate in float32 at least (float64 stays float64)
    t, s = q.shape[-2], k.shape[-2]
    offset = s - t  # causal, aligned bottom-right: query i sees keys 0 .. i + offset
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=acc, device=q.device)
    for i0 in range(0, t, block_q):
        qi = q[..., i0:i0 + block_q, :].to(acc) * scale  # (..., bq, Dh)
        bq = qi.shape[-2]
        m = torch.full(qi.shape[:-1], float("-inf"), dtype=acc, device=q.device)  # running max, (..., bq)
        l = torch.zeros(qi.shape[:-1], dtype=acc, device=q.device)  # running sum of exp(score - m)
        o = torch.zeros(*qi.shape[:-1], v.shape[-1], dtype=acc, device=q.device)  # running unnormalised output
        last_key = s if not causal else min(s, i0 + bq + offset)  # later key blocks are fully masked
        for j0 in range(0, max(last_key, 0), block_k):
            kj, vj = k[..., j0:j0 + block_k, :].to(acc), v[..., j0:j0 + block_k, :].to(acc)
            scores = qi @ kj.transpose(-1, -2)  # (..., bq, bk): the only score memory ever held
            if causal:
                rows = torch.arange(i0, i0 + bq, device=q.device)[:, None] + offset
                cols = torch.arange(j0, j0 + kj.shape[-2], device=q.device)[None, :]
                scores = scores.masked_fill(cols > rows, float("-inf"))
            m_new = torch.maximum(m, scores.amax(-1))
            safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # rows with nothing seen yet
            p = torch.exp(scores - safe.unsqueeze(-1))  # (..., bq, bk)
            correction = torch.exp(torch.where(torch.isinf(m), torch.full_like(m, float("-inf")), m - safe))
            l = l * correction + p.sum(-1)
            o = o * correction.unsqueeze(-1) + p @ vj
            m = m_new
        empty = l == 0  # a query with no visible key (causal with S < T): output 0, lse -inf
        out[..., i0:i0 + bq, :] = torch.where(empty.unsqueeze(-1), torch.zeros_like(o), o / l.clamp_min(1e-30).unsqueeze(-1)).to(q.dtype)
        lse[..., i0:i0 + bq] = torch.where(empty, torch.full_like(m, float("-inf")), m + torch.log(l.clamp_min(1e-30)))
    return out, lse


def _backward(q, k, v, out, lse, grad_out, grad_lse, causal, scale, block_q, block_k):
    acc = torch.promote_types(q.dtype, torch.float32)
    t, s = q.shape[-2], k.shape[-2]
    offset = s - t
    dq = torch.zeros_like(q, dtype=acc)
    dk = torch.zeros_like(k, dtype=acc)
    dv = torch.zeros_like(v, dtype=acc)
    delta = (grad_out.to(acc) * out.to(acc)).sum(-1)  # (..., T): rowsum(dO * O)
    if grad_lse is not None:
        # L_i = logsumexp_j s_ij gives dL_i / ds_ij = P_ij: the lse term joins the softmax's, ds = P (dP - delta + dL).
        delta = delta - torch.where(torch.isfinite(lse), grad_lse.to(acc), torch.zeros_like(delta))
    for i0 in range(0, t, block_q):
        qi = q[..., i0:i0 + block_q, :].to(acc)
        bq = qi.shape[-2]
        do_i = grad_out[..., i0:i0 + bq, :].to(acc)
        lse_i = lse[..., i0:i0 + bq]
        finite = torch.isfinite(lse_i)
        lse_safe = torch.where(finite, lse_i, torch.zeros_like(lse_i)).unsqueeze(-1)
        last_key = s if not causal else min(s, i0 + bq + offset)
        for j0 in range(0, max(last_key, 0), block_k):
            kj, vj = k[..., j0:j0 + block_k, :].to(acc), v[..., j0:j0 + block_k, :].to(acc)
            scores = (qi @ kj.transpose(-1, -2)) * scale
            p = torch.exp(scores - lse_safe) * finite.unsqueeze(-1)  # recomputed probabilities
            if causal:
                rows = torch.arange(i0, i0 + bq, device=q.device)[:, None] + offset
                cols = torch.arange(j0, j0 + kj.shape[-2], device=q.device)[None, :]
                p = p.masked_fill(cols > rows, 0.0)
            dv[..., j0:j0 + kj.shape[-2], :] += p.transpose(-1, -2) @ do_i
            dp = do_i @ vj.transpose(-1, -2)  # (..., bq, bk)
            ds = p * (dp - delta[..., i0:i0 + bq].unsqueeze(-1))  # softmax (and log-sum-exp) backward
            dq[..., i0:i0 + bq, :] += ds @ kj * scale
            dk[..., j0:j0 + kj.shape[-2], :] += ds.transpose(-1, -2) @ qi * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class TiledAttention(torch.autograd.Function):
    """Tiled attention with a backward pass by recomputation from the saved log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, block_q, block_k):
        out, lse = _forward(q, k, v, causal, scale, block_q, block_k)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (causal, scale, block_q, block_k)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, out, lse, grad_out, grad_lse, *ctx.args)
        return dq, dk, dv, None, None, None, None


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    scale: float | None = None, block_q: int = 64, block_k: int = 64,
                    return_lse: bool = False):
    """``softmax(q k^T * scale) v`` computed in (block_q, block_k) tiles; differentiable.

    ``q`` (..., T, Dh), ``k`` (..., S, Dh), ``v`` (..., S, Dv). ``causal`` masks key j for
    query i when ``j > i + S - T`` (bottom-right alignment, as in a KV cache). With
    ``return_lse`` also returns the log-sum-exp of each row of scaled scores (..., T),
    ``-inf`` for a query that sees no key (whose output is 0).
    """
    _check(q, k, v, block_q, block_k)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    out, lse = TiledAttention.apply(q, k, v, bool(causal), scale, block_q, block_k)
    return (out, lse) if return_lse else out
