"""Same results on every machine: the corpus on every Python, outputs under another instruction set."""

import hashlib
import lzma
import os
import subprocess
import sys
from pathlib import Path

import pytest

from companion import corpus
from companion.data import load_pydoc_text

ROOT = Path(__file__).resolve().parents[1]
PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
SUPPORTED = ("3.10", "3.11", "3.12", "3.13")  # requires-python >= 3.10


def other_pythons():
    """Interpreters of the supported minor versions found on this machine (pyenv), besides this one."""
    found = {}
    for path in sorted(PYENV.glob("3.*/bin/python3")):
        minor = ".".join(path.parent.parent.name.split(".")[:2])
        if minor in SUPPORTED:
            found.setdefault(minor, path)
    return found


def test_corpus_is_the_frozen_text():
    text = load_pydoc_text()
    assert hashlib.sha256(text.encode("utf-8")).hexdigest() == corpus.PYDOC_SHA256
    assert (len(text), len(set(text))) == (465_126, 103)  # Python 3.11.7's pydoc_data.topics


def test_damaged_corpus_fails_with_a_clear_message(tmp_path, monkeypatch):
    bad = tmp_path / "bad.txt.xz"
    bad.write_bytes(lzma.compress(b"not the corpus"))
    monkeypatch.setattr(corpus.resources, "files", lambda _: tmp_path)
    with pytest.raises(RuntimeError, match="damaged or was replaced: SHA-256"):
        corpus.load_text("bad.txt.xz")


@pytest.mark.parametrize("minor", SUPPORTED)
def test_corpus_has_the_same_sha256_on_every_python(minor):
    python = other_pythons().get(minor)
    if python is None:
        pytest.skip(f"no Python {minor} under {PYENV}")
    # companion.corpus imports no torch, so any bare interpreter can load it from the source tree.
    code = (
        "import hashlib, sys; sys.path.insert(0, sys.argv[1]); from companion.corpus import load_text; "
        "t = load_text(); print(sys.version.split()[0], hashlib.sha256(t.encode()).hexdigest(), len(t))"
    )
    proc = subprocess.run([str(python), "-I", "-c", code, str(ROOT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    version, digest, length = proc.stdout.split()
    assert version.startswith(minor + ".")
    assert (digest, int(length)) == (corpus.PYDOC_SHA256, 465_126), f"Python {version} loads another corpus"
