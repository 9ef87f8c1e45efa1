"""GPT: a decoder-only Transformer language model (Chapter 9).

One class covers GPT-1 (Radford et al., 2018: post-LN, no final norm) and
GPT-2/GPT-3 (Radford et al., 2019; Brown et al., 2020: pre-LN, a final
LayerNorm): ``GPTConfig.norm_first`` and ``final_norm`` switch between them.
Weights of Hugging Face ``GPT2LMHeadModel`` and ``OpenAIGPTLMHeadModel`` load
with :func:`from_hf_gpt2` and :func:`from_hf_openai_gpt`.

Shape legend: B batch, T new tokens, S cached + new tokens (keys), H heads,
Dh head size, D model size, F feed-forward size, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .._checks import check_probability
from ..attention import merge_heads, scaled_dot_product_attention, split_heads
from ..blocks import FeedForward, make_norm
from ..kv_cache import KVCache
from ..masks import causal_mask

__all__ = [
    "GPTConfig", "GPT", "CausalSelfAttention", "GPTBlock",
    "GPT1", "GPT2_SMALL", "GPT2_MEDIUM", "GPT2_LARGE", "GPT2_XL", "GPT3_175B",
    "count_parameters", "gpt_param_formula",
    "config_from_hf", "from_hf_gpt2", "config_from_hf_openai", "from_hf_openai_gpt",
    "lm_loss", "evaluate_lm",
]

_ACTIVATIONS = ("relu", "gelu", "gelu_tanh")


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int  # V, number of token ids
    block_size: int  # maximum number of positions (learned position embeddings)
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
    layer_norm_eps: float = 1e-5  # epsilon of every LayerNorm

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "d_model", "n_layers", "n_heads"):
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
        if not self.layer_norm_eps > 0:
            raise ValueError(f"layer_norm_eps must be positive, got {self.layer_norm_eps}")

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
GPT1 = GPTConfig(vocab_size=40478, block_size=512, d_model=768, n_layers=12, n_heads=12,
                 norm_first=False, final_norm=False, activation="gelu_tanh")
# GPT-2: Radford et al. (2019), table 2 and the released checkpoints (vocab 50,257, 1,024 positions).
GPT2_SMALL = GPTConfig(vocab_size=50257, block_size=1024, d_model=768, n_layers=12, n_heads=12)
GPT2_MEDIUM = GPTConfig(vocab_size=50257, block_size=1024, d_model=1024, n_layers=24, n_heads=16)
GPT2_LARGE = GPTConfig(vocab_size=50257, block_size=1024, d_model=1280, n_layers=36, n_heads=20)
GPT2_XL = GPTConfig(vocab_size=50257, block_size=1024, d_model=1600, n_layers=48, n_heads=25)
# GPT-3 175B: Brown et al. (2020), table 2.1: 96 layers, d_model 12,288, 96 heads of 128, 2,048 context.
# (GPT-3 also alternates dense and locally banded sparse attention; that changes no parameter.)
GPT3_175B = GPTConfig(vocab_size=50257, block_size=2048, d_model=12288, n_layers=96, n_heads=96)


class CausalSelfAttention(nn.Module):
    """Masked multi-head self-attention with a fused ``c_attn`` (D -> 3D) projection and an optional KV cache.

    ``c_attn`` output features ``[0, D)`` are queries, ``[D, 2D)`` keys and
    ``[2D, 3D)`` values, as in GPT-2 (whose ``Conv1D`` stores the transpose).
    """

    def __init__(self, cfg: GPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.n_heads, self.d_model, self.layer_idx = cfg.n_heads, cfg.d_model, layer_idx
        self.dropout = cfg.dropout
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        t = x.shape[1]
        q, k, v = self.c_attn(x).split(self.d_model, dim=-1)  # 3 x (B, T, D)
        q, k, v = (split_heads(z, self.n_heads) for z in (q, k, v))  # (B, H, T, Dh)
        if cache is not None:
            k, v = cache.append(self.layer_idx, k, v)  # (B, H, S, Dh)
        # Bottom-right aligned: new token i (at position S - T + i) sees keys 0 .. S - T + i.
        # One new token (cached decoding) sees every key: no mask, and SDPA takes its fast path.
        mask = None if t == 1 else causal_mask(t, k.shape[2], device=x.device)  # (T, S)
        out = scaled_dot_product_attention(
            q, k, v, mask, dropout_p=self.dropout if self.training else 0.0, backend="sdpa"
        )  # (B, H, T, Dh)
        return self.c_proj(merge_heads(out))  # (B, T, D)


class GPTBlock(nn.Module):
    """One decoder block: masked self-attention and FFN, each with a residual connection.

    Pre-LN (GPT-2): ``x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))``.
    Post-LN (GPT-1): ``x = ln_1(x + attn(x)); x = ln_2(x + mlp(x))``.
    """

    def __init__(self, cfg: GPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.norm_first = cfg.norm_first
        self.ln_1 = make_norm("layernorm", cfg.d_model, cfg.layer_norm_eps)
        self.attn = CausalSelfAttention(cfg, layer_idx)
        self.ln_2 = make_norm("layernorm", cfg.d_model, cfg.layer_norm_eps)
        self.mlp = FeedForward(cfg.d_model, cfg.ff_size, activation=cfg.activation, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)
        if not cfg.bias:
            for ln in (self.ln_1, self.ln_2):
                ln.bias = None

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        if self.norm_first:
            x = x + self.drop(self.attn(self.ln_1(x), cache))
            return x + self.drop(self.mlp(self.ln_2(x)))  # (B, T, D)
        x = self.ln_1(x + self.drop(self.attn(x, cache)))
        return self.ln_2(x + self.drop(self.mlp(x)))  # (B, T, D)


class GPT(nn.Module):
    """Decoder-only language model: token + position embeddings, ``n_layers`` blocks, a linear head.

    ``forward(idx)`` returns next-token logits ``(B, T, V)``. With a
    :class:`~companion.kv_cache.KVCache`, ``idx`` holds only the new tokens,
    whose positions start at ``cache.length``; each block appends its new keys
    and values to the cache.
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        if not isinstance(cfg, GPTConfig):
            raise TypeError(f"cfg must be a GPTConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)  # token embedding (V, D)
        self.wpe = nn.Embedding(cfg.block_size, cfg.d_model)  # learned position embedding
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(GPTBlock(cfg, i) for i in range(cfg.n_layers))
        self.ln_f = make_norm("layernorm", cfg.d_model, cfg.layer_norm_eps) if cfg.final_norm else nn.Identity()
        if cfg.final_norm and not cfg.bias:
            self.ln_f.bias = None
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight  # one (V, D) matrix used twice
        self.apply(self._init_weights)
        # GPT-2 (section 2.3): scale the weights of residual projections by 1/sqrt(N), N = 2 * n_layers.
        for name, p in self.named_parameters():
            if name.endswith("attn.c_proj.weight") or name.endswith("mlp.down.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, *, cache: KVCache | None = None) -> torch.Tensor:
        """Logits ``(B, T, V)`` for token ids ``idx`` ``(B, T)`` (only the new tokens when ``cache`` is given)."""
        if not isinstance(idx, torch.Tensor) or idx.dtype != torch.long:
            raise TypeError(f"idx must be a torch.long tensor of shape (B, T), got {getattr(idx, 'dtype', type(idx).__name__)}")
        if idx.dim() != 2 or idx.shape[1] == 0:
            raise ValueError(f"idx must have shape (B, T) with T >= 1, got {tuple(idx.shape)}")
        if cache is not None:
            if not isinstance(cache, KVCache):
                raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
            if cache.n_layers != self.cfg.n_layers:
                raise ValueError(f"cache has {cache.n_layers} layers, the model {self.cfg.n_layers}")
        t = idx.shape[1]
        start = 0 if cache is None else cache.length
        if start + t > self.cfg.block_size:
            raise ValueError(
                f"positions {start}..{start + t - 1} exceed block_size={self.cfg.block_size}: "
                f"{start} cached + {t} new tokens; crop the context"
            )
        pos = torch.arange(start, start + t, device=idx.device)  # (T,)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, D)
        for block in self.blocks:
            x = block(x, cache)
        return self.lm_head(self.ln_f(x))  # (B, T, V)


# --------------------------------------------------------------------------- parameter counts


def count_parameters(model: nn.Module) -> int:
    """Number of distinct parameters (a tied matrix counts once); works on the meta device."""
    return sum(p.numel() for p in model.parameters())  # .parameters() already skips duplicates


def gpt_param_formula(cfg: GPTConfig) -> int:
    """Closed-form parameter count of :class:`GPT` for ``cfg``.

    Per block (D = d_model, F = d_ff, b = 1 with biases else 0):
    attention ``4 D^2 + 4 b D``; FFN ``2 D F + b (F + D)``; two LayerNorms ``2 (1 + b) D``.
    Plus embeddings ``V D + P D``, a final LayerNorm ``(1 + b) D`` and, if untied, a head ``V D``.
    """
    d, f, v, p, n = cfg.d_model, cfg.ff_size, cfg.vocab_size, cfg.block_size, cfg.n_layers
    b = 1 if cfg.bias else 0
    ln = (1 + b) * d
    block = (4 * d * d + 4 * b * d) + (2 * d * f + b * (f + d)) + 2 * ln
    total = v * d + p * d + n * block
    total += ln if cfg.final_norm else 0
    total += 0 if cfg.tie_embeddings else v * d
    return total


# --------------------------------------------------------------------------- Hugging Face loading

_HF_ACT = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}


def _activation_from_hf(name: str) -> str:
    if name not in _HF_ACT:
        raise ValueError(f"unsupported Hugging Face activation {name!r}; expected one of {sorted(_HF_ACT)}")
    return _HF_ACT[name]


def config_from_hf(hf_config) -> GPTConfig:
    """``GPTConfig`` equivalent to a Hugging Face ``GPT2Config``."""
    if getattr(hf_config, "model_type", None) != "gpt2":
        raise TypeError(f"expected a GPT2Config, got model_type={getattr(hf_config, 'model_type', None)!r}")
    if not getattr(hf_config, "scale_attn_weights", True) or getattr(hf_config, "scale_attn_by_inverse_layer_idx", False):
        raise ValueError("only GPT-2 configs with the standard 1/sqrt(d_head) attention scale are supported")
    return GPTConfig(
        vocab_size=hf_config.vocab_size, block_size=hf_config.n_positions, d_model=hf_config.n_embd,
        n_layers=hf_config.n_layer, n_heads=hf_config.n_head, d_ff=hf_config.n_inner,
        norm_first=True, final_norm=True, activation=_activation_from_hf(hf_config.activation_function),
        tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", True)),
        layer_norm_eps=hf_config.layer_norm_epsilon,
    )


def _copy_blocks(model: GPT, sd: dict[str, torch.Tensor], prefix: str) -> None:
    """Copy the per-block weights; HF's ``Conv1D`` stores ``(in, out)``, ``nn.Linear`` ``(out, in)``: transpose."""
    for i, block in enumerate(model.blocks):
        p = f"{prefix}h.{i}."
        pairs = [
            (block.attn.c_attn, "attn.c_attn"), (block.attn.c_proj, "attn.c_proj"),
            (block.mlp.up, "mlp.c_fc"), (block.mlp.down, "mlp.c_proj"),
        ]
        for linear, name in pairs:
            linear.weight.copy_(sd[p + name + ".weight"].t())  # Conv1D (in, out) -> Linear (out, in)
            linear.bias.copy_(sd[p + name + ".bias"])
        for ln, name in ((block.ln_1, "ln_1"), (block.ln_2, "ln_2")):
            ln.weight.copy_(sd[p + name + ".weight"])
            ln.bias.copy_(sd[p + name + ".bias"])


@torch.no_grad()
def from_hf_gpt2(hf_model) -> GPT:
    """A :class:`GPT` holding the weights of a Hugging Face ``GPT2LMHeadModel``."""
    model = GPT(config_from_hf(hf_model.config))
    sd = hf_model.state_dict()
    model.wte.weight.copy_(sd["transformer.wte.weight"])
    model.wpe.weight.copy_(sd["transformer.wpe.weight"])
    _copy_blocks(model, sd, "transformer.")
    model.ln_f.weight.copy_(sd["transformer.ln_f.weight"])
    model.ln_f.bias.copy_(sd["transformer.ln_f.bias"])
    if not model.cfg.tie_embeddings:
        model.lm_head.weight.copy_(sd["lm_head.weight"])
    return model.eval()


# modeling_openai has its own table: ACT_FNS = {"relu": ReLU, "gelu": gelu_new (tanh!), "silu"/"swish": SiLU}.
_HF_OPENAI_ACT = {"gelu": "gelu_tanh", "relu": "relu"}


def config_from_hf_openai(hf_config) -> GPTConfig:
    """``GPTConfig`` equivalent to a Hugging Face ``OpenAIGPTConfig`` (GPT-1: post-LN, no final norm)."""
    if getattr(hf_config, "model_type", None) != "openai-gpt":
        raise TypeError(f"expected an OpenAIGPTConfig, got model_type={getattr(hf_config, 'model_type', None)!r}")
    if hf_config.afn not in _HF_OPENAI_ACT:
        raise ValueError(f"unsupported openai-gpt activation {hf_config.afn!r}; expected one of {sorted(_HF_OPENAI_ACT)}")
    return GPTConfig(
        vocab_size=hf_config.vocab_size, block_size=hf_config.n_positions, d_model=hf_config.n_embd,
        n_layers=hf_config.n_layer, n_heads=hf_config.n_head, norm_first=False, final_norm=False,
        activation=_HF_OPENAI_ACT[hf_config.afn], tie_embeddings=True,
        layer_norm_eps=hf_config.layer_norm_epsilon,
    )


@torch.no_grad()
def from_hf_openai_gpt(hf_model) -> GPT:
    """A :class:`GPT` holding the weights of a Hugging Face ``OpenAIGPTLMHeadModel`` (GPT-1)."""
    model = GPT(config_from_hf_openai(hf_model.config))
    sd = hf_model.state_dict()
    model.wte.weight.copy_(sd["transformer.tokens_embed.weight"])
    model.wpe.weight.copy_(sd["transformer.positions_embed.weight"])
    _copy_blocks(model, sd, "transformer.")
    return model.eval()


# --------------------------------------------------------------------------- language-model loss


def lm_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy (nats per token) of ``model`` on ``(x, y)``, both ``(B, T)``."""
    x, y = batch
    logits = model(x)  # (B, T, V)
    return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())


@torch.no_grad()
def evaluate_lm(model: nn.Module, ids: torch.Tensor, block_size: int, batch_size: int = 64) -> float:
    """Deterministic held-out loss: mean cross-entropy over non-overlapping windows of ``block_size + 1`` ids.

    Every id after the first of each window is predicted once, from the ids before
    it in its window (between 0 and ``block_size - 1`` of context).
    """
    if ids.dim() != 1 or len(ids) < block_size + 1:
        raise ValueError(f"ids must be 1-D with more than block_size={block_size} ids, got shape {tuple(ids.shape)}")
    was_training = model.training
    model.eval()
    n = (len(ids) - 1) // block_size
    x = ids[: n * block_size].view(n, block_size)  # (N, T)
    y = ids[1 : n * block_size + 1].view(n, block_size)  # (N, T)
    total = 0.0
    for i in range(0, n, batch_size):
        logits = model(x[i : i + batch_size])  # (b, T, V)
        total += nn.functional.cross_entropy(logits.flatten(0, 1), y[i : i + batch_size].flatten(), reduction="sum").item()
    model.train(was_training)
    return total / (n * block_size)
