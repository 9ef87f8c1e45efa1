"""The Chinese edition: catalogues from the English source, their state, and both websites.

    python tools/i18n.py update          # after an English edit: new strings empty, changed ones fuzzy
    python tools/i18n.py report          # translated / fuzzy / untranslated entries per page
    python tools/i18n.py check [PAGE...] # what tests/test_i18n.py checks, page by page (terms: locales/zh_CN/terms.toml)
    python tools/i18n.py long [--show=N] [PAGE...]  # sentences over 80 characters per page (to watch, not a gate)
    python tools/i18n.py visible [PAGE...]  # per page: code comments and figure labels a reader sees, and how many are translated
    python tools/i18n.py figures [PAGE...]  # each figure's labels; figures with none found, or drawn by companion.viz
    python tools/i18n.py build [OUT]     # both editions: OUT/html (English), OUT/html/zh_CN (Chinese)

The English pages are the one source (PEP 545's model): ``update`` runs Sphinx's
``gettext`` builder over the book (through Jupyter Book, so notebooks are read
as the website reads them) and ``sphinx-intl update`` merges the result into
``locales/zh_CN/LC_MESSAGES/book/<page>.po``: an entry whose English changed
keeps its old translation marked fuzzy until someone translates it again, and
the test suite (``tests/test_i18n.py``) fails until every entry is translated.
``build`` runs the README's build command twice, the second time with
``language: zh_CN`` added to a copy of ``_config.yml`` (nothing else differs).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LANGUAGE = "zh_CN"
LOCALES = ROOT / "locales"
CATALOGUES = LOCALES / LANGUAGE / "LC_MESSAGES"
# A fixed date in the catalogues' headers, so that an update changes a file only when a string changed.
EPOCH = "1767225600"  # 2026-01-01


def _tool(name: str) -> str:
    """An executable of the running environment (the venv's jupyter-book, sphinx-intl)."""
    path = Path(sys.executable).with_name(name)
    return str(path) if path.exists() else name


def jupyter_book(args: list[str], env: dict | None = None) -> str:
    proc = subprocess.run([_tool("jupyter-book"), "build", str(ROOT), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"jupyter-book build {' '.join(args)} failed:\n{log[-4000:]}")
    return log


def extract(out: Path) -> Path:
    """The English messages, one ``.pot`` per page, under ``out/_build/gettext/book``."""
    jupyter_book(["--path-output", str(out), "--builder", "custom", "--custom-builder", "gettext", "--all"],
                 env={"SOURCE_DATE_EPOCH": EPOCH})
    return out / "_build" / "gettext"


def update() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pot = extract(Path(tmp))
        subprocess.run([_tool("sphinx-intl"), "update", "-p", str(pot), "-d", str(LOCALES), "-l", LANGUAGE,
                        "-w", "0", "--no-obsolete", "-j", "1"], check=True, capture_output=True, text=True)
    for po in sorted(CATALOGUES.rglob("*.po")):
        fill_letterless(po)
    report()


LETTER = re.compile(r"[^\W\d_]")  # a letter of any script (Latin, CJK, Greek, ...)


def fill_letterless(po: Path) -> int:
    """Give every message without a letter (a table cell such as ``1.325`` or ``12,288``, a
    range, a sign) itself as its translation: there is nothing to translate, and a glued table
    whose numbers a script re-records must not leave the page untranslated. Returns how many."""
    from babel.messages.pofile import write_po

    catalog = load(po)
    filled = 0
    for message in catalog:
        if message.id and isinstance(message.id, str) and not LETTER.search(message.id) \
                and (message.fuzzy or message.string != message.id):
            message.string = message.id
            message.flags.discard("fuzzy")
            filled += 1
    if filled:
        with po.open("wb") as f:
            write_po(f, catalog, width=0, include_previous=False)
    return filled


def catalogue_state(po: Path) -> tuple[int, int, int]:
    """``(translated, fuzzy, untranslated)`` entries of one catalogue (the header not counted)."""
    done = fuzzy = missing = 0
    for message in load(po):
        if not message.id:
            continue
        if message.fuzzy:
            fuzzy += 1
        elif message.string:
            done += 1
        else:
            missing += 1
    return done, fuzzy, missing


def states() -> dict[str, tuple[int, int, int]]:
    return {str(po.relative_to(CATALOGUES).with_suffix("")): catalogue_state(po)
            for po in sorted(CATALOGUES.rglob("*.po"))}


def report_lines() -> list[str]:
    rows = states()
    lines = [f"{'page':32s} {'translated':>10s} {'fuzzy':>6s} {'untranslated':>12s}"]
    total = [0, 0, 0]
    for page, counts in rows.items():
        lines.append(f"{page:32s} {counts[0]:10d} {counts[1]:6d} {counts[2]:12d}")
        total = [a + b for a, b in zip(total, counts)]
    lines.append(f"{'all pages':32s} {total[0]:10d} {total[1]:6d} {total[2]:12d}")
    return lines


def report() -> None:
    print("\n".join(report_lines()))


def load(po: Path):
    from babel.messages.pofile import read_po

    with po.open("rb") as f:
        return read_po(f)


# What a translation must carry over unchanged: roles with their targets ({glue:text}`key`,
# {cite:t}`key`, {numref}`name`, ...), inline code and math.
ROLE = re.compile(r"(?<!`)\{[a-z:]+\}`[^`]*`")  # not inside a code span: `{stack}` is code
CODE = re.compile(r"(?<![}`])``?[^`]+``?")
MATH = re.compile(r"\$\$.+?\$\$|\$[^$]+\$", re.S)
# Words inside math may be translated: $\text{tokens} \times D$ -> $\text{词元数} \times D$ (the rest of the math identical).
MATH_TEXT = re.compile(r"\\(text|textrm|textit|textbf|mbox)\{[^{}]*\}")


def _math_token(math: str) -> str:
    return MATH_TEXT.sub(lambda m: f"\\{m.group(1)}{{…}}", math.strip())


def tokens(text: str) -> list[str]:
    """The roles, math and inline code of ``text``, sorted (their order may change in translation)."""
    # A role with its own text ({ref}`the correction in Chapter 2 <corr-ch02-x>`) keeps only its
    # target: the text is prose, and is translated.
    found = [re.sub(r"`[^`]*<([^<>`]+)>`$", r"`<\1>`", role) for role in ROLE.findall(text)]
    rest = ROLE.sub(" ", text)
    found += [_math_token(m) for m in MATH.findall(rest)]
    found += CODE.findall(MATH.sub(" ", rest))
    return sorted(found)


def prose(text: str) -> str:
    """``text`` without roles, math and inline code (where a glossary term may be read)."""
    return CODE.sub(" ", MATH.sub(" ", ROLE.sub(" ", text)))


_PAREN = re.compile(r"\s*[(（][^)）]*[)）]")


def glossary_terms() -> list[tuple[str, str]]:
    """``(English, Chinese)`` pairs of the glossary, lists split, parentheses dropped.

    Only terms of two or more English words whose Chinese name has no Latin
    letters are checked: a one-word English term (head, mask, token) has other
    senses in running text, and a Chinese name that keeps the English word
    (softmax 归一化) is written in more than one way.
    """
    pairs = []
    for line in (ROOT / "book" / "glossary.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not line.startswith("| ") or cells[0] in ("English", "---"):
            continue
        en, zh = _PAREN.sub("", cells[0]), _PAREN.sub("", cells[1])
        en_parts = [t.strip() for t in re.split(r",| / ", en) if t.strip()]
        zh_parts = [t.strip() for t in re.split(r"、| / ", zh) if t.strip()]
        if len(en_parts) != len(zh_parts):
            continue
        for e, z in zip(en_parts, zh_parts):
            if len(e.split()) >= 2 and not re.search(r"[A-Za-z]", z):
                pairs.append((e, z))
    return pairs


# --- the term sheet (locales/zh_CN/terms.toml): one Chinese rendering per term ---

TERM_SHEET = LOCALES / LANGUAGE / "terms.toml"
_LATEX_ARG = re.compile(r"\\[A-Za-z]+\*?\{[^{}]*\}")  # \operatorname{LayerNorm}, \mathrm{FFN}, \text{tokens}
_QUOTED_EN = re.compile(r'"([^"]+)"')
_CJK = "\u4e00-\u9fff"


def term_sheet(path: Path | None = None) -> list[dict]:
    """The terms of ``terms.toml``: ``en``, ``zh``, compiled ``forbid``, ``when`` (or None) and ``allow``."""
    import tomllib

    data = tomllib.loads((path or TERM_SHEET).read_text(encoding="utf-8"))
    sheet = []
    for term in data["term"]:
        sheet.append({"en": term["en"], "zh": term["zh"],
                      "forbid": [re.compile(p) for p in term["forbid"]],
                      "when": re.compile(term["when"], re.I) if term.get("when") else None,
                      "allow": [re.compile(p) for p in term.get("allow", [])]})
    return sheet


def term_text(en: str, zh: str) -> str:
    """The part of a translation the term sheet applies to.

    Left out (the allow-list every term shares): roles, math and inline code, the
    arguments of LaTeX commands, and any quotation that the English quotes word for
    word ("BERT的FFN使用GELU激活函数" in the English: a seed blog's words, or a
    diagram label such as "Add & LayerNorm", reproduced as they are).
    """
    text = _LATEX_ARG.sub(" ", prose(zh))
    for quoted in _QUOTED_EN.findall(en):
        if len(quoted.strip()) > 1:
            text = text.replace(quoted, " ")
    return text


def term_problems(page: str, en: str, zh: str, sheet: list[dict], context: str | None = None) -> list[str]:
    """Forbidden variants of the term sheet in one translation, one line each.

    ``context`` (default: ``en``) is the English that a term's ``when`` is matched against: on the
    glossary page, a Chinese cell's row (its English cell and itself).
    """
    head = en[:50].replace("\n", " ")
    if zh == en and not re.search(f"[{_CJK}]", zh):  # kept in English (the glossary's English column)
        return []
    text = term_text(en, zh)
    problems = []
    for term in sheet:
        if term["when"] and not term["when"].search(context or en):
            continue
        rest = text
        for allowed in term["allow"]:
            rest = allowed.sub(" ", rest)
        # The introduction of the term: 层归一化（LayerNorm）, 前馈网络（FFN）.
        name = re.split(r"[（；]", term["zh"])[0]
        rest = re.sub(rf"{re.escape(name)}\**（[^（）]*）", " ", rest)
        for variant in term["forbid"]:
            for found in variant.finditer(rest):
                problems.append(f"{page}: \"{head}...\" writes '{found.group(0)}' for '{term['en']}': "
                                f"write '{term['zh']}' (locales/zh_CN/terms.toml)")
    return problems


# The one pattern for introducing a term: 中文（English）. What breaks it, as far as a
# regular expression can tell: the Chinese inside the parenthesis before a comma and
# the English (（仅解码器, *decoder-only*）, （*预填充*，prefill）), and half-width
# parentheses after Chinese text (因果掩码(causal mask)).
_INTRO_INSIDE = re.compile(rf"（\**[{_CJK}][{_CJK}\-]{{0,11}}\**\s*[,，]\s*(?:\*[A-Za-z]|[a-z])[A-Za-z\- ]*\*?"
                           rf"(?:\s*[,，]\s*[A-Za-z]+)?）")
_INTRO_HALF = re.compile(rf"[{_CJK}]\**\s?\(\*?[A-Za-z][A-Za-z\- ]+\*?\)")
_ASCII_COMMA = re.compile(rf"（[^（）]*[{_CJK}]\**,\s*\*?[A-Za-z][^（）]*）")


def introduction_problems(page: str, en: str, zh: str) -> list[str]:
    head = en[:50].replace("\n", " ")
    text = term_text(en, zh)
    problems = []
    for pattern, fix in ((_INTRO_INSIDE, "write 中文（English）: the Chinese before the parenthesis"),
                         (_ASCII_COMMA, "an ASCII comma after Chinese: write 中文（English） or use ，"),
                         (_INTRO_HALF, "half-width parentheses: write 中文（English）")):
        for found in pattern.finditer(text):
            problems.append(f"{page}: \"{head}...\" introduces a term as '{found.group(0)}': {fix}")
    return problems


@functools.cache
def extension():
    """``book/_ext/i18n.py`` (what the builds extract and swap), loaded by path: it shares this module's name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("book_i18n", ROOT / "book" / "_ext" / "i18n.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def page_kinds(page: str) -> dict[str, list[str]]:
    """The messages of a page that are code comments and figure labels (``book/ch02_attention``)."""
    return extension().page_messages(ROOT / f"{page}.ipynb")


def visible_problems(page: str, en: str, zh: str, kinds: dict[str, list[str]]) -> list[str]:
    """What breaks a code comment or a figure label in the Chinese build."""
    head = en[:50].replace("\n", " ")
    problems = []
    if en in kinds.get("comments", ()) and "\n" in zh:
        problems.append(f"{page}: the code comment \"{head}...\" is translated over several lines: write a "
                        f"comment's translation on one line (a line without `#` would be code; the build wraps "
                        f"a run of comment lines itself)")
    if en in kinds.get("labels", ()) and en.count("…") != zh.count("…"):
        problems.append(f"{page}: the figure label \"{head}...\" has {en.count('…')} '…' (a number drawn in the "
                        f"figure), its translation {zh.count('…')}: keep each")
    return problems


def check_page(po: Path, terms: list[tuple[str, str]] | None = None, counts: bool = True,
               sheet: list[dict] | None = None) -> list[str]:
    """What is wrong with one page's catalogue, one line per problem (empty: nothing).

    ``counts=False`` leaves out the line on untranslated and fuzzy entries (checked on its own).
    """
    terms = glossary_terms() if terms is None else terms
    sheet = term_sheet() if sheet is None else sheet
    page = str(po.relative_to(CATALOGUES).with_suffix(""))
    kinds = page_kinds(page)
    problems = []
    done, fuzzy, missing = catalogue_state(po)
    if counts and (fuzzy or missing):
        problems.append(f"{page}: {missing} untranslated and {fuzzy} fuzzy of {done + fuzzy + missing} entries "
                        f"(translate them; `python tools/i18n.py update` after an English edit)")
    previous = ""
    for message in load(po):
        if not message.id or not message.string or message.fuzzy:
            continue
        en, zh = message.id, message.string
        context, previous = f"{previous}\n{en}", en  # a glossary row: English cell, then Chinese cell
        head = en[:50].replace("\n", " ")
        if tokens(en) != tokens(zh):
            lost = sorted(set(tokens(en)) - set(tokens(zh)))
            added = sorted(set(tokens(zh)) - set(tokens(en)))
            problems.append(f"{page}: roles, math or code differ in \"{head}...\": missing {lost}, added {added}")
        if re.match(r"\d+\. ", en) and not re.match(r"\d+\\\. ", zh):
            problems.append(f"{page}: \"{head}\": write the number as `{en.split('.')[0]}\\.` (otherwise "
                            f"the translated title parses as a numbered list)")
        if page != "book/glossary":
            text = prose(en).lower()
            for term_en, term_zh in terms:
                if re.search(rf"(?<![\w-]){re.escape(term_en.lower())}(?:s|es)?(?![\w-])", text) and term_zh not in zh:
                    problems.append(f"{page}: \"{head}...\" uses the glossary term '{term_en}' "
                                    f"but its translation lacks '{term_zh}'")
        problems += term_problems(page, en, zh, sheet, context if page == "book/glossary" else None)
        if page == "book/glossary" and zh == en and len(prose(en).split()) >= 10:
            # The English column stays English; an explanation in it is prose, and is translated.
            problems.append(f"{page}: \"{head}...\" is an explanation left in English: translate it "
                            f"(keep the term itself in English)")
        problems += introduction_problems(page, en, zh)
        problems += visible_problems(page, en, zh, kinds)
    return problems


def check(pages: list[str] | None = None, counts: bool = True) -> list[str]:
    terms, sheet = glossary_terms(), term_sheet()
    problems = []
    for po in sorted(CATALOGUES.rglob("*.po")):
        page = str(po.relative_to(CATALOGUES).with_suffix(""))
        if not pages or page in pages or Path(page).name in pages:
            problems += check_page(po, terms, counts=counts, sheet=sheet)
    return problems


# --- long sentences: a number to watch, not a gate ---

LONG = 80  # characters: a Chinese sentence longer than this usually reads as translated English
_SENTENCE_END = re.compile(r"(?<=[。！？])|\n+")


def visible(text: str) -> str:
    """Roughly what a reader sees of a translation: a role as its text or a short number, markup dropped."""
    text = re.sub(r"\{[a-z:]+\}`([^`<]*)<[^`]*>`", r"\1", text)  # {ref}`text <target>`
    text = re.sub(r"\{(?:glue|glue:text|numref|cite:t|cite:p|cite)\}`[^`]*`", "0", text)
    text = re.sub(r"\{[a-z:]+\}`([^`]*)`", r"\1", text)
    return re.sub(r"[*`$]", "", text)


def sentences(zh: str) -> list[str]:
    """The sentences of one translation (a display formula is not prose: no sentences)."""
    if zh.lstrip().startswith(("\\", "$$")) or "\\begin" in zh:
        return []
    return [s.strip() for s in _SENTENCE_END.split(visible(zh)) if s.strip()]


def long_sentences(po: Path, limit: int = LONG) -> tuple[int, list[str]]:
    """``(number of sentences, the sentences over limit characters)`` of one catalogue."""
    count, long = 0, []
    for message in load(po):
        if not message.id or not message.string:
            continue
        for sentence in sentences(message.string):
            count += 1
            if len(sentence) > limit:
                long.append(sentence)
    return count, long


def long_report(pages: list[str] | None = None, show: int = 0) -> list[str]:
    """Per page: sentences, those over LONG characters, the longest; ``show``: list that many of the longest."""
    lines = [f"{'page':32s} {'sentences':>9s} {'>' + str(LONG) + ' chars':>10s} {'longest':>8s}"]
    for po in sorted(CATALOGUES.rglob("*.po")):
        page = str(po.relative_to(CATALOGUES).with_suffix(""))
        if pages and page not in pages and Path(page).name not in pages:
            continue
        count, long = long_sentences(po)
        lines.append(f"{page:32s} {count:9d} {len(long):10d} {max(map(len, long), default=0):8d}")
        for sentence in sorted(long, key=len, reverse=True)[:show]:
            lines.append(f"    {len(sentence):4d}  {sentence}")
    return lines


# --- what a reader sees outside the prose: code comments and figure labels ---

def visible_report(pages: list[str] | None = None) -> list[str]:
    """Per page: the visible code comment lines and figure labels, and how many are translated."""
    lines = [f"{'page':32s} {'comment lines':>13s} {'translated':>10s} {'figure labels':>13s} {'translated':>10s}"]
    total = [0, 0, 0, 0]
    for po in sorted(CATALOGUES.rglob("*.po")):
        page = str(po.relative_to(CATALOGUES).with_suffix(""))
        if pages and page not in pages and Path(page).name not in pages:
            continue
        kinds = page_kinds(page)
        if not kinds["comments"] and not kinds["labels"]:
            continue
        done = {m.id for m in load(po) if m.id and m.string and not m.fuzzy and m.string != m.id}
        row = [len(kinds["comment_lines"]), sum(c in done for c in kinds["comment_lines"]),
               len(kinds["labels"]), sum(label in done for label in kinds["labels"])]
        total = [a + b for a, b in zip(total, row)]
        lines.append(f"{page:32s} {row[0]:13d} {row[1]:10d} {row[2]:13d} {row[3]:10d}")
    lines.append(f"{'all pages':32s} {total[0]:13d} {total[1]:10d} {total[2]:13d} {total[3]:10d}")
    return lines


def figures_report(pages: list[str] | None = None) -> list[str]:
    """Each figure of each page with its labels; ``NO LABEL`` or ``companion.viz`` marks a figure to look at.

    A figure whose text is drawn by package code (``companion.viz``) or that no
    label was found for gets its labels in the cell's metadata, ``{"i18n": {"labels": [...]}}``.
    """
    import json

    ext = extension()
    lines = []
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        if pages and path.stem not in pages and f"book/{path.stem}" not in pages:
            continue
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        helpers = ext.notebook_helpers(cells)
        for index, cell in enumerate(cells):
            if not ext.shows_figure(cell):
                continue
            labels = ext.figure_labels(cell, helpers)
            source = "".join(cell["source"])
            name = cell.get("metadata", {}).get("mystnb", {}).get("figure", {}).get("name", "")
            marks = []
            if not labels:
                marks.append("NO LABEL")
            if re.search(r"\bviz\.\w+\(|companion\.viz", source) and "i18n" not in cell.get("metadata", {}):
                marks.append("companion.viz: list its drawn text in metadata i18n.labels")
            lines.append(f"{path.stem} cell {index} {name} {len(labels)} labels"
                         + (f"  <-- {'; '.join(marks)}" if marks else ""))
            lines += [f"    {label}" for label in labels]
    return lines


# Interface words that no catalogue holds: myst-nb's prompts on a cell whose code is
# folded (the book folds only code, with the tag hide-input: tests/test_i18n.py checks).
ZH_INTERFACE = {"nb_code_prompt_show": "显示代码", "nb_code_prompt_hide": "隐藏代码"}


def zh_config(folder: Path) -> Path:
    """``_config.yml`` with ``language: zh_CN`` and the Chinese interface words, written into ``folder``."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    sphinx = config.setdefault("sphinx", {})
    sphinx.setdefault("config", {})["language"] = LANGUAGE
    sphinx["config"].update(ZH_INTERFACE)
    # Jupyter Book resolves local extensions against the configuration file's folder.
    sphinx["local_extensions"] = {name: str(ROOT / path) for name, path in sphinx.get("local_extensions", {}).items()}
    path = folder / "_config.zh_CN.yml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def build(out: Path, strict: bool = True, timings: dict | None = None) -> dict[str, str]:
    """Both editions into ``out/html`` and ``out/html/zh_CN``; returns each build's log.

    ``timings``, if given, receives each edition's build time in seconds.
    """
    import time

    flags = ["-W", "-n", "--keep-going"] if strict else []
    out = out.resolve()
    timings = {} if timings is None else timings
    start = time.perf_counter()
    logs = {"en": jupyter_book(["--path-output", str(out / "en"), *flags])}
    timings["en"] = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        logs[LANGUAGE] = jupyter_book(["--path-output", str(out / LANGUAGE), "--config", str(zh_config(Path(tmp))),
                                       *flags])
        timings[LANGUAGE] = time.perf_counter() - start
    site = out / "html"
    if site.exists():
        shutil.rmtree(site)
    shutil.copytree(out / "en" / "_build" / "html", site)
    shutil.copytree(out / LANGUAGE / "_build" / "html", site / LANGUAGE)
    return logs


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("update", "report", "check", "long", "visible", "figures", "build"):
        print(__doc__)
        return 2
    if argv[0] == "update":
        update()
    elif argv[0] == "report":
        report()
    elif argv[0] == "visible":
        print("\n".join(visible_report(argv[1:])))
    elif argv[0] == "figures":
        print("\n".join(figures_report(argv[1:])))
    elif argv[0] == "long":
        show = 0
        pages = argv[1:]
        if pages and pages[0].startswith("--show="):
            show, pages = int(pages[0].split("=", 1)[1]), pages[1:]
        print("\n".join(long_report(pages, show)))
    elif argv[0] == "check":
        problems = check(argv[1:])
        print("\n".join(problems) or "no problems")
        return 1 if problems else 0
    else:
        out = Path(argv[1]) if len(argv) > 1 else ROOT / "_build"
        timings = {}
        build(out, timings=timings)
        print(", ".join(f"{k}: {v:.0f} s" for k, v in timings.items()))
        print(f"English: {out / 'html' / 'index.html'}\nChinese: {out / 'html' / LANGUAGE / 'index.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
