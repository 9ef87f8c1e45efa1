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
  catalogue, and the Chinese build replaces it with its translation.
"""

from __future__ import annotations

import ast
import json
import re
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


def notebook_messages(path: Path) -> list[str]:
    """What a notebook's page shows that Sphinx does not extract: the alt texts of its
    figures (``mystnb.image.alt`` in cell metadata) and the phrases it glues."""
    if path.suffix != ".ipynb":
        return []
    texts = []
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
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
    for pasted in doctree.findall(nodes.inline):
        if "pasted-text" in pasted.get("classes", []) and _WORD.search(pasted.astext()):
            translated = catalog.gettext(pasted.astext())
            if translated != pasted.astext():
                pasted.children = [nodes.Text(translated)]


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
