"""Graded exercises: the check cells of the exercise notebooks call :func:`check` and :func:`score`.

In a notebook::

    from companion.grading import check, score
    ...                       # the student's function
    check("2.1", masked_attention)
    ...
    score(2)                  # last cell: the total for the chapter

These checks run in the student's kernel: they are feedback. Under nbgrader
(``nbgrader autograde`` or ``validate``, which set ``NBGRADER_EXECUTION``) a check
cell also reports its points the way nbgrader reads them: ``check()`` returns
the points earned (nbgrader takes a number a grade cell shows as partial
credit) and raises :class:`NoPoints` when none were earned (a grade cell that
shows an error scores 0; one that shows 0 or nothing would score full). An instructor
grades a folder of submitted notebooks with the separate instructor's grader
(``pip install -e ./grader``, then ``python -m companion_grader grade SUBMISSIONS/``),
which runs the same cases in its own process, out of the submissions' reach.
This package never imports it: a learner's install (Colab) has only ``companion``.
"""

from __future__ import annotations

import os
from typing import Any

from .core import (
    WORKER_ENV,
    Case,
    CheckFailed,
    Exercise,
    ExerciseResult,
    chapter_exercises,
    expect_tensor,
    expect_true,
    get_exercise,
    register,
    run_exercise,
    run_student,
)

__all__ = [
    "check",
    "score",
    "NoPoints",
    "Case",
    "CheckFailed",
    "Exercise",
    "expect_tensor",
    "expect_true",
    "register",
    "get_exercise",
    "chapter_exercises",
    "run_exercise",
    "run_student",
]

NBGRADER_ENV = "NBGRADER_EXECUTION"  # set by nbgrader while it runs a notebook to grade or validate it


class NoPoints(AssertionError):
    """Raised by :func:`check` under nbgrader when an exercise earned nothing, so that its grade cell scores 0."""


# Results of the check cells run in this kernel, by exercise id (a re-run replaces).
_GRADEBOOK: dict[str, ExerciseResult] = {}


def format_result(result: ExerciseResult) -> str:
    ex = result.exercise
    lines = [f"Exercise {ex.id}: {ex.title} -- {result.earned}/{result.points} points"]
    width = max(len(c.name) for c in result.cases)
    for c in result.cases:
        mark = "pass" if c.passed else "FAIL"
        lines.append(f"  [{mark}] {c.name:<{width}}  {c.earned}/{c.points}")
        if c.message:
            lines.append(f"         {c.message}")
    return "\n".join(lines)


def check(exercise_id: str, *students: Any) -> int | None:
    """Run the checks of one exercise on your function(s) or class and print a report.

    The result is kept for :func:`score`; nothing is returned, so the check
    cell shows only the report. Under nbgrader (``NBGRADER_EXECUTION`` set) it
    returns the points earned, and raises :class:`NoPoints` if there are none.
    """
    exercise = get_exercise(exercise_id)
    if os.environ.get(WORKER_ENV):
        print(f"(check {exercise.id} skipped: the instructor's grader runs the checks itself)")
        return None
    result = run_exercise(exercise, *students)
    _GRADEBOOK[exercise.id] = result
    print(format_result(result))
    if os.environ.get(NBGRADER_ENV):
        if result.earned == 0:
            raise NoPoints(f"exercise {exercise.id}: 0/{result.points} points")
        return result.earned
    return None


def score(chapter: int) -> None:
    """Print the table of this chapter's exercises with the total."""
    if os.environ.get(WORKER_ENV):
        return
    rows = []
    earned = possible = 0
    for ex in chapter_exercises(chapter):
        res = _GRADEBOOK.get(ex.id)
        got = res.earned if res is not None else 0
        note = "" if res is not None else "  (check cell not run)"
        rows.append((f"{ex.id} {ex.title}", f"{got}/{ex.points}{note}"))
        earned += got
        possible += ex.points
    width = max(len(r[0]) for r in rows)
    print(f"Chapter {chapter} score")
    for left, right in rows:
        print(f"  {left:<{width}}  {right}")
    print(f"  {'total':<{width}}  {earned}/{possible}")
