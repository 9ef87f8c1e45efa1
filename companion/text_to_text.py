"""Toy text-to-text tasks told apart only by a prefix (T5's format, Raffel et al., 2020, section 2.4).

Each example is a pair of strings: ``"reverse: 3 1 4" -> "4 1 3"``,
``"sort: 3 1 4" -> "1 3 4"``, ``"add: 12 + 7" -> "19"``. One model trained on the
mixture must read the prefix to know what to do.
"""
from __future__ import annotations

import random

TASKS = ("reverse", "sort", "add")


def make_example(task: str, rng: random.Random, min_len: int = 3, max_len: int = 8) -> tuple[str, str]:
    """One ``(input, target)`` pair of ``task``, drawn with ``rng``."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got {min_len}, {max_len}")
    if task == "add":
        a, b = rng.randrange(1000), rng.randrange(1000)
        return f"add: {a} + {b}", str(a + b)
    digits = [str(rng.randrange(10)) for _ in range(rng.randint(min_len, max_len))]
    answer = digits[::-1] if task == "reverse" else sorted(digits)
    return f"{task}: {' '.join(digits)}", " ".join(answer)


def make_mixture(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` examples, tasks in turn, reproducible from ``seed``."""
    rng = random.Random(seed)
    return [make_example(TASKS[i % len(TASKS)], rng) for i in range(n)]
