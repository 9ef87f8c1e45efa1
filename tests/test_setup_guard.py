"""Issue 7: a notebook that needs a newer package than Colab has says so in one line, never a traceback.

The guard is written into the setup cell by ``tools/notebooks.py sync`` from the
notebook's metadata (``"companion": {"needs": {"transformers": ">=5"}}``). Here a
fake distribution directory placed first on the kernel's path makes
``importlib.metadata`` report an older transformers, as on Colab.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import notebooks as nbtools  # noqa: E402

UPGRADE = "This notebook needs transformers>=5, but transformers 4.57.6 is installed: run `pip install -U transformers`"


def _fake_transformers(tmp_path: Path, version: str) -> Path:
    site = tmp_path / "fake-site"
    dist = site / f"transformers-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: transformers\nVersion: {version}\n")
    return site


def _notebook(needs: dict[str, str]):
    nb = nbformat.v4.new_notebook()
    nb.metadata["companion"] = {"needs": needs}
    setup = nbtools.setup_source(nbtools.notebook_needs(nb))
    nb.cells = [nbformat.v4.new_code_cell(setup, metadata={"tags": ["setup"]}),
                nbformat.v4.new_code_cell('print("second cell ran")')]
    return nb


def _run(nb, tmp_path, monkeypatch, site: Path | None):
    if site is not None:
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    client = NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except CellExecutionError:
        return False
    return True


def _text(cell) -> str:
    return "".join(out.get("text", "") for out in cell.outputs if out.output_type == "stream")


def test_too_old_transformers_stops_the_run_with_one_line_and_no_traceback(tmp_path, monkeypatch):
    nb = _notebook({"transformers": ">=5"})
    completed = _run(nb, tmp_path, monkeypatch, _fake_transformers(tmp_path, "4.57.6"))
    setup, second = nb.cells
    assert not completed  # "Run all" stops at the setup cell
    assert [out.output_type for out in setup.outputs] == ["stream"]  # no error output, hence no traceback
    assert _text(setup).startswith(UPGRADE) and _text(setup).count("\n") == 1
    assert "restart" in _text(setup) and "Traceback" not in _text(setup)
    assert second.outputs == [] and second.execution_count is None


def test_new_enough_transformers_passes_the_guard(tmp_path, monkeypatch):
    nb = _notebook({"transformers": ">=5"})
    assert _run(nb, tmp_path, monkeypatch, _fake_transformers(tmp_path, "5.0.0rc1"))
    assert nb.cells[0].outputs == [] and _text(nb.cells[1]) == "second cell ran\n"


def test_outside_ipython_the_guard_exits_with_the_message(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_fake_transformers(tmp_path, "4.57.6")), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-c", nbtools.setup_source({"transformers": ">=5"})],
                          env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.startswith(UPGRADE) and "Traceback" not in proc.stderr


def test_without_needs_the_setup_cell_has_no_guard_and_bad_specs_are_refused():
    assert "NeedsNewerPackage" not in nbtools.setup_source()
    assert nbtools.notebook_needs({"metadata": {}}) == {}
    for spec in ("5", "~=5", ">=5.x", ">=5; import os"):
        with pytest.raises(ValueError, match="MAJOR"):
            nbtools.notebook_needs({"metadata": {"companion": {"needs": {"transformers": spec}}}})
