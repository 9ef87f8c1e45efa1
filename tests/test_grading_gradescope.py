"""The Gradescope autograder, run locally in a fake /autograder tree (no network, no bubblewrap).

``python -m companion_grader gradescope 2`` writes the zip; its ``run_autograder``
runs here with ``AUTOGRADER_ROOT`` pointing at a temporary tree and
``AUTOGRADER_PYTHON`` at this Python, on submissions of every kind. Each
``results.json`` must follow Gradescope's specification (top-level ``score``,
``execution_time``, ``output``, ``tests`` of ``name``, ``score``, ``max_score``,
``output``, ``visibility``; ``extra_data`` free-form) and its score must equal
the local grader's for the same file.
"""

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "submissions"
VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}

# submission name -> files it holds (path inside the submission -> fixture)
SUBMISSIONS = {
    "correct": {"ch02_attention.ipynb": "sol-ch02.ipynb"},
    "buggy": {"ch02_attention.ipynb": "own-work-ch02.ipynb"},
    "empty": {},
    "hostile": {"ch02_attention.ipynb": "h-patches-run-case.ipynb"},
    "not-a-notebook": {"homework.pdf": "nested/submission_1003/homework.pdf"},
    "nested": {"work/week2/ch02_attention.ipynb": "untouched-ch02.ipynb",
               "work/answers_ch09.py": "nested/submission_1003/answers_ch09.py"},
}
EXPECTED_SCORE = {"correct": 28, "buggy": 5, "empty": 0, "hostile": 0, "not-a-notebook": 0, "nested": 0}


@pytest.fixture(scope="module")
def autograder(tmp_path_factory):
    from companion_grader.gradescope import build_autograder

    out = tmp_path_factory.mktemp("build")
    zpath = build_autograder(2, out, repository="https://example.org/course", ref="v9.9.9",
                             notebook_timeout=120, cell_timeout=30)
    return zpath


def test_the_zip_holds_what_gradescope_needs(autograder):
    with zipfile.ZipFile(autograder) as zf:
        names = set(zf.namelist())
        assert {"setup.sh", "run_autograder", "fingerprints.json"} <= names
        for name in ("setup.sh", "run_autograder"):
            assert (zf.getinfo(name).external_attr >> 16) & stat.S_IXUSR, name  # executable
        setup = zf.read("setup.sh").decode()
        prints = json.loads(zf.read("fingerprints.json"))
    assert "git+https://example.org/course@v9.9.9" in setup
    assert "#subdirectory=grader" in setup
    assert set(prints["2"]) == {"2.1", "2.2", "2.3", "2.4"}  # hashes only: no solution code in the zip
    assert "def " not in json.dumps(prints)


def test_the_default_install_is_the_release_of_config_yml(tmp_path):
    import yaml

    from companion_grader.gradescope import build_autograder

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import notebooks
    finally:
        sys.path.remove(str(ROOT / "tools"))
    setup = zipfile.ZipFile(build_autograder(9, tmp_path)).read("setup.sh").decode()
    assert notebooks.install_requirement() in setup  # git+<repository.url>@v<version>, as the setup cells
    assert yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"] in setup


@pytest.fixture(scope="module")
def graded(autograder, tmp_path_factory):
    """results.json of each submission, run as Gradescope would, without bubblewrap."""
    docs, seconds = {}, {}
    env = {**os.environ, "AUTOGRADER_PYTHON": sys.executable, "COMPANION_GRADING_SANDBOX": "none",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "grader"), os.environ.get("PYTHONPATH", "")])}
    for name, files in SUBMISSIONS.items():
        tree = tmp_path_factory.mktemp(f"autograder-{name}")
        with zipfile.ZipFile(autograder) as zf:
            zf.extractall(tree / "source")
        shutil.copy(tree / "source" / "run_autograder", tree / "run_autograder")
        (tree / "run_autograder").chmod(0o755)
        (tree / "submission").mkdir()
        for inside, fixture in files.items():
            (tree / "submission" / inside).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(FIXTURES / fixture, tree / "submission" / inside)
        proc = subprocess.run([str(tree / "run_autograder")], env={**env, "AUTOGRADER_ROOT": str(tree)},
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        docs[name] = json.loads((tree / "results" / "results.json").read_text())
    return docs


def test_results_json_follows_the_specification(graded):
    for name, doc in graded.items():
        assert isinstance(doc["score"], (int, float)) and isinstance(doc["execution_time"], (int, float)), name
        assert isinstance(doc["output"], str) and doc["output"], name
        assert doc.get("visibility", "visible") in VISIBILITY and doc.get("stdout_visibility", "hidden") in VISIBILITY
        assert isinstance(doc["extra_data"], dict) and isinstance(doc["extra_data"]["flags"], list), name
        tests = doc["tests"]
        assert tests and all(isinstance(t, dict) for t in tests), name
        for t in tests:
            assert isinstance(t["name"], str) and isinstance(t["output"], str), t
            assert isinstance(t["score"], (int, float)) and isinstance(t["max_score"], (int, float)), t
            assert 0 <= t["score"] <= t["max_score"] and t["visibility"] in VISIBILITY, t
        assert sum(t["max_score"] for t in tests) == 28, name  # every case of the chapter, graded or not
        assert sum(t["score"] for t in tests) == doc["score"], name


def test_scores_equal_the_local_graders(graded, tmp_path):
    from companion_grader.instructor import Limits, grade_folder

    for name, files in SUBMISSIONS.items():
        for inside, fixture in files.items():
            (tmp_path / name / inside).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(FIXTURES / fixture, tmp_path / name / inside)
    rows = grade_folder(tmp_path, limits=Limits(notebook_seconds=120, cell_seconds=30), progress=None)
    local = {}
    for r in rows:
        sub = r["notebook"].split("/")[0]
        if r["chapter"] == 2:
            local[sub] = max(local.get(sub, 0), r["earned"])
    for name, doc in graded.items():
        assert doc["score"] == local.get(name, 0) == EXPECTED_SCORE[name], (name, doc["score"], local.get(name))


def test_what_each_submission_is_told(graded):
    assert "Graded ch02_attention.ipynb: 28/28" in graded["correct"]["output"]
    assert any("solution copy" in f for f in graded["correct"]["extra_data"]["flags"])
    assert "solution copy" in graded["correct"]["output"]  # the flags reach the top-level output too
    failed = [t for t in graded["buggy"]["tests"] if t["score"] < t["max_score"]]
    assert failed and all(t["output"] for t in failed)  # the expected-versus-got message of each case
    assert all("not implemented yet" in t["output"] for t in failed)
    for name in ("empty", "not-a-notebook"):
        assert "No notebook of Chapter 2 was graded" in graded[name]["output"], graded[name]["output"]
    assert "homework.pdf: not a notebook" in graded["not-a-notebook"]["output"]
    nested = graded["nested"]
    assert nested["extra_data"]["graded"] == "work/week2/ch02_attention.ipynb"
    assert "Not graded: work/answers_ch09.py (not a notebook" in nested["output"]
    assert graded["hostile"]["score"] == 0  # patched run_case in its own kernel: nothing gained
    assert "no sandbox" in graded["hostile"]["extra_data"]["sandbox"].lower()


def test_a_failing_grader_still_writes_results_json(autograder, tmp_path):
    with zipfile.ZipFile(autograder) as zf:
        zf.extractall(tmp_path / "source")
    (tmp_path / "submission").mkdir()
    script = tmp_path / "source" / "run_autograder"
    script.chmod(0o755)
    proc = subprocess.run([str(script)], env={**os.environ, "AUTOGRADER_ROOT": str(tmp_path),
                                              "AUTOGRADER_PYTHON": "/nonexistent/python"},
                          capture_output=True, text=True, timeout=60)
    doc = json.loads((tmp_path / "results" / "results.json").read_text())
    assert doc["score"] == 0 and "could not run" in doc["output"], (doc, proc.stderr)
