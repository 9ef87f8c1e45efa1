"""companion.masks: the one boolean convention (True = may attend)."""

import pytest
import torch

from companion.masks import additive_mask, causal_mask, combine_masks, cross_attention_mask, padding_mask, prefix_lm_mask


def test_causal_square_is_lower_triangle():
    m = causal_mask(4)
    assert m.dtype == torch.bool
    assert m.tolist() == [[i >= j for j in range(4)] for i in range(4)]


def test_causal_with_cache_is_aligned_bottom_right():
    m = causal_mask(2, 5)  # 3 cached keys, 2 new queries
    assert m.tolist() == [[True, True, True, True, False], [True] * 5]
    assert causal_mask(1, 9).all()  # one new token sees the whole cache


def test_padding_mask_shape_and_meaning():
    m = padding_mask(torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert m.shape == (2, 1, 1, 3)
    assert m[1, 0, 0].tolist() == [True, False, False]


def test_prefix_lm_mask():
    m = prefix_lm_mask(2, 4)
    assert m.tolist() == [
        [True, True, False, False],
        [True, True, False, False],
        [True, True, True, False],
        [True, True, True, True],
    ]
    batched = prefix_lm_mask(torch.tensor([0, 4]), 4)
    assert batched.shape == (2, 1, 4, 4)
    assert torch.equal(batched[0, 0], causal_mask(4)) and batched[1].all()


def test_cross_attention_mask_and_combine():
    m = cross_attention_mask(torch.tensor([[1, 1, 0]]), t=2)
    assert m.shape == (1, 1, 2, 3) and m[0, 0, :, 2].eq(False).all()
    both = combine_masks(causal_mask(3), padding_mask(torch.tensor([[1, 1, 0]])), None)
    assert both.shape == (1, 1, 3, 3) and not both[0, 0, 2, 2]
    assert combine_masks(None) is None


def test_additive_mask_uses_finfo_min():
    a = additive_mask(causal_mask(3), torch.float16)
    assert a[0, 1] == torch.finfo(torch.float16).min and a[1, 0] == 0 and torch.isfinite(a).all()


@pytest.mark.parametrize("call", [
    lambda: causal_mask(0),
    lambda: causal_mask(4, 3),
    lambda: padding_mask(torch.ones(2, 3, 4)),
    lambda: padding_mask(torch.ones(2, 3)),
    lambda: prefix_lm_mask(5, 4),
    lambda: combine_masks(torch.ones(2, 2)),
])
def test_bad_input_gets_a_clear_error(call):
    with pytest.raises((ValueError, TypeError)):
        call()
