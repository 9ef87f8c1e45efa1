"""Train a tiny character-level GPT with the course's loop, on one process or several (Chapter 15).

The same script runs alone or under ``torchrun``; under ``torchrun`` every rank
builds the same model, takes its share of each step's batch
(:func:`companion.distributed.rank_batches`) and ``companion.training.train``
trains through ``DistributedDataParallel``. Only rank 0 prints and writes the
summary JSON. With ``--checkpoint-dir`` the run saves resumable checkpoints
(``torch.distributed.checkpoint``); ``--resume`` continues from the latest one.

It lives in the package so that a notebook finds it after ``pip install``
(``torchrun -m companion.experiments.ddp_training``); ``scripts/train_ddp.py``
is the same program as a file. Usage::

    python scripts/train_ddp.py --steps 20                              # one process
    torchrun --nproc_per_node=2 scripts/train_ddp.py --steps 20         # two CPU processes (gloo)
    torchrun --nproc_per_node=2 -m companion.experiments.ddp_training --steps 20   # the same
    torchrun --nproc_per_node=2 scripts/train_ddp.py --steps 20 --checkpoint-dir /tmp/run --checkpoint-every 5
    torchrun --nproc_per_node=2 scripts/train_ddp.py --steps 20 --checkpoint-dir /tmp/run --checkpoint-every 5 --resume

``--kill-at STEP`` makes every rank exit abruptly (``os._exit``) when it reaches
STEP, as a crash or a pre-empted job would, to try resuming.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from ..data import CharTokenizer, load_pydoc_text, random_batch, train_val_split
from ..distributed import init, rank_batches
from ..models.gpt import GPT, GPTConfig, evaluate_lm
from ..training import TrainConfig, lm_loss, train

__all__ = ["main", "MODEL"]

MODEL = dict(max_positions=32, d_model=32, n_layers=2, n_heads=2, dropout=0.0)  # dropout 0: resumable exactly
SEED = 0


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv`` (default: the command line) and train; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8, help="the global batch, split over the ranks")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--checkpoint-dir", type=Path)
    parser.add_argument("--checkpoint-every", type=int)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill-at", type=int, help="exit abruptly on reaching this step (to try --resume)")
    parser.add_argument("--out", type=Path, help="rank 0 writes summary.json (losses) and weights.pt in this folder")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    distributed = "RANK" in os.environ
    rank, world = init("gloo") if distributed else (0, 1)
    if args.batch_size % world:
        raise SystemExit(f"--batch-size {args.batch_size} does not split over {world} ranks")

    text = load_pydoc_text()
    tok = CharTokenizer(text)
    train_ids, val_ids = train_val_split(tok.encode(text), 0.1)
    val_ids = val_ids[:2000]  # a quick evaluation
    torch.manual_seed(SEED)  # the same initial weights on every rank
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, **MODEL))

    def global_batch(step: int):  # a function of the step only, so a resumed run sees the same batches
        if step == args.kill_at:
            os._exit(1)
        return random_batch(train_ids, MODEL["max_positions"], args.batch_size,
                            torch.Generator().manual_seed(SEED * 100_003 + step))

    cfg = TrainConfig(steps=args.steps, lr=args.lr, warmup_steps=min(5, args.steps), eval_every=max(1, args.steps // 2))
    hist = train(model, lm_loss, rank_batches(global_batch, rank, world), cfg,
                 eval_fn=lambda m: evaluate_lm(m, val_ids, MODEL["max_positions"]), progress=False,
                 checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every, resume=args.resume)
    if rank == 0:
        summary = {"world": world, "steps": args.steps, "train_loss": hist.train_loss, "eval_loss": hist.eval_loss}
        print(f"world {world}: {args.steps} steps, final train loss {hist.train_loss[-1]:.3f}, "
              f"held-out {hist.eval_loss[-1]:.3f}")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "summary.json").write_text(json.dumps(summary))
            torch.save(model.state_dict(), args.out / "weights.pt")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
