"""Chapter 3: train one tiny character LM per positional scheme on length 64, evaluate on longer texts.

    python scripts/ch03_train_extrapolation.py            # about 10 minutes on 2 idle CPU cores

Writes, under companion/checkpoints/:

* ``ch03_extrapolation.json``: the settings, the loss of each scheme at each
  evaluation length, and the loss by position at the longest length;
* ``ch03_position_lms.pt``: the six trained models (float16 state dicts, ~1.4 MB).

The chapter loads both with :func:`companion.experiments.extrapolation.load_extrapolation_results`
and :func:`companion.experiments.extrapolation.load_position_lm`.
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--out", type=Path, default=ROOT / "companion" / "checkpoints")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # one model per core is faster than two threads fighting on a shared machine

    exp = ExperimentConfig(steps=args.steps)
    data = make_data()
    results = {"config": exp.as_dict(), "loss": {}, "loss_by_position": {}, "train_seconds": {}}
    states = {}
    for scheme in POSITION_SCHEMES:
        start = time.time()
        model, hist = train_position_lm(scheme, exp, data, progress=True)
        results["train_seconds"][scheme] = round(time.time() - start, 1)
        results.setdefault("final_train_loss", {})[scheme] = round(sum(hist.train_loss[-50:]) / 50, 4)
        by_length, by_position = evaluate_lengths(model, data, exp)
        results["loss"][scheme] = by_length
        results["loss_by_position"][scheme] = by_position
        states[scheme] = {k: v.half() for k, v in model.state_dict().items()}
        print(scheme, {k: (None if v is None else round(v, 3)) for k, v in by_length.items()}, flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ch03_extrapolation.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    torch.save(states, args.out / "ch03_position_lms.pt")
    print(f"wrote {args.out / 'ch03_extrapolation.json'} and {args.out / 'ch03_position_lms.pt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
