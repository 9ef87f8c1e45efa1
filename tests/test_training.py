"""companion.training.train: resumable checkpoints (torch.distributed.checkpoint) in one process.

The two-process (torchrun) runs of the same loop are in tests/test_distributed.py.
"""

from __future__ import annotations

import pytest
import torch

from companion.training import TrainConfig, latest_checkpoint, lm_loss, make_optimizer, train
from resume_setup import Killed, evaluate, step_batch as get_batch, tiny_gpt

CFG = TrainConfig(steps=6, lr=1e-2, warmup_steps=2, eval_every=2)


def test_resumed_run_equals_an_uninterrupted_one(tmp_path):
    ref = tiny_gpt(0)
    hist_ref = train(ref, lm_loss, get_batch, CFG, eval_fn=evaluate, progress=False)

    def dies_at_step_4(step):
        if step == 4:
            raise Killed
        return get_batch(step)

    model = tiny_gpt(0)
    with pytest.raises(Killed):
        train(model, lm_loss, dies_at_step_4, CFG, eval_fn=evaluate, progress=False,
              checkpoint_dir=tmp_path, checkpoint_every=3)
    assert latest_checkpoint(tmp_path).name == "step_0000003"
    resumed = tiny_gpt(0)  # a fresh process: new weights, resumed from disk
    hist = train(resumed, lm_loss, get_batch, CFG, eval_fn=evaluate, progress=False,
                 checkpoint_dir=tmp_path, checkpoint_every=3, resume=True)
    for (name, p), q in zip(resumed.named_parameters(), ref.parameters()):
        assert torch.equal(p, q), name
    assert hist.steps == hist_ref.steps and hist.train_loss == hist_ref.train_loss
    assert hist.eval_steps == hist_ref.eval_steps and hist.eval_loss == hist_ref.eval_loss
    assert latest_checkpoint(tmp_path).name == "step_0000006"


def test_without_resume_the_checkpoint_is_ignored_and_arguments_are_checked(tmp_path):
    train(tiny_gpt(0), lm_loss, get_batch, CFG, progress=False, checkpoint_dir=tmp_path)
    assert latest_checkpoint(tmp_path).name == "step_0000006"  # the last step is always saved
    h = train(tiny_gpt(0), lm_loss, get_batch, CFG, progress=False)
    assert h.steps == list(range(6))
    with pytest.raises(ValueError, match="checkpoint_every needs a checkpoint_dir"):
        train(tiny_gpt(0), lm_loss, get_batch, CFG, progress=False, checkpoint_every=2)
    with pytest.raises(ValueError, match="resume=True needs"):
        train(tiny_gpt(0), lm_loss, get_batch, CFG, progress=False, resume=True)


def test_make_optimizer_decays_matrices_only_and_uses_the_fused_kernel_on_the_cpu():
    model = tiny_gpt(0)
    model.pos_emb.weight.requires_grad_(False)  # a frozen matrix is left out
    opt = make_optimizer(model, TrainConfig(lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95)))
    decay, no_decay = opt.param_groups
    trained = [p for p in model.parameters() if p.requires_grad]
    assert [id(p) for p in decay["params"]] == [id(p) for p in trained if p.dim() >= 2]
    assert [id(p) for p in no_decay["params"]] == [id(p) for p in trained if p.dim() < 2]
    assert no_decay["params"] and all(p is not model.pos_emb.weight for p in decay["params"])
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    assert all(g["fused"] and g["lr"] == 1e-3 and g["betas"] == (0.9, 0.95) for g in opt.param_groups)
    # a device without a fused kernel gets PyTorch's default
    assert make_optimizer(tiny_gpt(0).to("meta"), TrainConfig()).param_groups[0]["fused"] is None


def test_the_fused_step_equals_the_unfused_one_up_to_rounding():
    cfg = TrainConfig(lr=1e-2, weight_decay=0.1)
    fused, plain = tiny_gpt(0), tiny_gpt(0)
    opt_fused = make_optimizer(fused, cfg)
    matrices = [p for p in plain.parameters() if p.dim() >= 2]
    vectors = [p for p in plain.parameters() if p.dim() < 2]
    opt_plain = torch.optim.AdamW([{"params": matrices, "weight_decay": cfg.weight_decay},
                                   {"params": vectors, "weight_decay": 0.0}], lr=cfg.lr, betas=cfg.betas,
                                  foreach=False)  # the for-loop AdamW the loop used before
    for step in range(5):  # the same gradients for both, so only the update rule is compared
        opt_fused.zero_grad(set_to_none=True)
        lm_loss(fused, get_batch(step)).backward()
        for a, b in zip(fused.parameters(), plain.parameters()):
            b.grad = a.grad.clone()
        opt_fused.step()
        opt_plain.step()
    moved = [(a - a0).abs().max() for a, a0 in zip(fused.parameters(), tiny_gpt(0).parameters())]
    assert min(moved) > 1e-3  # every parameter moved: the comparison below is not vacuous
    for a, b in zip(fused.parameters(), plain.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
