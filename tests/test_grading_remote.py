"""The wire between the instructor's grader and a submission's worker (companion_grader.remote/worker)."""

import tempfile
import time
from pathlib import Path
from collections import Counter, OrderedDict

import pytest
import torch
from torch import nn

from companion.grading.core import StudentError
from companion_grader.instructor import Limits, _Session
from companion_grader.remote import RemoteObject

STUDENT = '''
import collections, enum, torch
from torch import nn

class Colour(enum.IntEnum):
    RED = 3

Pair = collections.namedtuple("Pair", "a b")

def returns_subclasses():
    return Counter_like(), Pair(1, 2), Colour.RED, {1, 2}

def Counter_like():
    return collections.Counter("abca")

def adds_in_place(x):
    x += 1
    return x

def picky(n):
    if n < 0:
        raise ValueError("n must be >= 0")
    raise SystemExit(3)

class Layer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d)
    def forward(self, x):
        return self.proj(x)

def capabilities():
    for line in open("/proc/self/status"):
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)

def start_processes(n):
    import os, signal, time
    pids = []
    try:
        for _ in range(n):
            pid = os.fork()
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            pids.append(pid)
    except OSError:
        pass  # EAGAIN: the process limit
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    return len(pids)

class Pretender:
    """Not a tensor, whatever it claims."""
'''


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    work = tmp_path_factory.mktemp("work")
    (work / "submission.ipynb").write_text("{}")
    magics = "%matplotlib inline\n!echo hi\ndef after_magics():\n    return 1\n"
    timed = "%%time\ndef in_timed_cell():\n    return 2\n"
    s = _Session(work, [(0, STUDENT), (1, magics), (2, timed)], Limits(cell_seconds=60),
                 deadline=time.monotonic() + 120)
    s.ready()
    yield s
    s.stop()


def target(session, name):
    (obj,) = session.targets((name,))
    return obj


def test_results_come_back_as_plain_data(session):
    counts, pair, colour, members = target(session, "returns_subclasses")()
    assert type(counts) is dict and counts == dict(Counter("abca"))
    assert type(pair) is tuple and pair == (1, 2)
    assert type(colour) is int and colour == 3
    assert members == {1, 2}


def test_the_worker_gets_copies(session):
    x = torch.zeros(3)
    out = target(session, "adds_in_place")(x)
    assert torch.equal(out, torch.ones(3)) and torch.equal(x, torch.zeros(3))


def test_exceptions_keep_builtin_types_but_never_stop_the_grader(session):
    picky = target(session, "picky")
    with pytest.raises(ValueError, match="n must be >= 0"):
        picky(-1)
    with pytest.raises(StudentError) as info:  # SystemExit in the worker is only a message here
        picky(1)
    assert not isinstance(info.value, SystemExit) and "SystemExit" in info.value.description


def test_modules_stay_in_the_worker_behind_a_proxy(session):
    layer = target(session, "Layer")(4)
    assert isinstance(layer, RemoteObject) and isinstance(layer, nn.Module)  # claimed from its torch base class
    assert isinstance(layer.proj, nn.Linear) and tuple(layer.proj.weight.shape) == (4, 4)
    state = layer.state_dict()
    assert isinstance(state, OrderedDict) and set(state) == {"proj.weight", "proj.bias"}
    ref = nn.Linear(4, 4)
    ref.load_state_dict({k.split(".", 1)[1]: v for k, v in state.items()})
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), ref(x))


def test_a_proxy_never_passes_for_a_tensor(session):
    obj = target(session, "Pretender")()
    assert not isinstance(obj, torch.Tensor) and type(obj).__name__ == "Pretender"


def test_a_missing_name_is_none(session):
    assert target(session, "nowhere") is None


def test_ipython_magics_do_not_cost_the_code_around_them(session):
    assert session.errors == []
    assert target(session, "after_magics")() == 1
    assert target(session, "in_timed_cell")() == 2


def test_the_sandboxed_worker_has_no_capabilities(session):
    from companion_grader.sandbox import sandbox_status

    if not sandbox_status().startswith("bubblewrap"):
        pytest.skip("no bubblewrap here: " + sandbox_status())
    assert target(session, "capabilities")() == 0  # not even when the grader runs as root


@pytest.mark.parametrize("content, reason", [
    ("[" * 100_000 + "]" * 100_000, "not a readable notebook: RecursionError"),
    ('{"cells": [1]}', "cell 0 is not a notebook cell"),
    ('{"cells": "none"}', "no list of cells"),
    (b"\xff\xfe", "UnicodeDecodeError"),
])
def test_files_that_are_not_notebooks_get_a_reason(tmp_path, content, reason):
    from companion_grader.instructor import grade_notebook

    path = tmp_path / "bad.ipynb"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    row = grade_notebook(path)
    assert row["status"] == "invalid notebook" and reason in row["reason"], row["reason"]


def test_the_worker_cannot_start_processes_without_end(session):
    import os

    if os.geteuid() == 0:
        pytest.skip("the kernel never applies RLIMIT_NPROC to the root user (only a cgroup could)")
    assert target(session, "start_processes")(400) < 300  # Limits.processes = 256 beyond what the user runs


def test_a_python_or_clone_under_tmp_stays_visible_in_the_sandbox(tmp_path, monkeypatch):
    # The sandbox gives the worker a fresh /tmp; a venv or a clone made under /tmp (as a CI
    # runner or a learner may do) must be bound in again, or the worker cannot even start.
    import shutil
    import subprocess
    import sys

    from companion_grader import sandbox

    if not sandbox._bwrap_works():
        pytest.skip("bubblewrap is not usable here")
    base = Path(tempfile.mkdtemp(dir="/tmp"))  # under /tmp whatever pytest's basetemp is
    try:
        venv = base / "venv"
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "marker").write_text("visible\n")
        work = base / "work"
        work.mkdir()
        monkeypatch.setattr(sys, "prefix", str(venv))
        kept = sandbox.kept_under_tmp()
        assert venv.resolve() in kept
        bwrap = shutil.which("bwrap")
        marker = str(venv / "bin" / "marker")
        seen = subprocess.run([bwrap, *sandbox._bwrap_args(work, None), "--", "cat", marker],
                              capture_output=True, text=True, timeout=30)
        assert seen.returncode == 0 and seen.stdout == "visible\n", seen.stderr
        hidden = subprocess.run([bwrap, *sandbox._bwrap_args(work, None, keep=()), "--", "cat", marker],
                                capture_output=True, text=True, timeout=30)
        assert hidden.returncode != 0  # without the binding the fresh /tmp hides it: the test can fail
    finally:
        shutil.rmtree(base)
