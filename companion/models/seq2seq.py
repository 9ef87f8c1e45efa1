"""What every encoder-decoder of the course shares (Chapters 4 and 11).

:class:`Seq2SeqModel` is the base of Chapter 4's
:class:`~companion.models.transformer.Transformer` and Chapter 11's
:class:`~companion.models.encoder_decoder.EncoderDecoder` (T5, BART). It owns
the one implementation of :meth:`~Seq2SeqModel.encode` and
:meth:`~Seq2SeqModel.decode_hidden` (checks, masks, the loops over the two
stacks), the teacher-forced ``forward``, ``decode``, the decoder cache and the
decoder as a causal LM for :mod:`companion.generation` (:class:`EncodedSource`).
A model supplies only what differs between them:

* ``cfg`` with ``vocab_size``, ``d_model``, ``pad_id``, ``max_positions`` and
  ``n_decoder_layers``; ``encoder`` and ``decoder``, lists of blocks;
* ``_embed(ids, start, decoder)``: token ids (B, L) -> (B, L, D), positions
  ``start .. start + L - 1`` included (sinusoids, a learned table, or none);
* ``head(hidden)``: decoder output (B, T, D) -> logits (B, T, V);
* optionally ``_position_bias(decoder, t, s)``, an additive score term shared by
  every layer of a stack (T5's relative buckets; default none), and
  ``_finish(x, decoder)``, what follows the last layer of a stack (a final norm;
  default nothing).

Masks are boolean, True = may attend (:mod:`companion.masks`). Shape legend:
B batch, S source length, T target length (new decoder tokens), D model size, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import nn

from .._checks import ShapeChecker, check_token_ids
from ..kv_cache import EncoderDecoderCache
from ..masks import cross_attention_mask, padding_mask

__all__ = ["Seq2SeqModel", "EncodedSource"]


class Seq2SeqModel(nn.Module):
    """An encoder-decoder made of the parts a subclass supplies (see the module docstring)."""

    encoder: nn.ModuleList
    decoder: nn.ModuleList

    @property
    def max_positions(self) -> int:
        """Longest source or target the model's positions cover (``cfg.max_positions``)."""
        return self.cfg.max_positions

    def new_cache(self) -> EncoderDecoderCache:
        """An empty decoder cache: self-attention keys grow, cross-attention keys are computed once."""
        return EncoderDecoderCache(self.cfg.n_decoder_layers)

    # ------------------------------------------------------------------ what a model may override
    def _position_bias(self, decoder: bool, t: int, s: int) -> torch.Tensor | None:
        """An additive score term (1, H, t, s) shared by every layer of one stack; none by default."""
        return None

    def _finish(self, x: torch.Tensor, decoder: bool) -> torch.Tensor:
        """What follows the last layer of a stack (a final norm); nothing by default."""
        return x

    # ------------------------------------------------------------------ checks at the door
    def _check_positions(self, which: str, start: int, length: int) -> None:
        if start + length > self.cfg.max_positions:
            raise ValueError(f"{which} positions {start}..{start + length - 1} exceed "
                             f"max_positions={self.cfg.max_positions}")

    def _check_decoder_inputs(self, tgt_in, memory, src_attention_mask) -> ShapeChecker:
        """Check what ``decode_hidden`` receives; the returned checker has B, T and S bound."""
        sc = ShapeChecker()
        check_token_ids("tgt_in", tgt_in, self.cfg.vocab_size, ("B", "T"), sc)
        sc.check("memory", memory, ("B", "S", self.cfg.d_model))
        sc.check("src_attention_mask", src_attention_mask, ("B", "S"))
        return sc

    # ------------------------------------------------------------------ the two halves
    def encode(self, src: torch.Tensor, src_attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Source ids (B, S) -> memory (B, S, D). The mask (B, S) is 1 on real tokens (default ``src != pad_id``)."""
        sc = ShapeChecker()
        check_token_ids("src", src, self.cfg.vocab_size, ("B", "S"), sc)
        s = src.shape[1]
        self._check_positions("source", 0, s)
        if src_attention_mask is None:
            src_attention_mask = src != self.cfg.pad_id
        sc.check("src_attention_mask", src_attention_mask, ("B", "S"))
        mask = padding_mask(src_attention_mask)  # (B, 1, 1, S)
        bias = self._position_bias(False, s, s)  # (1, H, S, S) or None, the same in every layer
        x = self._embed(src, 0, decoder=False)
        for block in self.encoder:
            x = block(x, mask, bias=bias)  # (B, S, D)
        return self._finish(x, decoder=False)

    def decode_hidden(
        self,
        tgt_in: torch.Tensor,
        memory: torch.Tensor,
        src_attention_mask: torch.Tensor,
        tgt_attention_mask: torch.Tensor | None = None,
        *,
        cache: EncoderDecoderCache | None = None,
    ) -> torch.Tensor:
        """The decoder's last hidden states (B, T, D); :meth:`decode` applies the head.

        Self-attention is causal (bottom-right aligned when keys are cached) and,
        with ``tgt_attention_mask`` (B, cached + T), skips target padding;
        cross-attention skips source padding.
        """
        sc = self._check_decoder_inputs(tgt_in, memory, src_attention_mask)
        start = 0 if cache is None else cache.length
        t = tgt_in.shape[1]
        self._check_positions("decoder", start, t)
        # Target padding here; the causal rule (bottom-right when keys are cached) is the kernel's: is_causal below.
        self_mask = None
        if tgt_attention_mask is not None:
            sc.check("tgt_attention_mask", tgt_attention_mask, ("B", start + t))
            self_mask = padding_mask(tgt_attention_mask)  # (B, 1, 1, start + T)
        # No source padding in the batch: no cross-attention mask, so the kernel takes its fused path. Reading
        # that value is cheap on the CPU; on an accelerator it would make the host wait at every decoding
        # step, so there the mask is always built.
        no_padding = src_attention_mask.device.type == "cpu" and bool(src_attention_mask.all())
        cross_mask = None if no_padding else cross_attention_mask(src_attention_mask, t)  # (B, 1, T, S)
        bias = self._position_bias(True, t, start + t)  # (1, H, T, start + T) or None
        x = self._embed(tgt_in, start, decoder=True)
        for block in self.decoder:
            x = block(x, memory, self_mask, cross_mask, is_causal=True, bias=bias, cache=cache)  # (B, T, D)
        return self._finish(x, decoder=True)

    def decode(
        self,
        tgt_in: torch.Tensor,
        memory: torch.Tensor,
        src_attention_mask: torch.Tensor,
        tgt_attention_mask: torch.Tensor | None = None,
        *,
        cache: EncoderDecoderCache | None = None,
    ) -> torch.Tensor:
        """Decoder input ids (B, T) and memory (B, S, D) -> logits (B, T, V).

        With a ``cache`` (:meth:`new_cache`), ``tgt_in`` holds only the new decoder
        tokens and ``tgt_attention_mask``, if given, covers cached and new ones.
        """
        return self.head(self.decode_hidden(tgt_in, memory, src_attention_mask, tgt_attention_mask, cache=cache))

    def forward(
        self,
        src: torch.Tensor,
        tgt_in: torch.Tensor,
        src_attention_mask: torch.Tensor | None = None,
        tgt_attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher-forced logits (B, T, V) for source ids (B, S) and decoder input ids (B, T)."""
        if src_attention_mask is None:
            src_attention_mask = src != self.cfg.pad_id
        memory = self.encode(src, src_attention_mask)
        return self.decode(tgt_in, memory, src_attention_mask, tgt_attention_mask)

    def decoder_lm(self, src: torch.Tensor, src_attention_mask: torch.Tensor | None = None) -> EncodedSource:
        """Encode ``src`` once and return the decoder as a causal LM for :mod:`companion.generation`."""
        if src_attention_mask is None:
            src_attention_mask = src != self.cfg.pad_id
        return EncodedSource(self, self.encode(src, src_attention_mask), src_attention_mask)  # (B, S, D) memory


class EncodedSource:
    """An encoder-decoder with its source encoded: the decoder as a causal LM for :mod:`companion.generation`.

    Works for any model with ``decode(tgt_in, memory, src_attention_mask, tgt_attention_mask, cache=...)``,
    ``new_cache()`` and ``max_positions`` (:class:`Transformer`, Chapter 11's
    :class:`~companion.models.encoder_decoder.EncoderDecoder`).

    ``generate`` and ``beam_search`` drive it like a decoder-only model
    (``new_cache``, ``max_positions``, ``__call__``); beam search feeds
    ``K`` rows per source, so memory rows are repeated to match.
    """

    def __init__(self, model: nn.Module, memory: torch.Tensor, src_attention_mask: torch.Tensor) -> None:
        self.model, self.memory, self.src_attention_mask = model, memory, src_attention_mask
        self.max_positions = getattr(model, "max_positions", None) or model.cfg.max_positions

    def new_cache(self) -> EncoderDecoderCache:
        return self.model.new_cache()

    def __call__(self, idx: torch.Tensor, *, cache: EncoderDecoderCache | None = None,
                 attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        memory, src_mask = self.memory, self.src_attention_mask
        if idx.shape[0] != memory.shape[0]:
            rep = idx.shape[0] // memory.shape[0]  # beams per source
            memory, src_mask = memory.repeat_interleave(rep, dim=0), src_mask.repeat_interleave(rep, dim=0)
        if cache is None:  # (stand-ins with the same encode/decode methods need not know caches)
            return self.model.decode(idx, memory, src_mask, attention_mask)  # (B, T, V)
        return self.model.decode(idx, memory, src_mask, attention_mask, cache=cache)  # (B, T, V)
