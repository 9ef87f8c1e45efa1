"""Timing helpers shared by the benchmarks.

Rules: warm up before timing, time with ``time.perf_counter``, report the
median of several repeats, and compare two implementations in the same run
with the same number of threads (set once by ``run.py``), so that their
*ratio* is meaningful even when the machine is shared and absolute numbers
move. On a GPU (``--device cuda``) the clock is read only after
``torch.cuda.synchronize()``: kernels run asynchronously, and without it a
timer measures how fast Python queues them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    quick: bool  # smaller sizes, fewer repeats
    repeats: int  # timed repeats; the median is reported
    warmup: int  # untimed calls before timing
    clock: str = "wall"  # "wall": time.perf_counter; "cpu": time.process_time (CPU time of this process)
    device: str = "cpu"  # where models and data live: "cpu", "cuda", "cuda:1", "mps"
    compile: bool = False  # also time torch.compile'd models where a benchmark offers it


def on_device(settings: Settings, *items):
    """``items`` (modules or tensors) moved to ``settings.device``; one item is returned as itself."""
    moved = tuple(x.to(settings.device) for x in items)
    return moved[0] if len(moved) == 1 else moved


def _sync(settings: Settings) -> None:
    if settings.device != "cpu":
        from companion.device import synchronize

        synchronize(settings.device)


def _clock(settings: Settings) -> Callable[[], float]:
    # CPU time ignores the time other programs hold the cores: on a shared machine it measures the
    # work done; with one thread it equals the wall time of an idle machine. On a GPU the host's CPU time
    # says nothing about the kernels: wall time, read after synchronising.
    read = time.process_time if settings.clock == "cpu" and settings.device == "cpu" else time.perf_counter

    def clock() -> float:
        _sync(settings)
        return read()
    return clock


@dataclass(frozen=True)
class Row:
    """One line of the table: two measurements of the same work and their ratio ``a / b``."""

    benchmark: str  # what is measured
    setting: str  # sizes, lengths
    a_label: str  # e.g. "companion"
    a_value: float
    b_label: str  # e.g. "HF"
    b_value: float
    unit: str  # unit of a_value and b_value; larger is better for "tok/s", smaller for "ms/..."

    @property
    def ratio(self) -> float:
        return self.a_value / self.b_value


def median_seconds(fn: Callable[[], object], settings: Settings) -> float:
    """Median wall time of ``fn()`` over ``settings.repeats`` calls, after ``settings.warmup`` calls."""
    clock = _clock(settings)
    for _ in range(settings.warmup):
        fn()
    _sync(settings)
    times = []
    for _ in range(settings.repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def paired_median_seconds(fa: Callable[[], object], fb: Callable[[], object], settings: Settings) -> tuple[float, float]:
    """Median times of ``fa`` and ``fb``, timed alternately (a, b, a, b, ...) so both see the same machine load."""
    for _ in range(settings.warmup):
        fa()
        fb()
    _sync(settings)
    clock = _clock(settings)
    ta, tb = [], []
    for _ in range(settings.repeats):
        for fn, out in ((fa, ta), (fb, tb)):
            start = clock()
            fn()
            out.append(clock() - start)
    return statistics.median(ta), statistics.median(tb)


def format_table(rows: list[Row]) -> str:
    """A fixed-width text table, one line per row, with the ratio a / b."""
    head = ("benchmark", "setting", "A", "value A", "B", "value B", "unit", "A / B")
    lines = [
        (r.benchmark, r.setting, r.a_label, f"{r.a_value:,.1f}", r.b_label, f"{r.b_value:,.1f}", r.unit, f"{r.ratio:.2f}")
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt = "  ".join("{:<%d}" % w if i < 2 else "{:>%d}" % w for i, w in enumerate(widths))
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([fmt.format(*head), sep, *(fmt.format(*line) for line in lines)])
