"""companion.pruning: head masks through hooks, head importance against a per-example loop and finite differences."""

from __future__ import annotations

import pytest
import torch

from companion.models.gpt import GPT, GPTConfig
from companion.pruning import attention_layers, head_importance, head_mask_applied, pruning_order
from companion.training import lm_loss


def _model_and_batch(seed=0):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=11, max_positions=9, d_model=12, n_layers=3, n_heads=3, dropout=0.0)).eval()
    x = torch.randint(0, 11, (5, 9))
    return model, (x, torch.roll(x, -1, dims=1))


def per_example(model, batch):
    return lm_loss(model, batch, reduction="none").mean(-1)


def test_zero_gate_equals_zeroing_the_heads_columns_of_the_output_projection():
    model, (x, _) = _model_and_batch()
    mask = torch.ones(3, 3)
    mask[1, 2] = 0
    with head_mask_applied(model, mask):
        got = model(x)
    d_head = 4
    with torch.no_grad():
        model.blocks[1].self_attn.out.weight[:, 2 * d_head:3 * d_head] = 0  # head 2 contributes nothing
    assert torch.allclose(got, model(x), atol=1e-6)
    assert not any(m._forward_pre_hooks for m in attention_layers(model))  # hooks removed


def test_importance_equals_a_loop_over_examples_and_a_finite_difference():
    model, batch = _model_and_batch(1)
    got = head_importance(model, per_example, [batch], normalize=False)
    want = torch.zeros(3, 3)
    for b in range(5):  # one example at a time, one (L, H) gate
        xi = torch.ones(3, 3, requires_grad=True)
        with head_mask_applied(model, xi):
            loss = per_example(model, (batch[0][b:b + 1], batch[1][b:b + 1]))[0]
        want += torch.autograd.grad(loss, xi)[0].abs() / 5
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-7)
    # finite difference on example 0, head (2, 1)
    eps, one = 1e-3, (batch[0][:1], batch[1][:1])
    vals = []
    for s in (1 + eps, 1 - eps):
        xi = torch.ones(3, 3, dtype=torch.float64)
        xi[2, 1] = s
        with torch.no_grad(), head_mask_applied(model.double(), xi):
            vals.append(per_example(model, one)[0].item())
    model.float()
    xi = torch.ones(3, 3, requires_grad=True)
    with head_mask_applied(model, xi):
        g = torch.autograd.grad(per_example(model, one)[0], xi)[0][2, 1].item()
    assert abs((vals[0] - vals[1]) / (2 * eps) - g) < 1e-4


def test_normalized_importance_has_unit_norm_per_layer_and_order_is_ascending():
    model, batch = _model_and_batch(2)
    imp = head_importance(model, per_example, [batch, batch])
    assert torch.allclose(imp.norm(dim=-1), torch.ones(3))
    order = pruning_order(imp)
    assert sorted(order) == [(l, h) for l in range(3) for h in range(3)]
    vals = [imp[l, h].item() for l, h in order]
    assert vals == sorted(vals)
    assert all(p.grad is None and p.requires_grad for p in model.parameters())


def test_bad_inputs_raise():
    model, batch = _model_and_batch()
    with pytest.raises(ValueError, match=r"\(L, H\) = \(3, 3\)"):
        with head_mask_applied(model, torch.ones(2, 3)):
            pass
    with pytest.raises(ValueError, match="one loss per example"):
        head_importance(model, lambda m, b: lm_loss(m, b), [batch])
    with pytest.raises(ValueError, match="no companion.attention"):
        attention_layers(torch.nn.Linear(2, 2))
