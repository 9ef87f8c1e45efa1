"""Exercises 15.1 (a masked log-softmax safe in fp16) and 15.2 (a dynamic loss scaler with hysteresis): the
solutions score full marks, the chapter's safe_masked_softmax and update_scale copied verbatim do not, and named
wrong answers lose points with a message that names their mistake. The 15.2 reference is checked against the
chapter's scaler (hysteresis 1) and against DeepSpeed's form of the same rule (iteration counts, delayed_shift)."""

import random
import time

import torch

from companion.grading import get_exercise, run_exercise
from companion.grading.ch15 import hysteresis_reference, masked_log_softmax_reference
from companion.precision import DynamicLossScaler
from scoring import loses, result


# ----------------------------------------------------------------- 15.1


def safe_masked_log_softmax(scores, mask):  # the solution notebook's answer
    mask = mask.expand_as(scores)
    s = scores.masked_fill(~mask, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    shifted = s - m.masked_fill(torch.isneginf(m), 0.0)
    lse = shifted.float().exp().sum(dim=-1, keepdim=True).log()
    return (shifted - lse.to(scores.dtype)).masked_fill(~mask.any(dim=-1, keepdim=True), float("-inf"))


def with_log_softmax(scores, mask):  # PyTorch's log_softmax, the empty rows fixed: also right
    mask = mask.expand_as(scores)
    out = scores.masked_fill(~mask, float("-inf")).log_softmax(-1)
    return out.masked_fill(~mask.any(-1, keepdim=True), float("-inf"))


def chapter_safe_masked_softmax(scores, mask):  # book/ch15_practice.ipynb, verbatim
    weights = scores.masked_fill(~mask, torch.finfo(scores.dtype).min).softmax(dim=-1)  # finite in every dtype
    return weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # a query with no visible key: zeros, not NaN


def log_of_chapter_weights(scores, mask):
    return chapter_safe_masked_softmax(scores, mask).log()


def finfo_fill(scores, mask):  # the chapter's fill, then log_softmax: masked keys keep a finite log-weight
    return scores.masked_fill(~mask, torch.finfo(scores.dtype).min).log_softmax(-1)


def inf_fill_only(scores, mask):  # -inf fill, empty rows not fixed: NaN
    return scores.masked_fill(~mask, float("-inf")).log_softmax(-1)


def test_15_1_solutions_score_full_marks():
    for student in (safe_masked_log_softmax, with_log_softmax):
        got, points, lost = result("15.1", student)
        assert got == points == 5, lost


def test_15_1_the_chapters_function_copied_verbatim_scores_zero():
    got, _, lost = result("15.1", chapter_safe_masked_softmax)
    assert got == 0 and all("look like weights" in m for m in lost.values()), lost


def test_15_1_wrong_answers_lose_points_with_a_message():
    _, lost = loses("15.1", log_of_chapter_weights, "underflowed", "s - m - log")
    assert list(lost) == ["fp16, log-weights far below what a weight can hold"], lost
    loses("15.1", finfo_fill, "masked key got a finite log-weight")
    loses("15.1", inf_fill_only, "NaN", "give the whole row -inf")


def test_15_1_large_case_goes_below_what_fp16_weights_hold():
    """The statement's numbers: 2**-25 rounds to 0 in fp16, log(2**-25) = -17.3, and the case reaches far below."""
    assert torch.tensor(2.0**-25).half().item() == 0.0 and torch.tensor(2.0**-24).half().item() > 0
    assert abs(-25 * torch.log(torch.tensor(2.0)).item() + 17.3) < 0.05
    seen = []

    def recorder(scores, mask):
        seen.append((scores.clone(), mask.clone()))
        return safe_masked_log_softmax(scores, mask)

    run_exercise(get_exercise("15.1"), recorder)
    scores, mask = next((s, m) for s, m in seen if s.shape == (1, 2, 3, 11))
    want = masked_log_softmax_reference(scores, mask)
    assert -46 < want[torch.isfinite(want)].min() < -44  # "log-weights reach -45"
    assert (torch.isfinite(want) & (want < -17.3)).sum() >= 5


# ----------------------------------------------------------------- 15.2


def update_scale(scale, clean_steps, hysteresis_left, found_inf, growth=2.0, backoff=0.5, interval=2000,
                 hysteresis=2, min_scale=1.0):  # the solution notebook's answer
    if found_inf:
        hysteresis_left -= 1
        if hysteresis_left <= 0:
            scale = max(scale * backoff, min_scale)
        return scale, 0, hysteresis_left, False
    clean_steps += 1
    if clean_steps == interval:
        return scale * growth, 0, hysteresis, True
    return scale, clean_steps, hysteresis_left, True


def stops_at_zero(*args, **kwargs):  # hysteresis_left kept at 0 or above: the same behaviour, accepted
    scale, clean, left, took = update_scale(*args, **kwargs)
    return scale, clean, max(left, 0), took


def chapter_update_scale(scale, clean_steps, found_inf, growth=2.0, backoff=0.5, interval=2000):
    """book/ch15_practice.ipynb, verbatim."""
    if found_inf:
        return scale * backoff, 0, False  # overflow: halve the scale and skip the step
    clean_steps += 1
    if clean_steps == interval:
        return scale * growth, 0, True  # a run of clean steps: double it
    return scale, clean_steps, True


def chapter_rule_with_the_new_signature(scale, clean_steps, hysteresis_left, found_inf, growth=2.0, backoff=0.5,
                                        interval=2000, hysteresis=2, min_scale=1.0):
    new_scale, clean, took = chapter_update_scale(scale, clean_steps, found_inf, growth, backoff, interval)
    return new_scale, clean, hysteresis_left, took


def restores_on_every_clean_step(scale, clean_steps, hysteresis_left, found_inf, **kw):  # DeepSpeed's consecutive
    scale, clean, left, took = update_scale(scale, clean_steps, hysteresis_left, found_inf, **kw)
    return scale, clean, (kw["hysteresis"] if not found_inf else left), took


def no_floor(scale, clean_steps, hysteresis_left, found_inf, **kw):
    return update_scale(scale, clean_steps, hysteresis_left, found_inf, **{**kw, "min_scale": 0.0})


def steps_while_counting_down(scale, clean_steps, hysteresis_left, found_inf, **kw):
    new_scale, clean, left, took = update_scale(scale, clean_steps, hysteresis_left, found_inf, **kw)
    return new_scale, clean, left, took or (found_inf and left > 0)


def test_15_2_solutions_score_full_marks():
    for student in (update_scale, stops_at_zero):
        got, points, lost = result("15.2", student)
        assert got == points == 4, lost


def test_15_2_the_chapters_function_copied_verbatim_scores_zero():
    got, _, lost = result("15.2", chapter_update_scale)
    assert got == 0, lost
    got, _, lost = result("15.2", chapter_rule_with_the_new_signature)
    assert got == 0, lost
    assert any("counts hysteresis_left down" in m or "the scale stays" in m for m in lost.values()), lost


def test_15_2_wrong_answers_lose_points_with_a_message():
    loses("15.2", restores_on_every_clean_step, "A clean step leaves hysteresis_left as it is")
    loses("15.2", no_floor, "max(scale * backoff, min_scale)")
    loses("15.2", steps_while_counting_down, "Every overflow skips the optimizer step")


def test_15_2_reference_with_hysteresis_1_is_the_chapters_scaler():
    rng = random.Random(0)
    flags = [rng.random() < 0.3 for _ in range(200)]
    scaler = DynamicLossScaler(init_scale=2.0**16, growth_interval=3)
    ours = hysteresis_reference(flags, scale=2.0**16, growth=2.0, backoff=0.5, interval=3, hysteresis=1,
                                min_scale=0.0)
    for found, (scale, clean, _, took) in zip(flags, ours):
        assert scaler.update(found) == took and scaler.scale == scale and scaler.clean_steps == clean


def deepspeed_style(flags, *, scale, growth, backoff, interval, hysteresis, min_scale):
    """The rule as DeepSpeed's DynamicLossScaler.update_scale counts it (consecutive_hysteresis=False): iterations
    since the last overflow instead of a count of clean steps, and a patience that counts down to 1."""
    it, last_overflow, cur_hysteresis = 0, -1, hysteresis
    for found_inf in flags:
        if found_inf:
            if hysteresis == 1 or cur_hysteresis == 1:
                scale = max(scale / (1 / backoff), min_scale)
            else:
                cur_hysteresis -= 1
            last_overflow = it
        elif (it - last_overflow) % interval == 0:
            cur_hysteresis, scale = hysteresis, scale * growth
        it += 1
        yield scale, not found_inf


def test_15_2_reference_equals_deepspeeds_form_of_the_rule():
    rng = random.Random(1)
    for hysteresis in (1, 2, 3):
        flags = [rng.random() < 0.35 for _ in range(300)]
        kw = dict(scale=2.0**10, growth=2.0, backoff=0.5, interval=4, hysteresis=hysteresis, min_scale=1.0)
        ours = [(s, took) for s, _, _, took in hysteresis_reference(flags, **kw)]
        assert ours == list(deepspeed_style(flags, **kw)), hysteresis


def test_15_1_and_15_2_checks_are_fast():
    for ex_id, student in (("15.1", safe_masked_log_softmax), ("15.2", update_scale)):
        start = time.perf_counter()
        run_exercise(get_exercise(ex_id), student)
        assert time.perf_counter() - start < 2.0, ex_id
