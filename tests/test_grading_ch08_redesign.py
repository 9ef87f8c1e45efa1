"""Chapter 8's exercises 8.1 (position ids of packed documents) and 8.4 (DistilBERT's triple loss): the reference
answers score full marks, the chapter's roberta_position_ids and soft_targets (verbatim, and wrapped to the new
signature) do not, and named wrong answers lose points with a message that names their mistake. The 8.4 reference is
also checked against the chapter's soft_targets on the selected rows and against torch.nn's loss modules, as Hugging
Face's distiller.py builds them."""

import time

import torch
import torch.nn.functional as F
from torch import nn

from companion.grading.ch08 import _distil_batch, _distil_reference, _packed_reference
from scoring import loses, result


# ----------------------------------------------------------------- 8.1


def roberta_position_ids(ids, pad_id):  # the chapter's code, verbatim
    real = (ids != pad_id).long()                    # 1 on real tokens, 0 on padding
    return torch.cumsum(real, dim=1) * real + pad_id  # pad_id + 1, pad_id + 2, ... ; padding keeps pad_id


def chapter_wrapped(ids, pad_id, bos_id):
    return roberta_position_ids(ids, pad_id)


def good_packed(ids, pad_id, bos_id):
    real = (ids != pad_id).long()
    count = torch.cumsum(real, dim=1)
    before = torch.where(ids == bos_id, count - 1, torch.zeros_like(count)).cummax(dim=1).values
    return (count - before) * real + pad_id


def restarts_at_zero(ids, pad_id, bos_id):  # each document numbered 0, 1, ... instead of pad_id + 1, ...
    return good_packed(ids, pad_id, bos_id) - (ids != pad_id).long() * (pad_id + 1)


def bos_ends_previous(ids, pad_id, bos_id):  # the count restarts after bos_id, so bos_id closes the last document
    real = (ids != pad_id).long()
    count = torch.cumsum(real, dim=1)
    before = torch.where(ids == bos_id, count, torch.zeros_like(count)).cummax(dim=1).values
    return (count - before) * real + pad_id


def padding_counts(ids, pad_id, bos_id):  # padding advances the count
    pos = torch.arange(ids.shape[1]).expand_as(ids)
    start = torch.where(ids == bos_id, pos, torch.zeros_like(pos)).cummax(dim=1).values
    return torch.where(ids == pad_id, torch.full_like(ids, pad_id), pos - start + pad_id + 1)


def test_packed_reference_by_hand():
    ids = torch.tensor([[0, 7, 8, 2, 0, 9, 2, 0, 5, 1]])
    assert _packed_reference(ids, 1, 0).tolist() == [[2, 3, 4, 5, 2, 3, 4, 2, 3, 1]]
    # each document, packed, gets the chapter's numbering of the document alone
    docs = [[0, 7, 8, 2], [0, 9, 2], [0, 5]]
    alone = [roberta_position_ids(torch.tensor([d]), 1)[0].tolist() for d in docs]
    assert _packed_reference(ids, 1, 0)[0, :9].tolist() == sum(alone, [])


def test_packed_solution_full_marks():
    got, points, lost = result("8.1", good_packed)
    assert got == points == 6, lost


def test_packed_chapter_code_does_not_pass():
    assert result("8.1", roberta_position_ids)[0] == 0  # verbatim: no bos_id argument
    got, lost = loses("8.1", chapter_wrapped, "must restart at pad_id + 1")
    assert got == 1, lost  # only the rows of one document


def test_packed_wrong_answers():
    loses("8.1", restarts_at_zero, "must restart at pad_id + 1")
    loses("8.1", bos_ends_previous, "on its bos_id")
    loses("8.1", padding_counts, "position ids")


# ----------------------------------------------------------------- 8.4


def soft_targets(student_logits, teacher_logits, T):  # the chapter's code, verbatim
    log_p_s = torch.log_softmax(student_logits / T, dim=-1)
    log_p_t = torch.log_softmax(teacher_logits / T, dim=-1)
    kl = (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1).mean()  # KL(teacher || student), mean over rows
    return T**2 * kl


def chapter_on_every_position(s_logits, t_logits, s_hidden, t_hidden, labels, attention_mask, T, alphas, restrict):
    return alphas[0] * soft_targets(s_logits.flatten(0, 1), t_logits.flatten(0, 1), T)


def _terms(s_logits, t_logits, s_hidden, t_hidden, labels, attention_mask, T, restrict, *, mlm_t=1.0,
           kl_rows=None, cos_rows=None, t_square=True):
    real, masked = attention_mask.bool(), labels != -100
    rows = kl_rows if kl_rows is not None else (masked if restrict else real)
    soft = soft_targets(s_logits[rows], t_logits[rows], T) / (1 if t_square else T ** 2)
    mlm = F.cross_entropy(s_logits[masked] / mlm_t, labels[masked])
    c = real if cos_rows is None else cos_rows
    cos = (1 - F.cosine_similarity(s_hidden[c], t_hidden[c], dim=-1)).mean()
    return soft, mlm, cos


def _sum(alphas, terms):
    return sum(a * t for a, t in zip(alphas, terms))


def good_distil(s_logits, t_logits, s_hidden, t_hidden, labels, attention_mask, T, alphas, restrict):
    return _sum(alphas, _terms(s_logits, t_logits, s_hidden, t_hidden, labels, attention_mask, T, restrict))


def kl_with_padding(s_logits, t_logits, s_hidden, t_hidden, labels, attention_mask, T, alphas, restrict):
    every = torch.ones_like(attention_mask, dtype=torch.bool)
    kl_rows = (labels != -100) if restrict else every
    return _sum(alphas, _terms(s_logits, t_logits, s_hidden, t_hidden, labels, attention_mask, T, restrict,
                               kl_rows=kl_rows))


def ignores_restrict(s_logits, t_logits, s_hidden, t_hidden, labels, attention_mask, T, alphas, restrict):
    return good_distil(s_logits, t_logits, s_hidden, t_hidden, labels, attention_mask, T, alphas, False)


def mlm_at_temperature(s_logits, t_logits, s_hidden, t_hidden, labels, attention_mask, T, alphas, restrict):
    return _sum(alphas, _terms(s_logits, t_logits, s_hidden, t_hidden, labels, attention_mask, T, restrict, mlm_t=T))


def cosine_with_padding(s_logits, t_logits, s_hidden, t_hidden, labels, attention_mask, T, alphas, restrict):
    every = torch.ones_like(attention_mask, dtype=torch.bool)
    return _sum(alphas, _terms(s_logits, t_logits, s_hidden, t_hidden, labels, attention_mask, T, restrict,
                               cos_rows=every))


def no_t_squared(s_logits, t_logits, s_hidden, t_hidden, labels, attention_mask, T, alphas, restrict):
    return _sum(alphas, _terms(s_logits, t_logits, s_hidden, t_hidden, labels, attention_mask, T, restrict,
                               t_square=False))


def test_distil_reference_against_chapter_and_torch_modules():
    batch = _distil_batch(3, 9, 11, 6, 7)
    s_logits, t_logits, s_hidden, t_hidden, labels, att = batch
    real, masked = att.bool(), labels != -100
    for restrict in (False, True):
        rows = masked if restrict else real
        kl = nn.KLDivLoss(reduction="batchmean")(F.log_softmax(s_logits[rows] / 2.0, -1), F.softmax(t_logits[rows] / 2.0, -1))
        torch.testing.assert_close(kl * 4.0, soft_targets(s_logits[rows], t_logits[rows], 2.0))
        mlm = nn.CrossEntropyLoss(ignore_index=-100)(s_logits.view(-1, 11), labels.view(-1))
        cos = nn.CosineEmbeddingLoss(reduction="mean")(s_hidden[real], t_hidden[real], torch.ones(int(real.sum())))
        want = 5.0 * kl * 4.0 + 2.0 * mlm + 1.0 * cos
        torch.testing.assert_close(_distil_reference(*batch, 2.0, (5.0, 2.0, 1.0), restrict), want)
        torch.testing.assert_close(good_distil(*batch, 2.0, (5.0, 2.0, 1.0), restrict), want)


def test_distil_solution_full_marks_and_fast():
    start = time.perf_counter()
    got, points, lost = result("8.4", good_distil)
    assert got == points == 6, lost
    assert time.perf_counter() - start < 2.0


def test_distil_chapter_code_does_not_pass():
    assert result("8.4", soft_targets)[0] == 0  # verbatim: another signature
    got, lost = loses("8.4", chapter_on_every_position, "over the real tokens")
    assert got == 0, lost


def test_distil_wrong_answers():
    loses("8.4", kl_with_padding, "soft-target term alone, over the real tokens")
    got, lost = loses("8.4", ignores_restrict, "positions whose label is not -100")
    assert got == 4, lost
    loses("8.4", mlm_at_temperature, "MLM term alone", "not divided by T")
    loses("8.4", cosine_with_padding, "cosine term alone", "over the real tokens")
    loses("8.4", no_t_squared, "soft-target term alone")
