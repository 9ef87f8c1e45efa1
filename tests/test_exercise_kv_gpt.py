"""Exercise 10.5 (your GPT with a KV cache): the solution scores full marks, each plausible mistake
loses the case that concerns it with a message naming the mistake, here and through the instructor's
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


def solution_source() -> str:
    nb = json.loads((ROOT / "solutions" / "ch10_generation.ipynb").read_text())
    return next("".join(c["source"]) for c in nb["cells"] if "class MyGPT" in "".join(c["source"]))


def variant(*edits: tuple[str, str]) -> str:
    src = solution_source()
    for old, new in edits:
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    return src


def build(src: str):
    scope = {"torch": torch, "nn": nn, "F": F, "math": math}
    exec(compile(src, "<cell 10.5>", "exec"), scope)
    return scope["MyGPT"], scope["generate_greedy"]


def results(src: str) -> dict[str, tuple[bool, str]]:
    res = run_exercise(get_exercise("10.5"), *build(src))
    return {c.name: (c.passed, c.message) for c in res.cases}


STEPS = "single-token steps after a prefill equal the full logits"
PREFILL = "prefill: logits and per-layer keys and values"
CHUNK = "three new tokens at once after a cached prefix"
MEMORY = "the cache holds 2 * n_layers * H * Dh * T * B * 4 bytes"
GREEDY = "greedy with the cache = without it = the reference's generate"
FEEDS = "with the cache each step feeds only the new token"

POSITIONS_RESTART = (("start = 0 if past[0] is None else past[0][0].shape[2]", "start = 0"),)
NOT_APPENDED = (("            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)  # (B, H, S, Dh)\n",
                 "            pass\n"),)
TOP_LEFT_MASK = (("tril(S - T)", "tril()"),)
RECOMPUTES = (("logits, cache = model(next_id, cache=cache)", "logits, cache = model(idx, cache=[None] * len(self_blocks))"
               .replace("self_blocks", "model.blocks")),)
CACHE_DROPPED = (("logits, cache = model(next_id, cache=cache)", "logits, _ = model(next_id, cache=cache)"),)
DOUBLE_APPEND = (("return self.out(out), (k, v)",
                  "return self.out(out), (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))"),)


def test_the_solution_scores_full_marks():
    res = run_exercise(get_exercise("10.5"), *build(solution_source()))
    assert res.earned == res.points == 11, [(c.name, c.message) for c in res.cases if not c.passed]


@pytest.mark.parametrize("edits, failing, message", [
    (POSITIONS_RESTART, STEPS, "positions restart at 0"),
    (NOT_APPENDED, STEPS, "holds only the 1 new token(s); append the new keys"),
    (NOT_APPENDED, MEMORY, "after 8 tokens, got (2, 5, 1, 4): it holds only the 1 new token(s)"),
    (TOP_LEFT_MASK, CHUNK, "logits of 3 new tokens after 7 cached"),
    (RECOMPUTES, FEEDS, "you are recomputing the whole sequence"),
    (CACHE_DROPPED, FEEDS, "pass on the cache the previous call returned"),
    (DOUBLE_APPEND, STEPS, "should have shape (B, H, S, Dh) = (2, 5, 6, 4)"),
])
def test_each_mistake_fails_with_a_message_naming_it(edits, failing, message):
    got = results(variant(*edits))
    passed, text = got[failing]
    assert not passed and message in text, (failing, text)
    assert sum(not p for p, _ in got.values()) < len(got)  # not everything fails: the mistake is located


def test_a_mistake_in_the_cache_does_not_cost_the_uncached_cases():
    got = results(variant(*POSITIONS_RESTART))
    assert got["without a cache: the reference's logits (B=2, T=7, D=20, H=5)"][0]
    assert got[PREFILL][0] and not got[GREEDY][0]


def test_an_untied_head_or_other_names_are_named():
    got = results(variant(("self.lm_head.weight = self.tok_emb.weight  # tied\n", "")))
    assert all(p for p, _ in got.values())  # the weights are copied into both: equal outputs (9.5 checks the tie)
    got = results(variant(("self.norm_f = nn.LayerNorm", "self.ln_f = nn.LayerNorm"),
                          ("self.norm_f(x)", "self.ln_f(x)")))
    del got[FEEDS]  # drives generate_greedy with the reference model: MyGPT's names play no part
    assert not any(p for p, _ in got.values())
    assert all("parameter names differ" in m and "norm_f.weight" in m for _, m in got.values())


# ------------------------------------------------------------------ through the instructor's grader

@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    from companion_grader.instructor import Limits, _Session

    sessions = []

    def start(src):
        work = tmp_path_factory.mktemp("work")
        (work / "submission.ipynb").write_text("{}")
        code = "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n" + src
        s = _Session(work, [(0, code)], Limits(cell_seconds=60), deadline=time.monotonic() + 120)
        s.ready()
        sessions.append(s)
        return s.targets(("MyGPT", "generate_greedy"))

    yield start
    for s in sessions:
        s.stop()


def test_the_instructor_grader_scores_solution_and_mistakes(remote):
    res = run_exercise(get_exercise("10.5"), *remote(solution_source()))
    assert res.earned == res.points, [(c.name, c.message) for c in res.cases if not c.passed]
    for edits, failing, message in ((POSITIONS_RESTART, STEPS, "positions restart at 0"),
                                    (RECOMPUTES, FEEDS, "recomputing the whole sequence"),
                                    (NOT_APPENDED, MEMORY, "it holds only the 1 new token(s)")):
        res = run_exercise(get_exercise("10.5"), *remote(variant(*edits)))
        case = next(c for c in res.cases if c.name == failing)
        assert not case.passed and message in case.message, case.message
        assert 0 < res.earned < res.points
