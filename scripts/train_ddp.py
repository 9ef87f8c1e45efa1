"""Train a tiny character-level GPT with the course's loop on one process or several (Chapter 15).

The program is :mod:`companion.experiments.ddp_training` (in the package, so notebooks find it too).

Usage (from the repository root)::

    python scripts/train_ddp.py --steps 20                          # one process
    torchrun --nproc_per_node=2 scripts/train_ddp.py --steps 20     # two CPU processes (gloo)
    torchrun --nproc_per_node=2 scripts/train_ddp.py --steps 20 --checkpoint-dir /tmp/run --checkpoint-every 5 --kill-at 12
    torchrun --nproc_per_node=2 scripts/train_ddp.py --steps 20 --checkpoint-dir /tmp/run --checkpoint-every 5 --resume
"""

from companion.experiments.ddp_training import main

if __name__ == "__main__":
    main()
