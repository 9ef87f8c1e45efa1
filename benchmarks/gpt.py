"""GPT benchmarks (Chapters 9 and 10): the companion GPT against Hugging Face GPT2LMHeadModel.

1. Training step (forward, backward, AdamW step), same config and weights: tokens per second.
2. Cached greedy generation, companion ``generate`` vs HF ``generate``: generated tokens per second.
3. Companion generation with vs without the KV cache at several lengths: milliseconds per generated token.

Both sides of a comparison run in the same process, with the same thread
count, timed alternately (see ``common.paired_median_seconds``). With
``--device cuda`` both run on the GPU; with ``--compile`` the training step
is also timed with both models ``torch.compile``'d (the first calls, untimed, compile).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from .common import Row, Settings, median_seconds, on_device, paired_median_seconds

DEVICES = ("cpu", "cuda", "mps")

# A 0.8M-parameter GPT-2: 4 layers, D=128, 4 heads, byte vocabulary.
VOCAB, D_MODEL, N_LAYERS, N_HEADS, BLOCK = 256, 128, 4, 4, 512


def _models():
    import transformers
    from transformers.utils import logging

    from companion.models.gpt import from_hf_gpt2

    logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=BLOCK, n_embd=D_MODEL, n_layer=N_LAYERS, n_head=N_HEADS,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )
    hf = transformers.GPT2LMHeadModel(cfg)
    hf.generation_config.eos_token_id = None  # never stop early: both sides generate exactly N tokens
    ours = from_hf_gpt2(hf)
    return hf, ours


def _placed(settings: Settings):
    return on_device(settings, *_models())


def _train_step(model, optimizer, x, y, hf: bool):
    logits = model(x).logits if hf else model(x)  # (B, T, V)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def bench_training(settings: Settings) -> list[Row]:
    hf, ours = _placed(settings)
    n_params = sum(p.numel() for p in ours.parameters())
    batch, t = (8, 128) if settings.quick else (16, 128)
    if settings.device != "cpu":
        batch *= 4  # a GPU idles on the CPU's batch
    g = torch.Generator().manual_seed(0)
    x, y = on_device(settings, torch.randint(0, VOCAB, (batch, t), generator=g), torch.randint(0, VOCAB, (batch, t), generator=g))
    hf.train(), ours.train()
    steps = 2 if settings.quick else 3
    tokens = steps * batch * t
    setting = f"{n_params / 1e6:.2f}M params, B={batch}, T={t}, {settings.device}"

    def timed(a, b):
        opt_a, opt_b = (torch.optim.AdamW(m.parameters(), lr=1e-4) for m in (a, b))
        ta, tb = paired_median_seconds(lambda: [_train_step(a, opt_a, x, y, hf=False) for _ in range(steps)],
                                       lambda: [_train_step(b, opt_b, x, y, hf=True) for _ in range(steps)], settings)
        return tokens / ta, tokens / tb

    eager_ours, eager_hf = timed(ours, hf)
    rows = [Row("GPT training step (fwd+bwd+AdamW)", setting, "companion", eager_ours, "HF GPT2LMHeadModel", eager_hf,
                "tok/s")]
    if settings.compile:
        compiled_ours, compiled_hf = timed(torch.compile(ours), torch.compile(hf))
        rows += [Row("GPT training step, torch.compile", setting, "companion compiled", compiled_ours,
                     "HF compiled", compiled_hf, "tok/s"),
                 Row("GPT training step, compiled / eager", setting, "companion compiled", compiled_ours,
                     "companion eager", eager_ours, "tok/s")]
    return rows


def bench_generation(settings: Settings) -> list[Row]:
    from companion.generation import generate

    hf, ours = _placed(settings)
    hf.eval(), ours.eval()
    rows = []
    prompt_len, n_new = 16, (64 if settings.quick else 128)
    for batch in (1, 8):
        prompt = on_device(settings, torch.randint(0, VOCAB, (batch, prompt_len), generator=torch.Generator().manual_seed(1)))
        mask = torch.ones_like(prompt)

        def run_hf():
            with torch.no_grad():
                return hf.generate(prompt, attention_mask=mask, do_sample=False, max_new_tokens=n_new,
                                   min_new_tokens=n_new, pad_token_id=0)

        def run_ours():
            return generate(ours, prompt, n_new)

        assert torch.equal(run_ours(), run_hf()), "the two greedy generations differ"
        ta, tb = paired_median_seconds(run_ours, run_hf, settings)
        rows.append(Row("greedy generation, KV cache", f"B={batch}, prompt {prompt_len}, {n_new} new, {settings.device}",
                        "companion", batch * n_new / ta, "HF generate", batch * n_new / tb, "tok/s"))
    return rows


def bench_cache_lengths(settings: Settings) -> list[Row]:
    from companion.generation import generate

    _, ours = _placed(settings)
    ours.eval()
    prompt = on_device(settings, torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(2)))
    lengths = (32, 128) if settings.quick else (32, 128, 384)
    quick = dataclasses.replace(settings, repeats=max(1, settings.repeats - 2), warmup=1)  # no-cache runs are long
    rows = []
    for n in lengths:
        t_cache, t_full = paired_median_seconds(lambda: generate(ours, prompt, n),
                                                lambda: generate(ours, prompt, n, use_cache=False), quick)
        rows.append(Row("generation: no cache / cache", f"B=1, {n} new tokens, {settings.device}",
                        "no cache", 1e3 * t_full / n, "KV cache", 1e3 * t_cache / n, "ms/token"))
    return rows


BENCHMARKS = {
    "training": bench_training,
    "generation": bench_generation,
    "cache": bench_cache_lengths,
}
