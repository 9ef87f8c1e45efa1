"""Generate student notebooks from solution notebooks (one source of truth).

In a solution notebook, the solution is marked inside code cells::

    def causal_mask(t, s):
        ### BEGIN SOLUTION
        return torch.ones(t, s, dtype=torch.bool).tril(s - t)
        ### END SOLUTION

and the student notebook gets, at the same indentation::

    def causal_mask(t, s):
        # YOUR CODE HERE
        raise NotImplementedError("Exercise: replace this line with your code")

The markers are nbgrader's, so the notebooks also work with nbgrader.
Outputs and execution counts are cleared in the student notebook.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

__all__ = ["strip_solutions", "make_exercise_notebook", "write_notebook", "notebook_text", "sync_exercises"]

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
STUB = 'raise NotImplementedError("replace this line with your code")'


def _source(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def strip_solutions(code: str, where: str = "cell") -> str:
    """Replace every ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region with a stub."""
    out: list[str] = []
    inside = False
    for lineno, line in enumerate(code.split("\n"), 1):
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise ValueError(f"{where}, line {lineno}: nested {BEGIN}")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}# YOUR CODE HERE")
            out.append(f"{indent}{STUB}")
        elif stripped == END:
            if not inside:
                raise ValueError(f"{where}, line {lineno}: {END} without {BEGIN}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{where}: {BEGIN} is never closed")
    return "\n".join(out)


def make_exercise_notebook(solution: dict[str, Any], source_name: str = "solution") -> dict[str, Any]:
    """The student notebook for a solution notebook (a new dict; the input is unchanged)."""
    nb = copy.deepcopy(solution)
    n_regions = 0
    for i, cell in enumerate(nb["cells"]):
        cell.get("metadata", {}).pop("execution", None)  # nbclient's timestamps: not part of the exercise
        if cell["cell_type"] != "code":
            continue
        src = _source(cell)
        n_regions += src.count(BEGIN)
        cell["source"] = strip_solutions(src, where=f"{source_name}, cell {i}")
        cell["outputs"] = []
        cell["execution_count"] = None
    if n_regions == 0:
        raise ValueError(f"{source_name} has no {BEGIN} region: nothing for the student to do")
    nb.setdefault("metadata", {}).setdefault("companion", {})["generated_from"] = source_name
    return nb


def notebook_text(nb: dict[str, Any]) -> str:
    """Serialise like Jupyter does (nbformat: indent 1, sorted keys), sources as line lists."""
    nb = copy.deepcopy(nb)
    for cell in nb["cells"]:
        src = _source(cell)
        cell["source"] = src.splitlines(keepends=True)
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def write_notebook(nb: dict[str, Any], path: Path) -> None:
    Path(path).write_text(notebook_text(nb), encoding="utf-8")


def sync_exercises(solutions: Path, exercises: Path, *, check: bool = False) -> list[Path]:
    """Regenerate ``exercises/X.ipynb`` from every ``solutions/X.ipynb``.

    With ``check=True`` nothing is written; returns the exercise notebooks that
    are missing or differ from what would be generated (empty = up to date).
    Also reports exercise notebooks that have no solution any more.
    """
    solutions, exercises = Path(solutions), Path(exercises)
    stale: list[Path] = []
    names = set()
    for sol_path in sorted(solutions.glob("*.ipynb")):
        names.add(sol_path.name)
        solution = json.loads(sol_path.read_text(encoding="utf-8"))
        rel = f"{solutions.name}/{sol_path.name}"
        text = notebook_text(make_exercise_notebook(solution, source_name=rel))
        target = exercises / sol_path.name
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            stale.append(target)
            if not check:
                exercises.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
    for orphan in sorted(exercises.glob("*.ipynb")):
        if orphan.name not in names:
            stale.append(orphan)
            if not check:
                orphan.unlink()
    return stale


