"""The wire between the instructor's grader (trusted) and a submission's worker (untrusted).

The grader runs the cases of the course's ``companion.grading.chNN`` modules in
its own process. The student's objects live in a worker process (:mod:`.worker`)
and are seen by the cases through :class:`RemoteObject` proxies: calling one
sends the arguments (copies, by construction) to the worker, which calls the
student's object and sends back only the result. The grader builds the inputs
and the reference answers and compares them; nothing the submission does in its
process can change them.

Frames are an 8-byte length and a payload. Grader to worker: a pickle (the
worker trusts the grader). Worker to grader: ``torch.save`` of plain data
(tensors, numbers, strings, lists, tuples, dicts), read back with
``torch.load(weights_only=True)``, which refuses to build arbitrary objects.
Any other object the student returns stays in the worker and is sent as a
handle ``{"__remote__": id, "type": ..., "mro": [...]}``. An exception of the
student's code comes back as :class:`companion.grading.core.StudentError`, a
worker that goes away as :class:`companion.grading.core.StudentProcessDied`:
the course's ``run_case`` turns both into a failed case with a message.
"""

from __future__ import annotations

import builtins
import io
import os
import pickle
import select
import struct
import sys
import time
from typing import Any

import torch

from companion.grading.core import StudentError, StudentProcessDied, StudentProxy

__all__ = ["RemoteObject", "Channel", "remote_exception"]

HEADER = struct.Struct(">Q")
MAX_FRAME = 256 * 1024 * 1024  # a reply larger than this is treated as a broken worker

_ERROR_CLASSES: dict[str, type] = {}


def remote_exception(type_name: str, description: str) -> BaseException:
    """An exception to raise in the grader for one raised by the student's code in the worker.

    Built-in exception types keep their type (a case may expect ``ValueError``),
    anything else becomes a plain :class:`StudentError`; never a ``BaseException``
    like ``SystemExit`` that would stop the grader.
    """
    base = getattr(builtins, type_name, None)
    if not (isinstance(base, type) and issubclass(base, Exception)):
        base = Exception
    cls = _ERROR_CLASSES.get(type_name)
    if cls is None:
        cls = type(type_name, (StudentError, base), {"__module__": "student"})
        _ERROR_CLASSES[type_name] = cls
    err = cls(description)
    err.description = description
    return err


# ------------------------------------------------------------------ framing

def write_frame(fd: int, payload: bytes) -> None:
    data = HEADER.pack(len(payload)) + payload
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                raise TimeoutError
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise StudentProcessDied("the worker closed its output")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, deadline: float | None = None) -> bytes:
    (n,) = HEADER.unpack(_read_exact(fd, HEADER.size, deadline))
    if n > MAX_FRAME:
        raise StudentProcessDied(f"the worker sent a frame of {n} bytes")
    return _read_exact(fd, n, deadline)


def dump_plain(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def load_plain(data: bytes) -> Any:
    """Decode a worker's reply without running any of its code."""
    return torch.load(io.BytesIO(data), weights_only=True)


# ------------------------------------------------------------------ grader side

class Channel:
    """The grader's end of a worker: send a request, wait for its reply (plain data only)."""

    def __init__(self, to_worker: int, from_worker: int) -> None:
        self.to_worker, self.from_worker = to_worker, from_worker
        self.broken = False
        self.imports: set[str] = set()  # what the student's code imported while answering (worker's report)
        self.outside: set[str] = set()  # what it tried to read, write or run outside its folders (worker's report)

    def request(self, message: tuple, deadline: float | None = None) -> Any:
        if self.broken:
            raise StudentProcessDied("the worker was stopped earlier in this exercise")
        buf = io.BytesIO()
        _HandlePickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(message)
        try:
            write_frame(self.to_worker, buf.getvalue())
            reply = load_plain(read_frame(self.from_worker, deadline))
        except BaseException:
            self.broken = True  # a half-read reply: the stream is out of step, the worker must go
            raise
        return self._unwrap(reply)

    def _unwrap(self, reply: Any) -> Any:
        if not isinstance(reply, dict):
            self.broken = True
            raise StudentProcessDied(f"the worker sent {type(reply).__name__} instead of a reply")
        found = reply.get("imports")
        if isinstance(found, list):
            self.imports.update(str(m)[:200] for m in found[:1000])
        found = reply.get("outside")
        if isinstance(found, list) and len(self.outside) < 1000:
            self.outside.update(str(m)[:400] for m in found[:200])
        if "error" in reply:
            raise remote_exception(str(reply.get("type", "Exception")), str(reply["error"])[:1000])
        return self.revive(reply.get("value"))

    def revive(self, value: Any) -> Any:
        """Turn handles in a reply into :class:`RemoteObject` proxies (containers are rebuilt)."""
        if isinstance(value, dict):
            if "__remote__" in value and len(value) == 3:
                return RemoteObject.make(self, value)
            return type(value)((k, self.revive(v)) for k, v in value.items())
        if isinstance(value, list):
            return [self.revive(v) for v in value]
        if isinstance(value, tuple) and not isinstance(value, torch.Size):
            return tuple(self.revive(v) for v in value)
        return value


class _HandlePickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, RemoteObject):
            return ("remote", object.__getattribute__(obj, "_id"))
        return None


def _trusted_class(mro: list[str]) -> type | None:
    """The first ``torch.nn.Module`` class in the student's object's MRO, found by name in the grader.

    Lets ``isinstance(proxy, nn.Linear)`` hold for a student's ``nn.Linear``
    (the behaviour is still checked by calling it). Only modules the grader has
    already imported are searched, and only module classes are claimed: a proxy
    never passes for a tensor.
    """
    for qualname in mro:
        module, _, name = qualname.rpartition(".")
        found = sys.modules.get(module) if module.split(".")[0] == "torch" else None
        for part in name.split(".") if found is not None else ():
            found = getattr(found, part, None)
        if isinstance(found, type) and issubclass(found, torch.nn.Module):
            return found
    return None


class RemoteObject(StudentProxy):
    """A proxy for an object living in the worker: call it, read its attributes, call its methods."""

    __slots__ = ("_channel", "_id", "_type", "_claimed")
    _classes: dict[str, type] = {}

    @classmethod
    def make(cls, channel: Channel, handle: dict[str, Any]) -> RemoteObject:
        type_name = str(handle["type"]).rpartition(".")[2] or "object"
        sub = cls._classes.get(type_name)
        if sub is None:  # so that messages say "got Foo", the student's type name
            sub = type(type_name, (cls,), {"__slots__": ()})
            cls._classes[type_name] = sub
        obj = object.__new__(sub)
        object.__setattr__(obj, "_channel", channel)
        object.__setattr__(obj, "_id", int(handle["__remote__"]))
        object.__setattr__(obj, "_type", str(handle["type"]))
        object.__setattr__(obj, "_claimed", _trusted_class([str(m) for m in handle["mro"]]))
        return obj

    @property  # type: ignore[misc]
    def __class__(self):  # isinstance() consults it when type() does not match
        claimed = object.__getattribute__(self, "_claimed")
        return claimed if claimed is not None else type(self)

    def _request(self, *message: Any) -> Any:
        return object.__getattribute__(self, "_channel").request(message)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # the grader's grad mode travels with the call (a check run under torch.no_grad() stays so)
        return self._request("call", object.__getattribute__(self, "_id"), args, kwargs, torch.is_grad_enabled())

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._request("getattr", object.__getattribute__(self, "_id"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._request("setattr", object.__getattribute__(self, "_id"), name, value)

    def _run_student(self, fn: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        # companion.grading.core.run_student: fn runs in the worker, on the student's own objects
        return object.__getattribute__(self, "_channel").request(("apply", fn, args, kwargs))

    def __repr__(self) -> str:
        return f"<student {object.__getattribute__(self, '_type')}>"
