"""Closed-form counts against independent ones: meta-device modules, Hugging Face models, FlopCounterMode."""

import dataclasses

import pytest

from companion.moe import MoEConfig
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from companion.calculators import (
    T5Sizes,
    attention_score_bytes,
    forward_flops,
    mlm_head_flops,
    generation_kv_cache_bytes,
    parameter_count,
    t5_sizes_from_hf,
)
from companion.memory import peak_tensor_bytes
from companion.models.albert import ALBERT_CONFIGS
from companion.models.bert import BERT_BASE, BertConfig, BertForMaskedLM, BertModel
from companion.models.electra import ELECTRA_SMALL
from companion.models.gpt import GPT, GPT1, GPT2_MEDIUM, GPTConfig
from companion.models.llama import Llama, LlamaConfig
from companion.models.roberta import ROBERTA_BASE
from companion.models.transformer import Transformer, TransformerConfig

transformers = pytest.importorskip("transformers")


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def counted_flops(fn):
    """FLOPs that torch counts; the math SDPA backend makes attention's two matmuls visible to the counter."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter, torch.no_grad():
        fn()
    return counter.get_total_flops()


ODD_BERTS = [
    dict(vocab_size=97, d_model=24, n_layers=3, n_heads=4, d_ff=40, max_positions=20),
    dict(vocab_size=101, d_model=30, n_layers=2, n_heads=5, d_ff=33, max_positions=17, n_segments=3, embedding_size=7),
    dict(vocab_size=53, d_model=16, n_layers=5, n_heads=2, d_ff=24, max_positions=9, embedding_size=8,
         share_layers=True),
]


@pytest.mark.parametrize("kw", ODD_BERTS)
@pytest.mark.parametrize("pooler", [True, False])
def test_encoder_parameters_match_meta_module(kw, pooler):
    cfg = BertConfig(**kw)
    with torch.device("meta"):
        model = BertModel(cfg, pooler=pooler)
    assert parameter_count(cfg, pooler=pooler) == n_params(model)


@pytest.mark.parametrize("cfg", [BERT_BASE, ROBERTA_BASE, ELECTRA_SMALL, *ALBERT_CONFIGS.values()])
def test_encoder_presets_match_meta_module(cfg):
    with torch.device("meta"):
        model = BertModel(cfg)
    assert parameter_count(cfg) == n_params(model)


def test_bert_base_matches_hugging_face():
    hf = transformers.BertConfig()  # BERT-base's sizes are HF's defaults
    with torch.device("meta"):
        model = transformers.BertModel(hf)
    assert parameter_count(BERT_BASE) == n_params(model)


@pytest.mark.parametrize("cfg", [GPT1, GPT2_MEDIUM, GPTConfig(vocab_size=61, max_positions=13, d_model=20, n_layers=3,
                                                             n_heads=5, d_ff=44, tie_embeddings=False, bias=False)])
def test_decoder_parameters_match_meta_module(cfg):
    with torch.device("meta"):
        model = GPT(cfg)
    assert parameter_count(cfg) == n_params(model)


@pytest.mark.parametrize("tie", [True, False])
def test_transformer_parameters_match_meta_module(tie):
    cfg = TransformerConfig(vocab_size=89, d_model=24, n_heads=4, d_ff=36, n_encoder_layers=2, n_decoder_layers=3,
                            max_positions=30, tie_embeddings=tie)
    with torch.device("meta"):
        model = Transformer(cfg)
    assert parameter_count(cfg) == n_params(model)


def hf_t5_config(**kw):
    """A ``T5Config``; ``tie_word_embeddings`` is set after construction (transformers 5.x's T5Config
    keeps True when it is passed as an argument)."""
    tie = kw.pop("tie_word_embeddings", True)
    hf = transformers.T5Config(**kw)
    hf.tie_word_embeddings = tie
    return hf


def t5_params(model):
    """Distinct parameters of a T5, with the encoder's and decoder's input tables counted as the shared one.

    Every T5 checkpoint and transformers 4.x use one input table (``shared``) for both stacks;
    transformers 5.x, when the output layer is untied, also unties the two stacks' tables."""
    extra = sum(stack.embed_tokens.weight.numel() for stack in (model.encoder, model.decoder)
                if stack.embed_tokens.weight is not model.shared.weight)
    return n_params(model) - extra


T5_HF = [
    dict(vocab_size=97, d_model=24, d_kv=5, num_heads=3, d_ff=40, num_layers=2, num_decoder_layers=3),
    dict(vocab_size=97, d_model=24, d_kv=5, num_heads=3, d_ff=40, num_layers=3, num_decoder_layers=1,
         feed_forward_proj="gated-gelu", tie_word_embeddings=False, relative_attention_num_buckets=7),
    dict(vocab_size=32128, d_model=512, d_kv=64, num_heads=8, d_ff=2048, num_layers=6, num_decoder_layers=6),  # small
    dict(vocab_size=32128, d_model=1024, d_kv=128, num_heads=128, d_ff=65536, num_layers=24,
         num_decoder_layers=24),  # 11B: n_heads * d_head = 16384 != d_model
]


@pytest.mark.parametrize("kw", T5_HF)
def test_t5_parameters_match_hugging_face(kw):
    hf = hf_t5_config(**kw)
    with torch.device("meta"):
        model = transformers.T5ForConditionalGeneration(hf)
    assert (model.lm_head.weight is model.shared.weight) == kw.get("tie_word_embeddings", True)
    assert parameter_count(t5_sizes_from_hf(hf)) == t5_params(model)


@pytest.mark.parametrize("kw", ODD_BERTS)
@pytest.mark.parametrize("t", [1, 9])
def test_encoder_flops_match_counter(kw, t):
    cfg = dataclasses.replace(BertConfig(**kw), dropout=0.0)
    model = BertModel(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, t))
    assert counted_flops(lambda: model(ids)) == forward_flops(cfg, t)


@pytest.mark.parametrize("kw", ODD_BERTS)
def test_masked_lm_flops_are_the_encoder_and_the_head(kw):
    cfg = dataclasses.replace(BertConfig(**kw), dropout=0.0)
    model = BertForMaskedLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 6))
    assert counted_flops(lambda: model(ids)) == forward_flops(cfg, 6, pooler=False) + mlm_head_flops(cfg, 6)
    with pytest.raises(TypeError, match="BertConfig"):
        mlm_head_flops(GPTConfig(vocab_size=9, max_positions=4, d_model=8, n_layers=1, n_heads=2), 3)


@pytest.mark.parametrize("t", [1, 7, 13])
def test_decoder_flops_match_counter(t):
    cfg = GPTConfig(vocab_size=97, max_positions=20, d_model=24, n_layers=3, n_heads=4, d_ff=40)
    model = GPT(cfg).eval()
    ids = torch.randint(0, 97, (1, t))
    assert counted_flops(lambda: model(ids)) == forward_flops(cfg, t)


def test_decoder_flops_scale_with_batch():
    cfg = GPTConfig(vocab_size=50, max_positions=16, d_model=16, n_layers=2, n_heads=2)
    model = GPT(cfg).eval()
    assert counted_flops(lambda: model(torch.randint(0, 50, (3, 11)))) == 3 * forward_flops(cfg, 11)


@pytest.mark.parametrize("s,t", [(11, 7), (1, 5), (6, 1)])
def test_transformer_flops_match_counter(s, t):
    cfg = TransformerConfig(vocab_size=97, d_model=24, n_heads=4, d_ff=40, n_encoder_layers=2, n_decoder_layers=3,
                            max_positions=30, dropout=0.0)
    model = Transformer(cfg).eval()
    src, tgt = torch.randint(1, 97, (1, s)), torch.randint(1, 97, (1, t))
    assert counted_flops(lambda: model(src, tgt)) == forward_flops(cfg, t, src_len=s)


@pytest.mark.parametrize("kw", T5_HF[:2])
def test_t5_flops_match_counter(kw):
    hf = hf_t5_config(**kw)
    model = transformers.T5ForConditionalGeneration(hf).eval()
    src, tgt = torch.randint(1, 97, (1, 11)), torch.randint(1, 97, (1, 6))
    got = counted_flops(lambda: model(input_ids=src, decoder_input_ids=tgt))
    assert got == forward_flops(t5_sizes_from_hf(hf), 6, src_len=11)


def test_flops_per_token_is_two_per_parameter_plus_attention():
    """Kaplan-style rule with the exact attention term: 2 N_matmul + 4 L d T (independent arithmetic)."""
    cfg = GPTConfig(vocab_size=1000, max_positions=2048, d_model=256, n_layers=4, n_heads=8)
    t = 2048
    n_matmul = cfg.n_layers * 12 * cfg.d_model ** 2 + cfg.vocab_size * cfg.d_model  # blocks + LM head
    assert forward_flops(cfg, t) == t * (2 * n_matmul + 4 * cfg.n_layers * cfg.d_model * t)


def test_gpt_kv_cache_bytes_match_a_filled_cache():
    cfg = GPTConfig(vocab_size=50, max_positions=32, d_model=24, n_layers=3, n_heads=4)
    model = GPT(cfg).eval()
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(0, 50, (2, 9)), cache=cache)
        model(torch.randint(0, 50, (2, 1)), cache=cache)
    stored = sum(k.numel() * k.element_size() + v.numel() * v.element_size()
                 for k, v in zip(cache.keys, cache.values))
    assert generation_kv_cache_bytes(cfg, 10, batch_size=2) == stored


ODD_LLAMAS = [
    LlamaConfig(vocab_size=97, d_model=36, n_layers=3, n_heads=6, n_kv_heads=2, d_ff=50, max_positions=20),
    LlamaConfig(vocab_size=61, d_model=20, n_layers=2, n_heads=4, n_kv_heads=1, d_head=8, d_ff=30, max_positions=20,
                qkv_bias=True, tie_embeddings=True),  # Qwen2-like: q/k/v biases, H Dh = 32 on D = 20
    LlamaConfig(vocab_size=53, d_model=24, n_layers=2, n_heads=3, d_head=10, d_ff=40, max_positions=20,
                qk_norm=True),  # Qwen3-like: q/k norms, multi-head
]


@pytest.mark.parametrize("cfg", ODD_LLAMAS)
def test_llama_parameters_match_meta_module(cfg):
    with torch.device("meta"):
        model = Llama(cfg)
    assert parameter_count(cfg) == n_params(model)


@pytest.mark.parametrize("cfg", ODD_LLAMAS)
@pytest.mark.parametrize("t", [1, 9])
def test_llama_flops_match_counter(cfg, t):
    model = Llama(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, t))
    assert counted_flops(lambda: model(ids)) == forward_flops(cfg, t)


def test_gpt_with_grouped_query_attention_flops_and_cache_bytes():
    cfg = GPTConfig(vocab_size=50, max_positions=16, d_model=24, n_layers=2, n_heads=6, n_kv_heads=2)
    model = GPT(cfg).eval()
    ids = torch.randint(0, 50, (2, 7))
    assert counted_flops(lambda: model(ids)) == 2 * forward_flops(cfg, 7)
    cache = model.new_cache()
    with torch.no_grad():
        model(ids, cache=cache)
    assert generation_kv_cache_bytes(cfg, 7, batch_size=2) == cache.nbytes()
    assert generation_kv_cache_bytes(cfg, 7) * 3 == generation_kv_cache_bytes(dataclasses.replace(cfg, n_kv_heads=None), 7)


@pytest.mark.parametrize("cfg", ODD_LLAMAS)
def test_llama_kv_cache_bytes_match_a_filled_cache(cfg):
    model = Llama(cfg).eval()
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(0, cfg.vocab_size, (2, 9)), cache=cache)
        model(torch.randint(0, cfg.vocab_size, (2, 1)), cache=cache)
    assert generation_kv_cache_bytes(cfg, 10, batch_size=2) == cache.nbytes()
    assert generation_kv_cache_bytes(cfg, 10) == 2 * cfg.n_layers * cfg.n_kv_heads * cfg.d_head * 10 * 4


def test_encoder_decoder_kv_cache_bytes_match_a_filled_cache():
    cfg = TransformerConfig(vocab_size=50, d_model=24, n_heads=4, d_ff=32, n_encoder_layers=1, n_decoder_layers=2,
                            max_positions=32, dropout=0.0)
    model = Transformer(cfg).eval()
    src = torch.randint(1, 50, (1, 13))
    memory = model.encode(src)
    cache = model.new_cache()
    with torch.no_grad():
        model.decode(torch.randint(1, 50, (1, 4)), memory, src != 0, cache=cache)
    assert generation_kv_cache_bytes(cfg, 4, src_len=13) == cache.nbytes()


def test_attention_scores_are_the_quadratic_part_of_the_memory():
    """Peak memory of materialised attention grows by exactly the score matrices' bytes (math backend)."""
    def peak(t):
        q = torch.randn(1, 4, t, 8)
        with sdpa_kernel(SDPBackend.MATH):
            return peak_tensor_bytes(torch.nn.functional.scaled_dot_product_attention, q, q, q)[1]
    grow = peak(64) - peak(32)
    quadratic = attention_score_bytes(4, 64) - attention_score_bytes(4, 32)
    assert quadratic <= grow <= 3 * quadratic + 4 * 8 * 32 * 4 * 4


def test_t5_sizes_from_any_object_with_t5_field_names():
    class Cfg:
        vocab_size, d_model, d_kv, num_heads, d_ff, num_layers, num_decoder_layers = 10, 8, 2, 3, 16, 1, 2
        relative_attention_num_buckets = 4
    sizes = t5_sizes_from_hf(Cfg())
    assert sizes == T5Sizes(10, 8, 2, 3, 16, 1, 2, 4, gated=False, tie_embeddings=True)


def test_t5_sizes_from_a_config_with_the_course_names():
    """The course's encoder-decoder configured as T5 (branch t5) has these fields; HF's T5 is the reference."""
    from types import SimpleNamespace

    ours = SimpleNamespace(vocab_size=97, d_model=24, n_heads=3, d_head=5, d_ff=40, n_encoder_layers=2,
                           n_decoder_layers=3, n_buckets=7, gated=True, tie_embeddings=False, bias=False,
                           positions="relative")
    hf = hf_t5_config(vocab_size=97, d_model=24, d_kv=5, num_heads=3, d_ff=40, num_layers=2, num_decoder_layers=3,
                      relative_attention_num_buckets=7, feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    with torch.device("meta"):
        model = transformers.T5ForConditionalGeneration(hf)
    assert parameter_count(t5_sizes_from_hf(ours)) == t5_params(model)
    with pytest.raises(ValueError, match="not a T5"):
        t5_sizes_from_hf(SimpleNamespace(**{**vars(ours), "positions": "learned"}))


def test_inputs_are_checked():
    gpt = GPTConfig(vocab_size=10, max_positions=8, d_model=8, n_layers=1, n_heads=2)
    with pytest.raises(TypeError, match="cfg must be one of"):
        parameter_count({"d_model": 8})
    with pytest.raises(ValueError, match="seq_len"):
        forward_flops(gpt, 0)
    with pytest.raises(ValueError, match="src_len"):
        forward_flops(TransformerConfig(vocab_size=10), 5)
    with pytest.raises(ValueError, match="only for encoder-decoders"):
        forward_flops(gpt, 5, src_len=3)
    with pytest.raises(TypeError, match="no KV cache"):
        generation_kv_cache_bytes(BERT_BASE, 5)
    with pytest.raises(ValueError, match="n_heads"):
        attention_score_bytes(0, 5)
    with pytest.raises(ValueError, match="d_model"):
        T5Sizes(d_model=0)
    with pytest.raises(TypeError, match="T5Config-like"):
        t5_sizes_from_hf(object())
    with pytest.raises(TypeError, match="cfg must be one of"):
        parameter_count(MoEConfig(n_experts=4))  # a mixture is counted by companion.moe.moe_parameter_counts


# --------------------------------------------------------------------------- Chapter 12's measurements

from companion.experiments.scaling import (  # noqa: E402
    ScalingConfig,
    family_models,
    fit_exponent,
    load_scaling_results,
    measure_scaling,
    training_vs_generation,
)


def test_fit_exponent_recovers_a_power_law():
    lengths = [16, 32, 64, 128]
    assert fit_exponent(lengths, [3 * t**1.5 for t in lengths]) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="positive"):
        fit_exponent([1, 2], [0, 1])
    with pytest.raises(ValueError, match="two or more"):
        fit_exponent([1], [1])


def test_measured_memory_grows_by_the_score_matrices():
    cfg = ScalingConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32, vocab_size=40, max_positions=256)
    r = measure_scaling([64, 128, 256], cfg=cfg, timing=False)
    assert set(r) == {"encoder", "decoder", "encoder-decoder"}
    for name, rows in r.items():
        assert rows["seconds"] == [None] * 3
        # each doubling adds at least one layer's (B, H, T, T) float32 scores: quadratic growth
        grow = rows["peak_bytes"][-1] - rows["peak_bytes"][-2]
        t = 256 if name != "encoder-decoder" else 128
        assert grow >= attention_score_bytes(cfg.n_heads, t) - attention_score_bytes(cfg.n_heads, t // 2), name
    assert r["decoder"]["flops"][0] == forward_flops(cfg.configs()["decoder"], 64)
    with pytest.raises(ValueError, match="max_positions"):
        measure_scaling([512], cfg=cfg, timing=False)


def test_generation_does_the_work_of_one_pass_in_many_calls():
    model = family_models(ScalingConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32, vocab_size=40,
                                        max_positions=64))["decoder"]
    r = training_vs_generation(model, 20, timing=False)
    assert r["training"]["forward_calls"] == 1 and r["generation_cache"]["forward_calls"] == 19
    # cached steps attend to 1..T keys instead of T: a little less than one full pass; without the cache, far more
    assert 0.5 * r["training"]["flops"] < r["generation_cache"]["flops"] < r["training"]["flops"]
    assert r["generation_no_cache"]["flops"] > 5 * r["generation_cache"]["flops"]


def test_recorded_run_uses_course_names_and_the_three_families():
    rec = load_scaling_results()
    assert set(rec["scaling"]) == {"encoder", "decoder", "encoder-decoder"}
    assert set(rec["config"]) == {f.name for f in dataclasses.fields(ScalingConfig)}
    assert rec["threads"] == 1
