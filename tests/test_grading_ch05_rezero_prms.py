"""Chapter 5's exercises 5.2 (a partial RMSNorm module) and 5.3 (a ReZero block): the reference answers score full
marks; the chapter's own code (rms_norm in a module, PreLNBlock and PostLNBlock, written out here as the chapter shows
them; tests/test_exercise_audit.py runs them read from the chapter) does not; each named wrong answer loses points with
a message that names its mistake."""

import math
import time

import pytest
import torch
from torch import nn

from companion.grading import get_exercise, run_exercise
from scoring import loses, remote_result, result, worker_session


# ----------------------------------------------------------------- 5.2


def prms(k_of, by=None, head_only=False):
    class Norm(nn.Module):
        def __init__(self, d_model, p=1.0, eps=1e-6):
            super().__init__()
            self.k, self.d, self.eps = k_of(d_model, p), d_model, eps
            self.weight = nn.Parameter(torch.ones(d_model))

        def forward(self, x):
            ms = x[..., : self.k].pow(2).sum(-1, keepdim=True) / (by(self) if by else self.k)
            y = self.weight * x / torch.sqrt(ms + self.eps)
            if head_only:
                y = torch.cat([y[..., : self.k], x[..., self.k:]], -1)
            return y
    return Norm


PartialRMSNorm = prms(lambda d, p: int(d * p))


class ChapterRMSNorm(nn.Module):  # the chapter's rms_norm in a module, p accepted and ignored
    def __init__(self, d_model, p=1.0, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        rms = torch.sqrt((x ** 2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x / rms


def test_5_2_reference_scores_full_marks_quickly():
    start = time.perf_counter()
    got, points, lost = result("5.2", PartialRMSNorm)
    assert got == points == 6, lost
    assert time.perf_counter() - start < 2.0


def test_5_2_the_chapters_rms_norm_in_a_module():
    got, lost = loses("5.2", ChapterRMSNorm, "full RMSNorm")
    assert got == 1  # only p = 1; every case with p < 1 is lost


@pytest.mark.parametrize("student, words", [
    (prms(lambda d, p: math.ceil(d * p)), ("math.ceil", "int(p * D) = 3")),
    (prms(lambda d, p: round(d * p)), ("first 4 features", "int(p * D) = 3")),  # round(3.5) = 4 = ceil(3.5)
    (prms(lambda d, p: int(d * p), by=lambda self: self.d), ("divided by D",)),
    (prms(lambda d, p: int(d * p), head_only=True), ("only the first",)),
])
def test_5_2_wrong_answers(student, words):
    loses("5.2", student, *words)


def test_5_2_eps_added_to_the_rms():
    class EpsOutside(PartialRMSNorm):  # the authors' code's placement of eps
        def forward(self, x):
            return self.weight * x / (x[..., : self.k].pow(2).mean(-1, keepdim=True).sqrt() + self.eps)
    got, lost = loses("5.2", EpsOutside, "inside the", "square root")
    assert got == 4  # also the float64 gradients, where eps = 1e-6 outside the root is visible


def test_5_2_detached_statistic_loses_the_gradient_case():
    class Detached(PartialRMSNorm):
        def forward(self, x):
            rms = torch.sqrt(x[..., : self.k].pow(2).mean(-1, keepdim=True) + self.eps).detach()
            return self.weight * x / rms
    got, lost = loses("5.2", Detached, "gradient of x")
    assert got == 5


# ----------------------------------------------------------------- 5.3


# The reference block and one wrong one, as source: defined here and sent to the instructor's grader's worker below.
REZERO = '''
class ReZeroBlock(nn.Module):
    def __init__(self, attn, ffn, d_model):
        super().__init__()
        self.attn, self.ffn = attn, ffn
        self.alpha = nn.Parameter(torch.zeros(1))

    def forward(self, x, mask=None):
        x = x + self.alpha * self.attn(x, mask)
        return x + self.alpha * self.ffn(x)


class Parallel(ReZeroBlock):
    def forward(self, x, mask=None):
        return x + self.alpha * self.attn(x, mask) + self.alpha * self.ffn(x)
'''
exec(REZERO)  # noqa: S102  (defines ReZeroBlock and Parallel here)


class PostLNBlock(nn.Module):  # the chapter's code, verbatim
    def __init__(self, attn, ffn, d_model):
        super().__init__()
        self.attn, self.ffn = attn, ffn
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, x, mask=None):
        x = self.norm1(x + self.attn(x, mask))
        return self.norm2(x + self.ffn(x))


class PreLNBlock(PostLNBlock):
    def forward(self, x, mask=None):
        x = x + self.attn(self.norm1(x), mask)
        return x + self.ffn(self.norm2(x))


class PreLNWithAlpha(PreLNBlock):  # the chapter's pre-LN block given an alpha: the norms stay
    def __init__(self, attn, ffn, d_model):
        super().__init__(attn, ffn, d_model)
        self.alpha = nn.Parameter(torch.zeros(1))

    def forward(self, x, mask=None):
        x = x + self.alpha * self.attn(self.norm1(x), mask)
        return x + self.alpha * self.ffn(self.norm2(x))


class AlphaOne(ReZeroBlock):
    def __init__(self, attn, ffn, d_model):
        super().__init__(attn, ffn, d_model)
        self.alpha = nn.Parameter(torch.ones(1))




class NoMask(ReZeroBlock):
    def forward(self, x, mask=None):
        return super().forward(x, None)


class ScalesTheSum(ReZeroBlock):
    def forward(self, x, mask=None):
        x = self.alpha * (x + self.attn(x, mask))
        return self.alpha * (x + self.ffn(x))


class TwoAlphas(ReZeroBlock):  # one scale per sublayer, the second not called alpha
    def __init__(self, attn, ffn, d_model):
        super().__init__(attn, ffn, d_model)
        self.alpha_ffn = nn.Parameter(torch.zeros(1))

    def forward(self, x, mask=None):
        x = x + self.alpha * self.attn(x, mask)
        return x + self.alpha_ffn * self.ffn(x)


def test_5_3_reference_scores_full_marks_quickly():
    start = time.perf_counter()
    got, points, lost = result("5.3", ReZeroBlock)
    assert got == points == 6, lost
    assert time.perf_counter() - start < 2.0


def test_5_3_the_chapters_blocks():
    for block in (PostLNBlock, PreLNBlock):
        assert result("5.3", block)[0] == 0
    got, lost = loses("5.3", PreLNWithAlpha, "no norm")
    assert got <= 3


@pytest.mark.parametrize("student, words", [
    (AlphaOne, ("alpha at initialisation",)),
    (Parallel, ("feed-forward reads x",)),
    (NoMask, ("ignores the mask",)),
    (ScalesTheSum, ("scales the sum",)),
    (TwoAlphas, ("alpha alone",)),
])
def test_5_3_wrong_answers(student, words):
    loses("5.3", student, *words)


# ----------------------------------------------------------------- through the instructor's grader (the student's
# classes live in the worker; the checks reach weight, alpha and the gradients through run_student)

REMOTE_STUDENT = '''
import torch
from torch import nn

class PartialRMSNorm(nn.Module):
    def __init__(self, d_model, p=1.0, eps=1e-6):
        super().__init__()
        self.k, self.eps = int(d_model * p), eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        return self.weight * x / torch.sqrt(x[..., : self.k].pow(2).mean(-1, keepdim=True) + self.eps)

''' + REZERO


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    with worker_session(tmp_path_factory.mktemp("work"), REMOTE_STUDENT) as s:
        yield s



def test_through_the_worker(session):
    for ex_id, name in (("5.2", "PartialRMSNorm"), ("5.3", "ReZeroBlock")):
        got, points, lost = remote_result(session, ex_id, name)
        assert got == points, (ex_id, lost)
    got, points, lost = remote_result(session, "5.3", "Parallel")
    assert got == 4 and any("feed-forward reads x" in m for m in lost.values()), lost
