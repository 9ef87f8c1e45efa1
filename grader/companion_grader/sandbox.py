"""Start a submission's worker process with limits, in a sandbox where one is available.

On Linux with ``bwrap`` (bubblewrap, Debian package ``bubblewrap``) the worker
sees the whole file system read-only, a private ``/tmp``, no network and its
own process namespace; the only writable folder is the submission's temporary
working copy. Everywhere, the worker gets resource limits (CPU seconds,
address space, file size, processes) and its own session, so that the grader
can kill it and all its children with one ``SIGKILL`` (which no signal
handler can ignore). Without bubblewrap the limits still apply, but the
student's code could write wherever the grader's user can: the grader says so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import companion

__all__ = ["Limits", "sandbox_status", "hidden_paths", "start_worker", "kill_worker"]


@dataclass(frozen=True)
class Limits:
    notebook_seconds: float = 300.0  # wall clock for one notebook, all exercises included
    cell_seconds: float = 60.0  # wall clock for one code cell of the submission
    cpu_seconds: int = 600  # CPU time of one worker process (RLIMIT_CPU)
    memory_bytes: int = 6 * 1024**3  # address space of the worker (RLIMIT_AS); torch alone maps ~1-2 GB
    file_bytes: int = 64 * 1024**2  # largest file the worker may write (RLIMIT_FSIZE)
    processes: int = 256  # new processes and threads the worker may add to what the user already runs (RLIMIT_NPROC)


# The folders holding the two import packages the worker runs: the course's ``companion``
# (its repository root in an editable install, where ``solutions/`` sits beside it) and this one.
COURSE_ROOT = Path(companion.__file__).resolve().parents[1]
GRADER_ROOT = Path(__file__).resolve().parents[1]

_BWRAP: dict[str, bool] | None = None  # {"works": ..., "size": whether this bwrap has --size}
NO_SANDBOX_ENV = "COMPANION_GRADING_SANDBOX"  # "none": use the fallback even where bubblewrap works


def _bwrap_probe() -> dict[str, bool]:
    global _BWRAP
    if _BWRAP is None:
        _BWRAP = {"works": False, "size": False}
        exe = shutil.which("bwrap")
        if exe and sys.platform.startswith("linux") and os.environ.get(NO_SANDBOX_ENV) != "none":
            for sized in (True, False):  # --size: bubblewrap 0.7 (its PR #509, Oct. 2022)
                try:
                    probe = subprocess.run([exe, *_bwrap_args(Path("/tmp/probe"), 1 << 20 if sized else None), "--", "true"],
                                           capture_output=True, timeout=20)
                except (OSError, subprocess.TimeoutExpired):
                    break
                if probe.returncode == 0:
                    _BWRAP = {"works": True, "size": sized}
                    break
    return _BWRAP


def _bwrap_works() -> bool:
    return _bwrap_probe()["works"]


def sandbox_status() -> str:
    """One line for the terminal and the JSON: which isolation the workers get."""
    if _bwrap_works():
        return ("bubblewrap: read-only file system, private /tmp and working folder"
                f"{' (size-limited)' if _bwrap_probe()['size'] else ''}, no network; plus resource limits")
    why = "bwrap is not installed" if shutil.which("bwrap") is None else "bwrap cannot create namespaces here"
    if os.environ.get(NO_SANDBOX_ENV) == "none":
        why = f"{NO_SANDBOX_ENV}=none"
    if not sys.platform.startswith("linux"):
        why = f"no sandbox on {sys.platform}"
    return (f"WARNING: no sandbox ({why}); falling back to resource limits only: submitted code "
            "can read and write any file this user can, and use the network (install bubblewrap: apt-get install bubblewrap)")


def kept_under_tmp() -> tuple[Path, ...]:
    """What the worker needs that a fresh ``/tmp`` would hide: Python, a virtual environment, the
    packages or an import path living under ``/tmp`` (a clone or a venv made there)."""
    tmp = Path("/tmp").resolve()
    wanted = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).parent,
              COURSE_ROOT, GRADER_ROOT, *(Path(p) for p in sys.path if p)]
    found = sorted({p.resolve() for p in wanted if p.exists()}, key=lambda p: len(p.parts))
    keep: list[Path] = []
    for p in found:
        if tmp in p.parents and not any(k == p or k in p.parents for k in keep):
            keep.append(p)
    return tuple(keep)


def _bwrap_args(workdir: Path, tmpfs_bytes: int | None, hide: tuple[Path, ...] = (),
                keep: tuple[Path, ...] | None = None) -> list[str]:
    """Everything read-only; ``/tmp`` and the working folder are fresh in-memory folders (of at most
    ``tmpfs_bytes`` each), the submission's copy is bound read-only into the latter; ``hide`` is masked.
    ``keep`` (default :func:`kept_under_tmp`) are bound read-only again inside the fresh ``/tmp``."""
    size = ["--size", str(tmpfs_bytes)] if tmpfs_bytes else []
    args = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", *size, "--tmpfs", "/tmp"]
    for path in kept_under_tmp() if keep is None else keep:
        args += ["--ro-bind", str(path), str(path)]
    for path in hide:
        args += ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
    args += [*size, "--tmpfs", str(workdir)]  # after the masks: the working folder may live under one
    copy = workdir / "submission.ipynb"
    if copy.is_file():
        args += ["--ro-bind", str(copy), str(copy)]
    # Run by root, bubblewrap would leave the worker root's capabilities (mount, load modules...).
    caps = ["--cap-drop", "ALL"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    return [*args, *caps, "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--die-with-parent", "--new-session", "--chdir", str(workdir)]


def _user_tasks() -> int:
    """Processes and threads of this user now: RLIMIT_NPROC counts them all, not only the worker's."""
    uid, total = os.getuid(), 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:
            continue  # the process ended meanwhile
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            total += int(fields.get("Threads", "1"))
    return total


def _limit(limits: Limits):
    # Computed in the grader, before the fork; RLIMIT_NPROC only where it counts tasks per user (Linux).
    nproc = _user_tasks() + limits.processes if sys.platform.startswith("linux") else None

    def apply() -> None:
        import resource

        caps = [(resource.RLIMIT_CPU, limits.cpu_seconds), (resource.RLIMIT_AS, limits.memory_bytes),
                (resource.RLIMIT_FSIZE, limits.file_bytes), (resource.RLIMIT_CORE, 0)]
        if nproc is not None:
            caps.append((resource.RLIMIT_NPROC, nproc))
        for what, value in caps:
            try:
                resource.setrlimit(what, (value, value))
            except (ValueError, OSError):
                pass  # a hard limit already lower than ours stays
    return apply


def hidden_paths(folder: Path, results: tuple[Path | None, ...] = ()) -> tuple[Path, ...]:
    """What a worker must not even read: the submissions (another student's work), the results,
    and the course's solutions next to the package (an editable install)."""
    needed = [Path(sys.prefix).resolve(), COURSE_ROOT / "companion", GRADER_ROOT / "companion_grader",
              Path(sys.executable).resolve()]
    hide = [Path(folder).resolve(), COURSE_ROOT / "solutions"]
    hide += [Path(p).resolve() for p in results if p is not None]
    return tuple(h for h in hide if h.exists() and not any(n == h or h in n.parents for n in needed))


def start_worker(workdir: Path, limits: Limits, log: Path, hide: tuple[Path, ...] = ()) -> subprocess.Popen:
    """The worker for one submission: protocol on its stdin/stdout, its stderr (student prints) in ``log``.

    ``hide`` (folders or files) are replaced by empty ones inside the sandbox.
    """
    workdir = Path(workdir).resolve()
    python = [sys.executable, "-m", "companion_grader.worker"]
    if _bwrap_works():
        tmpfs = 4 * limits.file_bytes if _bwrap_probe()["size"] else None
        cmd = [shutil.which("bwrap") or "bwrap", *_bwrap_args(workdir, tmpfs, hide), "--", *python]
    else:
        cmd = python
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "VIRTUAL_ENV")}
    env.update(HOME=str(workdir), TMPDIR=str(workdir), MPLCONFIGDIR=str(workdir / ".matplotlib"),
               MPLBACKEND="Agg", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join([str(COURSE_ROOT), str(GRADER_ROOT),
                                           *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))
    kwargs = {}
    if os.name == "posix":
        kwargs = {"preexec_fn": _limit(limits), "start_new_session": True}
    with open(log, "ab") as err:
        return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, cwd=workdir,
                                env=env, **kwargs)


def kill_worker(proc: subprocess.Popen) -> None:
    """SIGKILL the worker's whole process group (bubblewrap takes its namespace down with it)."""
    if proc.poll() is None:
        try:
            if os.name == "posix":
                os.killpg(proc.pid, 9)
            else:
                proc.kill()
        except (ProcessLookupError, PermissionError):
            pass
    for stream in (proc.stdin, proc.stdout):
        try:
            stream.close()
        except OSError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
