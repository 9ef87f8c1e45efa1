"""Chapter 16's checks: the reference answers score full marks, and each named wrong answer loses points with
a message that names its mistake (run here, and through the instructor's grader's worker for the modules)."""

import math
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from companion.attention import repeat_kv, scaled_dot_product_attention
from companion.blocks import rms_norm
from companion.grading import get_exercise, run_exercise
from companion.positional import apply_rope, rope_cos_sin


def result(ex_id, *students):
    res = run_exercise(get_exercise(ex_id), *students)
    return res.earned, res.points, {c.name: c.message for c in res.cases if not c.passed}


def full_marks(ex_id, *students):
    got, points, lost = result(ex_id, *students)
    assert got == points, lost


def loses(ex_id, student, *words):
    """The student loses points, and some failed case's message contains every one of ``words``."""
    got, points, lost = result(ex_id, student)
    assert got < points, f"{student.__name__} scored full marks on {ex_id}"
    assert any(all(w in m for w in words) for m in lost.values()), lost
    return got, lost


# ----------------------------------------------------------------- 16.1


def good_rms(x, weight, eps=1e-6):
    y = x.float() if x.element_size() < 4 else x
    return weight * (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


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


def test_16_1_reference_and_package():
    full_marks("16.1", good_rms)
    full_marks("16.1", rms_norm)
    # the plain formula in bfloat16 (no float32 detour) is inside the bfloat16 tolerance
    full_marks("16.1", lambda x, w, eps=1e-6: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w)


@pytest.mark.parametrize("student, words", [
    (rms_without_eps, ("ignores eps",)),
    (rms_eps_outside, ("outside the square root",)),
    (rms_is_layer_norm, ("equals LayerNorm",)),
    (rms_in_float32, ("dtype torch.float64", "got torch.float32")),
    (rms_sum_not_mean, ("differs from the reference",)),
])
def test_16_1_wrong_answers(student, words):
    loses("16.1", student, *words)


# ----------------------------------------------------------------- 16.2


def good_rotary(x, base=10000.0):
    t, d = x.shape[-2], x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(t, dtype=torch.float64)[:, None] * theta
    angles = torch.cat((angles, angles), -1)
    x1, x2 = x.chunk(2, -1)
    return x * angles.cos().to(x.dtype) + torch.cat((-x2, x1), -1) * angles.sin().to(x.dtype)


def package_rotary(x, base=10000.0):
    return apply_rope(x, *rope_cos_sin(x.shape[-2], x.shape[-1], base=base))


def interleaved_rotary(x, base=10000.0):
    return apply_rope(x, *rope_cos_sin(x.shape[-2], x.shape[-1], base=base, layout="interleaved"), layout="interleaved")


def rotary_ignores_base(x, base=10000.0):
    return good_rotary(x, 10000.0)


def rotary_from_one(x, base=10000.0):  # positions 1..T
    cos, sin = rope_cos_sin(torch.arange(1, x.shape[-2] + 1), x.shape[-1], base=base)
    return apply_rope(x, cos, sin)


def rotary_without_rotation(x, base=10000.0):  # x cos + x sin: scaled, not rotated
    cos, sin = rope_cos_sin(x.shape[-2], x.shape[-1], base=base)
    return x * cos + x * sin


def rotary_frequencies_without_2(x, base=10000.0):  # theta_i = base^(-i/Dh)
    t, d = x.shape[-2], x.shape[-1]
    angles = torch.arange(t, dtype=torch.float64)[:, None] * base ** (-torch.arange(d // 2, dtype=torch.float64) / d)
    angles = torch.cat((angles, angles), -1)
    x1, x2 = x.chunk(2, -1)
    return x * angles.cos().float() + torch.cat((-x2, x1), -1) * angles.sin().float()


def test_16_2_reference_and_package():
    full_marks("16.2", good_rotary)
    full_marks("16.2", package_rotary)


@pytest.mark.parametrize("student, words", [
    (interleaved_rotary, ("interleaved layout",)),
    (rotary_ignores_base, ("base 10000 although base=500000",)),
    (rotary_from_one, ("position 0 should be left unchanged",)),
    (rotary_without_rotation, ("depend only on m - n",)),
    (rotary_frequencies_without_2, ("(3, 5, 13, 10)",)),
])
def test_16_2_wrong_answers(student, words):
    loses("16.2", student, *words)


def test_16_2_each_wrong_answer_fails_its_own_case():
    _, _, lost = result("16.2", interleaved_rotary)
    assert "rotates halves, not interleaved pairs" in lost
    _, _, lost = result("16.2", rotary_from_one)
    assert "position 0 is unchanged" in lost
    _, _, lost = result("16.2", rotary_without_rotation)
    assert "q . k depends only on m - n" in lost


# ----------------------------------------------------------------- 16.3


class GoodSwiGLU(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class GeluSwiGLU(GoodSwiGLU):
    def forward(self, x):
        return self.down(F.gelu(self.gate(x)) * self.up(x))


class SwappedSwiGLU(GoodSwiGLU):
    def forward(self, x):
        return self.down(F.silu(self.up(x)) * self.gate(x))


class UngatedSwiGLU(GoodSwiGLU):
    def forward(self, x):
        return self.down(F.silu(self.up(x)))


class BiasedSwiGLU(GoodSwiGLU):
    def __init__(self, d_model, d_ff):
        super().__init__(d_model, d_ff)
        self.gate = nn.Linear(d_model, d_ff)


class TransposedSwiGLU(GoodSwiGLU):  # down declared D -> F
    def __init__(self, d_model, d_ff):
        super().__init__(d_model, d_ff)
        self.down = nn.Linear(d_model, d_ff, bias=False)


def test_16_3_reference():
    full_marks("16.3", GoodSwiGLU)


@pytest.mark.parametrize("student, words", [
    (GeluSwiGLU, ("GELU", "SwiGLU's gate is SiLU")),
    (SwappedSwiGLU, ("applied to up instead of gate",)),
    (UngatedSwiGLU, ("no gating",)),
    (BiasedSwiGLU, ("gate has a bias",)),
    (TransposedSwiGLU, ("down.weight should have shape",)),
])
def test_16_3_wrong_answers(student, words):
    loses("16.3", student, *words)


# ----------------------------------------------------------------- 16.4


def good_gqa(q, k, v):
    n_rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1)
    t = q.shape[-2]
    s = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    return s.softmax(-1) @ v


def package_gqa(q, k, v):
    return scaled_dot_product_attention(q, k, v, is_causal=True, backend="sdpa")


def gqa_tiled(q, k, v):  # head h reads key/value head h % Hkv
    n_rep = q.shape[1] // k.shape[1]
    return good_gqa(q, k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1))


def gqa_not_causal(q, k, v):
    n_rep = q.shape[1] // k.shape[1]
    return scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep))


def gqa_unscaled(q, k, v):
    return good_gqa(q * math.sqrt(q.shape[-1]), k, v)


def test_16_4_reference_and_package():
    full_marks("16.4", good_gqa)
    full_marks("16.4", package_gqa)


@pytest.mark.parametrize("student, words", [
    (gqa_tiled, ("h % Hkv", "repeat_interleave")),
    (gqa_not_causal, ("not causal",)),
    (gqa_unscaled, ("differs from the reference",)),
])
def test_16_4_wrong_answers(student, words):
    loses("16.4", student, *words)


def test_16_4_grouping_costs_only_the_grouped_cases():
    got, points, lost = result("16.4", gqa_tiled)
    assert set(lost) == {"H = 6, Hkv = 2: heads grouped in order", "odd sizes (B=3, H=9, Hkv=3, T=11, Dh=5) and one token"}


# ----------------------------------------------------------------- 16.5


class RMSNormLayer(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return good_rms(x, self.weight, self.eps)


class GoodAttention(nn.Module):
    rotary = staticmethod(good_rotary)
    attend = staticmethod(good_gqa)

    def __init__(self, cfg, bias=False):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_head, self.base = cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.rope_base
        self.q = nn.Linear(cfg.d_model, cfg.n_heads * cfg.d_head, bias=bias)
        self.k = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.d_head, bias=False)
        self.v = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.d_head, bias=False)
        self.out = nn.Linear(cfg.n_heads * cfg.d_head, cfg.d_model, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.n_heads, self.d_head).transpose(1, 2)
        k = self.k(x).view(b, t, self.n_kv_heads, self.d_head).transpose(1, 2)
        v = self.v(x).view(b, t, self.n_kv_heads, self.d_head).transpose(1, 2)
        q, k = self.rotary(q, self.base), self.rotary(k, self.base)
        return self.out(self.attend(q, k, v).transpose(1, 2).reshape(b, t, -1))


class GoodBlock(nn.Module):
    attention = GoodAttention

    def __init__(self, cfg):
        super().__init__()
        self.norm1 = RMSNormLayer(cfg.d_model, cfg.norm_eps)
        self.self_attn = self.attention(cfg)
        self.norm2 = RMSNormLayer(cfg.d_model, cfg.norm_eps)
        self.ffn = GoodSwiGLU(cfg.d_model, cfg.d_ff)

    def forward(self, x):
        x = x + self.self_attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class PostNormBlock(GoodBlock):
    def forward(self, x):
        x = self.norm1(x + self.self_attn(x))
        return self.norm2(x + self.ffn(x))


class BiasedAttention(GoodAttention):
    def __init__(self, cfg):
        super().__init__(cfg, bias=True)


class BiasedBlock(GoodBlock):
    attention = BiasedAttention


class HeadFromWidthBlock(GoodBlock):  # d_head = d_model // n_heads whatever the config says
    def __init__(self, cfg):
        super().__init__(cfg.replace(d_head=None))


class NonCausalAttention(GoodAttention):
    attend = staticmethod(gqa_not_causal)


class NonCausalBlock(GoodBlock):
    attention = NonCausalAttention


class FixedBaseBlock(GoodBlock):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.self_attn.base = 10000.0


class NoRopeAttention(GoodAttention):
    rotary = staticmethod(lambda x, base: x)


class NoRopeBlock(GoodBlock):
    attention = NoRopeAttention


class TiledAttention(GoodAttention):
    attend = staticmethod(gqa_tiled)


class TiledBlock(GoodBlock):
    attention = TiledAttention


class FixedEpsBlock(GoodBlock):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.norm1.eps = self.norm2.eps = 1e-6


class WithRopeBuffers(GoodBlock):  # cos/sin tables kept as buffers: extra state-dict entries are allowed
    def __init__(self, cfg):
        super().__init__(cfg)
        self.register_buffer("cos_table", torch.ones(cfg.max_positions, cfg.d_head))


def test_16_5_reference():
    full_marks("16.5", GoodBlock)
    full_marks("16.5", WithRopeBuffers)


def test_16_5_name_map_covers_the_reference_block():
    from companion.grading.ch16 import BLOCK_NAMES, _block_cfg
    from companion.models.llama import LlamaBlock

    ref = LlamaBlock(_block_cfg(d_model=36, n_heads=6, n_kv_heads=2, d_ff=53), 0)
    assert set(BLOCK_NAMES.values()) == set(ref.state_dict())
    assert set(BLOCK_NAMES) == set(GoodBlock(_block_cfg(d_model=36, n_heads=6, n_kv_heads=2, d_ff=53)).state_dict())


@pytest.mark.parametrize("student, words", [
    (PostNormBlock, ("post-norm",)),
    (BiasedBlock, ("unexpected self_attn.q.bias", "no bias")),
    (HeadFromWidthBlock, ("cfg.d_head = 8, not d_model // n_heads = 6",)),
    (NonCausalBlock, ("not causal",)),
    (FixedBaseBlock, ("base 10000 instead of cfg.rope_base = 500000",)),
    (NoRopeBlock, ("not rotated (no RoPE)",)),
    (TiledBlock, ("differs from the reference",)),
    (FixedEpsBlock, ("eps = 1e-6 instead of cfg.norm_eps = 1e-05",)),
])
def test_16_5_wrong_answers(student, words):
    loses("16.5", student, *words)


# ----------------------------------------------------------------- through the instructor's grader

# The module exercises run in the grader against proxies of the student's objects (another process):
# the cases may only call them, read attributes and pass plain data.
REMOTE_STUDENT = '''
import torch
import torch.nn.functional as F
from torch import nn

class SwiGLU(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))

class GeluSwiGLU(SwiGLU):
    def forward(self, x):
        return self.down(F.gelu(self.gate(x)) * self.up(x))

def rms_norm(x, weight, eps=1e-6):
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

def apply_rotary(x, base=10000.0):
    t, d = x.shape[-2], x.shape[-1]
    angles = torch.arange(t, dtype=torch.float64)[:, None] * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.cat((angles, angles), -1)
    x1, x2 = x.chunk(2, -1)
    return x * angles.cos().float() + torch.cat((-x2, x1), -1) * angles.sin().float()

def grouped_query_attention(q, k, v):
    n = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(n, 1), v.repeat_interleave(n, 1)
    t = q.shape[-2]
    s = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    return s.softmax(-1) @ v

class Norm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)

class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.q = nn.Linear(cfg.d_model, cfg.n_heads * cfg.d_head, bias=False)
        self.k = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.d_head, bias=False)
        self.v = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.d_head, bias=False)
        self.out = nn.Linear(cfg.n_heads * cfg.d_head, cfg.d_model, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        split = lambda z: z.view(b, t, -1, self.cfg.d_head).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        q, k = apply_rotary(q, self.cfg.rope_base), apply_rotary(k, self.cfg.rope_base)
        return self.out(grouped_query_attention(q, k, v).transpose(1, 2).reshape(b, t, -1))

class MyLlamaBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm1, self.norm2 = Norm(cfg.d_model, cfg.norm_eps), Norm(cfg.d_model, cfg.norm_eps)
        self.self_attn, self.ffn = Attention(cfg), SwiGLU(cfg.d_model, cfg.d_ff)

    def forward(self, x):
        x = x + self.self_attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))

class PostNormBlock(MyLlamaBlock):
    def forward(self, x):
        x = self.norm1(x + self.self_attn(x))
        return self.norm2(x + self.ffn(x))
'''


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    from companion_grader.instructor import Limits, _Session

    work = tmp_path_factory.mktemp("work")
    (work / "submission.ipynb").write_text("{}")
    s = _Session(work, [(0, REMOTE_STUDENT)], Limits(cell_seconds=60), deadline=time.monotonic() + 120)
    s.ready()
    yield s
    s.stop()


def remote_result(session, ex_id, *names):
    res = run_exercise(get_exercise(ex_id), *session.targets(names))
    return res.earned, res.points, {c.name: c.message for c in res.cases if not c.passed}


def test_16_3_through_the_worker(session):
    got, points, lost = remote_result(session, "16.3", "SwiGLU")
    assert got == points, lost
    got, points, lost = remote_result(session, "16.3", "GeluSwiGLU")
    assert got == 1 and set(lost) == {"equals the reference with the same weights", "gates with SiLU: not GELU, not ungated"}
    assert "GEGLU" in lost["gates with SiLU: not GELU, not ungated"], lost


def test_16_5_through_the_worker(session):
    got, points, lost = remote_result(session, "16.5", "MyLlamaBlock")
    assert got == points, lost
    got, points, lost = remote_result(session, "16.5", "PostNormBlock")
    assert got == 1 and "post-norm" in lost["equals the reference block with the same weights (GQA, odd sizes)"], lost
