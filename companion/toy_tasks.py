"""Toy sequence-to-sequence tasks on digit strings (Chapter 4).

A task maps a string of digits to another string of digits: ``"reverse"``
(``"30417" -> "71403"``) or ``"sort"`` (``"30417" -> "01347"``). Strings have
a random length in ``[min_len, max_len]`` and are right-padded in a batch.

Vocabulary (shared by source and target): ``PAD_ID = 0``, ``BOS_ID = 1``,
``EOS_ID = 2``, digits ``0..9`` are ids ``3..12``.

* source ``src``: the digits, then padding; ``src_mask`` is 1 on real tokens.
* target ``tgt``: the answer's digits, then ``EOS``, then padding.
  The decoder input is ``shift_right(tgt)`` (Chapter 4, teacher forcing).

Held-out split: a deterministic hash of each digit string puts about one
string in ``heldout_every`` into the held-out split. Training batches never
contain a held-out string, so held-out accuracy measures generalisation, not
memorisation.

Shape legend: B batch, S source length, T target length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from ._checks import check_positive_int

__all__ = [
    "PAD_ID",
    "BOS_ID",
    "EOS_ID",
    "VOCAB_SIZE",
    "Seq2SeqBatch",
    "encode_digits",
    "decode_ids",
    "solve",
    "make_batch",
    "is_heldout",
    "heldout_set",
]

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
DIGIT_OFFSET = 3  # digit d has id d + 3
VOCAB_SIZE = DIGIT_OFFSET + 10

Task = Literal["reverse", "sort"]
_TASKS = ("reverse", "sort")


@dataclass(frozen=True)
class Seq2SeqBatch:
    """A padded batch of a toy task."""

    src: torch.Tensor  # (B, S) source ids, right-padded with PAD_ID
    src_mask: torch.Tensor  # (B, S) 1 on real source tokens, 0 on padding
    tgt: torch.Tensor  # (B, T) answer ids, then EOS_ID, then PAD_ID; T = S + 1

    def __len__(self) -> int:
        return self.src.shape[0]


def encode_digits(text: str) -> list[int]:
    """``"307" -> [6, 3, 10]``."""
    if not isinstance(text, str) or not text.isdigit() or not text.isascii():
        raise ValueError(f"expected a non-empty string of ASCII digits, got {text!r}")
    return [int(c) + DIGIT_OFFSET for c in text]


def decode_ids(ids) -> str:
    """Ids -> digit string, stopping at the first ``EOS_ID``; ``PAD_ID`` and ``BOS_ID`` are skipped."""
    out = []
    for i in torch.as_tensor(ids).tolist():
        if i == EOS_ID:
            break
        if i in (PAD_ID, BOS_ID):
            continue
        if not DIGIT_OFFSET <= i < VOCAB_SIZE:
            raise ValueError(f"id {i} is not a token of the digit vocabulary (0..{VOCAB_SIZE - 1})")
        out.append(str(i - DIGIT_OFFSET))
    return "".join(out)


def solve(text: str, task: Task = "reverse") -> str:
    """The correct answer of ``task`` for a digit string."""
    if task not in _TASKS:
        raise ValueError(f"task must be one of {_TASKS}, got {task!r}")
    encode_digits(text)  # validates
    return text[::-1] if task == "reverse" else "".join(sorted(text))


def _check_lengths(min_len: int, max_len: int) -> None:
    check_positive_int("min_len", min_len)
    check_positive_int("max_len", max_len)
    if min_len > max_len:
        raise ValueError(f"min_len={min_len} must not exceed max_len={max_len}")


def _answer(digits: torch.Tensor, lengths: torch.Tensor, task: Task) -> torch.Tensor:
    """Answer digits (B, S) for source digits (B, S) with padding entries set to -1."""
    b, s = digits.shape
    pos = torch.arange(s)
    if task == "reverse":
        # position i of the answer is position (length - 1 - i) of the source
        src_pos = (lengths[:, None] - 1 - pos[None, :]).clamp(min=0)  # (B, S)
        out = digits.gather(1, src_pos)
    else:
        # padding (-1) must sort last: give it the key 10
        out = digits.masked_fill(digits < 0, 10).sort(dim=1).values
    return out.masked_fill(pos[None, :] >= lengths[:, None], -1)


def _hash_keys(digits: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """One int64 key per string, equal iff the strings are equal (padding entries are -1)."""
    s = digits.shape[1]
    key = torch.ones(digits.shape[0], dtype=torch.int64)  # a leading 1 keeps leading zeros apart
    for i in range(s):
        real = i < lengths
        key = torch.where(real, (key * 10 + digits[:, i].clamp(min=0)) % _MODULUS, key)
    return key


_MODULUS = 2_147_483_647  # 2^31 - 1, the MINSTD prime
_MULTIPLIER = 48_271


def is_heldout(digits: torch.Tensor, lengths: torch.Tensor, heldout_every: int = 10) -> torch.Tensor:
    """Boolean (B,): whether each digit string belongs to the held-out split.

    ``digits`` (B, S) holds digit values 0..9 (not token ids) and anything at
    positions ``>= lengths``. The key of the string is mixed by three rounds of
    the MINSTD generator (products stay below 2^62), then taken modulo
    ``heldout_every``: about one string in ``heldout_every`` is held out.
    """
    check_positive_int("heldout_every", heldout_every)
    digits = torch.where(torch.arange(digits.shape[1])[None, :] < lengths[:, None], digits, torch.full_like(digits, -1))
    key = _hash_keys(digits, lengths)
    for _ in range(3):
        key = (key * _MULTIPLIER) % _MODULUS
    return key % heldout_every == 0


def _to_batch(digits: torch.Tensor, lengths: torch.Tensor, task: Task) -> Seq2SeqBatch:
    b, s = digits.shape
    real = torch.arange(s)[None, :] < lengths[:, None]  # (B, S)
    src = torch.where(real, digits + DIGIT_OFFSET, torch.full_like(digits, PAD_ID))
    answer = _answer(torch.where(real, digits, torch.full_like(digits, -1)), lengths, task)
    tgt = torch.full((b, s + 1), PAD_ID, dtype=torch.long)  # (B, T) with T = S + 1
    tgt[:, :s] = torch.where(answer >= 0, answer + DIGIT_OFFSET, torch.full_like(answer, PAD_ID))
    tgt[torch.arange(b), lengths] = EOS_ID
    return Seq2SeqBatch(src=src, src_mask=real.long(), tgt=tgt)


def make_batch(
    batch_size: int,
    *,
    task: Task = "reverse",
    min_len: int = 1,
    max_len: int = 12,
    split: Literal["train", "heldout"] = "train",
    heldout_every: int = 10,
    generator: torch.Generator | None = None,
) -> Seq2SeqBatch:
    """A random batch of ``task`` with lengths uniform in ``[min_len, max_len]``.

    ``split="train"`` draws only strings outside the held-out split,
    ``split="heldout"`` only strings inside it (by rejection sampling).
    The source is padded to the longest string of the batch.
    """
    check_positive_int("batch_size", batch_size)
    _check_lengths(min_len, max_len)
    if task not in _TASKS:
        raise ValueError(f"task must be one of {_TASKS}, got {task!r}")
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    kept_digits, kept_lengths, n_kept = [], [], 0
    for _ in range(1000):
        n = 2 * batch_size if split == "train" else 12 * batch_size
        lengths = torch.randint(min_len, max_len + 1, (n,), generator=generator)
        digits = torch.randint(0, 10, (n, max_len), generator=generator)
        keep = is_heldout(digits, lengths, heldout_every) == (split == "heldout")
        kept_digits.append(digits[keep])
        kept_lengths.append(lengths[keep])
        n_kept += int(keep.sum())
        if n_kept >= batch_size:
            break
    else:  # pragma: no cover - only if the split is (nearly) empty
        raise RuntimeError(f"could not draw {batch_size} strings of the {split} split")
    digits = torch.cat(kept_digits)[:batch_size]
    lengths = torch.cat(kept_lengths)[:batch_size]
    s = int(lengths.max())
    return _to_batch(digits[:, :s], lengths, task)


def heldout_set(
    n: int,
    *,
    task: Task = "reverse",
    min_len: int = 1,
    max_len: int = 12,
    heldout_every: int = 10,
    seed: int = 1234,
) -> Seq2SeqBatch:
    """A fixed held-out evaluation set of ``n`` strings (seeded, disjoint from every training batch)."""
    gen = torch.Generator().manual_seed(seed)
    return make_batch(n, task=task, min_len=min_len, max_len=max_len, split="heldout",
                      heldout_every=heldout_every, generator=gen)
