"""The untrusted side of the instructor's grader: runs one submission's code, answers calls.

Started by :mod:`.instructor` (inside the sandbox) as
``python -m companion_grader.worker``, with the protocol on its stdin and
stdout. Before any student code runs, the protocol is moved to other file
descriptors and the student's prints go to stderr, so nothing a cell prints
can be mistaken for a reply.

Requests (see :mod:`.remote`): ``("cells", [(index, source), ...])`` runs the
notebook's code cells, replying ``("cell", i)`` before each and a summary at
the end; ``("target", name)``; ``("call", id, args, kwargs)``;
``("getattr", id, name)``; ``("setattr", id, name, value)``;
``("apply", fn, args, kwargs)``. Replies are plain data.
"""

from __future__ import annotations

import io
import linecache
import os
import pickle
import sys
import traceback
import types
from collections import OrderedDict
from typing import Any

import torch

from companion.grading.core import WORKER_ENV, describe_exception

from .remote import dump_plain, read_frame, write_frame
from .sandbox import ROOTS_ENV, WRITABLE_ENV

PLAIN_SCALARS = (type(None), bool, int, float, complex, str, bytes)


class Worker:
    def __init__(self, inp: int, out: int) -> None:
        self.inp, self.out = inp, out
        self.objects: dict[int, Any] = {}
        self.imports: set[str] = set()  # modules the student's own lines imported since the last reply
        self.outside: list[str] = []  # "read PATH" / "write PATH" / "ran PROGRAM", since the last reply
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}

    # ---------------------------------------------------------- replies
    def send(self, obj: Any) -> None:
        write_frame(self.out, dump_plain(obj))

    def handle_of(self, obj: Any) -> dict[str, Any]:
        key = id(obj)
        self.objects[key] = obj
        cls = obj if isinstance(obj, type) else type(obj)
        mro = [] if isinstance(obj, type) else [f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__]
        name = f"{cls.__module__}.{cls.__qualname__}" if not isinstance(obj, type) else "type"
        return {"__remote__": key, "type": name, "mro": mro}

    def plain(self, obj: Any, depth: int = 0) -> Any:
        """``obj`` as plain data; anything else becomes a handle (the object stays here)."""
        if depth > 50:
            return self.handle_of(obj)
        if isinstance(obj, torch.Tensor):
            if type(obj) not in (torch.Tensor, torch.nn.Parameter):
                obj = obj.as_subclass(torch.Tensor)
            t = obj.detach().clone()
            if obj.requires_grad:
                t.requires_grad_(True)
            return torch.nn.Parameter(t, requires_grad=obj.requires_grad) if isinstance(obj, torch.nn.Parameter) else t
        if type(obj) in PLAIN_SCALARS or isinstance(obj, (torch.dtype, torch.device, torch.Size)):
            return obj
        # Subclasses become their plain base (a Counter is a dict, a namedtuple a tuple, an IntEnum an int),
        # which is what the checks look at, and all that torch.load(weights_only=True) accepts.
        for base in (bool, int, float, complex, str, bytes):
            if isinstance(obj, base):
                return base(obj)
        if isinstance(obj, (list, tuple)):
            return (list if isinstance(obj, list) else tuple)(self.plain(v, depth + 1) for v in obj)
        if isinstance(obj, (set, frozenset)):
            return {self.plain(v, depth + 1) for v in obj}
        if isinstance(obj, types.GeneratorType):
            return [self.plain(v, depth + 1) for v in obj]
        if isinstance(obj, dict):
            kind = OrderedDict if isinstance(obj, OrderedDict) else dict
            return kind((self.plain(k, depth + 1), self.plain(v, depth + 1)) for k, v in obj.items())
        return self.handle_of(obj)

    def error(self, err: BaseException) -> dict[str, Any]:
        return {"error": describe_exception(err), "type": type(err).__name__}

    # ---------------------------------------------------------- requests
    def resolve(self, data: bytes) -> Any:
        objects = self.objects

        class Unpickler(pickle.Unpickler):
            def persistent_load(self, pid):
                return objects[pid[1]]

        return Unpickler(io.BytesIO(data)).load()

    def run_cells(self, cells: list[tuple[int, str]]) -> dict[str, Any]:
        errors = []
        for index, source in cells:
            self.send(("cell", index))
            try:
                source = _python_source(source)
                name = f"<cell {index}>"
                linecache.cache[name] = (len(source), None, source.splitlines(True), name)  # for tracebacks
                code = compile(source, name, "exec")
                exec(code, self.namespace)
            except BaseException as err:  # noqa: BLE001 - a cell that raises is recorded, the next one runs
                errors.append(f"cell {index}: {_short(err)}")
        return {"value": {"errors": errors}, "imports": self.take_imports(), "outside": self.take_outside()}

    def take_imports(self) -> list[str]:
        found, self.imports = sorted(self.imports), set()
        return found

    def take_outside(self) -> list[str]:
        found, self.outside[:] = list(self.outside), []
        return found

    def watch_files(self, readable: list[str], writable: list[str]) -> None:
        """Record what the student's code tries to read, write or run outside its allowed folders.

        An audit hook (PEP 578) sees every ``open``, directory listing, rename, removal and
        program start, whatever module makes it; only those made while a line of a notebook
        cell is on the stack count (not the import system's own reads), and only paths outside
        ``readable`` (``writable`` for a write). Under bubblewrap the access fails as well
        (nothing outside exists); without it, this record is all there is. Like the import
        record it comes from the submission's process: a flag for a person, not a proof.
        """
        norm = os.path.normpath
        readable = tuple(norm(r) for r in readable if r)
        writable = tuple(norm(w) for w in writable if w)
        outside, seen = self.outside, set()
        reads = {"os.listdir", "os.scandir", "glob.glob", "os.chdir", "shutil.copytree"}
        writes = {"os.mkdir", "os.remove", "os.rmdir", "os.rename", "os.replace", "os.symlink", "os.link",
                  "os.chmod", "os.chown", "os.truncate", "os.utime", "shutil.rmtree", "shutil.move",
                  "shutil.copyfile", "shutil.chown"}
        programs = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "pty.spawn"}
        wanted = reads | writes | programs | {"open"}
        write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

        def under(path: str, roots: tuple[str, ...]) -> bool:
            return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)

        def from_student() -> bool:
            frame = sys._getframe(2)
            student = False
            while frame is not None:
                name = frame.f_code.co_filename
                if name.startswith("<frozen importlib"):
                    return False  # the import system looking for a module
                student = student or name.startswith("<cell")
                frame = frame.f_back
            return student

        def record(what: str) -> None:
            if what not in seen and len(seen) < 200:
                seen.add(what)
                outside.append(what)

        def path_of(arg: Any) -> str | None:
            if isinstance(arg, bytes):
                arg = os.fsdecode(arg)
            if not isinstance(arg, str) or not arg:
                return None
            return norm(arg if os.path.isabs(arg) else os.path.join(os.getcwd(), arg))

        def hook(event: str, args: tuple) -> None:
            if event not in wanted:
                return
            try:
                if event in programs:
                    if from_student():
                        record(f"ran {str(args[0] if args else '?')[:200]}")
                    return
                if event == "open":
                    path, mode, flags = (list(args) + [None, None, None])[:3]
                    writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                        (mode is None and isinstance(flags, int) and bool(flags & write_flags))
                    paths = [path_of(path)]
                elif event in ("os.rename", "os.replace", "os.symlink", "os.link", "shutil.copyfile",
                               "shutil.move", "shutil.copytree"):
                    writing = event != "shutil.copytree"
                    paths = [path_of(args[0]), path_of(args[1]) if len(args) > 1 else None]
                    if event in ("shutil.copyfile", "shutil.copytree"):  # the source is read
                        src, dst = paths
                        if src is not None and not under(src, readable) and from_student():
                            record(f"read {src[:300]}")
                        paths, writing = [dst], True
                else:
                    writing = event in writes
                    paths = [path_of(args[0]) if args else None]
                for path in paths:
                    if path is None:
                        continue
                    inside = under(path, writable) if writing else under(path, readable)
                    parts = path.split("/")
                    if len(parts) > 3 and parts[1] == "proc" and parts[3] in ("root", "cwd", "fd", "map_files"):
                        inside = False  # another view of the whole file system
                    if not inside and from_student():
                        record(f"{'write' if writing else 'read'} {path[:300]}")
            except Exception:  # noqa: BLE001 - the record must never break the student's code
                pass

        sys.addaudithook(hook)

    def watch_imports(self) -> None:
        """Record what the student's lines import, however spelled (``__import__("a" + "b")`` too).

        Only imports made directly by a line of a notebook cell count, not those made by
        torch or companion internally. The record is a flag for a person, not a proof:
        the student's code runs here and could undo this.
        """
        import builtins
        import importlib

        real_import, real_import_module = builtins.__import__, importlib.import_module
        imports = self

        def from_student(depth: int) -> bool:
            return sys._getframe(depth).f_code.co_filename.startswith("<cell")

        def watched_import(name, globals=None, locals=None, fromlist=(), level=0):
            module = real_import(name, globals, locals, fromlist, level)
            if level == 0 and from_student(2):
                imports.imports.add(name)
                imports.imports.update(f"{name}.{f}" for f in fromlist or () if isinstance(f, str))
            return module

        def watched_import_module(name, package=None):
            if from_student(2) and not name.startswith("."):
                imports.imports.add(name)
            return real_import_module(name, package)

        builtins.__import__ = watched_import
        importlib.import_module = watched_import_module

    def serve(self) -> None:
        while True:
            try:
                data = read_frame(self.inp)
            except Exception:  # noqa: BLE001 - the grader went away
                return
            message = self.resolve(data)
            kind = message[0]
            try:
                if kind == "cells":
                    reply = self.run_cells(message[1])
                elif kind == "target":
                    name = message[1]
                    reply = {"value": self.handle_of(self.namespace[name]) if name in self.namespace else None}
                elif kind == "call":
                    _, key, args, kwargs, grad = message
                    with torch.set_grad_enabled(grad):
                        reply = {"value": self.plain(self.objects[key](*args, **kwargs))}
                elif kind == "getattr":
                    reply = {"value": self.plain(getattr(self.objects[message[1]], message[2]))}
                elif kind == "setattr":
                    setattr(self.objects[message[1]], message[2], message[3])
                    reply = {"value": None}
                elif kind == "apply":
                    _, fn, args, kwargs = message
                    reply = {"value": self.plain(fn(*args, **kwargs))}
                else:
                    reply = {"error": f"unknown request {kind!r}", "type": "RuntimeError"}
            except BaseException as err:  # noqa: BLE001 - the student's code raised: tell the grader
                reply = self.error(err)
            if kind != "cells":
                reply["imports"] = self.take_imports()
                reply["outside"] = self.take_outside()
            try:
                self.send(reply)
            except Exception as err:  # noqa: BLE001 - an unpicklable value, say why
                self.send({"error": f"the result could not be sent back: {_short(err)}", "type": "TypeError"})


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}{': ' + text if text else ''}"[:300]


def _python_source(source: str) -> str:
    """IPython syntax (``%magic``, ``!shell``) turned into Python; such lines then fail by themselves."""
    if "%" not in source and "!" not in source:
        return source
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        return source
    return TransformerManager().transform_cell(source)


class _NoShell:
    """What ``get_ipython()`` gives a submission's cells: magics and shell escapes do nothing,
    except the cell magics that only wrap their cell (``%%time``, ``%%capture``), whose cell runs."""

    RUNS_ITS_CELL = {"time", "timeit", "capture"}

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.namespace = namespace

    def run_cell_magic(self, name: str, line: str, cell: str) -> None:
        if name in self.RUNS_ITS_CELL:
            exec(compile(cell, "<cell magic>", "exec"), self.namespace)

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def main() -> None:
    # Keep the protocol away from fd 0/1: a student's print() goes to stderr.
    inp, out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    os.environ[WORKER_ENV] = "1"  # check() and score() of the notebook's cells do nothing here
    worker = Worker(inp, out)
    worker.watch_imports()
    roots = os.environ.get(ROOTS_ENV)
    if roots is not None:
        worker.watch_files(roots.split(os.pathsep), os.environ.get(WRITABLE_ENV, "").split(os.pathsep))
    shell = _NoShell(worker.namespace)
    worker.namespace["get_ipython"] = lambda: shell
    try:
        worker.serve()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:
        os._exit(0)


if __name__ == "__main__":
    main()
