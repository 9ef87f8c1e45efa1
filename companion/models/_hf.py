"""One helper for every ``from_hf_*`` loader: Hugging Face names stay here and in the loaders.

A loader states a **name map** (our parameter name -> the Hugging Face tensor
name), which of them are stored transposed (GPT-2's ``Conv1D`` keeps
``(in, out)``, ``nn.Linear`` ``(out, in)``), and which Hugging Face tensors it
knowingly skips (buffers such as a causal-mask ``attn.bias``, a tied
``lm_head.weight``). :func:`copy_by_name_map` then copies every tensor and
reports, by name, what is missing, unexpected or of the wrong shape.
:func:`read_hf_folder` reads a local folder written by ``save_pretrained``
(``config.json`` with ``model.safetensors``, sharded safetensors, or
``pytorch_model.bin``); nothing is downloaded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

__all__ = ["LoadReport", "copy_by_name_map", "read_hf_folder", "hf_source"]


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


def read_hf_folder(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(config, state_dict)`` of a local Hugging Face model folder.

    Reads ``config.json`` and the weights from ``model.safetensors``, the
    shards listed in ``model.safetensors.index.json``, or ``pytorch_model.bin``
    (loaded with ``weights_only=True``), in that order of preference.
    """
    folder = Path(path)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{folder} has no config.json: expected a folder written by save_pretrained")
    config = json.loads(config_file.read_text(encoding="utf-8"))
    single, index, binary = folder / "model.safetensors", folder / "model.safetensors.index.json", folder / "pytorch_model.bin"
    if single.is_file() or index.is_file():
        from safetensors.torch import load_file  # an optional dependency: companion[reference]

        files = [single] if single.is_file() else sorted(
            {folder / f for f in json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()})
        state_dict: dict[str, torch.Tensor] = {}
        for f in files:
            state_dict.update(load_file(str(f)))
    elif binary.is_file():
        state_dict = torch.load(binary, map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"{folder} holds no model.safetensors, model.safetensors.index.json or pytorch_model.bin")
    return config, state_dict


def hf_source(source: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """``(config, state_dict)`` from a Hugging Face model object or a local folder path.

    A folder's ``config.json`` becomes a namespace with attribute access, like
    a ``PretrainedConfig`` (keys left at their defaults may be absent: read them with ``getattr(cfg, name, default)``).
    """
    if isinstance(source, (str, Path)):
        config, state_dict = read_hf_folder(source)
        return SimpleNamespace(**config), state_dict
    if isinstance(source, nn.Module) and hasattr(source, "config"):
        return source.config, source.state_dict()
    raise TypeError(f"expected a Hugging Face model or the path of a saved model folder, got {type(source).__name__}")
