"""T5 benchmarks (Chapter 11): the course's encoder-decoder against Hugging Face ``T5ForConditionalGeneration``, same weights.

1. Forward pass (encoder + teacher-forced decoder) of a padded batch: tokens per second.
2. Greedy generation with a KV cache (self-attention keys grow, cross-attention
   keys computed once) from a padded batch of sources: generated tokens per second.
3. The course's decoding with and without the cache as the output grows:
   milliseconds per generated token.

Both sides run in the same process with the same thread count, timed
alternately (``common.paired_median_seconds``); their outputs are compared
before anything is timed.
"""

from __future__ import annotations

import torch

from .common import Row, Settings, on_device, paired_median_seconds

DEVICES = ("cpu", "cuda", "mps")  # models and batches on Settings.device

# A T5 v1.1-style model (gated GELU, untied head) of 2.6M parameters: D=128, 4 heads of d_kv=32,
# F=512, 4 encoder and 4 decoder layers, a vocabulary of 4,000.
VOCAB, D_MODEL, D_KV, N_HEADS, D_FF, N_LAYERS = 4000, 128, 32, 4, 512, 4


def _models():
    import transformers
    from transformers.utils import logging

    from companion.models.t5 import from_hf_t5

    logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=D_MODEL, d_kv=D_KV, d_ff=D_FF, num_layers=N_LAYERS,
                                num_heads=N_HEADS, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                                dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    hf = transformers.T5ForConditionalGeneration(cfg)
    with torch.no_grad():  # an untied head in both transformers 4.x and 5.x (5.x ties T5's head)
        hf.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, D_MODEL, generator=torch.Generator().manual_seed(1)))
    hf.eval()
    return hf, from_hf_t5(hf).eval()


def _batch(batch: int, s: int):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, VOCAB, (batch, s), generator=g)
    lengths = torch.randint(s // 2, s + 1, (batch,), generator=g)
    lengths[0] = s
    att = (torch.arange(s) < lengths[:, None]).long()  # (B, S), right padding as T5's tokenizer pads
    return ids.masked_fill(att == 0, 0), att


def bench_forward(settings: Settings) -> list[Row]:
    hf, ours = on_device(settings, *_models())
    batch, s, t = (8, 64, 32) if settings.quick else (16, 128, 64)
    src, att = on_device(settings, *_batch(batch, s))
    tgt = on_device(settings, torch.randint(2, VOCAB, (batch, t), generator=torch.Generator().manual_seed(2)))
    with torch.no_grad():
        a = ours(src, tgt, att)
        b = hf(input_ids=src, attention_mask=att, decoder_input_ids=tgt).logits
        if not torch.allclose(a, b, atol=1e-4, rtol=1e-4):
            raise AssertionError("the two T5s disagree: the benchmark would compare different work")
        ta, tb = paired_median_seconds(lambda: ours(src, tgt, att),
                                       lambda: hf(input_ids=src, attention_mask=att, decoder_input_ids=tgt), settings)
    tokens = int(att.sum()) + batch * t
    return [Row("T5 forward (encoder + teacher-forced decoder)", f"B={batch}, S={s} padded, T={t}",
                "companion", tokens / ta, "HF T5ForConditionalGeneration", tokens / tb, "tok/s")]


def _ours_greedy(model, src, att, n: int, use_cache: bool = True) -> torch.Tensor:
    from companion.generation import generate

    lm = model.decoder_lm(src, att)
    start = torch.zeros(src.shape[0], 1, dtype=torch.long, device=src.device)
    return generate(lm, start, n, use_cache=use_cache)  # no EOS: every row runs n steps, as on the HF side


def bench_generation(settings: Settings) -> list[Row]:
    hf, ours = on_device(settings, *_models())
    batch, s, n = (4, 64, 24) if settings.quick else (8, 128, 48)
    src, att = on_device(settings, *_batch(batch, s))

    def theirs():
        return hf.generate(input_ids=src, attention_mask=att, max_new_tokens=n, do_sample=False, num_beams=1,
                           eos_token_id=None, decoder_start_token_id=0, pad_token_id=0)

    with torch.no_grad():
        a, b = _ours_greedy(ours, src, att, n), theirs()
        if a.tolist() != b.tolist():
            raise AssertionError("the two T5s generate different tokens: the benchmark would compare different work")
        ta, tb = paired_median_seconds(lambda: _ours_greedy(ours, src, att, n), theirs, settings)
    tokens = batch * n
    return [Row("T5 greedy generation, KV cache", f"B={batch}, S={s} padded, {n} new tokens",
                "companion", tokens / ta, "HF generate", tokens / tb, "tok/s")]


def bench_cache(settings: Settings) -> list[Row]:
    ours = on_device(settings, _models()[1])
    batch, s = 2, 32
    src, att = on_device(settings, *_batch(batch, s))
    rows = []
    with torch.no_grad():
        for n in ((16, 48) if settings.quick else (16, 48, 96)):
            if _ours_greedy(ours, src, att, n).tolist() != _ours_greedy(ours, src, att, n, use_cache=False).tolist():
                raise AssertionError("cached and recomputed decoding disagree")
            ta, tb = paired_median_seconds(lambda: _ours_greedy(ours, src, att, n, use_cache=False),
                                           lambda: _ours_greedy(ours, src, att, n), settings)
            rows.append(Row("T5 decoding: recompute vs KV cache", f"B={batch}, S={s}, {n} new tokens",
                            "no cache", 1000 * ta / n, "EncoderDecoderCache", 1000 * tb / n, "ms/token"))
    return rows


BENCHMARKS = {
    "forward": bench_forward,
    "generation": bench_generation,
    "cache": bench_cache,
}
