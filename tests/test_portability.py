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


# --- outputs under another instruction set -------------------------------------------------

ISA_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")

# A float32 matrix product whose last digits depend on the instruction set (MKL's
# SGEMM blocks the sum differently with SSE4.2 than with AVX2 or AVX-512).
PROBE = """\
import torch
from companion.notebook import glue
torch.manual_seed(0)
value = (torch.randn(256, 512) @ torch.randn(512, 128)).mean().item()
glue("value", value, {fmt!r})
print(f"mean {{value:{fmt}}}")"""


def probe_notebook(path, fmt):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(PROBE.format(fmt=fmt))]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def execute_natively(path):
    """Run the notebook exactly as authors do: `python tools/notebooks.py execute`."""
    proc = subprocess.run([sys.executable, "tools/notebooks.py", "execute", str(path)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def nbval(path):
    """The suite's output comparison of one notebook, in this (the suite's) environment."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env", "-p", "no:cacheprovider",
         "-p", "no:xdist", "-q", path.name],
        cwd=path.parent, capture_output=True, text=True, env=os.environ.copy(),
    )


def test_the_suite_runs_under_a_forced_instruction_set():
    forced = {k: os.environ.get(k) for k in ISA_VARIABLES}
    assert None not in forced.values(), f"conftest.py must set {ISA_VARIABLES}, found {forced}"


@pytest.mark.skipif(sys.platform != "linux", reason="MKL/ATen instruction-set switches checked on Linux x86")
def test_a_full_precision_glue_fails_and_a_rounded_one_passes(tmp_path):
    import json

    full = probe_notebook(tmp_path / "full.ipynb", ".17g")
    execute_natively(full)
    native = json.loads(full.read_text())["cells"][0]["outputs"]
    assert any("application/papermill.record/text/plain" in o.get("data", {}) for o in native), native
    proc = nbval(full)
    if proc.returncode == 0:
        pytest.skip("this CPU's native instruction set gives the same float32 product as the forced one")
    assert "1 failed" in proc.stdout and "papermill.record" in proc.stdout, proc.stdout[-3000:]

    rounded = probe_notebook(tmp_path / "rounded.ipynb", ".3f")
    execute_natively(rounded)
    proc = nbval(rounded)
    assert proc.returncode == 0, proc.stdout[-3000:]
