"""A gradebook keyed by student (``grade --roster``), and submitter ids from LMS download names."""

import csv
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "submissions"

ROSTER = """student_id,name,email,submission
s1,Alice Martin,alice@example.edu,alice.ipynb
s2,"Brown, Bob",bob@example.edu,bob
s3,Carol Chen,carol@example.edu,carol.pdf
s4,Dan Diaz,dan@example.edu,dan.ipynb
s5,Erin Evans,erin@example.edu,
"""


@pytest.fixture(scope="module")
def roster_run(tmp_path_factory):
    """Five students: one with own work, one nested, one with a PDF, one missing, one found by id."""
    folder = tmp_path_factory.mktemp("class")
    (folder / "bob" / "week2").mkdir(parents=True)
    shutil.copy(FIXTURES / "own-work-ch02.ipynb", folder / "alice.ipynb")
    shutil.copy(FIXTURES / "untouched-ch02.ipynb", folder / "bob" / "week2" / "ch02_attention.ipynb")
    shutil.copy(FIXTURES / "nested" / "submission_1003" / "homework.pdf", folder / "carol.pdf")
    shutil.copy(FIXTURES / "sol-ch02.ipynb", folder / "s5.ipynb")  # no path in the roster: found by its id
    roster = tmp_path_factory.mktemp("roster") / "roster.csv"
    roster.write_text(ROSTER)
    proc = subprocess.run([sys.executable, "-m", "companion_grader", "grade", str(folder), "--roster", str(roster),
                           "--notebook-timeout", "120"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(folder / "gradebook.csv", newline="") as fh:
        book = list(csv.DictReader(fh))
    with open(folder / "gradebook.csv", newline="") as fh:
        header = next(csv.reader(fh))
    with open(folder / "canvas.csv", newline="") as fh:
        canvas = list(csv.reader(fh))
    return {"proc": proc, "book": book, "header": header, "canvas": canvas}


def test_five_students_five_rows_with_the_right_zeros_and_reasons(roster_run):
    book = {r["student_id"]: r for r in roster_run["book"]}
    assert len(roster_run["book"]) == 5 and list(book) == ["s1", "s2", "s3", "s4", "s5"]
    assert all(r["assignment"] == "ch02" and float(r["max_score"]) == 28 for r in book.values())
    assert (book["s1"]["first_name"], book["s1"]["last_name"], book["s1"]["email"]) == ("Alice", "Martin", "alice@example.edu")
    assert (book["s2"]["first_name"], book["s2"]["last_name"]) == ("Bob", "Brown")  # "Last, First"
    assert float(book["s1"]["score"]) == 5 and book["s1"]["reason"] == ""
    assert float(book["s2"]["score"]) == 0 and book["s2"]["files"] == "bob/week2/ch02_attention.ipynb"  # nested
    assert float(book["s3"]["score"]) == 0 and "carol.pdf: not a notebook" in book["s3"]["reason"]
    assert float(book["s4"]["score"]) == 0 and book["s4"]["reason"] == "no submission: dan.ipynb does not exist"
    assert float(book["s5"]["score"]) == 28 and "solution copy" in book["s5"]["flags"]
    for r in book.values():
        assert float(r["raw_score"]) == float(r["score"]) and float(r["late_submission_penalty"]) == 0


def test_the_gradebook_has_nbgraders_columns_in_order(roster_run):
    from companion_grader.gradebook import NBGRADER_COLUMNS

    assert NBGRADER_COLUMNS == ["assignment", "duedate", "timestamp", "student_id", "last_name", "first_name",
                                "email", "raw_score", "late_submission_penalty", "score", "max_score"]
    assert roster_run["header"][:11] == NBGRADER_COLUMNS


def test_the_canvas_file(roster_run):
    header, possible, *rows = roster_run["canvas"]
    assert header == ["Student", "ID", "SIS User ID", "Section", "Chapter 2 exercises"]
    assert possible[0].strip() == "Points Possible" and possible[-1] == "28"
    assert [(r[0], r[2], r[-1]) for r in rows] == [
        ("Martin, Alice", "s1", "5"), ("Brown, Bob", "s2", "0"), ("Chen, Carol", "s3", "0"),
        ("Diaz, Dan", "s4", "0"), ("Evans, Erin", "s5", "28")]


@pytest.mark.parametrize("path, expected", [
    ("submission_1001/ch02_attention.ipynb", ("1001", "")),  # Gradescope's export
    ("submission_1002/work/deeper/ch09_gpt.ipynb", ("1002", "")),
    ("doejane_12345_67890_ch02_attention.ipynb", ("12345", "doejane")),  # Canvas's download
    ("doejane_LATE_12345_67891_ch02_attention-1.ipynb", ("12345", "doejane")),
    ("s17/ch02.ipynb", ("s17", "")),  # one folder per student
    ("s18.ipynb", ("s18", "")),
])
def test_submitter_ids_from_download_names(path, expected):
    from companion_grader.gradebook import submitter_of

    assert submitter_of(path) == expected


def test_without_a_roster_students_come_from_the_names(tmp_path):
    from companion_grader.gradebook import gradebook_rows, students_from_files, with_canvas_ids

    rows = [{"notebook": n, "chapter": c, "exercises": [{}] if c else [], "earned": e, "points": 28, "status": s,
             "reason": "", "flags": [], "errors": []}
            for n, c, e, s in [("submission_1001/ch02_attention.ipynb", 2, 20, "graded"),
                               ("submission_1003/homework.pdf", None, 0, "not a notebook"),
                               ("doejane_12345_67890_ch02_attention.ipynb", 2, 7, "graded")]]
    (tmp_path / "submission_metadata.yml").write_text(
        ":submission_1001:\n  :submitters:\n  - :name: Ada Lovelace\n    :sid: '42'\n    :email: ada@example.edu\n")
    students = with_canvas_ids(students_from_files(rows, tmp_path))
    assert [(s.student_id, s.first_name, s.last_name, s.email, s.canvas_id) for s in students] == [
        ("42", "Ada", "Lovelace", "ada@example.edu", ""), ("1003", "", "", "", ""), ("12345", "", "doejane", "", "12345")]
    book = gradebook_rows(students, rows, [2], {2: 28}, tmp_path)
    assert [(r["student_id"], r["score"]) for r in book] == [("42", 20.0), ("1003", 0.0), ("12345", 7.0)]
    assert "homework.pdf: not a notebook" in book[1]["reason"]


def test_a_folder_without_notebooks_gives_a_table_and_a_message(tmp_path):
    (tmp_path / "student_7").mkdir()
    (tmp_path / "student_7" / "homework.pdf").write_text("%PDF-1.4\n")
    (tmp_path / "answers.py").write_text("x = 1\n")
    proc = subprocess.run([sys.executable, "-m", "companion_grader", "grade", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "No notebook (.ipynb) found" in proc.stdout
    for name in ("answers.py", "student_7/homework.pdf"):
        assert name in proc.stdout and name in (tmp_path / "scores.csv").read_text()
    assert "not a notebook" in proc.stdout
