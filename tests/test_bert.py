"""BERT (companion.models.bert) against Hugging Face's BERT built from small random configs."""

from __future__ import annotations

import json

import pytest
import torch

from companion.models.bert import (
    BERT_BASE, BERT_LARGE, BertConfig, BertForMaskedLM, BertForPreTraining, BertForQuestionAnswering,
    BertForSequenceClassification, BertForTokenClassification, BertModel,
    from_hf_bert, load_pretrained, mean_pool,
)
from companion.calculators import count_parameters

transformers = pytest.importorskip("transformers")

ATOL = 1e-5


def hf_config(**kw):
    base = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                max_position_embeddings=64, type_vocab_size=2, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0, pad_token_id=0)
    base.update(kw)
    return transformers.BertConfig(**base)


def batch(seed=0, b=3, t=11, vocab=99):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (b, t), generator=g)
    segments = (torch.arange(t) >= t // 2).long().expand(b, t).clone()
    attention_mask = torch.ones(b, t, dtype=torch.long)
    attention_mask[1, -4:] = 0  # a padded row
    attention_mask[2, -1:] = 0
    ids[attention_mask == 0] = 0
    return ids, segments, attention_mask


def _hf(cls, seed=0, **kw):
    torch.manual_seed(seed)
    model = cls(hf_config(**kw)).eval()
    with torch.no_grad():  # random LayerNorm and bias values, so a swapped or dropped tensor shows
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return model


@pytest.mark.parametrize("padded", [False, True])
def test_pretraining_heads_match_hugging_face(padded):
    hf = _hf(transformers.BertForPreTraining)
    ours = from_hf_bert(hf)
    assert isinstance(ours, BertForPreTraining)
    ids, seg, att = batch()
    att = att if padded else torch.ones_like(att)
    with torch.no_grad():
        ref = hf(input_ids=ids, token_type_ids=seg, attention_mask=att)
        out = ours(ids, att, seg)
    real = att.bool()  # padded positions' outputs are not used by anyone; compare the real ones
    torch.testing.assert_close(out.mlm_logits[real], ref.prediction_logits[real], atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(out.nsp_logits, ref.seq_relationship_logits, atol=ATOL, rtol=ATOL)


def test_padded_positions_match_too():
    hf = _hf(transformers.BertModel)
    ours = from_hf_bert(hf)
    ids, seg, att = batch(1)
    with torch.no_grad():
        ref = hf(input_ids=ids, token_type_ids=seg, attention_mask=att)
        out = ours(ids, att, seg)
    torch.testing.assert_close(out.hidden, ref.last_hidden_state, atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(out.pooled, ref.pooler_output, atol=ATOL, rtol=ATOL)


def test_masked_lm_matches_and_has_no_pooler():
    hf = _hf(transformers.BertForMaskedLM, hidden_act="gelu_new")
    ours = from_hf_bert(hf)
    assert isinstance(ours, BertForMaskedLM) and ours.bert.pooler is None
    ids, seg, att = batch(2)
    with torch.no_grad():
        ref = hf(input_ids=ids, token_type_ids=seg, attention_mask=att).logits
        out = ours(ids, att, seg).mlm_logits
    torch.testing.assert_close(out[att.bool()], ref[att.bool()], atol=ATOL, rtol=ATOL)


def test_mlm_decoder_is_the_token_embedding():
    model = BertForPreTraining(BertConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_positions=16))
    assert model.mlm.tok_emb.weight is model.bert.embeddings.tok_emb.weight
    ids = torch.randint(0, 50, (2, 5))
    model(ids).mlm_logits.sum().backward()
    # the one matrix gets gradient from both uses: the input lookup and the output projection
    assert model.bert.embeddings.tok_emb.weight.grad.abs().sum() > 0
    names = [n for n, _ in model.named_parameters()]
    assert not any("mlm.tok_emb" in n for n in names)


def test_padding_does_not_change_real_tokens():
    cfg = BertConfig(vocab_size=50, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_positions=16, dropout=0.0)
    model = BertModel(cfg).eval()
    ids = torch.randint(1, 50, (1, 6))
    padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], 1)
    att = torch.tensor([[1] * 6 + [0] * 3])
    with torch.no_grad():
        short = model(ids).hidden
        long = model(padded, att).hidden
    torch.testing.assert_close(long[:, :6], short, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kind", ["safetensors", "bin"])
def test_load_pretrained_reads_a_saved_folder(tmp_path, kind):
    pytest.importorskip("safetensors")
    hf = _hf(transformers.BertForMaskedLM, seed=3)
    if kind == "safetensors":
        hf.save_pretrained(tmp_path)
    else:  # the older layout (transformers 5 writes safetensors only): config.json + a pickled state dict
        hf.config.save_pretrained(tmp_path)
        torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    assert (tmp_path / ("model.safetensors" if kind == "safetensors" else "pytorch_model.bin")).is_file()
    ours = load_pretrained(tmp_path)
    ids, seg, att = batch(4)
    with torch.no_grad():
        ref = hf(input_ids=ids, token_type_ids=seg, attention_mask=att).logits
        out = ours(ids, att, seg).mlm_logits
    torch.testing.assert_close(out[att.bool()], ref[att.bool()], atol=ATOL, rtol=ATOL)


def _saved_state(tmp_path):
    from safetensors.torch import load_file, save_file

    hf = _hf(transformers.BertModel, seed=5)
    hf.save_pretrained(tmp_path)
    return load_file(str(tmp_path / "model.safetensors")), save_file


def test_load_pretrained_names_a_missing_tensor(tmp_path):
    pytest.importorskip("safetensors")
    sd, save_file = _saved_state(tmp_path)
    del sd["encoder.layer.1.output.LayerNorm.bias"]
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing.*encoder\.layer\.1\.output\.LayerNorm\.bias"):
        load_pretrained(tmp_path)


def test_load_pretrained_names_an_unexpected_tensor(tmp_path):
    pytest.importorskip("safetensors")
    sd, save_file = _saved_state(tmp_path)
    sd["encoder.layer.0.attention.self.rotary.weight"] = torch.zeros(3)
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"unexpected.*attention\.self\.rotary\.weight"):
        load_pretrained(tmp_path)


def test_load_pretrained_rejects_other_models(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load_pretrained(tmp_path / "nowhere")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises((TypeError, FileNotFoundError)):
        load_pretrained(tmp_path)


def test_parameter_counts_of_base_and_large_match_hugging_face():
    # The published 110M and 340M (Devlin et al., 2019) are these counts, rounded.
    for cfg, published in ((BERT_BASE, 110e6), (BERT_LARGE, 340e6)):
        with torch.device("meta"):
            ours = count_parameters(BertModel(cfg))
            hf = transformers.BertModel(transformers.BertConfig(
                hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                intermediate_size=cfg.d_ff))
        assert ours == sum(p.numel() for p in hf.parameters())
        assert abs(ours - published) / published < 0.02
    d, f, v, L = BERT_BASE.d_model, BERT_BASE.d_ff, BERT_BASE.vocab_size, BERT_BASE.n_layers
    per_block = 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d  # attention, FFN, two LayerNorms
    embeddings = (v + BERT_BASE.max_positions + BERT_BASE.n_segments) * d + 2 * d
    with torch.device("meta"):
        assert count_parameters(BertModel(BERT_BASE)) == embeddings + L * per_block + d * d + d


def test_mean_pool_ignores_padding_and_empty_rows():
    hidden = torch.arange(24, dtype=torch.float32).reshape(2, 4, 3)
    att = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]])
    pooled = mean_pool(hidden, att)
    torch.testing.assert_close(pooled[0], hidden[0, :2].mean(0))
    assert torch.equal(pooled[1], torch.zeros(3))
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(2, 4\)"):
        mean_pool(hidden, att[:, :3])


def test_bad_inputs_say_what_was_expected():
    cfg = BertConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_positions=8)
    model = BertModel(cfg)
    with pytest.raises(ValueError, match="more than max_positions=8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 50\)"):
        model(torch.full((1, 3), 50))
    with pytest.raises(ValueError, match=r"segment_ids must lie in \[0, 2\)"):
        model(torch.zeros(1, 3, dtype=torch.long), segment_ids=torch.full((1, 3), 2))
    with pytest.raises(ValueError, match="attention_mask must have input_ids' shape"):
        model(torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="not divisible by n_heads=3"):
        BertConfig(d_model=16, n_heads=3)


@pytest.mark.parametrize("padded", [False, True])
def test_sequence_classification_head_matches_hugging_face(padded):
    hf = _hf(transformers.BertForSequenceClassification, num_labels=3)
    ours = from_hf_bert(hf)
    assert isinstance(ours, BertForSequenceClassification) and ours.n_labels == 3
    ids, seg, att = batch(3)
    att = att if padded else torch.ones_like(att)
    with torch.no_grad():
        ref = hf(input_ids=ids, token_type_ids=seg, attention_mask=att).logits
        out = ours(ids, att, seg)
    assert out.shape == (3, 3)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("padded", [False, True])
def test_token_classification_head_matches_hugging_face(padded):
    hf = _hf(transformers.BertForTokenClassification, num_labels=5)
    ours = from_hf_bert(hf)
    assert isinstance(ours, BertForTokenClassification) and ours.bert.pooler is None
    ids, seg, att = batch(4)
    att = att if padded else torch.ones_like(att)
    with torch.no_grad():
        ref = hf(input_ids=ids, token_type_ids=seg, attention_mask=att).logits
        out = ours(ids, att, seg)
    real = att.bool()
    torch.testing.assert_close(out[real], ref[real], atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("padded", [False, True])
def test_span_head_matches_hugging_face_question_answering(padded):
    hf = _hf(transformers.BertForQuestionAnswering)
    ours = from_hf_bert(hf)
    assert isinstance(ours, BertForQuestionAnswering)
    ids, seg, att = batch(5)
    att = att if padded else torch.ones_like(att)
    with torch.no_grad():
        ref = hf(input_ids=ids, token_type_ids=seg, attention_mask=att)
        out = ours(ids, att, seg)
    real = att.bool()
    torch.testing.assert_close(out.start[real], ref.start_logits[real], atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(out.end[real], ref.end_logits[real], atol=ATOL, rtol=ATOL)


def test_heads_reject_a_bad_label_count():
    cfg = BertConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_positions=16)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="n_labels"):
            BertForSequenceClassification(cfg, bad)
