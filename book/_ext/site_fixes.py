"""Small fixes of the generated pages that the browser test (tests/test_browser.py) found.

* sphinx-thebe adds its inline configuration script (``const THEBE_JS_URL = ...``)
  twice (once from the registry, once from the builder, with different
  priorities and a body-only filename of None in one, "" in the other, so
  Sphinx does not see them as equal); every page declared the
  constant twice and the browser logged a SyntaxError.
  Identical scripts are kept once.
* The theme logged "Got invalid theme mode" on every page: the book theme's
  default mode is empty. The figures are drawn on white, so the default is light.
"""

from __future__ import annotations


def dedupe_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for js in scripts:
        # Same file and attributes (an inline script's body is an attribute); the
        # priority may differ between the two registrations.
        key = (getattr(js, "filename", str(js)) or "",
               tuple(sorted((k, str(v)) for k, v in getattr(js, "attributes", {}).items())))
        if key in seen:
            continue
        seen.add(key)
        kept.append(js)
    scripts[:] = kept


def default_mode(app, pagename, templatename, context, doctree):
    # The template variable of pydata-sphinx-theme's layout (the book theme does
    # not accept it as a theme option).
    if not context.get("default_mode"):
        context["default_mode"] = "light"


def setup(app):
    app.connect("html-page-context", default_mode)
    app.connect("html-page-context", dedupe_scripts, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
