"""The package's shape: every model is built from the shared attention and block, nothing is copied."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from companion.attention import MultiHeadAttention
from companion.blocks import Block

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
              and re.search(r"def _residual\(", src)]
    assert blocks == ["blocks.py"]  # one residual wiring


def test_every_model_is_made_of_blocks_and_multi_head_attention():
    from companion.diagnostics import StackConfig, StackLM
    from companion.models.gpt import GPT, GPTConfig
    from companion.models.bert import BertConfig, BertForPreTraining
    from companion.models.position_lm import PositionLM, PositionLMConfig
    from companion.models.transformer import Transformer, TransformerConfig

    models = [
        GPT(GPTConfig(vocab_size=11, max_positions=8, d_model=8, n_layers=2, n_heads=2)),
        Transformer(TransformerConfig(vocab_size=11, d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1,
                                      n_decoder_layers=1, max_positions=8)),
        *(PositionLM(PositionLMConfig(vocab_size=11, position=p, d_model=8, n_heads=2, d_ff=16))
          for p in ("none", "t5", "rope", "alibi")),
        BertForPreTraining(BertConfig(vocab_size=11, d_model=8, n_layers=2, n_heads=2, d_ff=16, max_positions=8)),
        StackLM(StackConfig(vocab_size=11, max_positions=8, n_layers=2, d_model=8, n_heads=2, d_ff=16)),
    ]
    for model in models:
        blocks = [m for m in model.modules() if isinstance(m, Block)]
        attns = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
        assert blocks and len(attns) == sum(1 + b.cross for b in blocks), type(model).__name__
        # and nothing else in the model holds attention projections of its own
        others = [n for n, m in model.named_modules() if re.search(r"(attn|attention)$", n)
                  and not isinstance(m, MultiHeadAttention)]
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
    import companion.models.position_lm

    assert not (PACKAGE / "mask_viz.py").exists()  # now companion.viz.masks
    for module, names in [
        (companion.models.position_lm, ["ExperimentConfig", "make_data", "train_position_lm", "evaluate_lengths",
                                        "load_extrapolation_results", "load_position_lm"]),  # companion.experiments
        (companion.generation, ["plot_next_token_distribution", "next_token_explorer"]),  # companion.viz
        (companion.diagnostics, ["plot_grad_profiles", "grad_profile_explorer"]),  # companion.viz
    ]:
        for name in names:
            assert not hasattr(module, name), f"{module.__name__}.{name} should only be importable from its new home"
    viz = importlib.import_module("companion.viz")
    assert all(hasattr(viz, n) for n in ["plot_next_token_distribution", "plot_grad_profiles", "plot_masks"])


def test_configs_use_the_course_names_only():
    """CONTRIBUTING, "Names": no retired field or alias on the model configs."""
    import dataclasses

    from companion.diagnostics import StackConfig
    from companion.models.gpt import GPTConfig
    from companion.models.transformer import TransformerConfig

    retired = {"block_size", "layer_norm_eps", "max_len", "n_positions", "layer_norm_epsilon", "n_embd", "n_head"}
    for config in (GPTConfig, TransformerConfig, StackConfig):
        fields = {f.name for f in dataclasses.fields(config)}
        assert "max_positions" in fields
        assert not retired & (fields | set(vars(config))), config.__name__


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
