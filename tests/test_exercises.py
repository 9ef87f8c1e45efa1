"""The exercise pipeline end to end, through the instructor's command.

Every solution notebook must score full marks and every untouched exercise
notebook must score zero, without crashing; a hostile submission still gets a
row. The notebooks are executed by the instructor's grader (`python -m companion_grader grade`).
"""

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))


def test_every_solution_has_an_exercise_notebook():
    assert SOLUTIONS, "no solution notebooks"
    assert [p.name for p in SOLUTIONS] == [p.name for p in EXERCISES]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("submissions")
    for path in SOLUTIONS:
        shutil.copy(path, folder / f"solution-{path.name}")
    for path in EXERCISES:
        shutil.copy(path, folder / f"untouched-{path.name}")
    proc = subprocess.run(
        [sys.executable, "-m", "companion_grader", "grade", str(folder), "--notebook-timeout", "300"],
        capture_output=True, text=True, cwd=folder,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((folder / "scores.json").read_text())["notebooks"]
    with open(folder / "scores.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    return proc.stdout, {r["notebook"]: r for r in results}, {r["notebook"]: r for r in rows}


def test_solutions_score_full_marks(graded):
    _, results, rows = graded
    for path in SOLUTIONS:
        r = results[f"solution-{path.name}"]
        assert r["points"] > 0 and r["status"] == "graded"
        # a solution notebook handed in as it is: flagged as a copy (markers, metadata, identical code), nothing else
        assert r["flags"] and all(f.startswith("solution copy: ") for f in r["flags"]), r["flags"]
        assert any("identical to the reference solution" in f for f in r["flags"]), r["flags"]
        lost = [(e["id"], c["name"], c["message"]) for e in r["exercises"] for c in e["cases"] if c["earned"] < c["points"]]
        assert r["earned"] == r["points"], lost
        assert int(rows[f"solution-{path.name}"]["earned"]) == r["points"]
        assert len(r["exercises"]) >= 3


def test_untouched_exercises_score_zero_without_crashing(graded):
    _, results, _ = graded
    for path in EXERCISES:
        r = results[f"untouched-{path.name}"]
        assert r["points"] > 0 and r["earned"] == 0
        assert r["errors"] == [], r["errors"]  # the stubs raise only when called by a check
        assert r["flags"] == [], r["flags"]  # an exercise notebook as distributed: no copy flag
        messages = {c["message"] for e in r["exercises"] for c in e["cases"]}
        assert all("not implemented yet" in m for m in messages), messages


def test_table_lists_every_notebook(graded):
    table, results, _ = graded
    for name in results:
        assert name in table
    assert table.splitlines()[0].split()[0] == "notebook"


def test_hostile_submission_still_gets_a_row(tmp_path):
    """Top-level endless loop, an exception, a NaN-producing answer: graded, not crashed."""
    nb = json.loads((ROOT / "solutions" / "ch02_attention.ipynb").read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if "def causal_mask" in src:
            cell["source"] = "while True:\n    pass\n"  # never returns: the cell times out, causal_mask is undefined
        elif "def masked_attention" in src:
            cell["source"] = src.replace("torch.finfo(scores.dtype).min", 'float("-inf")').replace(
                "weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)", "pass")
        elif "def split_heads" in src:
            cell["source"] = "raise RuntimeError('oops')\n" + src  # split/merge never get defined
    (tmp_path / "hostile.ipynb").write_text(json.dumps(nb))
    from companion_grader.instructor import Limits, grade_notebook

    r = grade_notebook(tmp_path / "hostile.ipynb", limits=Limits(cell_seconds=5, notebook_seconds=120))
    by_id = {e["id"]: e for e in r["exercises"]}
    assert by_id["2.1"]["earned"] == by_id["2.1"]["points"] - 2  # NaN on the fully masked row
    assert by_id["2.2"]["earned"] == 0 and "causal_mask not defined" in by_id["2.2"]["cases"][0]["message"]
    assert by_id["2.3"]["earned"] == 0
    assert "RuntimeError: oops (it defines split_heads)" in by_id["2.3"]["cases"][0]["message"]  # says why
    assert by_id["2.4"]["earned"] < by_id["2.4"]["points"]  # uses the undefined split_heads
    assert any("oops" in e for e in r["errors"])
    assert any("did not finish within 5 s" in e for e in r["errors"])
    assert r["status"] == "graded"
