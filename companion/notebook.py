"""Helpers for the chapter notebooks: seeding and ``glue`` that works everywhere.

Inside the book build, :func:`glue` is myst-nb's ``glue``, so prose can show a
number the notebook computed (``{glue:text}`name:.3f```). In Colab or a plain
Jupyter without myst-nb it does nothing visible, so the
same notebook runs unchanged.

"""

from __future__ import annotations

import random
from typing import Any

import torch

__all__ = ["glue", "seed_everything", "in_colab"]


def glue(name: str, value: Any, display: bool = False) -> None:
    """Record ``value`` under ``name`` for the book's prose.

    Returns ``None``, so that a ``glue(...)`` on the last line of a cell does
    not echo its value as a second output.
    """
    try:
        from myst_nb import glue as _myst_glue
    except ImportError:  # Colab, plain Jupyter: nothing to record into
        if display:
            from IPython.display import display as _display

            _display(value)
        return
    _myst_glue(name, value, display=display)


def seed_everything(seed: int = 0) -> torch.Generator:
    """Seed Python, NumPy (if present) and torch; return a torch generator seeded the same way."""
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def in_colab() -> bool:
    """True when running inside Google Colab."""
    import sys

    return "google.colab" in sys.modules
