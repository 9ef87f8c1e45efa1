"""Hostile submissions against the instructor's grader (fixtures: tests/fixtures/submissions/build.py).

Every file gets a row with the score and status it deserves, at any depth of
the folder, nothing outside the temporary copies changes, reads and writes
outside a submission's folder (a second copy of the course included) gain
nothing and are flagged, copies of the solution notebook are flagged, and the
batch ends within its stated bound.
"""

import hashlib
import os
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "submissions"
NOTEBOOK_SECONDS, CELL_SECONDS = 40, 5  # 40: a notebook that restarts its worker 5 times needs ~25 s on 2 busy cores
# Upper bound of the batch: the hanging notebook uses its whole limit, the slow
# case its 10 s, every other notebook a few seconds (restarts included).
BOUND_SECONDS = 2 * NOTEBOOK_SECONDS + 10 + 6 * len(list(FIXTURES.rglob("*.ipynb")))

# notebook -> (status, {exercise: earned})
EXPECTED = {
    "sol-ch02.ipynb": ("graded", {"2.1": 8, "2.2": 5, "2.3": 6, "2.4": 9}),
    "sol-ch09.ipynb": ("graded", {"9.1": 8, "9.2": 7, "9.3": 6, "9.4": 6, "9.5": 12, "9.6": 11}),
    "untouched-ch02.ipynb": ("graded", {"2.1": 0, "2.2": 0, "2.3": 0, "2.4": 0}),
    "untouched-ch09.ipynb": ("graded", {"9.1": 0, "9.2": 0, "9.3": 0, "9.4": 0, "9.5": 0, "9.6": 0}),
    "h-patches-run-case.ipynb": ("graded", {"2.1": 0, "2.2": 0, "2.3": 0, "2.4": 0}),
    "h-wraps-grade-namespace.ipynb": ("graded", {"9.1": 0, "9.2": 0, "9.3": 0, "9.4": 0, "9.5": 0, "9.6": 0}),
    "h-writes-outside.ipynb": ("graded", {"2.1": 8, "2.2": 5, "2.3": 6, "2.4": 9}),
    "h-hangs-ignoring-sigint.ipynb": ("graded", {"2.1": 8, "2.2": 5, "2.3": 6, "2.4": 9}),
    "h-hangs-every-call.ipynb": ("timeout", {"2.1": 0, "2.2": 0, "2.3": 0, "2.4": 0}),
    "h-not-json.ipynb": ("invalid notebook", {}),
    "h-no-companion-metadata.ipynb": ("not an exercise", {}),
    "h-prints-without-newline.ipynb": ("graded", {"2.1": 8, "2.2": 5, "2.3": 6, "2.4": 9}),
    "h-one-slow-case.ipynb": ("graded", {"9.1": 6, "9.2": 7, "9.3": 6, "9.4": 6, "9.5": 12, "9.6": 11}),
    "h-kills-its-process.ipynb": ("graded", {"9.1": 8, "9.2": 0, "9.3": 6, "9.4": 6, "9.5": 12, "9.6": 11}),
    "h-scales-q-in-place.ipynb": ("graded", {"2.1": 8, "2.2": 5, "2.3": 6, "2.4": 9}),
    "h-zeroes-its-inputs.ipynb": ("graded", {"2.1": 0, "2.2": 0, "2.3": 0, "2.4": 0}),
    "h-all-nan.ipynb": ("graded", {"2.1": 0, "2.2": 0, "2.3": 0, "2.4": 0}),
    "h-imports-reference-ch02.ipynb": ("graded", {"2.1": 8, "2.2": 5, "2.3": 0, "2.4": 0}),
    "h-imports-reference-ch09.ipynb": ("graded", {"9.1": 0, "9.2": 7, "9.3": 0, "9.4": 6, "9.5": 0, "9.6": 0}),
    "h-defines-in-check-cell.ipynb": ("graded", {"2.1": 8, "2.2": 5, "2.3": 6, "2.4": 9}),
    "h-copies-other-solutions.ipynb": ("graded", {"2.1": 0, "2.2": 0, "2.3": 0, "2.4": 0}),
    "h-fills-disk-and-memory.ipynb": ("graded", {"2.1": 8, "2.2": 5, "2.3": 6, "2.4": 9}),
    "h-hides-its-import.ipynb": ("graded", {"2.1": 8, "2.2": 0, "2.3": 0, "2.4": 0}),
    "h-reads-install-clone.ipynb": ("graded", {"2.1": 0, "2.2": 0, "2.3": 0, "2.4": 0}),
    "h-reads-second-copy.ipynb": ("graded", {"2.1": 0, "2.2": 0, "2.3": 0, "2.4": 0}),
    "own-work-ch02.ipynb": ("graded", {"2.1": 0, "2.2": 5, "2.3": 0, "2.4": 0}),
    "nested/submission_1001/ch02_attention.ipynb": ("graded", {"2.1": 0, "2.2": 0, "2.3": 0, "2.4": 0}),
    "nested/submission_1002/work/deeper/ch09_gpt.ipynb": ("graded", {"9.1": 0, "9.2": 0, "9.3": 0, "9.4": 0, "9.5": 0,
                                                                    "9.6": 0}),
    "nested/submission_1003/homework.pdf": ("not a notebook", {}),
    "nested/submission_1003/answers_ch09.py": ("not a notebook", {}),
}
# Built from the solution notebooks: flagged as copies (markers, metadata, identical code), besides the rest.
FROM_SOLUTIONS = {name for name in EXPECTED if name.startswith("sol-")} | {
    "h-writes-outside.ipynb", "h-hangs-ignoring-sigint.ipynb", "h-hangs-every-call.ipynb",
    "h-prints-without-newline.ipynb", "h-one-slow-case.ipynb", "h-kills-its-process.ipynb",
    "h-scales-q-in-place.ipynb", "h-fills-disk-and-memory.ipynb", "h-defines-in-check-cell.ipynb"}


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def fixture_files() -> list[str]:
    return sorted(p.relative_to(FIXTURES).as_posix() for p in FIXTURES.rglob("*")
                  if p.is_file() and p.name != "build.py" and "__pycache__" not in p.parts)


def test_every_fixture_has_an_expected_row():
    assert fixture_files() == sorted(EXPECTED)


def not_copy_flags(row):
    return [f for f in row["flags"] if not f.startswith("solution copy")]


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    from companion_grader.sandbox import sandbox_status

    if not sys.platform.startswith("linux"):
        pytest.skip("the sandbox (bubblewrap) is Linux only; elsewhere the grader falls back and says so")
    if not sandbox_status().startswith("bubblewrap"):
        # Without a sandbox these submissions would really rewrite the package and the other notebooks.
        pytest.skip("the hostile submissions need bubblewrap (apt-get install bubblewrap): " + sandbox_status())
    folder = tmp_path_factory.mktemp("hostile")
    clone = tmp_path_factory.mktemp("clone")  # a teaching assistant's second copy of the course
    shutil.copytree(ROOT / "solutions", clone / "solutions")
    for name in fixture_files():
        text = (FIXTURES / name).read_text(encoding="utf-8").replace("@@FOLDER@@", str(folder))
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text.replace("@@CLONE@@", str(clone)), encoding="utf-8")
    out = tmp_path_factory.mktemp("results")
    before = {"companion": digest(ROOT / "companion"), "grader": digest(ROOT / "grader"), "submissions": digest(folder),
              "fixtures": digest(FIXTURES), "clone": digest(clone)}
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "companion_grader", "grade", str(folder), "--csv", str(out / "scores.csv"),
         "--json", str(out / "scores.json"), "--notebook-timeout", str(NOTEBOOK_SECONDS),
         "--cell-timeout", str(CELL_SECONDS)],
        capture_output=True, text=True, timeout=BOUND_SECONDS + 60,
    )
    elapsed = time.monotonic() - start
    after = {"companion": digest(ROOT / "companion"), "grader": digest(ROOT / "grader"), "submissions": digest(folder),
             "fixtures": digest(FIXTURES), "clone": digest(clone)}
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "scores.json").read_text())
    return {"proc": proc, "elapsed": elapsed, "before": before, "after": after, "doc": doc,
            "rows": {r["notebook"]: r for r in doc["notebooks"]}, "folder": folder, "clone": clone,
            "csv": (out / "scores.csv").read_text()}


def test_scores_and_statuses(batch):
    got = {name: (r["status"], {e["id"]: e["earned"] for e in r["exercises"]}) for name, r in batch["rows"].items()}
    assert got == EXPECTED


def test_nothing_outside_the_temporary_copies_changed(batch):
    assert batch["after"] == batch["before"]
    assert not (batch["folder"] / "escaped.txt").exists() and not (batch["clone"] / "escaped.txt").exists()


def test_the_batch_ends_within_its_bound(batch):
    assert batch["elapsed"] < BOUND_SECONDS, batch["elapsed"]
    # the stated bound of one notebook: its limit, plus the moment it takes to kill the worker
    slow = {name: r["seconds"] for name, r in batch["rows"].items() if r["seconds"] > NOTEBOOK_SECONDS + 3}
    assert not slow, slow


def test_every_row_says_why_when_something_was_not_graded(batch):
    rows = batch["rows"]
    for name in ("h-not-json.ipynb", "h-no-companion-metadata.ipynb", "h-hangs-every-call.ipynb"):
        assert rows[name]["reason"], name
    assert f"limit of {NOTEBOOK_SECONDS} s" in rows["h-hangs-every-call.ipynb"]["reason"]
    hang = rows["h-hangs-ignoring-sigint.ipynb"]
    assert any("did not finish within 5 s" in e for e in hang["errors"]), hang["errors"]
    slow = next(e for e in rows["h-one-slow-case.ipynb"]["exercises"] if e["id"] == "9.1")
    assert [c["earned"] for c in slow["cases"]] == [3, 0, 2, 1]
    assert "did not finish within 10 s" in slow["cases"][1]["message"]
    died = next(e for e in rows["h-kills-its-process.ipynb"]["exercises"] if e["id"] == "9.2")
    assert all("process running your code stopped" in c["message"] for c in died["cases"]), died
    hog = rows["h-fills-disk-and-memory.ipynb"]["errors"]
    assert any("File too large" in e for e in hog), hog  # RLIMIT_FSIZE (Python ignores SIGXFSZ)
    assert any("MemoryError" in e for e in hog), hog  # RLIMIT_AS
    nan = rows["h-all-nan.ipynb"]["exercises"][0]["cases"][0]["message"]
    assert "NaN everywhere" in nan


def test_flags(batch):
    rows = batch["rows"]
    assert not_copy_flags(rows["h-imports-reference-ch02.ipynb"]) == [
        "uses companion.attention, which exercise 2.1 forbids", "uses companion.masks, which exercise 2.2 forbids"]
    assert rows["h-imports-reference-ch09.ipynb"]["flags"] == [
        "uses companion.tokenizers, which exercise 9.2 forbids", "uses companion.models, which exercise 9.4 forbids",
        "uses companion.models, which exercise 9.5 forbids"]  # 9.5 grades gpt_param_count too
    assert rows["h-hides-its-import.ipynb"]["flags"] == [
        "uses companion.attention, which exercise 2.1 forbids (an import seen at run time)"]
    assert any("check cell" in f and "split_heads" in f for f in rows["h-defines-in-check-cell.ipynb"]["flags"])
    for name in ("sol-ch02.ipynb", "sol-ch09.ipynb", "untouched-ch02.ipynb", "own-work-ch02.ipynb",
                 "nested/submission_1001/ch02_attention.ipynb", "nested/submission_1003/homework.pdf"):
        assert not_copy_flags(rows[name]) == [], name


def test_reads_and_writes_outside_the_folder_gain_nothing_and_are_flagged(batch):
    rows = batch["rows"]
    clone = str(batch["clone"])
    writes = rows["h-writes-outside.ipynb"]["flags"]
    assert any(f.startswith("tried to write outside its folder:") and "core.py" in f and "sandbox blocked it" in f
               for f in writes), writes
    second = rows["h-reads-second-copy.ipynb"]
    assert second["earned"] == 0
    assert any(f.startswith("tried to read outside its folder:") and f"{clone}/solutions/ch02_attention.ipynb" in f
               for f in second["flags"]), second["flags"]
    assert any(f.startswith("tried to write outside its folder:") and f"{clone}/escaped.txt" in f
               for f in second["flags"]), second["flags"]
    # through the installed package's direct_url.json (an editable install: a clone, maybe this one)
    from companion_grader.sandbox import install_roots

    installed = rows["h-reads-install-clone.ipynb"]
    assert installed["earned"] == 0
    reads = next(f for f in installed["flags"] if f.startswith("tried to read outside its folder:"))
    for root in install_roots():
        if (root / "solutions" / "ch02_attention.ipynb").exists():
            assert f"{root}/solutions/ch02_attention.ipynb" in reads, reads


def test_copies_of_the_solution_are_flagged(batch):
    rows = batch["rows"]
    for name in FROM_SOLUTIONS:
        copies = [f for f in rows[name]["flags"] if f.startswith("solution copy")]
        assert any("solution markers" in f for f in copies), (name, copies)
        assert any("generated_from" in f for f in copies), (name, copies)
    sol = [f for f in rows["sol-ch02.ipynb"]["flags"] if "identical to the reference" in f]
    assert sol and all(i in sol[0] for i in ("2.1", "2.2", "2.3", "2.4")), sol
    for name in set(EXPECTED) - FROM_SOLUTIONS:
        assert not any(f.startswith("solution copy") for f in rows[name]["flags"]), name
    assert "solution copies (flagged): " in batch["proc"].stdout
    assert "solution copy: " in batch["csv"]


def test_table_csv_and_progress(batch):
    proc = batch["proc"]
    n = len(EXPECTED)
    for i, name in enumerate(sorted(EXPECTED), 1):  # sorted by relative path, as the grader does
        assert f"[{i}/{n}] {name}: {EXPECTED[name][0]}" in proc.stderr
        assert name in proc.stdout and name in batch["csv"]
    assert proc.stdout.splitlines()[0].split()[:2] == ["notebook", "status"]
    assert batch["csv"].splitlines()[0].startswith("notebook,student,status,chapter,")
    for name in ("nested/submission_1003/homework.pdf", "nested/submission_1003/answers_ch09.py"):
        row = batch["rows"][name]
        assert (row["earned"], row["points"]) == (0, 0) and "not a Jupyter notebook" in row["reason"], row


def test_without_a_sandbox_the_grader_warns_and_flags_writes(tmp_path):
    """The fallback (resource limits only) says so, and notices a submission that wrote into the folder."""
    nb = json.loads((FIXTURES / "sol-ch02.ipynb").read_text())
    nb["cells"].insert(-1, {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                            "source": f"open({str(tmp_path / 'escaped.txt')!r}, 'w').write('x')\n"})
    (tmp_path / "writer.ipynb").write_text(json.dumps(nb))
    proc = subprocess.run(
        [sys.executable, "-m", "companion_grader", "grade", str(tmp_path), "--notebook-timeout", "60"],
        capture_output=True, text=True, timeout=180, env={**os.environ, "COMPANION_GRADING_SANDBOX": "none"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "WARNING: no sandbox (COMPANION_GRADING_SANDBOX=none)" in proc.stderr
    doc = json.loads((tmp_path / "scores.json").read_text())
    assert doc["sandbox"].startswith("WARNING: no sandbox")
    (row,) = doc["notebooks"]
    assert (row["status"], row["earned"], row["points"]) == ("graded", 28, 28)
    assert not_copy_flags(row) == [
        f"tried to write outside its folder: {tmp_path / 'escaped.txt'} (no sandbox: it may have succeeded)",
        "the submissions changed on disk while this notebook was graded"]
