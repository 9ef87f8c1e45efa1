"""Peak memory of the tensors a computation creates, measured on any device (CPU included).

``torch.cuda.max_memory_allocated`` exists only on GPUs, and the process's
resident size on a CPU moves in pages and includes the allocator's caches.
:func:`peak_tensor_bytes` instead watches every operator through a
``TorchDispatchMode``: each new storage an operator creates adds its size, and
the size is given back when the last tensor using that storage is freed. The
peak of that running total is the memory the computation needed on top of its
inputs: what FlashAttention's memory claim is about.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["peak_tensor_bytes"]


class _Tracker(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, list[int]] = {}  # storage address -> [bytes, number of live tensors]
        self.current = 0
        self.peak = 0

    def _release(self, ptr: int) -> None:
        entry = self.live.get(ptr)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self.live[ptr]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat_in = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        inputs = {id(x) for x in flat_in}
        input_ptrs = {x.untyped_storage().data_ptr() for x in flat_in}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or id(t) in inputs:
                continue
            storage = t.untyped_storage()
            ptr, size = storage.data_ptr(), storage.nbytes()
            if ptr not in self.live and ptr in input_ptrs:
                continue  # a view of a tensor that existed before: no new memory
            if ptr in self.live:
                self.live[ptr][1] += 1
            else:
                self.live[ptr] = [size, 1]
                self.current += size
                self.peak = max(self.peak, self.current)
            weakref.finalize(t, self._release, ptr)
        return out


def peak_tensor_bytes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """Run ``fn(*args, **kwargs)`` and return ``(result, peak bytes of the tensors it created)``.

    Tensors that exist before the call (the inputs) are not counted; the result's
    own storage is counted, since it was alive at the peak.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    tracker = _Tracker()
    with tracker:
        result = fn(*args, **kwargs)
    return result, tracker.peak
