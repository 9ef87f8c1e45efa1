"""companion.viz.masks: the family masks against hand-written patterns; the plots and the widget build."""

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from companion.viz.masks import FAMILIES, family_mask, mask_explorer, plot_mask, plot_masks


def _hand(t, rule):
    return torch.tensor([[rule(i, j) for j in range(t)] for i in range(t)])


def test_family_masks_follow_their_definitions():
    t, p, pad = 7, 3, 2
    real = lambda j: j < t - pad  # noqa: E731
    enc = family_mask("encoder (bidirectional)", t, n_pad=pad)
    dec = family_mask("decoder (causal)", t, n_pad=pad)
    pre = family_mask("prefix-LM", t, prefix_length=p, n_pad=pad)
    assert torch.equal(enc, _hand(t, lambda i, j: real(j)))
    assert torch.equal(dec, _hand(t, lambda i, j: j <= i and real(j)))
    assert torch.equal(pre, _hand(t, lambda i, j: (j < p or j <= i) and real(j)))


def test_cross_attention_family_is_rectangular():
    m = family_mask("cross-attention", 5, n_pad=4, s=13)
    assert m.shape == (5, 13)
    assert m[:, :9].all() and not m[:, 9:].any()


@pytest.mark.parametrize("call", [
    lambda: family_mask("bert", 4),
    lambda: family_mask("decoder (causal)", 4, n_pad=4),
    lambda: family_mask("prefix-LM", 4, prefix_length=5),
    lambda: plot_mask(torch.ones(3, 3)),
    lambda: plot_mask(torch.ones(2, 3, dtype=torch.bool), queries=["a"]),
    lambda: plot_masks({}),
])
def test_bad_arguments_raise(call):
    with pytest.raises((ValueError, TypeError)):
        call()


def test_plots_draw_every_panel():
    import matplotlib.pyplot as plt

    fig = plot_masks({name: family_mask(name, 5, prefix_length=2, s=5) for name in FAMILIES})
    drawn = [ax for ax in fig.axes if ax.images]
    assert len(drawn) == len(FAMILIES)
    for ax, name in zip(drawn, FAMILIES):
        assert ax.get_title() == name
        assert (ax.images[0].get_array() == family_mask(name, 5, prefix_length=2, s=5).numpy()).all()
    plt.close("all")


def test_mask_explorer_builds_and_reacts():
    import matplotlib.pyplot as plt

    pytest.importorskip("ipywidgets")
    box = mask_explorer(max_length=9)
    family, length, prefix = box.children[0].children
    pad = box.children[1].children[0]
    plt.close("all")
    others = [name for name in FAMILIES if name != family.value]
    for name in others:
        family.value = name  # each change draws one new figure showing that family's mask
        fig = plt.figure(plt.get_fignums()[-1])
        assert fig.axes[0].get_title().startswith(name)
    assert len(plt.get_fignums()) == len(others)
    length.value = 5  # the prefix and padding sliders cannot exceed the new length
    assert prefix.max == 5 and pad.max == 4
    plt.close("all")
