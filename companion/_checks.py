"""Argument checks shared by the public functions of ``companion``.

Every public function checks its inputs and raises a ``ValueError`` (or
``TypeError``) that says what was expected and what came, so that a learner
sees ``q must have shape (B, H, T, Dh), got (2, 7, 16)`` instead of an
obscure error from deep inside ``torch.matmul``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["ShapeChecker", "check_positive_int", "check_probability"]


def _fmt(dims: Sequence[object]) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ")"


class ShapeChecker:
    """Checks tensor shapes against symbolic dimensions, binding each symbol once.

    >>> sc = ShapeChecker()
    >>> sc.check("q", torch.zeros(2, 4, 7, 8), ("B", "H", "T", "Dh"))
    >>> sc.check("k", torch.zeros(2, 4, 9, 8), ("B", "H", "S", "Dh"))  # Dh must agree
    >>> sc["S"]
    9

    A dimension may be an ``int`` (must match exactly), a ``str`` (a symbol
    bound by its first use), or ``None`` (anything).
    """

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}

    def __getitem__(self, symbol: str) -> int:
        return self.sizes[symbol]

    def check(self, name: str, x: object, dims: Sequence[int | str | None]) -> None:
        # (Called several times per layer per forward pass: written to cost little when all is well.)
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape {_fmt(dims)}, got {type(x).__name__}")
        shape = x.shape
        if len(shape) != len(dims):
            raise ValueError(
                f"{name} must have {len(dims)} dimensions {_fmt(dims)}, "
                f"got {x.dim()} with shape {tuple(shape)}"
            )
        sizes = self.sizes
        for axis, want in enumerate(dims):
            if want is None:
                continue
            got = shape[axis]
            if isinstance(want, str):
                bound = sizes.setdefault(want, got)
                if bound != got:
                    raise ValueError(
                        f"{name} has {want}={got} (shape {tuple(shape)}), but {want}={bound} "
                        f"in an earlier argument; expected {name} of shape {_fmt(dims)}"
                    )
            elif got != want:
                raise ValueError(
                    f"{name} must have shape {_fmt(dims)} with size {want} on axis {axis}, "
                    f"got shape {tuple(shape)}"
                )


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` if it is a positive ``int``; raise a clear error otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return value


def check_probability(name: str, value: float) -> float:
    """Return ``value`` if it lies in [0, 1); raise a clear error otherwise."""
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{name} must lie in [0, 1), got {value}")
    return float(value)
