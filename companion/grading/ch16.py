"""Checks for the Chapter 16 exercises (today's decoders: the pieces of a Llama block, then the block).

Each exercise goes past the chapter's code: 16.1 RMSNorm that survives float16, 16.2 rotary
positions at given positions (a cache offset, one row per sequence) with Llama 3.1's rescaled
frequencies, 16.3 the feed-forward width rule of Meta's releases (``ffn_dim_multiplier``) and the
SwiGLU module, 16.4 grouped-query attention of T new queries over S cached keys; 16.5 assembles
the block.

References: :func:`companion.blocks.rms_norm` in float64 (16.1), :func:`companion.positional.rope_cos_sin`
with :func:`~companion.positional.llama3_rope_frequencies` and
:func:`~companion.positional.apply_rope` in the half layout (16.2), Meta's width formula written
here and :class:`companion.blocks.GatedFeedForward` with SiLU (16.3), a float64 masked softmax after
:func:`companion.attention.repeat_kv` (16.4), and the block of :mod:`companion.models.llama` (16.5).

Each case also compares the answer with the wrong answers a learner is likely
to write (an overflowing float16 square, positions ignored, unsmoothed scaling, rounding to the
nearest multiple, a top-left causal mask, ``repeat`` instead of ``repeat_interleave``...) and,
when it matches one, says which.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import repeat_kv
from ..blocks import GatedFeedForward, rms_norm
from ..models.llama import LlamaBlock, LlamaConfig
from ..positional import apply_rope, llama3_rope_frequencies, rope_cos_sin, rope_frequencies
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, register, run_student


def _matches(got, want, atol=1e-4) -> bool:
    """Whether a student's result equals ``want`` (used to name the wrong answer it matches)."""
    return (isinstance(got, torch.Tensor) and got.shape == want.shape
            and bool(torch.allclose(got.detach().to("cpu", torch.float64), want.to(torch.float64), atol=atol, rtol=1e-4)))


# ----------------------------------------------------------------- 16.1 RMSNorm, safe in float16


def _rms_want(x, w, eps):
    """Hugging Face's order: normalise in float64 here (float32 there), cast to x's dtype, then the weight."""
    return w * rms_norm(x.double(), None, eps).to(x.dtype)


def _rms_random(student):
    x = torch.randn(2, 7, 13) * 2 + 0.3
    w = torch.randn(13)
    expect_tensor(student(x, w, 1e-6), rms_norm(x, w, 1e-6), name="rms_norm(x of shape (2, 7, 13), w, eps=1e-6)")


def _rms_eps(student):
    x = torch.randn(3, 8) * 1e-3  # mean(x^2) is about 1e-6: eps = 1e-5 dominates it
    w = torch.rand(8) + 0.5
    got = student(x, w, 1e-5)
    if _matches(got, rms_norm(x, w, 0.0)):
        raise CheckFailed("the output ignores eps: for rows this small (RMS about 1e-3) eps = 1e-5 must change "
                          "the result; divide by sqrt(mean(x^2) + eps)")
    outside = x / (x.pow(2).mean(-1, keepdim=True).sqrt() + 1e-5) * w
    if _matches(got, outside, atol=1e-6):
        raise CheckFailed("eps is added outside the square root (x / (sqrt(mean(x^2)) + eps)); "
                          "RMSNorm adds it inside: x / sqrt(mean(x^2) + eps)")
    expect_tensor(got, rms_norm(x, w, 1e-5), name="rms_norm of tiny rows (RMS about 1e-3) with eps=1e-5", atol=1e-6)


def _rms_no_mean(student):
    x = torch.randn(4, 11) + 5.0  # every row shifted by a constant
    w = torch.rand(11) + 0.5
    got = student(x, w, 1e-6)
    if _matches(got, F.layer_norm(x, (11,), w, None, 1e-6)):
        raise CheckFailed("the output equals LayerNorm (the mean was subtracted); RMSNorm divides x by its root "
                          "mean square and never subtracts the mean")
    expect_tensor(got, rms_norm(x, w, 1e-6), name="rms_norm of rows with mean 5")


def _rms_dtype(student):
    x64, w64 = torch.randn(3, 9, dtype=torch.float64), torch.randn(9, dtype=torch.float64)
    expect_tensor(student(x64, w64, 1e-6), rms_norm(x64, w64, 1e-6), name="rms_norm in float64")
    x16, w16 = torch.randn(2, 5, 16).to(torch.bfloat16), (torch.rand(16) + 0.5).to(torch.bfloat16)
    expect_tensor(student(x16, w16, 1e-6), _rms_want(x16, w16, 1e-6), name="rms_norm in bfloat16 (tolerance 2e-2)",
                  atol=2e-2, rtol=2e-2)


def _rms_float16(student):
    g = torch.Generator().manual_seed(16)
    x = (torch.randn(2, 6, 64, generator=g) * 300).half()  # activations of a few hundred: x^2 passes 65504
    w = (torch.rand(64, generator=g) + 0.5).half()
    got = student(x, w, 1e-6)
    name = "rms_norm in float16 of activations of a few hundred (tolerance 1e-2)"
    if isinstance(got, torch.Tensor) and got.shape == x.shape and got.numel() and bool((got == 0).all()):
        raise CheckFailed(f"{name} is 0 everywhere: x ** 2 overflows float16 (largest value 65504, so |x| > 256 "
                          "gives inf, and x * rsqrt(inf) = 0); square and average in float32, then cast back")
    expect_tensor(got, _rms_want(x, w, 1e-6), name=name, atol=1e-2, rtol=1e-2)


register(Exercise(
    id="16.1",
    title="RMSNorm as a function, safe in float16",
    targets=("rms_norm",),
    forbidden=("companion.blocks", "torch.nn.functional.rms_norm", "torch.nn.RMSNorm"),  # the reference itself
    cases=(
        Case("random x and weight (2, 7, 13)", 1, _rms_random),
        Case("eps inside the square root matters for tiny rows", 1, _rms_eps),
        Case("does not subtract the mean (rows shifted by 5)", 1, _rms_no_mean),
        Case("keeps the input's dtype (float64, bfloat16)", 1, _rms_dtype),
        Case("float16 activations of a few hundred do not overflow", 1, _rms_float16),
    ),
))


# ----------------------------------------------------------------- 16.2 rotary positions: given positions, Llama 3.1


def _llama3_freqs(d, base, scaling, *, kind="llama3"):
    """The ``Dh/2`` frequencies under Llama 3.1's scaling (``kind="llama3"``) or a wrong rule a learner may write."""
    theta = rope_frequencies(d, base=base)  # (Dh/2,) float64
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    length = scaling["original_max_position_embeddings"]
    if kind == "llama3":
        return llama3_rope_frequencies(d, base=base, factor=factor, low_freq_factor=low, high_freq_factor=high,
                                       original_max_positions=length)
    wavelength = 2 * math.pi / theta
    if kind == "all":  # every frequency divided (position interpolation)
        return theta / factor
    if kind == "step":  # no smooth band: divided above length / low_freq_factor, kept below
        return torch.where(wavelength > length / low, theta / factor, theta)
    s = (length / wavelength - low) / (high - low)  # kind == "swapped": the two weights of the mix exchanged
    medium = (wavelength >= length / high) & (wavelength <= length / low)
    outside = torch.where(wavelength > length / low, theta / factor, theta)
    return torch.where(medium, s * theta / factor + (1 - s) * theta, outside)


def _rotary(x, positions, base=10000.0, scaling=None, *, kind="llama3", heads_axis=True):
    """Reference: half layout, any integer positions (T,) or (B, T), Llama 3.1's frequencies when scaling is given."""
    d = x.shape[-1]
    freqs = None if scaling is None else _llama3_freqs(d, base, scaling, kind=kind)
    cos, sin = rope_cos_sin(positions, d, base=base, frequencies=freqs)  # (T, Dh) or (B, T, Dh)
    if positions.dim() == 2:  # one row of positions per sequence: broadcast over the heads
        cos, sin = (cos[:, None], sin[:, None]) if heads_axis else (cos[None], sin[None])
    return apply_rope(x, cos, sin)


def _rotary_wrong(got, cases, what):
    for text, want in cases:
        if _matches(got, want):
            raise CheckFailed(f"{what}: {text}")


def _rot_inputs(shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _rope_plain(student):
    x = _rot_inputs((2, 3, 7, 12), 20)
    pos = torch.arange(7)
    expect_tensor(student(x, pos, 10000.0), _rotary(x, pos), name="apply_rotary(x (2, 3, 7, 12), arange(7), 10000)")
    x = _rot_inputs((1, 2, 9, 8), 21)
    got = student(x, torch.arange(9), 500000.0)
    _rotary_wrong(got, [("the result is the one for base 10000 although base=500000 was passed; compute the "
                         "frequencies base ** (-2i / Dh) from the argument", _rotary(x, torch.arange(9)))],
                  "apply_rotary(x, arange(9), base=500000)")
    expect_tensor(got, _rotary(x, torch.arange(9), 500000.0), name="apply_rotary(x (1, 2, 9, 8), arange(9), 500000)")


def _rope_offset(student):
    x = _rot_inputs((2, 2, 4, 8), 22)
    pos = torch.arange(5, 9)  # four new tokens after five cached ones
    got = student(x, pos, 10000.0)
    what = "apply_rotary(x (2, 2, 4, 8), positions 5..8)"
    _rotary_wrong(got, [("the rotation is the one for positions 0..3: use the positions given, not arange(T)",
                         _rotary(x, torch.arange(4))),
                        ("the positions are 4..7, one too low (off by one)", _rotary(x, pos - 1))], what)
    expect_tensor(got, _rotary(x, pos), name=what)


def _rope_batch_positions(student):
    x = _rot_inputs((2, 2, 3, 4), 24)  # B = H = 2: a missing head axis broadcasts without an error
    pos = torch.tensor([[0, 1, 2], [4, 5, 6]])
    got = student(x, pos, 10000.0)
    what = "apply_rotary(x (2, 2, 3, 4), positions of shape (2, 3))"
    first_row = ("every sequence was rotated with the positions of the first row; row b of positions belongs to "
                 "sequence b", _rotary(x, pos[0]))
    _rotary_wrong(got, [first_row, ("head h of every sequence got the positions of row h: cos and sin of shape "
                                    "(B, T, Dh) broadcast against x (B, H, T, Dh) along the heads axis; give them a "
                                    "head axis, cos[:, None]", _rotary(x, pos, heads_axis=False))], what)
    expect_tensor(got, _rotary(x, pos), name=what)
    x = _rot_inputs((3, 2, 5, 8), 23)  # B = 3 sequences, H = 2 heads
    pos = torch.tensor([[0, 1, 2, 3, 4], [1, 1, 0, 1, 2], [7, 8, 9, 10, 11]])  # row 1 left-padded by two
    got = student(x, pos, 10000.0)
    what = "apply_rotary(x (3, 2, 5, 8), positions of shape (3, 5))"
    _rotary_wrong(got, [(first_row[0], _rotary(x, pos[0]))], what)
    expect_tensor(got, _rotary(x, pos), name=what)


LLAMA31_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}  # Llama 3.1 8B/70B/405B
BANDS_SCALING = {"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 400}


def _rope_scaling_named(got, x, pos, base, scaling, what):
    _rotary_wrong(got, [
        ("the frequencies are not rescaled (scaling ignored)", _rotary(x, pos, base)),
        ("every frequency is divided by factor (plain position interpolation); Llama 3.1 keeps the high "
         "frequencies, divides only those whose wavelength exceeds L / low_freq_factor, and mixes in between",
         _rotary(x, pos, base, scaling, kind="all")),
        ("the band between L / high_freq_factor and L / low_freq_factor is not smoothed: there the frequency is "
         "(1 - s) theta / factor + s theta with s = (L / wavelength - low_freq_factor) / (high_freq_factor - "
         "low_freq_factor)", _rotary(x, pos, base, scaling, kind="step")),
        ("the two weights of the smooth band are exchanged: (1 - s) goes with theta / factor, s with theta",
         _rotary(x, pos, base, scaling, kind="swapped")),
    ], what)


def _rope_llama31(student):
    x = _rot_inputs((1, 2, 6, 128), 25)
    pos = torch.tensor([0, 1, 300, 1000, 2500, 4000])
    got = student(x, pos, 500000.0, dict(LLAMA31_SCALING))
    what = "apply_rotary(x (1, 2, 6, 128), positions up to 4000, base 500000, Llama 3.1's scaling)"
    _rope_scaling_named(got, x, pos, 500000.0, LLAMA31_SCALING, what)
    expect_tensor(got, _rotary(x, pos, 500000.0, LLAMA31_SCALING), name=what, atol=2e-3)


def _rope_bands(student):
    x = _rot_inputs((2, 1, 6, 10), 26)  # wavelengths 6, 35 (kept), 190 (smoothed), 1041, 5719 (divided)
    pos = torch.tensor([0, 5, 31, 90, 250, 399])
    got = student(x, pos, 5000.0, dict(BANDS_SCALING))
    what = ("apply_rotary(x (2, 1, 6, 10), base 5000, factor 4, low/high_freq_factor 1/4, "
            "original_max_position_embeddings 400)")
    _rope_scaling_named(got, x, pos, 5000.0, BANDS_SCALING, what)
    expect_tensor(got, _rotary(x, pos, 5000.0, BANDS_SCALING), name=what)


register(Exercise(
    id="16.2",
    title="Rotary positions at given positions, with Llama 3.1's scaling",
    targets=("apply_rotary",),
    forbidden=("companion.positional", "companion.attention", "companion.models"),  # the reference itself
    cases=(
        Case("positions 0..T-1, bases 10000 and 500000", 1, _rope_plain),
        Case("a cache offset: positions 5..8", 1, _rope_offset),
        Case("one row of positions per sequence (B, T)", 2, _rope_batch_positions),
        Case("Llama 3.1's scaling (factor 8, 8192 positions, Dh = 128)", 1, _rope_llama31),
        Case("the three bands: kept, smoothed, divided", 2, _rope_bands),
    ),
))


# ----------------------------------------------------------------- 16.3 the feed-forward width of Meta's Llamas


def _width(d_model, multiple_of, multiplier=None, *, kind="meta"):
    """Meta's rule (``kind="meta"``) or a wrong one a learner may write."""
    if kind == "float":  # no int() truncations
        h = 2 * 4 * d_model / 3 * (1 if multiplier is None else multiplier)
        return multiple_of * math.ceil(h / multiple_of)
    h = int(2 * 4 * d_model / 3)
    if kind == "after":  # the multiplier applied after the rounding
        h = multiple_of * ((h + multiple_of - 1) // multiple_of)
        return int(h * multiplier) if multiplier is not None else h
    if multiplier is not None and kind != "ignored":
        h = int(multiplier * h)
    if kind == "nearest":
        return multiple_of * round(h / multiple_of)
    if kind == "down":
        return multiple_of * (h // multiple_of)
    if kind == "bump":  # one multiple more even when h is already a multiple
        return multiple_of * (h // multiple_of + 1)
    return multiple_of * ((h + multiple_of - 1) // multiple_of)


_WIDTH_WRONG = {
    "ignored": "ffn_dim_multiplier is ignored",
    "nearest": "the width is rounded to the nearest multiple of multiple_of; Meta's code rounds up",
    "down": "the width is rounded down; Meta's code rounds up to a multiple of multiple_of",
    "bump": "a width that is already a multiple of multiple_of was rounded up once more; round up with "
            "multiple_of * ((h + multiple_of - 1) // multiple_of)",
    "after": "the multiplier is applied after the rounding; Meta's code multiplies first, then rounds up",
    "float": "the width is not truncated to an int after 2/3 and after the multiplier (int(), as Meta's code does)",
}


def _width_case(width, d_model, multiple_of, multiplier, name):
    call = (f"swiglu_width({d_model}, {multiple_of})" if multiplier is None
            else f"swiglu_width({d_model}, {multiple_of}, {multiplier})")
    got = width(d_model, multiple_of) if multiplier is None else width(d_model, multiple_of, multiplier)
    want = _width(d_model, multiple_of, multiplier)
    if isinstance(got, bool) or not isinstance(got, int):
        raise CheckFailed(f"{call} ({name}) should be an int, {want}; got {got!r} of type {type(got).__name__}")
    if got != want:
        for kind, text in _WIDTH_WRONG.items():
            if got == _width(d_model, multiple_of, multiplier, kind=kind):
                raise CheckFailed(f"{call} ({name}) should be {want}, got {got}: {text}")
        raise CheckFailed(f"{call} ({name}) should be {want}, got {got}")


# (d_model, multiple_of, ffn_dim_multiplier) -> the hidden width of the released checkpoints
LLAMA1_WIDTHS = {"LLaMA 7B": (4096, 256, None, 11008), "LLaMA 13B": (5120, 256, None, 13824)}
LLAMA3_WIDTHS = {  # Meta's llama-models: models/sku_list.py (model_args of Llama 3 and 3.1)
    "Llama 3 8B": (4096, 1024, 1.3, 14336), "Llama 3 70B": (8192, 4096, 1.3, 28672),
    "Llama 3.1 405B": (16384, 4096, 1.2, 53248),
}
# Small sizes where each wrong order of the roundings gives another number
ROUNDING_WIDTHS = {"exactly a multiple": (96, 64, None), "rounded up, not to the nearest": (100, 64, None),
                   "multiplier before the rounding": (100, 32, 1.5), "int() after the multiplier": (10, 1, 1.3)}


def _width_llama1(width, cls):
    for name, (d, m, mult, _) in LLAMA1_WIDTHS.items():
        _width_case(width, d, m, mult, name)


def _width_llama3(width, cls):
    for name, (d, m, mult, _) in LLAMA3_WIDTHS.items():
        _width_case(width, d, m, mult, name)


def _width_rounding(width, cls):
    for name, (d, m, mult) in ROUNDING_WIDTHS.items():
        _width_case(width, d, m, mult, name)


_SHAPES = {"gate": "(d_ff, d_model)", "up": "(d_ff, d_model)", "down": "(d_model, d_ff)"}


def _build_swiglu(cls, d_model, d_ff):
    torch.manual_seed(3)
    ffn = cls(d_model, d_ff)
    want = {"gate": (d_ff, d_model), "up": (d_ff, d_model), "down": (d_model, d_ff)}
    for name, shape in want.items():
        sub = getattr(ffn, name, None)
        if not isinstance(sub, nn.Linear):
            raise CheckFailed(f"SwiGLU(d_model, d_ff) must have an nn.Linear named {name}, got {type(sub).__name__}")
        if tuple(sub.weight.shape) != shape:
            raise CheckFailed(f"{name}.weight should have shape {_SHAPES[name]} = {shape}, got {tuple(sub.weight.shape)}")
        if sub.bias is not None:
            raise CheckFailed(f"{name} has a bias; Llama's feed-forward layers have none (bias=False)")
    return ffn


def _reference_swiglu(ffn, d_model, d_ff):
    ref = GatedFeedForward(d_model, d_ff, activation="silu", bias=False)
    ref.load_state_dict(ffn.state_dict())
    return ref


def _swiglu_matches(width, cls):
    ffn = _build_swiglu(cls, 13, 35)
    ref = _reference_swiglu(ffn, 13, 35)
    x = torch.randn(2, 7, 13)
    with torch.no_grad():
        expect_tensor(ffn(x), ref(x), name="SwiGLU(13, 35) on x of shape (2, 7, 13)")


def _swiglu_gated_silu(width, cls):
    ffn = _build_swiglu(cls, 10, 27)
    ref = _reference_swiglu(ffn, 10, 27)
    x = torch.randn(3, 5, 10) * 2
    with torch.no_grad():
        got = ffn(x)
        g, u = ref.gate(x), ref.up(x)
        wrong = {
            "down(gelu(gate(x)) * up(x)): the gate uses GELU (that is GEGLU); SwiGLU's gate is SiLU":
                ref.down(F.gelu(g) * u),
            "down(gelu(gate(x)) * up(x)) with GELU's tanh approximation (GEGLU); SwiGLU's gate is SiLU":
                ref.down(F.gelu(g, approximate="tanh") * u),
            "down(silu(up(x)) * gate(x)): SiLU is applied to up instead of gate": ref.down(F.silu(u) * g),
            "down(silu(gate(x))): the product with up(x) is missing (no gating)": ref.down(F.silu(g)),
            "down(silu(up(x))): the product with gate(x) is missing (no gating)": ref.down(F.silu(u)),
            "down(gate(x) * up(x)): SiLU is missing on the gate": ref.down(g * u),
        }
        for what, out in wrong.items():
            if _matches(got, out):
                raise CheckFailed(f"the output equals {what}; the expected is down(silu(gate(x)) * up(x))")
        expect_tensor(got, ref(x), name="SwiGLU(10, 27) on x of shape (3, 5, 10)")


register(Exercise(
    id="16.3",
    title="The feed-forward width of Meta's Llamas",
    targets=("swiglu_width", "SwiGLU"),
    forbidden=("companion.blocks", "companion.models"),  # the reference itself
    cases=(
        Case("LLaMA 7B and 13B: 11008 and 13824", 1, _width_llama1),
        Case("Llama 3 8B, 70B and 405B with ffn_dim_multiplier", 2, _width_llama3),
        Case("the order of the roundings on small sizes", 1, _width_rounding),
        Case("SwiGLU(d_model, d_ff) equals the reference with the same weights", 1, _swiglu_matches),
        Case("gates with SiLU: not GELU, not ungated", 1, _swiglu_gated_silu),
    ),
))


# ----------------------------------------------------------------- 16.4 grouped-query attention over a KV cache


def _gqa_inputs(b, h, hkv, t, s, d, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, t, d, generator=g), torch.randn(b, hkv, s, d, generator=g),
            torch.randn(b, hkv, s, d, generator=g))


def _gqa_ref(q, k, v, *, mask="bottom", tile=False):
    """float64 reference: query i (of T) sits at position S - T + i and sees keys 0 .. S - T + i."""
    n_rep = q.shape[1] // k.shape[1]
    if tile:  # the wrong grouping: head h reads key/value head h % Hkv
        k, v = k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)
    else:
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # head h reads key/value head h // n_rep
    t, s = q.shape[-2], k.shape[-2]
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, T, S)
    i, j = torch.arange(t)[:, None], torch.arange(s)
    if mask != "none":
        keep = j <= (s - t + i if mask == "bottom" else i)  # "top": query i sees keys 0..i (top-left)
        scores = scores.masked_fill(~keep, float("-inf"))
    return (scores.softmax(-1) @ v.double()).float()


def _gqa_case(student, b, h, hkv, t, s, d, seed):
    q, k, v = _gqa_inputs(b, h, hkv, t, s, d, seed)
    got = student(q, k, v)
    what = f"(B={b}, H={h}, Hkv={hkv}, T={t}, S={s}, Dh={d})"
    want = _gqa_ref(q, k, v)
    wrong = []
    if hkv not in (1, h):
        wrong.append((f"query head h reads key/value head h % Hkv (k.repeat): the grouping is wrong; heads "
                      f"0..{h // hkv - 1} share key/value head 0 (repeat_interleave order, or reshape the queries "
                      "to (B, Hkv, H/Hkv, T, Dh))", _gqa_ref(q, k, v, tile=True)))
    if s > t:
        wrong.append((f"query i sees keys 0..i (the top-left causal mask, as F.scaled_dot_product_attention's "
                      f"is_causal=True gives when T < S); the T queries are the last T of the S positions, so "
                      f"query i sees keys 0..S - T + i = 0..{s - t}+i", _gqa_ref(q, k, v, mask="top")))
    if t > 1 or s > 1:
        wrong.append(("no mask: every query sees every key, later ones included", _gqa_ref(q, k, v, mask="none")))
    for text, out in wrong:
        if not _matches(out, want) and _matches(got, out):
            raise CheckFailed(f"{what}: {text}")
    expect_tensor(got, want, name=f"grouped-query attention {what}", atol=1e-5)


register(Exercise(
    id="16.4",
    title="Grouped-query attention over a KV cache",
    targets=("grouped_query_attention",),
    forbidden=("companion.attention", "companion.efficient_attention", "companion.models",
               "torch.nn.functional.scaled_dot_product_attention"),
    cases=(
        Case("no cache (S = T): causal, H = 6, Hkv = 2", 1, lambda s: _gqa_case(s, 2, 6, 2, 7, 7, 8, 0)),
        Case("3 new queries after 7 cached keys (S = 10)", 2, lambda s: _gqa_case(s, 2, 6, 2, 3, 10, 8, 1)),
        Case("one new token (T = 1) sees all S = 9 keys", 1, lambda s: _gqa_case(s, 1, 4, 2, 1, 9, 8, 2)),
        Case("multi-query and multi-head with a cache, odd sizes", 1,
             lambda s: (_gqa_case(s, 3, 5, 1, 4, 11, 5, 3), _gqa_case(s, 2, 3, 3, 2, 6, 6, 4))),
    ),
))


# ----------------------------------------------------------------- 16.5 the block


# The student's parameter names -> the reference block's (LlamaBlock, whose q, k, v are one fused qkv).
BLOCK_NAMES = {
    "norm1.weight": "norm1.weight",
    "self_attn.q.weight": "self_attn.qkv.weight",  # rows [0, H Dh)
    "self_attn.k.weight": "self_attn.qkv.weight",  # rows [H Dh, H Dh + Hkv Dh)
    "self_attn.v.weight": "self_attn.qkv.weight",  # the last Hkv Dh rows
    "self_attn.out.weight": "self_attn.out.weight",
    "norm2.weight": "norm2.weight",
    "ffn.gate.weight": "ffn.gate.weight",
    "ffn.up.weight": "ffn.up.weight",
    "ffn.down.weight": "ffn.down.weight",
}

_BLOCK_SHAPES = {
    "norm1.weight": "(d_model,)", "norm2.weight": "(d_model,)",
    "self_attn.q.weight": "(n_heads * d_head, d_model)", "self_attn.k.weight": "(n_kv_heads * d_head, d_model)",
    "self_attn.v.weight": "(n_kv_heads * d_head, d_model)", "self_attn.out.weight": "(d_model, n_heads * d_head)",
    "ffn.gate.weight": "(d_ff, d_model)", "ffn.up.weight": "(d_ff, d_model)", "ffn.down.weight": "(d_model, d_ff)",
}


def _block_cfg(**sizes):
    return LlamaConfig(vocab_size=11, n_layers=1, max_positions=64, **sizes)


def _reference_block(cfg, seed):
    """The package's block with random weights (norm weights too, so that a missing norm weight shows)."""
    torch.manual_seed(seed)
    ref = LlamaBlock(cfg, 0).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return ref


def _student_weights(ref, cfg) -> dict[str, torch.Tensor]:
    """The reference block's weights under the student's names (the fused qkv split into q, k, v)."""
    sd = ref.state_dict()
    d_q, d_kv = cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head
    q, k, v = sd["self_attn.qkv.weight"].split((d_q, d_kv, d_kv))
    parts = {"self_attn.q.weight": q, "self_attn.k.weight": k, "self_attn.v.weight": v}
    return {name: parts.get(name, sd[theirs]).clone() for name, theirs in BLOCK_NAMES.items()}


def _load_weights(block, weights):
    """Run where the student's module lives: copy the weights in (extra buffers, e.g. cos/sin tables, are kept)."""
    block.load_state_dict(weights, strict=False)
    block.eval()


def _block_with_weights(cls, cfg, seed):
    """The student's block holding the reference's random weights, and the reference."""
    block = cls(cfg)
    ref = _reference_block(cfg, seed)
    want = _student_weights(ref, cfg)
    state = block.state_dict()
    if not isinstance(state, dict):
        raise CheckFailed(f"block.state_dict() should be a dict, got {type(state).__name__}: is MyLlamaBlock an nn.Module?")
    missing = [n for n in want if n not in state]
    extra = [n for n in state if n not in want and n.rpartition(".")[2] in ("weight", "bias")]
    if missing or extra:
        parts = []
        if missing:
            parts.append("missing " + ", ".join(missing))
        if extra:
            biases = [n for n in extra if n.endswith(".bias")]
            parts.append("unexpected " + ", ".join(extra) + (" (Llama's linear layers have no bias)" if biases else ""))
        raise CheckFailed(f"the block's parameters should be named {', '.join(want)}; " + "; ".join(parts))
    for name, tensor in want.items():
        got = tuple(state[name].shape) if isinstance(state[name], torch.Tensor) else type(state[name]).__name__
        if got != tuple(tensor.shape):
            hint = ""
            if name.startswith("self_attn.") and cfg.d_head != cfg.d_model // cfg.n_heads:
                hint = f"; the head size is cfg.d_head = {cfg.d_head}, not d_model // n_heads = {cfg.d_model // cfg.n_heads}"
            raise CheckFailed(f"{name} should have shape {_BLOCK_SHAPES[name]} = {tuple(tensor.shape)}, got {got}{hint}")
    run_student(_load_weights, block, want)
    return block, ref


def _reference_out(ref, cfg, x, *, rope=None, causal=True, norm_first=True, eps=None):
    t = x.shape[1]
    rope = rope_cos_sin(t, cfg.d_head, base=cfg.rope_base) if rope is None else rope
    if eps is not None:  # the wrong epsilon: the same weights in norms with another eps
        ref = copy.deepcopy(ref)
        ref.norm1.eps = ref.norm2.eps = eps

    def attn(h):
        return ref.self_attn(h, None, is_causal=causal, rope=rope)

    with torch.no_grad():
        if norm_first:
            h = x + attn(ref.norm1(x))
            return h + ref.ffn(ref.norm2(h))
        h = ref.norm1(x + attn(x))  # post-norm: the wrong placement
        return ref.norm2(h + ref.ffn(h))


def _block_compare(block, ref, cfg, x, what):
    with torch.no_grad():
        got = block(x)
    t = x.shape[1]
    wrong = {
        "the norms are after the residual additions (post-norm); Llama normalises the input of each sublayer: "
        "x + attn(norm1(x)), then h + ffn(norm2(h))": _reference_out(ref, cfg, x, norm_first=False),
        "the attention is not causal: query i must see only keys 0..i": _reference_out(ref, cfg, x, causal=False),
        "the queries and keys are not rotated (no RoPE): apply_rotary to q and k after splitting the heads":
            _reference_out(ref, cfg, x, rope=(torch.ones(t, cfg.d_head), torch.zeros(t, cfg.d_head))),
        f"the rotations use base 10000 instead of cfg.rope_base = {cfg.rope_base:g}":
            _reference_out(ref, cfg, x, rope=rope_cos_sin(t, cfg.d_head)),
        f"the norms use eps = 1e-6 instead of cfg.norm_eps = {cfg.norm_eps:g}": _reference_out(ref, cfg, x, eps=1e-6),
    }
    want = _reference_out(ref, cfg, x)
    for text, out in wrong.items():
        if not _matches(out, want) and _matches(got, out):
            raise CheckFailed(f"{what}: {text}")
    expect_tensor(got, want, name=f"the block's output {what}", atol=1e-4)


def _block_layout(cls):
    _block_with_weights(cls, _block_cfg(d_model=36, n_heads=6, n_kv_heads=2, d_ff=53), 0)


def _block_gqa(cls):
    cfg = _block_cfg(d_model=36, n_heads=6, n_kv_heads=2, d_ff=53)
    block, ref = _block_with_weights(cls, cfg, 1)
    x = torch.randn(2, 9, 36)
    _block_compare(block, ref, cfg, x, "(D=36, H=6, Hkv=2, F=53, x of shape (2, 9, 36))")


def _block_mqa(cls):
    cfg = _block_cfg(d_model=24, n_heads=4, n_kv_heads=1, d_head=8, d_ff=31, rope_base=500000.0, norm_eps=1e-5)
    block, ref = _block_with_weights(cls, cfg, 2)
    x = torch.randn(1, 7, 24) * 5e-3  # rows with an RMS of 0.005, where eps = 1e-5 matters
    _block_compare(block, ref, cfg, x, "(D=24, H=4, Hkv=1, Dh=8, rope_base=500000, norm_eps=1e-5, small x)")


def _block_causal(cls):
    cfg = _block_cfg(d_model=24, n_heads=4, n_kv_heads=2, d_ff=29)
    block, ref = _block_with_weights(cls, cfg, 3)
    x = torch.randn(1, 8, 24)
    x2 = x.clone()
    x2[:, -1] += 3.0  # only the last token changes
    with torch.no_grad():
        a, b = block(x), block(x2)
    expect_true(isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == x.shape == b.shape,
                f"the block should return a tensor of shape {tuple(x.shape)}")
    changed = (a[:, :-1] - b[:, :-1]).abs().amax().item()
    expect_true(changed < 1e-5, f"changing the last token changed the outputs at earlier positions by up to {changed:.3g}: "
                                "the attention lets queries see later keys (it must be causal)")
    expect_tensor(b, _reference_out(ref, cfg, x2), name="the block's output (D=24, H=4, Hkv=2)", atol=1e-4)


register(Exercise(
    id="16.5",
    title="The Llama block assembled",
    targets=("MyLlamaBlock",),
    forbidden=("companion.models", "companion.blocks", "companion.attention", "companion.positional",
               "torch.nn.functional.scaled_dot_product_attention"),
    cases=(
        Case("parameters named and shaped as the table says", 1, _block_layout),
        Case("equals the reference block with the same weights (GQA, odd sizes)", 3, _block_gqa),
        Case("multi-query, a head size apart from the width, another base and eps", 2, _block_mqa),
        Case("causal: earlier outputs ignore a changed last token", 1, _block_causal),
    ),
))
