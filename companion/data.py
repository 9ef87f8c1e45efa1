"""Offline text and batching helpers shared by the training chapters.

The corpus is Python's own documentation topics (``pydoc_data.topics``): 465,126
characters of real English prose and code, frozen from Python 3.11.7 and
shipped inside the package (see :mod:`companion.corpus` for its provenance and
licence), so it is the same on every Python version and no download is needed.
"""

from __future__ import annotations

import torch

from ._checks import check_positive_int

__all__ = ["load_pydoc_text", "CharTokenizer", "train_val_split", "random_batch"]


def load_pydoc_text() -> str:
    """Python 3.11.7's help topics (``pydoc_data.topics``), joined in sorted key order.

    The text is frozen package data, checked by its SHA-256 when loaded, so it
    does not depend on the Python that runs it.
    """
    from .corpus import load_text

    return load_text()


class CharTokenizer:
    """Character-level tokenizer: one id per distinct character of the training text."""

    def __init__(self, text: str) -> None:
        if not text:
            raise ValueError("CharTokenizer needs a non-empty text to build its vocabulary")
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        unknown = sorted(set(text) - self.stoi.keys())
        if unknown:
            raise ValueError(f"characters not in the vocabulary: {unknown[:10]!r}")
        return torch.tensor([self.stoi[c] for c in text], dtype=torch.long)

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def train_val_split(ids: torch.Tensor, val_fraction: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """Split a 1-D id sequence into a leading training part and a trailing validation part."""
    if ids.dim() != 1:
        raise ValueError(f"ids must be 1-D, got shape {tuple(ids.shape)}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction}")
    n_val = max(1, int(len(ids) * val_fraction))
    return ids[:-n_val], ids[-n_val:]


def random_batch(
    ids: torch.Tensor, seq_len: int, batch_size: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows for next-token prediction: inputs ``(B, T)`` and targets shifted by one ``(B, T)``."""
    check_positive_int("seq_len", seq_len)
    check_positive_int("batch_size", batch_size)
    if len(ids) <= seq_len:
        raise ValueError(f"need more than seq_len={seq_len} ids, got {len(ids)}")
    starts = torch.randint(len(ids) - seq_len, (batch_size,), generator=generator)
    offsets = torch.arange(seq_len)
    x = ids[starts[:, None] + offsets]  # (B, T)
    y = ids[starts[:, None] + offsets + 1]  # (B, T)
    return x, y
