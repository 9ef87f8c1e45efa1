"""Today's decoders: Llama, Qwen2 and Qwen3 as one model built from the course's parts.

Every part is one the course already has: RMSNorm before each sublayer
(:class:`~companion.blocks.RMSNorm`, Chapter 5), rotary positions in the half
layout (:class:`~companion.attention.RotaryAttention`, Chapter 3), a gated SiLU
feed-forward network, SwiGLU (:class:`~companion.blocks.GatedFeedForward`),
grouped-query attention (``n_kv_heads``, :func:`~companion.attention.repeat_kv`)
and the KV cache (:class:`~companion.kv_cache.KVCache`, Chapter 9). The block is
a :class:`~companion.blocks.Block`, pre-norm. No biases and no learned position
table. Two switches cover the Qwen families: ``qkv_bias`` (Qwen2: biases on the
query, key and value projections, none on the output) and ``qk_norm`` (Qwen3: an
RMSNorm over each head's query and key, before the rotation). ``d_head`` need
not be ``d_model / n_heads`` (Qwen3-0.6B: 16 heads of 128 on a width of 1,024).
``rope_scaling`` adds Llama 3.1's rescaled rotary frequencies (Llama 3.1, 3.2).

References: Touvron et al. (2023), "LLaMA" (section 2.2: pre-normalisation with
RMSNorm, SwiGLU, rotary embeddings); Ainslie et al. (2023) (grouped-query
attention); Shazeer (2020), "GLU Variants Improve Transformer"; Su et al. (2021),
"RoFormer"; Qwen2 and Qwen3 as implemented in Hugging Face ``transformers``
(``modeling_qwen2.py``: q/k/v biases; ``modeling_qwen3.py``: ``q_norm``/``k_norm``).

Hugging Face ``LlamaForCausalLM``, ``Qwen2ForCausalLM`` and ``Qwen3ForCausalLM``
load with :func:`from_hf` (a model object or a folder written by
``save_pretrained``); :func:`from_pretrained` takes a hub name or a folder.

Shape legend: B batch, T new tokens, S cached + new tokens, H query heads,
Hkv key/value heads, Dh head size, D model size, F feed-forward size, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from ..attention import RotaryAttention
from ..blocks import Block, GatedFeedForward, RMSNorm
from ..kv_cache import KVCache
from ..positional import llama3_rope_frequencies, rope_cos_sin
from ._hf import copy_by_name_map, fuse_rows, hf_source, read_hf_folder
from .gpt import causal_lm_positions

__all__ = [
    "Llama3RopeScaling", "LlamaConfig", "LlamaAttention", "LlamaBlock", "Llama", "llama_param_formula",
    "HF_MODEL_TYPES", "config_from_hf", "from_hf", "from_pretrained",
]


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's rescaled RoPE (Hugging Face ``rope_type="llama3"``), see
    :func:`~companion.positional.llama3_rope_frequencies`; the defaults are Llama 3.1's."""

    factor: float = 8.0  # long wavelengths are slowed down by this factor
    low_freq_factor: float = 1.0  # wavelengths above original_max_positions / low_freq_factor: divided by factor
    high_freq_factor: float = 4.0  # wavelengths below original_max_positions / high_freq_factor: kept
    original_max_positions: int = 8192  # the context of the first training stage

    def __post_init__(self) -> None:
        llama3_rope_frequencies(2, **vars(self))  # the same checks as the function that uses the values

    def frequencies(self, d_head: int, base: float) -> torch.Tensor:
        """The ``Dh / 2`` rescaled frequencies, float64."""
        return llama3_rope_frequencies(d_head, base=base, **vars(self))


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int  # V, number of token ids
    d_model: int  # D, width of the residual stream
    n_layers: int  # number of blocks
    n_heads: int  # H, query heads per attention layer
    d_ff: int  # F, hidden size of the gated feed-forward network (each of gate and up)
    max_positions: int  # longest sequence the model reads (prompt + generated tokens); RoPE has no table
    n_kv_heads: int | None = None  # Hkv, key/value heads; None: n_heads (filled in); 1: multi-query; between: GQA
    d_head: int | None = None  # Dh; None: d_model // n_heads (filled in); Qwen3 sets it independently of D
    rope_base: float = 10000.0  # RoPE's base (Hugging Face's rope_theta; Llama 3: 500,000)
    norm_eps: float = 1e-6  # epsilon of every RMSNorm
    qkv_bias: bool = False  # biases on the q, k, v projections, none on the output (Qwen2)
    qk_norm: bool = False  # RMSNorm over each head's q and k before the rotation (Qwen3)
    tie_embeddings: bool = False  # the LM head shares the token-embedding matrix
    rope_scaling: Llama3RopeScaling | None = None  # Llama 3.1/3.2's rescaled frequencies; None: plain RoPE

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_positions"):
            _positive_int(name, getattr(self, name))
        if self.n_kv_heads is None:  # resolved once, so that cfg.n_kv_heads is Hkv in every config
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        _positive_int("n_kv_heads", self.n_kv_heads)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads must be a multiple of n_kv_heads (each key/value head serves n_heads / "
                             f"n_kv_heads query heads), got n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}")
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}: "
                                 f"pass d_head (the size of one head) explicitly")
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        _positive_int("d_head", self.d_head)
        if self.d_head % 2:
            raise ValueError(f"d_head must be even (RoPE rotates pairs of features), got d_head={self.d_head}")
        if isinstance(self.rope_base, bool) or not isinstance(self.rope_base, (int, float)) or not self.rope_base > 1:
            raise ValueError(f"rope_base must be a number > 1, got {self.rope_base!r}")
        if isinstance(self.norm_eps, bool) or not isinstance(self.norm_eps, (int, float)) or not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be a positive number, got {self.norm_eps!r}")
        for name in ("qkv_bias", "qk_norm", "tie_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, Llama3RopeScaling):
            raise TypeError(f"rope_scaling must be None or a Llama3RopeScaling, got {type(self.rope_scaling).__name__}")

    def replace(self, **changes) -> LlamaConfig:
        """A copy with some fields changed (validated again).

        A ``d_head`` that was ``d_model // n_heads`` follows a new ``d_model`` or
        ``n_heads``, and an ``n_kv_heads`` equal to ``n_heads`` (multi-head) follows a
        new ``n_heads``, unless they are passed too.
        """
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ValueError(f"unknown config fields: {', '.join(sorted(unknown))}")
        if {"d_model", "n_heads"} & set(changes) and "d_head" not in changes \
                and self.d_head == self.d_model // self.n_heads:
            changes["d_head"] = None
        if "n_heads" in changes and "n_kv_heads" not in changes and self.n_kv_heads == self.n_heads:
            changes["n_kv_heads"] = None
        return replace(self, **changes)


class LlamaAttention(RotaryAttention):
    """Grouped-query self-attention with RoPE, no output bias, and optionally Qwen's two changes.

    A :class:`~companion.attention.RotaryAttention` (fused ``qkv``, ``out``, the
    cache) with biases on ``qkv`` only when ``cfg.qkv_bias`` (Qwen2), and with
    ``cfg.qk_norm`` an RMSNorm of size ``Dh`` on every query and key head,
    ``q_norm`` and ``k_norm``, applied before the rotation (Qwen3).
    """

    def __init__(self, cfg: LlamaConfig, layer_idx: int) -> None:
        super().__init__(cfg.d_model, cfg.n_heads, d_head=cfg.d_head, n_kv_heads=cfg.n_kv_heads,
                         bias=cfg.qkv_bias, out_bias=False, layer_idx=layer_idx)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.d_head, eps=cfg.norm_eps)
            self.k_norm = RMSNorm(cfg.d_head, eps=cfg.norm_eps)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = super().heads(x)  # (B, H, T, Dh), 2 x (B, Hkv, T, Dh)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)  # each head's vector normalised over its Dh features
        return q, k, v


class LlamaBlock(Block):
    """One block: ``x = x + attn(rmsnorm1(x)); x = x + swiglu(rmsnorm2(x))`` (a pre-norm :class:`Block`)."""

    def __init__(self, cfg: LlamaConfig, layer_idx: int) -> None:
        norm1 = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        attn = LlamaAttention(cfg, layer_idx)
        norm2 = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        ffn = GatedFeedForward(cfg.d_model, cfg.d_ff, activation="silu", bias=False)  # SwiGLU
        super().__init__(attn, ffn, norm1, norm2, norm_first=True)


class Llama(nn.Module):
    """Decoder-only language model of the Llama family: token embedding, ``n_layers`` blocks, RMSNorm, head.

    ``forward(idx)`` returns next-token logits ``(B, T, V)``. Positions enter only
    as rotations of queries and keys (no position table). With a
    :class:`~companion.kv_cache.KVCache`, ``idx`` holds only the new tokens, whose
    positions start at ``cache.length``; each block appends its rotated keys and its
    values. Works with :func:`companion.generation.generate` like
    :class:`~companion.models.gpt.GPT` (``new_cache``, ``max_positions``,
    ``attention_mask`` for left-padded prompts).
    """

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        if not isinstance(cfg, LlamaConfig):
            raise TypeError(f"cfg must be a LlamaConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)  # (V, D)
        self.blocks = nn.ModuleList(LlamaBlock(cfg, i) for i in range(cfg.n_layers))
        self.norm_f = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight  # one (V, D) matrix used twice
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # Hugging Face's LlamaPreTrainedModel: N(0, 0.02) for every matrix, zero biases, norms at one.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    @property
    def max_positions(self) -> int:
        """Longest sequence the model reads (``cfg.max_positions``; prompt + generated tokens)."""
        return self.cfg.max_positions

    def new_cache(self) -> KVCache:
        """An empty cache with one slot per block (what :func:`companion.generation.generate` asks for)."""
        return KVCache(self.cfg.n_layers)

    def forward(
        self, idx: torch.Tensor, *, cache: KVCache | None = None, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits ``(B, T, V)`` for token ids ``idx`` ``(B, T)`` (only the new tokens when ``cache`` is given).

        ``attention_mask`` ``(B, S)``, 1 on real tokens and 0 on padding, covers the
        cached and the new tokens (``S = cache.length + T``). With it, padding keys are
        masked and positions count real tokens only, so a left-padded prompt gives the
        logits it gives alone (what Hugging Face ``generate`` does).
        """
        cfg = self.cfg
        pos, mask = causal_lm_positions(idx, cache, attention_mask, vocab_size=cfg.vocab_size,
                                        n_layers=cfg.n_layers, max_positions=cfg.max_positions)
        freqs = None if cfg.rope_scaling is None else cfg.rope_scaling.frequencies(cfg.d_head, cfg.rope_base)
        cos, sin = rope_cos_sin(pos, cfg.d_head, base=cfg.rope_base, frequencies=freqs)  # 2 x (T, Dh) or (B, T, Dh)
        # With padding, one rotation per sequence, for every head: 2 x (B, 1, T, Dh).
        rope = (cos, sin) if pos.dim() == 1 else (cos[:, None], sin[:, None])
        x = self.tok_emb(idx)  # (B, T, D)
        for block in self.blocks:
            x = block(x, mask, is_causal=True, rope=rope, cache=cache)
        return self.lm_head(self.norm_f(x))  # (B, T, V)


# --------------------------------------------------------------------------- parameter count


def llama_param_formula(cfg: LlamaConfig) -> int:
    """Closed-form parameter count of :class:`Llama` for ``cfg``.

    Per block (D = d_model, H, Hkv, Dh, F = d_ff): attention ``D (H + 2 Hkv) Dh`` for q, k, v
    (plus ``(H + 2 Hkv) Dh`` biases with ``qkv_bias``) and ``H Dh D`` for the output;
    ``2 Dh`` for Qwen3's q/k norms; SwiGLU ``3 D F``; two RMSNorms ``2 D``. Plus the token
    table ``V D``, the final RMSNorm ``D`` and, if untied, the head ``V D``.
    """
    if not isinstance(cfg, LlamaConfig):
        raise TypeError(f"cfg must be a LlamaConfig, got {type(cfg).__name__}")
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    qkv_rows = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.d_head
    attention = d * qkv_rows + (qkv_rows if cfg.qkv_bias else 0) + cfg.n_heads * cfg.d_head * d
    attention += 2 * cfg.d_head if cfg.qk_norm else 0
    block = attention + 3 * d * f + 2 * d
    return v * d + cfg.n_layers * block + d + (0 if cfg.tie_embeddings else v * d)


# --------------------------------------------------------------------------- Hugging Face loading

# model_type of the Hugging Face configs this module loads, and the class that holds each.
HF_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# Defaults of the Hugging Face config classes for keys a config.json may leave out.
_HF_DEFAULTS = {
    "llama": dict(vocab_size=32000, max_position_embeddings=2048, rms_norm_eps=1e-6),
    "qwen2": dict(vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6),
    "qwen3": dict(vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6, head_dim=128),
}


def _rope_from_hf(hf_config, model_type: str) -> tuple[float, Llama3RopeScaling | None]:
    """``(rope_theta, scaling)`` from a config of either generation; refuses the scalings it does not implement.

    ``transformers`` 5 keeps ``{"rope_type": ..., "rope_theta": ..., <scaling keys>}`` in
    ``rope_parameters``; earlier releases (and older config.json files) have
    ``rope_theta`` and ``rope_scaling`` (``None`` or ``{"rope_type"|"type": ..., <scaling keys>}``).
    """
    params = getattr(hf_config, "rope_parameters", None)
    params = dict(params) if isinstance(params, dict) else {}
    scaling = getattr(hf_config, "rope_scaling", None)
    if isinstance(scaling, dict) and params.get("rope_type", params.get("type")) in (None, "default"):
        params = {**scaling, **{k: v for k, v in params.items() if k not in ("rope_type", "type")}}
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None))
    theta = float(10000.0 if theta is None else theta)
    kind = params.get("rope_type", params.get("type"))
    partial = params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", None))
    if partial not in (None, 1, 1.0):
        raise ValueError(f"{model_type} config rotates only part of each head (partial_rotary_factor={partial}); "
                         f"companion's Llama rotates whole heads")
    if kind in (None, "default"):
        return theta, None
    if kind == "llama3":
        original = params.get("original_max_position_embeddings", getattr(hf_config, "max_position_embeddings", None))
        return theta, Llama3RopeScaling(factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
                                        high_freq_factor=float(params["high_freq_factor"]),
                                        original_max_positions=int(original))
    raise ValueError(f"{model_type} config uses rotary scaling rope_type={kind!r}, which companion's Llama does not "
                     f"implement (it implements unscaled RoPE, rope_type 'default', and Llama 3.1's 'llama3')")


def config_from_hf(hf_config) -> LlamaConfig:
    """The :class:`LlamaConfig` of a Hugging Face ``LlamaConfig``, ``Qwen2Config`` or ``Qwen3Config``.

    Also takes a config.json read into a namespace (keys left at their defaults may
    be absent). Llama 3.1's rescaled RoPE (``rope_type="llama3"``) becomes a
    :class:`Llama3RopeScaling`. Raises ``ValueError`` naming what it does not implement:
    other rotary scalings (linear, dynamic, YaRN, LongRoPE), partial rotation,
    sliding-window attention, biases on the attention output or the MLP, an
    activation other than SiLU.
    """
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in HF_MODEL_TYPES:
        raise TypeError(f"expected the config of one of {sorted(HF_MODEL_TYPES)} (Hugging Face "
                        f"{', '.join(HF_MODEL_TYPES.values())}), got model_type={model_type!r}")
    defaults = _HF_DEFAULTS[model_type]

    def get(name, default=None):
        value = getattr(hf_config, name, None)
        return defaults.get(name, default) if value is None else value

    act = get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"{model_type} config has hidden_act={act!r}; companion's Llama uses SiLU (SwiGLU) only")
    if model_type in ("llama", "qwen3") and get("attention_bias", False):
        raise ValueError(f"{model_type} config has attention_bias=True (biases on q, k, v and the output "
                         f"projection); companion's Llama supports biases on q, k, v only (Qwen2's layout)")
    if get("mlp_bias", False):
        raise ValueError(f"{model_type} config has mlp_bias=True; companion's Llama has no biases in the MLP")
    layer_types = get("layer_types") or []
    sliding = [i for i, kind in enumerate(layer_types) if kind != "full_attention"]
    if get("use_sliding_window", False) or sliding:
        raise ValueError(f"{model_type} config enables sliding-window attention (use_sliding_window="
                         f"{get('use_sliding_window', False)}, sliding_window={get('sliding_window')}, layers "
                         f"{sliding or 'from max_window_layers on'}); companion's Llama attends to every earlier token")
    d_model, n_heads = get("hidden_size", 4096), get("num_attention_heads", 32)
    rope_base, rope_scaling = _rope_from_hf(hf_config, model_type)
    return LlamaConfig(
        vocab_size=get("vocab_size"), d_model=d_model, n_layers=get("num_hidden_layers", 32), n_heads=n_heads,
        d_ff=get("intermediate_size", 11008), max_positions=get("max_position_embeddings"),
        n_kv_heads=get("num_key_value_heads", n_heads), d_head=get("head_dim", d_model // n_heads),
        rope_base=rope_base, rope_scaling=rope_scaling, norm_eps=float(get("rms_norm_eps")),
        qkv_bias=model_type == "qwen2", qk_norm=model_type == "qwen3",
        tie_embeddings=bool(get("tie_word_embeddings", False)),
    )


def _hf_names(cfg: LlamaConfig) -> dict[str, str]:
    """Our name -> Hugging Face name for every parameter (after q, k, v are fused into ``qkv``)."""
    names = {"tok_emb.weight": "model.embed_tokens.weight", "norm_f.weight": "model.norm.weight"}
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = "lm_head.weight"
    for i in range(cfg.n_layers):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        pairs = [("norm1", "input_layernorm"), ("self_attn.qkv", "self_attn.qkv"), ("self_attn.out", "self_attn.o_proj"),
                 ("norm2", "post_attention_layernorm"), ("ffn.gate", "mlp.gate_proj"), ("ffn.up", "mlp.up_proj"),
                 ("ffn.down", "mlp.down_proj")]
        if cfg.qk_norm:
            pairs += [("self_attn.q_norm", "self_attn.q_norm"), ("self_attn.k_norm", "self_attn.k_norm")]
        for a, b in pairs:
            names[f"{ours}{a}.weight"] = f"{theirs}{b}.weight"
        if cfg.qkv_bias:
            names[f"{ours}self_attn.qkv.bias"] = f"{theirs}self_attn.qkv.bias"
    return names


# Buffers some releases keep in the state dict (the rotary inverse frequencies) and a tied head.
_HF_IGNORE = (r"\.rotary_emb\.inv_freq$", r"^lm_head\.weight$")


@torch.no_grad()
def from_hf(source) -> Llama:
    """A :class:`Llama` holding the weights of a Hugging Face ``LlamaForCausalLM``, ``Qwen2ForCausalLM`` or
    ``Qwen3ForCausalLM`` (the model object, or the path of a folder written by ``save_pretrained``).

    The separate ``q_proj``, ``k_proj``, ``v_proj`` are stacked into the fused ``qkv``
    (rows of q, then k, then v, biases likewise); every other tensor is copied by name,
    and anything missing, left over or of the wrong shape is reported by name. The
    model is float32 whatever the source's dtype (a bfloat16 checkpoint is widened).
    """
    return _load(*hf_source(source))


def _load(hf_config, state_dict: dict[str, torch.Tensor]) -> Llama:
    model = Llama(config_from_hf(hf_config))
    state_dict = fuse_rows(state_dict, ("q_proj", "k_proj", "v_proj"), "qkv", r"\.self_attn$")
    ignore = _HF_IGNORE if model.cfg.tie_embeddings else _HF_IGNORE[:1]
    copy_by_name_map(model, state_dict, _hf_names(model.cfg), ignore=ignore)
    return model.eval()


def from_pretrained(name_or_path: str | Path) -> Llama:
    """A :class:`Llama` holding a released checkpoint: a local folder, or a hub name.

    A folder written by ``save_pretrained`` (``config.json`` with safetensors or
    ``pytorch_model.bin``) is read directly, offline. Anything else is a hub name
    (``"HuggingFaceTB/SmolLM2-135M"``, ``"Qwen/Qwen2.5-0.5B"``, ``"Qwen/Qwen3-0.6B"``):
    Hugging Face ``transformers`` downloads it (the network, or a cached copy) and
    :func:`from_hf` copies its weights. Raises ``OSError`` saying so when the hub
    cannot be reached, and ``TypeError``/``ValueError`` for a checkpoint of another
    kind of model.
    """
    path = Path(name_or_path)
    if path.is_dir():
        config, state_dict = read_hf_folder(path)  # raises for a folder without config.json or weights
        if config.get("model_type") not in HF_MODEL_TYPES:
            raise ValueError(f"{path} holds a {config.get('model_type')!r} checkpoint; expected one of "
                             f"{sorted(HF_MODEL_TYPES)}")
        return _load(SimpleNamespace(**config), state_dict)
    if path.exists():
        raise ValueError(f"{path} is a file; expected a folder written by save_pretrained or a hub name")
    try:
        from transformers import AutoConfig, AutoModelForCausalLM  # an optional dependency: companion[reference]
    except ImportError as err:
        raise ImportError(f"{name_or_path!r} is not a local folder, and loading it from the hub needs "
                          f"transformers: pip install transformers") from err
    try:
        hf_config = AutoConfig.from_pretrained(str(name_or_path))
    except OSError as err:
        raise OSError(f"could not load {name_or_path!r}: it is not a local folder, and the Hugging Face hub did not "
                      f"provide it (no network, no cached copy, or no such model). Original error: {err}") from err
    config_from_hf(hf_config)  # refuses an unsupported model before downloading its weights
    hf = AutoModelForCausalLM.from_pretrained(str(name_or_path), config=hf_config)
    return from_hf(hf)
