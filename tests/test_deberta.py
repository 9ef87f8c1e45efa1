"""DeBERTa-v2/v3 disentangled attention (companion.models.deberta) against Hugging Face's DebertaV2Model."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch

from companion.models.deberta import (DebertaConfig, DebertaModel, DisentangledAttention, from_hf_deberta_v2,
                                      log_bucket_position, relative_buckets)

transformers = pytest.importorskip("transformers")
ATOL = 1e-5


def _hf(seed=0, weight_std=None, **kw):
    base = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                max_position_embeddings=64, relative_attention=True, position_buckets=8, pos_att_type=["p2c", "c2p"],
                share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    base.update(kw)
    torch.manual_seed(seed)
    model = transformers.DebertaV2Model(transformers.DebertaV2Config(**base)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.normal_(0.0, 0.5)
            elif weight_std is not None:
                p.normal_(0.0, weight_std)
    return model


def test_log_buckets_by_hand():
    # bucket_size 8 -> mid 4: |d| <= 4 exact; beyond, 4 + ceil(3 * log(|d| / 4) / log(511 / 4)), with the sign of d
    d = torch.tensor([0, 1, -4, 5, 9, -30, 200, 511, 1000])
    expected = [0 if x == 0 else (x if abs(x) <= 4 else int(math.copysign(
        4 + math.ceil(3 * math.log(abs(x) / 4) / math.log(511 / 4)), x))) for x in d.tolist()]
    assert log_bucket_position(d, 8, 512).tolist() == expected
    assert expected[3:] == [5, 5, -6, 7, 7, 8]  # distances far apart share rows; 1000 > max_position reaches 8


def test_bucket_function_equals_hugging_face():
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    d = torch.arange(-700, 701)
    for bucket_size, max_position in [(8, 512), (256, 512), (16, 64)]:
        assert torch.equal(log_bucket_position(d, bucket_size, max_position),
                           make_log_bucket_position(d, bucket_size, max_position).long())


def test_relative_rows_are_antisymmetric_around_the_middle():
    rows = relative_buckets(12, 8, 64)
    assert rows.shape == (12, 12) and torch.equal(rows.diagonal(), torch.full((12,), 8))
    assert torch.equal(rows + rows.T, torch.full((12, 12), 16))  # bucket(i - j) = -bucket(j - i)
    assert int(rows.min()) >= 0 and int(rows.max()) <= 15


@pytest.mark.parametrize("kw", [
    {},  # DeBERTa-v3's layout: relative positions only
    {"position_biased_input": True, "type_vocab_size": 2, "norm_rel_ebd": "none"},  # v2 with absolute positions
])
@pytest.mark.parametrize("t", [7, 40])  # 40 > n_position_buckets: the log buckets are used
def test_encoder_matches_hugging_face_with_padding(kw, t):
    hf = _hf(**kw)
    ours = from_hf_deberta_v2(hf)
    g = torch.Generator().manual_seed(t)
    ids = torch.randint(1, 99, (3, t), generator=g)
    att = torch.ones(3, t, dtype=torch.long)
    att[1, -3:] = 0
    ids[att == 0] = 0
    seg = (torch.arange(t) >= t // 2).long().expand(3, t) if kw.get("type_vocab_size") else None
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=att, token_type_ids=seg).last_hidden_state
        out = ours(ids, att, seg)
    real = att.bool()
    torch.testing.assert_close(out[real], ref[real], atol=ATOL, rtol=ATOL)


def test_one_layer_attention_matches_and_position_terms_matter():
    hf = _hf(num_hidden_layers=1, weight_std=0.3)  # large weights: position terms as big as content terms
    ours = from_hf_deberta_v2(hf)
    ids = torch.randint(1, 99, (2, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(input_ids=ids).last_hidden_state
        out = ours(ids)
        # Switch the c2p and p2c terms off: the output must change.
        with mock.patch.object(DisentangledAttention, "position_scores", lambda self, q, k, table, rows: None):
            no_pos = ours(ids)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=ATOL)
    assert (no_pos - ref).abs().max() > 1e-2


def test_config_and_loader_errors():
    with pytest.raises(ValueError, match="n_position_buckets"):
        DebertaConfig(n_position_buckets=7)
    with pytest.raises(ValueError, match="share_att_key"):
        from_hf_deberta_v2(_hf(share_att_key=False))
    with pytest.raises(ValueError, match="pos_att_type"):
        from_hf_deberta_v2(_hf(pos_att_type=["c2p"]))
    model = DebertaModel(DebertaConfig(vocab_size=20, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_positions=16,
                                       n_position_buckets=8))
    with pytest.raises(ValueError, match="max_positions"):
        model(torch.zeros(1, 17, dtype=torch.long))
