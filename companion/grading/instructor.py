"""Grade a folder of submitted exercise notebooks with one command.

    python -m companion.grading grade submissions/ --csv scores.csv --json scores.json

Each notebook is executed in a fresh kernel **without** its check cells
(cells tagged ``check`` or ``score``); a final cell then runs the official
checks on the functions the student defined. A notebook that raises, loops or
crashes its kernel still gets a row: the exercises it could not reach score 0.
Needs ``nbclient``, ``nbformat`` and ``ipykernel`` (``pip install companion[grading]``).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

__all__ = ["grade_notebook", "grade_folder", "format_table"]

MARKER = "@@companion-grade@@"
SKIP_TAGS = {"check", "score"}


def _chapter(nb: dict[str, Any], path: Path) -> int:
    chapter = nb.get("metadata", {}).get("companion", {}).get("chapter")
    if not isinstance(chapter, int):
        raise ValueError(f"{path} has no metadata companion.chapter: is it one of the course's exercise notebooks?")
    return chapter


def _zero_report(chapter: int, message: str) -> list[dict[str, Any]]:
    from .core import chapter_exercises

    return [
        {"id": ex.id, "title": ex.title, "earned": 0, "points": ex.points,
         "cases": [{"name": "notebook", "earned": 0, "points": ex.points, "message": message}]}
        for ex in chapter_exercises(chapter)
    ]


def grade_notebook(path: Path, *, cell_timeout: int = 120, kernel_name: str = "python3") -> dict[str, Any]:
    """Execute one submission and return ``{"notebook", "chapter", "exercises": [...], "earned", "points", "errors"}``."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    chapter = _chapter(nb, path)
    kept = [c for c in nb.cells if not (SKIP_TAGS & set(c.get("metadata", {}).get("tags", [])))]
    grading_cell = nbformat.v4.new_code_cell(
        "import json as _json\n"
        "from companion.grading import grade_namespace as _grade_namespace\n"
        f"print({MARKER!r} + _json.dumps(_grade_namespace({chapter}, globals())))"
    )
    nb.cells = kept + [grading_cell]
    client = NotebookClient(
        nb, timeout=cell_timeout, kernel_name=kernel_name, allow_errors=True,
        interrupt_on_timeout=True, resources={"metadata": {"path": str(path.parent)}},
    )
    errors: list[str] = []
    try:
        client.execute()
    except (CellTimeoutError, DeadKernelError, RuntimeError) as err:
        errors.append(f"execution stopped: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    for cell in kept:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                errors.append(f"{out.get('ename')}: {out.get('evalue')}"[:200])
    report = None
    for out in nb.cells[-1].get("outputs", []):
        text = out.get("text", "") if out.get("output_type") == "stream" else ""
        for line in text.splitlines():
            if line.startswith(MARKER):
                report = json.loads(line[len(MARKER):])
    if report is None:
        report = _zero_report(chapter, "the notebook could not be graded: " + ("; ".join(errors) or "no result"))
    return {
        "notebook": path.name,
        "chapter": chapter,
        "exercises": report,
        "earned": sum(e["earned"] for e in report),
        "points": sum(e["points"] for e in report),
        "errors": errors,
    }


def format_table(results: list[dict[str, Any]]) -> str:
    """A plain-text table: one row per notebook, one column per exercise, and the total."""
    ids = sorted({e["id"] for r in results for e in r["exercises"]}, key=lambda i: [int(p) for p in i.split(".")])
    header = ["notebook", *ids, "total"]
    rows = []
    for r in results:
        by_id = {e["id"]: f"{e['earned']}/{e['points']}" for e in r["exercises"]}
        rows.append([r["notebook"], *(by_id.get(i, "-") for i in ids), f"{r['earned']}/{r['points']}"])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)) for row in [header, *rows]]
    return "\n".join(lines)


def grade_folder(
    folder: Path, *, csv_path: Path | None = None, json_path: Path | None = None, cell_timeout: int = 120
) -> list[dict[str, Any]]:
    """Grade every ``*.ipynb`` in ``folder``; write the CSV and JSON files if paths are given."""
    folder = Path(folder)
    paths = sorted(folder.glob("*.ipynb"))
    if not paths:
        raise ValueError(f"no .ipynb files in {folder}")
    results = [grade_notebook(p, cell_timeout=cell_timeout) for p in paths]
    if json_path is not None:
        Path(json_path).write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if csv_path is not None:
        ids = sorted({e["id"] for r in results for e in r["exercises"]}, key=lambda i: [int(p) for p in i.split(".")])
        with open(csv_path, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["notebook", "chapter", *ids, "earned", "points"])
            for r in results:
                by_id = {e["id"]: e["earned"] for e in r["exercises"]}
                writer.writerow([r["notebook"], r["chapter"], *(by_id.get(i, "") for i in ids), r["earned"], r["points"]])
    return results
