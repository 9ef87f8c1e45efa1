"""The original encoder-decoder Transformer (Vaswani et al., 2017), Chapter 4.

* embeddings multiplied by ``sqrt(d_model)`` plus fixed sinusoidal positions
  (sections 3.4 and 3.5), one embedding matrix shared by source, target and
  the pre-softmax projection (section 3.4);
* ``n_encoder_layers`` **post-LN** encoder layers, ``x = LayerNorm(x + Sublayer(x))``
  (section 3.1), each self-attention then the ReLU feed-forward network of eq. (2);
* ``n_decoder_layers`` post-LN decoder layers: causal self-attention,
  cross-attention to the encoder output ("memory"), feed-forward;
* no final LayerNorm after either stack: every post-LN layer already ends
  with one (``torch.nn.Transformer`` adds one anyway).

Training uses teacher forcing: the decoder reads the target shifted right by
one position (:func:`shift_right`) and predicts every next token in parallel.
Inference decodes one token at a time (:func:`greedy_decode`).

Masks follow :mod:`companion.masks` (boolean, True = may attend):

* encoder self-attention: padding of the source, ``(B, 1, 1, S)``;
* decoder self-attention: causal AND padding of the target, ``(B, 1, T, T)``;
* cross-attention: padding of the source, ``(B, 1, T, S)``.

Shape legend: B batch, S source length, T target length, D model size,
V vocabulary size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import ShapeChecker, check_positive_int, check_probability
from ..attention import MultiHeadAttention, record_attention
from ..blocks import TransformerBlock, TransformerDecoderBlock
from ..generation import generate
from ..masks import causal_mask, combine_masks, padding_mask
from ..positional import sinusoidal_encoding
from .seq2seq import EncodedSource, Seq2SeqModel

__all__ = [
    "TransformerConfig",
    "Transformer",
    "shift_right",
    "decoder_self_mask",
    "seq2seq_loss",
    "greedy_decode",
    "cross_attention_weights",
    "block_from_torch_decoder_layer",
]


@dataclass(frozen=True)
class TransformerConfig:
    vocab_size: int  # V, one vocabulary shared by source and target (section 3.4)
    d_model: int = 512  # D, size of every token vector
    n_heads: int = 8  # H, attention heads per layer; must divide d_model
    d_ff: int = 2048  # F, hidden size of the feed-forward network (4 * d_model in the paper)
    n_encoder_layers: int = 6  # N encoder layers
    n_decoder_layers: int = 6  # N decoder layers
    max_positions: int = 512  # longest source or target the sinusoidal table covers
    dropout: float = 0.1  # P_drop on sublayer outputs, embeddings and attention weights
    pad_id: int = 0  # id of the padding token
    tie_embeddings: bool = True  # share the embedding and pre-softmax weights (section 3.4)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers", "max_positions"):
            check_positive_int(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.d_model % 2:
            raise ValueError(f"d_model must be even for the sinusoidal encoding, got {self.d_model}")
        check_probability("dropout", self.dropout)
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"pad_id must lie in [0, vocab_size={self.vocab_size}), got {self.pad_id}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


# The paper's base model (Table 3, row "base") with a 37000-token shared vocabulary (section 5.1).
TRANSFORMER_BASE = TransformerConfig(vocab_size=37000)


def shift_right(tgt: torch.Tensor, bos_id: int, pad_id: int = 0) -> torch.Tensor:
    """Decoder input for teacher forcing: ``[BOS, y_1, ..., y_{T-1}]`` from targets ``[y_1, ..., y_T]``.

    ``tgt`` (B, T) holds the target ids, right-padded with ``pad_id``. Position
    ``t`` of the result is the token the decoder has seen before predicting
    ``tgt[:, t]``. The last target token is dropped; ignored labels ``-100``
    (the ``cross_entropy`` convention) become ``pad_id``.
    """
    ShapeChecker().check("tgt", tgt, ("B", "T"))
    if tgt.dtype.is_floating_point or tgt.dtype == torch.bool:
        raise TypeError(f"tgt must hold integer token ids, got dtype {tgt.dtype}")
    out = torch.empty_like(tgt)
    out[:, 0] = bos_id
    out[:, 1:] = tgt[:, :-1]  # (B, T)
    return out.masked_fill(out == -100, pad_id)


def decoder_self_mask(tgt_attention_mask: torch.Tensor) -> torch.Tensor:
    """Mask of the decoder's self-attention: causal AND target padding, shape ``(B, 1, T, T)``.

    ``tgt_attention_mask`` (B, T) is 1 (or True) on real decoder-input tokens.
    Query ``i`` may see key ``j`` iff ``j <= i`` and key ``j`` is not padding.
    """
    ShapeChecker().check("tgt_attention_mask", tgt_attention_mask, ("B", "T"))
    t = tgt_attention_mask.shape[1]
    return combine_masks(causal_mask(t, device=tgt_attention_mask.device), padding_mask(tgt_attention_mask))  # (B, 1, T, T)


class Transformer(Seq2SeqModel):
    """Encoder-decoder Transformer with post-LN layers (Vaswani et al., 2017, figure 1)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        if not isinstance(cfg, TransformerConfig):
            raise TypeError(f"expected a TransformerConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.register_buffer("pe", sinusoidal_encoding(cfg.max_positions, cfg.d_model), persistent=False)  # (P, D)
        self.drop = nn.Dropout(cfg.dropout)

        def layer(cls: type, i: int) -> TransformerBlock | TransformerDecoderBlock:
            return cls(cfg.d_model, cfg.n_heads, cfg.d_ff, norm_first=False, dropout=cfg.dropout, activation="relu",
                       layer_idx=i)

        self.encoder = nn.ModuleList(layer(TransformerBlock, i) for i in range(cfg.n_encoder_layers))
        self.decoder = nn.ModuleList(layer(TransformerDecoderBlock, i) for i in range(cfg.n_decoder_layers))
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)
        if cfg.tie_embeddings:
            # Shared with the output projection, the embedding starts at std d_model^-0.5
            # (variance 1 over that projection's fan-in, d_model; the other linear layers are
            # Xavier-initialised): rows of norm about 1, which the sqrt(d_model) factor scales
            # to entries of unit size, comparable to the positional encoding.
            nn.init.normal_(self.tok_emb.weight, std=cfg.d_model ** -0.5)
            self.lm_head.weight = self.tok_emb.weight

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=1.0)

    def embed_tokens(self, ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        """``Embedding(ids) * sqrt(d_model) + PE[start:start + length]``, then dropout (sections 3.4, 3.5)."""
        x = self.tok_emb(ids) * math.sqrt(self.cfg.d_model)  # (B, L, D)
        return self.drop(x + self.pe[start : start + ids.shape[1]])  # (B, L, D)

    def _embed(self, ids: torch.Tensor, start: int, decoder: bool) -> torch.Tensor:
        return self.embed_tokens(ids, start)  # one table and one sinusoid for source and target

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Decoder output (B, T, D) -> logits (B, T, V): the pre-softmax projection (tied to the embedding)."""
        return self.lm_head(hidden)


def seq2seq_loss(model: Transformer, src: torch.Tensor, tgt: torch.Tensor, *, bos_id: int,
                 src_attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy of next-token prediction under teacher forcing; padding targets are ignored."""
    pad = model.cfg.pad_id
    tgt_in = shift_right(tgt, bos_id, pad)  # (B, T)
    # Right padding: decoder input t is real iff target t is real (its first pad is the EOS input).
    tgt_attention_mask = tgt != pad  # (B, T)
    logits = model(src, tgt_in, src_attention_mask, tgt_attention_mask)  # (B, T, V)
    labels = tgt.masked_fill(tgt == pad, -100)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


@torch.no_grad()
def greedy_decode(
    model: Transformer,
    src: torch.Tensor,
    *,
    bos_id: int,
    eos_id: int,
    max_new_tokens: int,
    src_attention_mask: torch.Tensor | None = None,
    use_cache: bool = False,
) -> torch.Tensor:
    """Greedy decoding: encode once, then append the most likely token until EOS or ``max_new_tokens``.

    Returns the generated ids (B, L) without the leading BOS, ``L <= max_new_tokens``;
    after a sequence emits ``eos_id`` its remaining positions hold ``pad_id``.
    By default the decoder is re-run on the whole prefix at every step (Chapter 10
    adds the cache: ``use_cache=True``). The loop is :func:`companion.generation.generate`'s.
    """
    check_positive_int("max_new_tokens", max_new_tokens)
    was_training = model.training
    model.eval()
    if src_attention_mask is None:
        src_attention_mask = src != model.cfg.pad_id
    lm = EncodedSource(model, model.encode(src, src_attention_mask), src_attention_mask)  # (B, S, D) memory
    start = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
    out = generate(lm, start, max_new_tokens, eos_token_id=eos_id, pad_token_id=model.cfg.pad_id, use_cache=use_cache)
    model.train(was_training)
    return out[:, 1:]


@torch.no_grad()
def cross_attention_weights(
    model: Transformer,
    src: torch.Tensor,
    tgt_in: torch.Tensor,
    src_attention_mask: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Cross-attention weights of every decoder layer, each ``(B, H, T, S)``, for teacher-forced inputs.

    Runs the model once (in eval mode) inside :func:`companion.attention.record_attention`,
    which keeps the weights each decoder layer's cross-attention forms. Row ``t``
    of a weight matrix says which source positions decoder input ``t`` reads.
    """
    was_training = model.training
    model.eval()
    try:
        with record_attention(model.decoder, cross=True) as weights:
            model(src, tgt_in, src_attention_mask)
    finally:
        model.train(was_training)
    return [weights[f"{i}.cross_attn"][0] for i in range(len(model.decoder))]  # each (B, H, T, S)


# ---------------------------------------------------------------- weights from torch.nn
# (``TransformerBlock.from_torch`` converts both kinds; this keeps Chapter 4's post-LN, ReLU check.)

def _check_torch_layer(layer: nn.Module, kind: type) -> None:
    if not isinstance(layer, kind):
        raise TypeError(f"expected {kind.__name__}, got {type(layer).__name__}")
    if layer.norm_first:
        raise ValueError("expected a post-LN layer (norm_first=False)")
    act = getattr(layer, "activation", None)
    if act is not F.relu and not isinstance(act, nn.ReLU):
        raise ValueError(f"expected activation relu, got {act}")


@torch.no_grad()
def block_from_torch_decoder_layer(layer: nn.TransformerDecoderLayer) -> TransformerDecoderBlock:
    """A post-LN :class:`~companion.blocks.TransformerDecoderBlock` holding a ``torch.nn.TransformerDecoderLayer``'s weights.

    torch's ``norm1, norm2, norm3`` follow self-attention, cross-attention and
    the FFN; the companion names are ``norm1, norm_cross, norm2``.
    """
    _check_torch_layer(layer, nn.TransformerDecoderLayer)
    return TransformerBlock.from_torch(layer).eval()
