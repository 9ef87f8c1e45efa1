"""BART's five ways to corrupt a document (Lewis et al., 2020, section 2.2).

* token masking: random tokens replaced by ``[MASK]`` (as in BERT);
* token deletion: random tokens removed, the model must find where;
* text infilling: spans with lengths drawn from Poisson(3) each replaced by a
  single ``[MASK]``; a 0-length span inserts a ``[MASK]``;
* sentence permutation: the sentences are shuffled;
* document rotation: the document is rotated to start at a random token.

The paper's final BART combines text infilling (30% of the tokens masked) and
sentence permutation (all sentences), section 5.1. Each function takes a list of
ids and a ``torch.Generator`` and returns a new list.
"""
from __future__ import annotations

import torch


def _check_ratio(ratio: float) -> None:
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"ratio must be in [0, 1], got {ratio!r}")


def _choose(n: int, k: int, generator) -> set[int]:
    return set(torch.randperm(n, generator=generator)[:k].tolist())


def token_masking(ids, mask_id: int, ratio: float = 0.15, generator=None) -> list[int]:
    """Replace ``round(ratio * len(ids))`` random tokens by ``mask_id``."""
    _check_ratio(ratio)
    ids = list(ids)
    chosen = _choose(len(ids), round(ratio * len(ids)), generator)
    return [mask_id if i in chosen else t for i, t in enumerate(ids)]


def token_deletion(ids, ratio: float = 0.15, generator=None) -> list[int]:
    """Delete ``round(ratio * len(ids))`` random tokens."""
    _check_ratio(ratio)
    ids = list(ids)
    chosen = _choose(len(ids), round(ratio * len(ids)), generator)
    return [t for i, t in enumerate(ids) if i not in chosen]


def text_infilling(ids, mask_id: int, ratio: float = 0.3, poisson_lambda: float = 3.0,
                   generator=None) -> list[int]:
    """Replace spans covering about ``ratio`` of the tokens, one ``mask_id`` per span.

    Span lengths are drawn from Poisson(``poisson_lambda``) until they cover
    ``round(ratio * len(ids))`` tokens (the last is cut to fit); each span starts at a
    random position; a 0-length span inserts ``mask_id`` before its start; a span
    that would overlap the previous one is skipped.
    """
    _check_ratio(ratio)
    ids = list(ids)
    budget = round(ratio * len(ids))
    lengths = []
    rate = torch.tensor([float(poisson_lambda)])
    while budget > 0 and sum(lengths) < budget:
        lengths.append(int(torch.poisson(rate, generator=generator).item()))
    if lengths:
        lengths[-1] -= sum(lengths) - budget
    starts = torch.randint(len(ids), (len(lengths),), generator=generator).tolist() if ids else []
    spans = sorted(zip(starts, lengths))
    out, pos = [], 0
    for start, length in spans:
        if start < pos:
            continue  # overlaps the previous span
        out.extend(ids[pos:start])
        out.append(mask_id)
        pos = start + length
    out.extend(ids[pos:])
    return out


def sentence_permutation(sentences, generator=None) -> list:
    """Shuffle a list of sentences (each a list of ids) and concatenate them."""
    order = torch.randperm(len(sentences), generator=generator).tolist()
    return [t for i in order for t in sentences[i]]


def document_rotation(ids, generator=None) -> list[int]:
    """Rotate the document so it starts at a uniformly chosen token."""
    ids = list(ids)
    if not ids:
        return ids
    k = int(torch.randint(len(ids), (1,), generator=generator))
    return ids[k:] + ids[:k]
