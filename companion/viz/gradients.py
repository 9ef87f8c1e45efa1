"""Gradient norms per layer at initialisation: a figure and a widget, post-LN against pre-LN (Chapter 5)."""

from __future__ import annotations

import torch

from ..diagnostics import GradProfile, grad_profile
from ..models.small_lm import SmallLMConfig

__all__ = ["plot_grad_profiles", "grad_profile_explorer"]

_QUANTITIES = {
    "w2": ("layer index l", r"$\|\partial L / \partial W_2^{(l)}\|$"),
    "block": ("layer index l", r"$\|\partial L / \partial \theta^{(l)}\|$ (all block parameters)"),
    "stream": ("stream position l (0 = embeddings)", r"$\|\partial L / \partial x_l\|$"),
}


def plot_grad_profiles(profiles: dict[str, GradProfile], quantity: str = "w2", *, title: str = "", ax=None):
    """Plot one quantity of several :class:`GradProfile` s (mean over seeds, log scale), one line per label."""
    import matplotlib.pyplot as plt

    if quantity not in _QUANTITIES:
        raise ValueError(f"quantity must be one of {sorted(_QUANTITIES)}, got {quantity!r}")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.6))
    first = 0 if quantity == "stream" else 1
    for label, prof in profiles.items():
        values = getattr(prof, quantity).mean(0)  # (L,) or (L + 1,)
        ax.semilogy(range(first, first + len(values)), values, "o-", ms=3, label=label)
    xlabel, ylabel = _QUANTITIES[quantity]
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title or "gradient norms at initialisation")
    ax.legend()
    return ax


def grad_profile_explorer(vocab_size: int, batch: tuple[torch.Tensor, torch.Tensor], *, seeds: int = 1):
    """Widget: choose the depth, the quantity and the norm; see post-LN and pre-LN profiles side by side.

    Profiles are computed on demand (one forward and backward per seed and
    placement) and cached.
    """
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    depth = widgets.SelectionSlider(options=[1, 2, 4, 6, 8, 12, 16, 24, 32], value=12, description="layers L")
    quantity = widgets.ToggleButtons(options=[("W2 per layer", "w2"), ("block per layer", "block"),
                                              ("stream", "stream")], value="w2")
    norm = widgets.ToggleButtons(options=["layernorm", "rmsnorm"], value="layernorm")
    out = widgets.Output()
    cache: dict[tuple[int, str, bool], GradProfile] = {}
    t = batch[0].shape[1]

    def profile(n_layers: int, kind: str, norm_first: bool) -> GradProfile:
        key = (n_layers, kind, norm_first)
        if key not in cache:
            cfg = SmallLMConfig(vocab_size=vocab_size, max_positions=t, n_layers=n_layers, norm_first=norm_first, norm=kind)
            cache[key] = grad_profile(cfg, batch, seeds=seeds)
        return cache[key]

    def redraw(*_):
        with out:
            out.clear_output(wait=True)
            profs = {f"{'pre' if nf else 'post'}-LN": profile(depth.value, norm.value, nf) for nf in (False, True)}
            plot_grad_profiles(profs, quantity.value, title=f"L = {depth.value}, {norm.value}")
            plt.show()

    for w in (depth, quantity, norm):
        w.observe(redraw, names="value")
    redraw()
    return widgets.VBox([depth, quantity, norm, out])
