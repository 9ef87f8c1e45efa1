"""Drawing attention masks, and a widget to explore them (Chapter 6).

Masks follow :mod:`companion.masks`: boolean, True = may attend. A drawn mask
has one row per query and one column per key; a filled cell means the query
may read that key.

Shape legend: T query length, S key length.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .._checks import check_positive_int
from ..masks import causal_mask, combine_masks, cross_attention_mask, influence_matrix, padding_mask, prefix_lm_mask

__all__ = ["FAMILIES", "family_mask", "plot_mask", "plot_masks", "mask_explorer"]

# The attention patterns of the three families (and the prefix-LM between them).
FAMILIES = (
    "encoder (bidirectional)",  # BERT, T5 encoder: every position sees every real position
    "decoder (causal)",  # GPT, T5 decoder self-attention: position i sees 0..i
    "prefix-LM",  # UniLM, T5's prefix LM: bidirectional over the prefix, causal after it
    "cross-attention",  # T5 decoder -> encoder: every target position sees every real source position
)


def family_mask(family: str, t: int, *, prefix_length: int = 0, n_pad: int = 0, s: int | None = None) -> torch.Tensor:
    """The mask ``(T, S)`` of one family for one sequence, built from :mod:`companion.masks`.

    Args:
        family: one of :data:`FAMILIES`.
        t: number of query positions T.
        prefix_length: prefix length for ``"prefix-LM"`` (ignored otherwise).
        n_pad: padding positions at the end of the keys (the encoder input for
            cross-attention, the sequence itself otherwise).
        s: number of keys S for cross-attention (the source length); default ``t``.
    """
    check_positive_int("t", t)
    s = t if s is None else check_positive_int("s", s)
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    keys = s if family == "cross-attention" else t
    if not 0 <= n_pad < keys:
        raise ValueError(f"n_pad must lie in [0, {keys - 1}] (at least one real key), got {n_pad}")
    real = torch.ones(1, keys, dtype=torch.long)
    if n_pad:
        real[:, keys - n_pad:] = 0  # (1, keys): 1 = real token, 0 = padding
    if family == "cross-attention":
        return cross_attention_mask(real, t)[0, 0]  # (T, S)
    if family == "encoder (bidirectional)":
        pattern = torch.ones(t, t, dtype=torch.bool)
    elif family == "decoder (causal)":
        pattern = causal_mask(t)
    else:
        pattern = prefix_lm_mask(prefix_length, t)
    return combine_masks(pattern, padding_mask(real))[0, 0]  # (T, T)


def plot_mask(
    mask: torch.Tensor,
    *,
    ax=None,
    title: str = "mask",
    queries: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    color: str = "tab:blue",
):
    """Draw a boolean mask ``(T, S)``: a filled cell = the query (row) may attend to the key (column)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    m = torch.as_tensor(mask).detach().cpu()
    if m.dim() != 2 or m.dtype != torch.bool:
        raise ValueError(f"expected a boolean mask of shape (T, S), got dtype {m.dtype} and shape {tuple(m.shape)}")
    t, s = m.shape
    queries = [str(i) for i in range(t)] if queries is None else list(queries)
    keys = [str(j) for j in range(s)] if keys is None else list(keys)
    if (len(queries), len(keys)) != (t, s):
        raise ValueError(f"mask of shape {(t, s)} does not match {len(queries)} query and {len(keys)} key labels")
    if ax is None:
        _, ax = plt.subplots(figsize=(0.4 * s + 1.5, 0.4 * t + 1.2))
    ax.imshow(m.numpy(), cmap=ListedColormap(["white", color]), vmin=0, vmax=1)
    ax.set_xticks(range(s), labels=keys, fontsize=8)
    ax.set_yticks(range(t), labels=queries, fontsize=8)
    ax.set_xticks([j - 0.5 for j in range(1, s)], minor=True)
    ax.set_yticks([i - 0.5 for i in range(1, t)], minor=True)
    ax.grid(which="minor", color="lightgray", linewidth=0.8)
    ax.tick_params(which="minor", length=0)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(title, fontsize=10)
    return ax


def plot_masks(masks: Mapping[str, torch.Tensor], *, suptitle: str = "attention masks (filled = may attend)", ncols: int = 4):
    """Several masks side by side, one panel per ``{title: mask}`` entry; returns the figure."""
    import matplotlib.pyplot as plt

    if not masks:
        raise ValueError("masks must contain at least one {title: mask} entry")
    n = len(masks)
    ncols = min(ncols, n)
    nrows = (n + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.3 * ncols, 3.3 * nrows), squeeze=False)
    for ax, (title, mask) in zip(axes.flat, masks.items()):
        plot_mask(mask, ax=ax, title=title)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(suptitle)
    fig.tight_layout()
    return fig


def mask_explorer(max_length: int = 12):
    """Widget: pick a family, a length, a prefix, padding and a depth; see the mask and what reaches each output.

    The right panel is :func:`companion.masks.influence_matrix`: which inputs
    can change which outputs after the chosen number of layers (self-attention
    families only; cross-attention reads a fixed encoder output).
    """
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    check_positive_int("max_length", max_length)
    family = widgets.Dropdown(options=list(FAMILIES), value=FAMILIES[2], description="family")
    length = widgets.IntSlider(min=2, max=max_length, value=min(8, max_length), description="T")
    prefix = widgets.IntSlider(min=0, max=min(8, max_length), value=3, description="prefix")
    pad = widgets.IntSlider(min=0, max=min(8, max_length) - 1, value=0, description="padding")
    layers = widgets.IntSlider(min=1, max=6, value=1, description="layers")
    out = widgets.Output()

    def redraw(*_):
        prefix.max = length.value
        pad.max = length.value - 1
        mask = family_mask(family.value, length.value, prefix_length=prefix.value, n_pad=pad.value,
                           s=length.value)
        with out:
            out.clear_output(wait=True)
            fig, axes = plt.subplots(1, 2, figsize=(8, 4))
            plot_mask(mask, ax=axes[0], title=f"{family.value}: mask")
            if family.value == "cross-attention":
                axes[1].axis("off")
                axes[1].text(0.5, 0.5, "cross-attention reads the encoder output:\nno stacking over its own positions",
                             ha="center", va="center", fontsize=9)
            else:
                plot_mask(influence_matrix(mask, layers.value), ax=axes[1], color="tab:orange",
                          title=f"inputs that reach each output after {layers.value} layer(s)")
                axes[1].set_xlabel("input position")
                axes[1].set_ylabel("output position")
            fig.tight_layout()
            plt.show()

    for w in (family, length, prefix, pad, layers):
        w.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([family, length, prefix]), widgets.HBox([pad, layers]), out])
