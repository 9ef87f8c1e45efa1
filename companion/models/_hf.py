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
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from .._loading import LoadReport, copy_by_name_map  # re-exported: the loaders' one copying routine

__all__ = ["LoadReport", "copy_by_name_map", "read_hf_folder", "hf_source"]


def read_hf_folder(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(config, state_dict)`` of a local Hugging Face model folder.

    Reads ``config.json`` and the weights from ``model.safetensors``, the
    shards listed in ``model.safetensors.index.json``, or ``pytorch_model.bin``
    (loaded with ``weights_only=True``), in that order of preference.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder: expected one written by save_pretrained or the hub")
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
