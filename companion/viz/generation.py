"""The next-token distribution under temperature, top-k and top-p: a figure and a widget (Chapter 10)."""

from __future__ import annotations

import torch

from .._checks import ShapeChecker
from ..generation import entropy, filter_logits

__all__ = ["plot_next_token_distribution", "next_token_explorer"]


def plot_next_token_distribution(
    logits: torch.Tensor,
    labels: list[str],
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    show_top: int | None = 20,
    ax=None,
    title: str | None = None,
):
    """Bar chart of ``softmax(filter_logits(logits))`` for one ``(V,)`` row, the unfiltered ``softmax(logits)`` outlined.

    The filters act on the whole vocabulary; only the ``show_top`` most
    probable tokens (under ``softmax(logits)``) are drawn.
    """
    import matplotlib.pyplot as plt

    ShapeChecker().check("logits", logits, ("V",))
    if len(labels) != logits.shape[0]:
        raise ValueError(f"got {len(labels)} labels for {logits.shape[0]} logits")
    logits = logits.detach().float().cpu()
    filtered = filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    base, probs = logits.softmax(-1), filtered.softmax(-1)
    shown = torch.argsort(base, descending=True)[: show_top or len(labels)]
    if ax is None:
        _, ax = plt.subplots(figsize=(0.3 * len(shown) + 2.5, 3))
    x = list(range(len(shown)))
    ax.bar(x, probs[shown].numpy(), color="tab:blue", label="after temperature, top-k, top-p")
    ax.bar(x, base[shown].numpy(), fill=False, edgecolor="black", linewidth=0.8, label="softmax(logits)")
    ax.set_xticks(x, labels=[labels[i] for i in shown.tolist()], fontsize=8)
    ax.set_xlabel(f"next token (the {len(shown)} most probable)")
    ax.set_ylabel("probability")
    kept = int((probs > 0).sum())
    ax.set_title(title or f"T={temperature:g}, top-k={top_k}, top-p={top_p}\n"
                          f"{kept} tokens kept, entropy {float(entropy(filtered)):.2f} nats", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    return ax


def next_token_explorer(logits: torch.Tensor, labels: list[str], *, show_top: int = 20):
    """Sliders for temperature, top-k and top-p over one ``(V,)`` next-token distribution (needs ipywidgets).

    Returns the widget (an ``ipywidgets.interactive``: the three sliders and an
    output area that redraws on every change); a notebook displays it, and no
    function repr is printed.
    """
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    n = logits.shape[-1]

    def show(temperature: float, top_k: int, top_p: float) -> None:
        _, ax = plt.subplots(figsize=(0.3 * show_top + 2.5, 3.2))
        plot_next_token_distribution(logits, labels, temperature=temperature, top_k=None if top_k >= n else top_k,
                                     top_p=None if top_p >= 1.0 else top_p, show_top=show_top, ax=ax)
        plt.show()

    return widgets.interactive(
        show,
        temperature=widgets.FloatLogSlider(value=1.0, base=10, min=-1.3, max=0.7, step=0.05, description="temperature"),
        top_k=widgets.IntSlider(value=n, min=1, max=n, description="top-k"),
        top_p=widgets.FloatSlider(value=1.0, min=0.05, max=1.0, step=0.05, description="top-p"),
    )
