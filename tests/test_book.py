"""The website builds with no warnings, and a chapter page has what a reader needs."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sitebuild import toc_docnames

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    from sitebuild import build_site

    logs = build_site(out)
    for edition, log in logs.items():
        assert "WARNING" not in log, (edition, [l for l in log.splitlines() if "WARNING" in l][:10])
    html = out / "html"
    assert (html / "index.html").exists() and (html / "zh_CN" / "index.html").exists()
    yield html
    shutil.rmtree(out, ignore_errors=True)


def chapter_pages(html):
    return sorted(p for p in (html / "book").glob("ch*.html"))


def test_every_chapter_page_is_built(site):
    notebooks = sorted(p.stem for p in (ROOT / "book").glob("ch*.ipynb"))
    assert [p.stem for p in chapter_pages(site)] == notebooks


def test_chapter_pages_have_math_figures_outputs_and_launch_buttons(site):
    for page in chapter_pages(site):
        text = page.read_text(encoding="utf-8")
        assert 'class="math' in text, f"{page.name}: no rendered math"
        assert re.search(r'<img[^>]+src="[^"]+\.png"', text), f"{page.name}: no figure"
        assert "cell_output" in text, f"{page.name}: no outputs"
        assert f"colab.research.google.com/github/" in text and f"{page.stem}.ipynb" in text, f"{page.name}: no Colab button"
        assert "glue:" not in text and "{glue" not in text, f"{page.name}: a glue role was not resolved"
        assert "glue(" not in text, f"{page.name}: the page shows glue(...) plumbing"


def test_glued_numbers_appear_in_the_chapter_2_prose(site):
    text = re.sub(r"<[^>]+>", "", (site / "book" / "ch02_attention.html").read_text(encoding="utf-8"))
    # The prose says the variance of q.k at d_k = 64 is about 64; the number comes from glue.
    match = re.search(r"have variance ([0-9.]+)", text)
    assert match and 60 < float(match.group(1)) < 68


def test_landing_page_lists_sixteen_chapters_in_toc_order(site):
    # Chapter 16 (today's decoders) reads after Chapter 13 in Part III, so the numbers are not in
    # order on the page: each of 1..16 appears once, in the order of the table of contents.
    text = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    numbered = [int(n) for n in re.findall(r"^(\d+)\. ", text, flags=re.M)]
    assert sorted(numbered) == list(range(1, 17))
    in_toc = [int(name[7:9]) for name in toc_docnames() if name.startswith("book/ch")]
    assert numbered == in_toc, (numbered, in_toc)


def test_landing_page_says_which_chapters_exist_and_which_are_coming():
    """A numbered line of the landing page links its chapter if the notebook exists, else says *coming*."""
    text = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    written = {int(p.stem[2:4]): p.stem for p in (ROOT / "book").glob("ch*.ipynb")}
    for number, line in re.findall(r"^(\d+)\. (.*)$", text, flags=re.M):
        number = int(number)
        if number in written:
            assert f"{{doc}}`{written[number]}`" in line, f"chapter {number} is written but not linked: {line}"
        else:
            assert line.endswith("*coming*") and "{doc}" not in line, f"chapter {number} does not exist yet: {line}"


# --- Corrections appendix: generated from the chapters' Correction admonitions ---

CORRECTION_FIELDS = ("**Seed:**", "**What holds:**", "**Evidence:**", "**Source:**")
FENCE = re.compile(r"^(:{3,}|`{3,})\{admonition\}([^\n]*)\n(.*?)^\1\s*$", flags=re.M | re.S)


def admonitions():
    """Every admonition in the chapters' markdown: (notebook, title, classes, name, body)."""
    import json

    found = []
    for nb in sorted((ROOT / "book").glob("ch*.ipynb")):
        for cell in json.loads(nb.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] != "markdown":
                continue
            for match in FENCE.finditer("".join(cell["source"])):
                body = match.group(3)
                classes = re.search(r"^:class:(.*)$", body, flags=re.M)
                name = re.search(r"^:name:\s*(\S+)", body, flags=re.M)
                found.append((nb.stem, match.group(2).strip(), classes.group(1).split() if classes else [],
                              name.group(1) if name else None, body))
    return found


def correction_admonitions():
    """The admonitions the corrections appendix collects: class `correction`. (notebook, name, body)"""
    return [(nb, name, body) for nb, _, classes, name, body in admonitions() if "correction" in classes]


def test_no_two_corrections_share_a_title():
    """One correction per claim (issue 9): a chapter that meets a claim corrected elsewhere refers to it."""
    seen = {}
    for notebook, title, classes, name, _ in admonitions():
        if "correction" not in classes:
            continue
        claim = re.sub(r"\W+", " ", title.lower()).strip()
        assert claim not in seen, f"{notebook} ({name}) repeats the correction {title!r} of {seen[claim]}: use {{ref}}"
        seen[claim] = f"{notebook} ({name})"


def test_every_correction_has_the_class_a_name_and_the_four_fields():
    for notebook, title, classes, name, body in admonitions():
        if not (title.lower().startswith("correction") or "correction" in classes):
            continue
        where = f"{notebook}, admonition {title!r}"
        assert "correction" in classes, f"{where}: needs `:class: warning correction` (one correction per admonition)"
        assert title.startswith("Correction: "), f"{where}: the title says what holds, `Correction: ...`"
        assert name and re.fullmatch(rf"corr-ch{notebook[2:4]}-[a-z0-9-]+", name), (
            f"{where}: needs `:name: corr-ch{notebook[2:4]}-...`, got {name!r}")
        missing = [f for f in CORRECTION_FIELDS if f not in body]
        assert not missing, f"{where}: missing {missing}"


def test_corrections_appendix_lists_every_correction(site):
    page = (site / "book" / "corrections.html").read_text(encoding="utf-8")
    corrections = correction_admonitions()
    entries = re.findall(r'<div class="correction-entry[^"]*"[^>]*id="list-([^"]+)"', page)
    assert sorted(entries) == sorted(name for _, name, _ in corrections)
    for notebook, name, _ in corrections:
        # The entry links back to the admonition in its chapter, which carries that anchor.
        assert f'href="{notebook}.html#{name}"' in page, name
        chapter = (site / "book" / f"{notebook}.html").read_text(encoding="utf-8")
        assert f'id="{name}"' in chapter, f"{notebook}: no anchor {name}"
        block = page.split(f'id="list-{name}"', 1)[1].split('<div class="correction-entry', 1)[0]
        for field in ("Seed:", "What holds:", "Evidence:", "Source:"):
            assert f"<strong>{field}</strong>" in block, f"{name}: {field} missing in the appendix"


def test_chinese_text_is_marked_lang_zh(site):
    for page in [site / "book" / "glossary.html", site / "book" / "corrections.html", *chapter_pages(site)]:
        text = page.read_text(encoding="utf-8")
        main = text[text.index("<main"):text.index("</main>")]
        main = re.sub(r"<(pre|code|script)\b.*?</\1>", "", main, flags=re.S)
        main = re.sub(r'<span class="zh" lang="zh">[^<]*</span>', "", main)
        main = re.sub(r'<a [^>]*lang="zh-CN"[^>]*>[^<]*</a>', "", main)  # the link to the Chinese edition
        left = re.findall(r"[\u3400-\u4dbf\u4e00-\u9fff]+", main)
        assert not left, f"{page.name}: Chinese text outside lang=\"zh\": {left[:5]}"
    assert (site / "book" / "glossary.html").read_text(encoding="utf-8").count('lang="zh"') >= 50


def test_no_page_loads_anything_from_a_cdn(site):
    """MathJax, RequireJS and the widget manager are served by the site (book/_static/vendor)."""
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        tags = re.findall(r"<(?:script|link)\b[^>]*>", text)
        remote = [t for t in tags if re.search(r'(src|href)="(https?:)?//', t)]
        assert not remote, f"{page.relative_to(site)}: {remote[:3]}"
    vendor = ROOT / "book" / "_static" / "vendor"
    assert (vendor / "VERSIONS").exists()
    for package in ("mathjax", "requirejs", "html-manager"):
        assert (vendor / package / "LICENSE").exists(), package


def test_the_bibliography_parses_and_every_entry_has_a_title_and_a_year():
    # A merge that drops an entry's closing brace swallows the next entry into it; Sphinx then fails at start-up.
    from pybtex.database import parse_file

    db = parse_file(ROOT / "book" / "references.bib")
    for key, entry in db.entries.items():
        assert "title" in entry.fields and "year" in entry.fields, f"references.bib: {key} lacks a title or a year"
        assert "@" not in entry.fields["title"], f"references.bib: {key} swallowed the next entry"


# --- The Chinese edition (tools/i18n.py build: English at html/, Chinese at html/zh_CN/) ---


def test_every_page_is_built_in_chinese(site):
    cjk = re.compile(r"[\u4e00-\u9fff]")
    for docname in toc_docnames():
        page = site / "zh_CN" / f"{docname}.html"
        assert page.exists(), f"no Chinese page for {docname}"
        text = page.read_text(encoding="utf-8")
        assert '<html lang="zh-CN"' in text, f"{docname}: the Chinese page does not say lang=zh-CN"
        title = re.search(r"<h1[^>]*>(.*?)</h1>", text, flags=re.S)
        english = re.search(r"<h1[^>]*>(.*?)</h1>", (site / f"{docname}.html").read_text(encoding="utf-8"), flags=re.S)
        name_only = re.fullmatch(r"\d+\. [A-Z][A-Za-z0-9]*", re.sub(r"<[^>]+>", "", english.group(1)).strip())
        assert title and (cjk.search(title.group(1)) or name_only), f"{docname}: the title is not translated"
        assert "{glue" not in text and "glue:" not in text, f"{docname}: a glue role in a translation was not resolved"
        # Emphasis that Markdown did not close (**标签：**000) shows its asterisks.
        shown = re.sub(r"<(pre|code|script|style|mjx-container)\b.*?</\1>|<[^>]+>", " ", text, flags=re.S)
        assert "**" not in shown, f"{docname}: literal ** in the page: {shown[shown.index('**') - 40:][:80]!r}"
    for page in chapter_pages(site / "zh_CN"):
        text = page.read_text(encoding="utf-8")
        assert 'class="math' in text and re.search(r'<img[^>]+src="[^"]+\.png"', text), page.name
        body = re.sub(r"<(pre|code|script|style)\b.*?</\1>|<[^>]+>", " ", text, flags=re.S)
        latin = len(re.findall(r"[A-Za-z]+", body))
        chinese = len(cjk.findall(body))
        assert chinese > latin, f"{page.name}: more English words ({latin}) than Chinese characters ({chinese})"


def test_the_chinese_interface_is_chinese(site):
    """The sidebar's part captions and the prompts of folded code are Chinese on every Chinese page."""
    english_captions = re.findall(r'caption-text">([^<]+)<', (site / "book" / "intro.html").read_text(encoding="utf-8"))
    assert "Reference" in english_captions, english_captions
    for docname in toc_docnames():
        text = (site / "zh_CN" / f"{docname}.html").read_text(encoding="utf-8")
        captions = re.findall(r'caption-text">([^<]+)<', text)
        for caption in english_captions:
            assert caption not in captions, f"{docname}: the sidebar shows {caption!r} in English"
        assert "code cell" not in text, f"{docname}: an English prompt on folded code"
    folded = (site / "zh_CN" / "book" / "ch02_attention.html").read_text(encoding="utf-8")
    assert "显示代码" in folded and "参考" in re.findall(r'caption-text">([^<]+)<', folded)


def test_each_page_links_to_the_same_page_in_the_other_edition(site):
    for docname in toc_docnames():
        for edition, other in ((site, site / "zh_CN"), (site / "zh_CN", site)):
            page = edition / f"{docname}.html"
            link = re.search(r'<p class="edition-switch"><a href="([^"]+)"', page.read_text(encoding="utf-8"))
            assert link, f"{page.relative_to(site)}: no link to the other edition"
            target = (page.parent / link.group(1)).resolve()
            assert target == (other / f"{docname}.html").resolve(), (page.relative_to(site), link.group(1))


def test_chinese_search_index_holds_chinese_words(site):
    import json

    index = (site / "zh_CN" / "searchindex.js").read_text(encoding="utf-8")
    terms = json.loads(index[index.index("(") + 1:index.rindex(")")])["terms"]
    for word in ("注意力", "编码器", "解码器", "掩码"):
        assert word in terms, f"{word} is not in the Chinese edition's search index (is jieba installed?)"


def test_chinese_code_comments_and_figure_text(site):
    """Chapter 2 in Chinese: a code block shows a Chinese comment (still highlighted as a comment) and a figure
    shows its 图中文字 line under the caption; the English page shows neither."""
    import html as html_module
    import importlib.util

    spec = importlib.util.spec_from_file_location("tools_i18n", ROOT / "tools" / "i18n.py")
    i18n = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(i18n)
    zh = {m.id: m.string for m in i18n.load(i18n.CATALOGUES / "book" / "ch02_attention.po") if m.id}
    chinese = (site / "zh_CN" / "book" / "ch02_attention.html").read_text(encoding="utf-8")
    english = (site / "book" / "ch02_attention.html").read_text(encoding="utf-8")
    comment = zh["the query we follow"]
    assert f'<span class="c1"># {html_module.escape(comment, quote=False)}</span>' in chinese
    assert '<span class="c1"># the query we follow</span>' in english and comment not in english
    label = zh["Scaling keeps the score variance at 1"]
    line = re.search(r'<p class="figure-text">(.*?)</p>', chinese, flags=re.S)
    assert line and line.group(1).startswith("图中文字：") and label in chinese
    assert chinese.index('id="fig-ch02-score-variance"') < chinese.index(label)
    assert "图中文字" not in english and "figure-text" not in english
