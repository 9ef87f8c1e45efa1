"""The learner's package and the instructor's grader are two distributions, one-way dependent.

A student's check cell (``from companion.grading import check, score``) runs in
a kernel where only ``companion`` is installed (Colab); the grader
(``grader/``, import package ``companion_grader``) imports the course's
exercises from ``companion``, never the reverse, and no module of either takes
part in an import cycle.
"""

import ast
import subprocess
import sys
import textwrap
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GRADING = ROOT / "companion" / "grading"
GRADER = ROOT / "grader" / "companion_grader"
MOVED = ("sandbox", "worker", "remote", "instructor", "authoring")


def run_python(code: str) -> subprocess.CompletedProcess:
    """A fresh interpreter importing the course from this checkout (what a notebook kernel gets)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
                                                       "PATH": "/usr/bin:/bin"})


def test_a_check_cell_runs_without_the_grader():
    # The grader is made unimportable (as on Colab) and every attempt to import it is recorded;
    # the check cell then grades the reference itself, through run_student's in-kernel path (4.1's last case).
    proc = run_python("""
        import sys

        tried = []

        class NoGrader:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "companion_grader":
                    tried.append(name)
                    raise ImportError(f"{name} is not installed here")
                return None

        sys.meta_path.insert(0, NoGrader())
        from companion.grading import check, score, chapter_exercises
        from companion.models.transformer import shift_right

        check("4.1", shift_right)
        score(4)
        for chapter in range(1, 17):
            chapter_exercises(chapter)  # every chapter's checks import
        loaded = sorted(m for m in sys.modules if m.split(".")[0] == "companion_grader"
                        or m.startswith("companion.grading.") and m.rsplit(".", 1)[1] in {moved})
        print("TRIED", tried, "LOADED", loaded)
    """.replace("{moved}", repr(set(MOVED))))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TRIED [] LOADED []" in proc.stdout, proc.stdout[-2000:]
    (line,) = [s for s in proc.stdout.splitlines() if s.startswith("Exercise 4.1")]
    earned, points = line.rsplit(" -- ", 1)[1].split()[0].split("/")
    assert earned == points, proc.stdout  # the reference earns every point in the kernel


def test_the_learners_wheel_holds_no_grader():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    # What setuptools' packages.find does with its defaults (namespace packages too): every folder,
    # as a dotted name, that matches one of the patterns.
    folders = {".".join(d.relative_to(ROOT).parts) for d in ROOT.rglob("*") if d.is_dir()
               and not any(part.startswith((".", "_")) or part == "node_modules" for part in d.relative_to(ROOT).parts)}
    packages = sorted(f for f in folders if any(fnmatchcase(f, pattern) for pattern in include))
    assert "companion" in packages and "companion.grading" in packages
    assert "grader.companion_grader" in folders and not [p for p in packages if "grader" in p], packages
    assert not any(fnmatchcase("companion_grader", pattern) for pattern in include)  # not even at the root
    assert not [name for name in MOVED + ("__main__",) if (GRADING / f"{name}.py").exists()]


def _imports(path: Path, package: str) -> set[str]:
    """Absolute names of every module ``path`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            found.add(module)
            found |= {f"{module}.{a.name}" for a in node.names}  # `from . import x` imports module x
    return found


def _modules() -> dict[str, Path]:
    mods = {}
    for package, folder in (("companion.grading", GRADING), ("companion_grader", GRADER)):
        for path in sorted(folder.glob("*.py")):
            mods[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return mods


def test_the_import_graph_is_acyclic_and_one_way():
    mods = _modules()
    assert {"companion_grader.remote", "companion.grading.core", "companion.grading.ch04"} <= set(mods)
    graph = {}
    for name, path in mods.items():
        package = name if path.stem == "__init__" else name.rpartition(".")[0]
        graph[name] = {m for m in _imports(path, package) if m in mods and m != name}
    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*trail, node, nxt]))
            if nxt not in state:
                visit(nxt, [*trail, node])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    # the course package never names the grader, anywhere
    named = [str(p.relative_to(ROOT)) for p in (ROOT / "companion").rglob("*.py")
             if any(m.split(".")[0] == "companion_grader" for m in _imports(p, "companion"))]
    assert named == []


def test_the_import_walk_sees_the_cycle_it_guards_against(tmp_path):
    # the same parser on the old shape (core -> remote inside a function, remote -> core): the test can fail
    (tmp_path / "core.py").write_text("def run_case():\n    from .remote import WorkerDied\n")
    (tmp_path / "remote.py").write_text("from .core import unwrap_student\n")
    assert "pkg.remote.WorkerDied" in _imports(tmp_path / "core.py", "pkg")
    assert "pkg.core" in _imports(tmp_path / "remote.py", "pkg")
