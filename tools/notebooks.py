"""Maintenance of the course notebooks (for authors; learners never need it).

    python tools/notebooks.py sync            # setup cells from _config.yml, exercises from solutions,
                                              # Chinese exercises from the catalogues (see below)
    python tools/notebooks.py check           # exit 1 if anything is out of date (a test runs this)
    python tools/notebooks.py execute NB...   # run notebooks in place and store their outputs

The repository URL lives in one place, ``_config.yml`` (``repository.url``);
every notebook's setup cell (the code cell tagged ``setup``) is rewritten from
it, so the Colab install line can never drift from the book's links.

The Chinese exercise notebooks (``exercises/zh_CN/``) come from the English ones
through one catalogue per notebook, ``locales/zh_CN/LC_MESSAGES/exercises/<nb>.po``,
the book's gettext mechanism applied to the markdown cells: ``sync`` updates the
catalogue (one message per paragraph: a new paragraph empty, a changed one fuzzy
with its old translation) and writes the Chinese notebook, identical to the
English exercise notebook except that each translated paragraph replaces its
English (an untranslated or fuzzy one stays English; ``tools/i18n.py check``
names it). An exercise heading stays ``## Exercise N.k: <title> (P points)``
word for word, followed by the Chinese title, so everything that reads headings
reads a Chinese notebook as it reads the English one.
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

from companion_grader.authoring import (TITLE, cell_source, check_statements,  # noqa: E402
                                        make_exercise_notebook, notebook_text, sync_exercises)

sys.path.insert(0, str(ROOT / "tools"))
import i18n  # noqa: E402  (the book's catalogues: loading, the checks)

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


# --- the Chinese exercise notebooks ---

ZH_EXERCISES = ROOT / "exercises" / i18n.LANGUAGE
EXERCISE_CATALOGUES = i18n.CATALOGUES / "exercises"
_BLOCK_SEP = re.compile(r"(\n[ \t]*\n+)")
_HEADING = re.compile(r"^(#+[ \t]+)(.*)$")
_NUMBERED = re.compile(r"\d+\.[ \t]+")
TITLE_CONTEXT = "Exercise {} title"  # msgctxt of an exercise's title (the heading keeps the English)


def _blocks(text: str) -> list[tuple[str, str]]:
    """A markdown cell as ``(block, separator)`` pairs: paragraphs, lists, a heading line on its own.

    A fenced code block or a display formula that contains blank lines stays one block.
    """
    parts = _BLOCK_SEP.split(text)
    pieces = list(zip(parts[0::2], parts[1::2] + [""]))
    merged: list[list[str]] = []
    for block, sep in pieces:
        if merged and (merged[-1][0].count("```") % 2 or merged[-1][0].count("$$") % 2):
            merged[-1][0] += merged[-1][1] + block  # still inside a fence or a display formula
            merged[-1][1] = sep
        else:
            merged.append([block, sep])
    out = []
    for block, sep in merged:
        kept = block.rstrip()  # trailing blanks (a cell's last newline) belong to the separator, not the message
        block, sep = kept, block[len(kept):] + sep
        lines = block.split("\n")
        if _HEADING.match(lines[0]) and len(lines) > 1:  # a heading with its paragraph right under it
            out += [(lines[0], "\n"), ("\n".join(lines[1:]), sep)]
        else:
            out.append((block, sep))
    return out


def _translatable(block: str) -> bool:
    """Prose to translate: not a code fence, not a display formula, not only code/math/roles."""
    stripped = block.strip()
    if not stripped or stripped.startswith("```") or (stripped.startswith("$$") and stripped.endswith("$$")):
        return False
    return bool(re.search(r"[A-Za-z]{2}", i18n.prose(stripped)))


def _message(block: str) -> tuple[str, str | None, str] | None:
    """``(msgid, msgctxt, heading prefix)`` of one block, or None for a block kept as it is."""
    if not _translatable(block):
        return None
    title = TITLE.match(block)
    if title:
        return title.group(2), TITLE_CONTEXT.format(title.group(1)), ""
    heading = _HEADING.match(block)
    if heading and "\n" not in block:
        return heading.group(2), None, heading.group(1)
    numbered = _NUMBERED.match(block)  # an ordered list: its first marker stays out of the message, as a
    if numbered:                       # heading's hashes (the catalogue checks read "1. " as a lost `1\.`)
        return block[numbered.end():], None, numbered.group(0)
    return block, None, ""


def exercise_messages(nb: dict) -> list[tuple[str, str | None]]:
    """The messages of a notebook's markdown cells, in order: ``(msgid, msgctxt)``."""
    found = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            for block, _ in _blocks(cell_source(cell)):
                message = _message(block)
                if message and message[:2] not in found:
                    found.append(message[:2])
    return found


def _catalogue_text(catalogue) -> str:
    import io

    from babel.messages.pofile import write_po

    out = io.BytesIO()
    write_po(out, catalogue, width=0, ignore_obsolete=True)  # as `tools/i18n.py update` (sphinx-intl -w 0 --no-obsolete)
    return out.getvalue().decode("utf-8")


def updated_catalogue(nb: dict, po: Path) -> str:
    """The catalogue ``po`` updated to the messages of ``nb`` (babel's merge, as sphinx-intl's):
    new messages empty, changed ones fuzzy with their old translation, gone ones dropped."""
    import datetime

    from babel.messages.catalog import Catalog

    epoch = datetime.datetime.fromtimestamp(int(i18n.EPOCH), datetime.timezone.utc)
    template = Catalog(creation_date=epoch, revision_date=epoch, fuzzy=False)
    for msgid, context in exercise_messages(nb):
        template.add(msgid, context=context)
    if po.exists():
        catalogue = i18n.load(po)
        catalogue.update(template)
    else:
        template.locale = i18n.LANGUAGE
        catalogue = template
    return _catalogue_text(catalogue)


def translate_exercise_notebook(nb: dict, catalogue) -> tuple[dict, int]:
    """The Chinese notebook (a new dict) and the number of blocks left in English."""
    import copy

    nb = copy.deepcopy(nb)
    english = 0
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        out = []
        for block, sep in _blocks(cell_source(cell)):
            message = _message(block)
            if message:
                msgid, context, prefix = message
                found = catalogue.get(msgid, context=context)
                zh = found.string if found is not None and found.string and not found.fuzzy else None
                english += zh is None
                if context:  # an exercise heading: English as the registry has it, then the Chinese title
                    number, points = TITLE.match(block).group(1), re.search(r"\((\d+) points?\)\s*$", block).group(1)
                    block += f"\n\n**练习 {number}：{zh or msgid}（{points} 分）**"
                elif zh:
                    block = prefix + zh
            out.append(block + sep)
        cell["source"] = "".join(out)
    return nb, english


def sync_chinese_exercises(check: bool = False, report: bool = True) -> list[Path]:
    """Update each exercise notebook's catalogue and write ``exercises/zh_CN/<nb>``; return what changed."""
    from babel.messages.pofile import read_po
    import io

    stale = []
    names = set()
    for sol_path in sorted((ROOT / "solutions").glob("*.ipynb")):
        names.add(sol_path.name)
        rel = f"solutions/{sol_path.name}"
        english = make_exercise_notebook(json.loads(sol_path.read_text(encoding="utf-8")), source_name=rel)
        po = EXERCISE_CATALOGUES / f"{sol_path.stem}.po"
        po_text = updated_catalogue(english, po)
        if not po.exists() or po.read_text(encoding="utf-8") != po_text:
            stale.append(po)
            if not check:
                po.parent.mkdir(parents=True, exist_ok=True)
                po.write_text(po_text, encoding="utf-8")
        zh, left = translate_exercise_notebook(english, read_po(io.BytesIO(po_text.encode("utf-8"))))
        check_statements(zh, f"exercises/{i18n.LANGUAGE}/{sol_path.name}")  # the headings read as the English ones
        text = notebook_text(zh)
        target = ZH_EXERCISES / sol_path.name
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            stale.append(target)
            if not check:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
        if left and report:
            print(f"{target.relative_to(ROOT)}: {left} paragraphs left in English (untranslated or fuzzy in "
                  f"{po.relative_to(ROOT)})", file=sys.stderr)
    for orphan in sorted(ZH_EXERCISES.glob("*.ipynb")) + sorted(EXERCISE_CATALOGUES.glob("*.po")):
        if orphan.stem + ".ipynb" not in names:
            stale.append(orphan)
            if not check:
                orphan.unlink()
    return stale


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
    stale += sync_chinese_exercises(check=check, report=not check)
    for path in stale:
        print(f"{'stale' if check else 'updated'}: {path.relative_to(ROOT)}")
    if check and stale:
        print("run: python tools/notebooks.py sync", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
