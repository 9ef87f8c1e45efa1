"""Structure of the notebooks: synced, executed, listed in the book, checkable."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BOOK = sorted((ROOT / "book").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))


def load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def source(cell):
    return "".join(cell["source"])


def test_setup_cells_and_exercises_are_in_sync():
    proc = subprocess.run([sys.executable, "tools/notebooks.py", "check"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def toc_files():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [c["file"] for c in part["chapters"]]
    return files


def test_every_chapter_is_in_the_toc_and_every_toc_entry_exists():
    listed = toc_files()
    for path in BOOK:
        assert f"book/{path.stem}" in listed, f"{path.name} is not in _toc.yml"
    for entry in listed:
        assert any((ROOT / f"{entry}{ext}").exists() for ext in (".md", ".ipynb")), entry


@pytest.mark.parametrize("path", BOOK + SOLUTIONS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_notebooks_are_executed_without_errors(path):
    nb = load(path)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c["execution_count"] is not None for c in code), "run the notebook and commit its outputs"
    errors = [o for c in code for o in c["outputs"] if o["output_type"] == "error"]
    assert not errors, errors[0].get("ename")
    first = nb["cells"][0]
    assert first["cell_type"] == "markdown" and source(first).startswith("# ")


@pytest.mark.parametrize("path", BOOK, ids=lambda p: p.name)
def test_chapter_headings_and_glue(path):
    nb = load(path)
    md = "\n".join(source(c) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert len(re.findall(r"^# ", md, flags=re.M)) == 1, "one top-level heading per chapter"
    code = "\n".join(source(c) for c in nb["cells"] if c["cell_type"] == "code")
    used = set(re.findall(r"\{glue(?::\w+)?\}`([A-Za-z0-9_]+)", md))
    defined = set(re.findall(r"glue\(\s*\"([A-Za-z0-9_]+)\"", code))
    assert used <= defined, f"glue keys used in prose but never glued: {sorted(used - defined)}"


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.name)
def test_exercise_notebooks_have_no_outputs_and_no_solutions(path):
    nb = load(path)
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None
            assert "BEGIN SOLUTION" not in source(cell)


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_solution_notebooks_are_gradable(path):
    nb = load(path)
    chapter = nb["metadata"]["companion"]["chapter"]
    assert path.name.startswith(f"ch{chapter:02d}_")
    tags = [t for c in nb["cells"] for t in c.get("metadata", {}).get("tags", [])]
    assert tags.count("score") == 1 and tags.count("check") >= 3
    checks = [source(c) for c in nb["cells"] if "check" in c.get("metadata", {}).get("tags", [])]
    assert all(s.strip().startswith("check(") for s in checks)


@pytest.mark.parametrize("path", BOOK + SOLUTIONS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_nbval_markers_are_well_formed(path):
    """nbval honours `# NBVAL_IGNORE_OUTPUT` only as a whole comment line; anything else is silently ignored."""
    for cell in load(path)["cells"]:
        for line in source(cell).splitlines():
            if "NBVAL_" in line and line.strip().startswith("#"):
                assert line.strip().lstrip("#").strip() in {
                    "NBVAL_IGNORE_OUTPUT", "NBVAL_CHECK_OUTPUT", "NBVAL_SKIP", "NBVAL_RAISES_EXCEPTION"
                }, f"malformed nbval marker: {line.strip()!r}"
