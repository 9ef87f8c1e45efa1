"""Chapter 14's exercises 14.1 (Batch Prioritized Routing) and 14.2 (the load-balancing loss of top-k routing
with padding): the reference answers score full marks, the chapter's own functions copied verbatim do not, and
each named wrong answer loses points with a message that names its mistake."""

import time

import pytest
import torch
import torch.nn.functional as F

from companion.grading import get_exercise
from companion.grading import ch14 as grading_ch14
from scoring import full_marks, loses, result


# ----------------------------------------------------------------- the chapter's code, verbatim (book/ch14_moe.ipynb)


def switch_route(logits, capacity):
    # logits (B, T, E) = W_r x. Switch: each token to its most probable expert, first come first served.
    probs = logits.softmax(-1)  # p(x), (B, T, E)
    choice = probs.argmax(-1)  # i*, (B, T)
    chose = F.one_hot(choice, probs.shape[-1])  # (B, T, E)
    place = chose.cumsum(1) * chose  # 1 for the first token of the group choosing e, 2 for the second...
    dispatch = (place > 0) & (place <= capacity)  # (B, T, E): served
    return dispatch, probs * dispatch  # combine: p_i*(x) where served, 0 where dropped


def balance_loss(probs, choice):
    # probs (B, T, E), choice (B, T): E * sum_i f_i P_i in each group, averaged over the groups.
    e = probs.shape[-1]
    f = F.one_hot(choice, e).float().mean(1)  # (B, E): share of the group's tokens that chose expert i
    p = probs.mean(1)  # (B, E): mean router probability of expert i
    return (e * (f * p).sum(-1)).mean()


def test_the_chapters_code_copied_verbatim_does_not_pass():
    got, points, lost = result("14.1", switch_route)
    assert got <= 2 < points, (got, lost)  # only the ties and the room-for-everyone cases agree with position order
    assert any("position order" in m and "switch_route" in m for m in lost.values()), lost
    got, points, lost = result("14.2", balance_loss)
    assert got == 0 < points, lost  # no mask argument: every case fails

    def balance_loss_ignoring_mask(probs, choice, mask):  # the chapter's loss under the new signature
        return balance_loss(probs, choice[..., 0])

    got, points, lost = result("14.2", balance_loss_ignoring_mask)
    assert got <= 1 < points, lost  # only k = 1 without padding is the chapter's loss


# ----------------------------------------------------------------- 14.1


def bpr_good(logits, capacity):
    probs = logits.softmax(-1)
    top, choice = probs.max(-1)
    order = top.argsort(dim=1, descending=True, stable=True)
    chose = F.one_hot(choice, probs.shape[-1])
    index = order.unsqueeze(-1).expand_as(chose)
    place_sorted = chose.gather(1, index).cumsum(1) * chose.gather(1, index)
    place = torch.zeros_like(place_sorted).scatter(1, index, place_sorted)
    dispatch = (place > 0) & (place <= capacity)
    return dispatch, probs * dispatch


def bpr_loop(logits, capacity):  # a plain loop, the way a student may well write it
    probs = logits.softmax(-1)
    dispatch = torch.zeros(probs.shape, dtype=torch.bool)
    for b in range(probs.shape[0]):
        used = {}
        top = probs[b].max(-1)
        for t in sorted(range(probs.shape[1]), key=lambda i: -top.values[i].item()):  # sorted() is stable
            e = int(top.indices[t])
            if used.get(e, 0) < capacity:
                dispatch[b, t, e] = True
                used[e] = used.get(e, 0) + 1
    return dispatch, probs * dispatch


def _route_in_order(logits, capacity, key):
    """Top-1 routing with capacity, each group's tokens served in ``sorted(range(T), key=key(b))`` order."""
    probs = logits.softmax(-1)
    dispatch = torch.zeros(probs.shape, dtype=torch.bool)
    choice = probs.argmax(-1)
    for b in range(probs.shape[0]):
        used = [0] * probs.shape[-1]
        for t in sorted(range(probs.shape[1]), key=key(logits[b], probs[b])):
            e = int(choice[b, t])
            if used[e] < capacity:
                dispatch[b, t, e] = True
                used[e] += 1
    return dispatch, probs * dispatch


def bpr_by_logit(logits, capacity):
    return _route_in_order(logits, capacity, lambda lg, p: lambda t: -lg[t].max().item())


def bpr_least_confident_first(logits, capacity):
    return _route_in_order(logits, capacity, lambda lg, p: lambda t: p[t].max().item())


def bpr_flipped_ties(logits, capacity):  # sorted ascending, then reversed: equal priorities go latest first
    return _route_in_order(logits, capacity, lambda lg, p: lambda t: (-p[t].max().item(), -t))


def bpr_pooled_batch(logits, capacity):  # the whole batch sorted and counted as one group
    b, t, e = logits.shape
    dispatch, combine = bpr_good(logits.reshape(1, b * t, e), capacity)
    return dispatch.view(b, t, e), combine.view(b, t, e)


def bpr_renormalised_combine(logits, capacity):  # top-1 weight set to 1: the router gets no gradient
    dispatch, _ = bpr_good(logits, capacity)
    return dispatch, dispatch.float()


def test_14_1_reference_and_a_loop_score_full_marks():
    full_marks("14.1", bpr_good)
    full_marks("14.1", bpr_loop)


@pytest.mark.parametrize("student, words", [
    (switch_route, ("position order", "switch_route")),
    (bpr_by_logit, ("largest logit",)),
    (bpr_least_confident_first, ("least confident tokens are served first",)),
    (bpr_flipped_ties, ("ties keep position order",)),
    (bpr_pooled_batch, ("served as one group",)),
    (bpr_renormalised_combine, ("combine", "differs from the reference")),
])
def test_14_1_wrong_answers(student, words):
    loses("14.1", student, *words)


# ----------------------------------------------------------------- 14.2


def lb_good(probs, choice, mask):
    e = probs.shape[-1]
    real = mask.float()
    n = real.sum(1)
    chose = F.one_hot(choice, e).sum(2).float()
    f = (chose * real[..., None]).sum(1) / n.clamp(min=1)[:, None]
    p = (probs * real[..., None]).sum(1) / n.clamp(min=1)[:, None]
    per_group = e * (f * p).sum(-1)
    return per_group[n > 0].mean()


def lb_loop(probs, choice, mask):  # group by group, token by token
    e = probs.shape[-1]
    losses = []
    for b in range(probs.shape[0]):
        real = mask[b].nonzero().flatten().tolist()
        if not real:
            continue
        f = torch.zeros(e)
        for t in real:
            for i in choice[b, t].tolist():
                f[i] += 1 / len(real)
        losses.append(e * (f * probs[b, real].mean(0)).sum())
    return torch.stack(losses).mean()


def lb_divided_by_k(probs, choice, mask):  # DeepSeek-style normalisation: 1 at uniform routing, not k
    return lb_good(probs, choice, mask) / choice.shape[-1]


def lb_padding_counted(probs, choice, mask):
    return lb_good(probs, choice, torch.ones_like(mask))


def lb_divided_by_t(probs, choice, mask):
    e, t = probs.shape[-1], probs.shape[1]
    real = mask.float()
    f = (F.one_hot(choice, e).sum(2).float() * real[..., None]).sum(1) / t
    p = (probs * real[..., None]).sum(1) / t
    per_group = e * (f * p).sum(-1)
    return per_group[real.sum(1) > 0].mean()


def lb_empty_group_as_zero(probs, choice, mask):
    e = probs.shape[-1]
    real = mask.float()
    n = real.sum(1).clamp(min=1)[:, None]
    f = (F.one_hot(choice, e).sum(2).float() * real[..., None]).sum(1) / n
    p = (probs * real[..., None]).sum(1) / n
    return (e * (f * p).sum(-1)).mean()


def lb_empty_group_nan(probs, choice, mask):  # 0 / 0 for a group of padding only
    e = probs.shape[-1]
    real = mask.float()
    n = real.sum(1)[:, None]
    f = (F.one_hot(choice, e).sum(2).float() * real[..., None]).sum(1) / n
    p = (probs * real[..., None]).sum(1) / n
    return (e * (f * p).sum(-1)).mean()


def lb_pooled_batch(probs, choice, mask):  # Hugging Face's Mixtral: the batch's real tokens as one group
    return lb_good(probs[mask][None], choice[mask][None], torch.ones(1, int(mask.sum()), dtype=torch.bool))


def lb_first_choice_only(probs, choice, mask):  # the chapter's top-1 count
    return lb_good(probs, choice[..., :1], mask)


def test_14_2_reference_and_a_loop_score_full_marks():
    full_marks("14.2", lb_good)
    full_marks("14.2", lb_loop)


@pytest.mark.parametrize("student, words", [
    (lb_divided_by_k, ("divided by k = 2",)),
    (lb_padding_counted, ("padding tokens are counted",)),
    (lb_divided_by_t, ("divided by T",)),
    (lb_empty_group_as_zero, ("counts as 0 in the mean",)),
    (lb_empty_group_nan, ("NaN",)),
    (lb_pooled_batch, ("pooled into one group",)),
    (lb_first_choice_only, ("only the first of each token's k choices",)),
])
def test_14_2_wrong_answers(student, words):
    loses("14.2", student, *words)


def test_14_2_reference_equals_hugging_face_mixtral_on_one_padded_sequence():
    """On one sequence (B = 1) the per-group loss and Hugging Face's pooled Mixtral loss are the same number."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    e, t, k = 6, 13, 2
    logits = 2 * torch.randn(1, t, e, generator=torch.Generator().manual_seed(0))
    mask = torch.arange(t)[None] < 9  # 9 real tokens, 4 of padding
    probs = logits.softmax(-1)
    choice = probs.topk(k, dim=-1).indices
    hf = load_balancing_loss_func((logits[0],), num_experts=e, top_k=k, attention_mask=mask.long())
    torch.testing.assert_close(grading_ch14._lb_reference(probs, choice, mask), hf)
    # and without padding, at uniform routing, both give k
    uniform = torch.zeros(1, 8, 4)
    hf_uniform = load_balancing_loss_func((uniform[0],), num_experts=4, top_k=2)
    assert hf_uniform.item() == pytest.approx(2.0)


def test_14_1_reference_agrees_with_the_package_when_nothing_is_dropped():
    logits = torch.randn(3, 9, 4, generator=torch.Generator().manual_seed(1))
    from companion.moe import route_top1

    dispatch, combine = grading_ch14._bpr_reference(logits, 9)
    assert torch.equal(dispatch, route_top1(logits, 9).dispatch)
    torch.testing.assert_close(combine, route_top1(logits, 9).combine)


@pytest.mark.parametrize("ex_id, student", [("14.1", bpr_good), ("14.2", lb_good)])
def test_each_case_is_fast(ex_id, student):
    for case in get_exercise(ex_id).cases:
        start = time.perf_counter()
        case.run(student)
        assert time.perf_counter() - start < 1.0, case.name
