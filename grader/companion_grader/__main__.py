"""Command line: ``python -m companion_grader {grade,make-exercises} ...``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m companion_grader", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("grade", help="grade a folder of submitted exercise notebooks")
    g.add_argument("folder", type=Path)
    g.add_argument("--csv", type=Path, default=None, help="write scores as CSV (default: FOLDER/scores.csv)")
    g.add_argument("--json", type=Path, default=None, help="write full results as JSON (default: FOLDER/scores.json)")
    g.add_argument("--notebook-timeout", type=float, default=300, help="wall-clock seconds per notebook (default 300)")
    g.add_argument("--cell-timeout", type=float, default=60, help="seconds one code cell of a submission may run (default 60)")
    g.add_argument("--memory-gb", type=float, default=6, help="address-space limit of a submission's process (default 6)")

    m = sub.add_parser("make-exercises", help="generate student notebooks from solution notebooks")
    m.add_argument("--solutions", type=Path, default=Path("solutions"))
    m.add_argument("--exercises", type=Path, default=Path("exercises"))
    m.add_argument("--check", action="store_true", help="write nothing; exit 1 if any exercise notebook is stale")

    args = parser.parse_args(argv)
    if args.command == "grade":
        if os.name == "nt":
            parser.error("the instructor's grader needs a POSIX system (Linux, macOS); on Windows run it in WSL")
        from .instructor import Limits, format_table, grade_folder

        csv_path = args.csv or args.folder / "scores.csv"
        json_path = args.json or args.folder / "scores.json"
        limits = Limits(notebook_seconds=args.notebook_timeout, cell_seconds=args.cell_timeout,
                        cpu_seconds=int(args.notebook_timeout) + 60, memory_bytes=int(args.memory_gb * 1024**3))
        results = grade_folder(args.folder, csv_path=csv_path, json_path=json_path, limits=limits)
        print(format_table(results))
        print(f"\nwrote {csv_path} and {json_path}")
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


if __name__ == "__main__":
    sys.exit(main())
