"""Copy tensors into a module by a name map, and say by name what did not fit.

The one weight-copying routine of the package: ``from_torch`` conversions
(:mod:`companion.attention`, :mod:`companion.blocks`) and the Hugging Face
loaders (:mod:`companion.models._hf`) all state a name map and call
:func:`copy_by_name_map`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = ["LoadReport", "copy_by_name_map"]


@dataclass
class LoadReport:
    """What :func:`copy_by_name_map` copied, and what it could not."""

    copied: list[str] = field(default_factory=list)  # our names
    missing: list[str] = field(default_factory=list)  # our names whose source tensor is absent
    unexpected: list[str] = field(default_factory=list)  # source names nothing maps to (and not ignored)
    mismatched: list[str] = field(default_factory=list)  # "ours (shape) <- theirs (shape)"

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def __str__(self) -> str:
        parts = [f"{len(self.copied)} tensors copied"]
        for label, names in (("missing", self.missing), ("unexpected", self.unexpected), ("shape mismatch", self.mismatched)):
            if names:
                parts.append(f"{label} ({len(names)}): " + ", ".join(names))
        return "; ".join(parts)


@torch.no_grad()
def copy_by_name_map(
    model: nn.Module,
    state_dict: Mapping[str, torch.Tensor],
    name_map: Mapping[str, str],
    *,
    transpose: Iterable[str] = (),
    ignore: Iterable[str] = (),
    strict: bool = True,
) -> LoadReport:
    """Copy ``state_dict[name_map[ours]]`` into each parameter/buffer ``ours`` of ``model``.

    Args:
        model: the companion model, already built with the right sizes.
        state_dict: the source tensors (Hugging Face names).
        name_map: our name -> source name, for **every** parameter of ``model``
            (a tied parameter counts once, under its first name).
        transpose: our names whose source tensor is stored ``(in, out)``.
        ignore: regular expressions of source names to skip silently.
        strict: raise a ``ValueError`` listing every problem (default), or only return the report.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    targets = dict(model.named_parameters())
    targets.update((n, b) for n, b in model.named_buffers() if n in model.state_dict())
    transpose, patterns = set(transpose), [re.compile(p) for p in ignore]
    report = LoadReport()
    unknown = sorted(set(name_map) - set(targets))
    if unknown:
        raise ValueError(f"name_map names tensors the model does not have: {', '.join(unknown)}")
    for ours, tensor in targets.items():
        theirs = name_map.get(ours)
        if theirs is None or theirs not in state_dict:
            report.missing.append(ours if theirs is None else f"{ours} <- {theirs}")
            continue
        src = state_dict[theirs]
        src = src.t() if ours in transpose else src
        if tuple(src.shape) != tuple(tensor.shape):
            report.mismatched.append(f"{ours} {tuple(tensor.shape)} <- {theirs} {tuple(src.shape)}")
            continue
        tensor.copy_(src)
        report.copied.append(ours)
    used = set(name_map.values())
    report.unexpected = [n for n in state_dict if n not in used and not any(p.search(n) for p in patterns)]
    if strict and not report.ok:
        raise ValueError(f"weights do not match the model: {report}")
    return report
