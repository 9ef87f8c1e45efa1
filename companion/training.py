"""One small training loop for every chapter that trains a model.

The loop is deliberately plain: AdamW (:func:`make_optimizer`), optional linear warm-up then cosine
decay, gradient clipping, periodic evaluation and a progress bar. Chapters
pass a ``loss_fn(model, batch)`` and a ``get_batch(step)`` so the same loop
trains a GPT, an encoder-decoder or a positional-encoding experiment.

The same loop scales out with PyTorch's own tools (Chapter 15). Launched by
``torchrun --nproc_per_node N`` after ``torch.distributed.init_process_group``
(:func:`companion.distributed.init`), it wraps the model in
``DistributedDataParallel`` (gradients averaged over ranks after ``backward``),
expects ``get_batch(step)`` to return *this rank's* share of the step's batch
(:func:`companion.distributed.rank_batches` slices a global batch; a
``DistributedSampler`` does the same for a ``DataLoader``), records the loss
averaged over ranks, evaluates and shows progress on rank 0 only. With
``checkpoint_dir`` it saves model, optimizer and history with
``torch.distributed.checkpoint`` every ``checkpoint_every`` steps, and with
``resume=True`` continues from the latest one: when ``get_batch(step)``
depends on ``step`` only (no hidden generator state) and the model draws no
random numbers (dropout 0), the resumed run equals an uninterrupted one.

On a GPU pass ``device`` (:func:`companion.device.pick_device`): the model
and every batch ``get_batch`` returns are moved there; ``eval_fn`` receives
the model on that device and moves its own data. ``mixed_precision=True``
runs the forward pass and the loss under autocast in the dtype the device
supports (:func:`companion.device.mixed_precision`: bf16, or fp16 with a
``GradScaler`` on GPUs without bf16). Without them the loop does exactly
what it did on the CPU.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ._checks import check_positive_int
from .device import mixed_precision as _mixed_precision
from .device import to_device

__all__ = ["TrainConfig", "History", "lr_at", "weight_decay_groups", "make_optimizer", "train", "lm_loss",
           "latest_checkpoint"]


def lm_loss(model: Callable[[torch.Tensor], torch.Tensor], batch: tuple[torch.Tensor, torch.Tensor], *, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy (nats per token) of a language model on ``(x, y)``, both ``(B, T)``.

    ``model(x)`` gives logits ``(B, T, V)``; ``y[b, t]`` is the token after ``x[b, t]``.
    ``reduction="none"`` gives the loss per position, shape ``(B, T)``. This is the
    ``loss_fn`` of :func:`train` for every language model of the course.
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    x, y = batch
    logits = model(x)  # (B, T, V)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction=reduction)
    return loss.view_as(y) if reduction == "none" else loss


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000  # optimizer steps
    lr: float = 3e-3  # peak learning rate
    warmup_steps: int = 0  # linear warm-up from 0 to lr
    cosine: bool = True  # cosine decay to min_lr_ratio * lr after warm-up
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float | None = 1.0  # max global gradient norm, None = no clipping
    eval_every: int = 100  # steps between evaluations (and at the last step)

    def __post_init__(self) -> None:
        check_positive_int("steps", self.steps)
        check_positive_int("eval_every", self.eval_every)
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not 0 <= self.warmup_steps <= self.steps:
            raise ValueError(f"warmup_steps must lie in [0, steps={self.steps}], got {self.warmup_steps}")


@dataclass
class History:
    """Losses recorded by :func:`train`."""

    steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)  # one per step
    eval_steps: list[int] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)  # before clipping

    @property
    def final_eval(self) -> float:
        if not self.eval_loss:
            raise ValueError("no evaluation was recorded: pass eval_fn to train()")
        return self.eval_loss[-1]


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate at ``step`` (0-based): linear warm-up, then cosine decay or constant."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if not cfg.cosine:
        return cfg.lr
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    ratio = cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return cfg.lr * ratio


# Devices with a fused AdamW kernel in every PyTorch the course supports (CPU since 2.4).
_FUSED_ADAMW_DEVICES = ("cpu", "cuda")


def weight_decay_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Optimizer parameter groups: the trainable matrices with ``weight_decay``, the 1-D parameters without.

    Biases, norms' gains and other 1-D parameters take no weight decay (as in
    GPT-2 and nanoGPT).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """The AdamW of :func:`train`: :func:`weight_decay_groups`, ``cfg``'s learning rate and betas.

    On the CPU and on CUDA the update is PyTorch's fused
    kernel, one pass over each parameter instead of a dozen element-wise ops:
    the same AdamW step, about three times faster, equal to the unfused one up to
    float32 rounding (and independent of the thread count).
    """
    groups = weight_decay_groups(model, cfg.weight_decay)
    params = [p for g in groups for p in g["params"]]
    fused = bool(params) and all(p.device.type in _FUSED_ADAMW_DEVICES and p.is_floating_point() for p in params)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, fused=fused or None)


def _world() -> tuple[int, int]:
    """(rank, world size) of the process group, (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def latest_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The newest complete checkpoint under ``checkpoint_dir`` (named by the file ``latest``), or None."""
    marker = Path(checkpoint_dir) / "latest"
    return Path(checkpoint_dir) / marker.read_text().strip() if marker.is_file() else None


def _checkpoint_state(model: nn.Module, opt: torch.optim.Optimizer, step: int, hist: History) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, opt)  # plain parameter names, also for a DDP-wrapped model
    return {"model": model_sd, "optim": optim_sd, "progress": {"step": step, "history": asdict(hist)}}


def _save_checkpoint(checkpoint_dir: Path, model: nn.Module, opt, step: int, hist: History) -> None:
    import torch.distributed.checkpoint as dcp

    rank, world = _world()
    name = f"step_{step:07d}"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(_checkpoint_state(model, opt, step, hist), checkpoint_id=checkpoint_dir / name, no_dist=world == 1)
    if world > 1:
        dist.barrier()  # every rank has written its part
    if rank == 0:  # the marker is written last: a run killed mid-save resumes from the previous checkpoint
        tmp = checkpoint_dir / "latest.tmp"
        tmp.write_text(name)
        tmp.replace(checkpoint_dir / "latest")
    if world > 1:
        dist.barrier()


def _load_checkpoint(path: Path, model: nn.Module, opt) -> tuple[int, History]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _checkpoint_state(model, opt, 0, History())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=path, no_dist=_world()[1] == 1)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    names = {f.name for f in fields(History)}
    return int(state["progress"]["step"]), History(**{k: list(v) for k, v in state["progress"]["history"].items() if k in names})


def train(
    model: nn.Module,
    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
    get_batch: Callable[[int], Any],
    cfg: TrainConfig,
    *,
    eval_fn: Callable[[nn.Module], float] | None = None,
    progress: bool = True,
    desc: str = "training",
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int | None = None,
    resume: bool = False,
    device: str | torch.device | None = None,
    mixed_precision: bool = False,
) -> History:
    """Train ``model`` for ``cfg.steps`` steps and return its :class:`History`.

    ``get_batch(step)`` returns a batch, ``loss_fn(model, batch)`` a scalar
    loss, ``eval_fn(model)`` (optional, called in eval mode without gradients)
    a held-out loss. A non-finite loss stops training with a ``FloatingPointError``.

    In a ``torch.distributed`` process group (``torchrun``) the model is trained
    through ``DistributedDataParallel`` and ``get_batch(step)`` gives this rank's
    share of the batch; the recorded loss is the mean over ranks, ``eval_fn`` runs
    on rank 0 and its result is sent to every rank (see the module docstring).
    ``checkpoint_dir``, ``checkpoint_every`` (steps) and ``resume`` save and
    resume with ``torch.distributed.checkpoint``; the last step is always saved.
    ``device`` moves the model and each batch there; ``mixed_precision`` autocasts
    the forward pass and the loss as the device supports (see the module docstring).
    """
    from tqdm.auto import tqdm

    rank, world = _world()
    if checkpoint_every is not None:
        check_positive_int("checkpoint_every", checkpoint_every)
        if checkpoint_dir is None:
            raise ValueError("checkpoint_every needs a checkpoint_dir")
    if resume and checkpoint_dir is None:
        raise ValueError("resume=True needs a checkpoint_dir")
    ckpt_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
    if ckpt_dir is not None and rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
    if device is not None:
        device = torch.device(device)
        model.to(device)
    if mixed_precision:
        if device is None:
            device = next(model.parameters()).device
        precision = _mixed_precision(device)
    else:
        precision = _mixed_precision("cpu")  # fp32: no autocast, no loss scale
    scaler = precision.grad_scaler()

    opt = make_optimizer(model, cfg)
    hist, start = History(), 0
    if resume and latest_checkpoint(ckpt_dir) is not None:
        start, hist = _load_checkpoint(latest_checkpoint(ckpt_dir), model, opt)
    # One process: the model itself. Several: DDP averages the gradients over ranks during backward.
    net = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model)
    bar = tqdm(range(start, cfg.steps), desc=desc, disable=not progress or rank != 0, mininterval=1.0,
               initial=start, total=cfg.steps)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        model.train()
        with precision.autocast():
            loss = loss_fn(net, to_device(get_batch(step), device))
        logged = loss.detach().clone()
        if world > 1:
            dist.all_reduce(logged)  # the mean over ranks is the loss of the whole batch
            logged /= world
        if not torch.isfinite(logged):
            raise FloatingPointError(f"loss became {logged.item()} at step {step}")
        opt.zero_grad(set_to_none=True)
        # fp16 scales the loss, unscales the gradients before clipping and skips overflowed steps;
        # otherwise the scaler is disabled and each call passes straight through.
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        max_norm = cfg.grad_clip if cfg.grad_clip is not None else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)
        scaler.update()
        hist.steps.append(step)
        hist.train_loss.append(logged.item())
        hist.grad_norm.append(float(norm))
        if eval_fn is not None and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
            model.eval()
            value = torch.zeros((), dtype=torch.float64, device=device if world > 1 else None)  # NCCL: a GPU tensor
            if rank == 0:
                with torch.no_grad():
                    value.fill_(float(eval_fn(model)))
            if world > 1:
                dist.broadcast(value, src=0)
            hist.eval_steps.append(step + 1)
            hist.eval_loss.append(value.item())
            bar.set_postfix(train=f"{logged.item():.3f}", eval=f"{hist.eval_loss[-1]:.3f}")
        if ckpt_dir is not None and ((checkpoint_every and (step + 1) % checkpoint_every == 0) or step + 1 == cfg.steps):
            _save_checkpoint(ckpt_dir, model, opt, step + 1, hist)
    model.eval()
    return hist
