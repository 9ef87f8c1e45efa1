"""companion.recurrence: the RNN loop against nn.RNN, FLOP formulas against torch's counter, path lengths against autograd."""

import math

import pytest
import torch
from torch import nn

from companion.attention import MultiHeadAttention
from companion.recurrence import (
    LAYER_TYPES,
    attention_flops,
    count_flops,
    layer_cost,
    layer_step,
    lstm_flops,
    max_path_length,
    rnn_flops,
    rnn_forward,
    rounds_to_connect,
    sequential_steps,
    time_call,
)


@pytest.mark.parametrize("bias", [True, False])
def test_rnn_forward_matches_nn_rnn(bias):
    torch.manual_seed(0)
    rnn = nn.RNN(5, 7, batch_first=True, bias=bias)
    x, h0 = torch.randn(3, 13, 5), torch.randn(3, 7)
    want_out, want_h = rnn(x, h0[None])
    got_out, got_h = rnn_forward(x, rnn.weight_ih_l0, rnn.weight_hh_l0,
                                 getattr(rnn, "bias_ih_l0", None), getattr(rnn, "bias_hh_l0", None), h0)
    torch.testing.assert_close(got_out, want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_h, want_h[0], rtol=1e-5, atol=1e-5)


def test_rnn_forward_checks_shapes():
    with pytest.raises(ValueError, match="weight_hh"):
        rnn_forward(torch.randn(2, 3, 4), torch.randn(6, 4), torch.randn(5, 5))


def test_flop_formulas_match_torch_flop_counter():
    torch.manual_seed(0)
    b, t, d_in, d = 2, 7, 5, 11
    x = torch.randn(b, t, d_in)
    assert count_flops(nn.RNN(d_in, d, batch_first=True), x) == rnn_flops(t, d, d_in, batch=b)
    cell = nn.LSTMCell(d_in, d)

    def lstm_loop():
        h = c = torch.zeros(b, d)
        for i in range(t):
            h, c = cell(x[:, i], (h, c))

    assert count_flops(lstm_loop) == lstm_flops(t, d, d_in, batch=b)
    attn = MultiHeadAttention(12, 3, backend="manual")
    y = torch.randn(b, 13, 12)
    assert count_flops(attn, y) == attention_flops(13, 12, batch=b)
    assert attention_flops(13, 12, projections=False) == 4 * 13 * 13 * 12


def test_table_1_rows():
    # Vaswani et al. (2017), Table 1, at n = 9, d = 4, k = 3.
    assert layer_cost("self-attention", 9, 4) == layer_cost("self-attention", 9, 4, kernel_size=5)
    sa, rec, conv = (layer_cost(name, 9, 4) for name in ("self-attention", "recurrent", "convolutional"))
    assert (sa.complexity, sa.sequential, sa.path_length) == (81 * 4, 1, 1)
    assert (rec.complexity, rec.sequential, rec.path_length) == (9 * 16, 9, 8)
    assert (conv.complexity, conv.sequential, conv.path_length) == (3 * 9 * 16, 1, 4)
    assert sequential_steps("recurrent", 1) == 1 and max_path_length("recurrent", 1) == 0


@pytest.mark.parametrize("layer", LAYER_TYPES)
@pytest.mark.parametrize("t", [2, 7, 10, 13])
def test_path_length_formula_matches_autograd(layer, t):
    step = layer_step(layer, 6, kernel_size=3)
    assert rounds_to_connect(step, torch.randn(1, t, 6), max_rounds=t) == max_path_length(layer, t, 3)


def test_dilated_path_is_logarithmic():
    for t in (2, 4, 5, 16, 17, 100):
        assert max_path_length("dilated convolutional", t, 4) == math.ceil(math.log(t, 4) - 1e-9)


def test_recurrence_in_rounds_equals_the_rnn_after_t_rounds():
    torch.manual_seed(0)
    d, t = 6, 9
    step = layer_step("recurrent", d, seed=3)
    gen = torch.Generator().manual_seed(3)  # the same weights layer_step draws
    w_ih, w_hh = torch.randn(d, d, generator=gen) * d**-0.5, torch.randn(d, d, generator=gen) * d**-0.5
    x = torch.randn(2, t, d)
    h = x
    for m in range(1, t + 1):
        h = step(x, h, m)
    want, _ = rnn_forward(x, w_ih, w_hh)
    torch.testing.assert_close(h, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("call", [
    lambda: max_path_length("transformer", 5),
    lambda: max_path_length("convolutional", 5, kernel_size=1),
    lambda: sequential_steps("recurrent", 0),
    lambda: rnn_flops(0, 4),
    lambda: rounds_to_connect(layer_step("recurrent", 4), torch.randn(1, 9, 4), max_rounds=3),
    lambda: time_call(lambda: None, clock="gpu"),
])
def test_bad_arguments_raise(call):
    with pytest.raises((ValueError, TypeError)):
        call()


def test_chapter_1_checks_reject_typical_mistakes():
    from companion.grading import get_exercise, run_exercise

    def rnn_without_tanh(x, weight_ih, weight_hh, bias_ih=None, bias_hh=None, h0=None):
        h = torch.zeros(x.shape[0], weight_hh.shape[0]) if h0 is None else h0
        outs = []
        for t in range(x.shape[1]):
            h = x[:, t] @ weight_ih.T + h @ weight_hh.T  # forgot tanh and biases
            outs.append(h)
        return torch.stack(outs, 1), h

    def flops_as_table_1(layer, t, d_model, batch=1):
        return {"recurrent": t * d_model**2, "lstm": t * d_model**2, "self-attention": t * t * d_model}[layer]

    def path_off_by_one(layer, t, kernel_size=3):
        return {"self-attention": 1, "recurrent": t, "convolutional": t // kernel_size}[layer]

    for exercise_id, wrong in (("1.1", path_off_by_one), ("1.2", rnn_without_tanh), ("1.3", flops_as_table_1)):
        result = run_exercise(get_exercise(exercise_id), wrong)
        assert result.earned < result.points, exercise_id
        assert all(c.message for c in result.cases if not c.passed)
