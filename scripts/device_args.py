"""The --device (and --mixed-precision) options the training scripts share.

Every shipped checkpoint and recorded run was made on the CPU, so ``cpu`` is
the default and reproduces them (with the script's own --threads); ``cuda``,
``mps`` or ``auto`` (:func:`companion.device.pick_device`) train elsewhere,
for a learner with a GPU, and give other numbers. Scripts import it as
``from device_args import ...`` (Python puts the script's folder on the path).
"""

from __future__ import annotations

import argparse

import torch

from companion.device import pick_device


def add_device_arguments(parser: argparse.ArgumentParser, *, mixed_precision: bool = True) -> None:
    parser.add_argument("--device", default="cpu",
                        help="cpu (default: reproduces the shipped run), cuda, cuda:1, mps, or auto (the first present)")
    if mixed_precision:
        parser.add_argument("--mixed-precision", action="store_true",
                            help="autocast as the device supports: bf16 on recent GPUs, fp16 + loss scale on older")


def device_from_args(args: argparse.Namespace, threads: int | None = None) -> torch.device:
    """The device asked for (refused if absent); on the CPU, ``threads`` threads (the recorded runs' setting)."""
    device = pick_device(None if args.device == "auto" else args.device)
    if device.type == "cpu" and threads is not None:
        torch.set_num_threads(threads)
    return device
