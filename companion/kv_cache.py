"""A key/value cache for incremental decoding (Chapter 9, used by Chapter 10).

When a decoder generates token ``t+1`` it needs the keys and values of every
earlier token in every layer. Recomputing them costs a full forward pass over
the whole prefix at every step; a **KV cache** keeps them, so each step only
computes the new token's query, key and value and appends them.

Shape legend: B batch, H heads, T new tokens, S cached + new tokens, Dh head size.

Memory held per sequence (keys *and* values, every layer and head)::

    bytes = 2 * n_layers * n_heads * d_head * seq_len * bytes_per_element

see :func:`kv_cache_bytes`.
"""

from __future__ import annotations

import torch

from ._checks import check_positive_int

__all__ = ["KVCache", "EncoderDecoderCache", "kv_cache_bytes"]


def kv_cache_bytes(
    n_layers: int, n_heads: int, d_head: int, seq_len: int, *, batch_size: int = 1, bytes_per_element: int = 4
) -> int:
    """Theoretical size of a KV cache: ``2 * n_layers * n_heads * d_head * seq_len * bytes_per_element`` per sequence.

    The factor 2 counts keys and values. With grouped-query or multi-query
    attention only the key/value heads are cached: pass ``n_kv_heads`` as ``n_heads``.
    ``bytes_per_element`` is 4 for float32,
    2 for float16/bfloat16. Multiply by ``batch_size`` sequences.
    """
    for name, value in (("n_layers", n_layers), ("n_heads", n_heads), ("d_head", d_head),
                        ("batch_size", batch_size), ("bytes_per_element", bytes_per_element)):
        check_positive_int(name, value)
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 0:
        raise ValueError(f"seq_len must be a non-negative int, got {seq_len!r}")
    return 2 * n_layers * n_heads * d_head * seq_len * bytes_per_element * batch_size


class KVCache:
    """Per-layer keys and values of the tokens seen so far.

    ``KVCache(n_layers)`` starts empty. A model calls :meth:`append` once per
    layer and forward pass with the new tokens' ``k, v`` of shape
    ``(B, H, T, Dh)`` and attends over the returned ``(B, H, S, Dh)`` tensors.
    :attr:`length` is the number of tokens cached (that is, the position of the
    next token).
    """

    def __init__(self, n_layers: int) -> None:
        self.n_layers = check_positive_int("n_layers", n_layers)
        self.keys: list[torch.Tensor | None] = [None] * n_layers  # each (B, H, S, Dh)
        self.values: list[torch.Tensor | None] = [None] * n_layers

    def __repr__(self) -> str:
        return f"KVCache(n_layers={self.n_layers}, length={self.length})"

    @property
    def length(self) -> int:
        """Number of tokens cached (read before a forward pass: the first filled layer's length)."""
        k = next((k for k in self.keys if k is not None), None)  # layer 0 in a model; any layer when used alone
        return 0 if k is None else k.shape[2]

    def has(self, layer: int) -> bool:
        """Whether ``layer`` already holds keys and values (a cross-attention layer fills its slot once)."""
        self._check_layer(layer)
        return self.keys[layer] is not None

    def _check_layer(self, layer: int) -> None:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be an int in [0, {self.n_layers}), got {layer!r}")

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new ``k, v`` ``(B, H, T, Dh)`` to ``layer`` and return all of them, ``(B, H, S, Dh)``.

        Called by every attention layer at every step: it trusts the shapes (the
        model checked its inputs) and only checks that layers are filled in order.
        ``torch.cat`` copies the ``S`` cached keys and values into a new tensor
        at every call: ``O(S)`` work per step and ``O(T^2)`` over a generation of
        ``T`` tokens, the same order as attention over the cache (Chapter 10
        measures both). A cache preallocated to the final length would avoid the
        copy; this one keeps every held tensor exactly ``(B, H, S, Dh)``, so that
        :meth:`nbytes` is the memory formula.
        """
        past_k, past_v = self.keys[layer], self.values[layer]
        if past_k is None:
            if layer > 0 and self.keys[0] is not None and self.keys[0].shape[2] != k.shape[2]:
                raise ValueError(
                    f"layer {layer} is empty but layer 0 already holds {self.keys[0].shape[2]} tokens; "
                    f"append to every layer in order 0..{self.n_layers - 1}"
                )
            k_all, v_all = k, v
        else:
            k_all = torch.cat([past_k, k], dim=2)  # (B, H, S, Dh)
            v_all = torch.cat([past_v, v], dim=2)  # (B, H, S, Dv)
        self.keys[layer], self.values[layer] = k_all, v_all
        return k_all, v_all

    def nbytes(self) -> int:
        """Bytes actually held by the cached tensors."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values) if t is not None)

    def reorder(self, index: torch.Tensor) -> None:
        """Select/reorder sequences along the batch axis (beam search): ``index`` is a 1-D LongTensor."""
        if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.dtype != torch.long:
            raise TypeError("index must be a 1-D torch.long tensor of batch positions")
        for i in range(self.n_layers):
            if self.keys[i] is not None:
                self.keys[i] = self.keys[i].index_select(0, index.to(self.keys[i].device))
                self.values[i] = self.values[i].index_select(0, index.to(self.values[i].device))

    def crop(self, length: int) -> None:
        """Keep only the first ``length`` cached tokens (for example to undo rejected draft tokens)."""
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= self.length:
            raise ValueError(f"length must be an int in [0, {self.length}], got {length!r}")
        for i in range(self.n_layers):
            if self.keys[i] is not None:
                if length == 0:
                    self.keys[i] = self.values[i] = None
                else:
                    self.keys[i] = self.keys[i][:, :, :length]  # (B, H, length, Dh)
                    self.values[i] = self.values[i][:, :, :length]


class EncoderDecoderCache:
    """The cache of an encoder-decoder's decoder: a self-attention part and a cross-attention part.

    ``self_attn`` grows by the new tokens at every step, like a decoder-only
    model's :class:`KVCache`. ``cross_attn`` holds the keys and values of the
    encoder output ("memory"), computed by each decoder layer at the first step
    and reused unchanged afterwards. Beam search reorders both.
    """

    def __init__(self, n_layers: int) -> None:
        self.n_layers = check_positive_int("n_layers", n_layers)
        self.self_attn = KVCache(n_layers)
        self.cross_attn = KVCache(n_layers)

    def __repr__(self) -> str:
        return f"EncoderDecoderCache(n_layers={self.n_layers}, length={self.length}, source_length={self.cross_attn.length})"

    @property
    def length(self) -> int:
        """Number of decoder tokens cached (the position of the next decoder token)."""
        return self.self_attn.length

    def nbytes(self) -> int:
        return self.self_attn.nbytes() + self.cross_attn.nbytes()

    def reorder(self, index: torch.Tensor) -> None:
        """Select/reorder sequences along the batch axis in both parts (beam search)."""
        self.self_attn.reorder(index)
        self.cross_attn.reorder(index)
