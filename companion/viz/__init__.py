"""Every plot and widget of the course, in one place (matplotlib, ipywidgets).

Every widget has a static counterpart (``plot_*``) so the website shows the
same content without a running kernel.

* :mod:`companion.viz.attention`: attention weights, per head (2)
* :mod:`companion.viz.gradients`: gradient norms per layer (5)
* :mod:`companion.viz.masks`: attention masks and the mask explorer (6)
* :mod:`companion.viz.generation`: the next-token distribution under the samplers (10)
"""

from .attention import head_explorer, plot_attention, plot_heads
from .generation import next_token_explorer, plot_next_token_distribution
from .gradients import grad_profile_explorer, plot_grad_profiles
from .masks import FAMILIES, family_mask, mask_explorer, plot_mask, plot_masks

__all__ = [
    "plot_attention", "plot_heads", "head_explorer",
    "plot_grad_profiles", "grad_profile_explorer",
    "FAMILIES", "family_mask", "plot_mask", "plot_masks", "mask_explorer",
    "plot_next_token_distribution", "next_token_explorer",
]
