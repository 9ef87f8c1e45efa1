"""Helpers for the chapter notebooks: seeding and ``glue`` that works everywhere.

Inside the book build, :func:`glue` is myst-nb's ``glue``, so prose can show a
number the notebook computed (``{glue:text}`name:.3f```). In Colab or a plain
Jupyter without myst-nb it does nothing visible, so the
same notebook runs unchanged. :func:`glue_table` glues a table the prose points
at as markdown, so the Chinese edition translates its words (in Colab it shows
the table in the cell).

Portability: nbval compares the stored glue record of every cell, so a float
is stored at the precision the prose shows it, never in full: another CPU (or
thread count) changes the last digits of a float32 computation.
``glue("loss", 1.3470634, ".3f")`` stores ``1.347``, and the prose shows it
with the same spec, ``{glue:text}`loss:.3f```. A float glued without a format
raises ``TypeError``; integers, strings and figures need none.
"""

from __future__ import annotations

import random
from typing import Any

import torch

__all__ = ["glue", "glue_table", "markdown_table", "seed_everything", "in_colab"]


def _rounded(name: str, value: Any, fmt: str | None) -> Any:
    """``value`` rounded as ``format(value, fmt)`` shows it (floats), or unchanged."""
    import numbers

    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(f"glue({name!r}, ...): a tensor must hold one number, got shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Number):
        if fmt is not None:
            raise TypeError(f"glue({name!r}, ...): fmt applies to numbers, got {type(value).__name__}")
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if fmt is None:
        raise TypeError(
            f"glue({name!r}, {float(value)!r}): a float needs the precision the prose shows it, "
            f"e.g. glue({name!r}, value, '.3f'); its last digits differ between CPUs"
        )
    text = format(float(value), fmt)
    try:
        return float(text.replace(",", "").rstrip("%")) / (100.0 if text.endswith("%") else 1.0)
    except ValueError as err:
        raise ValueError(f"glue({name!r}, ...): format {fmt!r} gave {text!r}, not a number") from err


def glue(name: str, value: Any, fmt: str | None = None, display: bool = False) -> None:
    """Record ``value`` under ``name`` for the book's prose.

    Args:
        name: the key the prose uses (``{glue:text}`name:.3f```).
        value: a number, a string or a figure. A 1-element tensor counts as a number.
        fmt: for a float, the format spec the prose shows it with (``".3f"``,
            ``".1e"``, ``".0%"``); the value is stored rounded to it, so the
            record is the same on every CPU. Required for floats.
        display: also show the value as the cell's output.

    Returns ``None``, so that a ``glue(...)`` on the last line of a cell does
    not echo its value as a second output.
    """
    value = _rounded(name, value, fmt)
    try:
        from myst_nb import glue as _myst_glue
    except ImportError:  # Colab, plain Jupyter: nothing to record into
        if display:
            from IPython.display import display as _display

            _display(value)
        return
    _myst_glue(name, value, display=display)


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else format(value)
    return " ".join(text.split()).replace("|", "\\|")


def markdown_table(header: list[str], rows: list[list[Any]], align: str | None = None) -> str:
    """A markdown (GFM) table: ``header`` cells, then ``rows``; ``align`` one of ``l``, ``r``, ``c`` per column.

    A cell is a string as given (format numbers before: ``f"{x:.3f}"``; numbers
    that are not strings are written with ``format(value)``); ``|`` is escaped and
    a newline becomes a space.
    """
    width = len(header)
    if any(len(row) != width for row in rows):
        raise ValueError(f"markdown_table: every row needs {width} cells (the header's), "
                         f"got {sorted({len(row) for row in rows})}")
    align = align or "l" * width
    if len(align) != width or set(align) - set("lrc"):
        raise ValueError(f"markdown_table: align needs one of l, r, c per column ({width}), got {align!r}")
    rule = {"l": ":--", "r": "--:", "c": ":-:"}
    lines = ["| " + " | ".join(_cell(c) for c in header) + " |",
             "| " + " | ".join(rule[a] for a in align) + " |"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def glue_table(name: str, header: list[str], rows: list[list[Any]], align: str | None = None,
               display: bool = False) -> None:
    """Glue a table the prose points at, as markdown; the page shows it where the prose puts

    .. code-block:: markdown

        ```{glue:md} name
        :format: myst
        ```

    Sphinx then reads the table as part of the page: its header and word cells are
    messages of the page's catalogue, translated in the Chinese edition (a table
    printed by ``print`` is not). Cells are strings as the prose shows them (round
    floats before: the glued record is compared by nbval, see :func:`glue`).

    In Colab or a plain Jupyter (no myst-nb) the cell shows the table itself;
    in the book it shows nothing unless ``display=True`` (the prose shows it).
    """
    from IPython.display import Markdown

    table = Markdown(markdown_table(header, rows, align))
    try:
        from myst_nb import glue as _myst_glue
    except ImportError:  # Colab, plain Jupyter: show the table in the cell
        from IPython.display import display as _display

        _display(table)
        return
    _myst_glue(name, table, display=display)


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
