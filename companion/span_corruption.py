"""T5's pre-training objective: span corruption (Raffel et al., 2020, section 3.1.4).

A fraction ``noise_density`` (0.15) of the tokens is chosen as noise, in spans
whose mean length is ``mean_noise_span_length`` (3). The input keeps the other
tokens and replaces each noise span by one sentinel; the target lists, for each
span, its sentinel followed by the span's tokens. Both end with EOS.

The mask follows the algorithm of ``random_spans_noise_mask`` in T5's reference
(google-research/text-to-text-transfer-transformer, ``preprocessors.py``),
rewritten here: the noise tokens and the kept tokens are each cut into
``num_noise_spans`` non-empty segments at uniformly random cut points, and the
segments are interleaved starting with a kept segment, so the sequence always
ends with a noise span. Because of that, the reference's target has no final
sentinel after the last span (the paper's Figure 2 draws one).

Sentinels count down from the end of the vocabulary: ``<extra_id_0>`` is id
``vocab_size - 1``, ``<extra_id_1>`` is ``vocab_size - 2`` and so on (the
reference's ``vocabulary.vocab_size - cumsum(first_noise_tokens)``).
"""
from __future__ import annotations

import torch


def _check_lengths(length: int, noise_density: float, mean_noise_span_length: float) -> None:
    if not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be a positive int, got {length!r}")
    if not 0.0 < noise_density < 1.0:
        raise ValueError(f"noise_density must be in (0, 1), got {noise_density!r}")
    if mean_noise_span_length < 1:
        raise ValueError(f"mean_noise_span_length must be >= 1, got {mean_noise_span_length!r}")


def noise_counts(length: int, noise_density: float = 0.15,
                 mean_noise_span_length: float = 3.0) -> tuple[int, int]:
    """(number of noise tokens, number of noise spans) for a sequence of ``length`` tokens,
    as T5's reference computes them: ``round(length * density)`` clipped to
    ``[1, length - 1]``, then ``round(num_noise / mean)`` with at least one span."""
    _check_lengths(length, noise_density, mean_noise_span_length)
    length = max(length, 2)
    num_noise = min(max(round(length * noise_density), 1), length - 1)
    num_spans = max(round(num_noise / mean_noise_span_length), 1)
    return num_noise, num_spans


def _random_segmentation(n_items: int, n_segments: int, generator) -> torch.Tensor:
    """Lengths of ``n_segments`` non-empty segments summing to ``n_items``: choose
    ``n_segments - 1`` of the ``n_items - 1`` gaps between items as cuts, uniformly."""
    cuts = torch.randperm(n_items - 1, generator=generator)[: n_segments - 1]
    bounds = torch.cat([torch.tensor([0]), torch.sort(cuts + 1).values, torch.tensor([n_items])])
    return bounds.diff()


def random_spans_noise_mask(length: int, noise_density: float = 0.15,
                            mean_noise_span_length: float = 3.0,
                            generator: torch.Generator | None = None) -> torch.Tensor:
    """Boolean mask of shape ``(length,)``, True = noise, from T5's span algorithm.

    Exactly :func:`noise_counts` noise tokens in exactly that many spans; the first
    token is never noise and the last always is (for ``length >= 2``).
    """
    orig_length = length
    num_noise, num_spans = noise_counts(length, noise_density, mean_noise_span_length)
    length = max(length, 2)
    noise_lengths = _random_segmentation(num_noise, num_spans, generator)
    keep_lengths = _random_segmentation(length - num_noise, num_spans, generator)
    interleaved = torch.stack([keep_lengths, noise_lengths], dim=1).reshape(-1)
    is_noise = torch.repeat_interleave(torch.arange(2 * num_spans) % 2 == 1, interleaved)
    return is_noise[:orig_length]


def compute_input_and_target_lengths(inputs_length: int, noise_density: float = 0.15,
                                     mean_noise_span_length: float = 3.0) -> tuple[int, int]:
    """(raw tokens to take, target length) so that the corrupted input is at most
    ``inputs_length`` long, EOS included, as in T5's reference: for 512 inputs,
    568 raw tokens and 114 targets.
    """
    def lengths(n_tokens: int) -> tuple[int, int]:
        num_noise = round(n_tokens * noise_density)
        num_spans = round(num_noise / mean_noise_span_length)
        # kept tokens + one sentinel per span + EOS; noise tokens + one sentinel per span + EOS
        return n_tokens - num_noise + num_spans + 1, num_noise + num_spans + 1

    _check_lengths(inputs_length, noise_density, mean_noise_span_length)
    n_tokens = inputs_length
    while lengths(n_tokens + 1)[0] <= inputs_length:
        n_tokens += 1
    _, targets_length = lengths(n_tokens)
    if noise_density == 0.5 and targets_length > lengths(n_tokens)[0]:
        n_tokens -= 1
        targets_length -= 1
    return n_tokens, targets_length


def sentinel_id(i: int, vocab_size: int) -> int:
    """Id of ``<extra_id_i>``: ``vocab_size - 1 - i`` (counting down from the end)."""
    if not 0 <= i < vocab_size:
        raise ValueError(f"sentinel index must be in [0, {vocab_size}), got {i}")
    return vocab_size - 1 - i


def span_corrupt(ids, noise_mask: torch.Tensor, vocab_size: int, eos_id: int):
    """Apply a noise mask: returns ``(inputs, targets)`` as lists of ids.

    inputs = kept tokens with each noise span replaced by its sentinel, then EOS;
    targets = for each noise span, its sentinel then its tokens, then EOS
    (the reference replaces each kept span of the target by the next sentinel, so a
    final sentinel appears only if the sequence ends with kept tokens).
    """
    ids = [int(t) for t in ids]
    mask = [bool(m) for m in noise_mask]
    if len(ids) != len(mask):
        raise ValueError(f"ids has {len(ids)} tokens but noise_mask has {len(mask)}")

    def replace_spans(keep_where_true: list[bool]) -> list[int]:
        out, n_spans, prev = [], 0, False
        for t, drop in zip(ids, keep_where_true):
            if drop:
                if not prev:
                    out.append(sentinel_id(n_spans, vocab_size))
                    n_spans += 1
            else:
                out.append(t)
            prev = drop
        return out + [eos_id]

    return replace_spans(mask), replace_spans([not m for m in mask])
