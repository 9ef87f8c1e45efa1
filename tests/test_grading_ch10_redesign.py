"""Exercises 10.1 (top-k with one k per row) and 10.2 (locally typical sampling): the solutions score full marks,
the chapter's own top_k and top_p copied verbatim do not, and named wrong answers lose points with a message
that names their mistake. The reference of 10.2 is checked against transformers' TypicalLogitsWarper."""

import time

import pytest
import torch

from companion.grading import get_exercise, run_exercise
from companion.grading.ch10 import typical_reference
from scoring import loses, result


# ----------------------------------------------------------------- 10.1


def top_k(logits, k):  # the solution notebook's answer
    v = logits.shape[-1]
    z = logits.sort(dim=-1, descending=True).values
    kth = z.gather(-1, (k.clamp(1, v) - 1)[:, None]).masked_fill((k == 0)[:, None], float("-inf"))
    return logits.masked_fill(logits < kth, float("-inf"))


def chapter_top_k(logits, k):  # book/ch10_generation.ipynb, verbatim
    kth = logits.topk(k).values[..., -1:]  # (..., 1): the k-th largest logit
    return logits.masked_fill(logits < kth, float("-inf"))  # outside V_k: probability 0


def chapter_top_k_per_row(logits, k):  # the chapter's function, row by row: k = 0 is not handled
    return torch.stack([chapter_top_k(row, int(kb)) for row, kb in zip(logits, k)])


def exactly_k(logits, k):  # keeps k indices from torch.topk: drops ties with the k-th largest
    out = torch.full_like(logits, float("-inf"))
    for b, row in enumerate(logits):
        kb = row.numel() if int(k[b]) == 0 else min(int(k[b]), row.numel())
        idx = row.topk(kb).indices
        out[b, idx] = row[idx]
    return out


def off_by_one(logits, k):  # the k-th largest read at position k instead of k - 1
    v = logits.shape[-1]
    z = logits.sort(dim=-1, descending=True).values
    kth = z.gather(-1, k.clamp(0, v - 1)[:, None]).masked_fill((k == 0)[:, None], float("-inf"))
    return logits.masked_fill(logits < kth, float("-inf"))


def one_k_for_all(logits, k):  # the largest k of the batch for every row
    return chapter_top_k(logits, min(int(k.max()), logits.shape[-1]))


def test_10_1_solution_scores_full_marks():
    got, points, lost = result("10.1", top_k)
    assert got == points == 7, lost


def test_10_1_the_chapters_top_k_copied_verbatim_scores_zero():
    got, _, lost = result("10.1", chapter_top_k)
    assert got == 0, lost
    assert any("must be int" in m for m in lost.values()), lost  # torch.topk takes one int


def test_10_1_wrong_answers_lose_points_with_a_message():
    _, lost = loses("10.1", chapter_top_k_per_row)
    assert "k = 0 and k >= V keep the whole row" in lost
    loses("10.1", exactly_k, "every logit equal to the k-th largest is kept", "expected True, got False")
    loses("10.1", off_by_one, "the kept tokens", "expected False, got True")
    loses("10.1", one_k_for_all, "k=[1, 3, 7, 2, 12, 5]")


def test_10_1_in_place_change_is_caught():
    def mutating(logits, k):
        out = top_k(logits, k)
        logits.zero_()
        return out

    got, _, lost = result("10.1", mutating)
    assert got == 6 and "in place" in lost["does not modify its input"], lost


# ----------------------------------------------------------------- 10.2


def typical(logits, tau):  # the solution notebook's answer
    log_p = logits.log_softmax(dim=-1)
    p = log_p.exp()
    h = -torch.where(p > 0, p * log_p, torch.zeros_like(p)).sum(dim=-1, keepdim=True)
    order = (-log_p - h).abs().argsort(dim=-1)
    p_sorted = p.gather(-1, order)
    before = p_sorted.cumsum(dim=-1) - p_sorted
    keep = torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, before < tau)
    return logits.masked_fill(~keep, float("-inf"))


def chapter_top_p(logits, p):  # book/ch10_generation.ipynb, verbatim
    z, order = logits.sort(-1, descending=True)  # so that p_(1) >= p_(2) >= ...
    probs = z.softmax(-1)
    before = probs.cumsum(-1) - probs  # mass of the more probable tokens
    keep = torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, before < p)  # back to vocabulary order
    return logits.masked_fill(~keep, float("-inf"))


def _typical_variant(logits, tau, *, gap, entropy_terms, crossing=True):
    log_p = logits.log_softmax(dim=-1)
    p = log_p.exp()
    h = -entropy_terms(p, log_p).sum(dim=-1, keepdim=True)
    order = gap(-log_p - h).argsort(dim=-1)
    p_sorted = p.gather(-1, order)
    mass = p_sorted.cumsum(dim=-1) - (p_sorted if crossing else 0)
    keep = torch.zeros_like(mass, dtype=torch.bool).scatter(-1, order, mass < tau)
    return logits.masked_fill(~keep, float("-inf"))


def _safe_terms(p, log_p):
    return torch.where(p > 0, p * log_p, torch.zeros_like(p))


def without_abs(logits, tau):  # orders by -log p - H: the same order as top-p
    return _typical_variant(logits, tau, gap=lambda d: d, entropy_terms=_safe_terms)


def nan_entropy(logits, tau):  # p * log p with p = 0 is NaN
    return _typical_variant(logits, tau, gap=torch.abs, entropy_terms=lambda p, log_p: p * log_p)


def drops_crossing_token(logits, tau):  # keeps a token when the mass up to and including it is below tau
    return _typical_variant(logits, tau, gap=torch.abs, entropy_terms=_safe_terms, crossing=False)


def test_10_2_solution_scores_full_marks():
    got, points, lost = result("10.2", typical)
    assert got == points == 7, lost


def test_10_2_the_chapters_top_p_copied_verbatim_loses_points():
    got, lost = loses("10.2", chapter_top_p, "top-p's nucleus", "|-log p_i - H|")
    assert got <= 1, lost


def test_10_2_wrong_answers_lose_points_with_a_message():
    loses("10.2", without_abs, "without the absolute value")
    loses("10.2", nan_entropy, "0 log 0 = 0")
    loses("10.2", drops_crossing_token, "crosses tau")


def _check_inputs():
    """The (logits, tau) pairs the 10.2 cases pass, recorded through a student that answers correctly."""
    seen = []

    def recorder(logits, tau):
        seen.append((logits.clone(), tau))
        return typical(logits, tau)

    assert run_exercise(get_exercise("10.2"), recorder).earned == 7
    return seen


def test_10_2_reference_equals_transformers_typical_warper():
    transformers = pytest.importorskip("transformers")
    warper_cls = transformers.generation.logits_process.TypicalLogitsWarper
    g = torch.Generator().manual_seed(0)
    inputs = _check_inputs() + [(3 * torch.randn(8, 31, generator=g), tau) for tau in (0.1, 0.35, 0.95)]
    for logits, tau in inputs:
        flat = logits.reshape(-1, logits.shape[-1])
        theirs = warper_cls(mass=tau)(None, flat.clone()).reshape(logits.shape)
        ours = typical_reference(logits, tau)
        assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs)), (tuple(logits.shape), tau)


def test_10_2_cases_sit_clear_of_the_boundary():
    """Float32 and float64 answers agree: no token's mass-before lies within 1e-4 of tau (tau / 2 for a tiny
    tau), and no two gaps |-log p - H| tie."""
    for logits, tau in _check_inputs():
        flat = logits.reshape(-1, logits.shape[-1]).double()
        for row in flat:
            log_p = row.log_softmax(-1)
            p = log_p.exp()
            h = -torch.where(p > 0, p * log_p, torch.zeros_like(p)).sum()
            gap = (-log_p - h).abs()
            order = gap.argsort()
            before = p[order].cumsum(0) - p[order]
            finite = torch.isfinite(gap[order])
            assert ((before[finite] - tau).abs() > min(1e-4, tau / 2)).all(), (tuple(logits.shape), tau)
            gaps = gap[order][finite]
            assert (gaps.diff() > 1e-5).all(), (tuple(logits.shape), tau)
        assert torch.equal(torch.isfinite(typical(logits, tau)), torch.isfinite(typical_reference(logits, tau)))


def test_10_1_and_10_2_checks_are_fast():
    for ex_id, student in (("10.1", top_k), ("10.2", typical)):
        start = time.perf_counter()
        run_exercise(get_exercise(ex_id), student)
        assert time.perf_counter() - start < 2.0, ex_id


def test_10_2_cases_show_what_their_names_say():
    by_shape = {(tuple(logits.shape), tau): logits for logits, tau in _check_inputs()}
    flat_tail = by_shape[((2, 21), 0.5)]
    assert not torch.isfinite(typical_reference(flat_tail, 0.5).gather(-1, flat_tail.argmax(-1, keepdim=True))).any()
    tiny = by_shape[((4, 10), 1e-4)]
    kept = torch.isfinite(typical_reference(tiny, 1e-4))
    assert (kept.sum(-1) == 1).all() and not kept.gather(-1, tiny.argmax(-1, keepdim=True)).all()
