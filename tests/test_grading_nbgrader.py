"""The exercise notebooks under nbgrader: its grading rule applied to executed notebooks.

nbgrader (``nbgrader autograde``) runs a notebook with ``NBGRADER_EXECUTION=autograde``
and scores each grade cell (our check cells, with the registry's points) by its
outputs: an error scores 0; a single number shown by the cell is partial credit
(a number above 0, at most the cell's points); anything else, nothing included,
scores full (nbgrader/utils.py, ``determine_grade`` and ``get_partial_grade``).
Here the notebooks are executed with nbclient under that variable and the rule
is applied as nbgrader does, without installing nbgrader.
"""

import ast
import copy
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def nbgrader_score(nb: dict) -> tuple[float, dict[str, float]]:
    """nbgrader's rule for autograded code cells (error: 0; a number > 0: partial; else full)."""
    per_cell = {}
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if not meta.get("grade") or cell["cell_type"] != "code":
            continue
        points, got = float(meta["points"]), float(meta["points"])
        for out in cell.get("outputs", []):
            if out["output_type"] == "error":
                got = 0.0
                break
            if out["output_type"] == "execute_result":
                text = "".join(out["data"].get("text/plain", ""))
                try:
                    value = float(text)
                except ValueError:
                    break  # not a number: full credit (nbgrader warns)
                assert value <= points, "nbgrader refuses partial credit above the cell's points"
                got = value if value > 0 else points  # nbgrader: 0 or less counts as full
                break
        per_cell[meta["grade_id"]] = got
    return sum(per_cell.values()), per_cell


def load(kind: str) -> dict:
    return json.loads((ROOT / kind / "ch02_attention.ipynb").read_text())


def solved(exercise: dict, solution: dict, broken: dict[str, tuple[str, str]] | None = None) -> dict:
    """The exercise notebook with the solution's code in its answer cells (optionally with bugs)."""
    nb = copy.deepcopy(exercise)
    for cell, ref in zip(nb["cells"], solution["cells"]):
        if cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
            src = "\n".join(line for line in "".join(ref["source"]).split("\n")
                            if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION"))
            for name, (old, new) in (broken or {}).items():
                if f"def {name}(" in src:
                    assert old in src, (name, old)
                    src = src.replace(old, new)
            cell["source"] = src
    return nb


def execute(nb: dict, tmp_path: Path) -> dict:
    import nbformat
    from nbclient import NotebookClient

    node = nbformat.reads(json.dumps(nb), as_version=4)
    NotebookClient(node, timeout=120, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    return json.loads(nbformat.writes(node))


@pytest.fixture(scope="module")
def scores(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("NBGRADER_EXECUTION", "autograde")  # what nbgrader autograde sets; the kernel inherits it
    try:
        exercise, solution = load("exercises"), load("solutions")
        buggy = solved(exercise, solution, {
            "causal_mask": ("tril(", "triu("),  # the future instead of the past
            "masked_attention": (" / math.sqrt(q.shape[-1])", ""),  # the 1/sqrt(d_k) scale dropped
        })
        out = {}
        for name, nb in (("empty", exercise), ("buggy", buggy), ("correct", solved(exercise, solution))):
            out[name] = nbgrader_score(execute(nb, tmp_path_factory.mktemp(name)))
        return out
    finally:
        mp.undo()


def test_nbgrader_scores_empty_zero_buggy_partial_correct_full(scores):
    total = sum(e.points for e in __import__("companion.grading", fromlist=["x"]).chapter_exercises(2))
    assert scores["empty"][0] == 0, scores["empty"]
    assert 0 < scores["buggy"][0] < total, scores["buggy"]
    assert scores["correct"][0] == total == 28, scores["correct"]
    cells = scores["buggy"][1]
    assert cells["check-2-2"] == 0  # every case failed: the cell raised
    assert 0 < cells["check-2-1"] < 8  # only the scale case (and those it affects) lost: partial credit
    assert cells["check-2-3"] == 6


def test_every_check_cell_ends_with_its_check_call():
    """nbgrader reads the number a cell shows: check() must be the cell's last expression."""
    for path in sorted((ROOT / "exercises").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade"):
                last = ast.parse("".join(cell["source"])).body[-1]
                assert isinstance(last, ast.Expr) and isinstance(last.value, ast.Call) \
                    and getattr(last.value.func, "id", "") == "check", (path.name, cell["source"])


def test_outside_nbgrader_check_returns_nothing(monkeypatch, capsys):
    from companion.grading import check
    from companion.masks import causal_mask

    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert check("2.2", causal_mask) is None  # a student's check cell shows only the report
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert check("2.2", causal_mask) == 5
    from companion.grading import NoPoints

    with pytest.raises(NoPoints, match="0/5 points"):
        check("2.2", lambda t, s: None)
    assert "Exercise 2.2" in capsys.readouterr().out  # the report is printed before the error
