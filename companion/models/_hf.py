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
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from .._loading import LoadReport, copy_by_name_map  # re-exported: the loaders' one copying routine

__all__ = ["LoadReport", "copy_by_name_map", "read_hf_folder", "hf_source", "fuse_rows", "activation_from_hf"]


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


def fuse_rows(state_dict: dict[str, torch.Tensor], parts: tuple[str, ...], fused: str,
              where: str = "") -> dict[str, torch.Tensor]:
    """``state_dict`` with every group of separate projections stacked into one fused tensor.

    For each ``<stem>.<parts[0]>.<leaf>`` whose siblings ``<stem>.<p>.<leaf>`` all
    exist (and whose stem matches the regular expression ``where``), the parts are
    concatenated along rows into ``<stem>.<fused>.<leaf>`` and removed: the layout of
    the course's fused ``qkv`` (rows of q, then k, then v) and ``kv`` projections.
    A group with a part missing is left as it is (the name map then reports the
    fused name as missing). ``fuse_rows(sd, ("q", "k", "v"), "qkv", r"SelfAttention$")``
    fuses T5's self-attention; BERT's ``query``/``key``/``value`` and BART's
    ``q_proj``/``k_proj``/``v_proj`` work the same way.
    """
    out = dict(state_dict)
    marker = f".{parts[0]}."
    for name in state_dict:
        stem, found, leaf = name.rpartition(marker)
        if not found or "." in leaf or not re.search(where, stem):
            continue
        names = [f"{stem}.{p}.{leaf}" for p in parts]
        if all(n in state_dict for n in names):
            out[f"{stem}.{fused}.{leaf}"] = torch.cat([state_dict[n] for n in names], dim=0)  # (sum of rows, ...)
            for n in names:
                del out[n]
    return out


# Hugging Face's activation names -> the course's (companion.blocks names its functions).
# GPT-2's "gelu_new" and "gelu_pytorch_tanh" are GELU's tanh approximation; "gelu" is the exact (erf) GELU.
_HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
                   "silu": "silu", "swish": "silu"}


def activation_from_hf(name: str, supported: tuple[str, ...] | None = None) -> str:
    """The course's activation name for a Hugging Face one (``hidden_act``, ``activation_function``).

    ``supported`` limits the answer to what a model implements (its config check
    would refuse the rest); the error names the Hugging Face names it accepts.
    """
    allowed = {k: v for k, v in _HF_ACTIVATIONS.items() if supported is None or v in supported}
    if name not in allowed:
        raise ValueError(f"unsupported Hugging Face activation {name!r}; expected one of {sorted(allowed)}")
    return allowed[name]
