"""GPT: a decoder-only Transformer language model (Chapter 9).

One class covers GPT-1 (Radford et al., 2018: post-LN, no final norm) and
GPT-2/GPT-3 (Radford et al., 2019; Brown et al., 2020: pre-LN, a final
LayerNorm): ``GPTConfig.norm_first`` and ``final_norm`` switch between them.
Weights of Hugging Face ``GPT2LMHeadModel`` and ``OpenAIGPTLMHeadModel`` load
with :func:`from_hf_gpt2` and :func:`from_hf_openai_gpt`; OpenAI's released GPT-2
checkpoints (a hub name such as ``"gpt2"``, or a saved folder) with
:func:`from_pretrained_gpt2`.

Shape legend: B batch, T new tokens, S cached + new tokens (keys), H heads,
Dh head size, D model size, F feed-forward size, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .._checks import check_probability, check_token_ids
from ..attention import MultiHeadAttention
from ..blocks import Block, FeedForward, GatedFeedForward, make_norm
from ..kv_cache import KVCache
from ..training import lm_loss  # re-exported: the one loss of every language model
from ._hf import activation_from_hf, copy_by_name_map, hf_source

__all__ = [
    "GPTConfig", "GPT", "GPTBlock", "dense_ffn",
    "GPT1", "GPT2_SMALL", "GPT2_MEDIUM", "GPT2_LARGE", "GPT2_XL", "GPT3_175B",
    "gpt_param_formula", "causal_lm_positions",
    "config_from_hf", "from_hf_gpt2", "from_pretrained_gpt2", "config_from_hf_openai", "from_hf_openai_gpt", "hf_block_names",
    "lm_loss", "evaluate_lm",
]

_ACTIVATIONS = ("relu", "gelu", "gelu_tanh")


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int  # V, number of token ids
    max_positions: int  # maximum number of positions (learned position embeddings)
    d_model: int  # D, width of the residual stream
    n_layers: int  # number of decoder blocks
    n_heads: int  # H, attention heads per block; d_head = d_model // n_heads
    d_ff: int | None = None  # F, feed-forward hidden size; None means 4 * d_model
    norm_first: bool = True  # True: pre-LN (GPT-2, GPT-3); False: post-LN (GPT-1)
    final_norm: bool = True  # LayerNorm after the last block (GPT-2: yes; GPT-1: no)
    activation: str = "gelu_tanh"  # FFN activation: GPT-2 uses GELU's tanh approximation
    tie_embeddings: bool = True  # output projection shares the token-embedding matrix
    dropout: float = 0.0  # on embeddings, attention weights and residual branches
    bias: bool = True  # biases in linear layers and LayerNorms
    norm_eps: float = 1e-5  # epsilon of every LayerNorm
    n_kv_heads: int | None = None  # Hkv, key/value heads (None: n_heads; 1: multi-query; between: grouped-query)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_positions", "d_model", "n_layers", "n_heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.d_ff is not None and (isinstance(self.d_ff, bool) or not isinstance(self.d_ff, int) or self.d_ff <= 0):
            raise ValueError(f"d_ff must be a positive int or None (= 4 * d_model), got {self.d_ff!r}")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {self.activation!r}")
        check_probability("dropout", self.dropout)
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be positive, got {self.norm_eps}")
        if self.n_kv_heads is not None and (isinstance(self.n_kv_heads, bool) or not isinstance(self.n_kv_heads, int)
                                            or self.n_kv_heads <= 0 or self.n_heads % self.n_kv_heads):
            raise ValueError(f"n_kv_heads must be None or a positive divisor of n_heads={self.n_heads}, "
                             f"got {self.n_kv_heads!r}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ff_size(self) -> int:
        """The feed-forward hidden size F actually used."""
        return 4 * self.d_model if self.d_ff is None else self.d_ff


# Presets (plain values; derive variants with dataclasses.replace).
# GPT-1: Radford et al. (2018), section 4.1: 12 layers, 768 wide, 12 heads, 3072 FFN,
# 512 positions, 40,000 BPE merges (HF openai-gpt vocabulary: 40,478). Post-LN, no final norm.
# GELU in its tanh approximation: the original TensorFlow code defines gelu that way, and HF's
# modeling_openai maps its afn="gelu" to gelu_new (tanh), not to the exact erf GELU.
GPT1 = GPTConfig(vocab_size=40478, max_positions=512, d_model=768, n_layers=12, n_heads=12,
                 norm_first=False, final_norm=False, activation="gelu_tanh")
# GPT-2: Radford et al. (2019), table 2 and the released checkpoints (vocab 50,257, 1,024 positions).
GPT2_SMALL = GPTConfig(vocab_size=50257, max_positions=1024, d_model=768, n_layers=12, n_heads=12)
GPT2_MEDIUM = GPTConfig(vocab_size=50257, max_positions=1024, d_model=1024, n_layers=24, n_heads=16)
GPT2_LARGE = GPTConfig(vocab_size=50257, max_positions=1024, d_model=1280, n_layers=36, n_heads=20)
GPT2_XL = GPTConfig(vocab_size=50257, max_positions=1024, d_model=1600, n_layers=48, n_heads=25)
# GPT-3 175B: Brown et al. (2020), table 2.1: 96 layers, d_model 12,288, 96 heads of 128, 2,048 context.
# (GPT-3 also alternates dense and locally banded sparse attention; that changes no parameter.)
GPT3_175B = GPTConfig(vocab_size=50257, max_positions=2048, d_model=12288, n_layers=96, n_heads=96)


FFNFactory = Callable[[GPTConfig, int], nn.Module]  # (cfg, layer_idx) -> a (B, T, D) -> (B, T, D) module


def dense_ffn(cfg: GPTConfig, layer_idx: int) -> FeedForward:
    """GPT's feed-forward network: ``D -> F -> D`` with ``cfg.activation`` (the default of :class:`GPT`)."""
    return FeedForward(cfg.d_model, cfg.ff_size, activation=cfg.activation, bias=cfg.bias)


class GPTBlock(Block):
    """One decoder block of :class:`GPT`: a :class:`~companion.blocks.Block` with GPT's parts.

    Pre-LN (GPT-2): ``x = x + attn(norm1(x)); x = x + ffn(norm2(x))``.
    Post-LN (GPT-1): ``x = norm1(x + attn(x)); x = norm2(x + ffn(x))``.
    The attention is masked by the model (causal, and padding with an ``attention_mask``).
    """

    def __init__(self, cfg: GPTConfig, layer_idx: int, ffn: FFNFactory | None = None) -> None:
        # Creation order norm1, attention, norm2, FFN: the order GPT's seeded initialisation was written with.
        norm1 = make_norm("layernorm", cfg.d_model, cfg.norm_eps, cfg.bias)
        attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, n_kv_heads=cfg.n_kv_heads, bias=cfg.bias,
                                  dropout=cfg.dropout, layer_idx=layer_idx)
        norm2 = make_norm("layernorm", cfg.d_model, cfg.norm_eps, cfg.bias)
        ffn = (ffn or dense_ffn)(cfg, layer_idx)
        super().__init__(attn, ffn, norm1, norm2, norm_first=cfg.norm_first, dropout=cfg.dropout)


class GPT(nn.Module):
    """Decoder-only language model: token + position embeddings, ``n_layers`` blocks, a linear head.

    ``forward(idx)`` returns next-token logits ``(B, T, V)``. With a
    :class:`~companion.kv_cache.KVCache`, ``idx`` holds only the new tokens,
    whose positions start at ``cache.length``; each block appends its new keys
    and values to the cache.

    ``ffn(cfg, layer_idx)`` builds each block's feed-forward network (default
    :func:`dense_ffn`); :func:`companion.moe.moe_gpt` passes a mixture of experts.
    """

    def __init__(self, cfg: GPTConfig, ffn: FFNFactory | None = None) -> None:
        super().__init__()
        if not isinstance(cfg, GPTConfig):
            raise TypeError(f"cfg must be a GPTConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)  # token embedding (V, D)
        self.pos_emb = nn.Embedding(cfg.max_positions, cfg.d_model)  # learned position embedding
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(GPTBlock(cfg, i, ffn) for i in range(cfg.n_layers))
        self.norm_f = make_norm("layernorm", cfg.d_model, cfg.norm_eps, cfg.bias) if cfg.final_norm else nn.Identity()
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight  # one (V, D) matrix used twice
        self.apply(self._init_weights)
        # GPT-2 (section 2.3): scale the weights of residual projections by 1/sqrt(N), N = 2 * n_layers:
        # the attention's output projection and every feed-forward network's down projection
        # (each expert of a mixture of experts is a FeedForward too).
        for m in self.modules():
            if isinstance(m, (MultiHeadAttention, FeedForward, GatedFeedForward)):
                w = m.out.weight if isinstance(m, MultiHeadAttention) else m.down.weight
                nn.init.normal_(w, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @property
    def max_positions(self) -> int:
        """Longest sequence the learned position table covers (``cfg.max_positions``)."""
        return self.cfg.max_positions

    def new_cache(self) -> KVCache:
        """An empty cache with one slot per block (what :func:`companion.generation.generate` asks for)."""
        return KVCache(self.cfg.n_layers)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self, idx: torch.Tensor, *, cache: KVCache | None = None, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits ``(B, T, V)`` for token ids ``idx`` ``(B, T)`` (only the new tokens when ``cache`` is given).

        ``attention_mask`` ``(B, S)``, 1 on real tokens and 0 on padding, covers
        the cached and the new tokens (``S = cache.length + T``). With it, padding
        keys are masked and positions count real tokens only, so a left-padded
        prompt gives the logits it gives alone (what Hugging Face ``generate`` does).
        """
        pos, mask = causal_lm_positions(idx, cache, attention_mask, vocab_size=self.cfg.vocab_size,
                                        n_layers=self.cfg.n_layers, max_positions=self.cfg.max_positions)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))  # (B, T, D)
        for block in self.blocks:
            x = block(x, mask, is_causal=True, cache=cache)
        return self.lm_head(self.norm_f(x))  # (B, T, V)


# --------------------------------------------------------------------------- parameter counts



def causal_lm_positions(idx: torch.Tensor, cache: KVCache | None, attention_mask: torch.Tensor | None, *,
                        vocab_size: int, n_layers: int, max_positions: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The door of a causal LM's ``forward`` (GPT's, and Chapter 16's Llama's): checks ``idx``, the cache and
    ``attention_mask``, and returns the positions of the new tokens and the padding mask of the keys.

    Without ``attention_mask``: positions ``start .. start + T - 1`` (``start`` = tokens already cached), shape
    ``(T,)``, and no mask (the kernel's ``is_causal`` is bottom-right aligned). With it, ``(B, S)`` over the
    cached and the new tokens: positions ``(B, T)`` count real tokens only (a left-padded prompt gets the
    positions it has alone) and the mask ``(B, 1, 1, S)`` hides the padding keys.
    """
    check_token_ids("idx", idx, vocab_size)
    if cache is not None:
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
        if cache.n_layers != n_layers:
            raise ValueError(f"cache has {cache.n_layers} layers, the model {n_layers}")
    b, t = idx.shape
    start = 0 if cache is None else cache.length
    if start + t > max_positions:
        raise ValueError(
            f"positions {start}..{start + t - 1} exceed max_positions={max_positions}: "
            f"{start} cached + {t} new tokens; crop the context"
        )
    if attention_mask is None:
        return torch.arange(start, start + t, device=idx.device), None  # (T,); causal only: is_causal
    if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != (b, start + t):
        got = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__
        raise ValueError(f"attention_mask must have shape (B, cached + new) = ({b}, {start + t}), got {got}")
    keep = attention_mask.bool()  # (B, S)
    # Position of a token = number of real tokens before it (padding takes no position).
    pos = (keep.long().cumsum(-1) - 1).clamp(min=0)[:, start:]  # (B, T)
    return pos, keep[:, None, None, :]  # (B, 1, 1, S): padding keys; the kernel adds the causal rule

def gpt_param_formula(cfg: GPTConfig) -> int:
    """Closed-form parameter count of :class:`GPT` for ``cfg``.

    Per block (D = d_model, F = d_ff, b = 1 with biases else 0):
    attention ``4 D^2 + 4 b D``; FFN ``2 D F + b (F + D)``; two LayerNorms ``2 (1 + b) D``.
    Plus embeddings ``V D + P D``, a final LayerNorm ``(1 + b) D`` and, if untied, a head ``V D``.
    """
    d, f, v, p, n = cfg.d_model, cfg.ff_size, cfg.vocab_size, cfg.max_positions, cfg.n_layers
    b = 1 if cfg.bias else 0
    ln = (1 + b) * d
    block = (4 * d * d + 4 * b * d) + (2 * d * f + b * (f + d)) + 2 * ln
    total = v * d + p * d + n * block
    total += ln if cfg.final_norm else 0
    total += 0 if cfg.tie_embeddings else v * d
    return total


# --------------------------------------------------------------------------- Hugging Face loading

def config_from_hf(hf_config) -> GPTConfig:
    """``GPTConfig`` equivalent to a Hugging Face ``GPT2Config``."""
    if getattr(hf_config, "model_type", None) != "gpt2":
        raise TypeError(f"expected a GPT2Config, got model_type={getattr(hf_config, 'model_type', None)!r}")
    if not getattr(hf_config, "scale_attn_weights", True) or getattr(hf_config, "scale_attn_by_inverse_layer_idx", False):
        raise ValueError("only GPT-2 configs with the standard 1/sqrt(d_head) attention scale are supported")
    # getattr with GPT2Config's defaults: a saved config.json may leave defaults out.
    return GPTConfig(
        vocab_size=getattr(hf_config, "vocab_size", 50257), max_positions=getattr(hf_config, "n_positions", 1024),
        d_model=getattr(hf_config, "n_embd", 768), n_layers=getattr(hf_config, "n_layer", 12),
        n_heads=getattr(hf_config, "n_head", 12), d_ff=getattr(hf_config, "n_inner", None),
        norm_first=True, final_norm=True,
        activation=activation_from_hf(getattr(hf_config, "activation_function", "gelu_new"), _ACTIVATIONS),
        tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", True)),
        norm_eps=getattr(hf_config, "layer_norm_epsilon", 1e-5),
    )


def hf_block_names(model: GPT, prefix: str) -> dict[str, str]:
    """Our name -> Hugging Face name for every block parameter; GPT-1 and GPT-2 share this layout."""
    names = {}
    for i in range(model.cfg.n_layers):
        ours, theirs = f"blocks.{i}.", f"{prefix}h.{i}."
        for a, b in (("norm1", "ln_1"), ("self_attn.qkv", "attn.c_attn"), ("self_attn.out", "attn.c_proj"),
                     ("norm2", "ln_2"), ("ffn.up", "mlp.c_fc"), ("ffn.down", "mlp.c_proj")):
            names[f"{ours}{a}.weight"] = f"{theirs}{b}.weight"
            names[f"{ours}{a}.bias"] = f"{theirs}{b}.bias"
    return names


# HF's Conv1D stores (in, out), nn.Linear (out, in): these are copied transposed.
_CONV1D = (".self_attn.qkv.weight", ".self_attn.out.weight", ".ffn.up.weight", ".ffn.down.weight")
# Buffers (the causal mask HF keeps as attn.bias / attn.masked_bias) and the tied head are skipped.
_HF_IGNORE = (r"\.attn\.bias$", r"\.attn\.masked_bias$", r"^lm_head\.weight$")


def _load(model: GPT, state_dict: dict[str, torch.Tensor], names: dict[str, str]) -> GPT:
    ignore = _HF_IGNORE if model.cfg.tie_embeddings else _HF_IGNORE[:2]
    if not model.cfg.tie_embeddings:
        names["lm_head.weight"] = "lm_head.weight"
    transpose = [n for n in names if n.endswith(_CONV1D)]
    copy_by_name_map(model, state_dict, names, transpose=transpose, ignore=ignore)
    return model.eval()


@torch.no_grad()
def from_hf_gpt2(source) -> GPT:
    """A :class:`GPT` holding the weights of a Hugging Face ``GPT2LMHeadModel`` (or its saved folder)."""
    hf_config, sd = hf_source(source)
    model = GPT(config_from_hf(hf_config))
    names = {"tok_emb.weight": "transformer.wte.weight", "pos_emb.weight": "transformer.wpe.weight",
             "norm_f.weight": "transformer.ln_f.weight", "norm_f.bias": "transformer.ln_f.bias",
             **hf_block_names(model, "transformer.")}
    return _load(model, sd, names)


def from_pretrained_gpt2(name_or_path: str | Path) -> GPT:
    """A :class:`GPT` holding a released GPT-2: a hub name (``"gpt2"``, ``"gpt2-medium"``, ...) or a local folder.

    Hugging Face ``transformers`` reads the checkpoint (``GPT2LMHeadModel.from_pretrained``:
    a hub name needs the network or a cached copy, a folder written by
    ``save_pretrained`` works offline) and :func:`from_hf_gpt2` copies its weights.
    Raises ``ValueError`` for a folder that is not a GPT-2 checkpoint, and the
    ``OSError`` of ``transformers`` when the hub cannot be reached.
    """
    from transformers import AutoConfig, GPT2LMHeadModel  # an optional dependency: companion[reference]

    path = Path(name_or_path)
    if path.exists() and not (path / "config.json").is_file():
        raise ValueError(f"{path} is not a GPT-2 checkpoint: no config.json in it "
                         "(expected a folder written by save_pretrained, or a hub name such as 'gpt2')")
    hf_config = AutoConfig.from_pretrained(name_or_path)
    if hf_config.model_type != "gpt2":
        raise ValueError(f"{name_or_path} is not a GPT-2 checkpoint: its config has model_type="
                         f"{hf_config.model_type!r}, expected 'gpt2'")
    hf = GPT2LMHeadModel.from_pretrained(name_or_path, config=hf_config)
    return from_hf_gpt2(hf)


def config_from_hf_openai(hf_config) -> GPTConfig:
    """``GPTConfig`` equivalent to a Hugging Face ``OpenAIGPTConfig`` (GPT-1: post-LN, no final norm)."""
    if getattr(hf_config, "model_type", None) != "openai-gpt":
        raise TypeError(f"expected an OpenAIGPTConfig, got model_type={getattr(hf_config, 'model_type', None)!r}")
    # modeling_openai's own table: its "gelu" is GELU's tanh approximation (HF's "gelu_new"), not the erf GELU.
    afn = getattr(hf_config, "afn", "gelu")
    activation = activation_from_hf("gelu_new" if afn == "gelu" else afn, ("gelu_tanh", "relu"))
    return GPTConfig(
        vocab_size=getattr(hf_config, "vocab_size", 40478), max_positions=getattr(hf_config, "n_positions", 512),
        d_model=getattr(hf_config, "n_embd", 768), n_layers=getattr(hf_config, "n_layer", 12),
        n_heads=getattr(hf_config, "n_head", 12), norm_first=False, final_norm=False,
        activation=activation, tie_embeddings=True,
        norm_eps=getattr(hf_config, "layer_norm_epsilon", 1e-5),
    )


@torch.no_grad()
def from_hf_openai_gpt(source) -> GPT:
    """A :class:`GPT` holding the weights of a Hugging Face ``OpenAIGPTLMHeadModel`` (GPT-1), or its saved folder."""
    hf_config, sd = hf_source(source)
    model = GPT(config_from_hf_openai(hf_config))
    names = {"tok_emb.weight": "transformer.tokens_embed.weight", "pos_emb.weight": "transformer.positions_embed.weight",
             **hf_block_names(model, "transformer.")}
    return _load(model, sd, names)


# --------------------------------------------------------------------------- held-out evaluation


@torch.no_grad()
def evaluate_lm(model: nn.Module, ids: torch.Tensor, seq_len: int, batch_size: int = 64) -> float:
    """Deterministic held-out loss: mean cross-entropy over non-overlapping windows of ``seq_len + 1`` ids.

    Every id after the first of each window is predicted once, from the ids before
    it in its window (between 0 and ``seq_len - 1`` of context).
    """
    if ids.dim() != 1 or len(ids) < seq_len + 1:
        raise ValueError(f"ids must be 1-D with more than seq_len={seq_len} ids, got shape {tuple(ids.shape)}")
    was_training = model.training
    model.eval()
    n = (len(ids) - 1) // seq_len
    x = ids[: n * seq_len].view(n, seq_len)  # (N, T)
    y = ids[1 : n * seq_len + 1].view(n, seq_len)  # (N, T)
    total = 0.0
    for i in range(0, n, batch_size):
        total += lm_loss(model, (x[i : i + batch_size], y[i : i + batch_size]), reduction="sum").item()
    model.train(was_training)
    return total / (n * seq_len)
