"""Scoring a submission with an exercise's registered checks, for the grading tests.

``result`` runs the checks on the given functions or classes (as the notebook's
``check`` does); ``full_marks`` and ``loses`` are the two assertions the redesign
tests make of a reference answer and of a named wrong answer."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

from companion.grading import get_exercise, run_exercise


def result(ex_id, *students):
    """``(earned, points, {failed case: its message})``."""
    res = run_exercise(get_exercise(ex_id), *students)
    return res.earned, res.points, {c.name: c.message for c in res.cases if not c.passed}


def full_marks(ex_id, *students):
    got, points, lost = result(ex_id, *students)
    assert got == points, lost


def loses(ex_id, student, *words):
    """The student loses points, and some failed case's message contains every one of ``words``;
    returns ``(earned, {failed case: its message})``."""
    got, points, lost = result(ex_id, student)
    assert got < points, f"{student.__name__} scored full marks on {ex_id}"
    assert any(all(w in m for w in words) for m in lost.values()), lost
    return got, lost


@contextmanager
def worker_session(work: Path, source: str):
    """The instructor's grader's worker (another process, as a real grading run) with ``source``
    run as the submission's one cell; ``remote_result`` scores what it defines."""
    from companion_grader.instructor import Limits, _Session

    (work / "submission.ipynb").write_text("{}")
    session = _Session(work, [(0, source)], Limits(cell_seconds=60), deadline=time.monotonic() + 120)
    session.ready()
    try:
        yield session
    finally:
        session.stop()


def remote_result(session, ex_id, *names):
    """``result`` of the objects the worker's submission defines under ``names``."""
    return result(ex_id, *session.targets(names))
