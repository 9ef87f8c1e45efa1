"""The grader never crashes on student code, and its checks can fail."""

import math

import pytest
import torch

from companion.attention import scaled_dot_product_attention
from companion.grading import CheckFailed, expect_tensor, get_exercise, run_exercise
from companion.grading.core import Case, Exercise, run_case, time_limit
from companion.masks import causal_mask


def good_attention(q, k, v, mask=None):
    return scaled_dot_product_attention(q, k, v, mask, return_weights=True)


def naive_inf_attention(q, k, v, mask=None):  # the seed's -inf fill: NaN on empty rows
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = s.softmax(-1)
    return w @ v, w


def unscaled_attention(q, k, v, mask=None):
    return scaled_dot_product_attention(q, k, v, mask, scale=1.0, return_weights=True)


def stub(*args, **kwargs):
    raise NotImplementedError("replace this line with your code")


def crashes(*args, **kwargs):
    return [][1]


def loops_forever(*args, **kwargs):
    while True:
        pass


def swallows_everything(*args, **kwargs):
    while True:
        try:
            while True:
                pass
        except Exception:  # a student's blanket except must not defeat the time limit
            pass


def exits(*args, **kwargs):
    raise SystemExit(1)


def transposed_output(q, k, v, mask=None):
    out, w = good_attention(q, k, v, mask)
    return out.transpose(-2, -1), w


def float64_output(q, k, v, mask=None):
    out, w = good_attention(q, k, v, mask)
    return out.double(), w.double()


def earned(ex_id, *students):
    res = run_exercise(get_exercise(ex_id), *students)
    return res.earned, res.points, [c.message for c in res.cases]


def test_reference_scores_full_marks():
    got, possible, _ = earned("2.1", good_attention)
    assert got == possible == 8


@pytest.mark.parametrize(
    "student, expected_message",
    [
        (stub, "not implemented yet"),
        (crashes, "IndexError"),
        (exits, "SystemExit"),
        (transposed_output, "should have shape"),
        (float64_output, "dtype"),
    ],
)
def test_bad_students_lose_points_with_a_message(student, expected_message):
    res = run_exercise(get_exercise("2.1"), student)
    failed = [c for c in res.cases if not c.passed]
    assert res.earned < res.points and failed
    assert all(expected_message in c.message for c in failed), [c.message for c in failed]
    if student in (stub, crashes, exits):
        assert res.earned == 0


def test_nan_on_empty_rows_costs_only_that_case():
    got, possible, messages = earned("2.1", naive_inf_attention)
    assert got == possible - 2
    assert any("NaN" in m for m in messages)


def test_missing_scale_is_caught():
    got, possible, messages = earned("2.1", unscaled_attention)
    assert got < possible
    assert any("sqrt(d_k)" in m for m in messages)


@pytest.mark.parametrize("student", [loops_forever, swallows_everything])
def test_endless_loop_hits_the_time_limit_and_later_cases_still_run(student):
    ex = Exercise("9.9", "loop", ("f",), (
        Case("loops", 1, lambda f: f(), timeout=0.3),
        Case("runs after", 1, lambda f: None),
    ))
    res = run_exercise(ex, student)
    assert [c.earned for c in res.cases] == [0, 1]
    assert "did not finish within 0.3 s" in res.cases[0].message


def test_time_limit_fallback_without_signals_in_a_thread():
    import threading

    box = {}

    def worker():
        box["result"] = run_case(Case("loops", 1, lambda f: f(), timeout=0.3), loops_forever)

    t = threading.Thread(target=worker)
    t.start()
    t.join(5)
    assert not t.is_alive()
    assert box["result"].earned == 0 and "did not finish" in box["result"].message


def test_time_limit_restores_the_alarm_handler():
    import signal

    before = signal.getsignal(signal.SIGALRM)
    with time_limit(1.0):
        pass
    assert signal.getsignal(signal.SIGALRM) is before


def test_causal_mask_checks():
    assert earned("2.2", causal_mask)[0] == 5
    upper = lambda t, s: causal_mask(t, s).T if t == s else causal_mask(t, s)  # noqa: E731
    assert earned("2.2", upper)[0] < 5
    top_left = lambda t, s: torch.ones(t, s, dtype=torch.bool).tril()  # noqa: E731  wrong when s > t
    got, _, messages = earned("2.2", top_left)
    assert got == 3 and any("bottom-right" in m for m in messages)
    as_int = lambda t, s: causal_mask(t, s).long()  # noqa: E731
    assert earned("2.2", as_int)[0] == 0


def test_expect_tensor_messages():
    want = torch.zeros(2, 3)
    with pytest.raises(CheckFailed, match="shape"):
        expect_tensor(torch.zeros(3, 2), want)
    with pytest.raises(CheckFailed, match="NaN"):
        expect_tensor(torch.full((2, 3), float("nan")), want)
    with pytest.raises(CheckFailed, match=r"index \(1, 2\): expected 0, got 5"):
        expect_tensor(torch.zeros(2, 3).index_put_((torch.tensor(1), torch.tensor(2)), torch.tensor(5.0)), want)
    with pytest.raises(CheckFailed, match="torch.Tensor"):
        expect_tensor([[0.0] * 3] * 2, want)
    expect_tensor(want + 1e-7, want)


def test_unknown_exercise_is_a_clear_error():
    with pytest.raises(ValueError, match="no exercise 2.99"):
        get_exercise("2.99")
    with pytest.raises(ValueError, match="chapter 98 has no graded exercises"):
        get_exercise("98.1")


# ---------------------------------------------------------------- authoring checks

def test_malformed_solution_markers_are_rejected():
    from companion_grader.authoring import strip_solutions

    for bad in ("def f():\n    ## BEGIN SOLUTION\n    return 1\n    ## END SOLUTION\n",
                "def f():\n    ### begin solution\n    return 1\n    ### END SOLUTION\n",
                "def f():\n    #### END SOLUTION\n"):
        with pytest.raises(ValueError, match="malformed solution marker"):
            strip_solutions(bad)
    with pytest.raises(ValueError, match="never closed"):
        strip_solutions("def f():\n    ### BEGIN SOLUTION\n    return 1\n")


def test_statement_points_must_match_the_registry():
    import copy
    import json
    from pathlib import Path

    from companion_grader.authoring import check_statements

    sol = json.loads((Path(__file__).resolve().parents[1] / "solutions" / "ch02_attention.ipynb").read_text())
    check_statements(sol)
    wrong = copy.deepcopy(sol)
    for cell in wrong["cells"]:
        src = "".join(cell["source"])
        if src.startswith("## Exercise 2.3"):
            cell["source"] = src.replace("(6 points)", "(7 points)")
    with pytest.raises(ValueError, match="2.3 says 7 points, companion/grading/ch02.py gives 6"):
        check_statements(wrong)


def test_exercise_notebooks_carry_nbgrader_metadata():
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for path in sorted((root / "exercises").glob("*.ipynb")):
        nb = json.loads(path.read_text())
        metas = [c["metadata"]["nbgrader"] for c in nb["cells"]]
        assert len({m["grade_id"] for m in metas}) == len(metas), path.name  # unique ids
        graded = [m for m in metas if m["grade"]]
        chapter = nb["metadata"]["companion"]["chapter"]
        from companion.grading import chapter_exercises

        assert sorted(m["points"] for m in graded) == sorted(e.points for e in chapter_exercises(chapter))
        # nbgrader's schema version 3: these keys only, these types, ids of letters, digits, - and _
        allowed = {"grade", "grade_id", "locked", "points", "schema_version", "solution", "task"}
        for m in metas:
            assert {"grade", "locked", "solution", "schema_version"} <= set(m) <= allowed, m
            assert m["schema_version"] == 3 and re.fullmatch(r"[A-Za-z0-9_-]+", m["grade_id"]), m
            assert all(isinstance(m[k], bool) for k in ("grade", "locked", "solution", "task"))
            assert ("points" in m) == m["grade"], m  # points exactly on graded cells
        for cell, m in zip(nb["cells"], metas):
            assert not (cell["cell_type"] == "markdown" and (m["grade"] or m["solution"]))  # would need both
        assert sum(m["solution"] for m in metas) >= len(graded)
        assert not any(m["solution"] and m["locked"] for m in metas)


# ---------------------------------------------------------------- the student view works on copies

def inplace_scaled_attention(q, k, v, mask=None):  # correct: the in-place update touches only its copy
    q /= math.sqrt(q.shape[-1])
    return scaled_dot_product_attention(q, k, v, mask, scale=1.0, return_weights=True)


def zeroes_its_inputs(q, k, v, mask=None):  # computes nothing; zeroing the inputs must not fool the reference
    for t in (q, k, v):
        t.zero_()
    w = torch.full(q.shape[:-1] + (k.shape[-2],), 1.0 / k.shape[-2])
    return w @ v, w


def test_student_code_gets_copies_of_the_inputs():
    assert earned("2.1", inplace_scaled_attention)[0] == 8
    assert earned("2.1", zeroes_its_inputs)[0] == 0


def test_an_all_nan_output_says_so():
    with pytest.raises(CheckFailed, match=r"NaN everywhere \(6 values\)"):
        expect_tensor(torch.full((2, 3), float("nan")), torch.zeros(2, 3))


def test_in_place_changes_are_still_caught_where_a_check_asks():
    def mutating_top_k(logits, k):
        logits[..., 0] = -1e9
        return logits

    res = run_exercise(get_exercise("10.1"), mutating_top_k)
    last = res.cases[-1]
    assert last.name == "does not modify its input" and last.earned == 0 and "in place" in last.message


def test_boolean_masks_are_reported_as_booleans():
    want = torch.tensor([[True, False], [True, True]])
    with pytest.raises(CheckFailed, match=r"at 1 of 4 positions; first at index \(1, 1\): expected True, got False"):
        expect_tensor(torch.tensor([[True, False], [True, False]]), want, name="mask")
    expect_tensor(want.clone(), want)


def test_a_missing_scale_does_not_fail_the_fully_masked_row():
    res = run_exercise(get_exercise("2.1"), unscaled_attention)
    by_name = {c.name: c for c in res.cases}
    assert by_name["a fully masked row gives zeros, not NaN"].passed, by_name["a fully masked row gives zeros, not NaN"].message
    assert not by_name["scales the scores by 1/sqrt(d_k)"].passed


def test_the_parameter_count_message_names_the_statements_fields():
    res = run_exercise(get_exercise("9.4"), lambda cfg: 1)
    message = res.cases[0].message
    assert "ff_size=96" in message and "d_ff" not in message, message


def test_statement_titles_equal_check_titles_in_every_chapter():
    """The heading a student reads and the title the check prints are the same, word for word."""
    import json
    import re
    from pathlib import Path

    from companion.grading import chapter_exercises

    heading = re.compile(r"^#+\s*Exercise\s+(\d+\.\d+):\s*(.*?)\s*\((\d+) points?\)\s*$", re.M)
    root = Path(__file__).resolve().parents[1]
    seen = 0
    for path in sorted((root / "solutions").glob("*.ipynb")):
        nb = json.loads(path.read_text())
        stated = {m.group(1): m.group(2) for c in nb["cells"] if c["cell_type"] == "markdown"
                  for m in heading.finditer("".join(c["source"]))}
        for ex in chapter_exercises(nb["metadata"]["companion"]["chapter"]):
            assert stated.get(ex.id) == ex.title, (path.name, ex.id, stated.get(ex.id), ex.title)
            seen += 1
    assert seen >= 50
