"""Attention weights as heat maps, per head, and a widget to browse them (Chapter 2).

Every widget has a static counterpart (``plot_*``) so the website shows the
same content without a running kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["plot_attention", "plot_heads", "head_explorer"]


def _as_2d(weights: torch.Tensor) -> torch.Tensor:
    w = torch.as_tensor(weights).detach().float().cpu()
    if w.dim() != 2:
        raise ValueError(f"expected attention weights of shape (T, S), got {tuple(w.shape)}")
    return w


def plot_attention(
    weights: torch.Tensor,
    queries: Sequence[str],
    keys: Sequence[str] | None = None,
    *,
    ax=None,
    title: str = "attention weights",
    annotate: bool = False,
):
    """Heat map of one head's weights ``(T, S)``: rows are queries, columns keys."""
    import matplotlib.pyplot as plt

    w = _as_2d(weights)
    keys = queries if keys is None else keys
    if w.shape != (len(queries), len(keys)):
        raise ValueError(f"weights of shape {tuple(w.shape)} do not match {len(queries)} queries and {len(keys)} keys")
    if ax is None:
        _, ax = plt.subplots(figsize=(0.45 * len(keys) + 2, 0.45 * len(queries) + 1.2))
    im = ax.imshow(w.numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(keys)), labels=list(keys), rotation=60, ha="right")
    ax.set_yticks(range(len(queries)), labels=list(queries))
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(title)
    if annotate:
        for i in range(w.shape[0]):
            for j in range(w.shape[1]):
                ax.text(j, i, f"{w[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="black" if w[i, j] > 0.6 else "white")
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="weight")
    return ax


def plot_heads(
    weights: torch.Tensor,
    tokens: Sequence[str],
    *,
    title: str = "attention weights per head",
    ncols: int = 2,
    fontsize: float = 9,
    width: float = 7.0,
):
    """One heat map per head for weights of shape ``(H, T, T)``; returns the figure.

    The grid has ``ncols`` columns and is ``width`` inches wide (the page width
    of the book), so the token labels stay legible: label only the outer
    panels, and keep ``T`` to a few dozen tokens.
    """
    import matplotlib.pyplot as plt

    w = torch.as_tensor(weights).detach().float().cpu()
    if w.dim() != 3:
        raise ValueError(f"expected weights of shape (H, T, S), got {tuple(w.shape)}")
    if w.shape[1] != len(tokens) or w.shape[2] != len(tokens):
        raise ValueError(f"weights of shape {tuple(w.shape)} do not match {len(tokens)} tokens")
    h = w.shape[0]
    ncols = min(ncols, h)
    nrows = (h + ncols - 1) // ncols
    panel = width / ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, panel * nrows + 0.5), squeeze=False,
                             sharex=True, sharey=True, layout="constrained")
    image = None
    for idx, ax in enumerate(axes.flat):
        if idx >= h:
            ax.axis("off")
            continue
        image = ax.imshow(w[idx].numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_title(f"head {idx}", fontsize=fontsize + 1)
        row, col = divmod(idx, ncols)
        ax.set_xticks(range(len(tokens)), labels=list(tokens), fontsize=fontsize)
        ax.set_yticks(range(len(tokens)), labels=list(tokens), fontsize=fontsize)
        ax.tick_params(length=0)
        if row == nrows - 1 or idx + ncols >= h:
            ax.set_xlabel("key (attended to)", fontsize=fontsize + 1)
        if col == 0:
            ax.set_ylabel("query (attending)", fontsize=fontsize + 1)
    fig.suptitle(title)
    fig.colorbar(image, ax=axes.ravel().tolist(), fraction=0.03, pad=0.02, label="weight")
    return fig


def head_explorer(weights: torch.Tensor, tokens: Sequence[str], *, layer_names: Sequence[str] | None = None):
    """Widget: pick a layer and a head, see its heat map. ``weights`` is ``(L, H, T, T)`` or ``(H, T, T)``."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    w = torch.as_tensor(weights).detach().float().cpu()
    if w.dim() == 3:
        w = w[None]
    if w.dim() != 4:
        raise ValueError(f"expected weights of shape (L, H, T, T) or (H, T, T), got {tuple(weights.shape)}")
    names = list(layer_names) if layer_names is not None else [f"layer {i}" for i in range(w.shape[0])]
    layer = widgets.Dropdown(options=list(range(w.shape[0])), value=0, description="layer")
    layer.options = [(n, i) for i, n in enumerate(names)]
    head = widgets.IntSlider(min=0, max=w.shape[1] - 1, value=0, description="head")
    out = widgets.Output()

    def redraw(*_):
        with out:
            out.clear_output(wait=True)
            plot_attention(w[layer.value, head.value], tokens, title=f"{names[layer.value]}, head {head.value}")
            plt.show()

    layer.observe(redraw, names="value")
    head.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([layer, head]), out])
