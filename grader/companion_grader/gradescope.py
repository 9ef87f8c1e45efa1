"""Gradescope: an autograder zip for one chapter, and the command it runs.

    python -m companion_grader gradescope 2 -o build/     # writes build/autograder-ch02.zip

Gradescope builds an image from the zip (it unpacks it into
``/autograder/source`` and runs ``setup.sh`` there once), then, for every
submission, runs ``/autograder/run_autograder``, which finds the files the
student uploaded in ``/autograder/submission`` and must write
``/autograder/results/results.json``. Ours:

* ``setup.sh`` makes a virtual environment and installs the course package and
  this grader from the course's repository at the release tag (the URL of
  ``_config.yml``, as the notebooks' setup cells do; ``--repository`` and
  ``--ref`` change them), and PyTorch's CPU build;
* ``run_autograder`` runs ``python -m companion_grader gradescope-run``, which
  grades every file of the submission at any depth with the local grader
  (bubblewrap where the container allows it, resource limits otherwise) and
  writes ``results.json``: one test per case (``name``, ``score``,
  ``max_score``, ``status``, ``output``: what was expected and what came,
  ``visibility``), the total as ``score``, ``execution_time``, an ``output``
  naming the file graded and the grader's flags, and the rows and flags in
  ``extra_data``. Several notebooks of the chapter: the best counts.
* ``fingerprints.json``: fingerprints (hashes) of the reference solution's
  code, so that a copied solution is flagged without shipping the solution.

Every path is settable, so that the test suite runs the generated
``run_autograder`` in a fake ``/autograder`` tree: ``AUTOGRADER_ROOT``
(default ``/autograder``) and ``AUTOGRADER_PYTHON`` (default the virtual
environment made by ``setup.sh``).
"""

from __future__ import annotations

import json
import stat
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from companion.grading.core import chapter_exercises

__all__ = ["build_autograder", "results_json", "run"]

DEFAULT_REPOSITORY = "https://github.com/transformers-from-scratch/course"

SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image.
# Installs the course package and its instructor's grader at {ref} of {repository}.
set -euo pipefail
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
COURSE="${{COURSE_REQUIREMENT:-git+{repository}@{ref}}}"
GRADER="${{GRADER_REQUIREMENT:-companion-grader @ git+{repository}@{ref}#subdirectory=grader}}"
if command -v apt-get >/dev/null; then
    apt-get update -q
    apt-get install -y -q python3 python3-venv python3-pip git
    apt-get install -y -q bubblewrap || true   # used where the container lets it create namespaces
fi
python3 -m venv "$ROOT/venv"
"$ROOT/venv/bin/pip" install --quiet --upgrade pip
"$ROOT/venv/bin/pip" install --quiet torch --index-url https://download.pytorch.org/whl/cpu
"$ROOT/venv/bin/pip" install --quiet "$COURSE" "$GRADER"
"""

RUN = """#!/usr/bin/env bash
# Gradescope runs this for every submission: grades /autograder/submission (any layout),
# writes /autograder/results/results.json. AUTOGRADER_ROOT and AUTOGRADER_PYTHON change the paths.
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
PYTHON="${{AUTOGRADER_PYTHON:-$ROOT/venv/bin/python}}"
RESULTS="$ROOT/results/results.json"
mkdir -p "$ROOT/results"
export COMPANION_GRADER_FINGERPRINTS="${{COMPANION_GRADER_FINGERPRINTS:-$ROOT/source/fingerprints.json}}"
"$PYTHON" -m companion_grader gradescope-run {chapter} --submission "$ROOT/submission" --results "$RESULTS" \\
    --notebook-timeout {notebook_timeout} --cell-timeout {cell_timeout} --memory-gb {memory_gb}
status=$?
if [ ! -s "$RESULTS" ]; then   # the grader itself failed: still a results.json, with the reason
    printf '{{"score": 0, "output": "The autograder could not run (exit code %s); please tell your instructor.", "tests": []}}\\n' "$status" > "$RESULTS"
fi
"""


def fingerprints(chapter: int) -> dict[str, dict[str, list[str]]]:
    from .instructor import solution_fingerprints

    return {str(chapter): solution_fingerprints(chapter)}


def build_autograder(chapter: int, out: Path, *, repository: str | None = None, ref: str | None = None,
                     notebook_timeout: float = 300, cell_timeout: float = 60, memory_gb: float = 6) -> Path:
    """Write ``out/autograder-chNN.zip`` (and the same files unpacked in ``out/autograder-chNN/``)."""
    exercises = chapter_exercises(chapter)  # raises ValueError for a chapter without exercises
    repository, ref = repository or _repository(), ref or _release_tag()
    files = {
        "setup.sh": SETUP.format(repository=repository, ref=ref),
        "run_autograder": RUN.format(chapter=chapter, notebook_timeout=f"{notebook_timeout:g}",
                                     cell_timeout=f"{cell_timeout:g}", memory_gb=f"{memory_gb:g}"),
        "fingerprints.json": json.dumps(fingerprints(chapter), indent=1) + "\n",
        "README.txt": (f"Gradescope autograder for Chapter {chapter} ({sum(e.points for e in exercises)} points), "
                       f"course {repository} at {ref}.\nMade by: python -m companion_grader gradescope {chapter}\n"),
    }
    out = Path(out)
    folder = out / f"autograder-ch{chapter:02d}"
    folder.mkdir(parents=True, exist_ok=True)
    zpath = out / f"autograder-ch{chapter:02d}.zip"
    with zipfile.ZipFile(zpath, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in files.items():
            (folder / name).write_text(text, encoding="utf-8")
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            mode = 0o755 if name in ("setup.sh", "run_autograder") else 0o644
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, text)
            (folder / name).chmod(mode)
    return zpath


def _repository() -> str:
    """``repository.url`` of the course's ``_config.yml`` (where the repository is at hand)."""
    from .sandbox import COURSE_ROOT

    config = COURSE_ROOT / "_config.yml"
    try:
        import yaml

        return yaml.safe_load(config.read_text(encoding="utf-8"))["repository"]["url"]
    except Exception:  # noqa: BLE001 - an installed package without the repository around it
        return DEFAULT_REPOSITORY


def _release_tag() -> str:
    """``v`` + the course package's version: the tag of its release (as tools/notebooks.py)."""
    import companion

    return f"v{getattr(companion, '__version__', '0.1.0')}"


# ------------------------------------------------------------------ grading one submission

def results_json(rows: list[dict[str, Any]], chapter: int, seconds: float, sandbox: str) -> dict[str, Any]:
    """Gradescope's results.json for one submission (its files' rows, from the local grader)."""
    exercises = chapter_exercises(chapter)
    possible = sum(e.points for e in exercises)
    ours = [r for r in rows if r["chapter"] == chapter and r["exercises"]]
    best = max(ours, key=lambda r: r["earned"], default=None)
    lines: list[str] = []
    tests: list[dict[str, Any]] = []
    if best is None:
        found = "; ".join(f"{r['notebook']}: {r['status']}" + (f" ({r['reason']})" if r["reason"] else "")
                          for r in rows[:10]) or "no file at all"
        why = f"No notebook of Chapter {chapter} was graded. Submit your exercise notebook (.ipynb). Found: {found}"
        lines.append(why)
        for ex in exercises:
            for case in ex.cases:
                tests.append(_test(ex.id, ex.title, case.name, 0, case.points, "not graded: " + why[:300]))
    else:
        lines.append(f"Graded {best['notebook']}: {best['earned']}/{best['points']} points"
                     + (f" ({best['status']}: {best['reason']})" if best["status"] != "graded" else "") + ".")
        if len(ours) > 1:
            lines.append(f"{len(ours)} notebooks of Chapter {chapter} were submitted; the best counts: "
                         + ", ".join(f"{r['notebook']} {r['earned']}/{r['points']}" for r in ours) + ".")
        for ex in best["exercises"]:
            for case in ex["cases"]:
                tests.append(_test(ex["id"], ex["title"], case["name"], case["earned"], case["points"],
                                   case["message"]))
    others = [r for r in rows if r is not best and r not in ours]
    for r in others:
        lines.append(f"Not graded: {r['notebook']} ({r['status']}{': ' + r['reason'] if r['reason'] else ''}).")
    flags = [f"{r['notebook']}: {f}" for r in rows for f in r["flags"]]
    if flags:
        lines.append("Flags for the instructor (a person will look; a flag does not change the score):")
        lines += [f"  - {f}" for f in flags]
    errors = best["errors"] if best is not None else []
    if errors:
        lines.append("While your notebook ran: " + "; ".join(errors[:5]))
    score = float(best["earned"]) if best is not None else 0.0
    return {
        "score": score,
        "execution_time": int(round(seconds)),
        "output": "\n".join(lines),
        "output_format": "text",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
        "extra_data": {"chapter": chapter, "max_score": possible, "flags": flags, "sandbox": sandbox,
                       "graded": best["notebook"] if best is not None else None,
                       "files": [{k: r[k] for k in ("notebook", "status", "reason", "earned", "points", "flags")}
                                 for r in rows]},
    }


def _test(ex_id: str, title: str, case: str, earned: int, points: int, message: str) -> dict[str, Any]:
    passed = earned == points
    return {"name": f"Exercise {ex_id}: {title} - {case}", "number": ex_id, "score": float(earned),
            "max_score": float(points), "status": "passed" if passed else "failed",
            "output": message or ("passed" if passed else ""), "visibility": "visible"}


def run(chapter: int, submission: Path, results: Path, limits: Any = None) -> dict[str, Any]:
    """Grade ``submission`` (a folder, any layout) for ``chapter`` and write ``results``; never raises."""
    start = time.monotonic()
    results = Path(results)
    results.parent.mkdir(parents=True, exist_ok=True)
    try:
        from .instructor import grade_folder
        from .sandbox import sandbox_status

        submission = Path(submission)
        with tempfile.TemporaryDirectory(prefix="companion-gradescope-") as tmp:
            rows = grade_folder(submission, json_path=Path(tmp) / "scores.json", limits=limits, progress=sys.stderr) \
                if submission.is_dir() else []
        doc = results_json(rows, chapter, time.monotonic() - start, sandbox_status())
    except Exception as err:  # noqa: BLE001 - Gradescope must get a results.json whatever happens
        doc = {"score": 0.0, "execution_time": int(round(time.monotonic() - start)), "tests": [],
               "output": f"The autograder failed: {type(err).__name__}: {err}. Please tell your instructor.",
               "extra_data": {"chapter": chapter, "flags": [], "error": repr(err)[:1000]}}
    results.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return doc
