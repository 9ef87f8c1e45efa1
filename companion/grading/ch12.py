"""Checks for the Chapter 12 exercises (comparing the families).

References: :func:`companion.calculators.parameter_count` (itself checked against
Hugging Face's ``T5ForConditionalGeneration`` on the meta device),
:func:`companion.calculators.forward_flops` (checked against
``torch.utils.flop_counter``) and :func:`companion.calculators.generation_kv_cache_bytes`
(checked against a filled :class:`companion.kv_cache.EncoderDecoderCache`).
"""

from __future__ import annotations

from ..calculators import T5Sizes, forward_flops, generation_kv_cache_bytes, parameter_count
from ..models.gpt import GPTConfig
from .core import Case, CheckFailed, Exercise, expect_true, register

_FORBIDDEN = ("transformers", "companion.calculators", "companion.models", "companion.kv_cache",
              "torch.utils.flop_counter")


def _expect_int(got, want, what):
    expect_true(isinstance(got, int) and not isinstance(got, bool),
                f"{what}: the function must return an int, got {type(got).__name__}")
    if got != want:
        raise CheckFailed(f"{what}: expected {want:,}, got {got:,} (difference {got - want:+,})")


# ----------------------------------------------------------------- 12.1 T5's parameter count

def _t5_case(student, what, **kw):
    sizes = T5Sizes(**kw)
    got = student(sizes.vocab_size, sizes.d_model, sizes.d_head, sizes.n_heads, sizes.d_ff, sizes.n_encoder_layers,
                  sizes.n_decoder_layers, sizes.n_buckets, sizes.gated, sizes.tie_embeddings)
    _expect_int(got, parameter_count(sizes), f"parameters of {what}")


register(Exercise(
    id="12.1",
    title="Count the parameters of a T5 model",
    targets=("t5_parameters",),
    forbidden=_FORBIDDEN,
    cases=(
        Case("T5-small", 2, lambda s: _t5_case(s, "T5-small")),
        Case("T5-11B (n_heads * d_head != d_model)", 2, lambda s: _t5_case(
            s, "T5-11B", d_model=1024, d_head=128, n_heads=128, d_ff=65536, n_encoder_layers=24, n_decoder_layers=24)),
        Case("odd sizes, more decoder than encoder layers", 1, lambda s: _t5_case(
            s, "V=97, D=24, d_head=5, H=3, F=40, 2/3 layers, 7 buckets", vocab_size=97, d_model=24, d_head=5,
            n_heads=3, d_ff=40, n_encoder_layers=2, n_decoder_layers=3, n_buckets=7)),
        Case("T5 v1.1 style: gated FFN, untied output layer", 1, lambda s: _t5_case(
            s, "gated and untied", vocab_size=101, d_model=32, d_head=8, n_heads=4, d_ff=48, n_encoder_layers=3,
            n_decoder_layers=1, gated=True, tie_embeddings=False)),
    ),
))


# ----------------------------------------------------------------- 12.2 a decoder's forward FLOPs

def _flops_case(student, what, seq_len, **kw):
    cfg = GPTConfig(**kw)
    got = student(cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.ff_size, seq_len)
    _expect_int(got, forward_flops(cfg, seq_len), f"forward FLOPs of {what}, seq_len={seq_len}")


register(Exercise(
    id="12.2",
    title="Forward FLOPs of a GPT on one sequence",
    targets=("gpt_forward_flops",),
    forbidden=_FORBIDDEN,
    cases=(
        Case("GPT-2 small on 1,024 tokens", 2, lambda s: _flops_case(
            s, "GPT-2 small", 1024, vocab_size=50257, max_positions=1024, d_model=768, n_layers=12, n_heads=12)),
        Case("one token (attention sees one key)", 1, lambda s: _flops_case(
            s, "a tiny GPT", 1, vocab_size=61, max_positions=8, d_model=20, n_layers=3, n_heads=5, d_ff=44)),
        Case("odd sizes, d_ff != 4 d_model", 2, lambda s: _flops_case(
            s, "V=61, D=20, 3 layers, F=44", 13, vocab_size=61, max_positions=16, d_model=20, n_layers=3, n_heads=5,
            d_ff=44)),
        Case("GPT-3 175B on 2,048 tokens", 1, lambda s: _flops_case(
            s, "GPT-3 175B", 2048, vocab_size=50257, max_positions=2048, d_model=12288, n_layers=96, n_heads=96)),
    ),
))


# ----------------------------------------------------------------- 12.3 an encoder-decoder's cache

def _cache_case(student, what, n_decoder_layers, n_heads, d_head, tgt_len, src_len, batch_size, bytes_per_element):
    sizes = T5Sizes(d_model=n_heads * d_head, d_head=d_head, n_heads=n_heads, n_decoder_layers=n_decoder_layers)
    got = student(n_decoder_layers, n_heads, d_head, tgt_len, src_len, batch_size, bytes_per_element)
    want = generation_kv_cache_bytes(sizes, tgt_len, src_len=src_len, batch_size=batch_size,
                                     bytes_per_element=bytes_per_element)
    _expect_int(got, want, f"cache bytes of {what}")


register(Exercise(
    id="12.3",
    title="The KV cache of an encoder-decoder while it generates",
    targets=("encoder_decoder_cache_bytes",),
    forbidden=_FORBIDDEN,
    cases=(
        Case("T5-base, 512 source and 128 target tokens, float32", 2, lambda s: _cache_case(
            s, "T5-base", 12, 12, 64, 128, 512, 1, 4)),
        Case("odd sizes, a batch of 3, bfloat16", 2, lambda s: _cache_case(
            s, "3 layers, 5 heads of 7", 3, 5, 7, 11, 17, 3, 2)),
        Case("before the first target token (tgt_len = 0)", 1, lambda s: _cache_case(
            s, "an empty self-attention cache", 2, 4, 8, 0, 9, 2, 4)),
    ),
))
