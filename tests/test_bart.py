"""BART (Chapter 11) against Hugging Face ``BartForConditionalGeneration`` built from small random configs."""

from __future__ import annotations

import pytest
import torch

from companion.models.bart import bart_config, from_hf_bart, load_pretrained_bart
from companion.models.encoder_decoder import EncoderDecoder, config_differences, generate_seq2seq
from companion.calculators import parameter_count
from companion.models.t5 import t5_config

transformers = pytest.importorskip("transformers")
ATOL = 1e-5
V = 89
PAD, BOS, EOS = 1, 0, 2


def _hf_bart(*, scale_embedding: bool = False, seed: int = 0, decoder_layers: int = 2):
    torch.manual_seed(seed)
    cfg = transformers.BartConfig(
        vocab_size=V, d_model=24, encoder_layers=2, decoder_layers=decoder_layers, encoder_attention_heads=3,
        decoder_attention_heads=3, encoder_ffn_dim=40, decoder_ffn_dim=40, max_position_embeddings=40,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, scale_embedding=scale_embedding,
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=EOS)
    hf = transformers.BartForConditionalGeneration(cfg)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # random norms, biases and final_logits_bias, so that a swapped or dropped tensor shows
        for name, p in hf.named_parameters():
            if "layer_norm" in name or "layernorm" in name or name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if name.endswith("weight") else 0.0))
        hf.final_logits_bias.copy_(torch.randn(hf.final_logits_bias.shape, generator=g))
    return hf.eval()


def _batch(seed: int = 0, b: int = 3, s: int = 11):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, V, (b, s), generator=g)
    att = torch.ones(b, s, dtype=torch.long)
    att[1, 8:] = 0
    att[2, 5:] = 0
    src[:, 0] = BOS
    return src.masked_fill(att == 0, PAD), att


GEN = dict(do_sample=False, decoder_start_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=BOS,
           forced_bos_token_id=None, forced_eos_token_id=None, no_repeat_ngram_size=0, min_length=0,
           length_penalty=1.0, early_stopping=False)


@pytest.mark.parametrize("scale_embedding", [False, True])
def test_logits_match_hugging_face_with_encoder_padding(scale_embedding):
    hf = _hf_bart(scale_embedding=scale_embedding, decoder_layers=3)
    model = from_hf_bart(hf)
    assert model.cfg.scale_embeddings is scale_embedding and model.cfg.n_decoder_layers == 3
    src, att = _batch()
    tgt = torch.randint(3, V, (3, 9), generator=torch.Generator().manual_seed(5))
    tgt[:, 0] = EOS
    with torch.no_grad():
        ref = hf(input_ids=src, attention_mask=att, decoder_input_ids=tgt).logits
        out = model(src, tgt, att)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=ATOL)


def test_position_offset_is_two():
    """Position p reads row p + 2 of the table: shifting the table by two rows changes the logits."""
    hf = _hf_bart()
    with torch.no_grad():  # positions as large as the tokens, so that reading the wrong row shows
        for table in (hf.model.encoder.embed_positions, hf.model.decoder.embed_positions):
            table.weight.normal_(std=1.0, generator=torch.Generator().manual_seed(7))
    model = from_hf_bart(hf)
    src, att = _batch()
    tgt = torch.full((3, 4), EOS)
    with torch.no_grad():
        out = hf(input_ids=src, attention_mask=att, decoder_input_ids=tgt, output_hidden_states=True)
        ref = out.encoder_last_hidden_state, out.decoder_hidden_states[-1]
        real = att.bool()
        memory = model.encode(src, att)
        torch.testing.assert_close(memory[real], ref[0][real], atol=ATOL, rtol=ATOL)
        torch.testing.assert_close(model.decode_hidden(tgt, memory, att), ref[1], atol=ATOL, rtol=ATOL)
        assert model.encoder_pos_emb.weight.shape[0] == 40 + 2
        for table in (model.encoder_pos_emb, model.decoder_pos_emb):
            table.weight.copy_(table.weight.roll(2, dims=0))  # position p now finds row p's old content
        memory = model.encode(src, att)
        assert (memory[real] - ref[0][real]).abs().max() > 0.1
        assert (model.decode_hidden(tgt, memory, att) - ref[1]).abs().max() > 0.1


@pytest.mark.parametrize("num_beams", [1, 3])
def test_generation_equals_hugging_face_generate(num_beams):
    hf = _hf_bart()
    model = from_hf_bart(hf)
    src, att = _batch(seed=1)
    ref = hf.generate(input_ids=src, attention_mask=att, max_new_tokens=12, num_beams=num_beams, **GEN)
    out = generate_seq2seq(model, src, src_attention_mask=att, max_new_tokens=12, num_beams=num_beams)
    assert out.tolist() == ref.tolist()


def test_cached_decoding_equals_recomputation():
    model = from_hf_bart(_hf_bart(seed=3))
    src, att = _batch(seed=2)
    for beams in (1, 2):
        cached = generate_seq2seq(model, src, src_attention_mask=att, max_new_tokens=10, num_beams=beams)
        full = generate_seq2seq(model, src, src_attention_mask=att, max_new_tokens=10, num_beams=beams, use_cache=False)
        assert cached.tolist() == full.tolist()


def test_parameter_count_equals_hugging_face():
    hf = _hf_bart(decoder_layers=3)
    cfg = bart_config(V, d_model=24, n_heads=3, d_ff=40, n_encoder_layers=2, n_decoder_layers=3, max_positions=40)
    assert parameter_count(cfg) == sum(p.numel() for p in hf.parameters())


def test_t5_and_bart_differ_only_in_config_fields():
    t5, bart = t5_config(100, d_model=16, d_kv=4, d_ff=24, n_layers=1, n_heads=4), bart_config(
        100, d_model=16, n_heads=4, d_ff=24, n_encoder_layers=1, n_decoder_layers=1)
    assert type(EncoderDecoder(t5)) is type(EncoderDecoder(bart))
    differ = {f for f in t5.__dataclass_fields__ if getattr(t5, f) != getattr(bart, f)}
    assert set(config_differences(t5, bart)) == differ and config_differences(t5, t5) == {}
    assert config_differences(t5, bart)["norm_first"] == (True, False)
    with pytest.raises(TypeError, match="EncoderDecoderConfig"):
        config_differences(t5, {})
    assert {"norm", "norm_first", "bias", "scale_attention", "positions", "embedding_norm", "final_norm",
            "scale_output", "final_logits_bias"} <= differ


def test_load_pretrained_reads_a_saved_folder(tmp_path):
    hf = _hf_bart()
    hf.save_pretrained(tmp_path)
    model = load_pretrained_bart(tmp_path)
    src, att = _batch()
    tgt = torch.full((3, 3), EOS)
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt, att), hf(input_ids=src, attention_mask=att, decoder_input_ids=tgt).logits,
                                   atol=ATOL, rtol=ATOL)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="BartForConditionalGeneration"):
        from_hf_bart(transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=20, d_model=8, d_kv=4, d_ff=8, num_layers=1, num_heads=2)))
    hf = _hf_bart()
    with torch.no_grad():
        hf.lm_head.weight = torch.nn.Parameter(hf.lm_head.weight + 1.0)
    with pytest.raises(ValueError, match="ties its head"):
        from_hf_bart(hf)
    model = EncoderDecoder(bart_config(50, d_model=16, n_heads=2, d_ff=24, n_encoder_layers=1, n_decoder_layers=1,
                                       max_positions=8))
    with pytest.raises(ValueError, match="max_positions=8"):
        model(torch.randint(3, 50, (1, 9)), torch.full((1, 2), EOS))
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load_pretrained_bart("/nonexistent/bart")


def test_bart_large_count_equals_hugging_face_on_the_meta_device():
    """BartConfig's defaults are bart-large's; both models are built without memory."""
    from companion.models.bart import BART_SIZES

    with torch.device("meta"):
        hf = transformers.BartForConditionalGeneration(transformers.BartConfig())
    spec = {k: v for k, v in BART_SIZES["bart-large"].items() if k != "published"}
    assert parameter_count(bart_config(**spec)) == sum(p.numel() for p in hf.parameters())
