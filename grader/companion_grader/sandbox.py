"""Start a submission's worker process with limits, in a sandbox where one is available.

On Linux with ``bwrap`` (bubblewrap, Debian package ``bubblewrap``) the worker
is denied the file system by default: it sees, read-only, the system's
programs and libraries (``/usr``, ``/lib*``, a few files of ``/etc``), the
Python installation that runs it (its prefixes and site-packages), the course
package ``companion`` and the grader's package, each bound on its own (so not
the repository around them: no ``solutions/``, no tests, no other clone), plus
a private ``/tmp``, no network and its own process namespace; the only
writable folder is the submission's temporary working copy. Everything else
(home folders, the submissions, another copy of the course found through the
install's ``direct_url.json``) does not exist inside. :func:`allowed_roots`
names what is visible; the worker flags any attempt of the student's code to
reach elsewhere (:mod:`.worker`'s audit hook). Everywhere, the worker gets resource limits (CPU seconds,
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

__all__ = ["Limits", "sandbox_status", "hidden_paths", "allowed_roots", "start_worker", "kill_worker"]


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
ROOTS_ENV = "COMPANION_GRADING_ROOTS"  # what the worker may read (os.pathsep-separated), for its audit hook
WRITABLE_ENV = "COMPANION_GRADING_WRITABLE"  # what it may write

# The system's programs and libraries (a usr-merged system has /bin, /lib... as links into /usr),
# and the few files of /etc that the dynamic loader and the C library read.
SYSTEM_ROOTS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/passwd",
                "/etc/group", "/etc/nsswitch.conf", "/etc/alternatives")


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
        return ("bubblewrap: deny by default (only Python, the system libraries and the course package, "
                "read-only; private /tmp and working folder"
                f"{', size-limited' if _bwrap_probe()['size'] else ''}), no network; plus resource limits")
    why = "bwrap is not installed" if shutil.which("bwrap") is None else "bwrap cannot create namespaces here"
    if os.environ.get(NO_SANDBOX_ENV) == "none":
        why = f"{NO_SANDBOX_ENV}=none"
    if not sys.platform.startswith("linux"):
        why = f"no sandbox on {sys.platform}"
    return (f"WARNING: no sandbox ({why}); falling back to resource limits only: submitted code "
            "can read and write any file this user can, and use the network; reads and writes outside "
            "its folder are flagged, not blocked (install bubblewrap: apt-get install bubblewrap)")


def python_roots() -> tuple[Path, ...]:
    """The Python installation that runs the worker: its prefixes (a virtual environment and the
    Python it was made from), the folder of the executable, and the site-packages folders."""
    import site

    wanted = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
              Path(sys.executable).parent, Path(sys.executable).resolve().parent.parent]
    try:
        wanted += [*site.getsitepackages(), site.getusersitepackages()]
    except AttributeError:  # an old virtualenv's site module
        pass
    return _outermost(Path(p) for p in wanted)


def _outermost(paths) -> tuple[Path, ...]:
    found = sorted({Path(p).resolve() for p in paths if Path(p).exists()}, key=lambda p: len(p.parts))
    keep: list[Path] = []
    for p in found:
        if p != Path("/") and not any(k == p or k in p.parents for k in keep):
            keep.append(p)
    return tuple(keep)


def package_roots() -> tuple[Path, ...]:
    """The two import packages the worker runs, each on its own (not the repository around them)."""
    return (COURSE_ROOT / "companion", GRADER_ROOT / "companion_grader")


def kept_under_tmp() -> tuple[Path, ...]:
    """What the worker needs that a fresh ``/tmp`` would hide: Python, a virtual environment or the
    packages living under ``/tmp`` (a clone or a venv made there)."""
    tmp = Path("/tmp").resolve()
    return tuple(p for p in _outermost([*python_roots(), *package_roots()]) if tmp in p.parents)


def allowed_roots(workdir: Path, keep: tuple[Path, ...] | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(readable, writable)``: the folders a worker's code may touch, as the sandbox shows them."""
    keep = python_roots() if keep is None else keep
    # Not /tmp: the worker's is private and empty (TMPDIR is its working folder), and outside the
    # sandbox /tmp is where other people's files are.
    readable = [*SYSTEM_ROOTS, *SYSTEM_FILES, "/dev", "/proc", "/sys",
                *map(str, keep), *map(str, package_roots()), str(workdir)]
    writable = ["/dev/null", str(workdir)]
    return tuple(readable), tuple(writable)


def _bwrap_args(workdir: Path, tmpfs_bytes: int | None, hide: tuple[Path, ...] = (),
                keep: tuple[Path, ...] | None = None) -> list[str]:
    """Deny by default: an empty root, then read-only binds of the system, the Python installation
    (``keep``, default :func:`python_roots`) and the two packages; ``/tmp`` and the working folder
    are fresh in-memory folders (of at most ``tmpfs_bytes`` each), the submission's copy is bound
    read-only into the latter; ``hide`` is masked where a bind would show it."""
    size = ["--size", str(tmpfs_bytes)] if tmpfs_bytes else []
    args = ["--dev", "/dev", "--proc", "/proc", *size, "--tmpfs", "/tmp"]
    for path in (*SYSTEM_ROOTS, *SYSTEM_FILES):
        args += ["--ro-bind-try", path, path]
    keep = python_roots() if keep is None else keep
    shown = _outermost([*keep, *package_roots()])
    for path in shown:
        args += ["--ro-bind", str(path), str(path)]
    for path in hide:  # only where a bind above would show it: elsewhere it does not exist inside
        path = Path(path)
        if any(path == s or s in path.parents for s in (*shown, *map(Path, SYSTEM_ROOTS))):
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


def install_roots() -> tuple[Path, ...]:
    """Local folders named by the ``direct_url.json`` of the installed ``companion`` and
    ``companion-grader`` (an editable install points at a clone, maybe not the one running)."""
    import importlib.metadata
    import json
    from urllib.parse import unquote, urlparse

    found = []
    for dist in ("companion", "companion-grader"):
        try:
            text = importlib.metadata.distribution(dist).read_text("direct_url.json")
            url = urlparse(json.loads(text or "{}").get("url", ""))
        except Exception:  # noqa: BLE001 - not installed, or odd metadata
            continue
        if url.scheme == "file":
            found.append(Path(unquote(url.path)))
    return tuple(found)


def hidden_paths(folder: Path, results: tuple[Path | None, ...] = ()) -> tuple[Path, ...]:
    """What a worker must not even read, in case a bind shows it (a Python or a clone under ``/usr``):
    the submissions (another student's work), the results, and the course's solutions and tests
    beside the package and beside any installed copy of it."""
    needed = [Path(sys.prefix).resolve(), COURSE_ROOT / "companion", GRADER_ROOT / "companion_grader",
              Path(sys.executable).resolve()]
    hide = [Path(folder).resolve()]
    for root in {COURSE_ROOT, *install_roots()}:
        hide += [root / "solutions", root / "tests", root / "exercises"]
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
    readable, writable = allowed_roots(workdir)
    env[ROOTS_ENV], env[WRITABLE_ENV] = os.pathsep.join(readable), os.pathsep.join(writable)
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
