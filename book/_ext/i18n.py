"""The two editions of the site: English (the source) and Chinese (gettext catalogues).

The English pages are the only source. ``python tools/i18n.py update`` extracts
their messages (Sphinx's ``gettext`` builder) into one catalogue per page,
``locales/zh_CN/LC_MESSAGES/book/<page>.po``, and ``python tools/i18n.py build``
builds both editions: English at the root of the site, Chinese under ``zh_CN/``.
Sphinx's own i18n translates the prose, headings, captions and admonitions of
each page from its catalogue; this extension adds what Sphinx leaves out:

* a link at the top of every page to the same page in the other edition;
* glued numbers in translated text: Sphinx parses each translation as a small
  document of its own, where myst-nb's ``{glue}`` roles find no notebook; they
  are pointed at the notebook of the page being translated;
* glued phrases: a notebook may glue words ("ahead in every seed"), not only
  numbers; the gettext build adds each glued string that holds words to the
  page's catalogue, and the Chinese build shows its translation;
* the captions of the table of contents' parts (the sidebar of every page is
  drawn from the root page's toctree nodes, whose captions Sphinx extracts into
  the root page's catalogue but never translates);
* the alt text of notebook figures (myst-nb turns an output into an image after
  Sphinx has translated the page, so Sphinx never sees it): the gettext build
  adds each figure's alt text (cell metadata ``mystnb.image.alt``) to the page's
  catalogue, and the Chinese build replaces it with its translation;
* the ``#`` comments of the code a reader sees: the gettext build adds the
  comments of every code cell whose source the page shows (folded ones too) to
  the page's catalogue, the text after ``# `` (a run of full-line comments is one
  message, see :func:`code_comments`); the Chinese build swaps each comment of a
  cell's code block (myst-nb's cell input ``literal_block``) for its translation,
  the code and the ``# `` untouched (a run rewrapped, :func:`swap_comments`);
* the text drawn in figures: the labels found in a figure cell's source (string
  constants given to ``set_title``, ``set_xlabel``, ``legend``, ``label=``,
  ``companion.diagrams.box``, ..., see :func:`figure_labels`) and those listed in
  the cell's metadata ``i18n.labels`` (text drawn by package code) join the
  catalogue; the Chinese build adds under the figure's caption one line
  「图中文字：English → 中文；...」;
* glued tables (``companion.notebook.glue_table``) need nothing here: the glue
  directive parses the table in the page, so Sphinx extracts and translates its
  cells like any table of the page.
"""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from pathlib import Path

from docutils import nodes
from sphinx.util.i18n import docname_to_domain

EDITIONS = {"en": ("English", ""), "zh_CN": ("中文", "zh_CN/")}  # label, folder in the published site


def _language(config) -> str:
    return config.language if config.language in EDITIONS else "en"


def switch_html(pagename: str, language: str) -> str:
    """The link from ``pagename`` in ``language`` to the same page in the other edition."""
    up = "../" * pagename.count("/")  # from the page to the root of its edition
    if language == "en":
        href, label, lang = f"{up}zh_CN/{pagename}.html", "中文", "zh-CN"
    else:
        href, label, lang = f"{up}../{pagename}.html", "English", "en"
    return (f'<p class="edition-switch"><a href="{href}" hreflang="{lang}" lang="{lang}" '
            f'data-edition="{lang}">{label}</a></p>\n')


def add_switch(app, pagename, templatename, context, doctree):
    if doctree is None or "body" not in context:  # search, genindex: generated pages
        return
    context["body"] = switch_html(pagename, _language(app.config)) + context["body"]


_WORD = re.compile(r"[A-Za-z]{3,}")


def glued_phrase(plain: str) -> str | None:
    """The string a glue output holds (its ``text/plain`` is the repr), if it holds words; else None."""
    if not plain[:1] in "'\"":
        return None
    try:
        value = ast.literal_eval(plain)
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, str) and _WORD.search(value) else None


# --- code comments ---------------------------------------------------------------

_MAGIC = re.compile(r"^\s*[%!]")  # an IPython magic or shell line: not Python
_PRAGMA = re.compile(r"^(noqa|type:|pragma|fmt:|isort:|pylint:)")
_COMMENT_PREFIX = re.compile(r"#+ ?")


def _tokens(source: str) -> list[tokenize.TokenInfo]:
    """The Python tokens of a cell (magic lines blanked, line numbers kept); as far as they go
    when the cell does not tokenize to the end."""
    text = "\n".join("" if _MAGIC.match(line) else line for line in source.split("\n"))
    found = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            found.append(token)
    except (tokenize.TokenError, SyntaxError):
        pass
    return found


def code_comments(source: str) -> list[tuple[int, int, int, str, str]]:
    """The comments of a cell worth translating: ``(first, last, column, prefix, message)`` each.

    Found with :mod:`tokenize` (a ``#`` inside a string is not a comment). Lines are
    0-based; ``prefix`` is the ``#`` (or ``##``) and the one space after it. A comment
    after code is one message, the text after ``# ``. A run of full-line comments
    (nothing but indentation before them, on consecutive lines, in the same column)
    is one message: their texts joined by spaces, so a sentence wrapped over
    several lines is translated as one sentence. A message without a word of three
    letters (``# ---``, ``# (B, T)``) or starting with a tool's pragma (``# noqa``)
    is left out.
    """
    lines = source.split("\n")
    comments = []  # (line, column, prefix, text, full-line)
    for token in _tokens(source):
        if token.type != tokenize.COMMENT:
            continue
        line, column = token.start[0] - 1, token.start[1]
        prefix = _COMMENT_PREFIX.match(token.string).group(0)
        comments.append((line, column, prefix, token.string[len(prefix):].strip(),
                         not lines[line][:column].strip()))
    groups = []
    for line, column, prefix, text, full in comments:
        last = groups[-1] if groups else None
        if (full and last and last[5] and last[1] == line - 1 and last[2] == column and last[3] == prefix):
            last[1], last[4] = line, f"{last[4]} {text}".strip()
        else:
            groups.append([line, line, column, prefix, text, full])
    return [(first, last, column, prefix, message) for first, last, column, prefix, message, _ in groups
            if _WORD.search(message) and not _PRAGMA.match(message)]


def _width(text: str) -> int:
    """Columns ``text`` takes in a monospaced font (a CJK character or full-width sign: two)."""
    return sum(2 if ord(c) >= 0x1100 and (0x2e80 <= ord(c) <= 0xffef or 0x1100 <= ord(c) <= 0x115f) else 1
               for c in text)


_UNIT = re.compile(r"`[^`]*`|\$[^$]*\$|[A-Za-z0-9_.()\[\]{}<>=+\-*/^'\"@,;:!?%&|~\\]+|\s+|.")
_NO_LINE_START = "，。；：、？！）》」』"


def wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` columns, broken between CJK characters or at spaces,
    never inside a Latin word, a code span or math (a line may run over to keep one whole)."""
    lines, current = [], ""
    for unit in _UNIT.findall(text):
        if current and _width(current + unit.rstrip()) > width and not unit.isspace() and unit[0] not in _NO_LINE_START:
            lines.append(current.rstrip())
            current = ""
        if not (unit.isspace() and not current):
            current += unit
    if current.strip():
        lines.append(current.rstrip())
    return lines


def swap_comments(source: str, translate) -> str:
    """``source`` with each comment's message replaced by ``translate(message)``.

    The code before a comment is kept character for character. A run of full-line
    comments becomes the translation wrapped to the run's widest line (at least 40
    columns), each line with the run's indentation and ``# `` (the run may get
    shorter or longer). A translation with a newline is not used: it is the
    checker's business (``tools/i18n.py check``).
    """
    lines = source.split("\n")
    for first, last, column, prefix, message in reversed(code_comments(source)):
        translated = translate(message)
        if not translated or translated == message or "\n" in translated:
            continue
        translated = translated.strip()
        if first == last and lines[first][:column].strip():  # after code: one line
            lines[first] = lines[first][:column] + prefix + translated
            continue
        indent = lines[first][:column]
        width = max(40, max(_width(line) for line in lines[first:last + 1]) - column - len(prefix))
        lines[first:last + 1] = [indent + prefix + part for part in wrap(translated, width)]
    return "\n".join(lines)


# --- which cells a reader sees ---------------------------------------------------

def _tags(cell: dict) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def shows_code(cell: dict) -> bool:
    """Whether the page shows the cell's source (a folded ``hide-input`` cell can be unfolded)."""
    return (cell.get("cell_type") == "code" and not _tags(cell) & {"remove-input", "remove_input", "remove-cell"}
            and not cell.get("metadata", {}).get("mystnb", {}).get("remove_code_source"))


def shows_figure(cell: dict) -> bool:
    """Whether the page shows an image output of the cell."""
    if cell.get("cell_type") != "code" or _tags(cell) & {"remove-output", "remove_output", "remove-cell"}:
        return False
    return any(key.startswith("image/") for output in cell.get("outputs", []) for key in output.get("data", {}))


# --- figure labels -------------------------------------------------------------

# Calls whose string arguments are drawn: matplotlib's and companion.diagrams'.
LABEL_CALLS = {"set_title", "set_xlabel", "set_ylabel", "suptitle", "text", "annotate", "title", "xlabel",
               "ylabel", "figtext", "legend", "set_xticklabels", "set_yticklabels", "set_label",
               "box", "arrow", "stack"}
# Keyword arguments whose strings are drawn, in any call (plot(..., label=...), viz.plot_heads(title=...)).
LABEL_KEYWORDS = {"label", "labels", "title", "suptitle", "xlabel", "ylabel", "text"}
PLACEHOLDER = "…"  # an f-string's {expression} in a label message
# Strings a drawing call takes that are not drawn: placements, styles, colours, marker codes.
STYLE_WORDS = {"top", "bottom", "left", "right", "center", "centre", "upper", "lower", "middle", "best",
               "bold", "italic", "normal", "monospace", "gray", "grey", "black", "white", "none", "auto",
               "equal", "log", "linear", "symlog", "off", "nearest", "manual", "tight", "baseline"}
_STYLE = re.compile(r"(?:(?:upper|lower|center) )?(?:left|right|center)|[.,ov^<>1-48spP*hH+xXDd|_]+|#[0-9a-fA-F]{3,8}"
                    r"|tab:\w+|arc3.*|[A-Z][a-z]+s(?:_r)?|[a-z]+_r")
_IDENTIFIER = re.compile(r"[\w.\-/]*[_./][\w.\-/]*")  # eval_loss, blocks.….self_attn, ch09.json: keys, not text


def label_text(node: ast.AST) -> str | None:
    """The text of a string constant or f-string (each ``{...}`` as ``…``), whitespace collapsed."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
    elif isinstance(node, ast.JoinedStr):
        text = "".join(part.value if isinstance(part, ast.Constant) else PLACEHOLDER for part in node.values)
    else:
        return None
    return " ".join(text.split())


def is_label(text: str) -> bool:
    """A label worth a gloss: a word of three letters outside its math (``$...$``), not a
    style word (``center``, ``tab:blue``, ``Greens``), a marker code or a key (``eval_loss``)."""
    if text.lower() in STYLE_WORDS or _STYLE.fullmatch(text) or _IDENTIFIER.fullmatch(text.replace(PLACEHOLDER, "")):
        return False
    return bool(_WORD.search(re.sub(r"\$[^$]*\$", " ", text)))


def _strings(node: ast.AST):
    """The string constants and f-strings of an argument: itself, or inside a list, tuple, dict or ``if`` expression."""
    text = label_text(node)
    if text is not None:
        yield text
    elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        for item in node.elts:
            yield from _strings(item)
    elif isinstance(node, ast.Dict):
        for item in [*node.keys, *node.values]:
            if item is not None:
                yield from _strings(item)
    elif isinstance(node, ast.IfExp):
        yield from _strings(node.body)
        yield from _strings(node.orelse)
    elif isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("zip", "enumerate", "list", "tuple"):
        for item in node.args:  # enumerate("QKV") iterates letters: only a list's strings are labels
            if not isinstance(item, (ast.Constant, ast.JoinedStr)):
                yield from _strings(item)


def _parse(source: str) -> ast.AST | None:
    text = "\n".join("" if _MAGIC.match(line) else line for line in source.split("\n"))
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def _call_name(call: ast.Call) -> str:
    return getattr(call.func, "attr", None) or getattr(call.func, "id", "") or ""


def _labels_in(tree: ast.AST, helpers: dict[str, ast.FunctionDef], seen: set[str]) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name in LABEL_CALLS or name in helpers:
                for arg in node.args:
                    found += list(_strings(arg))
            for keyword in node.keywords:
                if keyword.arg in LABEL_KEYWORDS:
                    found += list(_strings(keyword.value))
            if name in helpers and name not in seen:  # a drawing function of the notebook
                seen.add(name)
                found += _labels_in(helpers[name], helpers, seen)
        elif isinstance(node, (ast.For, ast.comprehension)):  # for ax, title in zip(axes, ["a", "b"])
            if not isinstance(node.iter, (ast.Constant, ast.JoinedStr)):  # for c in "QKV": letters
                found += list(_strings(node.iter))
        elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple, ast.Dict)):
            found += list(_strings(node.value))  # panels = {"encoder (bidirectional)": ..., ...}
    return found


def notebook_helpers(cells: list[dict]) -> dict[str, ast.FunctionDef]:
    """The functions the notebook defines (a figure cell may draw through one)."""
    helpers = {}
    for cell in cells:
        if cell.get("cell_type") == "code":
            tree = _parse("".join(cell.get("source", "")))
            for node in getattr(tree, "body", []):
                if isinstance(node, ast.FunctionDef):
                    helpers[node.name] = node
    return helpers


def figure_labels(cell: dict, helpers: dict[str, ast.FunctionDef] | None = None) -> list[str]:
    """The text a figure cell draws, as catalogue messages, in order, without repeats.

    Found with :mod:`ast` in the cell's source: the strings given to a drawing call
    (:data:`LABEL_CALLS`, or a function the notebook defines) or to a keyword of
    :data:`LABEL_KEYWORDS`, and the strings of the list a ``for`` loop draws from
    (``zip(axes, ["padding", "causal"])``); an f-string's expressions become ``…``.
    Then the cell's metadata ``i18n.labels`` (text drawn by package code, such as
    ``companion.viz``). A label with no word outside its math is left out.
    """
    tree = _parse("".join(cell.get("source", "")))
    found = _labels_in(tree, helpers or {}, set()) if tree is not None else []
    found += list(cell.get("metadata", {}).get("i18n", {}).get("labels", []))
    return [text for text in dict.fromkeys(found) if is_label(text)]


def page_messages(path: Path) -> dict[str, list[str]]:
    """What a notebook page shows beyond Sphinx's own messages, by kind:
    ``comments`` (one per comment message), ``comment_lines`` (a comment's message once
    per line of the code it takes), ``labels`` (of each figure), ``other`` (alt texts
    and glued phrases)."""
    kinds = {"comments": [], "comment_lines": [], "labels": [], "other": []}
    if path.suffix != ".ipynb" or not path.exists():
        return kinds
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    helpers = notebook_helpers(cells)
    for cell in cells:
        if shows_code(cell):
            for first, last, _, _, message in code_comments("".join(cell["source"])):
                kinds["comments"].append(message)
                kinds["comment_lines"] += [message] * (last - first + 1)
        if shows_figure(cell):
            kinds["labels"] += figure_labels(cell, helpers)
    kinds["other"] = _alt_and_glued(cells)
    return kinds


def notebook_messages(path: Path) -> list[str]:
    """What a notebook's page shows that Sphinx does not extract: the alt texts of its
    figures (``mystnb.image.alt`` in cell metadata), the phrases it glues, the comments
    of its visible code and the labels of its figures."""
    kinds = page_messages(path)
    return list(dict.fromkeys(kinds["other"] + kinds["comments"] + kinds["labels"]))


def _alt_and_glued(cells: list[dict]) -> list[str]:
    texts = []
    for cell in cells:
        alt = cell.get("metadata", {}).get("mystnb", {}).get("image", {}).get("alt")
        if alt:
            texts.append(alt)
        for output in cell.get("outputs", []):
            if "scrapbook" in output.get("metadata", {}):
                plain = output.get("data", {}).get("application/papermill.record/text/plain", "")
                phrase = glued_phrase("".join(plain) if isinstance(plain, list) else plain)
                if phrase:
                    texts.append(phrase)
    return texts


def collect_alt(app, doctree, docname):
    """gettext build: the figures' alt texts and the glued phrases join the page's catalogue."""
    if app.builder.name != "gettext":
        return
    from sphinx.builders.gettext import MsgOrigin

    path = Path(app.env.doc2path(docname))
    catalog = app.builder.catalogs[docname_to_domain(docname, app.config.gettext_compact)]
    for text in notebook_messages(path):
        catalog.add(text, MsgOrigin(str(path), 0))


def translate_alt(app, doctree, docname):
    """Chinese build: each figure's alt text and each glued phrase from the page's catalogue."""
    if _language(app.config) == "en" or app.builder.format != "html":
        return
    from sphinx.locale import init as init_locale

    dirs = [str(Path(app.srcdir, d)) for d in app.config.locale_dirs]
    catalog, found = init_locale(dirs, app.config.language, docname_to_domain(docname, app.config.gettext_compact))
    if not found:
        return
    for image in doctree.findall(nodes.image):
        alt = image.get("alt")
        if alt:
            translated = catalog.gettext(alt)
            if translated:
                image["alt"] = translated
    translate_cells(app, doctree, docname, catalog.gettext)
    for pasted in doctree.findall(nodes.inline):
        if "pasted-text" in pasted.get("classes", []) and _WORD.search(pasted.astext()):
            translated = catalog.gettext(pasted.astext())
            if translated != pasted.astext():
                pasted.children = [nodes.Text(translated)]


def figure_text(labels: list[str], translate) -> nodes.paragraph | None:
    """The line 「图中文字：English → 中文；...」 of a figure's translated labels (None: none translated).

    Math (``$...$``) in a label or its translation is rendered as math.
    """
    pairs = [(label, translate(label)) for label in labels]
    pairs = [(en, zh) for en, zh in pairs if zh and zh != en]
    if not pairs:
        return None
    paragraph = nodes.paragraph(classes=["figure-text"])
    paragraph += nodes.Text("图中文字：")
    for i, (en, zh) in enumerate(pairs):
        if i:
            paragraph += nodes.Text("；")
        paragraph.extend(_with_math(en))
        paragraph += nodes.Text(" → ")
        paragraph.extend(_with_math(zh))
    return paragraph


def _with_math(text: str) -> list[nodes.Node]:
    parts = []
    for i, piece in enumerate(re.split(r"\$([^$]+)\$", text)):
        if i % 2:
            parts.append(nodes.math(f"${piece}$", piece))
        elif piece:
            parts.append(nodes.Text(piece))
    return parts


def translate_cells(app, doctree, docname, translate) -> None:
    """Chinese build: the comments of each code cell's block, and a 图中文字 line under each figure's caption."""
    path = Path(app.env.doc2path(docname))
    if path.suffix != ".ipynb":
        return
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    helpers = None
    for container in list(doctree.findall(nodes.container)):
        if container.get("nb_element") != "cell_code":
            continue
        for block in container.findall(nodes.literal_block):
            source_box = block.parent
            if not (isinstance(source_box, nodes.container) and "cell_input" in source_box.get("classes", [])):
                continue
            code = block.astext()
            swapped = swap_comments(code, translate)
            if swapped != code:
                # rawsource equal to the text: Sphinx's HTML writer still highlights the block with Pygments.
                block.rawsource = swapped
                block.children = []
                block += nodes.Text(swapped)
        index = container.get("cell_index")
        figures = list(container.findall(nodes.figure))
        if not figures or index is None or index >= len(cells):
            continue
        if helpers is None:
            helpers = notebook_helpers(cells)
        line = figure_text(figure_labels(cells[index], helpers), translate)
        if line is None:
            continue
        for figure in figures:
            legend = nodes.legend("", line.deepcopy(), classes=["figure-text"])
            captions = [i for i, child in enumerate(figure.children) if isinstance(child, nodes.caption)]
            figure.insert(captions[0] + 1 if captions else len(figure.children), legend)


def translate_captions(app, doctree):
    """Chinese build: the captions of the toctree's parts ("Part I: ...") from the page's catalogue.

    Run on ``doctree-read``, before the doctree is stored: the sidebar of every page
    is built from the stored toctree nodes of the root page.
    """
    if _language(app.config) == "en":
        return
    from sphinx import addnodes
    from sphinx.locale import init as init_locale

    toctrees = [n for n in doctree.findall(addnodes.toctree) if n.get("caption")]
    if not toctrees:
        return
    dirs = [str(Path(app.srcdir, d)) for d in app.config.locale_dirs]
    catalog, found = init_locale(dirs, app.config.language, docname_to_domain(app.env.docname, app.config.gettext_compact))
    if not found:
        return
    for toctree in toctrees:
        translated = catalog.gettext(toctree["caption"])
        if translated:
            toctree["caption"] = translated


def _glue_in_translations(role_class, text_role: bool):
    """Make a glue role in a translated string read the page's notebook.

    The string is parsed as a document without a notebook, so the role is given
    the notebook's name: ``key`` becomes ``page.ipynb::key``, myst-nb's
    reference to another notebook's glued values (resolved after parsing, from the
    values the page's own parse saved). ``{glue:text}`` keeps its format (``s``
    when none was given: with ``::`` its last ``:`` always starts a format).
    """
    run = role_class.run

    def run_on_page(self):
        env = getattr(self.document.settings, "env", None)
        if "nb_renderer" not in self.document and "::" not in self.text and env is not None:
            page = Path(env.doc2path(env.docname))
            if page.suffix == ".ipynb":
                key = self.text if not text_role or ":" in self.text else f"{self.text}:s"
                self.text = f"{page.name}::{key}"
        return run(self)

    role_class.run = run_on_page


def setup(app):
    from myst_nb.ext.glue import roles

    _glue_in_translations(roles.PasteRoleAny, text_role=False)
    _glue_in_translations(roles.PasteTextRole, text_role=True)
    _glue_in_translations(roles.PasteMarkdownRole, text_role=False)
    app.connect("html-page-context", add_switch)
    app.connect("doctree-read", translate_captions)
    app.connect("doctree-resolved", collect_alt)
    app.connect("doctree-resolved", translate_alt)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
