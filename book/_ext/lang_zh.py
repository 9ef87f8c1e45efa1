"""Mark Chinese text ``lang="zh"`` in the HTML, wherever it appears (glossary, seed quotes).

Screen readers and browsers pick voice, font and line breaking from ``lang``;
the English site is English, so a run of CJK characters is wrapped in
``<span lang="zh">``. Code, math and raw HTML are left alone. Authors write
plain Chinese; nothing needs marking by hand.
"""

from __future__ import annotations

import re

from docutils import nodes

# CJK ideographs, CJK punctuation and full-width forms; a run may contain spaces
# between Chinese characters.
CJK = "\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef"
RUN = re.compile(f"[{CJK}](?:[{CJK}\\s]*[{CJK}])?")


class zh(nodes.inline):
    """Chinese text; rendered as ``<span lang="zh">`` by HTML, as plain inline text elsewhere."""


def visit_zh_html(self, node):
    self.body.append(self.starttag(node, "span", "", lang="zh", CLASS="zh"))


def depart_zh_html(self, node):
    self.body.append("</span>")


def _skip(node):
    while node is not None:
        if isinstance(node, (nodes.FixedTextElement, nodes.literal, nodes.math, nodes.raw, zh)):
            return True
        node = node.parent
    return False


def mark(app, doctree):
    if (app.config.language or "en").startswith("zh"):  # the Chinese edition: the page itself is lang="zh-CN"
        return
    for text in list(doctree.findall(nodes.Text)):
        parent = text.parent
        if parent is None or _skip(parent):
            continue
        value = str(text)
        if not RUN.search(value):
            continue
        parts, last = [], 0
        for m in RUN.finditer(value):
            if m.start() > last:
                parts.append(nodes.Text(value[last:m.start()]))
            parts.append(zh("", m.group(0)))
            last = m.end()
        if last < len(value):
            parts.append(nodes.Text(value[last:]))
        parent.replace(text, parts)


def setup(app):
    app.add_node(zh, html=(visit_zh_html, depart_zh_html))
    # Before the corrections extension copies admonitions (priority 500).
    app.connect("doctree-read", mark, priority=400)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
