"""Chapter 6's exercises 6.1-6.4 go past the chapter's masks: the reference answers score full marks, the
chapter's own lines (run on the new inputs) do not, and each named wrong answer loses points with a message that
names its mistake. The references the checks compare with are tested against companion.masks and Hugging Face."""

import time

import pytest
import torch

from companion.grading.ch06 import (
    _cross_reference,
    _packed_reference,
    _window_reference,
    reach_closed_form,
    window_sink_mask,
)
from companion.masks import causal_mask, influence_matrix
import scoring
from scoring import result


def loses(ex_id, student, *words):
    got, lost = scoring.loses(ex_id, student, *words)
    assert all(lost.values()), lost
    return got


# ----------------------------------------------------------------- reference answers

def packed_causal_mask(document_ids):
    t = document_ids.shape[-1]
    same = document_ids[:, :, None] == document_ids[:, None, :]
    return (torch.ones(t, t, dtype=torch.bool).tril() & same & (document_ids >= 0)[:, None, :])[:, None]


def sliding_window_mask(t, s, window):
    pos = torch.arange(s - t, s)[:, None]
    key = torch.arange(s)[None, :]
    return (key <= pos) & (key > pos - window)


def cross_attention_mask(decoder_attention_mask, encoder_attention_mask):
    mask = decoder_attention_mask.bool()[:, None, :, None] & encoder_attention_mask.bool()[:, None, None, :]
    return mask, ~mask[:, 0].any(dim=-1)


def influencing_positions(t, i, n_layers, window, n_sink=0):
    return reach_closed_form(t, i, n_layers, window, n_sink)


def influencing_by_layers(t, i, n_layers, window, n_sink=0):  # layer by layer, O(t) each: right, too slow at t = 20M
    reached = torch.zeros(t, dtype=torch.bool)
    reached[i] = True
    for _ in range(n_layers):
        c = torch.cat([torch.zeros(1, dtype=torch.long), reached.long().cumsum(0)])
        # key k is read by some reached query q with k <= q < k + window
        reached = (c[torch.clamp(torch.arange(t) + window, max=t)] - c[:-1]) > 0
        if n_sink and reached.any():
            reached[:min(n_sink, int(reached.nonzero()[-1]) + 1)] = True
    return reached


@pytest.mark.parametrize("ex_id, student", [("6.1", packed_causal_mask), ("6.2", sliding_window_mask),
                                            ("6.3", cross_attention_mask), ("6.4", influencing_positions)])
def test_reference_answers_score_full_marks(ex_id, student):
    got, points, lost = result(ex_id, student)
    assert got == points, lost


@pytest.mark.parametrize("ex_id", ["6.1", "6.2", "6.3", "6.4"])
def test_the_stub_scores_zero(ex_id):
    def stub(*args, **kwargs):
        raise NotImplementedError("replace this line with your code")

    assert result(ex_id, stub)[0] == 0


# ----------------------------------------------------------------- the chapter's lines and wrong answers

def chapter_decoder_mask(document_ids):  # cells 4, 6, 8: causal & pad, with pad = not -1
    T = document_ids.shape[1]
    pad = (document_ids >= 0)[:, None, None, :]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return causal & pad


def test_6_1_the_chapters_causal_and_padding():
    assert result("6.1", chapter_decoder_mask)[0] <= 1
    loses("6.1", chapter_decoder_mask, "sees key", "of document", "same-document")


def packed_no_padding_rule(document_ids):  # same document and causal, padding (-1 == -1) left visible
    t = document_ids.shape[-1]
    return (torch.ones(t, t, dtype=torch.bool).tril() & (document_ids[:, :, None] == document_ids[:, None, :]))[:, None]


def packed_not_causal(document_ids):
    return ((document_ids[:, :, None] == document_ids[:, None, :]) & (document_ids >= 0)[:, None, :])[:, None]


def packed_without_head_axis(document_ids):
    return packed_causal_mask(document_ids)[:, 0]


@pytest.mark.parametrize("student, words", [
    (packed_no_padding_rule, ("padding key",)),
    (packed_not_causal, ("later key", "causal")),
    (packed_without_head_axis, ("shape (2, 1, 9, 9)",)),
])
def test_6_1_wrong_answers(student, words):
    loses("6.1", student, *words)


def chapter_window(t, s, window):  # cell 40's square window, T_w = t
    return causal_mask(t) & ~causal_mask(t).tril(-window)


def chapter_window_on_s_keys(t, s, window):  # the same lines on a (t, s) grid: aligned top-left
    ones = torch.ones(t, s, dtype=torch.bool)
    return ones.tril() & ~ones.tril(-window)


def chapter_window_last_rows(t, s, window):  # cell 40's window on s keys, its last t rows: right, but (s, s)
    return chapter_window(s, s, window)[-t:]


def window_one_too_many(t, s, window):
    return sliding_window_mask(t, s, window + 1)


def window_one_too_few(t, s, window):
    return sliding_window_mask(t, s, window - 1)


def test_6_2_the_chapters_square_window():
    got, points, lost = result("6.2", chapter_window)
    assert got == 1 < points  # only the t = s case
    assert any("should have shape (3, 10)" in m for m in lost.values()), lost
    loses("6.2", chapter_window_on_s_keys, "aligned top-left", "s - t + i")
    assert loses("6.2", chapter_window_last_rows, "cannot be allocated") == 3


@pytest.mark.parametrize("student, words", [(window_one_too_many, ("one key too many",)),
                                            (window_one_too_few, ("one key too few",))])
def test_6_2_wrong_answers(student, words):
    assert loses("6.2", student, *words) == 0


def chapter_cross(decoder_attention_mask, encoder_attention_mask):  # cell 12, its empty rows from the same mask
    T_dec = decoder_attention_mask.shape[1]
    cross = encoder_attention_mask.bool()[:, None, None, :].expand(-1, 1, T_dec, -1)
    return cross, ~cross[:, 0].any(dim=-1)


def cross_mask_only(decoder_attention_mask, encoder_attention_mask):
    return cross_attention_mask(decoder_attention_mask, encoder_attention_mask)[0]


def cross_empty_from_decoder(decoder_attention_mask, encoder_attention_mask):  # forgets an all-padding source
    mask, _ = cross_attention_mask(decoder_attention_mask, encoder_attention_mask)
    return mask, ~decoder_attention_mask.bool()


def cross_causal(decoder_attention_mask, encoder_attention_mask):
    mask, _ = cross_attention_mask(decoder_attention_mask, encoder_attention_mask)
    mask = mask & torch.ones(mask.shape[-2:], dtype=torch.bool).tril()
    return mask, ~mask[:, 0].any(dim=-1)


def test_6_3_the_chapters_cross_attention_mask():
    assert result("6.3", chapter_cross)[0] <= 1
    loses("6.3", chapter_cross, "padded decoder query")


@pytest.mark.parametrize("student, words", [
    (cross_mask_only, ("tuple (mask, empty_rows)",)),
    (cross_empty_from_decoder, ("empty_rows[0] must be all True",)),
    (cross_causal, ("causal",)),
])
def test_6_3_wrong_answers(student, words):
    loses("6.3", student, *words)


def chapter_reach(mask, n_layers):  # cell 38, verbatim
    step = (mask | torch.eye(mask.shape[-1], dtype=torch.bool)).long()
    out = step
    for _ in range(n_layers - 1):
        out = (out @ step).clamp(max=1)
    return out.bool()


def reach_wrapped(t, i, n_layers, window, n_sink=0):
    return chapter_reach(window_sink_mask(t, window, n_sink), n_layers)[i]


def reach_window_not_minus_one(t, i, n_layers, window, n_sink=0):  # L * window instead of L * (window - 1)
    out = torch.zeros(t, dtype=torch.bool)
    out[max(0, i - n_layers * window):i + 1] = True
    out[:min(n_sink, i + 1)] = True
    return out


def reach_no_sinks(t, i, n_layers, window, n_sink=0):
    return reach_closed_form(t, i, n_layers, window)


def reach_sinks_after_i(t, i, n_layers, window, n_sink=0):  # sinks marked even when they come after i
    out = reach_closed_form(t, i, n_layers, window)
    out[:n_sink] = True
    return out


def test_6_4_the_chapters_reach():
    got, points, lost = result("6.4", reach_wrapped)
    assert got == 3 < points  # right on small sizes, cannot build the (t, t) matrix
    assert any("without building a (t, t)" in m for m in lost.values()), lost


@pytest.mark.parametrize("student, words", [
    (reach_window_not_minus_one, ("at most 2 positions per layer",)),
    (reach_no_sinks, ("sink keys",)),
    (reach_sinks_after_i, ("no later input",)),
])
def test_6_4_wrong_answers(student, words):
    loses("6.4", student, *words)


# ----------------------------------------------------------------- the references behind the checks

def test_closed_form_equals_the_matrix_power():
    for t in (1, 2, 7, 13):
        for window in (1, 2, 3, 5, 20):
            for n_sink in (0, 1, 3):
                mask = window_sink_mask(t, window, n_sink)
                for layers in (1, 2, 3, 6):
                    want = influence_matrix(mask, layers)
                    for i in range(t):
                        assert torch.equal(reach_closed_form(t, i, layers, window, n_sink), want[i])
                        assert torch.equal(influencing_by_layers(t, i, layers, window, n_sink), want[i])


def test_window_and_packed_references_agree_with_companion_and_loops():
    for t, s in ((4, 4), (3, 9), (1, 5)):
        assert torch.equal(_window_reference(t, s, s + 3), causal_mask(t, s))  # a window longer than s: causal
        for window in (1, 2, 4):
            assert torch.equal(_window_reference(t, s, window), sliding_window_mask(t, s, window))
    ids = torch.tensor([[0, 0, 1, 1, 1, 2, -1, -1], [-1, 0, 0, 0, 1, 2, 2, 2]])
    assert torch.equal(_packed_reference(ids), packed_causal_mask(ids))
    dec, enc = torch.tensor([[1, 1, 0], [1, 0, 0]]), torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0]])
    mask, empty = _cross_reference(dec, enc)
    assert torch.equal(empty, torch.tensor([[False, False, True], [True, True, True]]))
    assert torch.equal(mask, cross_attention_mask(dec, enc)[0])


def test_references_agree_with_hugging_face():
    mu = pytest.importorskip("transformers.masking_utils")
    if not hasattr(mu, "packed_sequence_mask_function"):
        pytest.skip("needs the masking API of transformers 5")
    ids = torch.tensor([[0, 0, 1, 1, 1, 2, 2, 2]])
    hf = mu.sdpa_mask(batch_size=1, q_length=8, kv_length=8, allow_is_causal_skip=False,
                      mask_function=mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(ids)))
    assert torch.equal(hf, _packed_reference(ids))
    for t, s, window in ((3, 10, 4), (1, 7, 3), (6, 6, 2)):
        hf = mu.sdpa_mask(batch_size=1, q_length=t, kv_length=s, q_offset=s - t,
                          allow_is_causal_skip=False,
                          mask_function=mu.and_masks(mu.causal_mask_function, mu.sliding_window_overlay(window)))
        assert torch.equal(hf[0, 0], _window_reference(t, s, window)), (t, s, window)


def test_checks_are_fast():
    for ex_id, student in (("6.1", packed_causal_mask), ("6.2", sliding_window_mask),
                           ("6.3", cross_attention_mask), ("6.4", influencing_positions)):
        start = time.perf_counter()
        result(ex_id, student)
        assert time.perf_counter() - start < 5, ex_id
