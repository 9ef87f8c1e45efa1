"""Colab, simulated: every chapter, solution and exercise notebook run from an empty folder
in a fresh environment that holds what Colab's runtime holds, with `companion` installed
by the notebook's own setup cell.

* The environment: Colab's Python, torch (a CUDA build, as on Colab; it runs on the CPU
  here), transformers, numpy, ipykernel and the other packages the course touches, at the
  versions in tests/colab_stack.toml (taken from googlecolab/backend-info; the file says
  when). No Jupyter Book, no myst-nb.
* Python comes from the machine, never installed: pyenv's newest ``versions/3.13.*``
  (under ``pyenv root``, or ~/.pyenv without the command), else ``python3.13`` on PATH.
  Where neither exists, every simulated test SKIPS and says so.
* The packages come from the package index (PIP_EXTRA_INDEX_URL is dropped, so that a CPU
  index set for the suite's own torch does not replace Colab's CUDA build). They are
  downloaded once into a wheelhouse, ~/.cache/companion-colab-wheels (about 3 GB, most
  of it torch's CUDA libraries), and installed from there without the index: pip's own
  HTTP cache cannot be relied on to keep them (behind a proxy that strips the caching
  headers it keeps nothing). A later run only re-resolves the versions against the index.
* One transformers release is simulated, Colab's. The simulation used to add a run on
  transformers 4.57.6 (Colab's Hugging Face libraries then lagged a major version behind);
  Colab now ships 5.x, pyproject.toml's `reference` extra asks for >=5.15, and what the
  4.x run alone could catch was the notebooks' branches for 4.x return types, a release
  line no current Colab runs: it is gone, with its pending list.
* The install: each notebook's setup cell runs unchanged except for the host of the
  repository URL, which points to a local git repository holding this working tree
  (committed as a snapshot and tagged with the release tag the setup cell asks for).
  So the exact pip line, `git+URL@vX.Y.Z`, is what gets exercised.
* After every notebook, `pip freeze` may differ from the fresh environment only by
  `companion`: installing the course never replaces anything Colab already has.
  Then `companion` is uninstalled, so the next notebook installs it again itself.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import notebooks as nbtools  # noqa: E402

STACK = tomllib.loads((Path(__file__).with_name("colab_stack.toml")).read_text(encoding="utf-8"))
COLAB_PYTHON = STACK["python"]["version"]
COLAB_PACKAGES = STACK["packages"]
COLAB_TRANSFORMERS = COLAB_PACKAGES["transformers"]
WHEELHOUSE = Path.home() / ".cache" / "companion-colab-wheels"
NOTEBOOKS = [p for d in ("book", "solutions", "exercises") for p in sorted((ROOT / d).glob("*.ipynb"))]


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", Path(path).parents[1].name))


def find_colab_python(version: str = COLAB_PYTHON) -> str | None:
    """Colab's Python on this machine: pyenv's newest ``versions/<version>.*``, else ``python<version>`` on PATH."""
    pyenv = shutil.which("pyenv")
    root = subprocess.run([pyenv, "root"], capture_output=True, text=True).stdout.strip() if pyenv else ""
    root = root or str(Path.home() / ".pyenv")
    found = sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}")), key=_version_key)
    return found[-1] if found else shutil.which(f"python{version}")


RUNNER = textwrap.dedent('''
    """Run one notebook as Colab's "Run all" would; report the first failing cell briefly."""
    import sys
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(sys.argv[1], as_version=4)
    try:
        NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": "."}}).execute()
    except CellExecutionError as err:
        print(f"FAILED {sys.argv[1]}: {err.ename}: {err.evalue}")
        print(str(err)[-4000:])
        sys.exit(1)
    finally:
        nbformat.write(nb, sys.argv[1] + ".out")  # what the reader saw, cell by cell
    print(f"OK {sys.argv[1]}")
''')


def run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def freeze(py) -> set[str]:
    return set(run([str(py), "-m", "pip", "freeze", "--all"]).splitlines())


def snapshot_repository(dest: Path) -> str:
    """A git repository holding this working tree (tracked and untracked, not ignored files),
    tagged with the release tag the setup cells install; returns its ``file://`` URL."""
    files = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT).split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    git = ["git", "-c", "user.name=colab-simulation", "-c", "user.email=colab@localhost", "-c", "commit.gpgsign=false"]
    run(["git", "init", "--quiet", str(dest)])
    run([*git, "add", "--all"], cwd=dest)
    run([*git, "commit", "--quiet", "-m", "snapshot of the working tree"], cwd=dest)
    run([*git, "tag", nbtools.release_tag()], cwd=dest)
    return dest.as_uri()


def setup_cell(nb: dict) -> dict:
    (cell,) = [c for c in nb["cells"] if "setup" in c.get("metadata", {}).get("tags", [])]
    return cell


@pytest.fixture(scope="module")
def colab(tmp_path_factory):
    if sys.platform != "linux":
        pytest.skip("the Colab simulation builds a Linux virtual environment")
    python = find_colab_python()
    if python is None:
        pytest.skip(f"the Colab simulation needs Python {COLAB_PYTHON} (Colab's, tests/colab_stack.toml): "
                    f"found neither pyenv's versions/{COLAB_PYTHON}.* nor python{COLAB_PYTHON} on PATH")
    tmp = tmp_path_factory.mktemp("colab")
    repo_url = snapshot_repository(tmp / "course")

    venv = tmp / "colab-venv"
    run([python, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    pins = [f"{name}=={version}" for name, version in COLAB_PACKAGES.items()]
    pip_env = {k: v for k, v in os.environ.items() if k != "PIP_EXTRA_INDEX_URL"}
    run([str(py), "-m", "pip", "download", "--quiet", "--dest", str(WHEELHOUSE), *pins], env=pip_env)
    run([str(py), "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(WHEELHOUSE), *pins])
    probe = json.loads(run([str(py), "-c", textwrap.dedent("""
        import importlib.util as u, json, platform, torch
        print(json.dumps([platform.python_version(), torch.__version__, torch.version.cuda,
                          u.find_spec("myst_nb") is None and u.find_spec("jupyter_book") is None]))
    """)]))
    assert probe[0].startswith(f"{COLAB_PYTHON}.") and probe[1].split("+")[0] == COLAB_PACKAGES["torch"], probe
    assert probe[2] is not None, f"torch {probe[1]} is a CPU build; Colab's is a CUDA build (a CPU index in pip's config?)"
    assert probe[3], "the simulated Colab must not hold Jupyter Book or myst-nb"
    (tmp / "runner.py").write_text(RUNNER)

    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    return {"py": py, "url": repo_url, "env": env, "runner": tmp / "runner.py", "tmp": tmp, "fresh": freeze(py)}


def test_setup_cells_install_the_release_of_their_own_version():
    import companion

    assert nbtools.package_version() == companion.__version__, "pyproject.toml and companion/__init__.py disagree"
    want = f'"git+{nbtools.repository_url()}@v{companion.__version__}"'
    for path in NOTEBOOKS:
        assert want in "".join(setup_cell(json.loads(path.read_text()))["source"]), path.name


def _lower_bounds() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    specs = project["dependencies"] + [s for extra in project["optional-dependencies"].values() for s in extra]
    bounds = {}
    for spec in specs:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", spec)
        assert match, f"pyproject.toml: expected 'name>=version' (a lower bound some environment tests), got {spec!r}"
        bounds[match[1].lower()] = match[2]
    return bounds


def test_declared_lower_bounds_are_the_versions_colab_installs():
    """pyproject.toml's lower bounds are exactly what the Colab simulation installs (the oldest environment the
    suite runs; requirements.txt pins newer releases), and requires-python is the CI's Python: no claim untested."""
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (ROOT / "requirements.txt").read_text(), re.M))
    for name, bound in _lower_bounds().items():
        assert name in COLAB_PACKAGES, f"pyproject.toml bounds {name}, which tests/colab_stack.toml does not install"
        assert bound == COLAB_PACKAGES[name], (
            f"pyproject.toml: {name}>={bound}, but the Colab simulation installs {name}=={COLAB_PACKAGES[name]}")
        assert name not in pins or _release(pins[name]) >= _release(bound), f"requirements.txt pins {name} below {bound}"
    ci_python = re.search(r"container: python:(\d+\.\d+)", (ROOT / ".github/workflows/ci.yml").read_text())[1]
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]
    assert requires == f">={ci_python}" and _release(ci_python) <= _release(COLAB_PYTHON), (requires, ci_python)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def _colab_too_old(nb: dict) -> bool:
    """Whether the notebook's metadata needs a newer transformers than the simulated Colab has."""
    spec = nbtools.notebook_needs(nb).get("transformers")
    colab = _release(COLAB_TRANSFORMERS)
    return spec is not None and colab[: len(spec[2:].split("."))] < tuple(int(p) for p in spec[2:].split("."))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_runs_in_colab_from_its_own_setup_cell(colab, notebook):
    _run_in_colab(colab, notebook, json.loads(notebook.read_text(encoding="utf-8")))


def test_a_notebook_needing_newer_transformers_stops_in_colab_with_one_line(colab):
    """Issue 7: the setup-cell guard (metadata companion.needs), in the simulated Colab: a notebook asking for the
    minor release after Colab's stops at the setup cell with one line."""
    major, minor = _release(COLAB_TRANSFORMERS)[:2]
    notebook = ROOT / "book" / "ch06_masks.ipynb"
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    nb["metadata"]["companion"] = {"needs": {"transformers": f">={major}.{minor + 1}"}}
    setup_cell(nb)["source"] = nbtools.setup_source(nbtools.notebook_needs(nb))
    assert _colab_too_old(nb)
    _run_in_colab(colab, notebook, nb, name="needs-newer")


def test_switch_capacity_guard_matches_colabs_transformers(colab):
    """Chapter 14's guard (companion.moe.hf_switch_has_capacity) against Colab's own Switch layer: where the guard
    says the release drops no token, the layer indeed differs from ours at a capacity that drops tokens."""
    env = {**colab["env"], "PYTHONPATH": str(ROOT)}
    result = json.loads(run([str(colab["py"]), str(ROOT / "tests" / "switch_parity.py")], env=env, cwd=colab["tmp"]).splitlines()[-1])
    assert result["dropped"] and result["equal"] is result["guard"], result


def _run_in_colab(colab, notebook, nb, name=None):
    py = colab["py"]
    run([str(py), "-m", "pip", "uninstall", "--quiet", "--yes", "companion"])  # every notebook installs it itself
    assert freeze(py) == colab["fresh"]

    cell = setup_cell(nb)
    source = "".join(cell["source"])
    official = f"git+{nbtools.repository_url()}@"
    want = nbtools.setup_source(nbtools.notebook_needs(nb))
    assert source == want and source.count(official) == 1, "run: python tools/notebooks.py sync"
    cell["source"] = source.replace(official, f"git+{colab['url']}@")  # only the host changes

    work = colab["tmp"] / (name or f"{notebook.parent.name}-{notebook.stem}")
    work.mkdir()  # an empty folder: nothing of the repository next to the notebook
    (work / notebook.name).write_text(json.dumps(nb), encoding="utf-8")
    proc = subprocess.run([str(py), str(colab["runner"]), notebook.name], cwd=work, env=colab["env"],
                          capture_output=True, text=True)
    if _colab_too_old(nb):
        # the guard stops "Run all" at the setup cell with one line and no traceback
        ran = json.loads((work / (notebook.name + ".out")).read_text(encoding="utf-8"))
        outputs = setup_cell(ran)["outputs"]
        assert proc.returncode == 1 and {o["output_type"] for o in outputs} == {"stream"}, proc.stdout[-3000:]
        text = "".join("".join(o["text"]) for o in outputs if o["name"] == "stdout")
        (line,) = [t for t in text.splitlines() if t.startswith("This notebook needs transformers>=")]
        assert f"{COLAB_TRANSFORMERS} is installed" in line and "pip install -U transformers" in line
        assert "Traceback" not in text and "NeedsNewerPackage" not in text
    else:
        assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]

    added = freeze(py) - colab["fresh"]
    removed = colab["fresh"] - freeze(py)
    assert not removed and [line.split(" @ ")[0].split("==")[0] for line in added] == ["companion"], (
        f"installing companion changed Colab's packages: removed {sorted(removed)}, added {sorted(added)}"
    )
