"""Closed-form sizes of the three families: parameters, forward FLOPs and memory.

Every count here is a formula of a config, so it runs for GPT-3 as fast as for a
toy model. ``tests/test_calculators.py`` checks each formula against an
independent count: the parameters of the real module built on the ``meta``
device (no memory), and the FLOPs that ``torch.utils.flop_counter.FlopCounterMode``
counts while a small real model runs.

Configs understood (one per family, plus T5's sizes):

* encoder-only: :class:`companion.models.bert.BertConfig` (BERT, RoBERTa, ALBERT, ELECTRA);
* decoder-only: :class:`companion.models.gpt.GPTConfig` (GPT-1, GPT-2, GPT-3) and
  :class:`companion.models.llama.LlamaConfig` (Llama, Qwen2, Qwen3: grouped-query
  attention, a head size independent of the width, SwiGLU);
* encoder-decoder: :class:`companion.models.transformer.TransformerConfig`
  (Chapter 4) and :class:`T5Sizes` (T5; :func:`t5_sizes_from_hf` reads a Hugging
  Face ``T5Config``, and any config with the same field names works).

:func:`parameter_count` also takes Chapter 11's
:class:`~companion.models.encoder_decoder.EncoderDecoderConfig` (T5, BART), counted
on the model built on the ``meta`` device, and :func:`count_parameters` counts the
parameters of any built module: the course's one way to count a model.

FLOPs: a multiply-add is 2 FLOPs. A weight matrix of ``n`` entries applied to one
token costs ``2 n`` FLOPs, hence the rule "2 x parameters per token"; attention adds
``4 d_attn S`` per token and layer for a token that looks at ``S`` keys (``Q K^T``
and ``weights V``, ``d_attn = n_heads * d_head``). Embedding look-ups, norms,
biases, softmax and activations are not counted (they are not matrix products,
and ``FlopCounterMode`` does not count them either). The count is the full
square of scores even under a causal mask: that is what the naive path computes
(scores, then the mask). Causal FlashAttention kernels skip the tiles above the
diagonal (FlashAttention-2, Dao 2023, section 3.1.1) and do about half of the
attention part for a long sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._checks import check_positive_int
from .kv_cache import kv_cache_bytes
import torch
from torch import nn

from .models.bert import BertConfig
from .models.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from .models.gpt import GPTConfig, gpt_param_formula
from .models.llama import LlamaConfig, llama_param_formula
from .models.transformer import TransformerConfig

__all__ = [
    "T5Sizes", "t5_sizes_from_hf", "count_parameters", "parameter_count", "forward_flops", "mlm_head_flops",
    "generation_kv_cache_bytes", "attention_score_bytes",
]


@dataclass(frozen=True)
class T5Sizes:
    """The sizes that fix T5's parameter count (Raffel et al., 2020; names as in the course).

    ``d_head`` is T5's ``d_kv``: ``n_heads * d_head`` need not equal ``d_model``
    (T5-3B and T5-11B). ``gated``: T5 v1.1's gated-GELU FFN (three matrices);
    ``tie_embeddings``: the original T5 reuses the input embedding as output layer.
    """

    vocab_size: int = 32128
    d_model: int = 512
    d_head: int = 64
    n_heads: int = 8
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    n_buckets: int = 32
    gated: bool = False
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "d_head", "n_heads", "d_ff", "n_encoder_layers",
                     "n_decoder_layers", "n_buckets"):
            check_positive_int(name, getattr(self, name))
        for name in ("gated", "tie_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")


def t5_sizes_from_hf(hf_config) -> T5Sizes:
    """:class:`T5Sizes` from a Hugging Face ``T5Config`` (or anything with its field names).

    A config with the course's names (``n_heads``, ``d_head``, ``n_encoder_layers``,
    ``n_decoder_layers``, ``n_buckets``, ``gated``, ``tie_embeddings``: the course's
    encoder-decoder configured as T5) is read too; one with biases or learned positions
    (BART) is refused, since T5's count has neither.
    """
    if hasattr(hf_config, "n_encoder_layers"):  # the course's names
        if getattr(hf_config, "bias", False) or getattr(hf_config, "positions", "relative") != "relative":
            raise ValueError("this config has biases or learned positions: it is not a T5 (T5Sizes counts neither)")
        try:
            d_head = hf_config.d_head if getattr(hf_config, "d_head", None) else hf_config.d_model // hf_config.n_heads
            return T5Sizes(
                vocab_size=hf_config.vocab_size, d_model=hf_config.d_model, d_head=d_head, n_heads=hf_config.n_heads,
                d_ff=hf_config.d_ff, n_encoder_layers=hf_config.n_encoder_layers,
                n_decoder_layers=hf_config.n_decoder_layers, n_buckets=hf_config.n_buckets,
                gated=bool(hf_config.gated), tie_embeddings=bool(hf_config.tie_embeddings))
        except AttributeError as err:
            raise TypeError(f"expected a T5-like config, got {type(hf_config).__name__}: {err}") from None
    try:
        return T5Sizes(
            vocab_size=hf_config.vocab_size, d_model=hf_config.d_model, d_head=hf_config.d_kv,
            n_heads=hf_config.num_heads, d_ff=hf_config.d_ff, n_encoder_layers=hf_config.num_layers,
            n_decoder_layers=hf_config.num_decoder_layers, n_buckets=hf_config.relative_attention_num_buckets,
            gated=bool(getattr(hf_config, "is_gated_act", False)),
            tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", True)))
    except AttributeError as err:
        raise TypeError(f"expected a T5Config-like object, got {type(hf_config).__name__}: {err}") from None


_CONFIGS = (BertConfig, GPTConfig, LlamaConfig, TransformerConfig, T5Sizes)


def _check_config(cfg: object) -> None:
    if not isinstance(cfg, _CONFIGS):
        raise TypeError(f"cfg must be one of {', '.join(c.__name__ for c in _CONFIGS)}, got {type(cfg).__name__}")


# --------------------------------------------------------------------------- parameters


def count_parameters(model: nn.Module) -> int:
    """Number of distinct parameters of a built module (a tied matrix counts once); works on the meta device."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    return sum(p.numel() for p in model.parameters())  # .parameters() already skips duplicates


def _bert_parameters(cfg: BertConfig, pooler: bool) -> int:
    d, e, f = cfg.d_model, cfg.embed_dim, cfg.d_ff
    embeddings = (cfg.vocab_size + cfg.max_positions + cfg.n_segments) * e + 2 * e  # three tables, LayerNorm
    embeddings += (e * d + d) if e != d else 0  # ALBERT/ELECTRA's E -> D projection
    block = (4 * d * d + 4 * d) + (2 * d * f + f + d) + 2 * (2 * d)  # attention, FFN, two LayerNorms
    blocks = block * (1 if cfg.share_layers else cfg.n_layers)
    return embeddings + blocks + ((d * d + d) if pooler else 0)


def _transformer_parameters(cfg: TransformerConfig) -> int:
    d, f = cfg.d_model, cfg.d_ff
    attention, ffn, norm = 4 * d * d + 4 * d, 2 * d * f + f + d, 2 * d
    encoder = cfg.n_encoder_layers * (attention + ffn + 2 * norm)
    decoder = cfg.n_decoder_layers * (2 * attention + ffn + 3 * norm)  # self-, cross-attention
    return cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2) + encoder + decoder  # sinusoids: no parameters


def _t5_parameters(cfg: T5Sizes) -> int:
    d, inner, f = cfg.d_model, cfg.n_heads * cfg.d_head, cfg.d_ff
    attention = 4 * d * inner  # q, k, v, o; no biases anywhere in T5
    ffn = (3 if cfg.gated else 2) * d * f
    bias_table = cfg.n_buckets * cfg.n_heads  # in the first layer of each stack, shared by the others
    encoder = cfg.n_encoder_layers * (attention + ffn + 2 * d) + d + bias_table  # RMSNorm: weight only
    decoder = cfg.n_decoder_layers * (2 * attention + ffn + 3 * d) + d + bias_table
    return cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2) + encoder + decoder


def parameter_count(cfg: BertConfig | GPTConfig | LlamaConfig | TransformerConfig | T5Sizes | EncoderDecoderConfig, *,
                    pooler: bool = True) -> int:
    """Number of distinct parameters of the model ``cfg`` describes (a shared matrix counts once).

    ``BertConfig``: :class:`~companion.models.bert.BertModel` (``pooler`` adds BERT's
    D x D pooler); ``GPTConfig``: :class:`~companion.models.gpt.GPT`
    (:func:`~companion.models.gpt.gpt_param_formula`); ``LlamaConfig``:
    :class:`~companion.models.llama.Llama` (:func:`~companion.models.llama.llama_param_formula`);
    ``TransformerConfig``: Chapter 4's
    :class:`~companion.models.transformer.Transformer`; ``T5Sizes``: Hugging Face's
    ``T5ForConditionalGeneration``; ``EncoderDecoderConfig``: Chapter 11's
    :class:`~companion.models.encoder_decoder.EncoderDecoder`, built on the ``meta``
    device (no memory: the configs of 11-billion-parameter models count in milliseconds).
    """
    if isinstance(cfg, EncoderDecoderConfig):
        with torch.device("meta"):
            return count_parameters(EncoderDecoder(cfg))
    _check_config(cfg)
    if not isinstance(pooler, bool):
        raise TypeError(f"pooler must be a bool, got {pooler!r}")
    if isinstance(cfg, BertConfig):
        return _bert_parameters(cfg, pooler)
    if isinstance(cfg, GPTConfig):
        return gpt_param_formula(cfg)
    if isinstance(cfg, LlamaConfig):
        return llama_param_formula(cfg)
    if isinstance(cfg, TransformerConfig):
        return _transformer_parameters(cfg)
    return _t5_parameters(cfg)


# --------------------------------------------------------------------------- FLOPs


def _stack_flops(tokens: int, keys: int, n_layers: int, d_model: int, d_attn: int, ffn_weights: int,
                 d_kv: int | None = None) -> int:
    """Matrix FLOPs of ``n_layers`` self-attention blocks on ``tokens`` tokens that each see ``keys`` keys.

    ``d_attn = H Dh`` is the width of the queries and of the output projection's input,
    ``d_kv = Hkv Dh`` that of the keys and values (default ``d_attn``: multi-head).
    """
    d_kv = d_attn if d_kv is None else d_kv
    per_token = 2 * (2 * d_model * d_attn + 2 * d_model * d_kv + ffn_weights) + 4 * d_attn * keys
    return n_layers * tokens * per_token


def _cross_flops(tgt: int, src: int, n_layers: int, d_model: int, d_attn: int) -> int:
    """Cross-attention: q and o on target tokens, k and v on source tokens, scores over the source."""
    return n_layers * (tgt * (2 * 2 * d_model * d_attn + 4 * d_attn * src) + src * 2 * 2 * d_model * d_attn)


def forward_flops(cfg: BertConfig | GPTConfig | LlamaConfig | TransformerConfig | T5Sizes, seq_len: int, *,
                  src_len: int | None = None, pooler: bool = True) -> int:
    """Matrix-multiply FLOPs of one forward pass over one sequence (batch size 1).

    Encoder (``BertConfig``, :class:`BertModel`) and decoder (``GPTConfig``, :class:`GPT`,
    and ``LlamaConfig``, :class:`Llama`, with their LM heads): ``seq_len`` tokens, each
    attending to ``seq_len`` keys; grouped-query attention makes the key and value
    projections ``n_kv_heads / n_heads`` as large (the scores cost the same). Encoder-decoder
    (``TransformerConfig``, ``T5Sizes``): ``src_len`` source tokens through the encoder
    and ``seq_len`` target tokens through the decoder and the LM head (teacher forcing).
    Per token this is about ``2 x (matrix parameters) + 4 n_layers d_attn seq_len``.
    """
    _check_config(cfg)
    check_positive_int("seq_len", seq_len)
    encdec = isinstance(cfg, (TransformerConfig, T5Sizes))
    if encdec:
        if src_len is None:
            raise ValueError("an encoder-decoder needs src_len, the number of source tokens")
        check_positive_int("src_len", src_len)
    elif src_len is not None:
        raise ValueError(f"src_len is only for encoder-decoders, got src_len={src_len} for a {type(cfg).__name__}")
    if isinstance(cfg, BertConfig):
        d, e = cfg.d_model, cfg.embed_dim
        total = _stack_flops(seq_len, seq_len, cfg.n_layers, d, d, 2 * d * cfg.d_ff)  # shared or not: same work
        total += 2 * seq_len * e * d if e != d else 0  # E -> D projection
        return total + (2 * d * d if pooler else 0)  # the pooler reads [CLS] only
    if isinstance(cfg, GPTConfig):
        d = cfg.d_model
        d_kv = (cfg.n_heads if cfg.n_kv_heads is None else cfg.n_kv_heads) * cfg.d_head
        total = _stack_flops(seq_len, seq_len, cfg.n_layers, d, d, 2 * d * cfg.ff_size, d_kv)
        return total + 2 * seq_len * d * cfg.vocab_size  # LM head
    if isinstance(cfg, LlamaConfig):
        d = cfg.d_model
        total = _stack_flops(seq_len, seq_len, cfg.n_layers, d, cfg.n_heads * cfg.d_head, 3 * d * cfg.d_ff,
                             cfg.n_kv_heads * cfg.d_head)  # SwiGLU: three D x F matrices
        return total + 2 * seq_len * d * cfg.vocab_size  # LM head
    if isinstance(cfg, TransformerConfig):
        d, d_attn, ffn = cfg.d_model, cfg.d_model, 2 * cfg.d_model * cfg.d_ff
    else:
        d, d_attn, ffn = cfg.d_model, cfg.n_heads * cfg.d_head, (3 if cfg.gated else 2) * cfg.d_model * cfg.d_ff
    total = _stack_flops(src_len, src_len, cfg.n_encoder_layers, d, d_attn, ffn)
    total += _stack_flops(seq_len, seq_len, cfg.n_decoder_layers, d, d_attn, ffn)
    total += _cross_flops(seq_len, src_len, cfg.n_decoder_layers, d, d_attn)
    return total + 2 * seq_len * d * cfg.vocab_size


def mlm_head_flops(cfg: BertConfig, seq_len: int) -> int:
    """Matrix-multiply FLOPs of BERT's masked-LM head over ``seq_len`` positions (batch size 1).

    :class:`~companion.models.bert.MLMHead`: a dense layer ``D -> E`` (``E = D``
    except with a factorised embedding), then the tied decoder ``E -> V``. Add it to
    ``forward_flops(cfg, seq_len, pooler=False)`` for a whole ``BertForMaskedLM``.
    """
    if not isinstance(cfg, BertConfig):
        raise TypeError(f"the masked-LM head belongs to a BertConfig, got {type(cfg).__name__}")
    check_positive_int("seq_len", seq_len)
    return 2 * seq_len * (cfg.d_model * cfg.embed_dim + cfg.embed_dim * cfg.vocab_size)


# --------------------------------------------------------------------------- memory


def generation_kv_cache_bytes(cfg: GPTConfig | LlamaConfig | TransformerConfig | T5Sizes, seq_len: int, *,
                              src_len: int | None = None, batch_size: int = 1, bytes_per_element: int = 4) -> int:
    """Bytes of the keys and values a model keeps while generating ``seq_len`` tokens.

    A decoder caches every layer's keys and values of the ``seq_len`` tokens
    (:func:`companion.kv_cache.kv_cache_bytes`): with grouped-query attention only the
    ``n_kv_heads`` key/value heads of size ``d_head``. An encoder-decoder caches its
    decoder's self-attention over ``seq_len`` target tokens plus the cross-attention
    keys and values of the ``src_len`` source tokens (computed once). An encoder
    does not generate, so ``BertConfig`` is refused.
    """
    if isinstance(cfg, BertConfig):
        raise TypeError("an encoder-only model does not generate token by token: it has no KV cache")
    _check_config(cfg)
    if isinstance(cfg, (GPTConfig, LlamaConfig)):
        if src_len is not None:
            raise ValueError("src_len is only for encoder-decoders")
        n_kv_heads = cfg.n_heads if cfg.n_kv_heads is None else cfg.n_kv_heads  # GPTConfig: None is multi-head
        return kv_cache_bytes(cfg.n_layers, n_kv_heads, cfg.d_head, seq_len, batch_size=batch_size,
                              bytes_per_element=bytes_per_element)
    if src_len is None:
        raise ValueError("an encoder-decoder needs src_len, the number of source tokens")
    n_heads, d_head = (cfg.n_heads, cfg.d_head)
    layers = cfg.n_decoder_layers
    return (kv_cache_bytes(layers, n_heads, d_head, seq_len, batch_size=batch_size, bytes_per_element=bytes_per_element)
            + kv_cache_bytes(layers, n_heads, d_head, src_len, batch_size=batch_size,
                             bytes_per_element=bytes_per_element))


def attention_score_bytes(n_heads: int, seq_len: int, key_len: int | None = None, *, batch_size: int = 1,
                          bytes_per_element: int = 4) -> int:
    """Bytes of one layer's attention matrix (B, H, T, S) when it is materialised (no FlashAttention).

    This is the part of the activation memory that grows as ``T * S``: quadratic in
    the sequence length for self-attention (``key_len`` defaults to ``seq_len``).
    """
    key_len = seq_len if key_len is None else key_len
    for name, value in (("n_heads", n_heads), ("seq_len", seq_len), ("key_len", key_len),
                        ("batch_size", batch_size), ("bytes_per_element", bytes_per_element)):
        check_positive_int(name, value)
    return batch_size * n_heads * seq_len * key_len * bytes_per_element
