"""Tests of companion.positional and the Chapter 3 language model, against formulas and Hugging Face."""

from __future__ import annotations

import math

import pytest
import torch

from companion.masks import additive_mask, causal_mask
from companion.experiments.extrapolation import MODEL
from companion.models.small_lm import POSITION_SCHEMES, SmallLM, SmallLMConfig
from companion.positional import (
    LearnedPositionalEmbedding,
    RelativePositionBias,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    relative_position_bucket,
    relative_positions,
    rope_cos_sin,
    rope_permutation,
    sinusoidal_encoding,
    sinusoidal_shift_matrix,
)

# ---------------------------------------------------------------- sinusoidal


def test_sinusoidal_matches_the_paper_formula():
    p_max, d = 13, 10
    pe = sinusoidal_encoding(p_max, d)
    for p in range(p_max):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            assert pe[p, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


@pytest.mark.parametrize("k", [0, 1, 5, 37, -3])
def test_shift_is_a_rotation(k):
    d = 14
    pe = sinusoidal_encoding(200, d)
    r = sinusoidal_shift_matrix(k, d)
    p = torch.arange(max(0, -k), 200 - max(0, k))
    torch.testing.assert_close(pe[p] @ r.T, pe[p + k], atol=2e-5, rtol=0)  # PE(p+k) = R_k PE(p) for every p
    torch.testing.assert_close(r @ r.T, torch.eye(d), atol=1e-6, rtol=0)  # orthogonal
    assert torch.linalg.det(r.double()).item() == pytest.approx(1.0, abs=1e-5)  # a rotation, not a reflection


def test_shift_matrices_compose_and_shift_is_not_additive():
    d = 8
    torch.testing.assert_close(sinusoidal_shift_matrix(3, d) @ sinusoidal_shift_matrix(4, d),
                               sinusoidal_shift_matrix(7, d), atol=1e-6, rtol=0)
    pe = sinusoidal_encoding(20, d)
    assert (pe[5] + pe[3] - pe[8]).abs().max() > 0.5  # PE(p + k) != PE(p) + PE(k)


def test_sinusoidal_rejects_odd_size():
    with pytest.raises(ValueError, match="even"):
        sinusoidal_encoding(4, 7)


# ---------------------------------------------------------------- learned


def test_learned_table_cannot_index_beyond_its_size():
    emb = LearnedPositionalEmbedding(9, 6)
    torch.testing.assert_close(emb(7), emb.weight[:7])
    torch.testing.assert_close(emb(2, offset=7), emb.weight[7:9])
    with pytest.raises(ValueError, match="cannot index beyond"):
        emb(10)


# ---------------------------------------------------------------- T5 buckets


def _hf_t5_attention():
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    return t5.T5Attention


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("n_buckets,max_distance", [(32, 128), (8, 20), (13, 7), (33, 100), (6, 50)])
def test_bucket_equals_hugging_face(bidirectional, n_buckets, max_distance):
    ref = _hf_t5_attention()._relative_position_bucket
    rel = relative_positions(7, 301) if bidirectional else relative_positions(301)  # (T, S)
    rel = torch.cat([rel.flatten(), torch.arange(-1000, 1001)])
    got = relative_position_bucket(rel, bidirectional=bidirectional, n_buckets=n_buckets, max_distance=max_distance)
    want = ref(rel, bidirectional=bidirectional, num_buckets=n_buckets, max_distance=max_distance)
    assert got.dtype == torch.long
    torch.testing.assert_close(got, want.long(), atol=0, rtol=0)


def test_bucket_structure_by_hand():
    rel = torch.arange(-200, 201)
    b = relative_position_bucket(rel, bidirectional=False, n_buckets=32, max_distance=128)
    # decoder: distances 0..15 have their own bucket, future keys share bucket 0, >= 128 share bucket 31
    torch.testing.assert_close(b[200 - torch.arange(16)], torch.arange(16))
    assert (b[rel > 0] == 0).all() and (b[rel <= -128] == 31).all()
    assert (b[:201].diff() <= 0).all()  # buckets never decrease with distance (rel from -200 to 0)
    assert b[rel == -16].item() == 16 and b[rel == -22].item() == 18  # 16 + floor(16 log(d/16) / log 8)
    bi = relative_position_bucket(rel, bidirectional=True, n_buckets=32, max_distance=128)
    assert (bi[rel > 0] >= 16).all() and (bi[rel <= 0] < 16).all()
    assert bi.max().item() == 31 and bi.min().item() == 0


@pytest.mark.parametrize("bidirectional,n_exact", [(False, 16), (True, 8)])
def test_bucket_starts_follow_the_log_spacing(bidirectional, n_exact):
    # T5's defaults (32 buckets, max distance 128): n_exact exact buckets per direction, then
    # bucket n_exact + k starts at the first integer distance >= n_exact * (128 / n_exact) ** (k / n_exact)
    # (Raffel et al. 2020, section 2.1; the Mesh TensorFlow formula), and 128 on is clamped to the last.
    distance = torch.arange(0, 300)
    b = relative_position_bucket(-distance, bidirectional=bidirectional, n_buckets=32, max_distance=128)
    starts = [int(distance[b == k].min()) for k in sorted(set(b.tolist()))]
    want = list(range(n_exact)) + [math.ceil(n_exact * (128 / n_exact) ** (k / n_exact)) for k in range(n_exact)]
    assert starts == want
    assert starts[-1] == (113 if not bidirectional else 91)  # 16 * 8 ** (15 / 16) = 112.4; 8 * 16 ** (7 / 8) = 90.5
    assert (b[127:] == b[127]).all()


@pytest.mark.parametrize("is_decoder", [False, True])
def test_relative_bias_equals_hugging_face_compute_bias(is_decoder):
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(d_model=16, d_kv=4, num_heads=3, relative_attention_num_buckets=11,
                                   relative_attention_max_distance=20, is_decoder=is_decoder)
    torch.manual_seed(0)
    hf = _hf_t5_attention()(config, has_relative_attention_bias=True)
    ours = RelativePositionBias(3, bidirectional=not is_decoder, n_buckets=11, max_distance=20)
    ours.load_state_dict({"relative_attention_bias.weight": hf.relative_attention_bias.weight.detach()})
    with torch.no_grad():
        torch.testing.assert_close(ours(7, 13), hf.compute_bias(7, 13, past_seen_tokens=6))
        torch.testing.assert_close(ours(9), hf.compute_bias(9, 9))


# ---------------------------------------------------------------- RoPE


def test_rope_half_layout_equals_hugging_face_llama():
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=24, num_attention_heads=2, head_dim=12, max_position_embeddings=64)
    rotary = llama.LlamaRotaryEmbedding(config)
    q, k = torch.randn(2, 2, 7, 12), torch.randn(2, 2, 7, 12)
    positions = torch.arange(3, 10)
    cos_hf, sin_hf = rotary(q, positions[None].expand(2, -1))  # (B, T, Dh)
    q_hf, k_hf = llama.apply_rotary_pos_emb(q, k, cos_hf, sin_hf)
    cos, sin = rope_cos_sin(positions, 12, base=config.rope_parameters["rope_theta"])
    torch.testing.assert_close(apply_rope(q, cos, sin), q_hf, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(apply_rope(k, cos, sin), k_hf, atol=1e-5, rtol=1e-5)


def test_rope_interleaved_layout_equals_hugging_face_gptj():
    gptj = pytest.importorskip("transformers.models.gptj.modeling_gptj")
    t, h, dh = 7, 3, 10
    x = torch.randn(1, t, h, dh)  # GPT-J's layout (B, T, H, Dh)
    sincos = gptj.create_sinusoidal_positions(t, dh)[None]  # (1, T, Dh): [sin | cos]
    want = gptj.apply_rotary_pos_emb(x, sincos[..., : dh // 2], sincos[..., dh // 2:])
    cos, sin = rope_cos_sin(t, dh, layout="interleaved")
    got = apply_rope(x.transpose(1, 2), cos, sin, layout="interleaved").transpose(1, 2)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_rope_layouts_differ_by_a_fixed_permutation():
    dh, t = 14, 9
    x = torch.randn(2, 3, t, dh)
    perm = rope_permutation(dh)
    half = apply_rope(x[..., perm], *rope_cos_sin(t, dh, layout="half"), layout="half")
    inter = apply_rope(x, *rope_cos_sin(t, dh, layout="interleaved"), layout="interleaved")
    torch.testing.assert_close(half, inter[..., perm], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(apply_rope(x, *rope_cos_sin(t, dh), layout="half"), inter, atol=1e-3)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rope_score_depends_only_on_the_offset(layout):
    dh = 16
    q, k = torch.randn(dh, dtype=torch.float64), torch.randn(dh, dtype=torch.float64)

    def score(m, n):
        pos = torch.tensor([m, n])
        cos, sin = rope_cos_sin(pos, dh, layout=layout)
        rq = apply_rope(q.expand(2, dh).float(), cos, sin, layout=layout)[0]
        rk = apply_rope(k.expand(2, dh).float(), cos, sin, layout=layout)[1]
        return (rq @ rk).item()

    for m, n in [(0, 5), (3, 1), (10, 10)]:
        for shift in (1, 17, 250):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=1e-3)
    assert abs(score(0, 5) - score(0, 6)) > 1e-3  # and it does depend on the offset
    x = torch.randn(5, dh)
    torch.testing.assert_close(apply_rope(x, *rope_cos_sin(5, dh, layout=layout), layout=layout).norm(dim=-1),
                               x.norm(dim=-1))  # rotations keep lengths


def test_rope_checks_shapes():
    cos, sin = rope_cos_sin(5, 8)
    with pytest.raises(ValueError):
        apply_rope(torch.randn(2, 6, 8), cos, sin)  # 6 positions, angles for 5
    with pytest.raises(ValueError, match="layout"):
        rope_cos_sin(5, 8, layout="gptj")


# ---------------------------------------------------------------- ALiBi


def _paper_slopes(n):
    # the recursive rule of the ALiBi reference code (Press et al., 2022), written out independently
    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + _paper_slopes(2 * closest)[0::2][: n - closest]


def test_alibi_slopes_for_eight_heads_are_powers_of_one_half():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))


@pytest.mark.parametrize("n_heads", list(range(1, 18)) + [24, 40])
def test_alibi_slopes_match_paper_and_hugging_face(n_heads):
    torch.testing.assert_close(alibi_slopes(n_heads), torch.tensor(_paper_slopes(n_heads), dtype=torch.float32))
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    torch.testing.assert_close(alibi_slopes(n_heads), bloom._get_alibi_slopes(n_heads, torch.device("cpu")))


def test_alibi_bias_gives_the_same_attention_as_bloom():
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    h, t = 5, 11
    scores = torch.randn(h, t, t)
    mask = additive_mask(causal_mask(t))
    hf = bloom.build_alibi_tensor(torch.ones(1, t, dtype=torch.long), h, torch.float32)  # (H, 1, S): m * j
    want = (scores + hf + mask).softmax(-1)
    got = (scores + alibi_bias(h, t) + mask).softmax(-1)  # -m |i - j|: differs by m * i, constant per row
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert alibi_bias(h, 7, 13).shape == (h, 7, 13)
    assert alibi_bias(h, 7, 13)[0, -1, -1] == 0 and alibi_bias(h, 7, 13)[0, 0, 0] < 0  # queries are the last 7


# ---------------------------------------------------------------- the language model


def position_lm(**kw) -> SmallLM:
    """A SmallLM as Chapter 3's extrapolation experiment builds it (pre-LN, GELU, torch init, no head bias)."""
    return SmallLM(SmallLMConfig(**{**MODEL, **kw}))


@pytest.mark.parametrize("scheme", POSITION_SCHEMES)
def test_position_lm_is_causal(scheme):
    torch.manual_seed(0)
    model = position_lm(vocab_size=11, position=scheme, d_model=16, n_heads=2, max_positions=13).eval()
    if scheme == "t5":  # a zero-initialised bias would make T5 look like NoPE: randomise it
        torch.nn.init.normal_(model.rel_bias.relative_attention_bias.weight)
    ids = torch.randint(11, (2, 13))
    changed = ids.clone()
    changed[:, 9:] = (changed[:, 9:] + 1) % 11
    with torch.no_grad():
        a, b = model(ids), model(changed)
    assert a.shape == (2, 13, 11)
    torch.testing.assert_close(a[:, :9], b[:, :9])
    assert (a[:, 9:] - b[:, 9:]).abs().max() > 1e-4


@pytest.mark.parametrize("scheme", POSITION_SCHEMES)
def test_position_lm_positions_matter_except_for_nope(scheme):
    """With one layer, swapping two earlier tokens changes the last prediction unless the model has no positions."""
    torch.manual_seed(1)
    model = position_lm(vocab_size=11, position=scheme, d_model=16, n_heads=2, n_layers=1, max_positions=13).eval()
    if scheme == "t5":
        torch.nn.init.normal_(model.rel_bias.relative_attention_bias.weight)
    ids = torch.randint(11, (1, 7))
    swapped = ids[:, [1, 0, 2, 3, 4, 5, 6]]
    with torch.no_grad():
        diff = (model(ids)[:, -1] - model(swapped)[:, -1]).abs().max().item()
    if scheme == "none":
        assert diff < 1e-5
    else:
        assert diff > 1e-4


def test_learned_lm_fails_beyond_its_table():
    model = position_lm(vocab_size=5, position="learned", d_model=8, n_heads=2, max_positions=7)
    model(torch.zeros(1, 7, dtype=torch.long))
    with pytest.raises(ValueError, match="cannot index beyond"):
        model(torch.zeros(1, 8, dtype=torch.long))


def test_nope_sees_order_through_the_causal_mask_with_two_layers():
    """Layer 1 output at position 0 depends only on token 0: a second layer can read the order from it."""
    torch.manual_seed(1)
    model = position_lm(vocab_size=11, position="none", d_model=16, n_heads=2, n_layers=2).eval()
    ids = torch.randint(11, (1, 7))
    ids[0, 0], ids[0, 1] = 3, 4
    swapped = ids[:, [1, 0, 2, 3, 4, 5, 6]]
    with torch.no_grad():
        assert (model(ids)[:, -1] - model(swapped)[:, -1]).abs().max() > 1e-4


def test_shipped_results_and_weights_agree():
    """The shipped weights load into SmallLM (same keys and shapes, strict) and reproduce the recorded losses."""
    from companion.experiments import extrapolation

    results = extrapolation.load_extrapolation_results()
    assert set(results["loss"]) == set(POSITION_SCHEMES)
    lengths = results["config"]["eval_lengths"]
    train_length = results["config"]["train_length"]
    # the learned table has no rows beyond the training length; every other scheme runs at every length
    assert all((results["loss"]["learned"][str(n)] is None) == (n > train_length) for n in lengths)
    assert all(v is not None for s in POSITION_SCHEMES if s != "learned" for v in results["loss"][s].values())
    data = extrapolation.make_data()
    exp = extrapolation.ExperimentConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in results["config"].items()})
    with extrapolation._checkpoint(extrapolation.CHECKPOINT_WEIGHTS).open("rb") as fh:
        states = torch.load(fh, map_location="cpu", weights_only=True)
    short = min(lengths)
    for scheme in POSITION_SCHEMES:
        model = extrapolation.load_position_lm(scheme, data.tokenizer.vocab_size)  # load_state_dict(strict=True)
        assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == \
            {k: tuple(v.shape) for k, v in states[scheme].items()}, scheme
        by_length, _ = extrapolation.evaluate_lengths(model, data, exp, lengths=(short,))
        assert abs(by_length[str(short)] - results["loss"][scheme][str(short)]) < 1e-3, scheme

def test_rope_with_one_row_of_positions_per_sequence():
    """Left-padded batches: (B, T) positions give (B, T, Dh) angles, applied per sequence to every head."""
    positions = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]])
    cos, sin = rope_cos_sin(positions, 8, base=500.0)
    assert cos.shape == sin.shape == (2, 5, 8)
    x = torch.randn(2, 3, 5, 8)  # (B, H, T, Dh)
    got = apply_rope(x, cos[:, None], sin[:, None])
    for b in range(2):
        torch.testing.assert_close(got[b], apply_rope(x[b], *rope_cos_sin(positions[b], 8, base=500.0)))
    with pytest.raises(ValueError, match=r"cos of shape \(3, 1, 5, 8\) does not broadcast to x of shape \(2, 3, 5, 8\)"):
        apply_rope(x, cos[:1].expand(3, 5, 8)[:, None], sin[:1].expand(3, 5, 8)[:, None])


def test_rope_takes_given_frequencies():
    from companion.positional import llama3_rope_frequencies, rope_frequencies

    theta = rope_frequencies(8, base=10.0)
    torch.testing.assert_close(rope_cos_sin(6, 8, frequencies=theta)[0], rope_cos_sin(6, 8, base=10.0)[0])
    assert not torch.allclose(rope_cos_sin(6, 8, frequencies=2 * theta)[0], rope_cos_sin(6, 8, base=10.0)[0])
    with pytest.raises(ValueError, match="frequencies"):
        rope_cos_sin(6, 8, frequencies=theta[:3])
    # Llama 3.1's values: the highest frequencies kept, the lowest divided by 8, none raised
    plain, scaled = rope_frequencies(128, base=500000.0), llama3_rope_frequencies(128)
    assert scaled[0] == plain[0] and scaled[-1] == plain[-1] / 8 and bool((scaled <= plain).all())
