"""Distil the Chapter 7 tiny BERT into a student with half its blocks, and record the result.

Writes ``companion/checkpoints/ch08_distill.json``: held-out masked-token loss and
accuracy of the teacher (4 blocks), of the student right after initialisation
from blocks 0 and 2, of the student trained with DistilBERT's loss, and of the
same student trained with the MLM loss only (same steps, batches, masks and
learning rate), with wall times and parameter counts. Each training run is
repeated for every seed in ``--seeds`` (the seed draws the batches, the masks and
the dropout); the record keeps every seed's result under ``per_seed`` and, in
``distilled`` and ``mlm_only``, the mean with the min and max over seeds.

Usage (from the repository root)::

    python scripts/ch08_distill.py
    python scripts/ch08_distill.py --steps 20 --seeds 0 --out /tmp/d.json   # a quick try
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from companion.data import load_pydoc_text
from companion.distillation import distillation_loss, student_from_teacher
from companion.calculators import count_parameters
from companion.pretraining import (build_mlm_blocks, corpus_documents, evaluate_mlm, load_tiny_bert, mask_held_out,
                                   masked_batches, mlm_loss, split_blocks)
from companion.training import TrainConfig, train

STEPS = 400
BATCH_SIZE = 32
TRAIN = TrainConfig(steps=STEPS, lr=5e-4, warmup_steps=40, min_lr_ratio=0.1, weight_decay=0.01, eval_every=100)
SEEDS = (0, 1, 2)
ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "companion/checkpoints/ch08_distill.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    teacher, tok = load_tiny_bert()
    seq_len = teacher.cfg.max_positions
    train_blocks, held_blocks = split_blocks(build_mlm_blocks(corpus_documents(load_pydoc_text()), tok, seq_len))
    mask_args = dict(mask_id=tok.vocab["[MASK]"], special_ids=tok.special_ids, vocab_size=tok.vocab_size)
    held = mask_held_out(held_blocks, **mask_args)
    tcfg = dataclasses.replace(TRAIN, steps=args.steps, warmup_steps=min(TRAIN.warmup_steps, args.steps))

    def batches(seed):  # for one seed, the same batches and masks for both students
        return masked_batches(train_blocks, BATCH_SIZE, seed=seed, **mask_args)

    def evaluate(model):
        loss, acc = evaluate_mlm(model, *held)
        return {"held_out_loss": round(loss, 4), "held_out_accuracy": round(acc, 4)}

    out = {"steps": args.steps, "batch_size": BATCH_SIZE, "train": dataclasses.asdict(tcfg), "threads": args.threads,
           "seeds": args.seeds, "teacher": {"n_layers": teacher.cfg.n_layers, "parameters": count_parameters(teacher),
                                     **evaluate(teacher)}}
    initial = student_from_teacher(teacher)
    out["student_init"] = {"n_layers": initial.cfg.n_layers, "parameters": count_parameters(initial),
                           **evaluate(initial)}
    runs = {
        "distilled": lambda m, b: distillation_loss(m, teacher, b[0], b[2], b[1]).total,
        "mlm_only": mlm_loss,
    }
    out["per_seed"] = {}
    for seed in args.seeds:
        row = {}
        for name, loss_fn in runs.items():
            torch.manual_seed(seed)
            student = student_from_teacher(teacher)
            t0 = time.perf_counter()
            train(student, loss_fn, batches(seed), tcfg, desc=f"{name} seed {seed}")
            seconds = time.perf_counter() - t0
            row[name] = {**evaluate(student), "seconds": round(seconds, 1)}
            print(seed, name, row[name], flush=True)
        out["per_seed"][str(seed)] = row
    for name in runs:  # mean, min and max over seeds
        rows = [out["per_seed"][str(seed)][name] for seed in args.seeds]
        out[name] = {}
        for key in ("held_out_loss", "held_out_accuracy", "seconds"):
            values = [r[key] for r in rows]
            out[name][key] = round(sum(values) / len(values), 4)
            out[name][f"{key}_min"], out[name][f"{key}_max"] = min(values), max(values)
    with torch.no_grad():  # forward time, teacher vs student, one batch of held-out blocks
        ids, att = held[0][:32], held[1][:32]
        times = {}
        for label, model in (("teacher", teacher), ("student", initial)):
            model.eval()  # no dropout: inference speed
            model(ids, att)
            best = float("inf")
            for _ in range(10):
                t0 = time.perf_counter()
                model(ids, att)
                best = min(best, time.perf_counter() - t0)
            times[label] = best
    out["forward_speedup"] = round(times["teacher"] / times["student"], 2)
    print(out)
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
