"""Chapter 4's exercises 4.3 (a DeepNorm encoder layer) and 4.2 (the decoder's combined mask as an additive bias): the
reference answers score full marks, the chapter's code (EncoderLayer verbatim and wrapped; the two boolean masks of
EncoderDecoder.forward joined with &) does not, and named wrong answers lose points with a message that names their
mistake. The grader's functional reference is checked against nn.TransformerEncoderLayer at alpha = 1."""

import math

import pytest
import time

import torch
import torch.nn.functional as F
from torch import nn

from companion.grading.ch04 import _deepnorm_reference
from companion.masks import padding_mask
from scoring import loses, result


class Attention(nn.Module):  # the chapter's code, verbatim
    """Multi-head attention (eq. 1 in every head): queries from x, keys and values from ctx."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.q, self.k, self.v, self.out = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x, ctx, mask=None):  # x (B, T, D), ctx (B, S, D), mask True = may attend
        B, T, D = x.shape
        split = lambda t: t.view(B, -1, self.n_heads, D // self.n_heads).transpose(1, 2)  # (B, H, L, Dh)  # noqa: E731
        out = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(ctx)), split(self.v(ctx)), attn_mask=mask)
        return self.out(out.transpose(1, 2).reshape(B, T, D))  # concatenate the heads, then W^O


def feed_forward(d_model, d_ff):  # the chapter's code, verbatim
    return nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))  # eq. (2)


class EncoderLayer(nn.Module):  # the chapter's code, verbatim
    def __init__(self, d_model, n_heads, d_ff, p_drop=0.1):
        super().__init__()
        self.self_attn, self.ffn = Attention(d_model, n_heads), feed_forward(d_model, d_ff)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.drop = nn.Dropout(p_drop)  # once on each sublayer's output, before the sum

    def forward(self, x, mask):  # x (B, S, D)
        x = self.norm1(x + self.drop(self.self_attn(x, x, mask)))  # LayerNorm(x + Sublayer(x))
        return self.norm2(x + self.drop(self.ffn(x)))  # (B, S, D)


class ChapterWrapped(EncoderLayer):  # n_layers ignored, mask optional
    def __init__(self, d_model, n_heads, d_ff, n_layers):
        super().__init__(d_model, n_heads, d_ff, 0.0)

    def forward(self, x, mask=None):
        return super().forward(x, mask)


class Good(nn.Module):
    alpha_of = staticmethod(lambda n: (2 * n) ** 0.25)
    beta_of = staticmethod(lambda n: (8 * n) ** -0.25)
    qk_gain = 1.0
    scale_sublayer = False
    uniform = False

    def __init__(self, d_model, n_heads, d_ff, n_layers):
        super().__init__()
        self.self_attn, self.ffn = Attention(d_model, n_heads), feed_forward(d_model, d_ff)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.alpha, beta = self.alpha_of(n_layers), self.beta_of(n_layers)
        init = nn.init.xavier_uniform_ if self.uniform else nn.init.xavier_normal_
        for m, gain in ((self.self_attn.q, self.qk_gain), (self.self_attn.k, self.qk_gain), (self.self_attn.v, beta),
                        (self.self_attn.out, beta), (self.ffn[0], beta), (self.ffn[2], beta)):
            init(m.weight, gain=gain)
            nn.init.zeros_(m.bias)

    def forward(self, x, mask=None):
        if self.scale_sublayer:  # alpha on the wrong branch
            x = self.norm1(x + self.alpha * self.self_attn(x, x, mask))
            return self.norm2(x + self.alpha * self.ffn(x))
        x = self.norm1(self.alpha * x + self.self_attn(x, x, mask))
        return self.norm2(self.alpha * x + self.ffn(x))


class AlphaOnSublayer(Good):
    scale_sublayer = True


class AlphaSquareRoot(Good):  # sqrt(2N) instead of the fourth root
    alpha_of = staticmethod(lambda n: math.sqrt(2 * n))


class BetaOnQK(Good):  # q and k scaled by beta too
    qk_gain = property(lambda self: self.beta_of(12))


class NoBeta(Good):  # Xavier with gain 1 everywhere
    beta_of = staticmethod(lambda n: 1.0)


class BetaSquareRoot(Good):  # (8N)^(-1/2)
    beta_of = staticmethod(lambda n: (8 * n) ** -0.5)


class Renamed(Good):  # the course's TransformerBlock names instead of the chapter's
    def __init__(self, d_model, n_heads, d_ff, n_layers):
        super().__init__(d_model, n_heads, d_ff, n_layers)
        self.mlp = self.ffn
        del self.ffn

    def forward(self, x, mask=None):
        x = self.norm1(self.alpha * x + self.self_attn(x, x, mask))
        return self.norm2(self.alpha * x + self.mlp(x))


def test_reference_is_torch_post_ln_at_alpha_one():
    torch.manual_seed(0)
    torch_layer = nn.TransformerEncoderLayer(12, 3, 20, dropout=0.0, batch_first=True, norm_first=False).train()
    with torch.no_grad():
        for norm in (torch_layer.norm1, torch_layer.norm2):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_(0, 0.1)
    w, b = torch_layer.self_attn.in_proj_weight, torch_layer.self_attn.in_proj_bias
    sd = {"self_attn.q.weight": w[:12], "self_attn.k.weight": w[12:24], "self_attn.v.weight": w[24:],
          "self_attn.q.bias": b[:12], "self_attn.k.bias": b[12:24], "self_attn.v.bias": b[24:],
          "self_attn.out.weight": torch_layer.self_attn.out_proj.weight,
          "self_attn.out.bias": torch_layer.self_attn.out_proj.bias,
          "ffn.0.weight": torch_layer.linear1.weight, "ffn.0.bias": torch_layer.linear1.bias,
          "ffn.2.weight": torch_layer.linear2.weight, "ffn.2.bias": torch_layer.linear2.bias,
          "norm1.weight": torch_layer.norm1.weight, "norm1.bias": torch_layer.norm1.bias,
          "norm2.weight": torch_layer.norm2.weight, "norm2.bias": torch_layer.norm2.bias}
    x = torch.randn(3, 9, 12)
    valid = torch.arange(9)[None, :] < torch.tensor([9, 4, 1])[:, None]
    with torch.no_grad():
        torch.testing.assert_close(_deepnorm_reference(sd, x, None, 3, 1.0), torch_layer(x))
        torch.testing.assert_close(_deepnorm_reference(sd, x, padding_mask(valid), 3, 1.0),
                                   torch_layer(x, src_key_padding_mask=~valid))
        chapter = EncoderLayer(12, 3, 20, 0.0).eval()
        chapter.load_state_dict(sd)
        torch.testing.assert_close(_deepnorm_reference(sd, x, None, 3, 1.0), chapter(x, None))


def test_solution_full_marks_and_fast():
    start = time.perf_counter()
    got, points, lost = result("4.3", Good)
    assert got == points == 8, lost
    assert time.perf_counter() - start < 2.0


def test_chapter_code_does_not_pass():
    got, points, lost = result("4.3", EncoderLayer)  # verbatim: n_layers lands in p_drop, Dropout(4) raises
    assert got == 0, lost
    got, lost = loses("4.3", ChapterWrapped, "chapter's post-LN layer (alpha = 1)")
    assert got == 1, lost


def test_wrong_answers():
    loses("4.3", AlphaOnSublayer, "output of LN(alpha x + sublayer(x))")
    loses("4.3", AlphaSquareRoot, "output of LN(alpha x + sublayer(x))")
    got, lost = loses("4.3", NoBeta, "DeepNorm's scaled initialisation", "expected 0.319 times")
    assert got == 7, lost
    loses("4.3", BetaSquareRoot, "DeepNorm's scaled initialisation")
    got, lost = loses("4.3", BetaOnQK, "query and key weights keep gain 1")
    assert got == 7, lost
    assert result("4.3", Renamed)[0] == 0
    loses("4.3", Renamed, "keep the chapter's modules and names", "unexpected ['mlp.0.bias'")


# ----------------------------------------------------------------- 4.2 the decoder's mask as an additive bias
# The chapter's EncoderDecoder.forward builds the two boolean masks; tests/test_exercise_audit.py runs them read from
# the chapter. Here: the reference, and wrong answers each named by its message.


def _allowed(tgt_valid):
    t = tgt_valid.shape[1]
    return torch.ones(t, t, dtype=torch.bool).tril() & tgt_valid.bool()[:, None, None, :]


def decoder_attention_bias(tgt_valid, dtype=torch.float32):
    allowed = _allowed(tgt_valid)
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


def boolean_mask(tgt_valid, dtype=torch.float32):  # the chapter's two masks joined with &
    return _allowed(tgt_valid)


def minus_inf(tgt_valid, dtype=torch.float32):
    return torch.zeros(_allowed(tgt_valid).shape, dtype=dtype).masked_fill(~_allowed(tgt_valid), float("-inf"))


def two_biases_added(tgt_valid, dtype=torch.float32):
    t, m = tgt_valid.shape[1], torch.finfo(dtype).min
    causal = torch.zeros(t, t, dtype=dtype).masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), m)
    pad = torch.zeros(tgt_valid.shape, dtype=dtype).masked_fill(~tgt_valid.bool(), m)[:, None, None, :]
    return causal + pad


def one_zero(tgt_valid, dtype=torch.float32):
    return _allowed(tgt_valid).to(dtype)


def inverted(tgt_valid, dtype=torch.float32):
    return torch.zeros(_allowed(tgt_valid).shape, dtype=dtype).masked_fill(_allowed(tgt_valid), torch.finfo(dtype).min)


def float32_min_always(tgt_valid, dtype=torch.float32):
    allowed = _allowed(tgt_valid)
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min).to(dtype)


def query_padding(tgt_valid, dtype=torch.float32):  # padding applied to the queries, not the keys
    t = tgt_valid.shape[1]
    allowed = torch.ones(t, t, dtype=torch.bool).tril() & tgt_valid.bool()[:, None, :, None]
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


def test_4_2_reference_scores_full_marks_quickly():
    start = time.perf_counter()
    got, points, lost = result("4.2", decoder_attention_bias)
    assert got == points == 7, lost
    assert time.perf_counter() - start < 2.0


def test_4_2_the_boolean_mask_scores_zero():
    got, lost = loses("4.2", boolean_mask, "boolean mask", "additive bias")
    assert got == 0


@pytest.mark.parametrize("student, words, most", [
    (minus_inf, ("-inf", "finfo"), 0),
    (two_biases_added, ("overflows",), 2),  # only the case without padding passes
    (one_zero, ("got 1 where",), 0),
    (inverted, ("inverted",), 0),
    (float32_min_always, ("float16",), 6),
    (query_padding, ("padded queries", "keys"), 3),
])
def test_4_2_wrong_answers(student, words, most):
    got, _ = loses("4.2", student, *words)
    assert got <= most
