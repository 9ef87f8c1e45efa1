"""Llama, Qwen2 and Qwen3 (companion.models.llama) against Hugging Face's, built from tiny random configs (no download).

The configs have odd sizes (D = 36, vocabulary 97), grouped-query attention
(6 query heads sharing 2 key/value heads), a RoPE base other than 10,000, and for
Qwen3 a head size independent of the width (6 heads of 10 on D = 36). Every weight,
norm gains and biases included, is randomised so that a swapped or transposed
tensor cannot hide, and the weights are large enough that the logits spread over
several units: a tolerance of 1e-5 then means something.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

transformers = pytest.importorskip("transformers")

from companion.calculators import count_parameters  # noqa: E402
from companion.generation import generate  # noqa: E402
from companion.kv_cache import KVCache  # noqa: E402
from companion.models.llama import (  # noqa: E402
    Llama, Llama3RopeScaling, LlamaConfig, config_from_hf, from_hf, from_pretrained,
)

TOL = dict(atol=1e-5, rtol=1e-5)
V = 97

FAMILIES = {  # model_type -> (config class, model class) names in transformers
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}


def _classes(family: str):
    config_name, model_name = FAMILIES[family]
    config_cls, model_cls = getattr(transformers, config_name, None), getattr(transformers, model_name, None)
    if config_cls is None or model_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {model_name} (Qwen3 arrived in 4.51)")
    return config_cls, model_cls


def _hf_config(family: str, **kw):
    config_cls, _ = _classes(family)
    args = dict(vocab_size=V, hidden_size=36, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
                intermediate_size=50, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=5000.0,
                tie_word_embeddings=False, attention_dropout=0.0, pad_token_id=0, bos_token_id=None,
                eos_token_id=None)
    if family == "qwen3":
        args["head_dim"] = 10  # 6 heads of 10 on a width of 36: Dh is not D / H
    args.update(kw)
    cfg = config_cls(**args)
    cfg._attn_implementation = "eager"
    return cfg


def _hf_model(family: str, seed: int = 0, **kw):
    _, model_cls = _classes(family)
    torch.manual_seed(seed)
    model = model_cls(_hf_config(family, **kw)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # RMSNorm gains (and Qwen3's q_norm/k_norm): around 1, not 1
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):  # Qwen2's q, k, v biases start at zero
                p.normal_(0.0, 0.3)
            elif "embed_tokens" in name:
                p.normal_(0.0, 0.3)  # tied, it is the head too: logits of a few units
            else:
                p.normal_(0.0, 1.5 / p.shape[-1] ** 0.5)  # unit-scale activations: logits spread over units
    return model


def _ids(shape=(3, 11), seed=1) -> torch.Tensor:
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed))


CASES = [pytest.param(f, tie, id=f"{f}-{'tied' if tie else 'untied'}") for f in FAMILIES for tie in (False, True)]


@pytest.mark.parametrize("family, tied", CASES)
def test_logits_equal_hugging_face(family, tied):
    hf = _hf_model(family, tie_word_embeddings=tied)
    ours = from_hf(hf)
    cfg = ours.cfg
    assert (cfg.n_kv_heads, cfg.rope_base, cfg.tie_embeddings) == (2, 5000.0, tied)
    assert (cfg.qkv_bias, cfg.qk_norm, cfg.d_head) == (family == "qwen2", family == "qwen3", 10 if family == "qwen3" else 6)
    assert (ours.lm_head.weight is ours.tok_emb.weight) == tied
    idx = _ids()
    with torch.no_grad():
        want, got = hf(idx).logits, ours(idx)
    assert want.std() > 1.0  # the logits spread: an error of the size of a weight would show
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_comparison_fails_a_plausible_wrong_model(family):
    """Interleaved RoPE pairs, the default base 10,000, a missing q/k norm or q/k/v bias: each is caught."""
    from companion.positional import rope_permutation

    hf = _hf_model(family)
    idx = _ids()
    with torch.no_grad():
        want = hf(idx).logits
        ours = from_hf(hf)
        wrong = []
        other_base = Llama(dataclasses.replace(ours.cfg, rope_base=10000.0))
        other_base.load_state_dict(ours.state_dict())
        wrong.append(other_base(idx))
        # interleaved pairs (RoFormer, GPT-J) where Hugging Face rotates halves: permute q and k rows accordingly
        inter = Llama(ours.cfg)
        inter.load_state_dict(ours.state_dict())
        perm = rope_permutation(ours.cfg.d_head)
        for block in inter.blocks:
            attn = block.self_attn
            d_q, d_kv = attn.qkv_widths[:2]
            rows = torch.arange(attn.qkv.out_features)
            heads_q = rows[:d_q].view(-1, ours.cfg.d_head)[:, perm].flatten()
            heads_k = rows[d_q:d_q + d_kv].view(-1, ours.cfg.d_head)[:, perm].flatten()
            order = torch.cat([heads_q, heads_k, rows[d_q + d_kv:]])
            attn.qkv.weight.copy_(attn.qkv.weight[order])
        wrong.append(inter(idx))
        if family == "qwen3":
            no_norm = Llama(ours.cfg)
            no_norm.load_state_dict(ours.state_dict())
            for block in no_norm.blocks:
                block.self_attn.q_norm.weight.fill_(1.0)
                block.self_attn.k_norm.weight.fill_(1.0)
            wrong.append(no_norm(idx))
        if family == "qwen2":
            no_bias = Llama(ours.cfg)
            no_bias.load_state_dict(ours.state_dict())
            for block in no_bias.blocks:
                block.self_attn.qkv.bias.zero_()
            wrong.append(no_bias(idx))
    torch.testing.assert_close(ours(idx).detach(), want, **TOL)
    for logits in wrong:
        assert (logits - want).abs().max() > 1e-2


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_equals_hugging_face_generate(family):
    hf = _hf_model(family, seed=2)
    ours = from_hf(hf)
    idx = _ids((2, 5), seed=3)
    want = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=12, do_sample=False,
                       min_new_tokens=12)
    for use_cache in (True, False):
        got = generate(ours, idx, 12, use_cache=use_cache)
        assert torch.equal(got, want), (use_cache, got, want)
    assert len(set(want[0, 5:].tolist())) > 2  # a continuation that varies, not one token repeated


@pytest.mark.parametrize("family", FAMILIES)
def test_left_padded_generation_equals_hugging_face_generate(family):
    """Prompts of different lengths, left-padded into one batch: positions count real tokens only."""
    hf = _hf_model(family, seed=4)
    ours = from_hf(hf)
    idx = _ids((2, 7), seed=5)
    attention_mask = torch.ones_like(idx)
    attention_mask[0, :3] = 0  # the first prompt has 4 tokens, the second 7
    idx = idx.masked_fill(attention_mask == 0, 0)
    want = hf.generate(idx, attention_mask=attention_mask, max_new_tokens=8, do_sample=False, min_new_tokens=8)
    got = generate(ours, idx, 8, attention_mask=attention_mask)
    assert torch.equal(got, want), (got, want)
    alone = generate(ours, idx[:1, 3:], 8)  # the short prompt by itself continues the same way
    assert torch.equal(alone[0], got[0, 3:])


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_logits_equal_full_recomputation(family):
    ours = from_hf(_hf_model(family, seed=6))
    idx = _ids((2, 10), seed=7)
    with torch.no_grad():
        full = ours(idx)
        cache = KVCache(ours.cfg.n_layers)
        parts = [ours(idx[:, :4], cache=cache)]  # the prompt, then one token at a time, then two
        for i in range(4, 8):
            parts.append(ours(idx[:, i:i + 1], cache=cache))
        parts.append(ours(idx[:, 8:], cache=cache))
    assert cache.length == 10
    assert cache.keys[0].shape == (2, ours.cfg.n_kv_heads, 10, ours.cfg.d_head)  # GQA: only the Hkv heads are cached
    torch.testing.assert_close(torch.cat(parts, dim=1), full, **TOL)


def test_causality_future_tokens_do_not_change_past_logits():
    ours = from_hf(_hf_model("qwen3"))
    idx = _ids((1, 9))
    changed = idx.clone()
    changed[0, 6:] = (changed[0, 6:] + 1) % V
    with torch.no_grad():
        torch.testing.assert_close(ours(changed)[:, :6], ours(idx)[:, :6], **TOL)


@pytest.mark.parametrize("family, tied", CASES)
def test_from_pretrained_reads_a_saved_folder(tmp_path, family, tied):
    hf = _hf_model(family, seed=8, tie_word_embeddings=tied)
    hf.save_pretrained(tmp_path)
    loaded, direct = from_pretrained(tmp_path), from_hf(hf)
    assert loaded.cfg == direct.cfg
    idx = _ids()
    with torch.no_grad():
        torch.testing.assert_close(loaded(idx), direct(idx), atol=0.0, rtol=0.0)
        torch.testing.assert_close(from_hf(str(tmp_path))(idx), direct(idx), atol=0.0, rtol=0.0)


def test_from_pretrained_takes_a_hub_name_through_transformers(monkeypatch):
    """No network in the tests: transformers' two calls are replaced by the random model they would return."""
    hf = _hf_model("qwen3", seed=11, tie_word_embeddings=True)
    calls = []

    def config_from_hub(name, **kw):
        calls.append(("config", name))
        return hf.config

    def model_from_hub(name, **kw):
        calls.append(("model", name))
        return hf

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", config_from_hub)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model_from_hub)
    loaded = from_pretrained("Qwen/Qwen3-0.6B")
    assert calls == [("config", "Qwen/Qwen3-0.6B"), ("model", "Qwen/Qwen3-0.6B")]
    idx = _ids()
    with torch.no_grad():
        torch.testing.assert_close(loaded(idx), hf(idx).logits, **TOL)
    # a model of another kind is refused from its config, before its weights are downloaded
    calls.clear()
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained",
                        lambda name, **kw: calls.append(("config", name)) or transformers.GPT2Config())
    with pytest.raises(TypeError, match="got model_type='gpt2'"):
        from_pretrained("openai-community/gpt2")
    assert calls == [("config", "openai-community/gpt2")]


def test_from_hf_copies_a_half_precision_model_into_float32():
    hf = _hf_model("llama", seed=12).to(torch.bfloat16)
    ours = from_hf(hf)
    assert {p.dtype for p in ours.parameters()} == {torch.float32}
    torch.testing.assert_close(ours.blocks[1].ffn.down.weight, hf.model.layers[1].mlp.down_proj.weight.float(),
                               atol=0.0, rtol=0.0)


def test_from_pretrained_refuses_what_it_cannot_load(tmp_path, monkeypatch):
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=11, n_positions=8, n_embd=8, n_layer=1,
                                                                n_head=2))
    gpt2.save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match=r"holds a 'gpt2' checkpoint; expected one of \['llama', 'qwen2', 'qwen3'\]"):
        from_pretrained(tmp_path / "gpt2")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        from_pretrained(tmp_path / "empty")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        from_pretrained(tmp_path / "file.txt")
    # A hub name without the network: one clear OSError (offline mode: no connection is attempted)
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))  # no cached copy either
    with pytest.raises(OSError, match="not a local folder, and the Hugging Face hub did not provide it"):
        from_pretrained("companion-tests/no-such-llama")


def _with_rope_scaling(cfg, scaling: dict):
    """``cfg`` with a rotary scaling, where this release of transformers keeps it."""
    if isinstance(getattr(cfg, "rope_parameters", None), dict):  # transformers 5
        cfg.rope_parameters = {**cfg.rope_parameters, **scaling}
    else:  # transformers 4
        cfg.rope_scaling = scaling
    return cfg


# Llama 3.1's rule on a small model: of the three frequencies of Dh = 6 at base 5,000 (wavelengths of
# about 6, 107 and 1,837 positions), one is kept, one smoothed and one divided by the factor.
LLAMA3 = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 200}


def test_llama3_rope_scaling_equals_hugging_face():
    from companion.positional import llama3_rope_frequencies, rope_frequencies

    _, model_cls = _classes("llama")
    torch.manual_seed(0)
    reference = _hf_model("llama", seed=9)
    hf = model_cls(_with_rope_scaling(_hf_config("llama"), LLAMA3)).eval()
    hf.load_state_dict(reference.state_dict())
    ours = from_hf(hf)
    scaling = ours.cfg.rope_scaling
    assert (scaling.factor, scaling.original_max_positions) == (4.0, 200)
    plain, scaled = rope_frequencies(6, base=5000.0), llama3_rope_frequencies(6, base=5000.0, **{
        "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_positions": 200})
    assert scaled[0] == plain[0] and scaled[2] == plain[2] / 4 and plain[1] / 4 < scaled[1] < plain[1]
    idx = _ids((2, 40), seed=10)
    with torch.no_grad():
        want = hf(idx).logits
        torch.testing.assert_close(ours(idx), want, **TOL)
        assert (from_hf(reference)(idx) - want).abs().max() > 1e-2  # the scaling changes the logits
    got = generate(ours, idx[:, :5], 10)
    assert torch.equal(got, hf.generate(idx[:, :5], attention_mask=torch.ones_like(idx[:, :5]), max_new_tokens=10,
                                        do_sample=False, min_new_tokens=10))


def test_config_from_hf_names_what_it_does_not_implement():
    with pytest.raises(ValueError, match="rope_type='yarn'"):
        config_from_hf(_with_rope_scaling(_hf_config("llama"), {"rope_type": "yarn", "factor": 4.0,
                                                                "original_max_position_embeddings": 32}))
    with pytest.raises(ValueError, match="attention_bias=True"):
        config_from_hf(_hf_config("llama", attention_bias=True))
    with pytest.raises(ValueError, match="mlp_bias=True"):
        config_from_hf(_hf_config("llama", mlp_bias=True))
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        config_from_hf(_hf_config("llama", hidden_act="gelu"))
    with pytest.raises(ValueError, match="sliding-window attention"):
        config_from_hf(_hf_config("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=1))
    with pytest.raises(TypeError, match="got model_type='gpt2'"):
        config_from_hf(transformers.GPT2Config())
    # An older config.json (transformers 4): rope_theta and rope_scaling at the top level
    from types import SimpleNamespace

    old = SimpleNamespace(model_type="llama", hidden_size=36, num_attention_heads=6, num_hidden_layers=2,
                          intermediate_size=50, rope_theta=500000.0, rope_scaling=None, tie_word_embeddings=True)
    got = config_from_hf(old)
    assert (got.rope_base, got.n_kv_heads, got.d_head, got.vocab_size, got.tie_embeddings) == (500000.0, 6, 6, 32000, True)
    old.rope_scaling = {"type": "yarn", "factor": 4.0}
    with pytest.raises(ValueError, match="rope_type='yarn'"):
        config_from_hf(old)
    old.rope_scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192}  # Llama 3.1's own values
    assert config_from_hf(old).rope_scaling == Llama3RopeScaling()


def test_bad_configs_raise_clear_errors():
    base = dict(vocab_size=V, d_model=36, n_layers=2, n_heads=6, d_ff=50, max_positions=64)
    cfg = LlamaConfig(**base)
    assert (cfg.n_kv_heads, cfg.d_head) == (6, 6)  # filled in: multi-head, D / H
    with pytest.raises(ValueError, match="n_heads must be a multiple of n_kv_heads .* got n_heads=6, n_kv_heads=4"):
        LlamaConfig(**base, n_kv_heads=4)
    with pytest.raises(ValueError, match="d_head must be even .* got d_head=7"):
        LlamaConfig(**base, d_head=7)
    with pytest.raises(ValueError, match="d_model=36 is not divisible by n_heads=5: pass d_head"):
        LlamaConfig(**{**base, "n_heads": 5})
    assert LlamaConfig(**{**base, "n_heads": 5}, d_head=8).d_head == 8
    with pytest.raises(ValueError, match="d_ff must be a positive int, got 0"):
        LlamaConfig(**{**base, "d_ff": 0})
    with pytest.raises(ValueError, match="rope_base must be a number > 1"):
        LlamaConfig(**base, rope_base=0.5)
    with pytest.raises(ValueError, match="norm_eps must be a positive number"):
        LlamaConfig(**base, norm_eps=0.0)
    with pytest.raises(TypeError, match="qk_norm must be a bool"):
        LlamaConfig(**base, qk_norm=1)
    with pytest.raises(TypeError, match="rope_scaling must be None or a Llama3RopeScaling"):
        LlamaConfig(**base, rope_scaling={"factor": 8.0})
    with pytest.raises(ValueError, match="high_freq_factor must exceed low_freq_factor, got 1.0 and 2.0"):
        Llama3RopeScaling(low_freq_factor=2.0, high_freq_factor=1.0)
    with pytest.raises(TypeError, match="cfg must be a LlamaConfig"):
        Llama(base)
    # replace: a derived d_head and a multi-head n_kv_heads follow the new sizes
    assert (cfg.replace(n_heads=3).d_head, cfg.replace(n_heads=3).n_kv_heads) == (12, 3)
    gqa = LlamaConfig(**base, n_kv_heads=2, d_head=10)
    assert (gqa.replace(n_heads=4).d_head, gqa.replace(n_heads=4).n_kv_heads) == (10, 2)
    with pytest.raises(ValueError, match="unknown config fields: n_head"):
        cfg.replace(n_head=4)


def test_forward_checks_its_inputs():
    model = Llama(LlamaConfig(vocab_size=10, d_model=8, n_layers=1, n_heads=2, d_ff=12, max_positions=6))
    assert model(torch.tensor([[1, 2, 3]]).int()).shape == (1, 3, 10)
    with pytest.raises(TypeError, match=r"idx must hold integer token ids \(int64 or int32\)"):
        model(torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"idx must lie in \[0, 10\), got range \[1, 60\]"):
        model(torch.tensor([[1, 60]]))
    with pytest.raises(ValueError, match="exceed max_positions=6"):
        model(torch.zeros(1, 7, dtype=torch.long))
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(B, cached \+ new\) = \(1, 3\)"):
        model(torch.zeros(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 4))
    with pytest.raises(ValueError, match="cache has 2 layers, the model 1"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=KVCache(2))


@pytest.mark.parametrize("family", FAMILIES)
def test_parameter_count_equals_hugging_face(family):
    hf = _hf_model(family)
    ours = from_hf(hf)
    assert count_parameters(ours) == sum(p.numel() for p in hf.parameters())
