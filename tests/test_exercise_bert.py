"""Exercises 7.5 (your BERT) and 7.6 (pre-train it): the solution scores full marks and each plausible
mistake loses the case that concerns it with a message naming it, here and through the instructor's
grader (the student's objects in another process)."""

import json
import math
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from companion.grading import get_exercise, run_exercise

ROOT = Path(__file__).resolve().parents[1]


def cells() -> dict[str, str]:
    """The solution notebook's code cells that define bert_embeddings, mlm_mask, MyBERT and train_mlm."""
    nb = json.loads((ROOT / "solutions" / "ch07_bert.ipynb").read_text())
    found = {}
    for c in nb["cells"]:
        src = "".join(c["source"])
        for name in ("def bert_embeddings", "def mlm_mask", "class MyBERT", "def train_mlm"):
            if c["cell_type"] == "code" and name in src:
                found[name.split()[1]] = src
    return found


def source(**edits: tuple[tuple[str, str], ...]) -> str:
    found = cells()
    for name, pairs in edits.items():
        for old, new in pairs:
            assert found[name].count(old) == 1, old
            found[name] = found[name].replace(old, new)
    return "\n\n".join(found[n] for n in ("bert_embeddings", "mlm_mask", "MyBERT", "train_mlm"))


def build(src: str):
    scope = {"torch": torch, "nn": nn, "F": F, "math": math}
    exec(compile(src, "<cells 7.5-7.6>", "exec"), scope)
    return scope


def results(ex_id: str, src: str) -> dict[str, tuple[bool, str]]:
    scope = build(src)
    ex = get_exercise(ex_id)
    res = run_exercise(ex, *(scope[t] for t in ex.targets))
    return {c.name: (c.passed, c.message) for c in res.cases}


MATCHES = "MLM logits equal the reference (B=2, T=7, D=20, H=5, F=37)"
PADDING = "padded rows: equal at the real tokens"
TIED = "the MLM head is tied to the token embedding"
LAYOUT = "parameter names and shapes of the chapter's MiniBert"
STEPS = "the loop updates the weights"
BAND = "300 steps bring the held-out masked-token loss below 5.6"


def test_your_bert_solution_scores_full_marks():
    got = results("7.5", source())
    assert all(p for p, _ in got.values()), got


@pytest.mark.parametrize("edits, failing, kept, message", [
    ({"MyBERT": (("scores = scores.masked_fill(keep[:, None, None, :] == 0, float(\"-inf\"))", "pass"),)},
     PADDING, MATCHES, "MLM logits at the real tokens (B=3, T=9"),
    ({"MyBERT": (("self.tok_emb = tok_emb  # the embedding module itself: tied",
                  "self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)"),)},
     TIED, MATCHES, "an MLM head with its own (V, D) matrix"),
    ({"MyBERT": (("x = self.norm1(x + self.drop(self.self_attn(x, keep)))", "x = x + self.self_attn(self.norm1(x), keep)"),
                 ("return self.norm2(x + self.drop(self.ffn(x)))", "return x + self.ffn(self.norm2(x))"))},
     MATCHES, LAYOUT, "differs from the reference"),
    ({"MyBERT": (("nn.GELU()", "nn.GELU(approximate=\"tanh\")"),)}, MATCHES, TIED, "differs from the reference"),
    ({"MyBERT": (("self.ffn = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model))",
                  "self.up, self.down = nn.Linear(cfg.d_model, cfg.d_ff), nn.Linear(cfg.d_ff, cfg.d_model)\n"
                  "        self.ffn = lambda x: self.down(F.gelu(self.up(x)))"),)},
     LAYOUT, None, "missing ['blocks.0.ffn.0.bias'"),
])
def test_each_bert_mistake_fails_with_a_message_naming_it(edits, failing, kept, message):
    got = results("7.5", source(**edits))
    passed, text = got[failing]
    assert not passed and message in text, (failing, text)
    if kept is not None:
        assert got[kept][0], got[kept]


def test_a_loop_that_never_steps_fails_at_once_saying_so():
    src = source(train_mlm=(("        optimizer.step()\n", ""),))
    start = time.monotonic()
    got = results("7.6", src)
    assert time.monotonic() - start < 20  # the 300-step case stops after its 3-step probe
    for name in (STEPS, BAND):
        passed, text = got[name]
        assert not passed and "never updates the model; call optimizer.step()" in text, text
    assert got["returns one finite loss per step"][0]


@pytest.mark.parametrize("edit", [
    ("logits = model(masked, torch.zeros_like(masked), keep)",  # reads the originals: learns to copy its input
     "logits = model(ids, torch.zeros_like(ids), keep)"),
    ("        optimizer.zero_grad()\n", ""),  # gradients pile up: this run ended at 10.4 nats
])
def test_a_loop_that_trains_wrongly_misses_the_band(edit):
    # 300 steps each, about 10-35 s
    got = results("7.6", source(train_mlm=(edit,)))
    assert got[STEPS][0]
    passed, text = got[BAND]
    assert not passed and "the held-out masked-token loss is" in text and "below 5.6" in text, text


def test_the_instructor_grader_scores_your_bert_and_a_loop_that_never_steps(tmp_path):
    from companion_grader.instructor import Limits, _Session

    (tmp_path / "submission.ipynb").write_text("{}")
    code = ("import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
            + source(train_mlm=(("        optimizer.step()\n", ""),)))
    s = _Session(tmp_path, [(0, code)], Limits(cell_seconds=60), deadline=time.monotonic() + 120)
    s.ready()
    try:
        res = run_exercise(get_exercise("7.5"), *s.targets(("MyBERT",)))
        assert res.earned == res.points, [(c.name, c.message) for c in res.cases if not c.passed]
        res = run_exercise(get_exercise("7.6"), *s.targets(("MyBERT", "train_mlm")))
        by_name = {c.name: c for c in res.cases}
        assert by_name["returns one finite loss per step"].passed
        for name in (STEPS, BAND):
            assert not by_name[name].passed and "call optimizer.step()" in by_name[name].message
    finally:
        s.stop()
