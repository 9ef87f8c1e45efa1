"""Structure of the notebooks: synced, executed, listed in the book, checkable."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sitebuild import toc_docnames

ROOT = Path(__file__).resolve().parents[1]
BOOK = sorted((ROOT / "book").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb")) + sorted((ROOT / "exercises" / "zh_CN").glob("*.ipynb"))


def load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def source(cell):
    return "".join(cell["source"])


def test_setup_cells_and_exercises_are_in_sync():
    proc = subprocess.run([sys.executable, "tools/notebooks.py", "check"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_chapter_is_in_the_toc_and_every_toc_entry_exists():
    listed = toc_docnames()
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


HIDDEN_ON_THE_SITE = {"remove-cell", "remove-input", "hide-input", "hide-cell"}


@pytest.mark.parametrize("path", BOOK, ids=lambda p: p.name)
def test_the_reader_sees_no_glue_plumbing_and_no_setup_before_the_first_section(path):
    # The website shows prose, the code that teaches and its output: `glue` calls live in cells
    # removed from the page, and the set-up above the first section (install, imports) is folded.
    visible = []
    before_first_section = True
    for i, cell in enumerate(load(path)["cells"]):
        if cell["cell_type"] == "markdown":
            if re.search(r"^## ", source(cell), flags=re.M):
                before_first_section = False
            continue
        if set(cell["metadata"].get("tags", [])) & HIDDEN_ON_THE_SITE:
            continue
        assert not before_first_section, f"{path.name}: code cell {i} is shown above the first section"
        if re.search(r"\bglue\(", source(cell)):
            visible.append(i)
    assert not visible, f"{path.name}: glue(...) in cells the website shows: {visible} (move it to a remove-cell cell)"


@pytest.mark.parametrize("path", BOOK, ids=lambda p: p.name)
def test_a_chapter_opens_with_its_goals_and_ends_with_a_summary_and_further_reading(path):
    cells = load(path)["cells"]
    opening = source(cells[0])
    goals = opening.split("**In this chapter you will:**")
    assert len(goals) == 2, f"{path.name}: the opening cell has no '**In this chapter you will:**' list"
    bullets = re.findall(r"^[-*] \S", goals[1], flags=re.M)
    assert 3 <= len(bullets) <= 8, f"{path.name}: {len(bullets)} goals listed, expected 3 to 8"
    sections = [(i, h) for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                for h in re.findall(r"^## (.+)$", source(c), flags=re.M)]
    assert [h.strip() for _, h in sections[-2:]] == ["Summary", "Further reading"], \
        f"{path.name}: the last two sections are {[h for _, h in sections[-2:]]}, expected Summary, Further reading"
    further = "\n".join(source(c) for c in cells[sections[-1][0]:] if c["cell_type"] == "markdown")
    assert "{cite" in further, f"{path.name}: Further reading cites nothing"


@pytest.mark.parametrize("path", BOOK, ids=lambda p: p.name)
def test_a_chapter_has_a_conceptual_diagram_with_alt_text_and_caption(path):
    prefix = f"fig-ch{path.name[2:4]}-diagram-"
    found = []
    for cell in load(path)["cells"]:
        meta = cell["metadata"].get("mystnb", {})
        name = meta.get("figure", {}).get("name", "")
        if cell["cell_type"] != "code" or not name.startswith(prefix):
            continue
        alt, caption = meta.get("image", {}).get("alt", ""), meta["figure"].get("caption", "")
        assert len(alt.split()) >= 8, f"{path.name}: {name} needs alt text a reader can use, got {alt!r}"
        assert caption.strip(), f"{path.name}: {name} has no caption"
        assert "remove-input" in cell["metadata"].get("tags", []), f"{path.name}: {name} shows its drawing code"
        assert any("image/png" in o.get("data", {}) for o in cell["outputs"]), f"{path.name}: {name} has no image"
        found.append(name)
    assert found, f"{path.name}: no conceptual diagram (a figure cell named {prefix}...)"


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: str(p.relative_to(ROOT / "exercises")))
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


NBVAL_TAGS = {"nbval-ignore-output", "nbval-check-output", "nbval-skip", "raises-exception", "nbval-raises-exception"}


@pytest.mark.parametrize("path", BOOK + SOLUTIONS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_nbval_markers_are_cell_tags_with_a_reason(path):
    """nbval markers live in cell metadata (the website never shows them), and the
    cell's first line says why its output is not compared."""
    for i, cell in enumerate(load(path)["cells"]):
        assert "NBVAL_" not in source(cell), f"cell {i}: use a cell tag (nbval-ignore-output), not a # NBVAL_ comment"
        tags = set(cell.get("metadata", {}).get("tags", []))
        assert not {t for t in tags if t.startswith("nbval")} - NBVAL_TAGS, f"cell {i}: unknown nbval tag in {sorted(tags)}"
        if tags & {"nbval-ignore-output", "nbval-skip"}:
            assert source(cell).lstrip().startswith("#"), f"cell {i}: say in a first comment line why the output varies"


def glue_records(nb):
    """{name: stored text} of every glue record in the notebook's outputs."""
    out = {}
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            meta = o.get("metadata", {}).get("scrapbook")
            if meta and "application/papermill.record/text/plain" in o.get("data", {}):
                out[meta["name"]] = o["data"]["application/papermill.record/text/plain"]
    return out


def _float_or_none(text):
    try:
        value = float(text)
    except ValueError:
        return None
    return None if re.fullmatch(r"-?\d+", text.strip()) else value


@pytest.mark.parametrize("path", BOOK, ids=lambda p: p.name)
def test_glued_floats_are_stored_at_the_precision_the_prose_shows(path):
    """nbval compares glue records: a float stored in full differs between CPUs in its last
    digits. Every glued float is shown in prose with a format spec and stored already
    rounded to it (companion.notebook.glue(name, value, fmt))."""
    nb = load(path)
    md = "\n".join(source(c) for c in nb["cells"] if c["cell_type"] == "markdown")
    specs = {}
    for name, spec in re.findall(r"\{glue(?::text)?\}`([A-Za-z0-9_]+)(?::([^`]*))?`", md):
        specs.setdefault(name, set()).add(spec)
    problems = []
    for name, text in glue_records(nb).items():
        value = _float_or_none(text)
        if value is None:
            continue
        shown = specs.get(name)
        if not shown:
            problems.append(f"{name}={text}: a glued float that no prose shows (glue it with the precision it is used at, or not at all)")
            continue
        for spec in shown:
            if not spec:
                problems.append(f"{name}={text}: shown without a format spec")
                continue
            finest = format(value, spec)
            if "e" in spec or "g" in spec:
                ok = float(format(value, spec).replace(",", "")) == value
            else:
                # stored value must carry no digit beyond what the spec shows
                ok = abs(float(finest.replace(",", "").rstrip("%")) / (100 if finest.endswith("%") else 1) - value) < 1e-12 * max(1.0, abs(value))
            if not ok:
                problems.append(f"{name}={text}: stored with more digits than the prose shows ({spec!r})")
    assert not problems, "\n".join(problems)
