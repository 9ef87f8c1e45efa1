"""Checks for the Chapter 16 exercises (today's decoders: the pieces of a Llama block, then the block).

References: :func:`companion.blocks.rms_norm` (16.1), :func:`companion.positional.rope_cos_sin`
and :func:`~companion.positional.apply_rope` in the half layout (16.2),
:class:`companion.blocks.GatedFeedForward` with SiLU (16.3),
:func:`companion.attention.repeat_kv` before causal attention (16.4), and the
block of :mod:`companion.models.llama` (16.5).

Each case also compares the answer with the wrong answers a learner is likely
to write (LayerNorm, interleaved pairs, a GELU gate, ``repeat`` instead of
``repeat_interleave``...) and, when it matches one, says which.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import repeat_kv, scaled_dot_product_attention
from ..blocks import GatedFeedForward, rms_norm
from ..models.llama import LlamaBlock, LlamaConfig
from ..positional import apply_rope, rope_cos_sin
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, register, run_student


def _matches(got, want, atol=1e-4) -> bool:
    """Whether a student's result equals ``want`` (used to name the wrong answer it matches)."""
    return (isinstance(got, torch.Tensor) and got.shape == want.shape
            and bool(torch.allclose(got.detach().to("cpu", torch.float64), want.to(torch.float64), atol=atol, rtol=1e-4)))


# ----------------------------------------------------------------- 16.1 RMSNorm


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
    want = rms_norm(x16.float(), w16.float(), 1e-6).to(torch.bfloat16)  # bfloat16 keeps 3 significant digits
    expect_tensor(student(x16, w16, 1e-6), want, name="rms_norm in bfloat16 (tolerance 2e-2)", atol=2e-2, rtol=2e-2)


register(Exercise(
    id="16.1",
    title="RMSNorm as a function",
    targets=("rms_norm",),
    forbidden=("companion.blocks", "torch.nn.functional.rms_norm", "torch.nn.RMSNorm"),  # the reference itself
    cases=(
        Case("random x and weight (2, 7, 13)", 2, _rms_random),
        Case("eps inside the square root matters for tiny rows", 1, _rms_eps),
        Case("does not subtract the mean (rows shifted by 5)", 1, _rms_no_mean),
        Case("keeps the input's dtype (float64, bfloat16)", 1, _rms_dtype),
    ),
))


# ----------------------------------------------------------------- 16.2 rotate-half RoPE


def _rope(x, base=10000.0):
    """Positions 0 .. T-1, half layout (Hugging Face's Llama)."""
    return apply_rope(x, *rope_cos_sin(x.shape[-2], x.shape[-1], base=base))


def _rope_interleaved(x, base=10000.0):
    t, d = x.shape[-2], x.shape[-1]
    return apply_rope(x, *rope_cos_sin(t, d, base=base, layout="interleaved"), layout="interleaved")


def _rope_values(student):
    x = torch.randn(2, 3, 7, 12)
    expect_tensor(student(x, 10000.0), _rope(x), name="apply_rotary(x of shape (2, 3, 7, 12), base=10000)")


def _rope_base(student):
    x = torch.randn(1, 2, 9, 8)
    got = student(x, 500000.0)
    if _matches(got, _rope(x, 10000.0)) and not _matches(_rope(x, 500000.0), _rope(x, 10000.0)):
        raise CheckFailed("the result is the one for base 10000 although base=500000 was passed: "
                          "compute the frequencies as base ** (-2i / Dh) from the argument")
    expect_tensor(got, _rope(x, 500000.0), name="apply_rotary(x of shape (1, 2, 9, 8), base=500000) (Llama 3's rope_theta)")


def _rope_halves(student):
    x = torch.randn(1, 1, 4, 6)
    got = student(x, 10000.0)
    if _matches(got, _rope_interleaved(x)):
        raise CheckFailed("this is the interleaved layout (pairs 2i, 2i+1, as RoFormer and GPT-J); Hugging Face's "
                          "Llama rotates halves: feature i pairs with feature i + Dh/2 (rotate_half)")
    expect_tensor(got, _rope(x), name="apply_rotary(x of shape (1, 1, 4, 6)), half layout")


def _rope_position0(student):
    x = torch.randn(2, 3, 5, 8)
    got = student(x, 10000.0)
    expect_true(isinstance(got, torch.Tensor) and got.shape == x.shape,
                f"apply_rotary should return a tensor of shape {tuple(x.shape)}, got "
                f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}")
    change = (got[..., 0, :] - x[..., 0, :]).abs().amax().item()
    expect_true(change < 1e-5, f"position 0 should be left unchanged (angle 0), but it changed by up to {change:.3g}: "
                               "do the positions start at 0?")


def _rope_relative(student):
    d, t = 16, 10
    q = torch.randn(d).expand(1, 1, t, d).contiguous()  # the same query at positions 0..9
    k = torch.randn(d).expand(1, 1, t, d).contiguous()  # the same key at positions 0..9
    rq, rk = student(q, 10000.0), student(k, 10000.0)
    expect_true(isinstance(rq, torch.Tensor) and rq.shape == q.shape and isinstance(rk, torch.Tensor) and rk.shape == k.shape,
                f"apply_rotary should return a tensor of shape {tuple(q.shape)}")
    scores = (rq @ rk.transpose(-1, -2))[0, 0]  # (T, T): q at m, k at n
    ref = (_rope(q) @ _rope(k).transpose(-1, -2))[0, 0]
    for m, n in ((0, 3), (4, 1), (2, 2)):
        a, b = scores[m, n].item(), scores[m + 5, n + 5].item()
        expect_true(abs(a - b) < 1e-3 * (1 + abs(a)),
                    f"q.k should depend only on m - n: (m, n) = ({m}, {n}) gives {a:.5f} but ({m + 5}, {n + 5}) gives "
                    f"{b:.5f}; each pair of features must be rotated (x cos + rotate_half(x) sin), not scaled")
    expect_tensor(scores, ref, name="the scores q_m . k_n of rotated queries and keys (T = 10)", atol=1e-4)


def _rope_odd(student):
    x = torch.randn(3, 5, 13, 10)  # 5 heads, 5 frequencies
    expect_tensor(student(x, 10000.0), _rope(x), name="apply_rotary(x of shape (3, 5, 13, 10))")
    x = torch.randn(1, 1, 3, 2)  # one frequency, theta_0 = 1
    expect_tensor(student(x, 10000.0), _rope(x), name="apply_rotary(x of shape (1, 1, 3, 2))")


register(Exercise(
    id="16.2",
    title="Rotary positions as Hugging Face's Llama applies them",
    targets=("apply_rotary",),
    forbidden=("companion.positional", "companion.attention", "companion.models"),  # the reference itself
    cases=(
        Case("random queries (B=2, H=3, T=7, Dh=12)", 2, _rope_values),
        Case("uses the base it is given (500000)", 1, _rope_base),
        Case("rotates halves, not interleaved pairs", 1, _rope_halves),
        Case("position 0 is unchanged", 1, _rope_position0),
        Case("q . k depends only on m - n", 1, _rope_relative),
        Case("odd sizes: 5 heads, 5 frequencies; Dh = 2", 1, _rope_odd),
    ),
))


# ----------------------------------------------------------------- 16.3 SwiGLU


_SHAPES = {"gate": "(d_ff, d_model)", "up": "(d_ff, d_model)", "down": "(d_model, d_ff)"}


def _build_swiglu(cls, d_model, d_ff):
    torch.manual_seed(3)
    ffn = cls(d_model, d_ff)
    want = {"gate": (d_ff, d_model), "up": (d_ff, d_model), "down": (d_model, d_ff)}
    for name, shape in want.items():
        sub = getattr(ffn, name, None)
        if not isinstance(sub, nn.Linear):
            raise CheckFailed(f"the module must have an nn.Linear named {name}, got {type(sub).__name__}")
        if tuple(sub.weight.shape) != shape:
            raise CheckFailed(f"{name}.weight should have shape {_SHAPES[name]} = {shape}, got {tuple(sub.weight.shape)}")
        if sub.bias is not None:
            raise CheckFailed(f"{name} has a bias; Llama's feed-forward layers have none (bias=False)")
    return ffn


def _reference_swiglu(ffn, d_model, d_ff):
    ref = GatedFeedForward(d_model, d_ff, activation="silu", bias=False)
    ref.load_state_dict(ffn.state_dict())
    return ref


def _swiglu_layout(cls):
    _build_swiglu(cls, 12, 20)


def _swiglu_matches(cls):
    ffn = _build_swiglu(cls, 13, 35)
    ref = _reference_swiglu(ffn, 13, 35)
    x = torch.randn(2, 7, 13)
    with torch.no_grad():
        expect_tensor(ffn(x), ref(x), name="output on x of shape (2, 7, 13), d_ff = 35")
        x1 = torch.randn(1, 1, 13)
        expect_tensor(ffn(x1), ref(x1), name="output on one token (1, 1, 13)")


def _swiglu_gated_silu(cls):
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
        expect_tensor(got, ref(x), name="output on x of shape (3, 5, 10), d_ff = 27")


register(Exercise(
    id="16.3",
    title="A SwiGLU feed-forward module",
    targets=("SwiGLU",),
    forbidden=("companion.blocks", "companion.models"),  # the reference itself
    cases=(
        Case("gate, up and down are nn.Linear without bias", 1, _swiglu_layout),
        Case("equals the reference with the same weights", 3, _swiglu_matches),
        Case("gates with SiLU: not GELU, not ungated", 2, _swiglu_gated_silu),
    ),
))


# ----------------------------------------------------------------- 16.4 grouped-query attention


def _gqa_inputs(b, h, hkv, t, d, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, t, d, generator=g), torch.randn(b, hkv, t, d, generator=g),
            torch.randn(b, hkv, t, d, generator=g))


def _gqa_ref(q, k, v, *, causal=True, tile=False):
    n_rep = q.shape[1] // k.shape[1]
    if tile:  # the wrong grouping: head h reads key/value head h % Hkv
        k, v = k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)
    else:
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # head h reads key/value head h // n_rep
    return scaled_dot_product_attention(q, k, v, is_causal=causal, backend="manual")


def _gqa_case(student, b, h, hkv, t, d, seed):
    q, k, v = _gqa_inputs(b, h, hkv, t, d, seed)
    got = student(q, k, v)
    what = f"(B={b}, H={h}, Hkv={hkv}, T={t}, Dh={d})"
    if hkv not in (1, h) and _matches(got, _gqa_ref(q, k, v, tile=True)):
        raise CheckFailed(f"query head h reads key/value head h % Hkv (k.repeat): the grouping is wrong {what}; "
                          f"heads 0..{h // hkv - 1} share key/value head 0, so repeat each key/value head "
                          "H/Hkv times in place (repeat_interleave), as Hugging Face's repeat_kv does")
    if t > 1 and _matches(got, _gqa_ref(q, k, v, causal=False)):
        raise CheckFailed(f"the attention is not causal {what}: query i must see only keys 0..i")
    expect_tensor(got, _gqa_ref(q, k, v), name=f"causal grouped-query attention {what}")


register(Exercise(
    id="16.4",
    title="Causal grouped-query attention",
    targets=("grouped_query_attention",),
    forbidden=("companion.attention", "companion.efficient_attention", "companion.models",
               "torch.nn.functional.scaled_dot_product_attention"),
    cases=(
        Case("Hkv = H (multi-head attention)", 1, lambda s: _gqa_case(s, 2, 4, 4, 5, 8, 0)),
        Case("Hkv = 1 (multi-query attention)", 1, lambda s: _gqa_case(s, 2, 6, 1, 7, 4, 1)),
        Case("H = 6, Hkv = 2: heads grouped in order", 2, lambda s: _gqa_case(s, 1, 6, 2, 9, 8, 2)),
        Case("odd sizes (B=3, H=9, Hkv=3, T=11, Dh=5) and one token", 1,
             lambda s: (_gqa_case(s, 3, 9, 3, 11, 5, 3), _gqa_case(s, 2, 4, 2, 1, 6, 4))),
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
