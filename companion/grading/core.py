"""The grader's core: cases, exercises, a time limit, tensor comparison, a gradebook.

Design rules (they are tested):

* A check never crashes on student code. A stub left as is, an exception, a
  wrong type, shape or dtype, a NaN, an endless loop (time limit) each cost
  that case's points with a message, and the remaining cases still run.
* Checks test behaviour: random inputs against a reference implementation,
  odd sizes and edge cases, never the text of the code.

The instructor's grader (the separate ``companion_grader`` distribution, in
``grader/`` of the repository) runs these same cases in its own process
against the student's objects living in another one. This module names what
that needs: :class:`StudentProxy` (the base of its proxies, which
:func:`run_student` hands its function to), :class:`StudentError` and
:class:`StudentProcessDied` (what a call through a proxy may raise),
:func:`describe_exception` and :data:`WORKER_ENV`. It never imports the grader.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "CheckFailed",
    "Case",
    "Exercise",
    "CaseResult",
    "ExerciseResult",
    "register",
    "get_exercise",
    "chapter_exercises",
    "run_exercise",
    "time_limit",
    "expect_tensor",
    "expect_true",
    "unwrap_student",
    "run_student",
    "input_after_call",
    "student_model_with",
    "describe_exception",
    "StudentProxy",
    "StudentError",
    "StudentProcessDied",
    "WORKER_ENV",
]

# Set in the instructor's grader's worker process: check() and score() do nothing there.
WORKER_ENV = "COMPANION_GRADING_WORKER"


class CheckFailed(AssertionError):
    """Raised by a case when the student's result is wrong; the message is shown to the student."""


class StudentError(Exception):
    """An exception of the student's code that ran in another process, raised again in this one.

    The instructor's grader raises it (built-in types are kept through a subclass that also
    derives from the built-in, so a case may still expect ``ValueError``); ``description`` is
    the text the student sees.
    """

    description = ""


class StudentProcessDied(Exception):
    """The process running the student's code ended or broke off while a case waited for it."""


class StudentProxy:
    """Base class of an object standing for a student's object that lives in another process.

    The instructor's grader subclasses it. Calling a proxy already sends copies of the
    arguments, so :func:`run_exercise` passes proxies as they are, and :func:`run_student`
    hands its function to :meth:`_run_student`, which runs it where the student's objects are.
    """

    __slots__ = ()

    def _run_student(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not say where to run {fn!r}")


def is_proxy(obj: Any) -> bool:
    # type(), not isinstance(): a proxy may claim the class of the student's object in __class__
    return StudentProxy in type(obj).__mro__


class _TimeUp(BaseException):
    """Raised inside student code when a case exceeds its time limit.

    A ``BaseException`` so that a student's ``except Exception`` cannot swallow it.
    """


@dataclass(frozen=True)
class Case:
    """One graded behaviour: ``run(*students)`` returns on success or raises :class:`CheckFailed`."""

    name: str
    points: int
    run: Callable[..., None]
    timeout: float = 10.0  # seconds


@dataclass(frozen=True)
class Exercise:
    """A graded exercise: ``targets`` name the functions or classes the student writes."""

    id: str  # "2.1": chapter 2, exercise 1
    title: str
    targets: tuple[str, ...]  # names defined in the notebook, passed to each case in this order
    cases: tuple[Case, ...]
    # Modules (``companion.attention``) or dotted names (``companion.models.gpt.gpt_param_formula``)
    # that solve the exercise for the student: the instructor's grader flags their import.
    forbidden: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.targets, str):
            raise TypeError("targets must be a tuple of names, e.g. ('causal_mask',)")
        if isinstance(self.forbidden, str):
            raise TypeError("forbidden must be a tuple of names, e.g. ('companion.masks',)")

    @property
    def points(self) -> int:
        return sum(c.points for c in self.cases)


@dataclass
class CaseResult:
    name: str
    points: int
    earned: int
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.earned == self.points


@dataclass
class ExerciseResult:
    exercise: Exercise
    cases: list[CaseResult] = field(default_factory=list)

    @property
    def earned(self) -> int:
        return sum(c.earned for c in self.cases)

    @property
    def points(self) -> int:
        return self.exercise.points

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.exercise.id,
            "title": self.exercise.title,
            "earned": self.earned,
            "points": self.points,
            "cases": [
                {"name": c.name, "earned": c.earned, "points": c.points, "message": c.message} for c in self.cases
            ],
        }


_REGISTRY: dict[str, Exercise] = {}


def register(exercise: Exercise) -> Exercise:
    """Add an exercise to the registry (called by the ``chNN`` modules at import)."""
    if exercise.id in _REGISTRY and _REGISTRY[exercise.id] is not exercise:
        raise ValueError(f"exercise {exercise.id} is registered twice")
    _REGISTRY[exercise.id] = exercise
    return exercise


def _chapter_of(exercise_id: str) -> int:
    head = str(exercise_id).split(".")[0]
    if not head.isdigit():
        raise ValueError(f"exercise ids look like '2.1' (chapter.number), got {exercise_id!r}")
    return int(head)


def _load_chapter(chapter: int) -> None:
    try:
        importlib.import_module(f"companion.grading.ch{chapter:02d}")
    except ModuleNotFoundError as err:
        if err.name != f"companion.grading.ch{chapter:02d}":
            raise
        raise ValueError(f"chapter {chapter} has no graded exercises") from None


def get_exercise(exercise_id: str) -> Exercise:
    """The registered exercise with this id (``"2.1"``), loading its chapter's checks on demand."""
    exercise_id = str(exercise_id)
    if exercise_id not in _REGISTRY:
        _load_chapter(_chapter_of(exercise_id))
    if exercise_id not in _REGISTRY:
        known = ", ".join(sorted(i for i in _REGISTRY if _chapter_of(i) == _chapter_of(exercise_id)))
        raise ValueError(f"no exercise {exercise_id}; this chapter has {known or 'none'}")
    return _REGISTRY[exercise_id]


def chapter_exercises(chapter: int) -> list[Exercise]:
    """All exercises of a chapter, in order."""
    _load_chapter(chapter)
    found = [e for i, e in _REGISTRY.items() if _chapter_of(i) == chapter]
    return sorted(found, key=lambda e: [int(p) for p in e.id.split(".")])


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`_TimeUp` in the running code after ``seconds``.

    Uses ``SIGALRM`` in the main thread of a POSIX process (Jupyter and Colab
    kernels), which also interrupts a tight ``while True: pass``. Elsewhere it
    falls back to a trace function that checks the clock on every line.
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    use_alarm = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if use_alarm:
        def on_alarm(signum, frame):
            raise _TimeUp()

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        return
    deadline = time.monotonic() + seconds
    old_trace = sys.gettrace()

    def tracer(frame, event, arg):
        if time.monotonic() > deadline:
            raise _TimeUp()
        return tracer

    sys.settrace(tracer)
    try:
        yield
    finally:
        sys.settrace(old_trace)


def describe_exception(err: BaseException) -> str:
    """What the student reads about an exception of their code: its type, first line and notebook line."""
    if isinstance(err, NotImplementedError):
        return "not implemented yet (the stub still raises NotImplementedError)"
    frames = traceback.extract_tb(err.__traceback__)
    where = ""
    for fr in reversed(frames):  # the innermost frame in the student's notebook
        if fr.filename.startswith(("<ipython-input", "<cell ")) or "ipykernel" in fr.filename or fr.filename.startswith("/tmp/ipykernel"):
            where = f" (line {fr.lineno}: {fr.line.strip() if fr.line else ''})"
            break
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"your code raised {type(err).__name__}{': ' + text if text else ''}{where}"


def run_case(case: Case, *students: Any) -> CaseResult:
    """Run one case; every failure of the student's code becomes a message, never an exception."""
    try:
        with time_limit(case.timeout):
            case.run(*students)
    except CheckFailed as err:
        return CaseResult(case.name, case.points, 0, str(err))
    except _TimeUp:
        return CaseResult(case.name, case.points, 0, f"did not finish within {case.timeout:g} s (an endless loop?)")
    except KeyboardInterrupt:
        raise
    except StudentError as err:  # raised by the student's code in the instructor's grader's worker
        return CaseResult(case.name, case.points, 0, err.description)
    except StudentProcessDied as err:
        return CaseResult(case.name, case.points, 0, f"the process running your code stopped ({err})")
    except BaseException as err:  # noqa: BLE001 - SystemExit from student code too
        return CaseResult(case.name, case.points, 0, describe_exception(err))
    return CaseResult(case.name, case.points, case.points)


def run_exercise(exercise: Exercise, *students: Any) -> ExerciseResult:
    """Run every case of ``exercise`` against the student's objects (one per target)."""
    if len(students) != len(exercise.targets):
        raise TypeError(
            f"exercise {exercise.id} checks {len(exercise.targets)} object(s) "
            f"({', '.join(exercise.targets)}), got {len(students)}"
        )
    # The student's code gets copies of the inputs, so an in-place update
    # cannot change the tensors the reference is computed from.
    students = tuple(s if is_proxy(s) else _OnCopies(s) for s in students)
    result = ExerciseResult(exercise)
    for case in exercise.cases:
        torch.manual_seed(0)  # each case sees the same random inputs on every run
        result.cases.append(run_case(case, *students))
    return result


def _copy_arg(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.clone()  # keeps autograd: a Jacobian through the student's function still works
    if type(x) in (list, tuple):
        return type(x)(_copy_arg(v) for v in x)
    if type(x) is dict:
        return {k: _copy_arg(v) for k, v in x.items()}
    if isinstance(x, torch.nn.Module):
        return copy.deepcopy(x)
    return x


class _OnCopies:
    """Calls the student's function or class with copies of the arguments (the object is unchanged)."""

    def __init__(self, student: Any) -> None:
        self.student = student

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.student(*(_copy_arg(a) for a in args), **{k: _copy_arg(v) for k, v in kwargs.items()})

    def __getattr__(self, name: str) -> Any:
        return getattr(self.student, name)


def unwrap_student(obj: Any) -> Any:
    """The student's own object behind the copying wrapper of :func:`run_exercise`."""
    return obj.student if isinstance(obj, _OnCopies) else obj


def run_student(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run the module-level function ``fn(*args)`` where the student's objects live.

    For a check that must see the student's code from the inside (a gradient,
    a Jacobian, whether the input was changed in place): in a notebook this is
    ``fn(*args)`` on the student's own objects; in the instructor's grader
    ``fn`` runs in the worker, where the arguments that are proxies are the
    student's objects, and only its (plain) result comes back to be compared.
    """
    for a in (*args, *kwargs.values()):
        if is_proxy(a):
            return type(a)._run_student(a, fn, args, kwargs)
    return fn(*(unwrap_student(a) for a in args), **{k: unwrap_student(v) for k, v in kwargs.items()})


def input_after_call(student: Callable[..., Any], x: Any, *args: Any) -> Any:
    """``x`` after ``student(x, *args)``: with :func:`run_student`, whether the student changed its input.

    The caller passes a copy of its tensor and compares what comes back with the original.
    """
    student(x, *args)
    return x


def student_model_with(cls: Any, cfg: Any, want: dict[str, torch.Tensor], *, what: str, like: str) -> Any:
    """``cls(cfg)`` holding the weights ``want`` (keyed by the student's names), in eval mode.

    The layout is checked first, so that a wrong model fails with a message naming what differs:
    ``state_dict()`` must be a dict, hold exactly the names of ``want`` and their shapes. ``what``
    names the student's class in the messages (``"MyGPT"``), ``like`` the model it follows
    (``"Chapter 9's MiniGPT"``).
    """
    model = cls(cfg)
    got = model.state_dict()
    if not isinstance(got, dict):
        raise CheckFailed(f"{what}(cfg).state_dict() should be a dict of tensors, got {type(got).__name__}")
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    if missing or extra:
        raise CheckFailed(f"{what}'s parameter names differ from {like}: missing {missing[:4]}, "
                          f"unexpected {extra[:4]} (name the modules as the statement lists them)")
    for name, tensor in want.items():
        if tuple(got[name].shape) != tuple(tensor.shape):
            raise CheckFailed(f"{name} should have shape {tuple(tensor.shape)}, got {tuple(got[name].shape)}")
    model.load_state_dict(want)
    model.eval()
    return model


# ---------------------------------------------------------------- comparisons

def _fmt_index(idx: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(i) for i in idx) + ")"


def expect_tensor(
    got: Any,
    want: torch.Tensor,
    *,
    name: str = "the output",
    atol: float = 1e-5,
    rtol: float = 1e-4,
    check_dtype: bool = True,
) -> None:
    """Compare a student's tensor with the reference; raise :class:`CheckFailed` saying what differs."""
    if isinstance(got, tuple) and not isinstance(want, tuple):
        raise CheckFailed(f"{name} should be one tensor, got a tuple of {len(got)} items")
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(f"{name} should be a torch.Tensor of shape {tuple(want.shape)}, got {type(got).__name__}")
    if got.shape != want.shape:
        raise CheckFailed(f"{name} should have shape {tuple(want.shape)}, got {tuple(got.shape)}")
    if check_dtype and got.dtype != want.dtype:
        raise CheckFailed(f"{name} should have dtype {want.dtype}, got {got.dtype}")
    if want.dtype == torch.bool:  # a mask: say which entries are wrong, as booleans
        got_b, want_b = got.detach().to("cpu") != 0, want.detach().to("cpu")
        wrong = got_b != want_b
        if wrong.any():
            idx = tuple(int(i) for i in wrong.nonzero()[0])
            raise CheckFailed(
                f"{name} differs from the reference at {int(wrong.sum())} of {wrong.numel()} positions; "
                f"first at index {_fmt_index(idx)}: expected {bool(want_b[idx])}, got {bool(got_b[idx])}"
            )
        return
    # Compared on the CPU: a student's code may have put its result on a GPU (the cases themselves run on the CPU).
    got_d, want_d = got.detach().to("cpu", torch.float64), want.detach().to("cpu", torch.float64)
    bad_got = ~torch.isfinite(got_d) & torch.isfinite(want_d)
    if got_d.numel() and torch.isnan(got_d).all() and not torch.isnan(want_d).all():
        raise CheckFailed(f"{name} is NaN everywhere ({got_d.numel()} values): look for a division by zero "
                          "or a softmax of a row that is all -inf")
    if bad_got.any():
        n_nan = int(torch.isnan(got_d).sum())
        idx = tuple(int(i) for i in bad_got.nonzero()[0])
        raise CheckFailed(
            f"{name} has {int(bad_got.sum())} non-finite values ({n_nan} NaN) where finite ones were expected, "
            f"first at index {_fmt_index(idx)}"
        )
    diff = (got_d - want_d).abs()
    tol = atol + rtol * want_d.abs()
    wrong = diff > tol
    if wrong.any():
        flat = int((diff - tol).flatten().argmax())
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape)) if diff.dim() else ()
        raise CheckFailed(
            f"{name} differs from the reference at {int(wrong.sum())} of {wrong.numel()} positions; "
            f"largest error at index {_fmt_index(idx)}: expected {want_d[idx].item():.5g}, got {got_d[idx].item():.5g}"
        )


def expect_true(condition: bool, message: str) -> None:
    """Raise :class:`CheckFailed` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise CheckFailed(message)
