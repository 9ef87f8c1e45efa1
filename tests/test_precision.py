"""companion.precision: fp16/bf16 ranges, the -1e9 mask fill, loss scaling against torch's own update rule."""

from __future__ import annotations

import pytest
import torch

from companion.precision import DynamicLossScaler, dtype_range, masked_softmax, naive_masked_softmax, unscale_grads


def test_dtype_ranges_are_the_ieee_and_bfloat16_values():
    fp16, bf16 = dtype_range(torch.float16), dtype_range(torch.bfloat16)
    assert fp16["max"] == (2 - 2**-10) * 2**15 == 65504.0  # 5 exponent bits, 10 mantissa bits
    assert fp16["smallest_normal"] == 2.0**-14 and fp16["bits"] == 10
    assert bf16["bits"] == 7 and bf16["smallest_normal"] == 2.0**-126  # fp32's exponent
    assert bf16["max"] == (2 - 2**-7) * 2.0**127
    with pytest.raises(ValueError, match="dtype must be one of"):
        dtype_range(torch.int8)


def _scores_and_mask(seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = 4 * torch.randn(2, 3, 5, 7, generator=g)
    mask = torch.rand(2, 3, 5, 7, generator=g) < 0.6
    mask[0, 1, 2] = False  # a query that sees no key
    return scores, mask


def test_minus_1e9_is_minus_inf_in_fp16_and_gives_nan_rows():
    with pytest.raises(RuntimeError, match="overflow"):
        torch.zeros(3, dtype=torch.float16).masked_fill(torch.tensor([True, False, True]), -1e9)
    assert torch.tensor(-1e9).to(torch.float16).item() == float("-inf")  # a cast does not refuse: -inf
    scores, mask = _scores_and_mask()
    naive16 = naive_masked_softmax(scores.half(), mask)
    assert torch.isnan(naive16[0, 1, 2]).all()
    naive32 = naive_masked_softmax(scores, mask)
    assert torch.allclose(naive32[0, 1, 2], torch.full((7,), 1 / 7))  # fp32: a uniform row over masked keys


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_masked_softmax_is_finite_and_matches_a_per_row_reference(dtype):
    scores, mask = _scores_and_mask(1)
    got = masked_softmax(scores.to(dtype), mask).float()
    assert torch.isfinite(got).all()
    want = torch.zeros_like(scores)
    for idx in torch.cartesian_prod(*(torch.arange(n) for n in scores.shape[:-1])):
        i = tuple(idx.tolist())
        keep = mask[i]
        if keep.any():
            e = torch.exp(scores[i][keep].double() - scores[i][keep].double().max())
            want[i][keep] = (e / e.sum()).float()
    tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-6}[dtype]
    assert (got - want).abs().max() < tol
    assert got[0, 1, 2].eq(0).all()


def test_masked_softmax_checks_inputs():
    with pytest.raises(TypeError, match="mask must be a boolean"):
        masked_softmax(torch.zeros(2, 3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="does not broadcast"):
        masked_softmax(torch.zeros(2, 3), torch.ones(4, dtype=torch.bool))


def test_loss_scaler_follows_torch_amp_update_scale():
    flags = [False] * 5 + [True] + [False] * 3 + [True, True] + [False] * 7
    ours = DynamicLossScaler(init_scale=1024.0, growth_interval=3)
    scale, tracker = torch.tensor([1024.0]), torch.tensor([0], dtype=torch.int32)
    for found in flags:
        stepped = ours.update(found)
        torch._amp_update_scale_(scale, tracker, torch.tensor([float(found)]), 2.0, 0.5, 3)
        assert stepped == (not found)
        assert ours.scale == scale.item() and ours.clean_steps == tracker.item()


def test_loss_scaling_rescues_gradients_that_underflow_in_fp16():
    w = torch.nn.Parameter(torch.ones(4))  # fp32 master weights, fp16 computation (as under autocast)
    x = torch.full((4,), 1e-4, dtype=torch.float16)
    c = torch.tensor(1e-4, dtype=torch.float16)
    ((w.half() * x).sum() * c).backward()  # d/dw = 1e-8, below fp16's smallest subnormal (6e-8)
    assert w.grad.eq(0).all()
    w.grad = None
    scale = 2.0**15  # 2**16 itself is above fp16's max (65,504)
    ((w.half() * x).sum() * c * scale).backward()
    assert not unscale_grads([w], scale)
    assert (w.grad - 1e-8).abs().max() < 1e-10


def test_loss_scaler_step_skips_an_overflowing_step():
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.float16))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = DynamicLossScaler(init_scale=2.0**16)
    assert not scaler.step((p * 10).sum(), [p], opt)  # 10 * 65536 overflows fp16
    assert p.eq(1).all() and scaler.scale == 2.0**15
    assert scaler.step((p * 1).sum(), [p], opt)
    assert torch.allclose(p.float(), torch.full((3,), 0.9), atol=1e-3)
    with pytest.raises(ValueError, match="backoff_factor"):
        DynamicLossScaler(backoff_factor=2.0)
