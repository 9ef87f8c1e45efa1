"""Moved to :mod:`companion.viz.masks` (every plot of the course lives in :mod:`companion.viz`)."""

from .viz.masks import FAMILIES, family_mask, mask_explorer, plot_mask, plot_masks

__all__ = ["FAMILIES", "family_mask", "plot_mask", "plot_masks", "mask_explorer"]
