"""Grade a folder of submitted exercise notebooks with one command.

    python -m companion_grader grade submissions/ [--csv scores.csv] [--json scores.json]

Every file under the folder, at any depth (an LMS's export nests them:
``submission_1001/ch02_attention.ipynb``), gets a row. The grader does not
trust the submissions. For each notebook:

1. it reads the file; a file that is not a notebook (``.pdf``, ``.py``),
   not a readable one, or not one of the course's exercise notebooks, gets a
   row with status ``not a notebook``, ``invalid notebook`` or ``not an exercise``
   and 0 points;
2. it copies the notebook into a fresh temporary folder and starts a worker
   process there (:mod:`.worker`, in the sandbox of :mod:`.sandbox`), which
   runs the notebook's code cells; ``check()`` and ``score()`` do nothing in
   the worker;
3. it runs every case of every exercise **in the grader's process**: inputs
   and reference answers are built here, the student's function or class is
   reached through a proxy (:mod:`.remote`) that sends copies of the inputs
   to the worker and gets back only the outputs, which are compared here;
4. a case that loops, or a worker that dies, costs that case: the worker is
   killed (``SIGKILL`` to its process group) and started again, re-running
   the notebook's cells, for the next case; a cell that hangs is skipped on
   the restart; a notebook over its wall-clock limit is stopped and gets the
   status ``timeout``, keeping the cases graded so far.

Each row has a status (:data:`STATUSES`), the points per exercise, flags
(imports of modules the exercise forbids, code defined in check cells, a copy
of the solution notebook, reads and writes outside the submission's folder) and,
whenever something could not be graded, the reason. The CSV and JSON are
rewritten after every notebook, so they exist even if the batch is stopped.
"""

from __future__ import annotations

import ast
import copy
import csv
import dataclasses
import hashlib
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

import torch

from companion.grading.core import CaseResult, ExerciseResult, StudentProcessDied, chapter_exercises, run_case

from .authoring import BEGIN, END, MARKER_LIKE, cell_source
from .remote import Channel, load_plain, read_frame, write_frame
from .sandbox import COURSE_ROOT, GRADER_ROOT, Limits, hidden_paths, kill_worker, sandbox_status, start_worker

__all__ = ["STATUSES", "Limits", "grade_notebook", "grade_folder", "format_table", "find_flags",
           "find_submissions", "solution_fingerprints", "copy_flags"]

STATUSES = ("graded", "timeout", "crashed", "not a notebook", "invalid notebook", "not an exercise")
# Files of a folder that are not submissions: the grader's own results, an export's metadata,
# and what operating systems and Jupyter leave beside files (checkpoints are older copies).
RESULT_NAMES = {"scores.csv", "scores.json", "gradebook.csv", "canvas.csv", "submission_metadata.yml"}
SKIPPED_DIRS = {".ipynb_checkpoints", "__MACOSX", "__pycache__"}
FINGERPRINTS_ENV = "COMPANION_GRADER_FINGERPRINTS"  # a JSON file of solution fingerprints (the Gradescope zip has one)
SKIP_TAGS = {"check", "score"}
MAX_NOTEBOOK_BYTES = 50 * 10**6
MAX_RESTARTS = 30  # per notebook; each restart re-runs the notebook's cells


# ------------------------------------------------------------------ reading a submission

def _read(path: Path) -> tuple[dict[str, Any] | None, str]:
    """``(notebook, "")`` or ``(None, reason)``."""
    try:
        size = path.stat().st_size
        if size > MAX_NOTEBOOK_BYTES:
            return None, f"{size / 1e6:.0f} MB: larger than any exercise notebook can be ({MAX_NOTEBOOK_BYTES / 1e6:.0f} MB)"
        nb = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        return None, f"not a readable notebook: {type(err).__name__}: {str(err)[:150]}"
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        return None, "not a Jupyter notebook: no list of cells"
    for i, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown", "raw"):
            return None, f"cell {i} is not a notebook cell"
    return nb, ""


def _tags(cell: dict[str, Any]) -> set[str]:
    meta = cell.get("metadata")
    tags = meta.get("tags", []) if isinstance(meta, dict) else []
    return {t for t in tags if isinstance(t, str)} if isinstance(tags, list) else set()


def _chapter(nb: dict[str, Any]) -> tuple[int | None, str]:
    meta = nb.get("metadata")
    companion = meta.get("companion") if isinstance(meta, dict) else None
    chapter = companion.get("chapter") if isinstance(companion, dict) else None
    if not isinstance(chapter, int) or isinstance(chapter, bool):
        return None, "no metadata companion.chapter: not one of the course's exercise notebooks"
    try:
        if not chapter_exercises(chapter):
            raise ValueError
    except ValueError:
        return None, f"metadata companion.chapter is {chapter}, a chapter without graded exercises"
    return chapter, ""


# ------------------------------------------------------------------ static flags

def _used_names(tree: ast.AST) -> set[str]:
    """Dotted names the code imports or reaches: ``import a.b as x; x.c`` gives ``a.b`` and ``a.b.c``."""
    aliases: dict[str, str] = {}
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                used.add(a.name)
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            used.add(node.module)
            for a in node.names:
                used.add(f"{node.module}.{a.name}")
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if fname in ("import_module", "__import__"):
                used.add(node.args[0].value)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts = []
            cur: ast.AST = node
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id in aliases:
                used.add(".".join([aliases[cur.id], *reversed(parts)]))
    return used


def _defined_names(tree: ast.AST) -> list[str]:
    names = []
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


def _forbidden_hits(ex: Any, used: set[str]) -> list[str]:
    return sorted({f for f in ex.forbidden for u in used if u == f or u.startswith(f + ".")})


def find_flags(nb: dict[str, Any], exercises: list[Any]) -> tuple[list[str], dict[str, list[str]]]:
    """Notebook-level flags and flags per exercise id, from the code alone (nothing is run)."""
    notebook_flags: list[str] = []
    owner: dict[str, set[str]] = {}  # a target may belong to several exercises (9.5 also grades 9.4's function)
    for ex in exercises:
        for name in ex.targets:
            owner.setdefault(name, set()).add(ex.id)
    used_by: dict[str, set[str]] = {ex.id: set() for ex in exercises}
    shared: set[str] = set()  # names used by cells that define no exercise's target (imports, helpers)
    for i, cell in enumerate(nb["cells"]):
        if cell.get("cell_type") != "code":
            continue
        try:
            tree = ast.parse(cell_source(cell))
        except SyntaxError:
            continue  # IPython syntax or a typo: the worker reports the cell's error
        defined = _defined_names(tree)
        owners = {ex_id for n in defined for ex_id in owner.get(n, ())}
        for ex_id in owners:
            used_by[ex_id] |= _used_names(tree)
        if not owners:
            shared |= _used_names(tree)
        if defined and _tags(cell) & SKIP_TAGS:
            notebook_flags.append(f"cell {i} (a check cell) defines {', '.join(defined)}: it was run as the student's code")
    per_exercise: dict[str, list[str]] = {}
    for ex in exercises:
        hits = _forbidden_hits(ex, used_by[ex.id] | shared)
        if hits:
            per_exercise[ex.id] = [f"uses {h}, which exercise {ex.id} forbids" for h in hits]
    return notebook_flags, per_exercise


# ------------------------------------------------------------------ copies of the solution

def _normalised(node: ast.AST) -> str:
    """A definition as code, without comments, docstrings or layout (``ast.unparse``)."""
    node = copy.deepcopy(node)
    for sub in ast.walk(node):
        body = getattr(sub, "body", None)
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str):
            sub.body = body[1:] or [ast.Pass()]
    return ast.unparse(node)


def _definitions(nb: dict[str, Any]) -> dict[str, str]:
    """Top-level ``def``/``class`` by name, normalised; the last definition wins, as when the cells run."""
    found: dict[str, str] = {}
    for cell in nb.get("cells", []):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        try:
            tree = ast.parse(cell_source(cell))
        except (SyntaxError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found[node.name] = _normalised(node)
    return found


def _fingerprint(code: str) -> str:
    return hashlib.sha256(code.encode("utf-8")).hexdigest()


_FINGERPRINTS: dict[int, dict[str, list[str]]] = {}


def solution_fingerprints(chapter: int) -> dict[str, list[str]]:
    """Per exercise id, the fingerprints (SHA-256 of the normalised code) of its targets in the
    reference solution: from the file named by ``$COMPANION_GRADER_FINGERPRINTS`` if set, else from
    the ``solutions/`` of the course's repository (an editable install); empty if neither exists."""
    if chapter in _FINGERPRINTS:
        return _FINGERPRINTS[chapter]
    found: dict[str, list[str]] = {}
    named = os.environ.get(FINGERPRINTS_ENV)
    if named:
        try:
            found = json.loads(Path(named).read_text(encoding="utf-8")).get(str(chapter), {})
        except (OSError, ValueError, AttributeError):
            found = {}
    else:
        for path in sorted((COURSE_ROOT / "solutions").glob(f"ch{chapter:02d}_*.ipynb")):
            try:
                nb = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            defs = _definitions(nb)
            for ex in chapter_exercises(chapter):
                if all(t in defs for t in ex.targets):
                    found[ex.id] = [_fingerprint(defs[t]) for t in ex.targets]
    _FINGERPRINTS[chapter] = found
    return found


def copy_flags(nb: dict[str, Any], chapter: int, exercises: list[Any]) -> list[str]:
    """Signs that a submission is the course's solution notebook, or holds its code."""
    flags = []
    marked = [i for i, c in enumerate(nb["cells"]) if c.get("cell_type") == "code"
              and any(MARKER_LIKE.match(line) for line in cell_source(c).splitlines())]
    if marked:
        flags.append(f"solution copy: cell {marked[0]} holds the solution markers ({BEGIN} / {END}), "
                     "which only the solution notebooks have")
    meta = nb.get("metadata")
    companion = meta.get("companion") if isinstance(meta, dict) else None
    if isinstance(companion, dict) and "generated_from" not in companion:
        flags.append("solution copy: its metadata lacks companion.generated_from, which every exercise "
                     "notebook carries and no solution notebook does")
    reference = solution_fingerprints(chapter)
    if reference:
        defs = _definitions(nb)
        same = [ex for ex in exercises if ex.id in reference and all(t in defs for t in ex.targets)
                and [_fingerprint(defs[t]) for t in ex.targets] == reference[ex.id]]
        if same:
            flags.append(f"solution copy: the code of exercise{'s' if len(same) > 1 else ''} "
                         f"{', '.join(f'{ex.id} ({chr(44).join(ex.targets)})' for ex in same)} is identical "
                         "to the reference solution (comments, docstrings and layout aside)")
    return flags


# ------------------------------------------------------------------ one submission

class _Session:
    """A worker for one submission that can be restarted; the grader's side of it."""

    def __init__(self, workdir: Path, cells: list[tuple[int, str]], limits: Limits, deadline: float,
                 hide: tuple[Path, ...] = ()) -> None:
        self.workdir, self.cells, self.limits, self.deadline, self.hide = workdir, cells, limits, deadline, hide
        self.skipped: dict[int, str] = {}
        self.errors: list[str] = []
        self.proc = None
        self.channel = None
        self.starts = 0
        self.log = workdir / "worker.log"
        self.cell_imports: set[str] = set()  # imported by the cells' own lines, as the worker saw it run
        self.runtime_imports: dict[str, set[str]] = {}  # exercise id -> imported while its cases ran
        self.definers: dict[str, int] = {}  # name -> index of the cell that defines it (read from the code)
        self.outside: set[str] = set()  # reads, writes and programs outside the allowed folders (worker's report)
        for index, source in cells:
            try:
                for name in _defined_names(ast.parse(source)):
                    self.definers.setdefault(name, index)
            except SyntaxError:
                continue

    def stop(self) -> None:
        if self.proc is not None:
            kill_worker(self.proc)
        self.proc = self.channel = None

    def ready(self) -> None:
        """A live worker that has run the notebook's cells; raises TimeoutError or RuntimeError."""
        if self.channel is not None and not self.channel.broken and self.proc.poll() is None:
            return
        self.stop()
        while True:
            if self.starts >= MAX_RESTARTS:
                raise RuntimeError(f"the worker was started {self.starts} times; giving up")
            if time.monotonic() > self.deadline:
                raise TimeoutError
            self.starts += 1
            self.proc = start_worker(self.workdir, self.limits, self.log, self.hide)
            self.channel = Channel(self.proc.stdin.fileno(), self.proc.stdout.fileno())
            todo = [(i, s) for i, s in self.cells if i not in self.skipped]
            current = None
            try:
                write_frame(self.channel.to_worker, pickle.dumps(("cells", todo)))
                while True:
                    # Until the first cell starts, the worker is importing torch: allow for a slow start.
                    allowance = self.limits.cell_seconds if current is not None else max(self.limits.cell_seconds, 120)
                    reply = load_plain(read_frame(self.channel.from_worker, min(self.deadline, time.monotonic() + allowance)))
                    if isinstance(reply, tuple) and len(reply) == 2 and reply[0] == "cell":
                        current = int(reply[1])
                        continue
                    if isinstance(reply, dict) and isinstance(reply.get("value"), dict):
                        self.errors = [str(e)[:300] for e in reply["value"].get("errors", [])][:50]
                        self.cell_imports |= self.channel.imports
                        if isinstance(reply.get("outside"), list):
                            self.outside.update(str(m)[:400] for m in reply["outside"][:200])
                        return
                    raise StudentProcessDied("unexpected reply while running the cells")
            except TimeoutError:
                self.stop()
                if time.monotonic() > self.deadline or current is None:
                    raise
                self.skipped[current] = f"cell {current} did not finish within {self.limits.cell_seconds:g} s; it was skipped"
            except Exception as err:  # noqa: BLE001 - the worker died or sent garbage
                code = self.proc.poll() if self.proc else None
                self.stop()
                if current is None:
                    raise RuntimeError(f"the worker could not start ({err}; exit code {code}){self._log_tail()}") from None
                self.skipped[current] = f"cell {current} stopped the process (exit code {code}); it was skipped"

    def _log_tail(self) -> str:
        try:
            tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
        except OSError:
            return ""
        return (": " + " | ".join(tail))[:400] if tail else ""

    def targets(self, names: tuple[str, ...]) -> list[Any]:
        return [self.channel.request(("target", n), deadline=min(self.deadline, time.monotonic() + 30)) for n in names]


def _why_missing(session: _Session, missing: list[str]) -> str:
    """"X not defined in the notebook", with the cell that should have defined it and what happened to it."""
    why = []
    for name in missing:
        cell = session.definers.get(name)
        if cell is None:
            continue
        said = session.skipped.get(cell) or next((e for e in session.errors if e.startswith(f"cell {cell}:")), "")
        if said:
            why.append(f"{said} (it defines {name})")
    return f"{', '.join(missing)} not defined in the notebook" + (": " + "; ".join(why) if why else "")


def _grade_exercises(session: _Session, exercises: list[Any]) -> tuple[list[dict[str, Any]], str, str]:
    """Every case of every exercise; returns (reports, status, reason)."""
    reports: list[dict[str, Any]] = []
    status, reason = "graded", ""
    for ex in exercises:
        result = ExerciseResult(ex)
        for case in ex.cases:
            if status != "graded":
                result.cases.append(CaseResult(case.name, case.points, 0, reason))
                continue
            try:
                session.ready()
                students = session.targets(ex.targets)
            except TimeoutError:
                status = "timeout"
                reason = f"not graded: the notebook exceeded its limit of {session.limits.notebook_seconds:g} s"
                result.cases.append(CaseResult(case.name, case.points, 0, reason))
                continue
            except Exception as err:  # noqa: BLE001 - the worker cannot run this submission
                status, reason = "crashed", f"not graded: {err}"[:500]
                result.cases.append(CaseResult(case.name, case.points, 0, reason))
                continue
            missing = [n for n, s in zip(ex.targets, students) if s is None]
            if missing:
                result.cases.append(CaseResult(case.name, case.points, 0, _why_missing(session, missing)))
                continue
            torch.manual_seed(0)  # as in run_exercise: the same inputs as in the student's notebook
            left = session.deadline - time.monotonic()
            if left < case.timeout:  # the notebook's limit comes first
                got = run_case(dataclasses.replace(case, timeout=max(left, 0.1)), *students)
                if got.earned == 0 and got.message.startswith("did not finish"):
                    status = "timeout"
                    reason = f"not graded: the notebook exceeded its limit of {session.limits.notebook_seconds:g} s"
                    got.message = reason
            else:
                got = run_case(case, *students)
            result.cases.append(got)
            if session.channel is not None:
                session.runtime_imports.setdefault(ex.id, set()).update(session.channel.imports)
                session.channel.imports.clear()
                session.outside |= session.channel.outside
                session.channel.outside.clear()
            if session.channel is None or session.channel.broken:
                session.stop()  # a case timed out or the worker died: a fresh worker for the next case
        reports.append(result.as_dict())
    return reports, status, reason


def _row(path: Path, status: str, reason: str = "", chapter: int | None = None,
         exercises: list[dict[str, Any]] | None = None, name: str | None = None) -> dict[str, Any]:
    exercises = exercises or []
    return {"notebook": name or path.name, "status": status, "reason": reason, "chapter": chapter,
            "earned": sum(e["earned"] for e in exercises), "points": sum(e["points"] for e in exercises),
            "exercises": exercises, "errors": [], "flags": []}


def _outside_flags(outside: set[str], sandboxed: bool) -> list[str]:
    """One flag per kind (read, write, ran), naming the first paths."""
    flags = []
    for kind, verb in (("read", "tried to read outside its folder"), ("write", "tried to write outside its folder"),
                       ("ran", "tried to run a program")):
        # real paths before glob patterns, deeper (more telling) paths first
        items = sorted((o.split(" ", 1)[1] for o in outside if o.startswith(kind + " ")),
                       key=lambda p: (any(c in p for c in "*?["), -p.count("/"), p))
        if items:
            shown = ", ".join(items[:4]) + (f" and {len(items) - 4} more" if len(items) > 4 else "")
            what = ("the sandbox blocked it" if sandboxed else "no sandbox: it may have succeeded")
            flags.append(f"{verb}: {shown} ({what})")
    return flags


def grade_notebook(path: Path, *, limits: Limits | None = None, workroot: Path | None = None,
                   hide: tuple[Path, ...] | None = None, name: str | None = None) -> dict[str, Any]:
    """Grade one submission; never raises for anything the submission contains.

    ``hide``: paths the worker must not read (default: the notebook's folder and the course's solutions);
    ``name``: what the row calls the file (default its name; :func:`grade_folder` gives the relative path).
    """
    path, limits = Path(path), limits or Limits()
    start = time.monotonic()
    if path.suffix.lower() != ".ipynb":
        kind = f"a {path.suffix.lower()[1:]} file" if path.suffix else "a file without extension"
        return {**_row(path, "not a notebook", f"{kind}, not a Jupyter notebook (.ipynb): nothing was run",
                       name=name), "seconds": 0.0}
    nb, why = _read(path)
    if nb is None:
        return {**_row(path, "invalid notebook", why, name=name), "seconds": round(time.monotonic() - start, 1)}
    chapter, why = _chapter(nb)
    if chapter is None:
        return {**_row(path, "not an exercise", why, name=name), "seconds": round(time.monotonic() - start, 1)}
    exercises = chapter_exercises(chapter)
    notebook_flags, exercise_flags = find_flags(nb, exercises)
    notebook_flags += copy_flags(nb, chapter, exercises)
    cells = [(i, cell_source(c)) for i, c in enumerate(nb["cells"]) if c.get("cell_type") == "code"]
    own_root = workroot is None
    root = Path(tempfile.mkdtemp(prefix="companion-grade-")) if own_root else Path(workroot)
    workdir = Path(tempfile.mkdtemp(prefix="submission-", dir=root))
    shutil.copyfile(path, workdir / "submission.ipynb")  # the worker sees only this copy
    hide = hidden_paths(path.parent) if hide is None else hide
    session = _Session(workdir, cells, limits, deadline=start + limits.notebook_seconds, hide=hide)
    try:
        reports, status, reason = _grade_exercises(session, exercises)
    finally:
        session.stop()
        shutil.rmtree(root if own_root else workdir, ignore_errors=True)
    for ex, rep in zip(exercises, reports):
        flags = exercise_flags.get(ex.id, [])
        seen = session.runtime_imports.get(ex.id, set()) | session.cell_imports
        for hit in _forbidden_hits(ex, seen):  # imports the code did not spell out, seen at run time
            flag = f"uses {hit}, which exercise {ex.id} forbids"
            flags = flags if flag in flags else [*flags, flag + " (an import seen at run time)"]
        rep["flags"] = flags
    row = _row(path, status, reason, chapter, reports, name=name)
    row["errors"] = [*session.skipped.values(), *session.errors]
    notebook_flags += _outside_flags(session.outside, sandbox_status().startswith("bubblewrap"))
    row["flags"] = notebook_flags + [f for rep in reports for f in rep["flags"]]
    if session.starts > 1:
        row["errors"].append(f"the worker was restarted {session.starts - 1} time(s)")
    row["seconds"] = round(time.monotonic() - start, 1)
    return row


# ------------------------------------------------------------------ a folder

def _ids(results: list[dict[str, Any]]) -> list[str]:
    return sorted({e["id"] for r in results for e in r["exercises"]}, key=lambda i: [int(p) for p in i.split(".")])


def format_table(results: list[dict[str, Any]]) -> str:
    """One row per file: status, points per exercise (``*`` = flagged), total."""
    ids = _ids(results)
    header = ["notebook", "status", *ids, "total"]
    rows = []
    for r in results:
        by_id = {e["id"]: f"{e['earned']}/{e['points']}{'*' if e.get('flags') else ''}" for e in r["exercises"]}
        total = f"{r['earned']}/{r['points']}{'*' if r['flags'] else ''}" if r["exercises"] else "0"
        rows.append([r["notebook"], r["status"], *(by_id.get(i, "-") for i in ids), total])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    if any(r["flags"] for r in results):
        lines.append("* flagged: see the flags in the CSV or JSON file")
    copies = [r["notebook"] for r in results if any(f.startswith("solution copy") for f in r["flags"])]
    if copies:
        lines.append(f"solution copies (flagged): {', '.join(copies)}")
    outside = [r["notebook"] for r in results if any("outside its folder" in f or "run a program" in f for f in r["flags"])]
    if outside:
        lines.append(f"reached outside their folder (flagged): {', '.join(outside)}")
    return "\n".join(lines)


def _write(results: list[dict[str, Any]], csv_path: Path | None, json_path: Path | None, sandbox: str) -> None:
    if json_path is not None:
        doc = {"sandbox": sandbox, "statuses": list(STATUSES), "notebooks": results}
        Path(json_path).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if csv_path is not None:
        ids = _ids(results)
        with open(csv_path, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["notebook", "student", "status", "chapter", *ids, "earned", "points", "flags", "reason"])
            for r in results:
                by_id = {e["id"]: e["earned"] for e in r["exercises"]}
                writer.writerow([r["notebook"], r.get("student", ""), r["status"],
                                 r["chapter"] if r["chapter"] is not None else "",
                                 *(by_id.get(i, "") for i in ids), r["earned"], r["points"],
                                 "; ".join(r["flags"]), r["reason"]])


def find_submissions(folder: Path, skip: tuple[Path | None, ...] = ()) -> list[Path]:
    """Every file under ``folder`` at any depth, sorted; not the grader's results (``skip`` and the
    usual names), an export's metadata, hidden files, nor Jupyter's checkpoint copies."""
    folder = Path(folder)
    skipped = {Path(p).resolve() for p in skip if p is not None}
    found = []
    for p in folder.rglob("*"):
        rel = p.relative_to(folder)
        if any(part.startswith(".") or part in SKIPPED_DIRS for part in rel.parts):
            continue
        if p.is_file() and p.name not in RESULT_NAMES and p.resolve() not in skipped:
            found.append(p)
    return sorted(found, key=lambda p: p.relative_to(folder).as_posix())


def _digest(folder: Path, skip: tuple[Path | None, ...] = ()) -> str:
    """A hash of the files under ``folder`` (names and contents), ignoring caches and the result files."""
    skipped = {Path(p).resolve() for p in skip if p is not None}
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.name not in RESULT_NAMES \
                and p.resolve() not in skipped:
            h.update(str(p.relative_to(folder)).encode())
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def _not_traceable() -> None:
    """Linux: no process of the same user may ptrace the grader (PR_SET_DUMPABLE = 0).

    Matters without bubblewrap, where a submission runs as the grader's user."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def grade_folder(
    folder: Path, *, csv_path: Path | None = None, json_path: Path | None = None,
    limits: Limits | None = None, progress: TextIO | None = sys.stderr,
    paths: list[Path] | None = None, skip: tuple[Path | None, ...] = (),
) -> list[dict[str, Any]]:
    """Grade every file under ``folder``, at any depth (one row each, named by its path relative
    to ``folder``; ``paths`` instead grades those files); the CSV and JSON are rewritten after each.

    A folder without notebooks gives rows for what it holds (maybe none) and no error."""
    folder, limits = Path(folder), limits or Limits()
    skip = (csv_path, json_path, *skip)
    paths = find_submissions(folder, skip) if paths is None else list(paths)
    sandbox = sandbox_status()
    sandboxed = sandbox.startswith("bubblewrap")
    hide = hidden_paths(folder, skip)
    _not_traceable()
    watched = {"the companion package": COURSE_ROOT / "companion", "the grader": GRADER_ROOT / "companion_grader",
               "the submissions": folder}
    watched = {what: (where, _digest(where, skip)) for what, where in watched.items() if where.is_dir()}
    notebooks = sum(p.suffix.lower() == ".ipynb" for p in paths)
    if progress:
        others = f" and {len(paths) - notebooks} other files" if len(paths) > notebooks else ""
        print(f"grading {notebooks} notebooks{others} under {folder}, at most {limits.notebook_seconds:g} s each; "
              f"sandbox: {sandbox}", file=progress, flush=True)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="companion-grade-") as root:
        for n, path in enumerate(paths, 1):
            try:
                name = path.relative_to(folder).as_posix()
            except ValueError:
                name = str(path)
            try:
                row = grade_notebook(path, limits=limits, workroot=Path(root), hide=hide, name=name)
            except Exception as err:  # noqa: BLE001 - a bug of the grader must not lose the other rows
                row = {**_row(path, "crashed", f"grader error: {type(err).__name__}: {err}"[:500], name=name),
                       "seconds": None}
                row["errors"] = traceback.format_exc().splitlines()[-5:]
            if not sandboxed:  # without a sandbox a submission could write: at least notice it
                for what, (where, digest) in list(watched.items()):
                    now = _digest(where, skip)
                    if now != digest:
                        row["flags"].append(f"{what} changed on disk while this notebook was graded")
                        watched[what] = (where, now)
                        if progress:
                            print(f"WARNING: {name} changed {what} ({where})", file=progress, flush=True)
            results.append(row)
            _write(results, csv_path, json_path, sandbox)
            if progress:
                total = f" {row['earned']}/{row['points']}" if row["exercises"] else ""
                print(f"[{n}/{len(paths)}] {name}: {row['status']}{total} ({row['seconds']} s)"
                      f"{' - ' + row['reason'] if row['reason'] else ''}", file=progress, flush=True)
    if not results:
        _write(results, csv_path, json_path, sandbox)
    return results
