"""Checks for the Chapter 6 exercises (the masks of the three families).

Each case compares the student's mask with :mod:`companion.masks` (itself
tested against Hugging Face ``masking_utils`` and ``nn.Transformer``) on odd
sizes and edge cases, and, where it matters, runs attention with the mask to
check what each position can see.
"""

from __future__ import annotations

import torch

from ..attention import scaled_dot_product_attention
from ..masks import causal_mask, combine_masks, cross_attention_mask, influence_matrix, padding_mask, prefix_lm_mask
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, register


def _expect_bool_mask(got, want: torch.Tensor, name: str) -> None:
    if isinstance(got, torch.Tensor) and got.dtype != torch.bool:
        raise CheckFailed(f"{name} must be a boolean tensor (True = may attend), got dtype {got.dtype}")
    expect_tensor(got, want, name=name)


# ----------------------------------------------------------------- 6.1 prefix-LM

def _prefix_values(student):
    for p, t in ((2, 5), (3, 7), (1, 13)):
        _expect_bool_mask(student(p, t), prefix_lm_mask(p, t), f"prefix_lm_mask({p}, {t})")


def _prefix_edges(student):
    _expect_bool_mask(student(0, 6), causal_mask(6), "prefix_lm_mask(0, 6) (no prefix: a causal mask)")
    _expect_bool_mask(student(6, 6), torch.ones(6, 6, dtype=torch.bool), "prefix_lm_mask(6, 6) (all prefix: bidirectional)")


def _prefix_behaviour(student):
    t, p = 7, 3
    mask = student(p, t)
    expect_true(isinstance(mask, torch.Tensor) and mask.shape == (t, t) and mask.dtype == torch.bool,
                f"prefix_lm_mask({p}, {t}) should be a boolean (T, T) tensor")
    q, k, v = torch.randn(1, 1, t, 4), torch.randn(1, 1, t, 4), torch.randn(1, 1, t, 4)
    out = scaled_dot_product_attention(q, k, v, mask)
    k2, v2 = k.clone(), v.clone()
    k2[..., p, :] += 3.0
    v2[..., p, :] += 3.0  # the first position after the prefix
    changed = (scaled_dot_product_attention(q, k2, v2, mask) - out)[0, 0].abs().amax(dim=-1)  # (T,)
    expect_true(bool((changed[:p] < 1e-6).all()),
                "changing the first token after the prefix changed a prefix position: the prefix must not see it")
    expect_true(bool((changed[p:] > 1e-6).all()), "positions from the prefix on should see the first token after it")


register(Exercise(
    id="6.1",
    title="A prefix-LM mask",
    targets=("prefix_lm_mask",),
    forbidden=("companion.masks",),  # the reference itself
    cases=(
        Case("values for several prefixes and lengths", 2, _prefix_values),
        Case("prefix 0 is causal, prefix T is bidirectional", 1, _prefix_edges),
        Case("the prefix sees the whole prefix and nothing after it", 2, _prefix_behaviour),
    ),
))


# ----------------------------------------------------------------- 6.2 padding + causal

def _pc_values(student):
    real = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0, 0]])
    want = combine_masks(causal_mask(7), padding_mask(real))
    _expect_bool_mask(student(real), want, "mask for a batch of 3 sequences of length 7 (shape (B, 1, T, T))")


def _pc_bool_input(student):
    real = torch.tensor([[True, True, False], [True, True, True]])
    want = combine_masks(causal_mask(3), padding_mask(real))
    _expect_bool_mask(student(real), want, "mask for a boolean attention_mask")


def _pc_broadcasts(student):
    real = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    mask = student(real)
    expect_true(isinstance(mask, torch.Tensor) and mask.dim() == 4,
                f"the mask must have 4 dimensions (B, 1, T, T), got {getattr(mask, 'shape', type(mask).__name__)}")
    scores = torch.zeros(2, 3, 5, 5)  # (B, H, T, T)
    try:
        full = torch.broadcast_shapes(mask.shape, scores.shape)
    except RuntimeError:
        full = None
    expect_true(full == scores.shape, f"a mask of shape {tuple(mask.shape)} does not broadcast to scores (2, 3, 5, 5)")


register(Exercise(
    id="6.2",
    title="Padding and causal masks combined",
    targets=("padding_causal_mask",),
    forbidden=("companion.masks",),  # the reference itself
    cases=(
        Case("values on a batch with different amounts of padding", 2, _pc_values),
        Case("accepts a boolean attention_mask", 1, _pc_bool_input),
        Case("broadcasts to scores of shape (B, H, T, T)", 1, _pc_broadcasts),
    ),
))


# ----------------------------------------------------------------- 6.3 cross-attention

def _cross_values(student):
    enc = torch.tensor([[1] * 13, [1] * 9 + [0] * 4])
    _expect_bool_mask(student(enc, 5), cross_attention_mask(enc, 5), "cross_attention_mask(encoder mask (2, 13), t=5)")


def _cross_one_query(student):
    enc = torch.tensor([[1, 1, 0]])
    _expect_bool_mask(student(enc, 1), cross_attention_mask(enc, 1), "cross_attention_mask for one decoder position")


def _cross_not_causal(student):
    enc = torch.ones(1, 7, dtype=torch.long)
    mask = student(enc, 7)
    expect_true(isinstance(mask, torch.Tensor) and bool(mask.all()),
                "with no encoder padding every decoder position must see every encoder position "
                "(cross-attention is not causal: the whole source is known)")


register(Exercise(
    id="6.3",
    title="A cross-attention mask",
    targets=("cross_attention_mask",),
    forbidden=("companion.masks",),  # the reference itself
    cases=(
        Case("values with encoder padding (T=5, S=13)", 2, _cross_values),
        Case("a single decoder position", 1, _cross_one_query),
        Case("not causal: every decoder position sees the whole source", 1, _cross_not_causal),
    ),
))


# ----------------------------------------------------------------- 6.4 influence

def _window(t, w):
    return causal_mask(t) & ~causal_mask(t).tril(-w)


def _infl_one_layer(student):
    for name, mask in (("causal", causal_mask(7)), ("prefix-LM (3)", prefix_lm_mask(3, 7))):
        for i in (0, 2, 6):
            _expect_bool_mask(student(mask, i, 1), influence_matrix(mask, 1)[i], f"{name} mask, position {i}, 1 layer")


def _infl_depth(student):
    mask = _window(9, 2)  # each position sees itself and one key back
    for layers in (1, 3, 8):
        _expect_bool_mask(student(mask, 8, layers), influence_matrix(mask, layers)[8],
                          f"sliding window of 2, position 8, {layers} layers")


def _infl_residual(student):
    mask = torch.zeros(5, 5, dtype=torch.bool)
    mask[:, 0] = True  # every query reads only key 0
    got = student(mask, 3, 1)
    want = influence_matrix(mask, 1)[3]
    if isinstance(got, torch.Tensor) and got.shape == want.shape and not bool(got[3]):
        raise CheckFailed("position 3 must influence its own output: the residual connection carries it even "
                          "where the mask does not let it attend to itself")
    _expect_bool_mask(got, want, "queries that only read key 0, position 3")


register(Exercise(
    id="6.4",
    title="Which positions can influence position i",
    targets=("influencing_positions",),
    forbidden=("companion.masks",),  # the reference itself
    cases=(
        Case("one layer: causal and prefix-LM masks", 2, _infl_one_layer),
        Case("several layers widen a sliding window", 2, _infl_depth),
        Case("the residual connection always carries the position itself", 1, _infl_residual),
    ),
))
