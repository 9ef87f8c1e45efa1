"""Conceptual diagrams: boxes, arrows, stacks and grids drawn with matplotlib.

A diagram is drawn on a canvas measured in abstract units (``canvas(12, 6)`` is
12 units wide and 6 high, y pointing up), so a chapter places its parts by
hand and draws the numbers in them (widths, heads, layers) from the model's
own config: the picture cannot drift from the code.

One colour per kind of part, the same in every chapter:

================  =====================================
``EMBEDDING``     token, position and segment tables
``ATTENTION``     attention layers and their heads
``FFN``           feed-forward networks and experts
``NORM``          LayerNorm / RMSNorm
``HEAD``          read-outs (LM head, classifier)
``CACHE``         KV cache and other stored state
``DATA``          tensors, tokens, masks
================  =====================================
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

EMBEDDING = "#f6d8ae"
ATTENTION = "#b9d4f1"
FFN = "#c8e6c1"
NORM = "#e9e3f5"
HEAD = "#f4c2c2"
CACHE = "#fde9a9"
DATA = "#eeeeee"
EDGE = "#444444"


def canvas(width: float, height: float, *, inches_per_unit: float = 0.6, max_width: float = 7.0):
    """A blank figure ``width`` x ``height`` units, no axes, at most ``max_width`` inches wide."""
    for name, value in (("width", width), ("height", height), ("inches_per_unit", inches_per_unit)):
        if not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"canvas: {name} must be a positive number, got {value!r}")
    scale = min(inches_per_unit, max_width / width)
    fig, ax = plt.subplots(figsize=(width * scale, height * scale))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=0.99)
    return fig, ax


def box(ax, x: float, y: float, w: float, h: float, text: str = "", *, color: str = DATA,
        fontsize: float = 9, edge: str = EDGE, linestyle: str = "-", rounded: bool = True):
    """A labelled box with its lower-left corner at ``(x, y)``; returns ``(cx, cy)``, its centre."""
    if w <= 0 or h <= 0:
        raise ValueError(f"box: width and height must be positive, got w={w}, h={h}")
    pad = min(w, h) * 0.08 if rounded else 0.0
    style = f"round,pad=0,rounding_size={pad}" if rounded else "square,pad=0"
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle=style, facecolor=color, edgecolor=edge,
                                linewidth=1.0, linestyle=linestyle))
    cx, cy = x + w / 2, y + h / 2
    if text:
        ax.text(cx, cy, text, ha="center", va="center", fontsize=fontsize)
    return cx, cy


def arrow(ax, start: Sequence[float], end: Sequence[float], text: str = "", *, color: str = EDGE,
          style: str = "-|>", connection: str = "arc3", fontsize: float = 8, linestyle: str = "-"):
    """An arrow from ``start`` to ``end`` (``connection="arc3,rad=0.3"`` bends it), labelled at its middle."""
    ax.add_patch(FancyArrowPatch(tuple(start), tuple(end), arrowstyle=style, mutation_scale=10,
                                 color=color, connectionstyle=connection, linewidth=1.0,
                                 linestyle=linestyle, shrinkA=0, shrinkB=0))
    if text:
        ax.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2, text, fontsize=fontsize,
                ha="left", va="center", color=color)


def stack(ax, x: float, y: float, w: float, h: float, n: int, text: str = "", *, color: str = ATTENTION,
          offset: float = 0.12, fontsize: float = 9, max_drawn: int = 4):
    """``n`` copies of a box drawn offset behind each other (heads, layers); the front one is labelled.

    At most ``max_drawn`` copies are drawn whatever ``n`` is; the label says how many there are.
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"stack: n must be a positive int, got {n!r}")
    drawn = min(n, max_drawn)
    for i in reversed(range(drawn)):
        box(ax, x + i * offset, y + i * offset, w, h, text if i == 0 else "", color=color, fontsize=fontsize)
    return x + w / 2, y + h / 2


def grid(ax, x: float, y: float, values, *, cell: float = 0.3, on: str = ATTENTION, off: str = "white",
         row_labels: Sequence[str] | None = None, col_labels: Sequence[str] | None = None, fontsize: float = 7):
    """A matrix of cells with ``(x, y)`` its top-left corner: ``values[i][j]`` true fills cell (i, j).

    Rows go down and columns right, as a printed matrix (a mask, a sparsity pattern, a tile plan).
    A value may also be a colour string, used as it is.
    """
    rows = [list(r) for r in values]
    if not rows or any(len(r) != len(rows[0]) for r in rows):
        raise ValueError("grid: values must be a non-empty rectangle of rows")
    for i, row in enumerate(rows):
        for j, v in enumerate(row):
            face = v if isinstance(v, str) else (on if v else off)
            box(ax, x + j * cell, y - (i + 1) * cell, cell, cell, color=face, edge="#999999", rounded=False)
    if row_labels is not None:
        for i, t in enumerate(row_labels):
            ax.text(x - 0.08, y - (i + 0.5) * cell, t, ha="right", va="center", fontsize=fontsize)
    if col_labels is not None:
        for j, t in enumerate(col_labels):
            ax.text(x + (j + 0.5) * cell, y + 0.08, t, ha="center", va="bottom", fontsize=fontsize)
    return x + len(rows[0]) * cell, y - len(rows) * cell
