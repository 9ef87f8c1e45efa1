"""Chapter 11: does a short span-corruption pre-training help the multi-task run? Three seeds, with and without.

    python scripts/ch11_pretraining.py            # the recorded protocol, 1 thread (about 25 CPU minutes)
    python scripts/ch11_pretraining.py --seeds 0 --pretrain-steps 20 --steps 20 --out /tmp/p.json   # a quick try
    python scripts/ch11_pretraining.py --control tasks   # the control: pre-trained on the tasks' own strings

The control (``--control tasks``, recorded in ``companion/checkpoints/ch11_pretraining_control.json``)
runs only the pre-trained arm, its span corruption drawn from the tasks' own strings instead of the
course corpus: the first 20,000 examples of the seed's multi-task training stream (inputs and
targets, so no held-out answer), written as text. If the corpus (prose, where digits are rare) were
why pre-training hurts, this arm would not fall as far.

For each seed the same T5 (:class:`companion.text_to_text_t5.TextToTextRecipe` with that seed and
``--steps`` multi-task steps) is trained on the reverse:/sort:/add: mixture twice: from its random
initialisation, and after ``--pretrain-steps`` steps of span corruption on windows of the course
corpus (:func:`companion.text_to_text_t5.pretrain_span_corruption`: characters, 15% noise in spans of
mean length 3, T5's algorithm). Both runs of a seed start from the same initial weights, see the
same multi-task stream and are scored on the same held-out inputs. The runs go one after another;
the record is rewritten after each, so an interrupted protocol keeps the runs it finished
(``protocol.seeds_completed`` lists the seeds with both runs).

Recorded run: seeds 0 and 1 by ``python scripts/ch11_pretraining.py`` (stopped during seed 2), then
seed 2 by ``--seeds 2 --append``, which adds seeds to an existing record; one thread, CPU.

Writes ``companion/checkpoints/ch11_pretraining.json`` (protocol, and per run: held-out exact match
per task, learning curve, pre-training loss, wall and CPU seconds); Chapter 11 reads it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from companion.text_to_text_t5 import (  # noqa: E402
    CONTROL_EXAMPLES, TextToTextRecipe, pretrain_span_corruption, train_text_to_text, training_examples,
)
from companion.training import TrainConfig  # noqa: E402


def task_text(seed: int, n: int = CONTROL_EXAMPLES) -> str:
    """The first ``n`` examples of seed ``seed``'s multi-task training stream, inputs and targets, as text."""
    return " ".join(f"{x} {y}" for x, y in training_examples(seed, n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=1000, help="multi-task steps (both arms)")
    parser.add_argument("--pretrain-steps", type=int, default=800)
    parser.add_argument("--length", type=int, default=32, help="characters per pre-training window")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "companion" / "checkpoints" / "ch11_pretraining.json")
    parser.add_argument("--control", choices=["tasks"], default=None,
                        help="pre-train on the tasks' own strings; only the pre-trained arm runs")
    parser.add_argument("--append", action="store_true",
                        help="add the runs of --seeds to the record already in --out (same protocol otherwise)")
    args = parser.parse_args()
    if args.control and args.out == parser.get_default("out"):
        args.out = args.out.with_name("ch11_pretraining_control.json")
    torch.set_num_threads(args.threads)

    base = TextToTextRecipe()
    train_cfg = dataclasses.replace(base.train, steps=args.steps, eval_every=min(base.train.eval_every, args.steps),
                                    warmup_steps=min(base.train.warmup_steps, args.steps))
    pre_cfg = TrainConfig(steps=args.pretrain_steps, lr=base.train.lr, warmup_steps=min(100, args.pretrain_steps),
                          weight_decay=base.train.weight_decay, eval_every=args.pretrain_steps)
    record = dict(
        protocol=dict(seeds=args.seeds, multitask_steps=args.steps, pretrain_steps=args.pretrain_steps,
                      pretrain_window_chars=args.length, control=args.control, noise_density=0.15, mean_noise_span_length=3.0,
                      batch_size=base.batch_size, heldout_per_task=base.n_heldout, threads=args.threads,
                      recipe={k: v for k, v in dataclasses.asdict(base).items() if k != "train"},
                      train=dataclasses.asdict(train_cfg), pretrain=dataclasses.asdict(pre_cfg)),
        runs=[])
    if args.append:  # continue a protocol: the same settings, more seeds
        old = json.loads(args.out.read_text(encoding="utf-8"))
        mismatch = {k for k in record["protocol"] if k != "seeds" and old["protocol"].get(k) != json.loads(json.dumps(record["protocol"][k]))}
        if mismatch:
            raise SystemExit(f"--append: the record in {args.out} was made with other settings: {sorted(mismatch)}")
        record["runs"] = [r for r in old["runs"] if r["seed"] not in args.seeds]
        record["protocol"]["seeds"] = sorted(set(old["protocol"]["seeds"]) | set(args.seeds))
    for seed in args.seeds:
        recipe = dataclasses.replace(base, seed=seed, train=train_cfg)
        for pretrained in (True,) if args.control else (False, True):
            c0, w0 = time.process_time(), time.perf_counter()
            text = task_text(seed) if args.control else None
            pre = pretrain_span_corruption(recipe, pre_cfg, length=args.length, text=text) if pretrained else None
            out = train_text_to_text(recipe, model=None if pre is None else pre["model"])
            rec = out["record"]
            run = dict(seed=seed, pretrained=pretrained, exact_match=rec["exact_match"],
                       mean_exact_match=sum(rec["exact_match"].values()) / len(rec["exact_match"]),
                       curve=rec["curve"], final_train_loss=rec["final_train_loss"],
                       pretrain=None if pre is None else pre["record"],
                       wall_time_s=round(time.perf_counter() - w0, 1), cpu_time_s=round(time.process_time() - c0, 1))
            record["runs"].append(run)
            arms = {True} if args.control else {False, True}
            done = {r["seed"] for r in record["runs"] if all(
                any(q["seed"] == r["seed"] and q["pretrained"] == a for q in record["runs"]) for a in arms)}
            record["protocol"]["seeds_completed"] = sorted(done)  # both runs recorded
            args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
            print(json.dumps({k: run[k] for k in ("seed", "pretrained", "exact_match", "wall_time_s", "cpu_time_s")}),
                  flush=True)


if __name__ == "__main__":
    main()
