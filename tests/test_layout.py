"""The package's shape: every model is built from the shared attention and block, nothing is copied."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from companion.attention import CrossAttention, MultiHeadAttention
from companion.blocks import Block, DecoderBlock

PACKAGE = Path(__file__).resolve().parents[1] / "companion"


def _sources():
    return {p.relative_to(PACKAGE).as_posix(): p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")}


def test_only_the_attention_module_calls_the_attention_kernel_or_defines_lm_loss():
    kernel = [name for name, src in _sources().items()
              if "F.scaled_dot_product_attention(" in src or "functional.scaled_dot_product_attention(" in src]
    assert kernel == ["attention.py"]
    losses = [name for name, src in _sources().items() if re.search(r"^def lm_loss\(", src, re.M)]
    assert losses == ["training.py"]
    blocks = [name for name, src in _sources().items() if re.search(r"^class \w+\((nn\.Module|Block)\)", src, re.M)
              and re.search(r"def sublayer\(", src)]
    assert blocks == ["blocks.py"]  # one residual wiring


def test_every_model_is_made_of_blocks_and_multi_head_attention():
    from companion.models.gpt import GPT, GPTConfig
    from companion.models.bert import BertConfig, BertForPreTraining
    from companion.models.llama import Llama, LlamaConfig
    from companion.models.small_lm import SmallLM, SmallLMConfig
    from companion.models.transformer import Transformer, TransformerConfig

    models = [
        GPT(GPTConfig(vocab_size=11, max_positions=8, d_model=8, n_layers=2, n_heads=2)),
        Transformer(TransformerConfig(vocab_size=11, d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1,
                                      n_decoder_layers=1, max_positions=8)),
        *(SmallLM(SmallLMConfig(vocab_size=11, position=p, n_layers=2, d_model=8, n_heads=2, d_ff=16))
          for p in ("none", "t5", "rope", "alibi")),
        BertForPreTraining(BertConfig(vocab_size=11, d_model=8, n_layers=2, n_heads=2, d_ff=16, max_positions=8)),
        SmallLM(SmallLMConfig(vocab_size=11, max_positions=8, n_layers=2, d_model=8, n_heads=2, d_ff=16)),
        Llama(LlamaConfig(vocab_size=11, d_model=8, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=16, max_positions=8,
                          qk_norm=True)),
    ]
    for model in models:
        blocks = [m for m in model.modules() if isinstance(m, Block)]
        attns = [m for m in model.modules() if isinstance(m, (MultiHeadAttention, CrossAttention))]
        assert blocks and len(attns) == sum(1 + isinstance(b, DecoderBlock) for b in blocks), type(model).__name__
        # and nothing else in the model holds attention projections of its own
        others = [n for n, m in model.named_modules() if re.search(r"(attn|attention)$", n)
                  and not isinstance(m, (MultiHeadAttention, CrossAttention))]
        assert not others, (type(model).__name__, others)
    assert torch.is_tensor(models[0](torch.zeros(1, 3, dtype=torch.long)))


def test_encoder_decoders_share_one_interface():
    """Chapter 4's Transformer and Chapter 11's T5/BART inherit encode, decode, forward, the cache and decoder_lm."""
    from companion.models.encoder_decoder import EncoderDecoder
    from companion.models.seq2seq import Seq2SeqModel
    from companion.models.transformer import Transformer

    shared = ("encode", "decode_hidden", "forward", "decode", "decoder_lm", "new_cache", "max_positions")
    for cls in (Transformer, EncoderDecoder):
        assert issubclass(cls, Seq2SeqModel), cls.__name__
        redefined = [name for name in shared if name in vars(cls)]
        assert not redefined, (cls.__name__, redefined)
        assert all(name in vars(cls) for name in ("_embed", "head")), cls.__name__
    for method in ("encode", "decode_hidden", "decoder_lm", "_check_ids"):
        defining = [name for name, src in _sources().items()
                    if name.startswith("models/") and re.search(rf"^    def {method}\(", src, re.M)]
        assert defining == ([] if method == "_check_ids" else ["models/seq2seq.py"]), method


def test_encoder_decoders_check_token_ids_alike():
    """One check of token ids serves both encoder-decoders; each adds only its own length rule."""
    import pytest

    from companion.models.encoder_decoder import EncoderDecoder
    from companion.models.t5 import t5_config
    from companion.models.transformer import Transformer, TransformerConfig

    models = [Transformer(TransformerConfig(vocab_size=11, d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1,
                                            n_decoder_layers=1, max_positions=8)),
              EncoderDecoder(t5_config(11, d_model=8, d_kv=4, d_ff=16, n_layers=1, n_heads=2, max_positions=8))]
    good = torch.tensor([[1, 2, 3]])
    for model in models:
        name = type(model).__name__
        assert model(good, good).shape == (1, 3, 11), name
        assert model(good.int(), good.int()).shape == (1, 3, 11), name  # int32 ids, as nn.Embedding takes
        for dtype in (torch.float32, torch.bool, torch.int16, torch.uint8):  # nn.Embedding refuses them all
            with pytest.raises(TypeError, match=r"src must hold integer token ids \(int64 or int32\)"):
                model(good.to(dtype), good)
        with pytest.raises(ValueError, match=r"tgt_in must lie in \[0, 11\), got range \[1, 11\]"):
            model(good, torch.tensor([[1, 11]]))
        with pytest.raises(ValueError, match=r"src must lie in \[0, 11\), got range \[-1, 2\]"):
            model(torch.tensor([[-1, 2]]), good)


def test_moved_names_have_no_old_import_paths():
    """Issue 8: names live in one place; the re-exports kept for old notebooks are gone."""
    import importlib

    import companion.diagnostics
    import companion.generation
    import companion.models.small_lm

    assert not (PACKAGE / "mask_viz.py").exists()  # now companion.viz.masks
    for module, names in [
        (companion.models.small_lm, ["ExperimentConfig", "make_data", "train_position_lm", "evaluate_lengths",
                                     "load_extrapolation_results", "load_position_lm"]),  # companion.experiments
        (companion.generation, ["plot_next_token_distribution", "next_token_explorer"]),  # companion.viz
        (companion.diagnostics, ["plot_grad_profiles", "grad_profile_explorer",  # companion.viz
                                 "StackConfig", "StackLM"]),  # companion.models.small_lm
    ]:
        for name in names:
            assert not hasattr(module, name), f"{module.__name__}.{name} should only be importable from its new home"
    viz = importlib.import_module("companion.viz")
    assert all(hasattr(viz, n) for n in ["plot_next_token_distribution", "plot_grad_profiles", "plot_masks"])


def _config_classes() -> dict[str, type]:
    """Every dataclass defined in companion (outside the grader) whose name ends in Config, Sizes or Recipe."""
    import dataclasses
    import importlib
    import inspect

    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        if "grading" in rel.parts:
            continue
        module = importlib.import_module(".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts))
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__
                    and name.endswith(("Config", "Sizes", "Recipe"))):
                found[name] = obj
    return found


# CONTRIBUTING, "Names": the "not" column, and the names this issue retired.
RETIRED = {
    "block_size", "max_len", "n_positions", "n_vocab", "hidden_size", "n_embd", "dim", "num_heads", "n_head",
    "num_key_value_heads", "head_dim", "head_size", "n_inner", "intermediate_size", "n_layer", "num_layers",
    "layer_norm_eps", "layer_norm_epsilon", "pre_norm", "pdrop", "p_drop", "attn_mask", "past_key_values",
    "num_buckets", "t5_num_buckets", "t5_max_distance", "position_buckets",
}


def test_configs_use_the_course_names_only():
    """CONTRIBUTING, "Names": no retired field or alias on any config of the package."""
    import dataclasses

    configs = _config_classes()
    # the scan finds the models' configs (so that it cannot pass by finding nothing)
    assert {"GPTConfig", "SmallLMConfig", "TransformerConfig", "EncoderDecoderConfig", "BertConfig",
            "DebertaConfig", "MoEConfig", "T5Sizes", "TextToTextRecipe"} <= set(configs), sorted(configs)
    for name, config in configs.items():
        fields = {f.name for f in dataclasses.fields(config)}
        assert not RETIRED & (fields | set(vars(config))), (name, sorted(RETIRED & (fields | set(vars(config)))))
        if "vocab_size" in fields and "d_model" in fields and name != "T5Sizes":  # a model: its length limit
            assert "max_positions" in fields, name
    # one name for T5's bucket count and distance limit, in every config that has them
    for name in ("EncoderDecoderConfig", "SmallLMConfig", "T5Sizes", "TextToTextRecipe"):
        assert "n_buckets" in {f.name for f in dataclasses.fields(configs[name])}, name


def test_models_name_their_tables_alike():
    """One attribute name for the token table, the position table, the final norm and the LM head."""
    from companion.models.bert import BertConfig, BertModel
    from companion.models.deberta import DebertaConfig, DebertaModel
    from companion.models.encoder_decoder import EncoderDecoder
    from companion.models.gpt import GPT, GPTConfig
    from companion.models.small_lm import SmallLM, SmallLMConfig
    from companion.models.t5 import t5_config
    from companion.models.transformer import Transformer, TransformerConfig

    causal = [GPT(GPTConfig(vocab_size=11, max_positions=8, d_model=8, n_layers=1, n_heads=2)),
              SmallLM(SmallLMConfig(vocab_size=11, max_positions=8, n_layers=1, d_model=8, n_heads=2, d_ff=16))]
    for model in causal:
        assert {"tok_emb", "pos_emb", "blocks", "norm_f", "lm_head"} <= dict(model.named_children()).keys(), \
            type(model).__name__
    from companion.models.llama import Llama, LlamaConfig

    llama = Llama(LlamaConfig(vocab_size=11, d_model=8, n_layers=1, n_heads=2, d_ff=16, max_positions=8))
    assert dict(llama.named_children()).keys() == {"tok_emb", "blocks", "norm_f", "lm_head"}  # RoPE: no position table
    causal.append(llama)
    seq2seq = [Transformer(TransformerConfig(vocab_size=11, d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1,
                                             n_decoder_layers=1, max_positions=8)),
               EncoderDecoder(t5_config(11, d_model=8, d_kv=4, d_ff=16, n_layers=1, n_heads=2, max_positions=8))]
    encoders = [BertModel(BertConfig(vocab_size=11, d_model=8, n_layers=1, n_heads=2, d_ff=16, max_positions=8)).embeddings,
                DebertaModel(DebertaConfig(vocab_size=11, d_model=8, n_layers=1, n_heads=2, d_ff=16, max_positions=16,
                                           n_position_buckets=4, absolute_positions=True))]
    for model in seq2seq + encoders:
        assert isinstance(model.tok_emb, torch.nn.Embedding), type(model).__name__
    for model in causal[:1] + encoders:
        assert isinstance(model.pos_emb, torch.nn.Embedding), type(model).__name__
    retired = {"wte", "wpe", "ln_f", "embed", "tok", "token", "position", "segment", "pos", "head", "norm",
               "token_embedding", "encoder_positions", "decoder_positions"}
    for model in causal + seq2seq + encoders:
        kept = {"norm"} if any(model is e for e in encoders) else set()  # an encoder's embedding LayerNorm
        assert not (retired - kept) & dict(model.named_children()).keys(), type(model).__name__


def test_package_docstrings_name_every_module():
    """The maps in companion/__init__.py and models/__init__.py list what the packages hold, and nothing else."""
    import companion
    import companion.models

    def listed(doc: str, prefix: str) -> set[str]:
        return {m for m in re.findall(rf":mod:`{re.escape(prefix)}\.(\w+)`", doc) if not m.startswith("_")}

    public = {p.stem for p in PACKAGE.glob("*.py") if not p.name.startswith("_")}
    public |= {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert listed(companion.__doc__, "companion") == public
    models = {p.stem for p in (PACKAGE / "models").glob("*.py") if not p.name.startswith("_")}
    assert listed(companion.models.__doc__, "companion.models") == models


def test_small_causal_lms_check_token_ids_alike():
    """GPT, SmallLM and Llama share one check of token ids (companion._checks.check_token_ids)."""
    import pytest

    from companion.models.gpt import GPT, GPTConfig
    from companion.models.llama import Llama, LlamaConfig
    from companion.models.small_lm import SmallLM, SmallLMConfig

    models = [GPT(GPTConfig(vocab_size=10, max_positions=8, d_model=8, n_layers=1, n_heads=2)),
              SmallLM(SmallLMConfig(vocab_size=10, max_positions=8, n_layers=1, d_model=8, n_heads=2, d_ff=16)),
              Llama(LlamaConfig(vocab_size=10, d_model=8, n_layers=1, n_heads=2, d_ff=16, max_positions=8))]
    for model in models:
        name = type(model).__name__
        assert model(torch.tensor([[1, 2, 3]]).int()).shape == (1, 3, 10), name
        with pytest.raises(TypeError, match=r"idx must hold integer token ids \(int64 or int32\)"):
            model(torch.ones(1, 3))
        with pytest.raises(ValueError, match=r"idx must lie in \[0, 10\), got range \[1, 60\]"):
            model(torch.tensor([[1, 60]]))
        with pytest.raises(ValueError, match=r"idx must lie in \[0, 10\), got range \[-1, 2\]"):
            model(torch.tensor([[-1, 2]]))
