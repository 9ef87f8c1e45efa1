"""Small trained checkpoints shipped inside the package, so notebooks find them after ``pip install`` too.

Each ``*.pt`` file here is written by a script under ``scripts/`` (for example
``scripts/ch09_train_gpt.py`` writes ``ch09_tiny_gpt.pt``).
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import torch

__all__ = ["load_checkpoint", "checkpoint_names"]


def checkpoint_names() -> list[str]:
    """Names of the checkpoints shipped with the package (without ``.pt``)."""
    return sorted(f.name[:-3] for f in resources.files(__name__).iterdir() if f.name.endswith(".pt"))


def load_checkpoint(name: str) -> dict[str, Any]:
    """Load ``companion/checkpoints/<name>.pt`` (a dict) on the CPU, found via ``importlib.resources``."""
    ref = resources.files(__name__) / f"{name}.pt"
    if not ref.is_file():
        raise FileNotFoundError(f"no checkpoint {name!r} in companion/checkpoints; shipped: {checkpoint_names()}")
    with resources.as_file(ref) as path:
        return torch.load(path, map_location="cpu", weights_only=True)
