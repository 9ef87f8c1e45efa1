"""T5 (Chapter 11) against Hugging Face ``T5ForConditionalGeneration`` built from small random configs."""

from __future__ import annotations

import pytest
import torch

from companion.models.encoder_decoder import EncoderDecoder, EncoderDecoderConfig, generate_seq2seq
from companion.calculators import parameter_count
from companion.models.t5 import T5_SIZES, from_hf_t5, load_pretrained_t5, t5_config, t5_size_table

transformers = pytest.importorskip("transformers")
ATOL = 1e-5
V = 97
VARIANTS = {  # (feed_forward_proj, tied head): T5 v1.0 and T5 v1.1
    "v1.0": ("relu", True),
    "v1.1": ("gated-gelu", False),
}


def _hf_t5(variant: str, *, n_decoder_layers: int = 2, seed: int = 0, vocab_size: int = V):
    proj, tie = VARIANTS[variant]
    torch.manual_seed(seed)
    cfg = transformers.T5Config(
        vocab_size=vocab_size, d_model=24, d_kv=7, d_ff=40, num_layers=2, num_decoder_layers=n_decoder_layers, num_heads=3,
        feed_forward_proj=proj, tie_word_embeddings=tie, relative_attention_num_buckets=8,
        relative_attention_max_distance=20, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    hf = transformers.T5ForConditionalGeneration(cfg)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # random norms (T5 starts them at 1) so that a swapped or dropped norm shows
        for name, p in hf.named_parameters():
            if "layer_norm" in name:
                p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g))
        if not tie:  # transformers 5.x ties the head even for v1.1 configs: give it its own weights, as in v1.1 checkpoints
            hf.lm_head.weight = torch.nn.Parameter(torch.randn(hf.lm_head.weight.shape, generator=g))
    return hf.eval()


def _batch(seed: int = 0, b: int = 3, s: int = 11, vocab_size: int = V):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(2, vocab_size, (b, s), generator=g)
    att = torch.ones(b, s, dtype=torch.long)
    att[1, 7:] = 0  # right padding, as T5's tokenizer pads
    att[2, 4:] = 0
    return src.masked_fill(att == 0, 0), att


def _upto_eos(seqs: torch.Tensor, eos: int = 1) -> list[list[int]]:
    """Each sequence up to and including its first EOS: what comes after is padding, and transformers 5.x
    pads finished beams with EOS when the pad id is 0 (``pad or eos``) where 4.x used the pad id."""
    out = []
    for row in seqs.tolist():
        out.append(row[: row.index(eos, 1) + 1] if eos in row[1:] else row)
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_match_hugging_face_with_encoder_padding(variant):
    hf = _hf_t5(variant, n_decoder_layers=3)  # a decoder deeper than the encoder, as configs allow
    model = from_hf_t5(hf)
    proj, tie = VARIANTS[variant]
    assert model.cfg.tie_embeddings is tie and model.cfg.scale_output is tie and model.cfg.gated is (not tie)
    assert model.cfg.n_decoder_layers == 3 and model.cfg.d_head == 7
    src, att = _batch()
    tgt = torch.randint(2, V, (3, 9), generator=torch.Generator().manual_seed(5))
    tgt[:, 0] = 0
    with torch.no_grad():
        ref = hf(input_ids=src, attention_mask=att, decoder_input_ids=tgt).logits
        out = model(src, tgt, att)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=ATOL)


def test_scaling_of_the_tied_head_matters():
    """Without T5's ``d_model**-0.5`` before a tied head the logits are sqrt(d_model) times larger."""
    hf = _hf_t5("v1.0")
    model = from_hf_t5(hf)
    src, att = _batch()
    tgt = torch.zeros(3, 4, dtype=torch.long)
    with torch.no_grad():
        ref = hf(input_ids=src, attention_mask=att, decoder_input_ids=tgt).logits
        model.cfg.__dict__["scale_output"] = False  # frozen dataclass: flip the field for this check only
        try:
            unscaled = model(src, tgt, att)
        finally:
            model.cfg.__dict__["scale_output"] = True
    torch.testing.assert_close(unscaled, ref * 24 ** 0.5, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("num_beams", [1, 3])
def test_generation_equals_hugging_face_generate(variant, num_beams):
    hf = _hf_t5(variant)
    model = from_hf_t5(hf)
    src, att = _batch(seed=1)
    ref = hf.generate(input_ids=src, attention_mask=att, max_new_tokens=12, do_sample=False, num_beams=num_beams,
                      length_penalty=1.0, early_stopping=False, decoder_start_token_id=0, eos_token_id=1, pad_token_id=0)
    out = generate_seq2seq(model, src, src_attention_mask=att, max_new_tokens=12, num_beams=num_beams)
    assert _upto_eos(out) == _upto_eos(ref)
    if num_beams == 1:  # greedy pads with the pad id in both libraries
        assert out.tolist() == ref.tolist()


@pytest.mark.parametrize("num_beams", [1, 3])
def test_generations_that_stop_at_eos_equal_hugging_face(num_beams):
    """With 6 tokens EOS comes soon: the finishing and padding rules are exercised, not only the length limit."""
    for seed in range(20):
        hf = _hf_t5("v1.1", seed=seed, vocab_size=6)
        src, att = _batch(seed=seed, vocab_size=6)
        ref = hf.generate(input_ids=src, attention_mask=att, max_new_tokens=20, do_sample=False, num_beams=num_beams,
                          decoder_start_token_id=0, eos_token_id=1, pad_token_id=0)
        if any(1 in row for row in _upto_eos(ref)):
            break
    else:
        pytest.fail("no seed gave a generation that ends with EOS")
    out = generate_seq2seq(from_hf_t5(hf), src, src_attention_mask=att, max_new_tokens=20, num_beams=num_beams)
    assert _upto_eos(out) == _upto_eos(ref)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_cached_decoding_equals_recomputation(num_beams):
    model = from_hf_t5(_hf_t5("v1.1"))
    src, att = _batch(seed=2)
    cached = generate_seq2seq(model, src, src_attention_mask=att, max_new_tokens=10, num_beams=num_beams, use_cache=True)
    full = generate_seq2seq(model, src, src_attention_mask=att, max_new_tokens=10, num_beams=num_beams, use_cache=False)
    assert cached.tolist() == full.tolist()


def test_cache_logits_step_by_step_equal_teacher_forcing():
    model = from_hf_t5(_hf_t5("v1.0"))
    src, att = _batch(seed=3)
    tgt = torch.randint(2, V, (3, 7), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        memory = model.encode(src, att)
        full = model.decode(tgt, memory, att)  # (B, T, V)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, i : i + 1], memory, att, cache=cache) for i in range(7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == 7 and cache.cross_attn.length == src.shape[1]  # cross keys computed once, for S tokens


def test_batched_prompts_of_different_lengths_generate_what_each_would_alone():
    model = from_hf_t5(_hf_t5("v1.1"))
    src, att = _batch(seed=4)
    batched = _upto_eos(generate_seq2seq(model, src, src_attention_mask=att, max_new_tokens=9))
    for i in range(3):
        n = int(att[i].sum())
        alone = _upto_eos(generate_seq2seq(model, src[i : i + 1, :n], max_new_tokens=9))
        assert batched[i] == alone[0]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_parameter_count_equals_hugging_face(variant):
    hf = _hf_t5(variant, n_decoder_layers=3)
    n_hf = sum(p.numel() for p in hf.parameters())  # parameters() lists a tied matrix once
    proj, tie = VARIANTS[variant]
    cfg = t5_config(V, d_model=24, d_kv=7, d_ff=40, n_layers=2, n_decoder_layers=3, n_heads=3,
                    version="1.0" if tie else "1.1", n_buckets=8, max_distance=20)
    assert parameter_count(cfg) == n_hf


def _closed_form(d_model, d_kv, d_ff, n_layers, n_heads, version, vocab=32128, buckets=32):
    inner = n_heads * d_kv
    ffn = (3 if version == "1.1" else 2) * d_model * d_ff
    enc = n_layers * (4 * d_model * inner + ffn + 2 * d_model)
    dec = n_layers * (8 * d_model * inner + ffn + 3 * d_model)
    head = vocab * d_model if version == "1.1" else 0
    return vocab * d_model + enc + dec + 2 * d_model + 2 * buckets * n_heads + head


def test_size_table_counts_against_the_closed_form_and_published_sizes():
    rows = {r["name"]: r for r in t5_size_table()}
    assert rows["t5-small"]["params"] == 60_506_624  # the count Hugging Face reports for t5-small
    for name, row in rows.items():
        spec = {k: v for k, v in T5_SIZES[name].items() if k != "published"}
        assert row["params"] == _closed_form(**spec)
        if row["published"] is None:
            continue
        published = float(row["published"][:-1]) * (1e9 if row["published"].endswith("B") else 1e6)
        assert abs(row["params"] - published) / published < 0.06, name
    # t5-3b and t5-11b keep d_model = 1024: they grow through d_ff, the number of heads and d_kv
    assert rows["t5-3b"]["d_model"] == rows["t5-11b"]["d_model"] == rows["t5-large"]["d_model"]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_load_pretrained_reads_a_saved_folder(variant, tmp_path):
    hf = _hf_t5(variant)
    hf.save_pretrained(tmp_path)
    model = load_pretrained_t5(tmp_path)
    src, att = _batch()
    tgt = torch.zeros(3, 3, dtype=torch.long)
    with torch.no_grad():
        ref = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()(
            input_ids=src, attention_mask=att, decoder_input_ids=tgt).logits
        torch.testing.assert_close(model(src, tgt, att), ref, atol=ATOL, rtol=ATOL)


def test_bad_inputs_raise_clear_errors():
    cfg = t5_config(50, d_model=16, d_kv=4, d_ff=24, n_layers=1, n_heads=2)
    model = EncoderDecoder(cfg).eval()
    ids = torch.randint(0, 50, (2, 5))
    with pytest.raises(TypeError, match="EncoderDecoderConfig"):
        EncoderDecoder({"vocab_size": 50})
    with pytest.raises(TypeError, match="integer token ids"):
        model(ids.float(), ids)
    with pytest.raises(ValueError, match=r"src must lie in \[0, 50\)"):
        model(ids + 50, ids)
    with pytest.raises(ValueError, match="src_attention_mask"):
        model.encode(ids, torch.ones(2, 4))
    with pytest.raises(ValueError, match="version"):
        t5_config(version="2.0")
    with pytest.raises(ValueError, match="unknown T5 size"):
        t5_size_table(["t5-huge"])
    with pytest.raises(ValueError, match="positions must be"):
        EncoderDecoderConfig(vocab_size=10, d_model=8, n_heads=2, positions="rotary")
    with pytest.raises(ValueError, match="decoder_start_id"):
        EncoderDecoderConfig(vocab_size=10, d_model=8, n_heads=2, decoder_start_id=10)
    with pytest.raises(ValueError, match="max_positions"):
        model(torch.randint(0, 50, (1, 513)), ids[:1])
    with pytest.raises(ValueError, match="T5ForConditionalGeneration"):
        from_hf_t5(transformers.BertModel(transformers.BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1,
                                                                   num_attention_heads=2, intermediate_size=8)))
    with pytest.raises(TypeError, match="EncoderDecoder"):
        generate_seq2seq(torch.nn.Linear(2, 2), ids, max_new_tokens=2)


def test_training_mode_is_restored_and_dropout_is_off_in_generation():
    model = EncoderDecoder(t5_config(50, d_model=16, d_kv=4, d_ff=24, n_layers=1, n_heads=2, dropout=0.5))
    model.train()
    src = torch.randint(2, 50, (2, 5))
    a = generate_seq2seq(model, src, max_new_tokens=4)
    b = generate_seq2seq(model, src, max_new_tokens=4)
    assert model.training and a.tolist() == b.tolist()


def test_load_pretrained_names_a_missing_folder(tmp_path):
    from companion.models.bart import load_pretrained_bart
    from companion.models.t5 import load_pretrained_t5

    for load in (load_pretrained_t5, load_pretrained_bart):
        with pytest.raises(FileNotFoundError, match=r"nowhere is not a folder"):
            load(tmp_path / "nowhere")
        with pytest.raises(FileNotFoundError, match="has no config.json"):
            load(tmp_path)  # a folder, but not a saved model
