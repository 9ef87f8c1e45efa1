"""Argument checks shared by the public functions of ``companion``.

Every public function checks its inputs and raises a ``ValueError`` (or
``TypeError``) that says what was expected and what came, so that a learner
sees ``q must have shape (B, H, T, Dh), got (2, 7, 16)`` instead of an
obscure error from deep inside ``torch.matmul``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["ShapeChecker", "check_positive_int", "check_probability", "check_token_ids"]


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


def check_token_ids(
    name: str,
    ids: object,
    vocab_size: int | None,
    dims: Sequence[int | str | None] = ("B", "T"),
    sc: ShapeChecker | None = None,
) -> torch.Tensor:
    """Return ``ids`` if it holds token ids a model's embedding can read; raise a clear error otherwise.

    The one rule of every model's ``forward``: a tensor of shape ``dims``
    (symbols bound in ``sc`` when given) with at least one token on its last
    axis, of dtype int64 or int32 (what ``nn.Embedding`` takes; ``TypeError``
    otherwise), each id in ``[0, vocab_size)`` (``ValueError``; ``vocab_size=None``
    skips the range). Without the range check an id of 60 in a 50-token
    vocabulary ends in torch's ``IndexError: index out of range in self``. The range
    is read only from ids on the CPU and outside ``torch.compile``: on a GPU, reading
    two values would make the host wait for the device at every forward pass (and break
    a compiled graph), so there the embedding's own device-side check stands.
    """
    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.long, torch.int32):
        got = f"dtype {ids.dtype}" if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise TypeError(f"{name} must hold integer token ids (int64 or int32) of shape {_fmt(dims)}, got {got}")
    (ShapeChecker() if sc is None else sc).check(name, ids, dims)
    if ids.shape[-1] == 0:
        raise ValueError(f"{name} must hold at least one token, got shape {tuple(ids.shape)}")
    if vocab_size is not None and ids.device.type == "cpu" and not torch.compiler.is_compiling():
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(f"{name} must lie in [0, {vocab_size}), got range [{low}, {high}]")
    return ids
