"""Mixed precision: what low-precision floats hold, where attention overflows, loss scaling (Chapter 15).

* fp16 (IEEE half) keeps 10 mantissa bits and 5 exponent bits: largest finite
  value 65,504, smallest normal 6.1e-5. bf16 keeps fp32's 8 exponent bits and
  7 mantissa bits: the range of fp32 with three significant digits.
  :func:`dtype_range` reads both from ``torch.finfo``.
* ``-1e9``, the usual mask fill, does not exist in fp16: ``masked_fill`` refuses
  it (``RuntimeError: value cannot be converted to type c10::Half without
  overflow``), and an additive mask built in fp32 and cast to fp16 (as models
  cast their masks to the activations' dtype) turns it into ``-inf``: a row whose
  keys are all masked then softmaxes to ``0 / 0 = NaN``. :func:`masked_softmax`
  fills with ``torch.finfo(dtype).min`` and gives such rows zeros, the convention
  of :func:`companion.attention.scaled_dot_product_attention`.
* Small gradients underflow to zero in fp16. Loss scaling (Micikevicius et al.,
  2018, section 3.2) multiplies the loss by ``S`` before ``backward`` and divides
  the gradients by ``S`` before the step; :class:`DynamicLossScaler` halves
  ``S`` and skips the step when a gradient overflowed, and doubles it after
  ``growth_interval`` clean steps (the rule of ``torch.amp.GradScaler``).

Shape legend: ..., T queries, S keys.
"""

from __future__ import annotations

import torch

from ._checks import check_positive_int

__all__ = ["dtype_range", "naive_masked_softmax", "masked_softmax", "DynamicLossScaler", "unscale_grads"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_float_dtype(dtype) -> None:
    if dtype not in _FLOATS:
        raise ValueError(f"dtype must be one of {[str(d) for d in _FLOATS]}, got {dtype}")


def dtype_range(dtype: torch.dtype) -> dict[str, float]:
    """``max`` (largest finite), ``smallest_normal``, ``eps`` (gap above 1) and mantissa ``bits`` of a float dtype."""
    _check_float_dtype(dtype)
    fi = torch.finfo(dtype)
    return {"max": float(fi.max), "smallest_normal": float(fi.smallest_normal), "eps": float(fi.eps),
            "bits": int(round(-torch.log2(torch.tensor(fi.eps, dtype=torch.float64)).item()))}


def _check_scores_mask(scores: torch.Tensor, mask: torch.Tensor) -> None:
    if not isinstance(scores, torch.Tensor) or not scores.is_floating_point():
        raise TypeError(f"scores must be a floating-point tensor (..., T, S), got {getattr(scores, 'dtype', type(scores).__name__)}")
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"mask must be a boolean tensor (True = may attend), got {getattr(mask, 'dtype', type(mask).__name__)}")
    try:
        torch.broadcast_shapes(mask.shape, scores.shape)
    except RuntimeError:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to scores {tuple(scores.shape)}") from None


def naive_masked_softmax(scores: torch.Tensor, mask: torch.Tensor, fill: float = -1e9) -> torch.Tensor:
    """The common idiom: an additive mask, 0 where allowed and ``fill`` elsewhere, cast to ``scores.dtype``.

    Shown to be unsafe: cast to fp16, ``-1e9`` becomes ``-inf`` and a row with no visible key gives NaN.
    """
    _check_scores_mask(scores, mask)
    additive = torch.where(mask, 0.0, fill).to(scores.dtype)  # fp32 -> the activations' dtype
    return (scores + additive).softmax(dim=-1)


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis of ``scores`` where ``mask`` is True, safe in every float dtype.

    Masked scores are set to ``torch.finfo(scores.dtype).min`` (finite in fp16),
    and a row with no visible key gets all-zero weights instead of NaN.
    """
    _check_scores_mask(scores, mask)
    weights = scores.masked_fill(~mask, torch.finfo(scores.dtype).min).softmax(dim=-1)
    empty = ~mask.any(dim=-1, keepdim=True)  # rows with no visible key
    return weights.masked_fill(empty, 0.0)


def unscale_grads(params, scale: float) -> bool:
    """Divide the gradients of ``params`` by ``scale`` in place; return True if any is inf or NaN."""
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale}")
    found_inf = False
    for p in params:
        if p.grad is None:
            continue
        p.grad.div_(scale)
        found_inf |= not bool(torch.isfinite(p.grad).all())
    return found_inf


class DynamicLossScaler:
    """Dynamic loss scaling: ``scale`` the loss, then :meth:`update` with whether a gradient overflowed.

    On an overflow the step is skipped and the scale multiplied by ``backoff_factor``;
    after ``growth_interval`` consecutive clean steps it is multiplied by
    ``growth_factor``. Defaults are ``torch.amp.GradScaler``'s (2**16, 2, 0.5, 2000).
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000) -> None:
        if not init_scale > 0:
            raise ValueError(f"init_scale must be positive, got {init_scale}")
        if not growth_factor > 1:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor}")
        if not 0 < backoff_factor < 1:
            raise ValueError(f"backoff_factor must lie in (0, 1), got {backoff_factor}")
        check_positive_int("growth_interval", growth_interval)
        self.scale = float(init_scale)
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.clean_steps = 0  # consecutive steps without overflow since the last change of scale

    def update(self, found_inf: bool) -> bool:
        """Record one step; returns True if the optimizer step should be taken (no overflow)."""
        if found_inf:
            self.scale *= self.backoff_factor
            self.clean_steps = 0
            return False
        self.clean_steps += 1
        if self.clean_steps == self.growth_interval:
            self.scale *= self.growth_factor
            self.clean_steps = 0
        return True

    def step(self, loss: torch.Tensor, params, optimizer: torch.optim.Optimizer) -> bool:
        """``backward`` of the scaled loss, unscale, step if finite, update the scale. Returns whether it stepped."""
        params = list(params)
        optimizer.zero_grad(set_to_none=True)
        (loss * self.scale).backward()
        ok = self.update(unscale_grads(params, self.scale))
        if ok:
            optimizer.step()
        return ok
