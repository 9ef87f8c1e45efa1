"""The corrections appendix, collected at build time from the chapters' Correction admonitions.

A chapter corrects a seed post in an admonition with the class ``correction``
(CONTRIBUTING.md, item 5)::

    :::{admonition} Correction: GPT-1 is post-LN
    :class: warning correction
    :name: corr-ch09-gpt1-post-ln

    **Seed:** ...   **What holds:** ...   **Evidence:** ...   **Source:** ...
    :::

The directive ``{corrections-list}`` (on book/corrections.md) is replaced by
every such admonition of the book, in chapter order, each with its fields and a
link back to the admonition in its chapter, beside the cell that demonstrates
it. The chapters are the one source of truth; nothing is typed twice. Works like
``sphinx.ext.todo``'s todolist: admonitions are copied when a document is read
and resolved (citations, cross-references) in the appendix's own context.
"""

from __future__ import annotations

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

CLASS = "correction"


class corrections_list(nodes.General, nodes.Element):
    """Placeholder for the appendix, filled in at ``doctree-resolved``."""


class CorrectionsListDirective(SphinxDirective):
    has_content = False

    def run(self):
        return [corrections_list("")]


def _store(env):
    if not hasattr(env, "corrections_all"):
        env.corrections_all = []
    return env.corrections_all


def collect(app, doctree):
    env = app.env
    store = _store(env)
    for index, node in enumerate(doctree.findall(nodes.admonition)):
        if CLASS not in node["classes"]:
            continue
        titles = [c for c in node.children if isinstance(c, nodes.title)]
        store.append({
            "docname": env.docname,
            "order": index,
            "id": node["ids"][0] if node["ids"] else "",
            "name": node["names"][0] if node["names"] else "",
            "title": titles[0].astext() if titles else "",
            "body": [c.deepcopy() for c in node.children if not isinstance(c, nodes.title)],
        })


def purge(app, env, docname):
    env.corrections_all = [c for c in _store(env) if c["docname"] != docname]


def merge(app, env, docnames, other):
    _store(env).extend(c for c in _store(other) if c["docname"] in docnames)


def _strip_ids(node):
    for n in node.findall(nodes.Element):
        n["ids"] = []
        n["names"] = []
    return node


def fill(app, doctree, fromdocname):
    env = app.env
    lists = list(doctree.findall(corrections_list))
    if not lists:
        return
    all_docs = env.toctree_includes
    # Document order of the table of contents (root, then its parts, depth first).
    flat = []

    def walk(doc):
        for child in all_docs.get(doc, []):
            flat.append(child)
            walk(child)

    walk(env.config.root_doc)
    order = {name: i for i, name in enumerate(flat)}
    entries = sorted(_store(env), key=lambda c: (order.get(c["docname"], len(order)), c["docname"], c["order"]))

    for placeholder in lists:
        content = []
        if not entries:
            content.append(nodes.paragraph(text="No chapter makes a correction yet."))
        current = None
        for entry in entries:
            if entry["docname"] != current:
                current = entry["docname"]
                title = env.titles[current].astext() if current in env.titles else current
                rubric = nodes.rubric("", "")
                ref = nodes.reference("", title, internal=True,
                                      refuri=app.builder.get_relative_uri(fromdocname, current))
                rubric += ref
                content.append(rubric)
            box = nodes.container(classes=["correction-entry"])
            if entry["name"]:
                box["ids"] = ["list-" + entry["name"]]
            head = nodes.paragraph(classes=["correction-entry-title"])
            label = entry["title"]
            if label.lower().startswith("correction:"):
                label = label.split(":", 1)[1].strip()
            head += nodes.strong(text=label)
            head += nodes.Text(" (")
            uri = app.builder.get_relative_uri(fromdocname, entry["docname"])
            if entry["id"]:
                uri += "#" + entry["id"]
            head += nodes.reference("", "in the chapter, beside the cell that shows it", internal=True, refuri=uri)
            head += nodes.Text(")")
            box += head
            for child in entry["body"]:
                box += _strip_ids(child.deepcopy())
            # Resolve {cite}, {numref}, {doc} in the appendix's context.
            env.resolve_references(box, fromdocname, app.builder)
            content.append(box)
        if any(next(iter(box.findall(nodes.math)), None) is not None for box in content):
            # Sphinx loads MathJax only on pages that had math when they were read;
            # this page's math arrives now, copied from the chapters.
            env.get_domain("math").data["has_equations"][fromdocname] = True
        placeholder.replace_self(content)


def setup(app):
    app.add_node(corrections_list)
    app.add_directive("corrections-list", CorrectionsListDirective)
    app.connect("doctree-read", collect)
    app.connect("env-purge-doc", purge)
    app.connect("env-merge-info", merge)
    app.connect("doctree-resolved", fill)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True, "env_version": 1}
