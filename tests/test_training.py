"""companion.training.train: resumable checkpoints (torch.distributed.checkpoint) in one process.

The two-process (torchrun) runs of the same loop are in tests/test_distributed.py.
"""

from __future__ import annotations

import pytest
import torch

from companion.training import TrainConfig, latest_checkpoint, lm_loss, train
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
