"""GPT (Chapter 9) against Hugging Face GPT-2 / GPT-1 built from tiny random configs (no download)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, OpenAIGPTConfig, OpenAIGPTLMHeadModel

from companion.kv_cache import KVCache
from companion.models.gpt import (
    GPT, GPT1, GPT2_LARGE, GPT2_MEDIUM, GPT2_SMALL, GPT2_XL, GPT3_175B, GPTConfig,
    from_hf_gpt2, from_hf_openai_gpt, from_pretrained_gpt2, gpt_param_formula,
)
from companion.generation import generate
from companion.calculators import count_parameters


def _hf_gpt2(seed: int = 0, **kw) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=99, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=0,
                     bos_token_id=None, eos_token_id=None, **kw)
    model = GPT2LMHeadModel(cfg).eval()
    # Random init leaves biases and LayerNorms at 0/1: perturb every tensor so a transposed
    # or swapped weight cannot hide.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _hf_gpt1(seed: int = 0) -> OpenAIGPTLMHeadModel:
    torch.manual_seed(seed)
    cfg = OpenAIGPTConfig(vocab_size=99, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = OpenAIGPTLMHeadModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _greedy(model: GPT, idx: torch.Tensor, n_new: int, use_cache: bool) -> torch.Tensor:
    cache = KVCache(model.cfg.n_layers) if use_cache else None
    out, step_in = idx, idx
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(step_in if use_cache else out, cache=cache)
            nxt = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
            out = torch.cat([out, nxt], dim=1)
            step_in = nxt
    return out


def test_logits_match_hf_gpt2():
    hf = _hf_gpt2()
    ours = from_hf_gpt2(hf)
    idx = torch.randint(0, 99, (3, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), hf(idx).logits, rtol=1e-5, atol=1e-5)


def test_untied_head_and_custom_inner_size_match_hf():
    hf = _hf_gpt2(seed=3, n_inner=40, tie_word_embeddings=False)
    ours = from_hf_gpt2(hf)
    assert ours.cfg.d_ff == 40 and not ours.cfg.tie_embeddings
    idx = torch.randint(0, 99, (2, 13), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), hf(idx).logits, rtol=1e-5, atol=1e-5)


def test_logits_match_hf_gpt1_post_ln():
    hf = _hf_gpt1()
    ours = from_hf_openai_gpt(hf)
    assert not ours.cfg.norm_first and not ours.cfg.final_norm
    idx = torch.randint(0, 99, (2, 7), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), hf(idx).logits, rtol=1e-5, atol=1e-5)


def test_greedy_continuation_equals_hf_generate():
    hf = _hf_gpt2()
    ours = from_hf_gpt2(hf)
    idx = torch.randint(1, 99, (2, 5), generator=torch.Generator().manual_seed(5))
    expected = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=10,
                           do_sample=False, pad_token_id=0)
    assert torch.equal(_greedy(ours, idx, 10, use_cache=True), expected)
    assert torch.equal(_greedy(ours, idx, 10, use_cache=False), expected)


def test_cached_logits_equal_full_recomputation():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=53, max_positions=24, d_model=24, n_layers=3, n_heads=3)).eval()
    idx = torch.randint(0, 53, (2, 13))
    with torch.no_grad():
        full = model(idx)  # (B, 13, V)
        cache = KVCache(3)
        chunks = [model(idx[:, :7], cache=cache)]  # a 7-token prompt, then 1, then 5 tokens
        chunks.append(model(idx[:, 7:8], cache=cache))
        chunks.append(model(idx[:, 8:], cache=cache))
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, rtol=1e-5, atol=1e-5)
    assert cache.length == 13


def test_post_ln_cached_equals_full():
    torch.manual_seed(1)
    cfg = dataclasses.replace(GPT1, vocab_size=31, max_positions=16, d_model=16, n_layers=2, n_heads=2)
    model = GPT(cfg).eval()
    idx = torch.randint(0, 31, (1, 9))
    with torch.no_grad():
        cache = KVCache(2)
        steps = [model(idx[:, i:i + 1], cache=cache) for i in range(9)]
        torch.testing.assert_close(torch.cat(steps, 1), model(idx), rtol=1e-5, atol=1e-5)


def test_causality_future_tokens_do_not_change_past_logits():
    torch.manual_seed(2)
    model = GPT(GPTConfig(vocab_size=17, max_positions=16, d_model=16, n_layers=2, n_heads=4)).eval()
    a = torch.randint(0, 17, (1, 11))
    b = a.clone()
    b[0, 6:] = (b[0, 6:] + 1) % 17
    with torch.no_grad():
        torch.testing.assert_close(model(a)[:, :6], model(b)[:, :6])


def test_errors():
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(vocab_size=10, max_positions=8, d_model=10, n_layers=1, n_heads=3)
    with pytest.raises(ValueError, match="activation"):
        GPTConfig(vocab_size=10, max_positions=8, d_model=8, n_layers=1, n_heads=2, activation="swish")
    model = GPT(GPTConfig(vocab_size=10, max_positions=8, d_model=8, n_layers=1, n_heads=2))
    with pytest.raises(ValueError, match="max_positions"):
        model(torch.zeros(1, 9, dtype=torch.long))
    cache = KVCache(1)
    model(torch.zeros(1, 6, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="max_positions"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    with pytest.raises(TypeError, match=r"idx must hold integer token ids \(int64 or int32\)"):
        model(torch.zeros(1, 3))
    # ids outside the vocabulary are named at the door, not left to torch's "index out of range in self"
    with pytest.raises(ValueError, match=r"idx must lie in \[0, 10\), got range \[0, 60\]"):
        model(torch.tensor([[0, 60]]))
    with pytest.raises(ValueError, match=r"idx must lie in \[0, 10\), got range \[-1, 2\]"):
        model(torch.tensor([[-1, 2]]))
    with pytest.raises(ValueError, match="at least one token"):
        model(torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="layers"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=KVCache(2))


def test_tied_embeddings_share_storage():
    model = GPT(GPTConfig(vocab_size=10, max_positions=8, d_model=8, n_layers=1, n_heads=2))
    assert model.lm_head.weight is model.tok_emb.weight


@pytest.mark.parametrize("cfg", [GPT1, GPT2_SMALL, GPT2_MEDIUM, GPT2_LARGE, GPT2_XL, GPT3_175B])
def test_param_formula_matches_module_count(cfg):
    with torch.device("meta"):
        model = GPT(cfg)
    assert count_parameters(model) == gpt_param_formula(cfg)


def test_param_counts_match_hf_and_published():
    # HF's own module for a GPT-2 small config (meta device, no memory) has exactly our count.
    with torch.device("meta"):
        hf = GPT2LMHeadModel(GPT2Config())
        ours = GPT(GPT2_SMALL)
    hf_count = sum(p.numel() for p in hf.parameters())
    assert count_parameters(ours) == hf_count == 124_439_808
    # Released checkpoints: 124M, 355M, 774M, 1558M (rounded).
    for cfg, millions in ((GPT2_MEDIUM, 355), (GPT2_LARGE, 774), (GPT2_XL, 1558)):
        assert round(gpt_param_formula(cfg) / 1e6) == millions
    assert round(gpt_param_formula(GPT3_175B) / 1e9) == 175


def test_shipped_checkpoint_loads_and_meets_the_chapter_goal():
    from companion.checkpoints import checkpoint_names, load_checkpoint
    from companion.data import CharTokenizer, load_pydoc_text, train_val_split
    from companion.models.gpt import evaluate_lm

    assert "ch09_tiny_gpt" in checkpoint_names()
    ckpt = load_checkpoint("ch09_tiny_gpt")
    cfg = GPTConfig(**ckpt["config"])
    model = GPT(cfg)
    model.load_state_dict(ckpt["state_dict"])
    text = load_pydoc_text()
    tok = CharTokenizer(text)
    assert tok.chars == ckpt["chars"]
    _, val_ids = train_val_split(tok.encode(text), ckpt["val_fraction"])
    loss = evaluate_lm(model, val_ids, cfg.max_positions)
    assert loss <= 1.40  # the chapter's goal, in nats per character
    assert abs(loss - ckpt["val_loss"]) < 1e-3  # the figure the training script recorded
    with pytest.raises(FileNotFoundError, match="shipped"):
        load_checkpoint("no_such_checkpoint")


def test_shipped_configs_use_the_course_names():
    """Configs stored in checkpoints build today's configs (CONTRIBUTING, "Names"): no retired keys."""
    from companion.checkpoints import load_checkpoint
    from companion.models.small_lm import SmallLMConfig

    retired = {"block_size", "layer_norm_eps", "max_len", "n_positions", "layer_norm_epsilon"}
    gpt = load_checkpoint("ch09_tiny_gpt")["config"]
    assert not retired & set(gpt)
    assert GPTConfig(**gpt).max_positions == 128  # scripts/ch09_train_gpt.py trains on 128-character windows
    settings = load_checkpoint("ch05_warmup")["settings"]
    assert not retired & set(settings)
    assert SmallLMConfig(vocab_size=11, n_layers=2, **settings).max_positions == 64


def test_every_shipped_checkpoint_uses_the_course_names():
    """Every stored config builds today's config, and no state-dict key holds a retired attribute name."""
    from companion.checkpoints import checkpoint_names, load_checkpoint
    from companion.models.bert import BertConfig
    from companion.models.encoder_decoder import EncoderDecoderConfig
    from companion.moe import MoEConfig

    retired_fields = {"num_buckets", "head_size", "n_experts_per_token", "block_size", "n_positions", "n_embd"}
    retired_parts = {"wte", "wpe", "ln_f", "embed", "tok", "token", "position", "segment", "pos", "head", "norm",
                     "token_embedding", "encoder_positions", "decoder_positions", "attn"}
    builds = {"ch07_tiny_bert": BertConfig, "ch09_tiny_gpt": GPTConfig, "ch11_text_to_text": EncoderDecoderConfig,
              "ch14_moe_gpt": GPTConfig}
    for name in checkpoint_names():
        ckpt = load_checkpoint(name)
        if name in builds:
            assert not retired_fields & set(ckpt["config"]), name
            builds[name](**ckpt["config"])
        if name == "ch14_moe_gpt":
            MoEConfig(**ckpt["moe"])
        states = [ckpt["state_dict"]] if "state_dict" in ckpt else [v for v in ckpt.values() if isinstance(v, dict)
                                                                   and all(torch.is_tensor(t) for t in v.values())]
        for state in states:
            for key in state:
                if key.startswith(("bert.", "mlm.")):  # BERT's embedding and MLM-head LayerNorms are "norm"
                    assert key.split(".")[1] not in retired_parts - {"norm"}, (name, key)
                else:
                    assert key.split(".")[0] not in retired_parts, (name, key)
                assert ".embeddings.token." not in key and ".attn." not in key, (name, key)


# ---------------------------------------------------------------- the loader helper

@pytest.mark.parametrize("safe", [True, False])
def test_gpt2_loads_from_a_saved_folder(tmp_path, safe):
    hf = _hf_gpt2(seed=3, n_inner=40)
    hf.save_pretrained(tmp_path, safe_serialization=safe)
    if not safe:  # transformers 5 may always write safetensors: make the .bin case real
        from safetensors.torch import load_file
        for f in tmp_path.glob("*.safetensors"):
            torch.save(load_file(str(f)), tmp_path / "pytorch_model.bin")
            f.unlink()
    ours = from_hf_gpt2(tmp_path)
    assert ours.cfg.d_ff == 40
    idx = torch.randint(0, 99, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), hf(idx).logits, rtol=1e-5, atol=1e-5)


def test_copy_by_name_map_reports_missing_unexpected_and_mismatched_by_name():
    from companion.models._hf import copy_by_name_map

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    names = {"0.weight": "a.w", "0.bias": "a.b", "1.weight": "b.w", "1.bias": "b.b"}
    sd = {"a.w": torch.randn(3, 4), "a.b": torch.randn(4), "b.w": torch.randn(2, 4), "extra": torch.zeros(1)}
    with pytest.raises(ValueError) as err:
        copy_by_name_map(model, sd, names)
    msg = str(err.value)
    assert "1.bias <- b.b" in msg and "unexpected (1): extra" in msg and "0.weight (4, 3) <- a.w (3, 4)" in msg
    report = copy_by_name_map(model, sd, names, transpose=["0.weight"], ignore=[r"^extra$"], strict=False)
    assert report.missing == ["1.bias <- b.b"] and report.unexpected == [] and report.mismatched == []
    assert torch.equal(model[0].weight, sd["a.w"].t())
    with pytest.raises(ValueError, match="does not have: nope"):
        copy_by_name_map(model, sd, {"nope": "a.w"})


# ---------------------------------------------------------------- released GPT-2 checkpoints, offline

def test_from_pretrained_gpt2_reads_a_saved_folder_and_decodes_like_hf(tmp_path):
    _hf_gpt2(seed=5).save_pretrained(tmp_path)
    hf = GPT2LMHeadModel.from_pretrained(tmp_path).eval()  # what the loader reads, read by HF itself
    ours = from_pretrained_gpt2(tmp_path)
    idx = torch.randint(0, 99, (2, 11), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), hf(idx).logits, rtol=1e-5, atol=1e-5)
    prompt = idx[:, :4]
    hf_tokens = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12,
                            do_sample=False, pad_token_id=0)
    assert hf_tokens.shape == (2, 16)
    assert torch.equal(generate(ours, prompt, 12), hf_tokens)
    assert torch.equal(generate(ours, prompt, 12, use_cache=False), hf_tokens)


def test_from_pretrained_gpt2_rejects_what_is_not_a_gpt2_checkpoint(tmp_path):
    from transformers import BertConfig, BertModel

    with pytest.raises(ValueError, match="no config.json"):
        from_pretrained_gpt2(tmp_path)
    (tmp_path / "weights.txt").write_text("not a model")
    with pytest.raises(ValueError, match="no config.json"):
        from_pretrained_gpt2(tmp_path / "weights.txt")
    bert = tmp_path / "bert"
    BertModel(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                         intermediate_size=37)).save_pretrained(bert)
    with pytest.raises(ValueError, match="model_type='bert', expected 'gpt2'"):
        from_pretrained_gpt2(bert)
