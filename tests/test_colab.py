"""Colab, simulated: the package installed into a fresh environment that has only
what Colab already has (torch, numpy, matplotlib, ipywidgets, a Jupyter kernel;
no Jupyter Book), and a chapter and an exercise notebook run from an empty
folder outside the repository."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
COLAB_PACKAGES = [
    f"torch=={torch.__version__.split('+')[0]}", "numpy", "matplotlib", "ipywidgets", "tqdm",
    "ipykernel", "nbclient", "nbformat",
]
NOTEBOOKS = [ROOT / "book" / "ch02_attention.ipynb", ROOT / "exercises" / "ch02_attention.ipynb"]

RUNNER = textwrap.dedent('''
    import sys
    import nbformat
    from nbclient import NotebookClient
    for path in sys.argv[1:]:
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": "."}}).execute()
        texts = [o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs]
        print(path, "OK", sum("[pass]" in t for t in texts), "passed checks")
''')


def run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.skipif(sys.platform != "linux", reason="the Colab simulation builds a Linux virtual environment")
def test_notebooks_run_in_a_colab_like_environment(tmp_path):
    wheels = tmp_path / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheels), str(ROOT)])
    (wheel,) = wheels.glob("companion-*.whl")
    import zipfile

    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("companion/checkpoints/")}
    expected = {f"companion/checkpoints/{p.name}" for p in (ROOT / "companion" / "checkpoints").glob("*.[pj][ts]*")}
    assert expected <= shipped, f"checkpoints missing from the wheel: {sorted(expected - shipped)}"

    venv = tmp_path / "colab-venv"
    run([sys.executable, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    run([str(py), "-m", "pip", "install", "--quiet", *COLAB_PACKAGES])
    before = run([str(py), "-m", "pip", "freeze"])
    run([str(py), "-m", "pip", "install", "--quiet", str(wheel)])
    after = run([str(py), "-m", "pip", "freeze"])
    changed = sorted(set(after.splitlines()) - set(before.splitlines()))
    assert [line.split(" @ ")[0].split("==")[0] for line in changed] == ["companion"], changed  # nothing reinstalled

    probe = run([str(py), "-c", "import importlib.util as u; print(u.find_spec('myst_nb'), u.find_spec('jupyter_book'))"])
    assert probe.strip() == "None None"

    work = tmp_path / "empty-folder"
    work.mkdir()
    for nb in NOTEBOOKS:
        shutil.copy(nb, work / f"{nb.parent.name}-{nb.name}")
    (work / "runner.py").write_text(RUNNER)
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": ""}
    env.pop("VIRTUAL_ENV", None)
    out = run([str(py), "runner.py", *sorted(p.name for p in work.glob("*.ipynb"))], cwd=work, env=env)
    assert out.count(" OK ") == len(NOTEBOOKS), out
