"""Exercise 11.6 (Your T5): the solution scores full marks, plausible wrong T5s fail with the right message,
in the learner's kernel and through the instructor's grader (the student's objects behind proxies)."""

import json
import math
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from companion.grading import get_exercise, run_exercise
from companion_grader.instructor import Limits, _Session

ROOT = Path(__file__).resolve().parents[1]
CELLS = ["".join(c["source"]) for c in json.loads((ROOT / "solutions/ch11_t5_bart.ipynb").read_text())["cells"]
         if c["cell_type"] == "code"]
PIECES = "\n\n".join(next(s for s in CELLS if f"def {name}(" in s) for name in ("span_corrupt", "t5_attention"))
MODEL = next(s for s in CELLS if "class MyT5" in s)


def swap(old, new, source=MODEL):
    assert source.count(old) >= 1, old
    return source.replace(old, new)


# Plausible wrong T5s: the case that must fail, a phrase its message must contain, and the changed source.
WRONG = {
    "scaled scores": (  # divides q k^T by sqrt(d_kv) (both attentions, as a student's one attention function would)
        "logits equal the reference", "divides the scores by sqrt(d_kv)",
        "def scaled_attention(q, k, v, bias, mask):\n    return t5_attention(q / q.shape[-1] ** 0.5, k, v, bias, mask)\n\n\n"
        + MODEL.replace("t5_attention(heads(q)", "scaled_attention(heads(q)").replace("t5_attention(q, ", "scaled_attention(q, ")),
    "mean-subtracting norm": (
        "logits equal the reference", "mean-subtracting LayerNorm",
        swap("return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)",
             "x = x - x.mean(-1, keepdim=True)\n    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)")),
    "bidirectional decoder buckets": (
        "logits equal the reference", "bidirectional buckets",
        swap("relative_bucket(pos[None, :] - pos[:, None], not self.causal,",
             "relative_bucket(pos[None, :] - pos[:, None], True,")),
    "a table in every layer": (  # the bias recomputed per layer from a table of its own
        "names and shapes", "one table per stack",
        swap("        self.norm1 = nn.Parameter(torch.ones(d_model))\n",
             "        self.norm1 = nn.Parameter(torch.ones(d_model))\n"
             "        self.rel, self.causal = nn.Embedding(8, n_heads), cross\n",
             swap("        x = x + self.o(merge(t5_attention(heads(q), heads(k), heads(v), bias, mask)))",
                  "        pos = torch.arange(T)\n"
                  "        bias = self.rel(relative_bucket(pos[None, :] - pos[:, None], not self.causal, 8, 12)).permute(2, 0, 1)\n"
                  "        x = x + self.o(merge(t5_attention(heads(q), heads(k), heads(v), bias, mask)))",
                  swap("        self.rel = nn.Embedding(cfg.n_buckets, cfg.n_heads)", "        pass")))),
    "bias in the first layer only": (
        "one position bias per stack", "first layer only",
        swap("        for layer in self.layers:\n            x = layer(x, bias, mask, memory, memory_mask)",
             "        for i, layer in enumerate(self.layers):\n"
             "            x = layer(x, bias if i == 0 else 0.0, mask, memory, memory_mask)")),
    "no causal mask": (
        "the decoder is causal", "must be causal",
        swap("causal = torch.ones(T, T, dtype=torch.bool, device=input_ids.device).tril()",
             "causal = torch.ones(T, T, dtype=torch.bool, device=input_ids.device)")),
    "tied head not rescaled": (
        "logits equal the reference", "rescale the tied head",
        swap("return (h * self.d_model ** -0.5) @ self.emb.weight.T", "return h @ self.emb.weight.T")),
    "untied head rescaled": (
        "an untied head", "without the d_model**-0.5",
        swap("return self.lm_head(h)", "return self.lm_head(h * self.d_model ** -0.5)")),
}


def objects(model_source, pieces=PIECES):
    ns = {"math": math, "torch": torch, "nn": nn}
    exec(pieces, ns)
    exec(model_source, ns)
    return ns["MyT5"], ns["span_corrupt"]


def results(*students):
    return {case.name: case for case in run_exercise(get_exercise("11.6"), *students).cases}


def test_the_solution_scores_full_marks():
    res = run_exercise(get_exercise("11.6"), *objects(MODEL))
    assert res.earned == res.exercise.points == 10, res.cases


@pytest.mark.parametrize("name", WRONG)
def test_a_wrong_t5_fails_with_a_message_that_says_why(name):
    case_start, phrase, source = WRONG[name]
    cases = results(*objects(source))
    failed = {n: c.message for n, c in cases.items() if c.earned < c.points}
    hit = [n for n in failed if n.startswith(case_start)]
    assert hit, (name, failed)
    assert phrase in failed[hit[0]], (name, failed[hit[0]])


def test_a_wrong_span_corruption_fails_only_the_pipeline_case():
    pieces = swap("return replace_runs(noise), replace_runs([not m for m in noise])",
                  "return replace_runs(noise), replace_runs(noise)", PIECES)
    cases = results(*objects(MODEL, pieces))
    failed = {n: c.message for n, c in cases.items() if c.earned < c.points}
    assert list(failed) == ["your span corruption feeds your T5: the loss equals the reference's"], failed
    assert "span_corrupt's targets" in next(iter(failed.values()))


def test_the_generated_stub_scores_zero():
    cells = json.loads((ROOT / "exercises/ch11_t5_bart.ipynb").read_text())["cells"]
    stub = next("".join(c["source"]) for c in cells if "class MyT5" in "".join(c["source"]))
    assert "raise NotImplementedError" in stub
    res = run_exercise(get_exercise("11.6"), *objects(stub))
    assert res.earned == 0 and all("not implemented" in c.message for c in res.cases), res.cases


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    """A worker running the solution and the wrong T5s, as the instructor's grader runs a submission."""
    work = tmp_path_factory.mktemp("work")
    (work / "submission.ipynb").write_text("{}")
    header = "import math\nimport torch\nfrom torch import nn\n"
    cells = [(0, header + PIECES), (1, MODEL)]
    for i, name in enumerate(("scaled scores", "a table in every layer")):
        source = WRONG[name][2]
        for cls in ("T5Layer", "T5Stack", "MyT5"):  # its own names: a cell's classes replace earlier ones
            source = source.replace(cls, f"{cls}{i}")
        cells.append((2 + i, source))
    s = _Session(work, cells, Limits(cell_seconds=60), deadline=time.monotonic() + 120)
    s.ready()
    yield s
    s.stop()


def test_the_instructor_grader_scores_the_solution_and_the_wrong_t5s(remote):
    model, corrupt, wrong0, wrong1 = remote.targets(("MyT5", "span_corrupt", "MyT50", "MyT51"))
    res = run_exercise(get_exercise("11.6"), model, corrupt)
    assert res.earned == 10, res.cases
    cases = results(wrong0, corrupt)
    assert "divides the scores by sqrt(d_kv)" in cases[next(n for n in cases if n.startswith("logits equal"))].message
    cases = results(wrong1, corrupt)
    assert "one table per stack" in cases["names and shapes of the name map"].message


def test_the_solution_equals_hugging_face_t5_through_the_name_map():
    """The statement's name map reaches Hugging Face's T5 too: its weights, loaded by from_hf_t5 and renamed.

    Tied head only: how an untied head is configured differs between transformers 4 and 5 (the untied head
    is checked against the course's T5 in the exercise).
    """
    transformers = pytest.importorskip("transformers")
    from companion.grading.ch11 import t5_name_map
    from companion.models.t5 import from_hf_t5

    torch.manual_seed(0)
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=61, d_model=20, num_heads=3, d_kv=8, d_ff=36, num_layers=2, num_decoder_layers=3,
        relative_attention_num_buckets=8, relative_attention_max_distance=12, dropout_rate=0.0)).eval()
    course = from_hf_t5(hf)
    assert course.cfg.tie_embeddings and course.cfg.scale_output
    cls, _ = objects(MODEL)
    mine = cls(course.cfg).eval()
    sd = course.state_dict()
    mine.load_state_dict({ours: sd[theirs] for ours, theirs in t5_name_map(course.cfg).items()})
    g = torch.Generator().manual_seed(1)
    src = torch.randint(2, 61, (2, 15), generator=g)
    mask = torch.ones_like(src)
    mask[1, 9:] = 0
    src = src.masked_fill(mask == 0, 0)
    tgt_in = torch.cat([torch.zeros(2, 1, dtype=torch.long), torch.randint(2, 61, (2, 6), generator=g)], dim=1)
    with torch.no_grad():
        want = hf(input_ids=src, attention_mask=mask, decoder_input_ids=tgt_in).logits
        got = mine(src, tgt_in, mask)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
