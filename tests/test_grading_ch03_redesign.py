"""Chapter 3's exercises 3.1 and 3.2: the reference answers score full marks, the chapter's own code submitted
verbatim does not, and each named wrong answer loses points with a message that names its mistake."""

import math

import pytest
import torch

from companion.grading.ch03 import _pe_at
from companion.positional import (RelativePositionBias, relative_position_bucket, relative_positions,
                                  sinusoidal_encoding, sinusoidal_shift_matrix)
from scoring import full_marks, loses, result


# ----------------------------------------------------------------- the chapter's code, verbatim


def sinusoidal(n_positions, d_model):
    omega = 10000 ** (-torch.arange(0, d_model, 2) / d_model)  # (D/2,): omega_i
    angles = torch.arange(n_positions)[:, None] * omega  # (P, D/2): p * omega_i
    pe = torch.empty(n_positions, d_model)
    pe[:, 0::2] = angles.sin()
    pe[:, 1::2] = angles.cos()
    return pe


def shift_matrix(k, d_model):
    omega = 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (D/2,)
    c, s = (k * omega).cos(), (k * omega).sin()
    blocks = [torch.tensor([[c[i], s[i]], [-s[i], c[i]]]) for i in range(d_model // 2)]  # acts on (sin, cos)
    return torch.block_diag(*blocks).float()  # (D, D): R_k


def bucket(rel, bidirectional=True, n_buckets=32, max_distance=128):
    # rel = j - i (key minus query), an integer tensor
    out = torch.zeros_like(rel)
    if bidirectional:
        n_buckets //= 2
        out += (rel > 0).long() * n_buckets  # keys after the query: the upper half
        n = rel.abs()
    else:
        n = (-rel).clamp(min=0)  # keys after the query count as distance 0
    n_exact = n_buckets // 2
    log_ratio = torch.log(n.float() / n_exact) / math.log(max_distance / n_exact)  # float32, as in the original
    far = (n_exact + (log_ratio * (n_buckets - n_exact)).long()).clamp(max=n_buckets - 1)
    return out + torch.where(n < n_exact, n, far)


# ----------------------------------------------------------------- 3.1


def good_shift(pe, k):
    d = pe.shape[-1]
    omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = torch.as_tensor(k, dtype=torch.float64)[..., None] * omega
    c, s = angle.cos().to(pe.dtype), angle.sin().to(pe.dtype)
    sin_p, cos_p = pe[..., 0::2], pe[..., 1::2]
    return torch.stack((sin_p * c + cos_p * s, cos_p * c - sin_p * s), -1).flatten(-2)


def chapter_matrix_wrapped(pe, k):  # the chapter's R_k applied as a matrix: one scalar offset, float32
    return pe @ shift_matrix(k, pe.shape[-1]).T


def wrong_direction(pe, k):  # the textbook rotation [[c, -s], [s, c]] on (sin, cos): PE(p - k)
    return good_shift(pe, -torch.as_tensor(k))


def float32_angles(pe, k):
    d = pe.shape[-1]
    angle = torch.as_tensor(k, dtype=torch.float32)[..., None] * 10000.0 ** (-torch.arange(0, d, 2) / d)
    c, s = angle.cos().to(pe.dtype), angle.sin().to(pe.dtype)
    sin_p, cos_p = pe[..., 0::2], pe[..., 1::2]
    return torch.stack((sin_p * c + cos_p * s, cos_p * c - sin_p * s), -1).flatten(-2)


def additive(pe, k):  # the seed's "additive" reading: PE(p) + PE(k)
    return pe + _pe_at(torch.as_tensor(k, dtype=torch.float64), pe.shape[-1]).to(pe.dtype)


def scalar_offset_only(pe, k):  # ignores the shape of k: every vector moves by the first offset
    return good_shift(pe, float(torch.as_tensor(k).flatten()[0]))


def test_grader_formula_equals_the_package_table():
    torch.testing.assert_close(_pe_at(torch.arange(300), 16).float(), sinusoidal_encoding(300, 16), atol=1e-6, rtol=0)
    v = torch.randn(3, 10, dtype=torch.float64)
    torch.testing.assert_close(good_shift(v, 4), v @ sinusoidal_shift_matrix(4, 10).double().T, atol=1e-6, rtol=0)


def test_3_1_reference():
    full_marks("3.1", good_shift)


def test_3_1_the_chapters_code_does_not_pass():
    for student in (sinusoidal, shift_matrix):  # verbatim: another question's answer
        got, points, _ = result("3.1", student)
        assert got == 0, (student.__name__, got)
    got, lost = loses("3.1", chapter_matrix_wrapped, "dtype")  # wrapping the chapter's matrix: 2 of 5 points
    assert got == 2 and set(lost) == {"negative, fractional and large offsets in float64",
                                      "one offset per sequence of a batch",
                                      "a rotation of any vector: linear, composes, keeps norms"}, lost


@pytest.mark.parametrize("student, words", [
    (wrong_direction, ("PE(p - k)", "-k w_i")),
    (float32_angles, ("float64",)),
    (additive, ("not an addition",)),
    (scalar_offset_only, ("one offset per sequence",)),
])
def test_3_1_wrong_answers(student, words):
    loses("3.1", student, *words)


# ----------------------------------------------------------------- 3.2


def good_t5_bias(table, n_queries, n_keys, bidirectional, max_distance=128):
    query = torch.arange(n_keys - n_queries, n_keys)[:, None]
    key = torch.arange(n_keys)[None, :]
    return table[bucket(key - query, bidirectional, table.shape[0], max_distance)].permute(2, 0, 1)[None]


def no_cache_offset(table, n_queries, n_keys, bidirectional, max_distance=128):  # queries at 0..T-1
    rel = torch.arange(n_keys)[None, :] - torch.arange(n_queries)[:, None]
    return table[bucket(rel, bidirectional, table.shape[0], max_distance)].permute(2, 0, 1)[None]


def query_minus_key(table, n_queries, n_keys, bidirectional, max_distance=128):
    rel = torch.arange(n_keys - n_queries, n_keys)[:, None] - torch.arange(n_keys)[None, :]
    return table[bucket(rel, bidirectional, table.shape[0], max_distance)].permute(2, 0, 1)[None]


def not_permuted(table, n_queries, n_keys, bidirectional, max_distance=128):  # (T, S, H)
    return good_t5_bias(table, n_queries, n_keys, bidirectional, max_distance)[0].permute(1, 2, 0)


def always_32_buckets(table, n_queries, n_keys, bidirectional, max_distance=128):
    rel = torch.arange(n_keys)[None, :] - torch.arange(n_keys - n_queries, n_keys)[:, None]
    return table[bucket(rel, bidirectional, 32, max_distance)].permute(2, 0, 1)[None]


def test_3_2_reference_and_package():
    full_marks("3.2", good_t5_bias)

    def package(table, n_queries, n_keys, bidirectional, max_distance=128):
        module = RelativePositionBias(table.shape[1], bidirectional=bidirectional, n_buckets=table.shape[0],
                                      max_distance=max_distance).to(table.dtype)
        module.load_state_dict({"relative_attention_bias.weight": table})
        with torch.no_grad():
            return module(n_queries, n_keys)

    full_marks("3.2", package)
    # the reference of the checks agrees with the package's own pieces
    rel = relative_positions(7, 13)
    assert torch.equal(bucket(rel, False), relative_position_bucket(rel, bidirectional=False))


def test_3_2_the_chapters_bucket_does_not_pass():
    got, points, _ = result("3.2", bucket)
    assert got == 0


@pytest.mark.parametrize("student, words", [
    (no_cache_offset, ("cached positions", "the last ones")),
    (query_minus_key, ("key minus query",)),
    (not_permuted, ("(T, S, H)", "(1, H, T, S)")),
    (always_32_buckets, ("8 rows", "table.shape[0]")),
])
def test_3_2_wrong_answers(student, words):
    loses("3.2", student, *words)


def test_3_2_missing_offset_costs_only_the_cached_cases():
    got, lost = loses("3.2", no_cache_offset, "cached")
    assert set(lost) == {"decoder with 6 cached positions, T = 7, S = 13",
                         "one new token after 300 cached ones (T = 1, S = 301)",
                         "the number of buckets comes from the table (8 buckets, max_distance 20)",
                         "odd sizes: 13 buckets, max_distance 7, a float64 table"} and got == 2, lost


def test_3_2_reference_equals_hugging_face_compute_bias():
    import inspect

    import transformers
    from transformers.models.t5.modeling_t5 import T5Attention

    for is_decoder, t, s in ((False, 40, 40), (True, 7, 13), (True, 1, 301)):
        config = transformers.T5Config(d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=1, vocab_size=50,
                                       is_decoder=is_decoder)
        hf = T5Attention(config, has_relative_attention_bias=True, layer_idx=0)
        # transformers 5 takes the number of cached positions; 4.x takes the positions of the queries
        if "past_seen_tokens" in inspect.signature(hf.compute_bias).parameters:
            cached = {"past_seen_tokens": s - t}
        else:
            cached = {"cache_position": torch.arange(s - t, s)}
        with torch.no_grad():
            want = hf.compute_bias(t, s, **cached)
            got = good_t5_bias(hf.relative_attention_bias.weight, t, s, not is_decoder)
        assert torch.equal(got, want), (is_decoder, t, s)
