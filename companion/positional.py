"""Positional information: sinusoidal, learned, T5 relative buckets, RoPE and ALiBi (Chapter 3).

Attention by itself is permutation-equivariant: shuffle the tokens and the
outputs are shuffled the same way. Each scheme here tells the model where a
token is, in one of three places:

* added to the token embeddings (absolute): :func:`sinusoidal_encoding`
  (Vaswani et al., 2017, section 3.5) and :class:`LearnedPositionalEmbedding`
  (GPT-2, BERT);
* a rotation of queries and keys (relative through the dot product):
  :func:`apply_rope` (Su et al., 2021, RoFormer);
* a bias added to the attention scores (relative): T5's bucketed learned
  bias, :func:`relative_position_bucket` and :class:`RelativePositionBias`
  (Raffel et al., 2020, section 2.1), and ALiBi's fixed linear bias,
  :func:`alibi_slopes` and :func:`alibi_bias` (Press et al., 2022).

Shape legend: B batch, H heads, T query length, S key length, P positions,
D model size, Dh head size.

Relative positions are ``key position - query position`` (Hugging Face T5's
``memory_position - context_position``): negative for keys in the past.
When ``S > T`` (decoding with a cache) the queries are the last ``T`` of the
``S`` positions, as in :func:`companion.masks.causal_mask`.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from ._checks import ShapeChecker, check_positive_int

__all__ = [
    "sinusoidal_encoding",
    "sinusoidal_shift_matrix",
    "LearnedPositionalEmbedding",
    "relative_positions",
    "relative_position_bucket",
    "RelativePositionBias",
    "rope_frequencies",
    "llama3_rope_frequencies",
    "rope_cos_sin",
    "rotate_half",
    "rotate_every_two",
    "apply_rope",
    "rope_permutation",
    "alibi_slopes",
    "alibi_bias",
]

RopeLayout = Literal["half", "interleaved"]


def _check_even(name: str, value: int) -> int:
    check_positive_int(name, value)
    if value % 2:
        raise ValueError(f"{name} must be even (features come in sin/cos pairs), got {value}")
    return value


def _check_base(base: float) -> float:
    if not isinstance(base, (int, float)) or isinstance(base, bool) or base <= 1:
        raise ValueError(f"base must be a number > 1, got {base!r}")
    return float(base)


# ---------------------------------------------------------------- sinusoidal

def sinusoidal_encoding(n_positions: int, d_model: int, *, base: float = 10000.0) -> torch.Tensor:
    """The fixed encoding of Vaswani et al. (2017), section 3.5: shape ``(P, D)``.

    ``PE[p, 2i] = sin(p * w_i)`` and ``PE[p, 2i+1] = cos(p * w_i)`` with
    ``w_i = base^(-2i / D)``: pair ``i`` is a point on the unit circle turning
    with angular frequency ``w_i``, from one radian per position (``i = 0``)
    down to about ``1 / base``.
    """
    check_positive_int("n_positions", n_positions)
    _check_even("d_model", d_model)
    base = _check_base(base)
    freqs = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (D/2,)
    angles = torch.arange(n_positions, dtype=torch.float64)[:, None] * freqs  # (P, D/2)
    pe = torch.empty(n_positions, d_model, dtype=torch.float64)
    pe[:, 0::2] = angles.sin()
    pe[:, 1::2] = angles.cos()
    return pe.float()  # computed in float64 so that large positions stay accurate


def sinusoidal_shift_matrix(k: int, d_model: int, *, base: float = 10000.0) -> torch.Tensor:
    """The ``(D, D)`` matrix ``R_k`` with ``PE[p + k] = R_k @ PE[p]`` for every position ``p``.

    ``R_k`` is block diagonal: block ``i`` is the 2x2 rotation
    ``[[cos(k w_i), sin(k w_i)], [-sin(k w_i), cos(k w_i)]]`` acting on
    ``(sin(p w_i), cos(p w_i))``, by the angle-addition formulas. It depends on
    the offset ``k`` only, not on ``p``: a shift is a rotation, not an addition.
    """
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int offset, got {type(k).__name__}")
    _check_even("d_model", d_model)
    base = _check_base(base)
    freqs = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (D/2,)
    c, s = (k * freqs).cos(), (k * freqs).sin()
    r = torch.zeros(d_model, d_model, dtype=torch.float64)
    idx = torch.arange(0, d_model, 2)
    r[idx, idx], r[idx, idx + 1] = c, s  # sin(a + b) = sin a cos b + cos a sin b
    r[idx + 1, idx], r[idx + 1, idx + 1] = -s, c  # cos(a + b) = cos a cos b - sin a sin b
    return r.float()


# ---------------------------------------------------------------- learned

class LearnedPositionalEmbedding(nn.Module):
    """A trained table of ``max_positions`` vectors, one per absolute position (GPT-2, BERT).

    ``forward(t)`` returns the first ``t`` rows, shape ``(T, D)``. A position
    at or beyond ``max_positions`` has no row: the module raises a
    ``ValueError`` instead of extrapolating, because there is nothing to look up.
    """

    def __init__(self, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.max_positions = check_positive_int("max_positions", max_positions)
        self.weight = nn.Parameter(torch.randn(max_positions, check_positive_int("d_model", d_model)) * 0.02)

    def forward(self, t: int, *, offset: int = 0) -> torch.Tensor:
        check_positive_int("t", t)
        if offset < 0 or offset + t > self.max_positions:
            raise ValueError(
                f"positions {offset}..{offset + t - 1} requested, but the table only has positions "
                f"0..{self.max_positions - 1}: learned absolute embeddings cannot index beyond their table"
            )
        return self.weight[offset:offset + t]  # (T, D)


# ---------------------------------------------------------------- T5 relative bias

def relative_positions(t: int, s: int | None = None, *, device: torch.device | str | None = None) -> torch.Tensor:
    """``(T, S)`` integer matrix of ``key position - query position``, queries being the last ``T`` positions."""
    check_positive_int("t", t)
    s = t if s is None else check_positive_int("s", s)
    if s < t:
        raise ValueError(f"need at least as many keys as queries, got t={t}, s={s}")
    query = torch.arange(s - t, s, device=device)[:, None]  # (T, 1)
    key = torch.arange(s, device=device)[None, :]  # (1, S)
    return key - query  # (T, S)


def relative_position_bucket(
    relative_position: torch.Tensor,
    *,
    bidirectional: bool = True,
    n_buckets: int = 32,
    max_distance: int = 128,
) -> torch.Tensor:
    """T5's bucket index of each relative position (Raffel et al., 2020; Mesh TensorFlow).

    Bidirectional (encoder): half the buckets are for keys before the query
    (and the query itself), half for keys after it. Causal (decoder): keys after the query
    count as distance 0, and all buckets go to the past. Within a direction,
    with ``n`` buckets: distances ``0 .. n/2 - 1`` get one bucket each; larger
    distances share ``n/2`` buckets spaced logarithmically up to
    ``max_distance``; every distance ``>= max_distance`` falls in the last bucket.

    Args:
        relative_position: integer tensor of ``key - query`` positions, any shape.
        bidirectional: encoder (True) or decoder (False) buckets.
        n_buckets: total number of buckets (T5 uses 32).
        max_distance: distance from which all positions share the last bucket (T5: 128).

    Returns:
        ``torch.long`` tensor of the same shape, values in ``[0, n_buckets)``.
    """
    if not isinstance(relative_position, torch.Tensor) or relative_position.dtype.is_floating_point:
        got = relative_position.dtype if isinstance(relative_position, torch.Tensor) else type(relative_position).__name__
        raise TypeError(f"relative_position must be an integer tensor, got {got}")
    check_positive_int("n_buckets", n_buckets)
    check_positive_int("max_distance", max_distance)
    rel = relative_position.long()
    bucket = torch.zeros_like(rel)
    n = n_buckets
    if bidirectional:
        n //= 2
        bucket = bucket + (rel > 0).long() * n  # keys after the query use the upper half
        distance = rel.abs()
    else:
        distance = (-rel).clamp(min=0)  # future keys (masked anyway) count as distance 0
    max_exact = n // 2
    if max_exact < 1:
        raise ValueError(f"n_buckets={n_buckets} is too small: need at least {4 if bidirectional else 2}")
    if max_distance <= max_exact:
        raise ValueError(f"max_distance must exceed the {max_exact} exact buckets, got {max_distance}")
    # The same float32 arithmetic as Mesh TensorFlow / HF, so bucket edges agree exactly.
    log_ratio = torch.log(distance.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (log_ratio * (n - max_exact)).long()).clamp(max=n - 1)
    return bucket + torch.where(distance < max_exact, distance, large)


class RelativePositionBias(nn.Module):
    """T5's learned relative position bias: one scalar per (bucket, head), added to the scores.

    T5 computes it in the first layer of each stack and reuses it in every
    layer; it replaces absolute positions altogether. ``forward(t, s)``
    returns ``(1, H, T, S)``, to be added to ``q k^T`` before the softmax.
    """

    def __init__(self, n_heads: int, *, bidirectional: bool = True, n_buckets: int = 32, max_distance: int = 128) -> None:
        super().__init__()
        self.n_heads = check_positive_int("n_heads", n_heads)
        self.bidirectional, self.n_buckets, self.max_distance = bidirectional, n_buckets, max_distance
        relative_position_bucket(torch.zeros(1, dtype=torch.long), bidirectional=bidirectional,
                                 n_buckets=n_buckets, max_distance=max_distance)  # validate the sizes now
        self.relative_attention_bias = nn.Embedding(n_buckets, n_heads)  # HF T5's name for the table

    def forward(self, t: int, s: int | None = None) -> torch.Tensor:
        rel = relative_positions(t, s, device=self.relative_attention_bias.weight.device)  # (T, S)
        buckets = relative_position_bucket(rel, bidirectional=self.bidirectional,
                                           n_buckets=self.n_buckets, max_distance=self.max_distance)
        bias = self.relative_attention_bias(buckets)  # (T, S, H)
        return bias.permute(2, 0, 1)[None]  # (1, H, T, S)


# ---------------------------------------------------------------- RoPE

def rope_frequencies(d_head: int, *, base: float = 10000.0) -> torch.Tensor:
    """The ``Dh / 2`` angular frequencies ``theta_i = base^(-2i / Dh)`` of RoPE (Su et al., 2021)."""
    _check_even("d_head", d_head)
    return _check_base(base) ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)  # (Dh/2,)


def llama3_rope_frequencies(
    d_head: int,
    *,
    base: float = 500000.0,
    factor: float = 8.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_max_positions: int = 8192,
) -> torch.Tensor:
    """RoPE's ``Dh / 2`` frequencies as Llama 3.1 rescales them for a longer context (``rope_type="llama3"``).

    With wavelengths ``2 pi / theta_i`` and ``L = original_max_positions`` (the context
    the model was first trained on): a frequency whose wavelength is shorter than
    ``L / high_freq_factor`` is kept; one whose wavelength is longer than
    ``L / low_freq_factor`` is divided by ``factor``; in between, the two are mixed
    linearly in ``s = (L / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)``:
    ``(1 - s) theta / factor + s theta``. The defaults are Llama 3.1's (Hugging Face
    ``transformers``, ``modeling_rope_utils._compute_llama3_parameters``).
    """
    for name, value in (("factor", factor), ("low_freq_factor", low_freq_factor), ("high_freq_factor", high_freq_factor)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    if not high_freq_factor > low_freq_factor:
        raise ValueError(f"high_freq_factor must exceed low_freq_factor, got {high_freq_factor} and {low_freq_factor}")
    check_positive_int("original_max_positions", original_max_positions)
    theta = rope_frequencies(d_head, base=base)  # (Dh/2,)
    wavelength = 2 * math.pi / theta
    scaled = torch.where(wavelength > original_max_positions / low_freq_factor, theta / factor, theta)
    s = (original_max_positions / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    medium = (wavelength >= original_max_positions / high_freq_factor) & (wavelength <= original_max_positions / low_freq_factor)
    return torch.where(medium, (1 - s) * scaled / factor + s * scaled, scaled)  # (Dh/2,)


def rope_cos_sin(
    positions: torch.Tensor | int,
    d_head: int,
    *,
    base: float = 10000.0,
    layout: RopeLayout = "half",
    frequencies: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosines and sines of the rotation angles ``p * theta_i``, each of shape ``(T, Dh)``.

    ``positions`` is an int ``T`` (positions ``0 .. T-1``), a 1-D integer tensor
    ``(T,)``, or one row of positions per sequence ``(B, T)`` (left-padded
    batches); the result then has shape ``(B, T, Dh)``.
    ``layout="half"`` repeats the ``Dh/2`` angles as ``[a, a]`` (GPT-NeoX, HF
    Llama); ``"interleaved"`` as ``[a0, a0, a1, a1, ...]`` (RoFormer, GPT-J).
    ``frequencies`` ``(Dh/2,)`` replaces :func:`rope_frequencies` (``base`` is then
    unused): :func:`llama3_rope_frequencies` for Llama 3.1's rescaled RoPE.
    """
    if isinstance(positions, int) and not isinstance(positions, bool):
        positions = torch.arange(check_positive_int("positions", positions))
    if isinstance(positions, torch.Tensor) and positions.dim() == 2:
        ShapeChecker().check("positions", positions, ("B", "T"))
    else:
        ShapeChecker().check("positions", positions, ("T",))
    if layout not in ("half", "interleaved"):
        raise ValueError(f"layout must be 'half' or 'interleaved', got {layout!r}")
    device = positions.device
    work = torch.device("cpu") if device.type == "mps" else device  # float64 angles; MPS has no float64
    if frequencies is None:
        freqs = rope_frequencies(d_head, base=base)
    else:
        _check_even("d_head", d_head)
        ShapeChecker().check("frequencies", frequencies, (d_head // 2,))
        freqs = frequencies
    freqs = freqs.to(work, torch.float64)  # (Dh/2,)
    angles = positions.to(work, torch.float64)[..., None] * freqs  # (..., T, Dh/2)
    angles = torch.cat((angles, angles), dim=-1) if layout == "half" else angles.repeat_interleave(2, dim=-1)  # (..., T, Dh)
    return angles.cos().float().to(device), angles.sin().float().to(device)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last axis: pairs are ``(i, i + Dh/2)`` (GPT-NeoX, HF Llama)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """``(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)``: pairs are ``(2i, 2i+1)`` (RoFormer, GPT-J)."""
    pairs = x.unflatten(-1, (-1, 2))  # (..., Dh/2, 2)
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)  # (..., Dh)


def apply_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: RopeLayout = "half",
) -> torch.Tensor:
    """Rotate each feature pair of ``x`` by its angle: ``x * cos + rotate(x) * sin`` (Su et al., 2021).

    Args:
        x: queries or keys, shape ``(..., T, Dh)`` (usually ``(B, H, T, Dh)``).
        cos, sin: from :func:`rope_cos_sin` with the same ``layout``, shape ``(T, Dh)``,
            or ``(..., T, Dh)`` broadcastable to ``x`` (one row of positions per
            sequence: ``(B, 1, T, Dh)`` for ``x`` of shape ``(B, H, T, Dh)``).
        layout: which features form a pair, ``"half"`` or ``"interleaved"``.

    Returns:
        The rotated tensor, same shape as ``x``. Applied to both ``q`` (at
        position ``m``) and ``k`` (at ``n``), it makes ``q . k`` a function of
        ``n - m`` only, because ``R_m^T R_n = R_{n-m}``.
    """
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise ValueError(f"x must be a tensor of shape (..., T, Dh), got {getattr(x, 'shape', type(x).__name__)}")
    sc = ShapeChecker()
    sc.check("x[..., T, Dh]", x[(0,) * (x.dim() - 2)], ("T", "Dh"))
    for name, c in (("cos", cos), ("sin", sin)):
        if isinstance(c, torch.Tensor) and c.dim() > 2:  # per-sequence angles: (..., T, Dh), broadcast over heads
            sc.check(f"{name}[..., T, Dh]", c[(0,) * (c.dim() - 2)], ("T", "Dh"))
            try:
                fits = torch.broadcast_shapes(c.shape, x.shape) == x.shape
            except RuntimeError:
                fits = False
            if not fits:
                raise ValueError(f"{name} of shape {tuple(c.shape)} does not broadcast to x of shape {tuple(x.shape)}")
        else:
            sc.check(name, c, ("T", "Dh"))
    _check_even("Dh", x.shape[-1])
    if layout == "half":
        rotated = rotate_half(x)
    elif layout == "interleaved":
        rotated = rotate_every_two(x)
    else:
        raise ValueError(f"layout must be 'half' or 'interleaved', got {layout!r}")
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def rope_permutation(d_head: int) -> torch.Tensor:
    """The feature permutation that turns the interleaved layout into the half layout.

    With ``perm = rope_permutation(Dh)``:
    ``apply_rope(x[..., perm], layout="half") == apply_rope(x, layout="interleaved")[..., perm]``.
    Interleaved pair ``(2i, 2i+1)`` becomes half pair ``(i, i + Dh/2)``.
    """
    _check_even("d_head", d_head)
    return torch.cat((torch.arange(0, d_head, 2), torch.arange(1, d_head, 2)))  # (Dh,)


# ---------------------------------------------------------------- ALiBi

def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's head slopes ``m_h`` (Press et al., 2022, section 3), shape ``(H,)``.

    For ``H`` a power of two: the geometric sequence starting at ``2^(-8/H)``
    with that same ratio, ``2^(-8/H), 2^(-16/H), ..., 2^(-8)`` (the paper
    states this rule for any ``H``, but trains only 8 and 16 heads). Otherwise
    as in the authors' released code, which BLOOM follows: the slopes of the
    closest smaller power of two ``n``, followed by the first ``H - n`` of
    every other slope of the sequence for ``2n`` heads (its 1st, 3rd, 5th, ...).
    """
    check_positive_int("n_heads", n_heads)

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    n = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(n)
    if n < n_heads:
        slopes += power_of_two(2 * n)[0::2][: n_heads - n]  # indices 0, 2, ... = exponents 1, 3, 5, ...
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(n_heads: int, t: int, s: int | None = None, *, device: torch.device | str | None = None) -> torch.Tensor:
    """ALiBi's bias ``-m_h * |key - query|``, shape ``(H, T, S)``, added to the scores.

    No parameters are learned. For a causal model the future half is masked
    anyway; the symmetric ``|key - query|`` keeps the function defined there.
    """
    rel = relative_positions(t, s, device=device)  # (T, S)
    slopes = alibi_slopes(n_heads).to(device)  # (H,)
    return -slopes[:, None, None] * rel.abs().float()  # (H, T, S)
