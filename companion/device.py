"""Where the course computes: one device for a whole notebook, and the mixed precision it supports.

:func:`pick_device` chooses the first of CUDA, Apple's MPS and the CPU that is
present; the environment variable ``COMPANION_DEVICE`` (``cpu``, ``cuda``,
``cuda:1``, ``mps``) overrides the choice, so a learner or a test run can force
one. :func:`mixed_precision` says what a training step on that device should
autocast to (Chapter 15):

* a GPU with bf16 units (NVIDIA compute capability 8.0 and later: A100, H100,
  RTX 30xx): bf16, which keeps fp32's range and needs no loss scale;
* an older GPU (a T4 is 7.5, Colab's free GPU): fp16 with a dynamic loss scale
  (``torch.amp.GradScaler``), since small gradients underflow in fp16;
* the CPU and MPS: fp32 (no autocast). bf16 autocast on a CPU is offered on
  request (``cpu_bf16=True``): it pays only on CPUs with bf16 instructions.

:func:`to_device` moves a batch (a tensor, or tuples, lists, dicts and
dataclasses of them) to a device. On the CPU every helper here is a no-op, so
a chapter run on a CPU computes exactly what it did before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any

import torch

__all__ = ["ENV_VAR", "pick_device", "MixedPrecision", "mixed_precision", "to_device", "synchronize"]

ENV_VAR = "COMPANION_DEVICE"  # overrides pick_device()'s choice, e.g. COMPANION_DEVICE=cpu


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return mps is not None and mps.is_available()


def _available(device: torch.device) -> bool:
    if device.type == "cpu":
        return True
    if device.type == "cuda":
        return torch.cuda.is_available() and (device.index is None or device.index < torch.cuda.device_count())
    if device.type == "mps":
        return _mps_available()
    return device.type == "meta"  # placement tests build models on the meta device


def pick_device(name: str | torch.device | None = None) -> torch.device:
    """The device to compute on: ``name``, else ``$COMPANION_DEVICE``, else CUDA, then MPS, then the CPU.

    A device asked for by name (argument or environment) must be present:
    ``COMPANION_DEVICE=cuda`` on a machine without a GPU raises a ``RuntimeError``
    rather than silently running on the CPU.
    """
    source = "pick_device's argument"
    if name is None and os.environ.get(ENV_VAR, "").strip():
        name, source = os.environ[ENV_VAR].strip(), f"${ENV_VAR}"
    if name is not None:
        try:
            device = torch.device(name)
        except (RuntimeError, TypeError):
            raise ValueError(f"{source} must name a device such as 'cpu', 'cuda', 'cuda:1' or 'mps', got {name!r}") from None
        if not _available(device):
            raise RuntimeError(f"{source} asks for device {str(device)!r}, which this machine does not have "
                               f"(CUDA available: {torch.cuda.is_available()}, MPS available: {_mps_available()})")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


@dataclasses.dataclass(frozen=True)
class MixedPrecision:
    """How a training step runs on one device: autocast dtype (None = fp32) and whether to scale the loss."""

    device_type: str  # "cuda", "mps", "cpu"
    dtype: torch.dtype | None  # torch.bfloat16, torch.float16, or None (no autocast, fp32)
    loss_scale: bool  # fp16 gradients need a dynamic loss scale (GradScaler)

    @property
    def enabled(self) -> bool:
        return self.dtype is not None

    def autocast(self):
        """The context to run the forward pass and the loss in (a no-op context for fp32)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler:
        """A ``GradScaler`` that scales only when needed (a disabled scaler passes everything through)."""
        return torch.amp.GradScaler(self.device_type if self.loss_scale else "cpu", enabled=self.loss_scale)


def _cuda_has_bf16(device: torch.device) -> bool:
    # Native bf16 tensor cores arrive with compute capability 8.0 (Ampere). torch.cuda.is_bf16_supported()
    # also answers True on older GPUs where bf16 is only emulated (slowly), so it is asked without emulation.
    if torch.version.hip is not None:  # ROCm reports its own capabilities
        return torch.cuda.is_bf16_supported()
    return torch.cuda.get_device_capability(device) >= (8, 0)


def mixed_precision(device: str | torch.device, *, cpu_bf16: bool = False) -> MixedPrecision:
    """The mixed precision that pays on ``device``: bf16 on recent GPUs, fp16 + loss scale on older ones, else fp32."""
    device = torch.device(device)
    if device.type == "cuda":
        if _cuda_has_bf16(device):
            return MixedPrecision("cuda", torch.bfloat16, loss_scale=False)
        return MixedPrecision("cuda", torch.float16, loss_scale=True)
    if device.type == "cpu" and cpu_bf16:
        return MixedPrecision("cpu", torch.bfloat16, loss_scale=False)
    return MixedPrecision(device.type, None, loss_scale=False)


def to_device(batch: Any, device: str | torch.device | None) -> Any:
    """``batch`` with every tensor moved to ``device``: tensors, tuples, lists, dicts and dataclasses of them.

    Anything else is returned as it is; ``device=None`` returns ``batch`` unchanged.
    """
    if device is None:
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(to_device(x, device) for x in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(x, device) for x in batch)
    if isinstance(batch, dict):
        return type(batch)((k, to_device(v, device)) for k, v in batch.items())
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(batch, **{f.name: to_device(getattr(batch, f.name), device)
                                             for f in dataclasses.fields(batch) if f.init})
    return batch


def synchronize(device: str | torch.device) -> None:
    """Wait for the device's queued work (GPUs run asynchronously): call before reading a clock."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
