"""Train a tiny mixture-of-experts GPT and a dense GPT with the same active parameters, for three seeds (Chapter 14).

Both models are the course GPT (``companion.models.gpt``) on the characters of
the course corpus: 2 pre-LN blocks of width 64. The dense model has one
feed-forward network of 256 per block; the MoE model has 4 such networks per
block behind a top-1 (Switch) router with capacity factor 1.25, so one token
uses as many parameters in both (plus the router's 64 x 4 per block). They
see the same batches, in the same order, for the same number of steps; their
steps are interleaved (dense, MoE, dense, MoE...) so that both are timed under
the same machine load, and an equal wall-time budget is read off the recorded
curves. The MoE loss adds Switch's load-balancing loss (weight 0.01) and
ST-MoE's router z-loss (weight 0.001). Each seed draws its own initialisation
and its own batches; the top-level fields of the JSON are the first seed's run
(its curves, expert load and capacity sweep), and ``seeds`` holds every seed's
losses, times and curves, with ``summary`` their mean, minimum and maximum.

Writes ``companion/checkpoints/ch14_moe_vs_dense.json`` (losses, curves, expert
load over training, drop rates by capacity factor, wall times) and
``companion/checkpoints/ch14_moe_gpt.pt`` (the trained MoE model, for the
routing drawing of the chapter).

Usage (from the repository root)::

    python scripts/ch14_moe_vs_dense.py                  # the shipped run (seeds 0 1 2, 1 thread)
    python scripts/ch14_moe_vs_dense.py --steps 40 --seeds 0 1 --out-dir /tmp/ch14   # a quick try
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from companion.experiments import seed_spread  # noqa: E402
from companion.data import CharTokenizer, load_pydoc_text, random_batch, train_val_split
from companion.models.gpt import GPT, GPTConfig, evaluate_lm, lm_loss
from companion.calculators import count_parameters
from companion.moe import MoEConfig, MoEFeedForward, drop_rate, expert_load, moe_aux_loss, moe_gpt, moe_parameter_counts
from companion.training import TrainConfig, lr_at, weight_decay_groups

SEEDS = (0, 1, 2)
SEQ_LEN = 64
BATCH_SIZE = 32
MODEL = dict(max_positions=SEQ_LEN, d_model=64, n_layers=2, n_heads=4, d_ff=256, dropout=0.0)
MOE = MoEConfig(n_experts=4, top_k=1, capacity_factor=1.25)
TRAIN = TrainConfig(steps=2000, lr=3e-3, warmup_steps=50, min_lr_ratio=0.1, weight_decay=0.1, eval_every=100)
BALANCE_WEIGHT, Z_WEIGHT = 0.01, 0.001  # Switch (section 2.2) and ST-MoE (section 3.3, equation 5)
EVAL_CHARS = 8192  # held-out characters for the curves (the final losses use the whole split)
CAPACITY_FACTORS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0)
VAL_FRACTION = 0.1


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW with the param groups of companion.training.train, unfused: the update the recorded run used."""
    return torch.optim.AdamW(weight_decay_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas)


def moe_layers(model: torch.nn.Module) -> list[MoEFeedForward]:
    return [m for m in model.modules() if isinstance(m, MoEFeedForward)]


@torch.no_grad()
def capacity_sweep(model: GPT, val_ids: torch.Tensor) -> dict[str, list[float]]:
    """Drop rate and held-out loss of ``model`` with each capacity factor (changed in place, then restored)."""
    layers = moe_layers(model)
    saved = [m.capacity_factor for m in layers]
    x = val_ids[: 64 * SEQ_LEN].view(64, SEQ_LEN)  # 64 windows of the held-out text
    out = {"capacity_factor": list(CAPACITY_FACTORS), "drop_rate": [], "val_loss": []}
    for cf in CAPACITY_FACTORS:
        for m in layers:
            m.capacity_factor = cf
        model.eval()
        model(x)
        out["drop_rate"].append(sum(drop_rate(m.last_routing) for m in layers) / len(layers))
        out["val_loss"].append(evaluate_lm(model, val_ids[:EVAL_CHARS + 1], SEQ_LEN))
    for m, cf in zip(layers, saved):
        m.capacity_factor = cf
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=TRAIN.steps)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parents[1] / "companion/checkpoints")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tcfg = dataclasses.replace(TRAIN, steps=args.steps, warmup_steps=min(TRAIN.warmup_steps, args.steps))
    runs = [run_seed(seed, tcfg, args.threads) for seed in args.seeds]
    result, moe_state = runs[0]
    per_seed = [{"seed": r["seed"], "final_val_loss": r["final_val_loss"], "wall_seconds": r["wall_seconds"],
                 "equal_time_budget_seconds": r["equal_time_budget_seconds"], "at_equal_time": r["at_equal_time"],
                 "curves": {name: {k: c[k] for k in ("eval_steps", "eval_loss", "eval_seconds")}
                            for name, c in r["curves"].items()}} for r, _ in runs]

    def spread(values: list[float]) -> dict[str, float] | None:
        return seed_spread(values) if values else None

    summary = {"final_val_loss": {k: spread([s["final_val_loss"][k] for s in per_seed]) for k in ("dense", "moe")},
               "moe_minus_dense": spread([s["final_val_loss"]["moe"] - s["final_val_loss"]["dense"] for s in per_seed]),
               "wall_seconds": {k: spread([s["wall_seconds"][k] for s in per_seed]) for k in ("dense", "moe")},
               "at_equal_time": {k: spread([s["at_equal_time"][k]["eval_loss"] for s in per_seed if s["at_equal_time"][k]])
                                 for k in ("dense", "moe")}}
    result = {**result, "seeds": per_seed, "summary": summary}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "ch14_moe_vs_dense.json").write_text(json.dumps(result, indent=1))
    torch.save(moe_state, args.out_dir / "ch14_moe_gpt.pt")
    print(json.dumps(summary))


def run_seed(seed: int, tcfg: TrainConfig, threads: int) -> tuple[dict, dict]:
    """Train the dense and the MoE model from ``seed``; return the result record and the MoE checkpoint."""
    text = load_pydoc_text()
    tok = CharTokenizer(text)
    train_ids, val_ids = train_val_split(tok.encode(text), VAL_FRACTION)
    dense_cfg = GPTConfig(vocab_size=tok.vocab_size, **MODEL)
    torch.manual_seed(seed)
    dense = GPT(dense_cfg)
    torch.manual_seed(seed)
    moe = moe_gpt(dense_cfg, MOE)
    init_sweep = capacity_sweep(moe, val_ids)
    models = {"dense": dense, "moe": moe}
    opts = {name: make_optimizer(m, tcfg) for name, m in models.items()}
    gen = torch.Generator().manual_seed(seed)
    n_moe = len(moe_layers(moe))
    record = {name: {"train_loss": [], "eval_steps": [], "eval_loss": [], "eval_seconds": [], "seconds": 0.0}
              for name in models}
    load_sum = torch.zeros(n_moe, MOE.n_experts)
    drops, aux_hist = [], {"load_balancing": [], "z": []}
    load_curve, drop_curve = [], []  # per evaluation interval: mean expert load per layer, mean drop rate
    for step in range(tcfg.steps):
        batch = random_batch(train_ids, SEQ_LEN, BATCH_SIZE, gen)
        for name, model in models.items():
            start = time.perf_counter()
            for group in opts[name].param_groups:
                group["lr"] = lr_at(step, tcfg)
            model.train()
            loss = lm_loss(model, batch)
            total = loss + moe_aux_loss(model, balance_weight=BALANCE_WEIGHT, z_weight=Z_WEIGHT)
            opts[name].zero_grad(set_to_none=True)
            total.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip)
            opts[name].step()
            record[name]["seconds"] += time.perf_counter() - start
            record[name]["train_loss"].append(round(loss.item(), 4))
        layers = moe_layers(moe)
        load_sum += torch.stack([expert_load(m.last_routing) for m in layers])
        drops.append(sum(drop_rate(m.last_routing) for m in layers) / n_moe)
        aux_hist["load_balancing"].append(round(sum(m.aux["load_balancing"].item() for m in layers) / n_moe, 4))
        aux_hist["z"].append(round(sum(m.aux["z"].item() for m in layers) / n_moe, 4))
        if (step + 1) % tcfg.eval_every == 0 or step + 1 == tcfg.steps:
            interval = (step + 1) - (record["moe"]["eval_steps"][-1] if record["moe"]["eval_steps"] else 0)
            load_curve.append((load_sum / interval).tolist())
            drop_curve.append(sum(drops[-interval:]) / interval)
            load_sum.zero_()
            for name, model in models.items():
                record[name]["eval_steps"].append(step + 1)
                record[name]["eval_loss"].append(round(evaluate_lm(model, val_ids[:EVAL_CHARS + 1], SEQ_LEN), 4))
                record[name]["eval_seconds"].append(round(record[name]["seconds"], 2))
            print(f"step {step + 1}: dense {record['dense']['eval_loss'][-1]:.3f}, "
                  f"moe {record['moe']['eval_loss'][-1]:.3f}, drop {drop_curve[-1]:.3f}", flush=True)

    # Equal wall-time budget: the slower model's training time caps both; each model's last
    # evaluation within the budget is its loss at that budget.
    budget = min(r["seconds"] for r in record.values())
    at_budget = {}
    for name, r in record.items():
        within = [i for i, s in enumerate(r["eval_seconds"]) if s <= budget + 1e-9]
        at_budget[name] = {"steps": r["eval_steps"][within[-1]], "eval_loss": r["eval_loss"][within[-1]]} if within else None
    result = {
        "seed": seed, "threads": threads, "steps": tcfg.steps, "batch_size": BATCH_SIZE, "seq_len": SEQ_LEN,
        "train_config": dataclasses.asdict(tcfg), "balance_weight": BALANCE_WEIGHT, "z_weight": Z_WEIGHT,
        "dense_config": dataclasses.asdict(dense_cfg), "moe_config": {**dataclasses.asdict(dense_cfg), **dataclasses.asdict(MOE)},
        "parameters": {"dense": moe_parameter_counts(dense), "moe": moe_parameter_counts(moe)},
        "final_val_loss": {name: round(evaluate_lm(m, val_ids, SEQ_LEN), 4) for name, m in models.items()},
        "wall_seconds": {name: round(r["seconds"], 1) for name, r in record.items()},
        "equal_time_budget_seconds": round(budget, 1), "at_equal_time": at_budget,
        "curves": record, "expert_load": load_curve, "drop_rate_curve": [round(d, 4) for d in drop_curve],
        "aux_losses": aux_hist,
        "capacity_sweep": {"init": init_sweep, "trained": capacity_sweep(moe, val_ids)},
        "torch_version": str(torch.__version__),
        "note": "wall times measured on a shared 2-core machine with other jobs running; steps interleaved",
    }
    state = {"config": dataclasses.asdict(dense_cfg), "moe": dataclasses.asdict(MOE), "state_dict": moe.state_dict(),
             "chars": tok.chars, "seed": seed, "steps": tcfg.steps}
    print(json.dumps({k: result[k] for k in ("seed", "final_val_loss", "wall_seconds", "at_equal_time")}), flush=True)
    return result, state


if __name__ == "__main__":
    main()
