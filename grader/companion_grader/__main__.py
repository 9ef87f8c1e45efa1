"""Command line: ``python -m companion_grader {grade,gradescope,gradescope-run,make-exercises} ...``.

    python -m companion_grader grade submissions/                       # a table, scores.csv/json
    python -m companion_grader grade submissions/ --roster roster.csv   # + gradebook.csv, canvas.csv
    python -m companion_grader gradescope 2 -o build/                   # build/autograder-ch02.zip
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _limits(args: argparse.Namespace):
    from .sandbox import Limits

    return Limits(notebook_seconds=args.notebook_timeout, cell_seconds=args.cell_timeout,
                  cpu_seconds=int(args.notebook_timeout) + 60, memory_bytes=int(args.memory_gb * 1024**3))


def _add_limits(p: argparse.ArgumentParser) -> None:
    p.add_argument("--notebook-timeout", type=float, default=300, help="wall-clock seconds per notebook (default 300)")
    p.add_argument("--cell-timeout", type=float, default=60, help="seconds one code cell of a submission may run (default 60)")
    p.add_argument("--memory-gb", type=float, default=6, help="address-space limit of a submission's process (default 6)")


def _chapters(text: str) -> list[int]:
    return [int(c) for c in text.replace(",", " ").split()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m companion_grader", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("grade", help="grade every file under a folder of submissions (any depth)")
    g.add_argument("folder", type=Path)
    g.add_argument("--csv", type=Path, default=None, help="write scores as CSV (default: FOLDER/scores.csv)")
    g.add_argument("--json", type=Path, default=None, help="write full results as JSON (default: FOLDER/scores.json)")
    g.add_argument("--roster", type=Path, default=None,
                   help="CSV of students: student_id, name, email, submission (file or folder); see the guide")
    g.add_argument("--chapters", type=_chapters, default=None,
                   help="chapters of the gradebook, e.g. '2,9' (default: those of the graded notebooks)")
    g.add_argument("--gradebook", type=Path, default=None,
                   help="one row per student per chapter, nbgrader's columns (default: gradebook.csv beside the CSV)")
    g.add_argument("--canvas", type=Path, default=None, help="Canvas gradebook import (default: canvas.csv beside the CSV)")
    _add_limits(g)

    z = sub.add_parser("gradescope", help="write a Gradescope autograder zip for one chapter")
    z.add_argument("chapter", type=int)
    z.add_argument("-o", "--out", type=Path, default=Path("."), help="folder for autograder-chNN.zip (default: .)")
    z.add_argument("--repository", default=None, help="git URL of the course (default: repository.url of _config.yml)")
    z.add_argument("--ref", default=None, help="tag or commit to install (default: v + the package version)")
    _add_limits(z)

    r = sub.add_parser("gradescope-run", help="(run by the autograder) grade a submission, write results.json")
    r.add_argument("chapter", type=int)
    r.add_argument("--submission", type=Path, default=Path("/autograder/submission"))
    r.add_argument("--results", type=Path, default=Path("/autograder/results/results.json"))
    _add_limits(r)

    m = sub.add_parser("make-exercises", help="generate student notebooks from solution notebooks")
    m.add_argument("--solutions", type=Path, default=Path("solutions"))
    m.add_argument("--exercises", type=Path, default=Path("exercises"))
    m.add_argument("--check", action="store_true", help="write nothing; exit 1 if any exercise notebook is stale")

    args = parser.parse_args(argv)
    if args.command in ("grade", "gradescope-run") and os.name == "nt":
        parser.error("the instructor's grader needs a POSIX system (Linux, macOS); on Windows run it in WSL")
    if args.command == "grade":
        return _grade(args, parser)
    if args.command == "gradescope":
        from .gradescope import build_autograder

        try:
            path = build_autograder(args.chapter, args.out, repository=args.repository, ref=args.ref,
                                    notebook_timeout=args.notebook_timeout, cell_timeout=args.cell_timeout,
                                    memory_gb=args.memory_gb)
        except ValueError as err:
            parser.error(str(err))
        print(f"wrote {path} (upload it as the autograder of a Gradescope programming assignment)")
        return 0
    if args.command == "gradescope-run":
        from .gradescope import run

        doc = run(args.chapter, args.submission, args.results, limits=_limits(args))
        print(doc["output"])
        print(f"score {doc['score']:g}; wrote {args.results}")
        return 0

    from .authoring import sync_exercises

    stale = sync_exercises(args.solutions, args.exercises, check=args.check)
    verb = "stale" if args.check else "written"
    for path in stale:
        print(f"{verb}: {path}")
    if args.check and stale:
        print("run: python -m companion_grader make-exercises", file=sys.stderr)
        return 1
    return 0


def _grade(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from companion.grading import chapter_exercises

    from . import gradebook as gb
    from .instructor import format_table, grade_folder

    if not args.folder.is_dir():
        parser.error(f"{args.folder} is not a folder (put the submissions in one, at any depth)")
    students = None
    if args.roster is not None:
        try:
            students = gb.read_roster(args.roster)
        except (OSError, ValueError) as err:
            parser.error(f"cannot read the roster: {err}")
    csv_path = args.csv or args.folder / "scores.csv"
    json_path = args.json or args.folder / "scores.json"
    book_path = args.gradebook or csv_path.parent / "gradebook.csv"  # beside the scores
    canvas_path = args.canvas or csv_path.parent / "canvas.csv"
    results = grade_folder(args.folder, csv_path=csv_path, json_path=json_path, limits=_limits(args),
                           skip=(book_path, canvas_path, args.roster))
    for r in results:
        r["student"] = gb.submitter_of(r["notebook"])[0]
    print(format_table(results))
    if not any(r["notebook"].lower().endswith(".ipynb") for r in results):
        print(f"\nNo notebook (.ipynb) found under {args.folder} (searched at every depth; "
              f"{len(results)} other file(s)). Are the students' exercise notebooks in this folder?")
    unclaimed = []
    if students is not None:
        unclaimed = gb.assign_files(students, results, args.folder)
        by_name = {r["notebook"]: r for r in results}
        for st in students:
            for f in st.files:
                by_name[f]["student"] = st.student_id
    else:
        students = gb.students_from_files(results, args.folder)
    students = gb.with_canvas_ids(students)
    chapters = args.chapters or sorted({r["chapter"] for r in results if r["exercises"]})
    try:
        points = {c: sum(e.points for e in chapter_exercises(c)) for c in chapters}
    except ValueError as err:
        parser.error(str(err))
    rows = gb.gradebook_rows(students, results, chapters, points, args.folder)
    gb.write_gradebook(rows, book_path)
    gb.write_canvas(rows, chapters, points, canvas_path)
    from .instructor import _write
    from .sandbox import sandbox_status

    _write(results, csv_path, json_path, sandbox_status())  # now with each file's student
    print(f"\nwrote {csv_path} and {json_path} (one row per file), {book_path} and {canvas_path} "
          f"(one row per student: {len(students)} students, chapters {', '.join(map(str, chapters)) or 'none'})")
    if unclaimed:
        print(f"not on the roster (graded, left out of the gradebook): {', '.join(unclaimed)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
