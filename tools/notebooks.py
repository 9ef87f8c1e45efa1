"""Maintenance of the course notebooks (for authors; learners never need it).

    python tools/notebooks.py sync            # setup cells from _config.yml, exercises from solutions
    python tools/notebooks.py check           # exit 1 if anything is out of date (a test runs this)
    python tools/notebooks.py execute NB...   # run notebooks in place and store their outputs

The repository URL lives in one place, ``_config.yml`` (``repository.url``);
every notebook's setup cell (the code cell tagged ``setup``) is rewritten from
it, so the Colab install line can never drift from the book's links.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "grader")]  # the course package and the instructor's grader, uninstalled

from companion_grader.authoring import notebook_text, sync_exercises  # noqa: E402

NOTEBOOK_DIRS = ("book", "solutions")

SETUP_TEMPLATE = '''\
# Setup: the course package `companion` is needed. In the repository it is
# installed by `pip install -e .`; in Colab this installs the release that
# matches this notebook (and nothing that Colab already has: torch, numpy,
# matplotlib and transformers are left as they are).
import importlib.util
import subprocess
import sys

if importlib.util.find_spec("companion") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "{requirement}"], check=True)'''


def repository_url() -> str:
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    return config["repository"]["url"]


def package_version() -> str:
    """The version in pyproject.toml (``project.version``), which is also ``companion.__version__``."""
    match = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    if match is None:
        raise ValueError("pyproject.toml has no project version line (version = \"X.Y.Z\")")
    return match.group(1)


def release_tag(version: str | None = None) -> str:
    """The git tag of a release: ``v`` + the package version (README: how a release is tagged)."""
    return f"v{version or package_version()}"


def install_requirement(url: str | None = None) -> str:
    """What the setup cell gives pip: the repository at the tag of this notebook's release."""
    return f"git+{url or repository_url()}@{release_tag()}"


# Appended to the setup cell of a notebook whose metadata says it needs a newer
# release of a package than Colab may have, e.g.
#     "metadata": {"companion": {"needs": {"transformers": ">=5"}}}
# Too old (or missing): one line saying what is needed, what is installed and how
# to upgrade, then the run stops (an IPython handler shows the line, no traceback).
GUARD_TEMPLATE = '''

# This notebook needs {package}{spec}, newer than some Colab images ship.
import re
from importlib.metadata import PackageNotFoundError, version


class NeedsNewerPackage(Exception):
    """Stops "Run all" with one line of explanation instead of a traceback."""


try:
    have = version("{package}")
except PackageNotFoundError:
    have = None
if have is None or tuple(map(int, re.findall(r"\\d+", have)[:{n}])) < {minimum}:
    installed = "no {package} is installed" if have is None else f"{package} {{have}} is installed"
    message = (f"This notebook needs {package}{spec}, but {{installed}}: run "
               "`pip install -U {package}` in a cell, then restart the runtime and run the notebook again.")
    if "get_ipython" not in globals():
        raise SystemExit(message)
    get_ipython().set_custom_exc((NeedsNewerPackage,), lambda shell, etype, value, tb, tb_offset=None: print(value))
    raise NeedsNewerPackage(message)'''


def notebook_needs(nb: dict) -> dict[str, str]:
    """The notebook's minimum package versions: ``metadata.companion.needs``, e.g. ``{"transformers": ">=5"}``."""
    needs = nb.get("metadata", {}).get("companion", {}).get("needs", {})
    for package, spec in needs.items():
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", package) or not re.fullmatch(r">=\d+(\.\d+)?", spec):
            raise ValueError(f"metadata.companion.needs: expected {{package: '>=MAJOR' or '>=MAJOR.MINOR'}}, "
                             f"got {package!r}: {spec!r}")
    return needs


def setup_source(needs: dict[str, str] | None = None) -> str:
    """The setup cell: install ``companion`` if missing, then one guard per entry of ``needs``."""
    source = SETUP_TEMPLATE.format(requirement=install_requirement())
    for package, spec in (needs or {}).items():
        minimum = tuple(int(p) for p in spec[2:].split("."))
        source += GUARD_TEMPLATE.format(package=package, spec=spec, minimum=minimum, n=len(minimum))
    return source


def _notebooks() -> list[Path]:
    return sorted(p for d in NOTEBOOK_DIRS for p in (ROOT / d).glob("*.ipynb"))


def sync_setup_cells(check: bool = False) -> list[Path]:
    """Rewrite the setup cell of every notebook; return those that changed (or would)."""
    changed = []
    for path in _notebooks():
        nb = json.loads(path.read_text(encoding="utf-8"))
        want = setup_source(notebook_needs(nb))
        setup = [c for c in nb["cells"] if "setup" in c.get("metadata", {}).get("tags", [])]
        if len(setup) != 1 or setup[0]["cell_type"] != "code":
            raise ValueError(f"{path.relative_to(ROOT)} needs exactly one code cell tagged 'setup', found {len(setup)}")
        src = setup[0]["source"]
        tags = setup[0]["metadata"]["tags"]
        if ("".join(src) if isinstance(src, list) else src) != want or "hide-input" not in tags:
            changed.append(path)
            if not check:
                setup[0]["source"] = want
                # The website folds the install cell behind a "show code" toggle.
                setup[0]["metadata"]["tags"] = sorted(set(tags) | {"hide-input"})
                path.write_text(notebook_text(nb), encoding="utf-8")
    return changed


# Variables that force an instruction set on PyTorch, MKL and oneDNN. The test
# suite sets them (conftest.py) so that nbval compares the committed outputs
# under another instruction set than the one that produced them; `execute`
# removes them, so committed outputs always come from the machine's native one.
ISA_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def native_environment() -> dict[str, str]:
    """This process's environment without the instruction-set overrides (for notebook kernels)."""
    return {k: v for k, v in os.environ.items() if k not in ISA_VARIABLES}


def execute(paths: list[Path], timeout: int = 900) -> None:
    """Execute notebooks in place (working directory = the notebook's folder) and save outputs.

    Kernels run with the machine's native instruction set (see ``ISA_VARIABLES``).
    """
    import nbformat
    from nbclient import NotebookClient

    env = native_environment()
    for path in paths:
        path = Path(path).resolve()
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                                resources={"metadata": {"path": str(path.parent)}})
        client.execute(env=env)
        path.write_text(notebook_text(nb), encoding="utf-8")
        print(f"executed {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["sync", "check", "execute"])
    parser.add_argument("paths", nargs="*", type=Path)
    args = parser.parse_args(argv)
    if args.command == "execute":
        execute(args.paths)
        return 0
    check = args.command == "check"
    stale = sync_setup_cells(check=check)
    stale += sync_exercises(ROOT / "solutions", ROOT / "exercises", check=check)
    for path in stale:
        print(f"{'stale' if check else 'updated'}: {path.relative_to(ROOT)}")
    if check and stale:
        print("run: python tools/notebooks.py sync", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
