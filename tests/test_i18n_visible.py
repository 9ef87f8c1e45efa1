"""Chinese a reader sees outside the prose (issue 34): code comments, figure text, glued tables.

The unit tests take the pieces of ``book/_ext/i18n.py`` and ``tools/i18n.py`` one by
one; ``test_a_page_in_both_editions`` builds a one-page Sphinx project with
myst-nb and the book's extension (gettext, then HTML in English and in Chinese,
about 10 s) and reads what each edition shows.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import i18n  # noqa: E402

spec = importlib.util.spec_from_file_location("book_i18n_ext", ROOT / "book" / "_ext" / "i18n.py")
ext = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ext)


# --- code comments ---

CODE = '''x = "# not a comment"  # the answer: `x` holds a string
%matplotlib inline
# (B, T)
y = f"{x} #"  # noqa: E501
    # an indented comment that runs
    # over two lines
z = 1  # after code
# a comment in another column
'''


def test_comments_are_found_with_tokenize_not_in_strings():
    found = ext.code_comments(CODE)
    assert [(first, last, message) for first, last, _, _, message in found] == [
        (0, 0, "the answer: `x` holds a string"),
        (4, 5, "an indented comment that runs over two lines"),  # a run of full-line comments: one message
        (6, 6, "after code"), (7, 7, "a comment in another column")]
    assert all("not a comment" not in message for *_, message in found)  # the # inside the string


def test_the_swap_keeps_the_code_and_the_hash():
    zh = {"the answer: `x` holds a string": "答案：`x` 存的是字符串", "after code": "代码之后",
          "an indented comment that runs over two lines": "一条缩进的、" + "很长" * 20 + "的注释"}
    swapped = ext.swap_comments(CODE, zh.get)
    lines = swapped.split("\n")
    assert lines[0] == 'x = "# not a comment"  # 答案：`x` 存的是字符串'
    assert lines[1:4] == CODE.split("\n")[1:4]  # magic, symbol-only comment and pragma untouched
    # The run rewrapped at 40 columns (a CJK character takes two), each line indented and with "# ".
    run = lines[4:lines.index("z = 1  # 代码之后")]
    assert len(run) == 3 and all(line.startswith("    # ") for line in run)
    assert "".join(line[6:] for line in run) == zh["an indented comment that runs over two lines"]
    assert all(ext._width(line[6:]) <= 40 for line in run)
    assert lines[-2:] == ["# a comment in another column", ""]  # no translation: kept
    # A translation over two lines would put Chinese outside the comment: not used.
    assert ext.swap_comments("a = 1  # one\n", {"one": "一\n二"}.get) == "a = 1  # one\n"


def test_wrapping_keeps_words_code_and_math_whole():
    assert ext.wrap("把 `scores.softmax(dim=-1)` 的每一行加起来等于一", 16) == [
        "把", "`scores.softmax(dim=-1)`", "的每一行加起来等", "于一"]
    assert ext.wrap("每行之和为一，不是零", 12) == ["每行之和为一，", "不是零"]  # no line starts with ，


def test_visible_cells_and_figures():
    code = {"cell_type": "code", "source": "# c", "metadata": {}, "outputs": []}
    assert ext.shows_code(code)
    assert ext.shows_code({**code, "metadata": {"tags": ["hide-input"]}})  # folded, can be unfolded
    assert not ext.shows_code({**code, "metadata": {"tags": ["remove-input"]}})
    assert not ext.shows_code({**code, "metadata": {"tags": ["remove-cell"]}})
    figure = {**code, "outputs": [{"output_type": "display_data", "data": {"image/png": "", "text/plain": ""}}]}
    assert ext.shows_figure(figure) and ext.shows_figure({**figure, "metadata": {"tags": ["remove-input"]}})
    assert not ext.shows_figure(code)
    assert not ext.shows_figure({**figure, "metadata": {"tags": ["remove-output"]}})


# --- figure labels ---

FIGURE = '''fig, axes = plt.subplots(1, 2)
for ax, title in zip(axes, ["padding (length 3)", "causal"]):
    ax.imshow(m, cmap="Greens")
    ax.set_title(title)
axes[0].plot(x, y, "o-", label=r"prediction $d_k$")
axes[0].plot(x, y, "k:", label=r"$q \\cdot k$")
axes[0].set_xlabel(r"head size $d_k$", fontsize=9)
axes[0].legend(["held out"], loc="upper left")
fig.suptitle(f"Masks of sequence {i}: green = may attend")
dg.box(ax, 0, 0, 1, 1, "weights\\n@ V", color=dg.ATTENTION)
matrix(0.3, 5.9, cells, f"scores ({t}, {s})")
print("a printed line")
for i, name in enumerate("QKV"):
    pass
'''


def test_a_figures_labels_are_extracted():
    helpers = ext.notebook_helpers([{"cell_type": "code", "source": "def matrix(x, top, cells, label):\n    ax.text(x, top, label)\n"}])
    cell = {"cell_type": "code", "source": FIGURE, "metadata": {"i18n": {"labels": ["key (attended to)", "$x$"]}}}
    labels = ext.figure_labels(cell, helpers)
    assert set(labels) == {"padding (length 3)", "causal", "prediction $d_k$", "head size $d_k$", "held out",
                           "Masks of sequence …: green = may attend", "weights @ V", "scores (…, …)",
                           "key (attended to)"}
    # Not labels: math only, styles and markers, what print shows, letters iterated.
    for text in ("$q \\cdot k$", "Greens", "o-", "upper left", "a printed line", "QKV", "$x$"):
        assert text not in labels


def test_the_figure_text_line_pairs_each_translated_label_and_keeps_math():
    zh = {"head size $d_k$": "头维度 $d_k$", "causal": "因果"}
    line = ext.figure_text(["head size $d_k$", "causal", "held out"], lambda s: zh.get(s, s))
    assert line.astext() == "图中文字：head size d_k → 头维度 d_k；causal → 因果"
    from docutils import nodes

    assert len(list(line.findall(nodes.math))) == 2  # $d_k$ on each side stays math
    assert ext.figure_text(["held out"], lambda s: s) is None  # nothing translated: no line


# --- glued tables ---

def test_glue_table_writes_markdown_and_shows_it_without_myst_nb(monkeypatch):
    from companion import notebook

    assert notebook.markdown_table(["model", "counted"], [["BERT-base", "110M"], ["a|b", 3]], align="lr") == (
        "| model | counted |\n| :-- | --: |\n| BERT-base | 110M |\n| a\\|b | 3 |")
    with pytest.raises(ValueError, match="2 cells"):
        notebook.markdown_table(["a", "b"], [["x"]])
    shown = []
    import IPython.display

    monkeypatch.setattr(IPython.display, "display", lambda obj, **kw: shown.append(obj))
    monkeypatch.setitem(sys.modules, "myst_nb", None)  # Colab: no myst-nb, the cell shows the table
    assert notebook.glue_table("t", ["model"], [["GPT-2"]]) is None
    assert [type(obj).__name__ for obj in shown] == ["Markdown"] and "| GPT-2 |" in shown[0].data


def _glue_output(name: str, header, rows) -> dict:
    """The output ``glue_table`` stores in a notebook (myst-nb's display call captured)."""
    from companion import notebook
    import myst_nb.ext.glue as glue_module

    captured = []
    original = glue_module.ipy_display
    glue_module.ipy_display = lambda data, raw, metadata: captured.append((data, metadata))
    try:
        notebook.glue_table(name, header, rows)
    finally:
        glue_module.ipy_display = original
    data, metadata = captured[0]
    assert "scrapbook" in metadata
    return {"output_type": "display_data", "data": data, "metadata": metadata}


# --- \text{} in math ---

def test_a_translated_text_in_math_is_allowed_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setattr(i18n, "CATALOGUES", tmp_path)
    en = "The cost is $C = 6 N \\text{tokens}$ FLOPs."
    assert i18n.check_page(_po(tmp_path, [(en, "开销是 $C = 6 N \\text{词元数}$ 次浮点运算。")]), []) == []
    problems = i18n.check_page(_po(tmp_path, [(en, "开销是 $C = 6 M \\text{词元数}$ 次浮点运算。")]), [])
    assert problems and "$C = 6 N" in problems[0]  # the rest of the math must stay identical


def _po(tmp_path, entries, name="chXX"):
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import write_po

    catalog = Catalog(locale="zh_CN")
    for en, zh in entries:
        catalog.add(en, zh)
    folder = tmp_path / "book"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.po"
    with path.open("wb") as f:
        write_po(f, catalog, width=0)
    return path


def test_the_checker_flags_a_comment_over_two_lines_and_a_lost_placeholder(tmp_path, monkeypatch):
    monkeypatch.setattr(i18n, "CATALOGUES", tmp_path)
    kinds = {"comments": ["step 1: `s`, one score per key"], "labels": ["scores (…, …)"], "other": []}
    monkeypatch.setattr(i18n, "page_kinds", lambda page: kinds)
    good = [("step 1: `s`, one score per key", "第 1 步：`s`，每个键一个分数"), ("scores (…, …)", "分数 (…, …)")]
    assert i18n.check_page(_po(tmp_path, good), []) == []
    bad = [("step 1: `s`, one score per key", "第 1 步：`s`，\n每个键一个分数"), ("scores (…, …)", "分数")]
    text = "\n".join(i18n.check_page(_po(tmp_path, bad), []))
    assert "one line" in text and "'…'" in text
    code = [("step 1: `s`, one score per key", "第 1 步：s，每个键一个分数")]  # code span lost
    assert "missing ['`s`']" in "\n".join(i18n.check_page(_po(tmp_path, code), []))


# --- one page built in both editions ---

PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082")).decode()


def _notebook(glued: dict) -> dict:
    def code(source, outputs=(), metadata=None):
        return {"cell_type": "code", "source": source, "metadata": metadata or {}, "outputs": list(outputs),
                "execution_count": 1}

    figure_output = {"output_type": "display_data", "data": {"image/png": PNG, "text/plain": "<Figure>"}, "metadata": {}}
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                         "language_info": {"name": "python"}},
            "cells": [
                {"cell_type": "markdown", "metadata": {}, "source": "# A test page\n\nThe counts:\n\n"
                 "```{glue:md} counts\n:format: myst\n```\n"},
                code('x = "# not a comment"  # the answer is a string\nprint(x)'),
                code("# a hidden comment\ny = 2", metadata={"tags": ["remove-input"]}),
                code('ax.set_title("Loss against step")\nax.set_xlabel(r"head size $d_k$")', [figure_output],
                     {"mystnb": {"figure": {"caption": "A figure.", "name": "fig-test"}}}),
                code('glue_table("counts", ["model", "parameters"], [["small model", "10"]])', [glued],
                     {"tags": ["remove-cell"]}),
            ]}


ZH = {"the answer is a string": "答案是一个字符串", "Loss against step": "损失随步数的变化",
      "head size $d_k$": "头维度 $d_k$", "model": "模型", "parameters": "参数量", "small model": "小模型",
      "A test page": "测试页", "The counts:": "计数：", "A figure.": "一幅图。"}


def _sphinx(src: Path, builder: str, out: Path, language: str = "en") -> None:
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-b", builder, "-q", "-D", f"language={language}",
                           str(src), str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_page_in_both_editions(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'book' / '_ext')!r})\n"
        "extensions = ['myst_nb', 'i18n']\n"
        "nb_execution_mode = 'off'\n"
        "myst_enable_extensions = ['dollarmath']\n"
        "locale_dirs = ['locales']\n"
        "gettext_compact = False\n"
        "exclude_patterns = ['_build', 'locales']\n", encoding="utf-8")
    (src / "page.ipynb").write_text(json.dumps(_notebook(_glue_output("counts", ["model", "parameters"],
                                                                          [["small model", "10"]]))),
                                    encoding="utf-8")
    (src / "index.md").write_text("# Index\n\n```{toctree}\npage\n```\n", encoding="utf-8")

    # gettext: the visible comment, the figure's labels and the table's words are messages; the hidden
    # comment and the # in a string are not.
    _sphinx(src, "gettext", tmp_path / "pot")
    ids = {m.id for m in i18n.load(tmp_path / "pot" / "page.pot") if m.id}
    assert {"the answer is a string", "Loss against step", "head size $d_k$", "model", "parameters",
            "small model"} <= ids
    assert not any("hidden comment" in i or "not a comment" in i for i in ids)

    from babel.messages.catalog import Catalog
    from babel.messages.pofile import write_po

    catalog = Catalog(locale="zh_CN")
    for message in ids:
        catalog.add(message, ZH.get(message, ""))
    po = src / "locales" / "zh_CN" / "LC_MESSAGES" / "page.po"
    po.parent.mkdir(parents=True)
    with po.open("wb") as f:
        write_po(f, catalog)

    _sphinx(src, "html", tmp_path / "en")
    _sphinx(src, "html", tmp_path / "zh", language="zh_CN")
    en = (tmp_path / "en" / "page.html").read_text(encoding="utf-8")
    zh = (tmp_path / "zh" / "page.html").read_text(encoding="utf-8")

    # The comment swapped, the string and the code kept, Pygments still at work (c1: a comment token).
    assert '<span class="c1"># 答案是一个字符串</span>' in zh
    assert '<span class="s2">"# not a comment"</span>' in zh and "the answer is a string" not in zh
    assert '<span class="c1"># the answer is a string</span>' in en
    # The figure: one line of its text under the caption, math kept; none in English.
    assert "图中文字：" in zh and "Loss against step → 损失随步数的变化" in zh
    caption, line = zh.index("一幅图。"), zh.index("图中文字")
    assert caption < line
    assert "图中文字" not in en
    # The glued table: header and word cells translated.
    assert "<th" in zh and "参数量" in zh and "小模型" in zh
    assert "parameters" in en and "参数量" not in en
