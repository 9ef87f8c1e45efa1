"""One configurable encoder-decoder for Chapter 11: T5 and BART are two configs of it.

Every difference between the two models is a field of :class:`EncoderDecoderConfig`
(see :func:`companion.models.t5.t5_config` and :func:`companion.models.bart.bart_config`):

==================  =============================  ===================================
field               T5 (Raffel et al., 2020)       BART (Lewis et al., 2020)
==================  =============================  ===================================
``norm_first``      pre-LN (True)                  post-LN (False)
``norm``            ``"rmsnorm"``, no bias          ``"layernorm"`` with bias
``bias``            no biases anywhere             biases in every projection
``scale_attention`` ``q k^T`` (False)              ``q k^T / sqrt(d_head)`` (True)
``positions``       ``"relative"`` buckets, first   ``"learned"`` absolute positions,
                    layer's bias shared by all      offset 2 (``position_offset``)
``activation``      ReLU (v1.0), gated GELU (v1.1)  GELU
``embedding_norm``  False                          LayerNorm on the embeddings
``final_norm``      a norm after each stack        none (post-LN layers end normed)
``scale_output``    tied head: ``h * d_model**-0.5`` no scaling, ``final_logits_bias``
==================  =============================  ===================================

Both are built from :class:`companion.blocks.Block`,
:class:`companion.attention.MultiHeadAttention`, :func:`companion.blocks.make_norm`
and :class:`companion.blocks.FeedForward` / :class:`companion.blocks.GatedFeedForward`;
decoding uses :class:`companion.kv_cache.EncoderDecoderCache` (self-attention keys
grow, cross-attention keys are computed once) and the course's
:func:`companion.generation.generate` / :func:`companion.generation.beam_search`
through :class:`companion.models.seq2seq.EncodedSource`. What they share with
Chapter 4's Transformer (``encode``, ``decode``, ``forward``, the cache, ``decoder_lm``)
is :class:`companion.models.seq2seq.Seq2SeqModel`: this model supplies its
embeddings, T5's relative position bias and the final norms.

Masks are boolean, True = may attend (:mod:`companion.masks`). Shape legend:
B batch, S source length, T target length, D model size, H heads, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import torch
from torch import nn

from .._checks import check_positive_int, check_probability
from ..attention import CrossAttention, MultiHeadAttention
from ..blocks import Block, DecoderBlock, FeedForward, GatedFeedForward, check_activation, make_norm
from ..generation import BeamSearchOutput, beam_search, generate
from ..positional import RelativePositionBias
from .seq2seq import Seq2SeqModel

__all__ = ["EncoderDecoderConfig", "EncoderDecoder", "generate_seq2seq", "config_differences"]


@dataclass(frozen=True)
class EncoderDecoderConfig:
    vocab_size: int  # V, one vocabulary for source, target and output
    d_model: int = 512  # D
    n_heads: int = 8  # H
    d_head: int | None = None  # Dh per head; None: d_model // n_heads, filled in (T5's d_kv is independent of D)
    d_ff: int = 2048  # hidden size of the feed-forward network
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    norm: Literal["layernorm", "rmsnorm"] = "rmsnorm"
    norm_eps: float = 1e-6
    norm_first: bool = True  # pre-LN (T5) or post-LN (BART)
    bias: bool = False  # biases in projections and LayerNorms
    scale_attention: bool = False  # divide q k^T by sqrt(Dh) (BART) or not (T5: folded into W_Q's init)
    activation: str = "relu"
    gated: bool = False  # GatedFeedForward (T5 v1.1's gated GELU) instead of FeedForward
    positions: Literal["relative", "learned"] = "relative"
    n_buckets: int = 32  # relative: T5 buckets
    max_distance: int = 128  # relative: distances beyond share the last bucket
    max_positions: int = 512  # learned: table size (without the offset); relative: longest sequence accepted
    position_offset: int = 0  # learned: row of position 0 (BART: 2)
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(D)
    embedding_norm: bool = False  # a norm on embeddings + positions (BART's layernorm_embedding)
    final_norm: bool = True  # a norm after the last layer of each stack (pre-LN needs it)
    tie_embeddings: bool = True  # output head shares the embedding matrix
    scale_output: bool = True  # multiply the decoder output by D**-0.5 before the head (T5 when tied)
    final_logits_bias: bool = False  # a (1, V) buffer added to the logits (BART)
    dropout: float = 0.1
    pad_id: int = 0
    eos_id: int = 1
    decoder_start_id: int = 0  # first decoder input (T5: pad; BART: </s>)
    init: Literal["t5", "bart"] = "t5"  # T5's fan-in normal init or BART's N(0, 0.02)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers",
                     "max_positions", "n_buckets", "max_distance"):
            check_positive_int(name, getattr(self, name))
        if self.d_head is None and self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; pass d_head")
        if self.d_head is None:  # resolved once, so that cfg.d_head is Dh as in every other config
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        check_positive_int("d_head", self.d_head)
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {self.norm!r}")
        if self.positions not in ("relative", "learned"):
            raise ValueError(f"positions must be 'relative' or 'learned', got {self.positions!r}")
        if self.init not in ("t5", "bart"):
            raise ValueError(f"init must be 't5' or 'bart', got {self.init!r}")
        check_activation(self.activation)
        check_probability("dropout", self.dropout)
        if isinstance(self.position_offset, bool) or not isinstance(self.position_offset, int) or self.position_offset < 0:
            raise ValueError(f"position_offset must be a non-negative int, got {self.position_offset!r}")
        for name in ("pad_id", "eos_id", "decoder_start_id"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < self.vocab_size:
                raise ValueError(f"{name} must be an int in [0, vocab_size={self.vocab_size}), got {value!r}")

    def replace(self, **changes) -> "EncoderDecoderConfig":
        """A copy with some fields changed (validated again).

        A ``d_head`` that was ``d_model // n_heads`` follows a new ``d_model`` or
        ``n_heads`` unless ``d_head`` is passed too.
        """
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ValueError(f"unknown config fields: {', '.join(sorted(unknown))}")
        if {"d_model", "n_heads"} & set(changes) and "d_head" not in changes \
                and self.d_head == self.d_model // self.n_heads:
            changes["d_head"] = None
        return replace(self, **changes)


def _make_block(cfg: EncoderDecoderConfig, cross: bool, i: int) -> Block | DecoderBlock:
    attn_kw = dict(d_head=cfg.d_head, bias=cfg.bias, dropout=cfg.dropout, layer_idx=i,
                   scale=None if cfg.scale_attention else 1.0)

    def norm() -> nn.Module:
        return make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias if cfg.norm == "layernorm" else None)

    # Creation order (FFN, self-attention, cross-attention) fixes a seeded model's initial weights.
    ffn_cls = GatedFeedForward if cfg.gated else FeedForward
    ffn = ffn_cls(cfg.d_model, cfg.d_ff, activation=cfg.activation, dropout=cfg.dropout, bias=cfg.bias)
    self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, **attn_kw)
    cross_attn = CrossAttention(cfg.d_model, cfg.n_heads, **attn_kw) if cross else None
    if cross:
        return DecoderBlock(self_attn, cross_attn, ffn, norm(), norm(), norm(), norm_first=cfg.norm_first,
                            dropout=cfg.dropout)
    return Block(self_attn, ffn, norm(), norm(), norm_first=cfg.norm_first, dropout=cfg.dropout)


class EncoderDecoder(Seq2SeqModel):
    """An encoder-decoder language model: T5 or BART depending on its :class:`EncoderDecoderConfig`.

    ``forward(src, tgt_in)`` gives teacher-forced logits; :meth:`encode` and
    :meth:`decode` (with an optional :class:`~companion.kv_cache.EncoderDecoderCache`)
    are the two halves, :meth:`decoder_lm` the decoder as a causal LM for
    :mod:`companion.generation`.
    """

    def __init__(self, cfg: EncoderDecoderConfig) -> None:
        super().__init__()
        if not isinstance(cfg, EncoderDecoderConfig):
            raise TypeError(f"expected an EncoderDecoderConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        d = cfg.d_model
        self.tok_emb = nn.Embedding(cfg.vocab_size, d)  # shared by encoder, decoder (and head if tied)
        if cfg.positions == "learned":
            self.encoder_pos_emb = nn.Embedding(cfg.max_positions + cfg.position_offset, d)
            self.decoder_pos_emb = nn.Embedding(cfg.max_positions + cfg.position_offset, d)
        else:  # computed once per stack, added to the scores of every layer
            kw = dict(n_buckets=cfg.n_buckets, max_distance=cfg.max_distance)
            self.encoder_bias = RelativePositionBias(cfg.n_heads, bidirectional=True, **kw)
            self.decoder_bias = RelativePositionBias(cfg.n_heads, bidirectional=False, **kw)
        norm_bias = cfg.bias if cfg.norm == "layernorm" else None
        if cfg.embedding_norm:
            self.encoder_embed_norm = make_norm(cfg.norm, d, cfg.norm_eps, norm_bias)
            self.decoder_embed_norm = make_norm(cfg.norm, d, cfg.norm_eps, norm_bias)
        self.encoder = nn.ModuleList(_make_block(cfg, False, i) for i in range(cfg.n_encoder_layers))
        self.decoder = nn.ModuleList(_make_block(cfg, True, i) for i in range(cfg.n_decoder_layers))
        if cfg.final_norm:
            self.encoder_norm = make_norm(cfg.norm, d, cfg.norm_eps, norm_bias)
            self.decoder_norm = make_norm(cfg.norm, d, cfg.norm_eps, norm_bias)
        self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)
        if cfg.final_logits_bias:
            self.register_buffer("final_logits_bias", torch.zeros(1, cfg.vocab_size))
        self.drop = nn.Dropout(cfg.dropout)
        self.apply(self._init_weights)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def _init_weights(self, module: nn.Module) -> None:
        if self.cfg.init == "bart":  # N(0, 0.02) everywhere, zero biases
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            return
        # T5 (Mesh TensorFlow): N(0, fan_in**-0.5); W_Q also absorbs the 1/sqrt(Dh) of the scores.
        # (apply() visits an attention layer after its Linear children, so this overrides their W_Q rows.)
        if isinstance(module, (MultiHeadAttention, CrossAttention)):
            dq = module.n_heads * module.d_head
            w = module.q.weight if isinstance(module, CrossAttention) else module.qkv.weight[:dq]
            with torch.no_grad():
                w.normal_(std=(module.d_model * module.d_head) ** -0.5)
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=module.in_features ** -0.5)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=1.0 if module is self.tok_emb else module.embedding_dim ** -0.5)
        elif isinstance(module, RelativePositionBias):
            nn.init.normal_(module.relative_attention_bias.weight, std=self.cfg.d_model ** -0.5)

    # ------------------------------------------------------------------ pieces
    def _embed(self, ids: torch.Tensor, start: int, decoder: bool) -> torch.Tensor:
        cfg = self.cfg
        x = self.tok_emb(ids)  # (B, L, D)
        if cfg.scale_embeddings:
            x = x * math.sqrt(cfg.d_model)
        if cfg.positions == "learned":
            table = self.decoder_pos_emb if decoder else self.encoder_pos_emb
            pos = torch.arange(start, start + ids.shape[1], device=ids.device) + cfg.position_offset  # (L,)
            x = x + table(pos)
        if cfg.embedding_norm:
            x = (self.decoder_embed_norm if decoder else self.encoder_embed_norm)(x)
        return self.drop(x)

    def _position_bias(self, decoder: bool, t: int, s: int) -> torch.Tensor | None:
        if self.cfg.positions != "relative":
            return None
        return (self.decoder_bias if decoder else self.encoder_bias)(t, s)  # (1, H, t, s), shared by all layers

    def _finish(self, x: torch.Tensor, decoder: bool) -> torch.Tensor:
        if not self.cfg.final_norm:
            return x
        return self.drop((self.decoder_norm if decoder else self.encoder_norm)(x))

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Decoder hidden states (B, T, D) -> logits (B, T, V), with T5's ``D**-0.5`` scaling if configured."""
        if self.cfg.scale_output:
            hidden = hidden * self.cfg.d_model ** -0.5
        logits = self.lm_head(hidden)
        if self.cfg.final_logits_bias:
            logits = logits + self.final_logits_bias
        return logits



@torch.no_grad()
def generate_seq2seq(
    model: EncoderDecoder,
    src: torch.Tensor,
    *,
    max_new_tokens: int,
    src_attention_mask: torch.Tensor | None = None,
    num_beams: int = 1,
    use_cache: bool = True,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    num_return_sequences: int = 1,
) -> torch.Tensor:
    """Greedy (``num_beams=1``) or beam-search decoding of an :class:`EncoderDecoder`.

    Encodes ``src`` (B, S) once, starts every row with ``cfg.decoder_start_id``
    and runs :func:`companion.generation.generate` or
    :func:`~companion.generation.beam_search` on the decoder until ``cfg.eos_id``
    (finished rows are padded with ``cfg.pad_id``). Returns the decoder
    sequences ``(B * R, 1 + N)``, start token included, as Hugging Face's
    ``generate`` does for encoder-decoders.
    """
    if not isinstance(model, EncoderDecoder):
        raise TypeError(f"model must be an EncoderDecoder, got {type(model).__name__}")
    check_positive_int("num_beams", num_beams)
    was_training = model.training
    model.eval()
    try:
        cfg = model.cfg
        lm = model.decoder_lm(src, src_attention_mask)
        start = torch.full((src.shape[0], 1), cfg.decoder_start_id, dtype=torch.long, device=src.device)  # (B, 1)
        if num_beams == 1:
            if num_return_sequences != 1:
                raise ValueError("num_return_sequences > 1 needs beam search (num_beams > 1)")
            return generate(lm, start, max_new_tokens, eos_token_id=cfg.eos_id, pad_token_id=cfg.pad_id, use_cache=use_cache)
        out: BeamSearchOutput = beam_search(
            lm, start, num_beams=num_beams, max_new_tokens=max_new_tokens, length_penalty=length_penalty,
            early_stopping=early_stopping, eos_token_id=cfg.eos_id, pad_token_id=cfg.pad_id,
            num_return_sequences=num_return_sequences, use_cache=use_cache)
        return out.sequences
    finally:
        model.train(was_training)


def config_differences(a: EncoderDecoderConfig, b: EncoderDecoderConfig) -> dict[str, tuple[Any, Any]]:
    """``{field: (value in a, value in b)}`` for every field where two configs differ (T5 beside BART)."""
    for name, cfg in (("a", a), ("b", b)):
        if not isinstance(cfg, EncoderDecoderConfig):
            raise TypeError(f"{name} must be an EncoderDecoderConfig, got {type(cfg).__name__}")
    return {f.name: (getattr(a, f.name), getattr(b, f.name)) for f in fields(a) if getattr(a, f.name) != getattr(b, f.name)}
