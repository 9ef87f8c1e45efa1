"""Data, tensor and pipeline parallelism with ``torch.distributed``, small enough to read (Chapter 15).

Everything here runs for real on one machine: ``torchrun --nproc_per_node 2``
starts two CPU processes that talk through the ``gloo`` backend. The same code
runs on GPUs with the ``nccl`` backend and on many machines.

* **Data parallelism** (:func:`shard`, PyTorch's ``DistributedDataParallel``):
  every rank holds the whole model and a slice of the batch; after ``backward``
  the gradients are averaged across ranks (an all-reduce), so every rank takes
  the same step as one process would on the whole batch.
* **Tensor parallelism** (Megatron-LM, Shoeybi et al., 2019, section 3):
  :class:`ColumnParallelLinear` keeps a slice of a layer's *output* features and
  :class:`RowParallelLinear` a slice of its *input* features, whose partial
  products are summed by an all-reduce. An MLP split column-then-row
  (:class:`TensorParallelMLP`) needs one all-reduce in the forward pass.
* **Pipeline parallelism** (GPipe, Huang et al., 2019): :func:`pipeline_step`
  runs stage 0 of a model on rank 0 and stage 1 on rank 1, sending activations
  forward and their gradients back, micro-batch by micro-batch.

Shape legend: B batch, D model size, F hidden size, W world size (number of ranks).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .blocks import ACTIVATIONS, FeedForward

__all__ = ["init", "shard", "rank_batches", "ColumnParallelLinear", "RowParallelLinear", "TensorParallelMLP", "pipeline_step"]


def init(backend: str = "gloo") -> tuple[int, int]:
    """Join the process group ``torchrun`` prepared (its environment variables); returns ``(rank, world_size)``."""
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise RuntimeError(f"not launched by torchrun: environment variables {missing} are missing "
                           "(start with `torchrun --nproc_per_node 2 your_script.py`)")
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def shard(x: torch.Tensor, rank: int, world: int, dim: int = 0) -> torch.Tensor:
    """Rank ``rank``'s contiguous slice of ``x`` along ``dim`` (which must divide evenly by ``world``)."""
    if x.shape[dim] % world:
        raise ValueError(f"dimension {dim} of size {x.shape[dim]} does not split into {world} equal shards")
    return x.chunk(world, dim=dim)[rank]


def rank_batches(get_batch: Callable[[int], Any], rank: int, world: int) -> Callable[[int], Any]:
    """``get_batch(step)`` of the whole batch -> a function giving rank ``rank``'s slice of it.

    The batch may be a tensor or a tuple/list of tensors, each sliced along its
    first axis (which must divide by ``world``). Every rank computes the same
    global batch (same seed, or a function of ``step``) and keeps its share, so
    :func:`companion.training.train` under ``torchrun`` takes the steps one
    process takes on the whole batch (the role ``DistributedSampler`` plays for a ``DataLoader``).
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank must lie in [0, world={world}), got {rank}")

    def get_rank_batch(step: int):
        batch = get_batch(step)
        if isinstance(batch, torch.Tensor):
            return shard(batch, rank, world)
        if isinstance(batch, (tuple, list)) and all(isinstance(x, torch.Tensor) for x in batch):
            return type(batch)(shard(x, rank, world) for x in batch)
        raise TypeError(f"get_batch must return a tensor or a tuple of tensors, got {type(batch).__name__}")

    return get_rank_batch


class _AllReduceSum(torch.autograd.Function):
    """Sum over ranks in the forward pass; the gradient (the same on every rank) passes through unchanged."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class _CopyToParallel(torch.autograd.Function):
    """Identity forward; the gradient is summed over ranks (each rank's slice contributed a part)."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class _GatherLastDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return shard(grad, dist.get_rank(), dist.get_world_size(), dim=-1).contiguous()


class ColumnParallelLinear(nn.Module):
    """The rows of ``full.weight`` (output features) of this rank: ``y_r = x W_r^T + b_r``, (..., out / W).

    With ``gather=True`` the slices of all ranks are concatenated into the full output.
    """

    def __init__(self, full: nn.Linear, rank: int, world: int, *, gather: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(shard(full.weight.detach(), rank, world, dim=0).clone())
        self.bias = None if full.bias is None else nn.Parameter(shard(full.bias.detach(), rank, world).clone())
        self.gather = gather

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.linear(_CopyToParallel.apply(x), self.weight, self.bias)
        return _GatherLastDim.apply(y) if self.gather else y


class RowParallelLinear(nn.Module):
    """The columns of ``full.weight`` (input features) of this rank: partial products summed over ranks.

    Takes this rank's slice of the input, (..., in / W); returns the full output (..., out),
    the same on every rank. The bias is added once, after the sum.
    """

    def __init__(self, full: nn.Linear, rank: int, world: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(shard(full.weight.detach(), rank, world, dim=1).clone())
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone())

    def forward(self, x_local: torch.Tensor) -> torch.Tensor:
        y = _AllReduceSum.apply(nn.functional.linear(x_local, self.weight))
        return y if self.bias is None else y + self.bias


class TensorParallelMLP(nn.Module):
    """A :class:`~companion.blocks.FeedForward` split over the ranks: ``up`` by columns, ``down`` by rows.

    Each rank computes ``F / W`` of the hidden units; one all-reduce in ``down``
    sums the partial outputs. Equal to the unsplit network (forward and gradients).
    """

    def __init__(self, ffn: FeedForward, rank: int, world: int) -> None:
        super().__init__()
        self.activation = ffn.activation
        self.up = ColumnParallelLinear(ffn.up, rank, world)
        self.down = RowParallelLinear(ffn.down, rank, world)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(ACTIVATIONS[self.activation](self.up(x)))


def pipeline_step(stage: nn.Module, rank: int, micro_batches: list[torch.Tensor], loss_fn=None,
                  targets: list[torch.Tensor] | None = None, *, activation_shape: tuple[int, ...] | None = None):
    """One GPipe step over two ranks: all micro-batches forward, then all backward.

    Rank 0 holds the first ``stage`` and the inputs; it sends each micro-batch's
    activations (of ``activation_shape``) to rank 1 and later receives their
    gradients. Rank 1 holds the second stage, computes ``loss_fn(out, target)``
    per micro-batch (averaged over micro-batches), backpropagates, and sends the
    activation gradients back. Returns the mean loss on rank 1, ``None`` on rank 0;
    gradients are left in ``stage``'s parameters on both ranks.
    """
    if dist.get_world_size() != 2:
        raise RuntimeError(f"pipeline_step runs on exactly 2 ranks, got {dist.get_world_size()}")
    n = len(micro_batches)
    if rank == 0:
        outs = []
        for x in micro_batches:  # forward of every micro-batch
            y = stage(x)
            dist.send(y.detach().contiguous(), dst=1)
            outs.append(y)
        for y in outs:  # then backward, as the gradients come back
            grad = torch.empty_like(y)
            dist.recv(grad, src=1)
            y.backward(grad)
        return None
    if loss_fn is None or targets is None or activation_shape is None:
        raise ValueError("rank 1 needs loss_fn, targets and activation_shape")
    losses, inputs = [], []
    for _ in range(n):
        h = torch.empty(activation_shape)
        dist.recv(h, src=0)
        h.requires_grad_(True)
        inputs.append(h)
        losses.append(loss_fn(stage(h), targets[len(inputs) - 1]) / n)
    for h, loss in zip(inputs, losses):
        loss.backward()
        dist.send(h.grad.contiguous(), dst=0)
    return sum(l.detach() for l in losses)
