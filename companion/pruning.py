"""Head importance and head pruning (Chapter 15), after Michel et al. (2019), "Are Sixteen Heads Really Better than One?".

A gate ``xi[l, h]`` multiplies the output of head ``h`` of layer ``l``
(``companion.attention``'s ``head_mask``). Head importance is the expected
absolute sensitivity of the loss to that gate, at ``xi = 1`` (section 4.1, eq. 2):

    I[l, h] = E_x | dL(x) / dxi[l, h] |

One backward pass gives it for every head: the gate is given one value per
example (a ``(B, H)`` head mask), so the gradient holds one derivative per
example and head. Michel et al. normalise the scores of each layer by their
l2 norm (section 4.2, "we normalize the importance scores by layer"). Heads are
then removed least important first, by setting their gate to 0.

Shape legend: L layers (attention modules), H heads, B batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from .attention import CrossAttention, MultiHeadAttention

__all__ = ["attention_layers", "head_mask_applied", "head_importance", "pruning_order"]


def attention_layers(model: nn.Module) -> list[MultiHeadAttention | CrossAttention]:
    """The attention layers of ``model`` (:class:`~companion.attention.MultiHeadAttention` and
    :class:`~companion.attention.CrossAttention`), in registration order."""
    layers = [m for m in model.modules() if isinstance(m, (MultiHeadAttention, CrossAttention))]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no companion.attention.MultiHeadAttention module")
    return layers


@contextmanager
def head_mask_applied(model: nn.Module, head_mask: torch.Tensor) -> Iterator[None]:
    """Within the block, attention layer ``l`` of ``model`` runs with ``head_mask[l]``.

    ``head_mask`` is ``(L, H)`` (one gate per head) or ``(L, B, H)`` (one per example);
    0 silences a head. It may require gradients (head importance). Works for any model
    built from ``MultiHeadAttention`` (GPT, BERT...), without changing its ``forward``.
    """
    layers = attention_layers(model)
    if not isinstance(head_mask, torch.Tensor) or head_mask.dim() not in (2, 3):
        got = tuple(head_mask.shape) if isinstance(head_mask, torch.Tensor) else type(head_mask).__name__
        raise ValueError(f"head_mask must have shape (L, H) or (L, B, H), got {got}")
    n_heads = layers[0].n_heads
    if head_mask.shape[0] != len(layers) or head_mask.shape[-1] != n_heads:
        raise ValueError(f"head_mask must have shape (L, H) = ({len(layers)}, {n_heads}) or (L, B, H), "
                         f"got {tuple(head_mask.shape)}")

    def make_hook(l):
        def hook(module, args, kwargs):
            if kwargs.get("head_mask") is not None:
                raise ValueError("the model already passes a head_mask to its attention")
            return args, {**kwargs, "head_mask": head_mask[l]}
        return hook

    handles = [m.register_forward_pre_hook(make_hook(l), with_kwargs=True) for l, m in enumerate(layers)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def head_importance(
    model: nn.Module,
    loss_fn: Callable[[nn.Module, object], torch.Tensor],
    batches: Iterable[object],
    *,
    normalize: bool = True,
) -> torch.Tensor:
    """Importance ``(L, H)`` of every head: mean over examples of ``|dL(x)/dxi[l, h]|`` at ``xi = 1``.

    ``loss_fn(model, batch)`` returns one loss per example, shape ``(B,)``. With
    ``normalize`` each layer's scores are divided by their l2 norm (Michel et al., 2019).
    The model's weights are not changed; their ``.grad`` is left untouched.
    """
    layers = attention_layers(model)
    n_layers, n_heads = len(layers), layers[0].n_heads
    total, count = torch.zeros(n_layers, n_heads, dtype=torch.float64), 0
    params = [p for p in model.parameters() if p.requires_grad]
    was_training = model.training
    model.eval()
    try:
        for p in params:
            p.requires_grad_(False)
        for batch in batches:
            # The batch size is known only after a forward pass (loss_fn decides what a batch is).
            with torch.no_grad():
                first = loss_fn(model, batch)
            if first.dim() != 1:
                raise ValueError(f"loss_fn must return one loss per example, shape (B,), got {tuple(first.shape)}")
            b = first.shape[0]
            xi = torch.ones(n_layers, b, n_heads, requires_grad=True)
            with head_mask_applied(model, xi):
                losses = loss_fn(model, batch)
            if losses.dim() != 1 or losses.shape[0] != b:
                raise ValueError(f"loss_fn must return one loss per example, shape (B,), got {tuple(losses.shape)}")
            (grad,) = torch.autograd.grad(losses.sum(), xi)  # (L, B, H): dL(x_b)/dxi[l, h]
            total += grad.abs().sum(dim=1).double()
            count += b
    finally:
        for p in params:
            p.requires_grad_(True)
        model.train(was_training)
    if count == 0:
        raise ValueError("batches was empty")
    importance = (total / count).float()
    if normalize:
        importance = importance / importance.norm(dim=-1, keepdim=True).clamp(min=1e-20)
    return importance


def pruning_order(importance: torch.Tensor) -> list[tuple[int, int]]:
    """``(layer, head)`` pairs from least to most important, across all layers (ties: lower index first)."""
    if not isinstance(importance, torch.Tensor) or importance.dim() != 2:
        raise ValueError(f"importance must be a (L, H) tensor, got {getattr(importance, 'shape', type(importance).__name__)}")
    n_heads = importance.shape[1]
    flat = importance.flatten()
    order = sorted(range(flat.numel()), key=lambda i: (float(flat[i]), i))
    return [(i // n_heads, i % n_heads) for i in order]
