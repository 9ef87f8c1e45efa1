"""Run by tests/test_distributed.py under ``torchrun --nproc_per_node 2``; writes one JSON per rank.

Each check compares a parallel computation with the same computation done in
one process (recomputed here on every rank from the same seed).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from companion.blocks import FeedForward
from companion.distributed import (ColumnParallelLinear, RowParallelLinear, TensorParallelMLP, init, pipeline_step,
                                   rank_batches, shard)
from companion.training import TrainConfig, latest_checkpoint, lm_loss, train
from resume_setup import Killed, evaluate, step_batch as global_batch, tiny_gpt  # (tests/ is sys.path[0] under torchrun)


def max_diff(a, b):
    return float((a - b).abs().max())


def data_parallel(rank, world):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    single = copy.deepcopy(model)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    ddp = DDP(model)
    opt_ddp = torch.optim.SGD(ddp.parameters(), lr=0.1)
    opt_single = torch.optim.SGD(single.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(3):
        opt_ddp.zero_grad()
        loss_fn(ddp(shard(x, rank, world)), shard(y, rank, world)).backward()  # gradients averaged by DDP
        opt_ddp.step()
        opt_single.zero_grad()
        loss_fn(single(x), y).backward()  # the whole batch in one process
        opt_single.step()
    return max(max_diff(a, b) for a, b in zip(model.parameters(), single.parameters()))


def tensor_parallel(rank, world):
    torch.manual_seed(1)
    full = nn.Linear(8, 12)
    x = torch.randn(5, 8, requires_grad=True)
    col = ColumnParallelLinear(full, rank, world, gather=True)
    out = {"column": max_diff(col(x), full(x))}
    row = RowParallelLinear(full, rank, world)
    out["row"] = max_diff(row(shard(x, rank, world, dim=-1)), full(x))
    ffn = FeedForward(8, 20, activation="gelu")
    tp = TensorParallelMLP(ffn, rank, world)
    xa = x.detach().clone().requires_grad_(True)
    xb = x.detach().clone().requires_grad_(True)
    ya, yb = tp(xa), ffn(xb)
    out["mlp"] = max_diff(ya, yb)
    ya.sum().backward()
    yb.sum().backward()
    out["mlp_input_grad"] = max_diff(xa.grad, xb.grad)
    out["mlp_up_grad"] = max_diff(tp.up.weight.grad, shard(ffn.up.weight.grad, rank, world, dim=0))
    out["mlp_down_grad"] = max_diff(tp.down.weight.grad, shard(ffn.down.weight.grad, rank, world, dim=1))
    return out


def pipeline(rank, world):
    torch.manual_seed(2)
    stages = [nn.Sequential(nn.Linear(6, 10), nn.ReLU()), nn.Linear(10, 3)]
    full = nn.Sequential(*copy.deepcopy(stages))
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    loss_fn = nn.CrossEntropyLoss()
    micro_x, micro_y = list(x.chunk(4)), list(y.chunk(4))
    loss = pipeline_step(stages[rank], rank, micro_x, loss_fn, micro_y, activation_shape=(2, 10))
    ref = sum(loss_fn(full(a), b) for a, b in zip(micro_x, micro_y)) / 4
    ref.backward()
    grads = max(max_diff(p.grad, q.grad) for p, q in zip(stages[rank].parameters(), full[rank].parameters()))
    return {"grad": grads, "loss": None if loss is None else abs(float(loss) - float(ref))}


TRAIN = TrainConfig(steps=6, lr=1e-2, warmup_steps=2, eval_every=2)


def training_loop(rank, world, ckpt_dir):
    """companion.training.train under torchrun against one process on the whole batch; then kill and resume."""
    single = tiny_gpt(3)
    dist.barrier()
    # The one-process reference, computed on every rank with the process group hidden from train().
    hist_single = _without_group(lambda: train(single, lm_loss, global_batch, TRAIN, eval_fn=evaluate, progress=False))
    ddp = tiny_gpt(3)
    hist = train(ddp, lm_loss, rank_batches(global_batch, rank, world), TRAIN, eval_fn=evaluate, progress=False)
    out = {"weights": max(max_diff(p, q) for p, q in zip(ddp.parameters(), single.parameters())),
           "train_loss": max(abs(a - b) for a, b in zip(hist.train_loss, hist_single.train_loss)),
           "eval_loss": max(abs(a - b) for a, b in zip(hist.eval_loss, hist_single.eval_loss)),
           "n_steps": len(hist.steps)}

    def dies_at_step_4(step):
        if step == 4:
            raise Killed
        return rank_batches(global_batch, rank, world)(step)

    try:
        train(tiny_gpt(3), lm_loss, dies_at_step_4, TRAIN, eval_fn=evaluate, progress=False,
              checkpoint_dir=ckpt_dir, checkpoint_every=3)
    except Killed:
        pass
    out["saved_at"] = latest_checkpoint(ckpt_dir).name
    resumed = tiny_gpt(3)
    hist_r = train(resumed, lm_loss, rank_batches(global_batch, rank, world), TRAIN, eval_fn=evaluate,
                   progress=False, checkpoint_dir=ckpt_dir, checkpoint_every=3, resume=True)
    out["resumed_weights"] = max(max_diff(p, q) for p, q in zip(resumed.parameters(), ddp.parameters()))
    out["resumed_history_equal"] = hist_r.train_loss == hist.train_loss and hist_r.eval_loss == hist.eval_loss
    return out


def _without_group(fn):
    import companion.training as training

    real = training._world
    training._world = lambda: (0, 1)
    try:
        return fn()
    finally:
        training._world = real


def main():
    rank, world = init("gloo")
    result = {"rank": rank, "world": world, "data_parallel": data_parallel(rank, world),
              "tensor_parallel": tensor_parallel(rank, world), "pipeline": pipeline(rank, world),
              "training_loop": training_loop(rank, world, Path(sys.argv[1], "ckpt"))}
    Path(sys.argv[1], f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
