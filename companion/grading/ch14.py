"""Checks for the Chapter 14 exercises (mixture of experts).

References: :func:`companion.moe.route_top1` (Switch routing with capacity),
:func:`companion.moe.load_balancing_loss`, :func:`companion.moe.route_top2` with
room for every token (top-2 gates), and :func:`companion.moe.moe_parameter_counts`
of a :func:`companion.moe.moe_gpt` built on the meta device.
"""

from __future__ import annotations

import torch

from ..models.gpt import GPTConfig
from ..moe import MoEConfig, load_balancing_loss, moe_gpt, moe_parameter_counts, route_top1, route_top2
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, register

_FORBIDDEN = ("transformers", "companion.moe", "companion.models")


def _logits(b, t, e, seed, scale=2.0):
    return scale * torch.randn(b, t, e, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------- 14.1 top-1 routing with capacity

def _top1_case(student, logits, capacity, what):
    want = route_top1(logits, capacity)
    got = student(logits.clone(), capacity)
    expect_true(isinstance(got, tuple) and len(got) == 2,
                f"{what}: route_top1 must return a tuple (dispatch, combine), got {type(got).__name__}")
    dispatch, combine = got
    expect_true(isinstance(dispatch, torch.Tensor) and dispatch.dtype == torch.bool,
                f"{what}: dispatch must be a bool tensor, got {getattr(dispatch, 'dtype', type(dispatch).__name__)}")
    expect_tensor(dispatch, want.dispatch, name=f"dispatch ({what})")
    expect_tensor(combine, want.combine, name=f"combine ({what})")


def _top1_worked(student):
    # 5 tokens all prefer expert 1; capacity 2: tokens 0 and 1 are served, 2-4 dropped
    logits = torch.tensor([[[0.0, 5.0, 0.0]] * 4 + [[3.0, 0.0, 0.0]]])
    _top1_case(student, logits, 2, "5 tokens, capacity 2")


register(Exercise(
    id="14.1",
    title="Switch (top-1) routing with expert capacity",
    targets=("route_top1",),
    forbidden=_FORBIDDEN,
    cases=(
        Case("a worked example: first come, first served", 2, _top1_worked),
        Case("random logits (B=3, T=13, E=5), capacity 3", 2, lambda s: _top1_case(s, _logits(3, 13, 5, 0), 3, "B=3, T=13, E=5")),
        Case("capacity 1 (E=2, T=9): most tokens dropped", 1, lambda s: _top1_case(s, _logits(2, 9, 2, 1), 1, "capacity 1")),
        Case("room for every token: nothing dropped", 1, lambda s: _top1_case(s, _logits(4, 7, 3, 2), 7, "capacity 7 = T")),
        Case("capacity counts per sequence, not per batch", 2,
             lambda s: _top1_case(s, torch.tensor([[[4.0, 0.0]] * 3] * 2), 2, "two sequences of 3 tokens, capacity 2")),
    ),
))


# ----------------------------------------------------------------- 14.2 load-balancing loss

def _lb_case(student, probs, choice, what):
    got = student(probs.clone(), choice.clone())
    expect_tensor(got, load_balancing_loss(probs, choice.unsqueeze(-1)), name=f"load-balancing loss ({what})")


def _lb_random(student, b, t, e, seed):
    probs = _logits(b, t, e, seed).softmax(-1)
    _lb_case(student, probs, probs.argmax(-1), f"B={b}, T={t}, E={e}")


def _lb_uniform(student):
    e, t = 4, 12
    probs = torch.full((2, t, e), 1 / e)
    choice = (torch.arange(t) % e).expand(2, t).clone()
    got = student(probs.clone(), choice.clone())
    expect_tensor(got, torch.tensor(1.0), name="load-balancing loss at uniform routing (must be exactly 1)")


def _lb_collapsed(student):
    probs = torch.zeros(3, 5, 6)
    probs[..., 2] = 1.0
    choice = torch.full((3, 5), 2)
    got = student(probs.clone(), choice.clone())
    expect_tensor(got, torch.tensor(6.0), name="load-balancing loss when every token goes to one expert (must be E = 6)")


register(Exercise(
    id="14.2",
    title="Switch's load-balancing loss",
    targets=("load_balancing_loss",),
    forbidden=_FORBIDDEN,
    cases=(
        Case("uniform routing gives exactly 1", 2, _lb_uniform),
        Case("collapsed routing gives E", 1, _lb_collapsed),
        Case("random router (B=3, T=10, E=5)", 2, lambda s: _lb_random(s, 3, 10, 5, 3)),
        Case("an expert nobody chose, one group (B=1, T=7, E=8)", 1, lambda s: _lb_random(s, 1, 7, 8, 4)),
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
