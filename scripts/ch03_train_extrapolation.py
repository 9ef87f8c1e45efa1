"""Chapter 3: train one tiny character LM per positional scheme on length 64, evaluate on longer texts.

    python scripts/ch03_train_extrapolation.py            # about 10 minutes a seed on 2 idle CPU cores (3 seeds)

Writes, under companion/checkpoints/:

* ``ch03_extrapolation.json``: the settings, the loss of each scheme at each
  evaluation length, and the loss by position at the longest length;
* ``ch03_position_lms.pt``: the six trained models (float16 state dicts, ~1.4 MB).

The chapter loads both with :func:`companion.experiments.extrapolation.load_extrapolation_results`
and :func:`companion.experiments.extrapolation.load_position_lm`.
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

from companion.experiments.extrapolation import (  # noqa: E402
    ExperimentConfig,
    evaluate_lengths,
    make_data,
    train_position_lm,
)
from companion.models.small_lm import POSITION_SCHEMES  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=ExperimentConfig.steps)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                        help="seeds of the initial weights and batches; the first one's models are shipped")
    parser.add_argument("--out", type=Path, default=ROOT / "companion" / "checkpoints")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # one model per core is faster than two threads fighting on a shared machine

    exp = ExperimentConfig(steps=args.steps, seed=args.seeds[0])
    data = make_data()
    # "loss", "loss_by_position", "train_seconds" and "final_train_loss" describe the first seed (the shipped
    # models); "loss_seeds" holds the loss by length of every seed, for the spread the chapter shows.
    results = {"config": exp.as_dict(), "seeds": args.seeds, "loss": {}, "loss_by_position": {}, "train_seconds": {},
               "final_train_loss": {}, "loss_seeds": {}}
    states = {}
    for seed in args.seeds:
        exp_seed = dataclasses.replace(exp, seed=seed)
        results["loss_seeds"][str(seed)] = {}
        for scheme in POSITION_SCHEMES:
            start = time.time()
            model, hist = train_position_lm(scheme, exp_seed, data, progress=True)
            by_length, by_position = evaluate_lengths(model, data, exp_seed)
            results["loss_seeds"][str(seed)][scheme] = by_length
            print(f"seed {seed}", scheme, {k: (None if v is None else round(v, 3)) for k, v in by_length.items()}, flush=True)
            if seed != args.seeds[0]:
                continue
            results["train_seconds"][scheme] = round(time.time() - start, 1)
            results["final_train_loss"][scheme] = round(sum(hist.train_loss[-50:]) / 50, 4)
            results["loss"][scheme] = by_length
            results["loss_by_position"][scheme] = by_position
            states[scheme] = {k: v.half() for k, v in model.state_dict().items()}

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ch03_extrapolation.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    torch.save(states, args.out / "ch03_position_lms.pt")
    print(f"wrote {args.out / 'ch03_extrapolation.json'} and {args.out / 'ch03_position_lms.pt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
