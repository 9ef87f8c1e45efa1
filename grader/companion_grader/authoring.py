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
import re
from pathlib import Path
from typing import Any

from companion.grading.core import chapter_exercises, get_exercise

__all__ = ["cell_source", "strip_solutions", "make_exercise_notebook", "check_statements", "write_notebook",
           "notebook_text", "sync_exercises"]

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
STUB = 'raise NotImplementedError("replace this line with your code")'
# Anything that looks like a marker but is not exactly one (``## BEGIN SOLUTION``,
# ``### begin solution``, ``#### END SOLUTION``) would leak the solution: rejected.
MARKER_LIKE = re.compile(r"^\s*#+\s*(BEGIN|END)\s+SOLUTION\b", re.IGNORECASE)
STATEMENT = re.compile(r"^#+\s*Exercise\s+(\d+\.\d+)\b.*\((\d+)\s+points?\)", re.MULTILINE)
TITLE = re.compile(r"^#+\s*Exercise\s+(\d+\.\d+):\s*(.*?)\s*\(\d+\s+points?\)\s*$", re.MULTILINE)
CHECK_CALL = re.compile(r"""check\(\s*["'](\d+\.\d+)["']""")
NBGRADER_SCHEMA = 3


def cell_source(cell: dict[str, Any]) -> str:
    """A cell's source as one string (a notebook file may store it as a list of lines).

    Also reads the cells of a submitted notebook, which may hold anything: never raises on odd values.
    """
    src = cell.get("source", "")
    return "".join(str(s) for s in src) if isinstance(src, list) else str(src)


def strip_solutions(code: str, where: str = "cell") -> str:
    """Replace every ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region with a stub."""
    out: list[str] = []
    inside = False
    for lineno, line in enumerate(code.split("\n"), 1):
        stripped = line.strip()
        if MARKER_LIKE.match(line) and stripped not in (BEGIN, END):
            raise ValueError(f"{where}, line {lineno}: malformed solution marker {stripped!r}; write {BEGIN!r} or {END!r}")
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
        src = cell_source(cell)
        n_regions += src.count(BEGIN)
        cell["source"] = strip_solutions(src, where=f"{source_name}, cell {i}")
        cell["outputs"] = []
        cell["execution_count"] = None
    if n_regions == 0:
        raise ValueError(f"{source_name} has no {BEGIN} region: nothing for the student to do")
    _add_nbgrader_metadata(nb, source_name)
    nb.setdefault("metadata", {}).setdefault("companion", {})["generated_from"] = source_name
    return nb


def _add_nbgrader_metadata(nb: dict[str, Any], source_name: str) -> None:
    """nbgrader's cell metadata: solution cells, graded check cells (with points), the rest locked.

    Lets a course that uses nbgrader take the exercise notebooks as they are
    (its ``enforce_metadata``): the points of a check cell are the registry's.
    """
    for i, cell in enumerate(nb["cells"]):
        src = cell_source(cell)
        tags = set(cell.get("metadata", {}).get("tags", []))
        meta = {"grade": False, "grade_id": f"cell-{i}", "locked": True, "schema_version": NBGRADER_SCHEMA,
                "solution": False, "task": False}
        if cell["cell_type"] == "code" and "# YOUR CODE HERE" in src:
            meta.update(locked=False, solution=True)
        elif cell["cell_type"] == "code" and "check" in tags:
            found = CHECK_CALL.search(src)
            if not found:
                raise ValueError(f"{source_name}, cell {i}: a check cell must call check(\"N.k\", ...)")
            ex_id = found.group(1)
            meta.update(grade=True, grade_id=f"check-{ex_id.replace('.', '-')}", points=get_exercise(ex_id).points)
        cell.setdefault("metadata", {})["nbgrader"] = meta


def check_statements(solution: dict[str, Any], source_name: str = "solution") -> None:
    """Every exercise of the chapter has a statement whose title and "(N points)" equal the registry's."""
    chapter = solution.get("metadata", {}).get("companion", {}).get("chapter")
    if not isinstance(chapter, int):
        raise ValueError(f"{source_name} has no metadata companion.chapter")
    stated: dict[str, int] = {}
    titles: dict[str, str] = {}
    for cell in solution["cells"]:
        if cell["cell_type"] == "markdown":
            for ex_id, points in STATEMENT.findall(cell_source(cell)):
                stated[ex_id] = int(points)
            titles.update(TITLE.findall(cell_source(cell)))
    problems = []
    for ex in chapter_exercises(chapter):
        if ex.id not in stated:
            problems.append(f"no statement '## Exercise {ex.id}: ... ({ex.points} points)'")
        elif stated[ex.id] != ex.points:
            problems.append(f"the statement of {ex.id} says {stated[ex.id]} points, companion/grading/ch{chapter:02d}.py gives {ex.points}")
        elif titles.get(ex.id) != ex.title:
            problems.append(f"the statement of {ex.id} is titled {titles.get(ex.id)!r}, the check {ex.title!r}: "
                            "write the same words in both")
    extra = sorted(set(stated) - {ex.id for ex in chapter_exercises(chapter)})
    problems += [f"a statement for {i}, which is not registered" for i in extra]
    if problems:
        raise ValueError(f"{source_name}: " + "; ".join(problems))


def notebook_text(nb: dict[str, Any]) -> str:
    """Serialise like Jupyter does (nbformat: indent 1, sorted keys), sources as line lists."""
    nb = copy.deepcopy(nb)
    for cell in nb["cells"]:
        src = cell_source(cell)
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
        check_statements(solution, rel)
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


