"""Train a Llama-style decoder and the Chapter 9 GPT at equal parameters, for three seeds (Chapter 16).

Both models read the characters of the course corpus (the frozen Python help
topics, 10% held out) in windows of 64, 2 blocks of width 64 with 4 query heads:

* the GPT is ``companion.models.gpt.GPT`` as Chapter 9 trains it: learned
  positions, pre-LayerNorm, a GELU feed-forward network of 4 D, biases, a head
  tied to the token embedding;
* the Llama-style model is ``companion.models.llama.Llama``: rotary positions,
  pre-RMSNorm, a SwiGLU feed-forward network, 2 key/value heads (GQA), no
  biases, an untied head. Its feed-forward width is the one that brings its
  parameter count closest to the GPT's;
* the same Llama-style model, from the same initial draw, with its residual
  projections (each attention output and feed-forward down projection) scaled
  by 1 / sqrt(2 L) as the GPT initialises them (GPT-2, section 2.3): the one
  difference of initialisation between the two models, removed.

Both see the same batches in the same order with the same recipe (AdamW, peak
learning rate 3e-3, warm-up then cosine decay, weight decay 0.1, gradient
clipping 1.0) for the same number of steps. Their steps are interleaved (GPT,
Llama, scaled Llama, GPT...) so that all are timed under the same machine load; the
record holds each model's held-out loss every ``eval_every`` steps with the
training seconds spent until then, so the chapter can plot the loss against
steps and against measured time. Each seed draws its own initialisation and
batches; ``summary`` holds the mean, minimum and maximum over the seeds.

Writes ``companion/checkpoints/ch16_training.json``.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python scripts/ch16_training.py        # the recorded run (seeds 0 1 2, 1 thread, CPU)
    python scripts/ch16_training.py --steps 40 --seeds 0 --out-dir /tmp/ch16   # a quick try
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch
from device_args import add_device_arguments, device_from_args

from companion.calculators import count_parameters
from companion.data import CharTokenizer, load_pydoc_text, random_batch, train_val_split
from companion.experiments import seed_spread
from companion.models.gpt import GPT, GPTConfig, evaluate_lm, lm_loss
from companion.models.llama import Llama, LlamaConfig
from companion.training import TrainConfig, lr_at, weight_decay_groups

SEEDS = (0, 1, 2)
SEQ_LEN = 64
BATCH_SIZE = 32
D_MODEL, N_LAYERS, N_HEADS, N_KV_HEADS = 64, 2, 4, 2
TRAIN = TrainConfig(steps=1000, lr=3e-3, warmup_steps=50, min_lr_ratio=0.1, weight_decay=0.1, eval_every=100)
EVAL_CHARS = 8192  # held-out characters for the curves (the final losses use the whole split)
VAL_FRACTION = 0.1


def configs(vocab_size: int) -> tuple[GPTConfig, LlamaConfig]:
    """The GPT of Chapter 9's shape, and the Llama-style model whose d_ff matches its parameter count best."""
    gpt_cfg = GPTConfig(vocab_size=vocab_size, max_positions=SEQ_LEN, d_model=D_MODEL, n_layers=N_LAYERS,
                        n_heads=N_HEADS)
    target = count_parameters(GPT(gpt_cfg))

    def llama_cfg(d_ff: int) -> LlamaConfig:
        return LlamaConfig(vocab_size=vocab_size, d_model=D_MODEL, n_layers=N_LAYERS, n_heads=N_HEADS,
                           n_kv_heads=N_KV_HEADS, d_ff=d_ff, max_positions=SEQ_LEN, rope_base=10000.0,
                           norm_eps=1e-5, qkv_bias=False, qk_norm=False, tie_embeddings=False)

    best = min(range(8, 8 * D_MODEL), key=lambda f: abs(count_parameters(Llama(llama_cfg(f))) - target))
    return gpt_cfg, llama_cfg(best)


@torch.no_grad()
def scale_residual_projections(model: Llama) -> Llama:
    """Scale the weights that write into the residual stream by 1 / sqrt(2 L), as GPT initialises them."""
    factor = (2 * model.cfg.n_layers) ** -0.5
    for block in model.blocks:
        block.self_attn.out.weight.mul_(factor)
        block.ffn.down.weight.mul_(factor)
    return model


def run_seed(seed: int, tcfg: TrainConfig, device: torch.device) -> dict:
    text = load_pydoc_text()
    tok = CharTokenizer(text)
    train_ids, val_ids = train_val_split(tok.encode(text), VAL_FRACTION)
    gpt_cfg, llama_cfg = configs(tok.vocab_size)
    torch.manual_seed(seed)
    gpt = GPT(gpt_cfg).to(device)
    torch.manual_seed(seed)
    llama = Llama(llama_cfg).to(device)
    torch.manual_seed(seed)
    llama_scaled = scale_residual_projections(Llama(llama_cfg)).to(device)
    models = {"gpt": gpt, "llama": llama, "llama_scaled_init": llama_scaled}
    opts = {name: torch.optim.AdamW(weight_decay_groups(m, tcfg.weight_decay), lr=tcfg.lr, betas=tcfg.betas)
            for name, m in models.items()}
    gen = torch.Generator().manual_seed(seed)
    val_curve = val_ids[:EVAL_CHARS + 1].to(device)
    record = {name: {"eval_steps": [], "eval_loss": [], "eval_seconds": [], "seconds": 0.0} for name in models}
    for step in range(tcfg.steps):
        batch = tuple(t.to(device) for t in random_batch(train_ids, SEQ_LEN, BATCH_SIZE, gen))
        for name, model in models.items():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            for group in opts[name].param_groups:
                group["lr"] = lr_at(step, tcfg)
            model.train()
            loss = lm_loss(model, batch)
            opts[name].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip)
            opts[name].step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            record[name]["seconds"] += time.perf_counter() - start
        if (step + 1) % tcfg.eval_every == 0 or step + 1 == tcfg.steps:
            for name, model in models.items():
                record[name]["eval_steps"].append(step + 1)
                record[name]["eval_loss"].append(round(evaluate_lm(model, val_curve, SEQ_LEN), 4))
                record[name]["eval_seconds"].append(round(record[name]["seconds"], 2))
            print(f"seed {seed} step {step + 1}: " + ", ".join(f"{name} {r['eval_loss'][-1]:.3f}"
                                                              for name, r in record.items()), flush=True)
    final = {name: round(evaluate_lm(m, val_ids.to(device), SEQ_LEN), 4) for name, m in models.items()}
    result = {
        "seed": seed, "final_val_loss": final,
        "seconds_per_step": {name: round(r["seconds"] / tcfg.steps, 5) for name, r in record.items()},
        "curves": {name: {k: r[k] for k in ("eval_steps", "eval_loss", "eval_seconds")} for name, r in record.items()},
    }
    print(json.dumps({k: result[k] for k in ("seed", "final_val_loss", "seconds_per_step")}), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=TRAIN.steps)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parents[1] / "companion/checkpoints")
    add_device_arguments(parser, mixed_precision=False)
    args = parser.parse_args()
    device = device_from_args(args, threads=args.threads)
    tcfg = dataclasses.replace(TRAIN, steps=args.steps, warmup_steps=min(TRAIN.warmup_steps, args.steps))
    runs = [run_seed(seed, tcfg, device) for seed in args.seeds]
    text = load_pydoc_text()
    gpt_cfg, llama_cfg = configs(CharTokenizer(text).vocab_size)
    names = list(runs[0]["final_val_loss"])
    summary = {
        "final_val_loss": {k: seed_spread([r["final_val_loss"][k] for r in runs]) for k in names},
        "llama_minus_gpt": seed_spread([r["final_val_loss"]["llama"] - r["final_val_loss"]["gpt"] for r in runs]),
        "scaled_init_minus_llama": seed_spread([r["final_val_loss"]["llama_scaled_init"] - r["final_val_loss"]["llama"]
                                                for r in runs]),
        "seconds_per_step": {k: seed_spread([r["seconds_per_step"][k] for r in runs], 5) for k in names},
        "llama_over_gpt_time": seed_spread([r["seconds_per_step"]["llama"] / r["seconds_per_step"]["gpt"] for r in runs]),
    }
    result = {
        "seq_len": SEQ_LEN, "batch_size": BATCH_SIZE, "steps": tcfg.steps, "train_config": dataclasses.asdict(tcfg),
        "eval_chars": EVAL_CHARS, "threads": args.threads, "device": device.type,
        "gpt_config": dataclasses.asdict(gpt_cfg), "llama_config": dataclasses.asdict(llama_cfg),
        "parameters": {"gpt": count_parameters(GPT(gpt_cfg)), "llama": count_parameters(Llama(llama_cfg))},
        "seeds": runs, "summary": summary, "torch_version": str(torch.__version__),
        "note": "seconds measured on a shared 2-core machine with other jobs running; steps interleaved",
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "ch16_training.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
