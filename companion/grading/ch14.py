"""Checks for the Chapter 14 exercises (mixture of experts).

References: a plain loop that serves each group's tokens in V-MoE's Batch Prioritized order (14.1; the
chapter grows position-order routing, :func:`companion.moe.route_top1`), :func:`companion.moe.load_balancing_loss`
on each group's real tokens (14.2, top-k routing with padding), :func:`companion.moe.route_top2` with room for
every token (top-2 gates), and :func:`companion.moe.moe_parameter_counts` of a :func:`companion.moe.moe_gpt`
built on the meta device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models.gpt import GPTConfig
from ..moe import MoEConfig, load_balancing_loss, moe_gpt, moe_parameter_counts, route_top1, route_top2
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, register

_FORBIDDEN = ("transformers", "companion.moe", "companion.models")


def _logits(b, t, e, seed, scale=2.0):
    return scale * torch.randn(b, t, e, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------- 14.1 Batch Prioritized Routing
# V-MoE (Riquelme et al., 2021) serves each group's tokens in decreasing order of their largest routing
# probability instead of position order (google-research/vmoe, vmoe/moe.py, `batch_priority`: a stable
# argsort of minus the top gate, so equal priorities keep position order). The reference is a plain loop.

def _serve(probs, choice, capacity, order):
    """dispatch (B, T, E) bool: in each group, the tokens in ``order(b)`` take the places of their expert."""
    dispatch = torch.zeros(probs.shape, dtype=torch.bool)
    for b in range(probs.shape[0]):
        used = [0] * probs.shape[-1]
        for t in order(b):
            e = int(choice[b, t])
            if used[e] < capacity:
                dispatch[b, t, e] = True
                used[e] += 1
    return dispatch


def _bpr_reference(logits, capacity):
    probs = logits.softmax(-1)
    top, choice = probs.max(-1)  # (B, T): the first index of the largest probability
    t = logits.shape[1]
    dispatch = _serve(probs, choice, capacity, lambda b: sorted(range(t), key=lambda i: (-float(top[b, i]), i)))
    return dispatch, probs * dispatch


def _bpr_mistakes(logits, capacity):
    """Dispatch tensors of plausible wrong orders of service, each with what is wrong with it."""
    probs = logits.softmax(-1)
    top, choice = probs.max(-1)
    top_logit = logits.max(-1).values
    b, t, e = logits.shape
    pooled = _serve(probs.reshape(1, b * t, e), choice.reshape(1, b * t), capacity,
                    lambda _: sorted(range(b * t), key=lambda i: (-float(top.flatten()[i]), i))).view(b, t, e)
    return (
        (route_top1(logits, capacity).dispatch,
         "the tokens are served in position order, as the chapter's switch_route does; Batch Prioritized Routing "
         "serves them in decreasing order of their largest router probability"),
        (_serve(probs, choice, capacity, lambda g: sorted(range(t), key=lambda i: (float(top[g, i]), i))),
         "the least confident tokens are served first; sort by the largest probability in decreasing order"),
        (_serve(probs, choice, capacity, lambda g: sorted(range(t), key=lambda i: (-float(top[g, i]), -i))),
         "among tokens of equal priority the later position was served first; ties keep position order "
         "(a stable sort)"),
        (_serve(probs, choice, capacity, lambda g: sorted(range(t), key=lambda i: (-float(top_logit[g, i]), i))),
         "the tokens are ordered by their largest logit; the priority is the largest softmax probability, which "
         "also depends on the token's other logits"),
        (pooled, "the batch is served as one group; capacity and priority count within each group (sequence)"),
    )


def _bpr_case(student, logits, capacity, what):
    want_dispatch, want_combine = _bpr_reference(logits, capacity)
    got = student(logits.clone(), capacity)
    expect_true(isinstance(got, tuple) and len(got) == 2,
                f"{what}: switch_route_bpr must return a tuple (dispatch, combine), got {type(got).__name__}")
    dispatch, combine = got
    expect_true(isinstance(dispatch, torch.Tensor) and dispatch.dtype == torch.bool,
                f"{what}: dispatch must be a bool tensor, got {getattr(dispatch, 'dtype', type(dispatch).__name__)}")
    if dispatch.shape == want_dispatch.shape and not torch.equal(dispatch.cpu(), want_dispatch):
        for wrong, why in _bpr_mistakes(logits, capacity):
            if not torch.equal(wrong, want_dispatch) and torch.equal(dispatch.cpu(), wrong):
                raise CheckFailed(f"dispatch ({what}): {why}")
    expect_tensor(dispatch, want_dispatch, name=f"dispatch ({what})")
    expect_tensor(combine, want_combine, name=f"combine ({what})")


# The chapter's worked example (6 tokens, 3 experts, capacity 2): four tokens choose expert 1.
_CHAPTER_LOGITS = torch.tensor([[[0.1, 2.0, 0.0], [1.5, 0.2, 0.0], [0.0, 1.8, 0.3],
                                 [0.2, 2.2, 0.1], [0.0, 0.1, 1.2], [0.3, 1.9, 0.0]]])


def _bpr_ties(student):
    # every token has the same logits: equal priorities, so the first two positions are served
    _bpr_case(student, torch.tensor([[[0.0, 1.0, 0.0]] * 6]), 2, "6 equal tokens, capacity 2")


def _bpr_probability_not_logit(student):
    # all four choose expert 0; the largest logit (token 1) shares its mass with a close second logit, so the
    # most probable choice is token 3's. Position order, logit order, least confident first and BPR differ.
    logits = torch.tensor([[[1.5, -2.0, -2.0], [3.0, 2.9, 0.0], [0.5, 0.4, 0.3], [2.0, -3.0, -3.0]]])
    _bpr_case(student, logits, 1, "top logits 1.5, 3.0, 0.5, 2.0 with top probabilities 0.94, 0.51, 0.37, 0.99; "
                                  "capacity 1")


def _bpr_per_group(student):
    # group 0 is confident, group 1 is not: pooled, group 1's tokens would lose their places to group 0's
    logits = torch.tensor([[[4.0, 0.0], [5.0, 0.0], [4.5, 0.0]], [[0.3, 0.0], [0.5, 0.0], [0.1, 0.0]]])
    _bpr_case(student, logits, 2, "two sequences of 3 tokens, capacity 2")


register(Exercise(
    id="14.1",
    title="Batch Prioritized Routing",
    targets=("switch_route_bpr",),
    forbidden=_FORBIDDEN,
    cases=(
        Case("the chapter's example: the confident tokens are served first", 2,
             lambda s: _bpr_case(s, _CHAPTER_LOGITS, 2, "the chapter's 6 tokens, capacity 2")),
        Case("random logits (B=3, T=13, E=5), capacity 3", 2, lambda s: _bpr_case(s, _logits(3, 13, 5, 0), 3, "B=3, T=13, E=5")),
        Case("the priority is the largest probability, not the largest logit", 1, _bpr_probability_not_logit),
        Case("equal priorities keep position order", 1, _bpr_ties),
        Case("capacity and priority count per sequence", 1, _bpr_per_group),
        Case("room for every token: nothing dropped", 1, lambda s: _bpr_case(s, _logits(4, 7, 3, 2), 7, "capacity 7 = T")),
    ),
))


# ----------------------------------------------------------------- 14.2 top-k load-balancing loss with padding
# The expected value comes from the package's per-group loss on each group's real tokens, averaged over the
# groups that have one. Hugging Face's Mixtral load_balancing_loss_func normalises the same way (a token counts
# once for each of its k experts, divided by the number of tokens: k at uniform routing), but pools the batch;
# tests/test_grading_ch14_redesign.py checks the two agree on one sequence with padding.

def _lb_reference(probs, choice, mask):
    losses = [load_balancing_loss(probs[b:b + 1, mask[b]], choice[b:b + 1, mask[b]])
              for b in range(probs.shape[0]) if mask[b].any()]
    return torch.stack(losses).mean()


def _lb_pooled(probs, choice, mask):
    """Hugging Face's Mixtral convention: the real tokens of the whole batch form one group."""
    return load_balancing_loss(probs[mask][None], choice[mask][None])


def _lb_mistakes(probs, choice, mask):
    e, k = probs.shape[-1], choice.shape[-1]
    want = _lb_reference(probs, choice, mask)
    real = mask.float()
    n = real.sum(1)
    counts = (F.one_hot(choice, e).sum(2).float() * real[..., None]).sum(1)  # (B, E)
    mass = (probs * real[..., None]).sum(1)  # (B, E)
    per_t = e * (counts / probs.shape[1] * mass / probs.shape[1]).sum(-1)  # divided by T, not by the real count
    per_n = e * (counts / n.clamp(min=1)[:, None] * mass / n.clamp(min=1)[:, None]).sum(-1)
    return (
        (want / k, f"this is the loss divided by k = {k}: each of a token's k choices counts, and f_i is divided by "
                   f"the number of tokens, not by k times it (the loss is k at uniform routing, as in Hugging Face's "
                   f"Mixtral)"),
        (_lb_reference(probs, choice[..., :1], mask),
         "only the first of each token's k choices is counted; every one of the k experts a token chose counts"),
        (_lb_reference(probs, choice, torch.ones_like(mask)),
         "the padding tokens are counted; f_i and P_i are over the real tokens only (mask True)"),
        (per_t[n > 0].mean(), "f_i and P_i are divided by T; divide by the number of real tokens of the group"),
        (per_n.mean(), "a group without real tokens counts as 0 in the mean; leave it out of the mean"),
        (_lb_pooled(probs, choice, mask),
         "the batch is pooled into one group (Hugging Face's Mixtral does that); here each sequence is a group "
         "and the groups' losses are averaged"),
    )


def _lb_case(student, probs, choice, mask, what):
    got = student(probs.clone(), choice.clone(), mask.clone())
    want = _lb_reference(probs, choice, mask)
    if isinstance(got, torch.Tensor) and got.shape == want.shape and torch.isfinite(got).all():
        for wrong, why in _lb_mistakes(probs, choice, mask):
            if abs(float(wrong) - float(want)) > 1e-4 and abs(float(got) - float(wrong)) <= 1e-6 + 1e-5 * abs(float(wrong)):
                raise CheckFailed(f"load-balancing loss ({what}): expected {float(want):.5g}, got {float(got):.5g}: {why}")
    expect_tensor(got, want, name=f"load-balancing loss ({what})")


def _lb_router(b, t, e, k, seed):
    probs = _logits(b, t, e, seed).softmax(-1)
    return probs, probs.topk(k, dim=-1).indices


def _lb_uniform_top2(student):
    e, t = 4, 8
    probs = torch.full((2, t, e), 1 / e)
    choice = torch.stack([torch.arange(t) % e, (torch.arange(t) + 1) % e], -1).expand(2, t, 2).clone()
    _lb_case(student, probs, choice, torch.ones(2, t, dtype=torch.bool), "uniform top-2 routing, E=4: exactly k = 2")


def _lb_top1(student):
    probs, choice = _lb_router(3, 10, 5, 1, 3)
    _lb_case(student, probs, choice, torch.ones(3, 10, dtype=torch.bool), "k=1, no padding (B=3, T=10, E=5)")


def _lb_top2(student):
    probs, choice = _lb_router(3, 11, 6, 2, 4)
    _lb_case(student, probs, choice, torch.ones(3, 11, dtype=torch.bool), "top-2, no padding (B=3, T=11, E=6)")


def _padded(b, t, e, k, seed, lengths):
    """A top-k router whose padding positions (after each length) all route, confidently, to expert 0."""
    probs, choice = _lb_router(b, t, e, k, seed)
    mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]  # (B, T): True for a real token
    pad_probs = torch.full((e,), 0.02 / (e - 1))
    pad_probs[0] = 0.98
    probs[~mask] = pad_probs
    choice[~mask] = torch.arange(k)  # expert 0 first
    return probs, choice, mask


def _lb_padding(student):
    probs, choice, mask = _padded(3, 12, 5, 2, 5, [12, 7, 3])
    _lb_case(student, probs, choice, mask, "top-2, sequences of 12, 7 and 3 real tokens padded to T=12, E=5")


def _lb_empty_group(student):
    probs, choice, mask = _padded(3, 9, 4, 2, 6, [9, 0, 5])
    _lb_case(student, probs, choice, mask, "top-2, 9, 0 and 5 real tokens of T=9 (the second group is all padding)")


register(Exercise(
    id="14.2",
    title="Load-balancing loss for top-k routing with padding",
    targets=("balance_loss",),
    forbidden=_FORBIDDEN,
    cases=(
        Case("uniform top-2 routing gives exactly k", 1, _lb_uniform_top2),
        Case("k = 1 without padding: the chapter's loss", 1, _lb_top1),
        Case("a random top-2 router (B=3, T=11, E=6)", 1, _lb_top2),
        Case("padding is left out of f and P", 2, _lb_padding),
        Case("a group of padding only is left out of the mean", 1, _lb_empty_group),
    ),
))


# ----------------------------------------------------------------- 14.3 top-2 gates

def _gates_case(student, logits, what):
    want = route_top2(logits, capacity=logits.shape[1]).combine  # room for every token: no capacity drops
    got = student(logits.clone())
    expect_tensor(got, want, name=f"top-2 gates ({what})")


register(Exercise(
    id="14.3",
    title="Top-2 gates (renormalised)",
    targets=("top2_gates",),
    forbidden=_FORBIDDEN,
    cases=(
        Case("a worked example (one token, E=4)", 1,
             lambda s: _gates_case(s, torch.tensor([[[1.0, 3.0, 0.0, 2.0]]]), "logits [1, 3, 0, 2]")),
        Case("random logits (B=2, T=11, E=6)", 2, lambda s: _gates_case(s, _logits(2, 11, 6, 5), "B=2, T=11, E=6")),
        Case("two experts: both always chosen", 1, lambda s: _gates_case(s, _logits(3, 5, 2, 6), "E=2")),
        Case("large logits stay finite", 1, lambda s: _gates_case(s, _logits(1, 6, 5, 7, scale=300.0), "logits of +-300")),
    ),
))


# ----------------------------------------------------------------- 14.4 active and total parameters

def _counts_reference(cfg: GPTConfig, moe: MoEConfig) -> tuple[int, int]:
    with torch.device("meta"):
        counts = moe_parameter_counts(moe_gpt(cfg, moe))
    return counts["total"], counts["active"]


def _counts_case(student, what, n_experts, top_k=1, **kw):
    cfg, moe = GPTConfig(**kw), MoEConfig(n_experts=n_experts, top_k=top_k)
    want = _counts_reference(cfg, moe)
    got = student(cfg.vocab_size, cfg.max_positions, cfg.d_model, cfg.n_layers, cfg.ff_size, moe.n_experts, moe.top_k)
    expect_true(isinstance(got, tuple) and len(got) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in got),
                f"{what}: moe_gpt_parameters must return a tuple of two ints (total, active), got {got!r}")
    if tuple(got) != want:
        raise CheckFailed(f"{what}: expected (total, active) = ({want[0]:,}, {want[1]:,}), got ({got[0]:,}, {got[1]:,})")


register(Exercise(
    id="14.4",
    title="Total and active parameters of a mixture-of-experts GPT",
    targets=("moe_gpt_parameters",),
    forbidden=_FORBIDDEN,
    cases=(
        Case("the chapter's tiny model (4 experts, top-1)", 2, lambda s: _counts_case(
            s, "V=98, P=64, D=64, 2 layers, F=256, E=4, k=1", vocab_size=98, max_positions=64, d_model=64,
            n_layers=2, n_heads=4, d_ff=256, n_experts=4)),
        Case("top-2 of 8 experts (Mixtral-like routing)", 2, lambda s: _counts_case(
            s, "E=8, k=2", vocab_size=1000, max_positions=128, d_model=96, n_layers=3, n_heads=4, d_ff=384,
            n_experts=8, top_k=2)),
        Case("one expert: a dense model plus a router", 1, lambda s: _counts_case(
            s, "E=1", vocab_size=50, max_positions=16, d_model=32, n_layers=1, n_heads=2, d_ff=80, n_experts=1)),
        Case("128 experts of Switch-Base's width (2 blocks)", 1, lambda s: _counts_case(
            s, "E=128, D=768, F=3072", vocab_size=32128, max_positions=512, d_model=768, n_layers=2, n_heads=12,
            d_ff=3072, n_experts=128)),
    ),
))
