"""Chapter 16's checks: the reference answers score full marks, the chapter's own code does not, and each named
wrong answer loses points with a message that names its mistake (run here, and through the instructor's grader's
worker for the modules).

The reference answers are one source text, ``REFERENCE`` (the solution notebook's code, condensed), executed
here and sent as it is to the grader's worker; the wrong answers are that code with one function or method
replaced."""

import math
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from companion.grading import get_exercise, run_exercise
from companion.positional import apply_rope, llama3_rope_frequencies, rope_cos_sin
from scoring import full_marks, remote_result, result, worker_session

REFERENCE = '''
import math

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm(x, weight, eps=1e-6):
    y = x.float() if x.element_size() < 4 else x  # half precision: square and average in float32
    y = y * torch.rsqrt(y.pow(2).mean(dim=-1, keepdim=True) + eps)
    return weight * y.to(x.dtype)


def apply_rotary(x, positions, base=10000.0, scaling=None):
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    if scaling is not None:
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        length = scaling["original_max_position_embeddings"]
        s = ((length * theta / (2 * math.pi) - low) / (high - low)).clamp(0, 1)
        theta = (1 - s) * theta / factor + s * theta
    angles = positions.to(torch.float64)[..., None] * theta
    angles = torch.cat((angles, angles), dim=-1)
    if positions.dim() == 2:
        angles = angles[:, None]
    x1, x2 = x.chunk(2, dim=-1)
    return x * angles.cos().to(x.dtype) + torch.cat((-x2, x1), dim=-1) * angles.sin().to(x.dtype)


def swiglu_width(d_model, multiple_of=256, ffn_dim_multiplier=None):
    hidden = int(2 * 4 * d_model / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


class SwiGLU(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


def grouped_query_attention(q, k, v):
    b, h, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    scores = q.reshape(b, hkv, h // hkv, t, d) @ k[:, :, None].transpose(-1, -2) / math.sqrt(d)
    future = torch.arange(s) > s - t + torch.arange(t)[:, None]
    out = scores.masked_fill(future, float("-inf")).softmax(-1) @ v[:, :, None]
    return out.reshape(b, h, t, d)


class RMSNormLayer(nn.Module):
    def __init__(self, d_model, eps):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.d_head, self.rope_base = cfg.d_head, cfg.rope_base
        self.q = nn.Linear(cfg.d_model, cfg.n_heads * cfg.d_head, bias=False)
        self.k = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.d_head, bias=False)
        self.v = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.d_head, bias=False)
        self.out = nn.Linear(cfg.n_heads * cfg.d_head, cfg.d_model, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (z.view(b, t, -1, self.d_head).transpose(1, 2) for z in (self.q(x), self.k(x), self.v(x)))
        positions = torch.arange(t)
        q, k = apply_rotary(q, positions, self.rope_base), apply_rotary(k, positions, self.rope_base)
        return self.out(grouped_query_attention(q, k, v).transpose(1, 2).reshape(b, t, -1))


class MyLlamaBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm1, self.norm2 = RMSNormLayer(cfg.d_model, cfg.norm_eps), RMSNormLayer(cfg.d_model, cfg.norm_eps)
        self.self_attn, self.ffn = Attention(cfg), SwiGLU(cfg.d_model, cfg.d_ff)

    def forward(self, x):
        h = x + self.self_attn(self.norm1(x))
        return h + self.ffn(self.norm2(h))
'''

# Two wrong answers that the worker test grades as well.
REMOTE_WRONG = '''

class GeluSwiGLU(SwiGLU):
    def forward(self, x):
        return self.down(F.gelu(self.gate(x)) * self.up(x))


class PostNormBlock(MyLlamaBlock):
    def forward(self, x):
        x = self.norm1(x + self.self_attn(x))
        return self.norm2(x + self.ffn(x))
'''


def reference(**replaced):
    """The reference answers, with some of their functions replaced (the others call the replacements)."""
    ns = {}
    exec(compile(REFERENCE + REMOTE_WRONG, "<reference>", "exec"), ns)
    ns.update(replaced)
    return type("Reference", (), {name: staticmethod(v) if callable(v) and not isinstance(v, type) else v
                                  for name, v in ns.items() if not name.startswith("__")})


R = reference()


def loses(ex_id, *students, words):
    """The students lose points, and some failed case's message contains every one of ``words``."""
    got, points, lost = result(ex_id, *students)
    assert got < points, f"{students} scored full marks on {ex_id}"
    assert any(all(w in m for w in words) for m in lost.values()), lost
    return got, lost


# ----------------------------------------------------------------- 16.1


def chapter_rms(x, weight, eps=1e-6):  # the chapter's RMSNorm.forward, verbatim, as a function
    return weight * x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def rms_without_eps(x, weight, eps=1e-6):
    return x / x.pow(2).mean(-1, keepdim=True).sqrt() * weight


def rms_eps_outside(x, weight, eps=1e-6):
    return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight


def rms_is_layer_norm(x, weight, eps=1e-6):
    return F.layer_norm(x, (x.shape[-1],), weight, None, eps)


def rms_in_float32(x, weight, eps=1e-6):  # the dtype is not given back
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def rms_sum_not_mean(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps) * weight


def rms_weight_in_float32(x, weight, eps=1e-6):  # Meta's order up to rounding: cast after the weight
    y = x.float()
    return (weight.float() * y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def test_16_1_reference_and_acceptable_variants():
    full_marks("16.1", R.rms_norm)
    full_marks("16.1", rms_weight_in_float32)


def test_16_1_the_chapter_code_loses_the_float16_case():
    got, lost = loses("16.1", chapter_rms, words=("overflows float16", "65504"))
    assert got == 4 and set(lost) == {"float16 activations of a few hundred do not overflow"}
    from companion.blocks import rms_norm  # the package's function has no half-precision path either
    loses("16.1", rms_norm, words=("overflows float16",))


@pytest.mark.parametrize("student, words", [
    (rms_without_eps, ("ignores eps",)),
    (rms_eps_outside, ("outside the square root",)),
    (rms_is_layer_norm, ("equals LayerNorm",)),
    (rms_in_float32, ("dtype torch.float64", "got torch.float32")),
    (rms_sum_not_mean, ("differs from the reference",)),
])
def test_16_1_wrong_answers(student, words):
    loses("16.1", student, words=words)


# ----------------------------------------------------------------- 16.2


def chapter_rope(x, base=10000.0):  # the chapter's rope, verbatim
    T, Dh = x.shape[-2:]
    theta = base ** (-torch.arange(0, Dh, 2, device=x.device) / Dh)
    angles = torch.arange(T, device=x.device)[:, None] * theta
    angles = torch.cat((angles, angles), dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * angles.cos() + torch.cat((-x2, x1), dim=-1) * angles.sin()


def rope_positions_only(x, positions, base=10000.0, scaling=None):  # the chapter's rope at given positions, no scaling
    return R.apply_rotary(x, positions, base)


def package_rotary(x, positions, base=10000.0, scaling=None):
    freqs = None
    if scaling is not None:
        freqs = llama3_rope_frequencies(
            x.shape[-1], base=base, factor=scaling["factor"], low_freq_factor=scaling["low_freq_factor"],
            high_freq_factor=scaling["high_freq_factor"],
            original_max_positions=scaling["original_max_position_embeddings"])
    cos, sin = rope_cos_sin(positions, x.shape[-1], base=base, frequencies=freqs)
    return apply_rope(x, cos[:, None], sin[:, None]) if positions.dim() == 2 else apply_rope(x, cos, sin)


def rotary_from_zero(x, positions, base=10000.0, scaling=None):  # positions ignored
    return R.apply_rotary(x, torch.arange(x.shape[-2]), base, scaling)


def rotary_first_row(x, positions, base=10000.0, scaling=None):
    return R.apply_rotary(x, positions[0] if positions.dim() == 2 else positions, base, scaling)


def rotary_no_head_axis(x, positions, base=10000.0, scaling=None):  # (B, T, Dh) angles against (B, H, T, Dh)
    if positions.dim() == 1:
        return R.apply_rotary(x, positions, base, scaling)
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.double()[..., None] * theta
    angles = torch.cat((angles, angles), -1)
    x1, x2 = x.chunk(2, -1)
    return x * angles.cos().float() + torch.cat((-x2, x1), -1) * angles.sin().float()


def _scaled_theta(d, base, scaling, rule):
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelength = 2 * math.pi / theta
    length = scaling["original_max_position_embeddings"]
    s = ((length / wavelength - low) / (high - low)).clamp(0, 1)
    return {"all": theta / factor,
            "step": torch.where(wavelength > length / low, theta / factor, theta),
            "swapped": torch.where((s > 0) & (s < 1), s * theta / factor + (1 - s) * theta,
                                   (1 - s) * theta / factor + s * theta),
            }[rule]


def rotary_with(rule):
    def student(x, positions, base=10000.0, scaling=None):
        if scaling is None:
            return R.apply_rotary(x, positions, base)
        theta = _scaled_theta(x.shape[-1], base, scaling, rule)
        angles = positions.double()[..., None] * theta
        angles = torch.cat((angles, angles), -1)
        if positions.dim() == 2:
            angles = angles[:, None]
        x1, x2 = x.chunk(2, -1)
        return x * angles.cos().float() + torch.cat((-x2, x1), -1) * angles.sin().float()
    student.__name__ = f"rotary_{rule}"
    return student


def test_16_2_reference_and_package():
    full_marks("16.2", R.apply_rotary)
    full_marks("16.2", package_rotary)


def test_16_2_the_chapter_code_does_not_pass():
    got, points, lost = result("16.2", chapter_rope)  # rope(x, base): no positions argument
    assert got == 0, lost
    got, lost = loses("16.2", rope_positions_only, words=("not rescaled",))  # positions added, no scaling
    assert got == 4 and set(lost) == {"Llama 3.1's scaling (factor 8, 8192 positions, Dh = 128)",
                                      "the three bands: kept, smoothed, divided"}


@pytest.mark.parametrize("student, words", [
    (rotary_from_zero, ("positions 0..3", "not arange(T)")),
    (rotary_first_row, ("positions of the first row",)),
    (rotary_no_head_axis, ("head h of every sequence got the positions of row h", "cos[:, None]")),
    (rotary_with("all"), ("plain position interpolation",)),
    (rotary_with("step"), ("not smoothed",)),
    (rotary_with("swapped"), ("weights of the smooth band are exchanged",)),
])
def test_16_2_wrong_answers(student, words):
    loses("16.2", student, words=words)


def test_16_2_reference_equals_hugging_face_llama31():
    """The reference rotation, Llama 3.1's scaling and (B, T) positions included, equals transformers'."""
    from transformers import LlamaConfig as HFConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from companion.grading.ch16 import LLAMA31_SCALING, _rotary

    hf_cfg = HFConfig(hidden_size=512, num_attention_heads=4, max_position_embeddings=131072,
                      rope_scaling=dict(LLAMA31_SCALING), rope_theta=500000.0)
    x = torch.randn(2, 4, 5, 128)
    pos = torch.tensor([[0, 1, 2, 3, 4], [1000, 2000, 2500, 3000, 4000]])
    cos, sin = LlamaRotaryEmbedding(hf_cfg)(x, pos)
    want, _ = apply_rotary_pos_emb(x, x, cos, sin)
    for ours in (_rotary(x, pos, 500000.0, LLAMA31_SCALING), R.apply_rotary(x, pos, 500000.0, LLAMA31_SCALING)):
        torch.testing.assert_close(ours, want, atol=2e-3, rtol=0)
    assert (_rotary(x, pos, 500000.0) - want).abs().max() > 0.1  # the scaling shows at these positions


# ----------------------------------------------------------------- 16.3


def chapter_width(d_model, multiple_of):  # the chapter's swiglu_width, verbatim
    return multiple_of * math.ceil(int(2 * 4 * d_model / 3) / multiple_of)


class ChapterSwiGLU(nn.Module):  # the chapter's SwiGLU, verbatim: it takes a config
    def __init__(self, cfg):
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


def width_rule(kind):
    from companion.grading.ch16 import _width

    def student(d_model, multiple_of=256, ffn_dim_multiplier=None):
        return _width(d_model, multiple_of, ffn_dim_multiplier, kind=kind)
    student.__name__ = f"width_{kind}"
    return student


def width_as_float(d_model, multiple_of=256, ffn_dim_multiplier=None):
    return float(R.swiglu_width(d_model, multiple_of, ffn_dim_multiplier))


GeluSwiGLU = R.GeluSwiGLU  # defined in REMOTE_WRONG


class SwappedSwiGLU(R.SwiGLU):
    def forward(self, x):
        return self.down(F.silu(self.up(x)) * self.gate(x))


class UngatedSwiGLU(R.SwiGLU):
    def forward(self, x):
        return self.down(F.silu(self.up(x)))


class BiasedSwiGLU(R.SwiGLU):
    def __init__(self, d_model, d_ff):
        super().__init__(d_model, d_ff)
        self.gate = nn.Linear(d_model, d_ff)


class TransposedSwiGLU(R.SwiGLU):  # down declared D -> F
    def __init__(self, d_model, d_ff):
        super().__init__(d_model, d_ff)
        self.down = nn.Linear(d_model, d_ff, bias=False)


def test_16_3_reference():
    full_marks("16.3", R.swiglu_width, R.SwiGLU)


def test_16_3_the_chapter_code_does_not_pass():
    got, points, lost = result("16.3", chapter_width, ChapterSwiGLU)
    assert got == 1 and "LLaMA 7B and 13B: 11008 and 13824" not in lost, lost


def test_16_3_widths_are_the_released_ones():
    """Meta's rule on Meta's arguments gives the intermediate_size of the released checkpoints (read from their
    Hugging Face configs: 11008, 13824, 14336, 28672, 53248); the chapter's 8B model uses 14336 too."""
    from companion.grading.ch16 import LLAMA1_WIDTHS, LLAMA3_WIDTHS, ROUNDING_WIDTHS, _WIDTH_WRONG, _width

    for d, m, mult, released in (*LLAMA1_WIDTHS.values(), *LLAMA3_WIDTHS.values()):
        assert R.swiglu_width(d, m, mult) == _width(d, m, mult) == released
    for kind in _WIDTH_WRONG:  # each wrong rule gives another number on at least one rounding case
        assert any(_width(d, m, mult, kind=kind) != _width(d, m, mult) for d, m, mult in ROUNDING_WIDTHS.values()), kind


@pytest.mark.parametrize("kind, words", [
    ("ignored", ("ffn_dim_multiplier is ignored",)),
    ("nearest", ("nearest multiple",)),
    ("down", ("rounded down",)),
    ("bump", ("already a multiple",)),
    ("after", ("applied after the rounding",)),
    ("float", ("not truncated to an int",)),
])
def test_16_3_wrong_widths(kind, words):
    loses("16.3", width_rule(kind), R.SwiGLU, words=words)


@pytest.mark.parametrize("student, words", [
    (GeluSwiGLU, ("GELU", "SwiGLU's gate is SiLU")),
    (SwappedSwiGLU, ("applied to up instead of gate",)),
    (UngatedSwiGLU, ("no gating",)),
    (BiasedSwiGLU, ("gate has a bias",)),
    (TransposedSwiGLU, ("down.weight should have shape",)),
])
def test_16_3_wrong_modules(student, words):
    loses("16.3", R.swiglu_width, student, words=words)


def test_16_3_a_float_width_is_refused():
    loses("16.3", width_as_float, R.SwiGLU, words=("should be an int", "float"))


# ----------------------------------------------------------------- 16.4


def chapter_gqa(q, k, v):  # the chapter's GroupedQueryAttention: repeat_interleave, then F.sdpa(is_causal=True)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def square_mask_gqa(q, k, v):  # the old exercise's answer: a (T, T) causal mask
    n = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(n, 1), v.repeat_interleave(n, 1)
    t = q.shape[-2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    return s.softmax(-1) @ v


def repeated_gqa(q, k, v):  # copies the keys (repeat_interleave) but masks right: accepted, only values are checked
    n = q.shape[1] // k.shape[1]
    return R.grouped_query_attention(q, k.repeat_interleave(n, 1), v.repeat_interleave(n, 1))


def gqa_tiled(q, k, v):  # head h reads key/value head h % Hkv
    n = q.shape[1] // k.shape[1]
    return R.grouped_query_attention(q, k.repeat(1, n, 1, 1), v.repeat(1, n, 1, 1))


def gqa_no_mask(q, k, v):
    n = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(n, 1), v.repeat_interleave(n, 1))


def gqa_unscaled(q, k, v):
    return R.grouped_query_attention(q * math.sqrt(q.shape[-1]), k, v)


def test_16_4_reference_and_a_copying_answer():
    full_marks("16.4", R.grouped_query_attention)
    full_marks("16.4", repeated_gqa)


def test_16_4_the_chapter_code_does_not_pass():
    got, lost = loses("16.4", chapter_gqa, words=("top-left causal mask",))
    assert got == 1 and "no cache (S = T): causal, H = 6, Hkv = 2" not in lost, lost
    got, lost = loses("16.4", square_mask_gqa, words=("raised RuntimeError",))  # a (T, T) mask on (T, S) scores
    assert got == 2 and set(lost) == {"3 new queries after 7 cached keys (S = 10)",
                                      "multi-query and multi-head with a cache, odd sizes"}, lost


@pytest.mark.parametrize("student, words", [
    (gqa_tiled, ("h % Hkv",)),
    (gqa_no_mask, ("no mask",)),
    (gqa_unscaled, ("differs from the reference",)),
])
def test_16_4_wrong_answers(student, words):
    loses("16.4", student, words=words)


# ----------------------------------------------------------------- 16.5


PostNormBlock = R.PostNormBlock  # defined in REMOTE_WRONG


class BiasedBlock(R.MyLlamaBlock):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.self_attn.q = nn.Linear(cfg.d_model, cfg.n_heads * cfg.d_head, bias=True)


class HeadFromWidthBlock(R.MyLlamaBlock):  # d_head = d_model // n_heads whatever the config says
    def __init__(self, cfg):
        super().__init__(cfg.replace(d_head=None))


class FixedBaseBlock(R.MyLlamaBlock):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.self_attn.rope_base = 10000.0


class FixedEpsBlock(R.MyLlamaBlock):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.norm1.eps = self.norm2.eps = 1e-6


class WithRopeBuffers(R.MyLlamaBlock):  # cos/sin tables kept as buffers: extra state-dict entries are allowed
    def __init__(self, cfg):
        super().__init__(cfg)
        self.register_buffer("cos_table", torch.ones(cfg.max_positions, cfg.d_head))


def test_16_5_reference():
    full_marks("16.5", R.MyLlamaBlock)
    full_marks("16.5", WithRopeBuffers)


def test_16_5_name_map_covers_the_reference_block():
    from companion.grading.ch16 import BLOCK_NAMES, _block_cfg
    from companion.models.llama import LlamaBlock

    cfg = _block_cfg(d_model=36, n_heads=6, n_kv_heads=2, d_ff=53)
    assert set(BLOCK_NAMES.values()) == set(LlamaBlock(cfg, 0).state_dict())
    assert set(BLOCK_NAMES) == set(R.MyLlamaBlock(cfg).state_dict())


@pytest.mark.parametrize("student, words", [
    (PostNormBlock, ("post-norm",)),
    (BiasedBlock, ("unexpected self_attn.q.bias", "no bias")),
    (HeadFromWidthBlock, ("cfg.d_head = 8, not d_model // n_heads = 6",)),
    (reference(grouped_query_attention=gqa_no_mask).MyLlamaBlock, ("not causal",)),
    (FixedBaseBlock, ("base 10000 instead of cfg.rope_base = 500000",)),
    (reference(apply_rotary=lambda x, positions, base=10000.0, scaling=None: x).MyLlamaBlock, ("not rotated (no RoPE)",)),
    (reference(grouped_query_attention=gqa_tiled).MyLlamaBlock, ("differs from the reference",)),
    (FixedEpsBlock, ("eps = 1e-6 instead of cfg.norm_eps = 1e-05",)),
])
def test_16_5_wrong_answers(student, words):
    loses("16.5", student, words=words)


# ----------------------------------------------------------------- times


@pytest.mark.parametrize("ex_id, names", [("16.1", ("rms_norm",)), ("16.2", ("apply_rotary",)),
                                          ("16.3", ("swiglu_width", "SwiGLU")), ("16.4", ("grouped_query_attention",)),
                                          ("16.5", ("MyLlamaBlock",))])
def test_each_case_is_fast(ex_id, names):
    """Each case well under a second here (the statements promise well under 5 s on a laptop CPU)."""
    ex = get_exercise(ex_id)
    students = [getattr(R, n) for n in names]
    for case in ex.cases:
        start = time.perf_counter()
        case.run(*students)
        assert time.perf_counter() - start < 1.0, case.name


# ----------------------------------------------------------------- through the instructor's grader

# The module exercises run in the grader against proxies of the student's objects (another process):
# the cases may only call them, read attributes and pass plain data.


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    with worker_session(tmp_path_factory.mktemp("work"), REFERENCE + REMOTE_WRONG) as s:
        yield s



@pytest.mark.parametrize("ex_id, names", [("16.1", ("rms_norm",)), ("16.2", ("apply_rotary",)),
                                          ("16.4", ("grouped_query_attention",))])
def test_functions_through_the_worker(session, ex_id, names):
    got, points, lost = remote_result(session, ex_id, *names)
    assert got == points, lost


def test_16_3_through_the_worker(session):
    got, points, lost = remote_result(session, "16.3", "swiglu_width", "SwiGLU")
    assert got == points, lost
    got, points, lost = remote_result(session, "16.3", "swiglu_width", "GeluSwiGLU")
    assert got == 4 and set(lost) == {"SwiGLU(d_model, d_ff) equals the reference with the same weights",
                                      "gates with SiLU: not GELU, not ungated"}, lost
    assert "GEGLU" in lost["gates with SiLU: not GELU, not ungated"], lost


def test_16_5_through_the_worker(session):
    got, points, lost = remote_result(session, "16.5", "MyLlamaBlock")
    assert got == points, lost
    got, points, lost = remote_result(session, "16.5", "PostNormBlock")
    assert got == 1 and "post-norm" in lost["equals the reference block with the same weights (GQA, odd sizes)"], lost
