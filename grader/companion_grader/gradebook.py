"""A gradebook keyed by student: one row per student per chapter, for an LMS.

    python -m companion_grader grade submissions/ --roster roster.csv

The grader's own table has one row per file. An LMS wants one row per student
and a 0 for a student who handed nothing in. This module maps files to students
and writes two CSV files:

* ``gradebook.csv``, in the column order of nbgrader's gradebook export
  (``assignment, duedate, timestamp, student_id, last_name, first_name, email,
  raw_score, late_submission_penalty, score, max_score``), followed by
  ``reason``, ``flags`` and ``files``: one row per student per chapter, with
  0 and the reason when the submission is missing, is not a notebook or holds
  no notebook of that chapter;
* ``canvas.csv``, which Canvas's gradebook import takes: ``Student, ID,
  SIS User ID, Section``, a ``Points Possible`` row, then one column per
  chapter's exercises.

The roster is a CSV with a header; recognised columns (any case): ``student_id``
(or ``id``, ``sid``), ``name`` ("First Last" or "Last, First") or ``first_name``
and ``last_name``, ``email``, ``submission`` (a file or folder, relative to the
graded folder; empty: the files whose submitter id is the student's), and
optionally ``section`` and ``canvas_id`` (Canvas's own user id, its column ``ID``).

Without a roster the students are the submitters the files' paths name, as
the bulk downloads do: Gradescope's export (``submission_<id>/...``, with the
names and emails of its ``submission_metadata.yml`` when present), Canvas's
(``<name>[_LATE]_<user id>_<submission id>_<file>``), or else the top folder or
the file name.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = ["Student", "read_roster", "submitter_of", "students_from_files", "gradebook_rows",
           "write_gradebook", "write_canvas", "NBGRADER_COLUMNS"]

NBGRADER_COLUMNS = ["assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email",
                    "raw_score", "late_submission_penalty", "score", "max_score"]
CANVAS = re.compile(r"^(?P<name>[a-z0-9]+?)(?P<late>_LATE)?_(?P<uid>\d+)_(?P<sid>\d+)_(?P<file>.+)$")
GRADESCOPE = re.compile(r"^submission_(?P<id>\d+)$")


@dataclass
class Student:
    student_id: str
    first_name: str = ""
    last_name: str = ""
    email: str = ""
    section: str = ""
    canvas_id: str = ""
    submission: str = ""  # as the roster gives it
    files: list[str] = field(default_factory=list)  # relative paths of the rows that are this student's
    missing: str = ""  # why no file is there, when none is


def _split_name(name: str) -> tuple[str, str]:
    name = " ".join(name.split())
    if "," in name:
        last, first = (p.strip() for p in name.split(",", 1))
        return first, last
    first, _, last = name.rpartition(" ")
    return (first, last) if first else ("", last)


def read_roster(path: Path) -> list[Student]:
    """The roster's students, in its order; raises ``ValueError`` saying which column is missing."""
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        header = {h.strip().lower(): h for h in reader.fieldnames or []}

        def col(row: dict[str, str], *names: str) -> str:
            for n in names:
                if n in header:
                    return (row.get(header[n]) or "").strip()
            return ""

        if not any(n in header for n in ("student_id", "id", "sid")):
            raise ValueError(f"{path}: the roster needs a column student_id (or id, sid); it has {', '.join(header)}")
        students = []
        for row in reader:
            sid = col(row, "student_id", "id", "sid")
            if not sid:
                continue
            first, last = col(row, "first_name", "first"), col(row, "last_name", "last")
            if not (first or last):
                first, last = _split_name(col(row, "name", "student"))
            students.append(Student(sid, first, last, col(row, "email"), col(row, "section"),
                                    col(row, "canvas_id", "canvas id"), col(row, "submission", "file", "folder", "path")))
    return students


def submitter_of(rel: str) -> tuple[str, str]:
    """``(submitter id, name)`` from a file's path relative to the graded folder, as bulk downloads name them."""
    parts = Path(rel).parts
    for part in parts[:-1]:
        found = GRADESCOPE.match(part)
        if found:
            return found.group("id"), ""
    found = CANVAS.match(parts[0]) if len(parts) == 1 else None
    if found:
        return found.group("uid"), found.group("name")
    if len(parts) > 1:
        return parts[0], ""
    return Path(parts[0]).stem, ""


def _gradescope_metadata(folder: Path) -> dict[str, dict[str, str]]:
    """``submission_<id>`` -> name, sid, email of its first submitter, from Gradescope's export metadata."""
    path = folder / "submission_metadata.yml"
    if not path.is_file():
        return {}
    try:
        import yaml

        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except Exception:  # noqa: BLE001 - no PyYAML, or not the file we know: the folder names are enough
        return {}
    found = {}
    for key, value in doc.items() if isinstance(doc, dict) else ():
        subs = value.get(":submitters") or value.get("submitters") if isinstance(value, dict) else None
        if isinstance(subs, list) and subs and isinstance(subs[0], dict):
            who = {str(k).lstrip(":"): str(v) for k, v in subs[0].items()}
            found[str(key).lstrip(":")] = who
    return found


def students_from_files(results: list[dict[str, Any]], folder: Path | None = None) -> list[Student]:
    """One student per submitter id found in the rows' paths, in order of first appearance."""
    meta = _gradescope_metadata(Path(folder)) if folder is not None else {}
    students: dict[str, Student] = {}
    for r in results:
        sid, name = submitter_of(r["notebook"])
        if sid not in students:
            first, last = "", name
            email = ""
            folder_name = f"submission_{sid}"
            if folder_name in meta:
                first, last = _split_name(meta[folder_name].get("name", ""))
                email = meta[folder_name].get("email", "")
                sid_meta = meta[folder_name].get("sid", "")
                students[sid] = Student(sid_meta or sid, first, last, email)
                students[sid].canvas_id = ""
            else:
                students[sid] = Student(sid, first, last, email)
        students[sid].files.append(r["notebook"])
    return list(students.values())


def assign_files(students: list[Student], results: list[dict[str, Any]], folder: Path) -> list[str]:
    """Give each roster student the rows under their submission path (or, without one, those whose
    submitter id is theirs); returns the files nobody claims."""
    folder = Path(folder).resolve()
    claimed: set[str] = set()
    names = [r["notebook"] for r in results]
    for st in students:
        st.files = []
        if st.submission:
            target = Path(st.submission)
            target = (target if target.is_absolute() else folder / target).resolve()
            try:
                rel = target.relative_to(folder).as_posix()
            except ValueError:
                rel = str(target)
            st.files = [n for n in names if n == rel or n.startswith(rel.rstrip("/") + "/")]
            if not st.files:
                st.missing = (f"no submission: {st.submission} does not exist" if not target.exists()
                              else f"no submission: nothing in {st.submission}")
        else:
            st.files = [n for n in names if submitter_of(n)[0] == st.student_id]
            if not st.files:
                st.missing = f"no submission: no file names the student id {st.student_id}"
        claimed.update(st.files)
    return [n for n in names if n not in claimed]


def _timestamp(folder: Path, rel: str) -> str:
    try:
        when = (Path(folder) / rel).stat().st_mtime
    except OSError:
        return ""
    return datetime.fromtimestamp(when, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def gradebook_rows(students: list[Student], results: list[dict[str, Any]], chapters: list[int],
                   points: dict[int, int], folder: Path, assignment: str = "ch{chapter:02d}") -> list[dict[str, Any]]:
    """One row per student per chapter (nbgrader's columns, then reason, flags, files)."""
    by_name = {r["notebook"]: r for r in results}
    rows = []
    for st in students:
        mine = [by_name[f] for f in st.files if f in by_name]
        for chapter in chapters:
            ofc = [r for r in mine if r["chapter"] == chapter and r["exercises"]]
            best = max(ofc, key=lambda r: r["earned"], default=None)
            if best is not None:
                reason = best["reason"] or ("" if best["status"] == "graded" else best["status"])
                if len(ofc) > 1:
                    reason = "; ".join(filter(None, [reason, f"best of {len(ofc)} notebooks of chapter {chapter}: "
                                                     + ", ".join(r["notebook"] for r in ofc)]))
                raw, flags, files, stamp = best["earned"], best["flags"], [best["notebook"]], _timestamp(folder, best["notebook"])
            else:
                raw, flags, files, stamp = 0, [], [r["notebook"] for r in mine], ""
                if not mine:
                    reason = st.missing or "no submission"
                else:
                    what = "; ".join(f"{r['notebook']}: {r['status']}" + (f" ({r['reason']})" if r["reason"] else "")
                                     for r in mine[:3]) + (f"; and {len(mine) - 3} more" if len(mine) > 3 else "")
                    reason = f"no notebook of chapter {chapter} was graded; submitted: {what}"
            rows.append({"assignment": assignment.format(chapter=chapter), "duedate": "", "timestamp": stamp,
                         "student_id": st.student_id, "last_name": st.last_name, "first_name": st.first_name,
                         "email": st.email, "raw_score": float(raw), "late_submission_penalty": 0.0,
                         "score": float(raw), "max_score": float(points[chapter]), "reason": reason,
                         "flags": "; ".join(flags), "files": "; ".join(files), "chapter": chapter,
                         "_student": st})
    return rows


def write_gradebook(rows: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow([*NBGRADER_COLUMNS, "reason", "flags", "files"])
        for r in rows:
            writer.writerow([r[c] for c in (*NBGRADER_COLUMNS, "reason", "flags", "files")])


def canvas_column(chapter: int) -> str:
    return f"Chapter {chapter} exercises"


def write_canvas(rows: list[dict[str, Any]], chapters: list[int], points: dict[int, int], path: Path) -> None:
    """Canvas's gradebook import: Student ("Last, First"), ID (Canvas's), SIS User ID, Section,
    a "Points Possible" row, then a column per chapter. Canvas matches a row by ID or SIS User ID."""
    students: dict[str, tuple[Student, dict[int, float]]] = {}
    for r in rows:
        st = r["_student"]
        students.setdefault(st.student_id, (st, {}))[1][r["chapter"]] = r["score"]
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["Student", "ID", "SIS User ID", "Section", *(canvas_column(c) for c in chapters)])
        writer.writerow(["    Points Possible", "", "", "", *(points[c] for c in chapters)])
        for st, scores in students.values():
            name = ", ".join(p for p in (st.last_name, st.first_name) if p) or st.student_id
            sis = "" if st.canvas_id == st.student_id else st.student_id  # an id from Canvas's own file names
            writer.writerow([name, st.canvas_id, sis, st.section,
                             *(_number(scores.get(c, 0.0)) for c in chapters)])


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def with_canvas_ids(students: list[Student]) -> list[Student]:
    """Canvas's user id, when a Canvas download named the files (``name_<user id>_<submission id>_file``)."""
    out = []
    for st in students:
        uid = next((m.group("uid") for f in st.files if (m := CANVAS.match(Path(f).name))), "")
        out.append(replace(st, canvas_id=st.canvas_id or uid))
    return out
