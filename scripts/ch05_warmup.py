"""Chapter 5: post-LN vs pre-LN, with and without learning-rate warm-up, over several seeds.

Trains the 6- and 12-layer character-level SmallLM of companion.models.small_lm on the
pydoc corpus for each (placement, warm-up, seed) and writes the losses to
companion/checkpoints/ch05_warmup.pt (a few kB), which the chapter loads with
companion.diagnostics.load_warmup_results(). The chapter itself repeats a
shorter run live.

    python scripts/ch05_warmup.py            # all seeds (about 15 min on 2 idle cores)
    # or one process per seed, then merge:
    python scripts/ch05_warmup.py --seeds 0 --out /tmp/s0.pt   (and 1, 2)
    python scripts/ch05_warmup.py --merge /tmp/s0.pt /tmp/s1.pt /tmp/s2.pt
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch

from companion.data import CharTokenizer, load_pydoc_text, train_val_split
from companion.diagnostics import warmup_run
from companion.models.small_lm import SmallLMConfig

SETTINGS = dict(d_model=64, n_heads=4, d_ff=256, max_positions=64)
RUN = dict(steps=200, lr=3e-3, batch_size=16, eval_every=25, eval_batches=4)
WARMUP = 50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--layers", type=int, nargs="+", default=[6, 12])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "companion" / "checkpoints" / "ch05_warmup.pt")
    parser.add_argument("--merge", type=Path, nargs="+", help="merge result files of single seeds into --out")
    args = parser.parse_args()
    if args.merge:
        parts = [torch.load(p, weights_only=True) for p in args.merge]
        runs = []
        for part in parts:
            for r in part["runs"]:
                r.setdefault("n_layers", part["settings"].get("n_layers"))  # files of an older version
                runs.append(r)
        settings = {k: v for k, v in parts[0]["settings"].items() if k != "n_layers"}
        merged = {**parts[0], "settings": settings, "runs": runs}
        torch.save(merged, args.out)
        print(f"merged {len(merged['runs'])} runs into {args.out}")
        return
    torch.set_num_threads(1)  # the machine is shared; runs are small
    text = load_pydoc_text()
    tok = CharTokenizer(text)
    train_ids, val_ids = train_val_split(tok.encode(text))
    cfg = SmallLMConfig(vocab_size=tok.vocab_size, **SETTINGS)
    runs = []
    for n_layers in args.layers:
        for seed in args.seeds:
            for norm_first in (False, True):
                for warmup in (0, WARMUP):
                    t0 = time.time()
                    c = dataclasses.replace(cfg, n_layers=n_layers, norm_first=norm_first)
                    res = warmup_run(c, train_ids, val_ids, warmup_steps=warmup, seed=seed, progress=False, **RUN)
                    runs.append({"n_layers": n_layers, "norm_first": norm_first, "warmup_steps": warmup, "seed": seed, **res})
                    last = res["eval_loss"][-1] if res["eval_loss"] else float("nan")
                    print(f"L={n_layers} seed {seed} {'pre ' if norm_first else 'post'}-LN warm-up {warmup:3d}: "
                          f"final eval {last:.3f} ({time.time() - t0:.0f} s)", flush=True)
    torch.save({"settings": SETTINGS, "run": RUN, "warmup": WARMUP, "runs": runs}, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
