"""Checks for the Chapter 9 exercises (GPT).

Each case builds random inputs, runs the student's code and compares it with the
reference in :mod:`companion.models.gpt` and :mod:`companion.tokenizers.bpe`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import torch
from torch import nn

from ..attention import MultiHeadAttention
from ..models.gpt import GPT, GPTConfig
from ..calculators import count_parameters
from ..tokenizers.bpe import merge_pair, pair_counts
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, register


# ----------------------------------------------------------------- 9.1 causal self-attention

def _reference_attention(d_model: int, n_heads: int, seed: int) -> MultiHeadAttention:
    """The attention of a GPT block (fused qkv D -> 3D, out D -> D), called with ``is_causal=True``."""
    torch.manual_seed(seed)
    layer = MultiHeadAttention(d_model, n_heads).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.3)
    return layer


def _run_attention(student, layer: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    return student(x, layer.qkv.weight.detach(), layer.qkv.bias.detach(),
                   layer.out.weight.detach(), layer.out.bias.detach(), layer.n_heads)


def _attn_random(student):
    layer = _reference_attention(24, 3, 0)
    x = torch.randn(2, 7, 24)
    with torch.no_grad():
        expect_tensor(_run_attention(student, layer, x), layer(x, is_causal=True), name="output for B=2, T=7, D=24, H=3")


def _attn_heads(student):
    layer = _reference_attention(20, 5, 1)
    x = torch.randn(3, 13, 20)
    with torch.no_grad():
        want = layer(x, is_causal=True)
        got = _run_attention(student, layer, x)
    expect_tensor(got, want, name="output for T=13, D=20, H=5 (head size 4)")


def _attn_causal(student):
    layer = _reference_attention(16, 2, 2)
    x = torch.randn(1, 9, 16)
    x2 = x.clone()
    x2[:, 5:] += 3.0  # change positions 5..8 only
    with torch.no_grad():
        a, b = _run_attention(student, layer, x), _run_attention(student, layer, x2)
    expect_true(isinstance(a, torch.Tensor) and a.shape == (1, 9, 16), f"the output must have shape (1, 9, 16), got {getattr(a, 'shape', type(a).__name__)}")
    changed = (a[:, :5] - b[:, :5]).abs().max().item()
    expect_true(changed < 1e-5, f"changing tokens 5..8 changed the outputs of tokens 0..4 by {changed:.3g}: position i must not see j > i")


def _attn_length_one(student):
    layer = _reference_attention(12, 4, 3)
    x = torch.randn(4, 1, 12)
    with torch.no_grad():
        expect_tensor(_run_attention(student, layer, x), layer(x, is_causal=True), name="output for T=1")


register(Exercise(
    id="9.1",
    title="Causal self-attention with a fused qkv projection",
    targets=("causal_self_attention",),
    forbidden=("companion.models", "companion.attention"),  # the reference itself
    cases=(
        Case("random input (B=2, T=7, D=24, H=3)", 3, _attn_random),
        Case("five heads of size 4, T=13", 2, _attn_heads),
        Case("no position sees the future", 2, _attn_causal),
        Case("a single token", 1, _attn_length_one),
    ),
))


# ----------------------------------------------------------------- 9.2 one BPE training step

def _bpe_reference(words: dict[tuple[int, ...], int], new_id: int):
    counts = pair_counts(words)
    best = max(counts.values())
    pair = min(p for p, c in counts.items() if c == best)
    merged = Counter()
    for w, f in words.items():
        merged[tuple(merge_pair(w, pair, new_id))] += f
    return pair, dict(merged)


def _check_bpe(student, words, new_id, what):
    result = student(dict(words), new_id)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise CheckFailed(f"bpe_step should return a pair (pair, new_words), got {type(result).__name__}")
    pair, new_words = result
    want_pair, want_words = _bpe_reference(words, new_id)
    expect_true(tuple(pair) == want_pair, f"{what}: expected the pair {want_pair}, got {pair}")
    got = {tuple(w): f for w, f in dict(new_words).items()}
    expect_true(got == want_words, f"{what}: after merging {want_pair} -> {new_id} expected {want_words}, got {got}")


def _bpe_by_hand(student):
    # "low" x5, "lower" x2, "newest" x6, "widest" x3 (Sennrich et al., 2016, figure 1), as bytes.
    words = {tuple(w.encode()): f for w, f in {"low": 5, "lower": 2, "newest": 6, "widest": 3}.items()}
    _check_bpe(student, words, 256, "Sennrich et al.'s example")


def _bpe_random(student):
    g = torch.Generator().manual_seed(9)
    words = {}
    for _ in range(12):
        n = int(torch.randint(1, 8, (1,), generator=g))
        w = tuple(int(i) for i in torch.randint(0, 5, (n,), generator=g))
        words[w] = words.get(w, 0) + int(torch.randint(1, 9, (1,), generator=g))
    _check_bpe(student, words, 300, "random words over 5 symbols")


def _bpe_overlap(student):
    _check_bpe(student, {(7, 7, 7): 1, (7, 7, 7, 7): 1}, 256, "overlapping pairs 7 7 7")


def _bpe_tie(student):
    _check_bpe(student, {(3, 4): 2, (1, 2): 2, (9, 9, 1): 1}, 400, "a tie between (1, 2) and (3, 4)")


register(Exercise(
    id="9.2",
    title="One step of BPE training",
    targets=("bpe_step",),
    forbidden=("companion.tokenizers",),  # the reference itself
    cases=(
        Case("Sennrich et al.'s low/lower/newest/widest", 2, _bpe_by_hand),
        Case("random words", 2, _bpe_random),
        Case("overlapping occurrences merge left to right", 2, _bpe_overlap),
        Case("ties go to the smallest pair", 1, _bpe_tie),
    ),
))


# ----------------------------------------------------------------- 9.3 GPT-2's Conv1D weights

def _conv_case(student, d_in, d_out, seed):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(d_in, d_out, generator=g)  # Conv1D layout (in, out)
    bias = torch.randn(d_out, generator=g)
    x = torch.randn(2, 5, d_in, generator=g)
    linear = student(weight.clone(), bias.clone())
    expect_true(isinstance(linear, nn.Linear), f"linear_from_conv1d must return an nn.Linear, got {type(linear).__name__}")
    expect_true(tuple(linear.weight.shape) == (d_out, d_in),
                f"nn.Linear({d_in}, {d_out}).weight has shape ({d_out}, {d_in}), got {tuple(linear.weight.shape)}")
    with torch.no_grad():
        expect_tensor(linear(x), x @ weight + bias, name=f"output of the layer {d_in} -> {d_out} (Conv1D computes x @ W + b)")


register(Exercise(
    id="9.3",
    title="Load a GPT-2 Conv1D weight into nn.Linear",
    targets=("linear_from_conv1d",),
    forbidden=("companion.models",),  # the reference itself
    cases=(
        Case("c_attn-like: 8 -> 24", 2, lambda s: _conv_case(s, 8, 24, 0)),
        Case("c_proj-like: 24 -> 8", 2, lambda s: _conv_case(s, 24, 8, 1)),
        Case("square 6 -> 6 (a transposition error cannot hide behind a shape error)", 2, lambda s: _conv_case(s, 6, 6, 2)),
    ),
))


# ----------------------------------------------------------------- 9.4 parameter count

def _count_case(student, cfg: GPTConfig):
    with torch.device("meta"):
        want = count_parameters(GPT(cfg))
    got = student(cfg)
    expect_true(isinstance(got, int) and not isinstance(got, bool), f"gpt_param_count must return an int, got {type(got).__name__}")
    fields = (f"vocab_size={cfg.vocab_size}, max_positions={cfg.max_positions}, d_model={cfg.d_model}, "
              f"n_layers={cfg.n_layers}, ff_size={cfg.ff_size}, tie_embeddings={cfg.tie_embeddings}, "
              f"final_norm={cfg.final_norm}")
    expect_true(got == want, f"for {fields} expected {want:,} parameters, got {got:,} (off by {got - want:+,})")


_SMALL = GPTConfig(vocab_size=101, max_positions=17, d_model=24, n_layers=3, n_heads=4)

register(Exercise(
    id="9.4",
    title="Count a GPT's parameters in closed form",
    targets=("gpt_param_count",),
    forbidden=("companion.models",),  # the reference itself
    cases=(
        Case("a small GPT-2 style config", 2, lambda s: _count_case(s, _SMALL)),
        Case("d_ff different from 4 * d_model", 1, lambda s: _count_case(s, dataclasses.replace(_SMALL, d_ff=50))),
        Case("untied output layer", 1, lambda s: _count_case(s, dataclasses.replace(_SMALL, tie_embeddings=False))),
        Case("GPT-1 style: no final LayerNorm", 1, lambda s: _count_case(s, dataclasses.replace(_SMALL, norm_first=False, final_norm=False))),
        Case("GPT-2 XL", 1, lambda s: _count_case(s, GPTConfig(vocab_size=50257, max_positions=1024, d_model=1600, n_layers=48, n_heads=25)), timeout=30.0),
    ),
))
