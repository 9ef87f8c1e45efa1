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


# ---------------------------------------------------------------- Chapter 6: independent references

def test_causal_mask_matches_nn_transformer_and_hf():
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    t = 7
    assert torch.equal(causal_mask(t), torch.nn.Transformer.generate_square_subsequent_mask(t) == 0)
    hf = sdpa_mask(batch_size=1, q_length=t, kv_length=t, mask_function=causal_mask_function, allow_is_causal_skip=False)
    assert torch.equal(causal_mask(t), hf[0, 0])


def test_padding_and_causal_combined_match_hf():
    from transformers.masking_utils import sdpa_mask

    real = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0, 0]])
    ours = combine_masks(causal_mask(7), padding_mask(real))
    hf = sdpa_mask(batch_size=3, q_length=7, kv_length=7, attention_mask=real.bool(), allow_is_causal_skip=False)
    assert ours.shape == (3, 1, 7, 7) and torch.equal(ours, hf)


def test_prefix_lm_matches_hf_or_mask():
    from transformers.masking_utils import causal_mask_function, or_masks, sdpa_mask

    for prefix in (0, 3, 7):
        fn = or_masks(causal_mask_function, lambda b, h, q, kv, p=prefix: kv < p)
        hf = sdpa_mask(batch_size=1, q_length=7, kv_length=7, mask_function=fn, allow_is_causal_skip=False)
        assert torch.equal(prefix_lm_mask(prefix, 7), hf[0, 0]), prefix


def _stack_outputs(x, mask, layers):
    for layer in layers:
        x = x + layer(x, mask)  # residual + attention, as in every Transformer block
    return x


@pytest.mark.parametrize("name", ["causal", "prefix", "window"])
def test_influence_matrix_matches_perturbations_through_real_layers(name):
    from companion.attention import MultiHeadAttention
    from companion.masks import influence_matrix

    torch.manual_seed(0)
    t, n_layers = 7, 2
    mask = {
        "causal": causal_mask(t),
        "prefix": prefix_lm_mask(3, t),
        "window": causal_mask(t) & ~causal_mask(t).tril(-2),  # each query sees itself and one key back
    }[name]
    layers = [MultiHeadAttention(8, 2, backend="manual") for _ in range(n_layers)]
    x = torch.randn(1, t, 8, dtype=torch.float64)
    layers = [layer.double() for layer in layers]
    with torch.no_grad():
        base = _stack_outputs(x, mask, layers)
        observed = torch.zeros(t, t, dtype=torch.bool)
        for j in range(t):
            x2 = x.clone()
            x2[0, j] += 1.0
            observed[:, j] = (_stack_outputs(x2, mask, layers) - base)[0].abs().amax(dim=-1) > 1e-12
    assert torch.equal(observed, influence_matrix(mask, n_layers))


def test_influence_matrix_rejects_bad_masks():
    from companion.masks import influence_matrix

    with pytest.raises(TypeError):
        influence_matrix(torch.ones(3, 3))
    with pytest.raises(ValueError):
        influence_matrix(torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError):
        influence_matrix(causal_mask(3), 0)


def test_chapter_6_checks_reject_typical_mistakes():
    from companion.grading import get_exercise, run_exercise

    def packed_without_document_rule(document_ids):  # the chapter's causal & padding
        t = document_ids.shape[1]
        return causal_mask(t) & (document_ids >= 0)[:, None, None, :]

    def window_aligned_top_left(t, s, window):
        return causal_mask(t, s).tril() & ~torch.ones(t, s, dtype=torch.bool).tril(-window)

    def cross_without_decoder_padding(decoder_attention_mask, encoder_attention_mask):
        t = decoder_attention_mask.shape[1]
        mask = encoder_attention_mask.bool()[:, None, None, :].expand(-1, 1, t, -1)
        return mask, ~mask[:, 0].any(dim=-1)

    def influence_without_residual(t, i, n_layers, window, n_sink=0):
        reach = torch.zeros(t, dtype=torch.bool)
        reach[max(0, i - n_layers * (window - 1)):i] = True  # i itself missing
        return reach

    for exercise_id, wrong in (("6.1", packed_without_document_rule), ("6.2", window_aligned_top_left),
                               ("6.3", cross_without_decoder_padding), ("6.4", influence_without_residual)):
        result = run_exercise(get_exercise(exercise_id), wrong)
        assert result.earned < result.points, exercise_id
        assert all(c.message for c in result.cases if not c.passed)
