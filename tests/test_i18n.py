"""The Chinese edition stays in step with the English source (tools/i18n.py).

* The catalogues hold exactly the messages the English pages have now: an English
  edit without ``python tools/i18n.py update`` fails here, naming the page.
* Every entry of every page is translated and none is fuzzy; the failure names
  each page with its counts. (The counts per page print in the suite's summary.)
* A translation keeps its roles (glued numbers, citations, cross-references),
  math and inline code, escapes a leading chapter number, and uses the glossary's
  Chinese name of each multi-word term its English uses.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import i18n  # noqa: E402


@pytest.fixture(scope="module")
def extracted(tmp_path_factory):
    """The messages of the English pages as they are now: {page: set of msgids}."""
    pot_dir = i18n.extract(tmp_path_factory.mktemp("gettext"))
    pages = {}
    for pot in sorted(pot_dir.rglob("*.pot")):
        pages[str(pot.relative_to(pot_dir).with_suffix(""))] = {m.id for m in i18n.load(pot) if m.id}
    return pages


def test_every_page_has_a_catalogue_with_the_messages_of_its_english_source(extracted):
    have = {str(po.relative_to(i18n.CATALOGUES).with_suffix("")): po for po in (i18n.CATALOGUES / "book").rglob("*.po")}
    assert sorted(have) == sorted(extracted), "pages and catalogues differ: run `python tools/i18n.py update`"
    stale = []
    for page, ids in extracted.items():
        catalogued = {m.id for m in i18n.load(have[page]) if m.id}
        new, gone = len(ids - catalogued), len(catalogued - ids)
        if new or gone:
            stale.append(f"{page}: {new} English messages not in the catalogue, {gone} no longer in the English")
    assert not stale, "run `python tools/i18n.py update`, then translate:\n" + "\n".join(stale)


def test_every_entry_is_translated_and_none_is_fuzzy():
    incomplete = [f"{page}: {missing} untranslated, {fuzzy} fuzzy of {done + fuzzy + missing}"
                  for page, (done, fuzzy, missing) in i18n.states().items() if fuzzy or missing]
    assert not incomplete, "translate these entries (CONTRIBUTING: the Chinese edition):\n" + "\n".join(incomplete)


def test_translations_keep_roles_math_code_and_glossary_terms():
    problems = i18n.check(counts=False)  # the counts: the test above
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])


# --- the checker itself (so that the tests above can fail) ---

def test_tokens_are_the_roles_math_and_code_of_a_string():
    text = "At {glue:text}`n:.2f` tokens, $x_1$ and `nn.Linear` ({cite:t}`vaswani2017attention`); $$a$$"
    assert i18n.tokens(text) == sorted(["{glue:text}`n:.2f`", "{cite:t}`vaswani2017attention`", "$x_1$",
                                        "`nn.Linear`", "$$a$$"])
    # A role with its own text keeps only its target: the text is translated.
    assert i18n.tokens("see {ref}`the correction <corr-ch02-x>`") == ["{ref}`<corr-ch02-x>`"]


def test_glossary_pairs_split_lists_and_skip_one_word_terms():
    pairs = dict(i18n.glossary_terms())
    assert pairs["multi-head attention"] == "多头注意力"
    assert pairs["data parallelism"] == "数据并行"
    assert "head" not in pairs and "softmax" not in pairs  # one English word: other senses in running text


def _po(tmp_path, entries, name="chXX"):
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import write_po

    catalog = Catalog(locale="zh_CN")
    for en, zh, fuzzy in entries:
        catalog.add(en, zh, flags=("fuzzy",) if fuzzy else ())
    folder = tmp_path / "book"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.po"
    with path.open("wb") as f:
        write_po(f, catalog, width=0)
    return path


def test_the_checker_finds_a_lost_role_a_list_title_a_wrong_term_and_missing_entries(tmp_path, monkeypatch):
    monkeypatch.setattr(i18n, "CATALOGUES", tmp_path)
    good = _po(tmp_path, [("1. Why Transformers", "1\\. 为什么是 Transformer", False),
                          ("It has {glue:text}`n` heads and $H$ rows.", "它有 {glue:text}`n` 个头和 $H$ 行。", False)])
    assert i18n.check_page(good, [("multi-head attention", "多头注意力")]) == []
    bad = _po(tmp_path, [("1. Why Transformers", "1. 为什么是 Transformer", False),
                         ("It has {glue:text}`n` heads.", "它有很多头。", False),
                         ("Multi-head attention splits D.", "多个头的注意力把 D 分开。", False),
                         ("A new sentence.", "", False),
                         ("A changed sentence.", "旧的译文。", True)])
    problems = i18n.check_page(bad, [("multi-head attention", "多头注意力")])
    text = "\n".join(problems)
    assert "1 untranslated and 1 fuzzy of 5" in text
    assert "{glue:text}`n`" in text  # the lost role is named
    assert "1\\." in text  # the title that would parse as a list
    assert "多头注意力" in text  # the glossary's name
    assert len(problems) == 4


def test_the_chinese_configuration_differs_from_the_english_only_in_language_and_interface_words(tmp_path):
    import yaml

    english = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    chinese = yaml.safe_load(i18n.zh_config(tmp_path).read_text(encoding="utf-8"))
    assert chinese["sphinx"]["config"].pop("language") == "zh_CN"
    for name, words in i18n.ZH_INTERFACE.items():
        assert chinese["sphinx"]["config"].pop(name) == words
    for name, path in chinese["sphinx"].pop("local_extensions").items():
        assert Path(path) == ROOT / english["sphinx"]["local_extensions"][name]
    english["sphinx"].pop("local_extensions")
    assert chinese == english


def test_the_book_folds_only_code_so_the_chinese_prompts_fit():
    """The Chinese prompts say "show/hide code": true only while no page folds an output or a whole cell."""
    for page in sorted((ROOT / "book").glob("*.ipynb")):
        for cell in json.loads(page.read_text(encoding="utf-8"))["cells"]:
            folded = {t for t in cell.get("metadata", {}).get("tags", []) if t in ("hide-output", "hide-cell")}
            assert not folded, f"{page.name}: a cell tagged {sorted(folded)}; give tools/i18n.py ZH_INTERFACE a prompt for it"


def test_the_edition_switch_points_at_the_same_page():
    import importlib.util

    # Loaded by path: tools/i18n.py has the same module name.
    spec = importlib.util.spec_from_file_location("book_i18n", ROOT / "book" / "_ext" / "i18n.py")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    assert 'href="../zh_CN/book/ch02_attention.html"' in ext.switch_html("book/ch02_attention", "en")
    assert 'href="../../book/ch02_attention.html"' in ext.switch_html("book/ch02_attention", "zh_CN")
    assert 'href="zh_CN/index.html"' in ext.switch_html("index", "en")


# --- the term sheet (locales/zh_CN/terms.toml): each drift of issue 34 fails the check ---

# (English entry, a translation with the drift, what the failure must name)
DRIFTS = {
    "Source: 出处 in a correction box": ("**Source:** {cite}`radford2019gpt2`, section 2.", "**出处**：{cite}`radford2019gpt2`，第 2 节。", "来源"),
    "token: 全局标记": ("Longformer adds a few global tokens.", "Longformer 加入少量全局标记。", "词元"),
    "token: 分类标记 for [CLS]": ("the output at `[CLS]` (the classification token)", "`[CLS]`（分类标记）处的输出", "词元"),
    "token: 哨兵标记": ("spans become sentinel tokens", "片段被换成哨兵标记", "词元"),
    "post-LN: 后置层归一化": ("the original post-LN layer", "原始的后置层归一化层", "post-LN"),
    "pre-LN: 前置层归一化": ("a standard pre-LN block", "标准的前置层归一化块", "pre-LN"),
    "pre-LN capitalised": ("a standard pre-LN block", "标准的 Pre-LN 块", "pre-LN"),
    "post-LN capitalised": ("post-LN blocks", "Post-LN 块", "post-LN"),
    "LayerNorm in prose": ("a final LayerNorm before the head", "输出头之前的最终 LayerNorm", "层归一化"),
    "heads axis 注意力头轴": ("a heads axis of size 1", "一个大小为 1 的注意力头轴", "头维度"),
    "attend: 双向注意": ("without a mask it attends bidirectionally", "不传入掩码时就双向注意", "关注"),
    "attend: 注意缓存中的键": ("the new query attends to the cached keys", "新查询注意缓存中的键", "关注"),
    "kernel: 内核": ("checked against PyTorch's fused kernel", "与 PyTorch 的融合内核核对", "算子"),
    "kernel: 内核 for a compute kernel next to a Jupyter one": (
        "In a running kernel, the kernel is fused.", "在运行中的 Jupyter 内核里，内核是融合的。", "算子"),
    "batch size: 批大小": ("the batch size", "批大小", "批量大小"),
    "batch size: 批次大小": ("the batch size", "批次大小", "批量大小"),
    "FFN: 前馈层": ("the feed-forward layer is four times wider", "前馈层宽四倍", "前馈网络"),
    "FFN in prose": ("the FFN holds most parameters", "FFN 占了大部分参数", "前馈网络"),
    "held-out: 留出集": ("the held-out loss", "留出损失", "验证"),
    "softmax 归一化": ("softmax", "softmax 归一化", "'softmax'"),
    "词嵌入": ("token embeddings", "词嵌入", "词元嵌入"),
    "introduction （中文, *English*）": (
        "a stack of decoder blocks (decoder-only)", "一叠解码器块（仅解码器, *decoder-only*）", "中文（English）"),
    "introduction （中文，*English*）": (
        "a stack of decoder blocks (decoder-only)", "一叠解码器块（仅解码器，*decoder-only*）", "中文（English）"),
    "introduction （*中文*，english）": ("the *prefill*", "（*预填充*，prefill）", "中文（English）"),
    "stock phrase 现场运行": ("This is a live run: the curve differs between machines.", "这是一次现场运行：曲线在不同机器上略有差异。", "构建本页时"),
    "stock phrase 毫无怨言": ("it runs without complaint", "它会毫无怨言地运行", "natural phrasing"),
    "stock phrase 的那个运算": ("Attention is the one operation every model is built around.", "注意力是每个模型都围绕其构建的那个运算。", "natural phrasing"),
    "introduction with half-width parentheses": ("a causal mask", "因果掩码(causal mask)", "中文（English）"),
}


@pytest.mark.parametrize("drift", sorted(DRIFTS))
def test_the_term_sheet_rejects_each_drift_of_issue_34(tmp_path, monkeypatch, drift):
    monkeypatch.setattr(i18n, "CATALOGUES", tmp_path)
    en, zh, expected = DRIFTS[drift]
    problems = i18n.check_page(_po(tmp_path, [(en, zh, False)]), [])
    assert problems, f"{drift}: the checker passed {zh!r}"
    assert "book/chXX" in problems[0] and en[:20] in problems[0]  # names the page and the entry
    assert expected in "\n".join(problems)  # and the expected term


def test_the_term_sheet_allows_code_math_quotations_introductions_and_other_senses(tmp_path, monkeypatch):
    monkeypatch.setattr(i18n, "CATALOGUES", tmp_path)
    allowed = [
        ("it wraps `nn.LayerNorm` and `FFN`", "它包装了 `nn.LayerNorm` 和 `FFN`"),  # code
        ("$\\operatorname{LayerNorm}(x) + \\mathrm{FFN}(x)$ per token", "每个词元 $\\operatorname{LayerNorm}(x) + \\mathrm{FFN}(x)$"),  # math
        ("layer normalization (LayerNorm) and the FFN (feed-forward network)", "层归一化（LayerNorm）与前馈网络（FFN）"),  # introductions
        ('the seed: "GPT 模型使用 Pre-LN" (GPT uses pre-LN)', "博文：“GPT 模型使用 Pre-LN”"),  # a quotation the English quotes
        ('its diagram ("Add & LayerNorm")', "它的框图（“Add & LayerNorm”）"),
        ("needs a running kernel; the Linux kernel never limits root", "需要运行中的 Jupyter 内核；Linux 内核从不限制 root"),
        ("the notebook is flagged", "该笔记本被标记"),  # 标记 in its own sense: the English has no token
        ("Note the default", "注意默认值"),  # 注意 = note: the English does not attend
        ("(B, T) masks", "(B, T) 掩码"),  # a shape, not an introduction
        ("bidirectional (encoder, BERT)", "双向（编码器，BERT）"),
    ]
    problems = i18n.check_page(_po(tmp_path, [(en, zh, False) for en, zh in allowed]), [])
    assert problems == []


def test_a_glossary_cell_is_checked_in_its_row_and_an_explanation_is_translated(tmp_path, monkeypatch):
    monkeypatch.setattr(i18n, "CATALOGUES", tmp_path)
    explanation = "relative position bucket (T5: one learned bias per head and bucket; DeBERTa v2: one row per bucket)"
    rows = [("sentinel token", "sentinel token", False), ("哨兵标记", "哨兵标记", False),
            ("layer normalization (LayerNorm)", "layer normalization (LayerNorm)", False),  # the English column
            (explanation, explanation, False)]
    problems = i18n.check_page(_po(tmp_path, rows, name="glossary"), [])
    text = "\n".join(problems)
    assert "'标记' for 'token'" in text  # the Chinese cell of the row "sentinel token"
    assert "explanation left in English" in text
    assert len(problems) == 2
    good = [rows[0], ("哨兵词元", "哨兵词元", False), rows[2],
            (explanation, "relative position bucket（T5：每个头、每个桶一个可学习的偏置；DeBERTa v2：每个桶一行）", False)]
    assert i18n.check_page(_po(tmp_path, good, name="glossary"), []) == []


def test_every_term_of_the_sheet_has_one_rendering_and_compiles():
    sheet = i18n.term_sheet()
    assert len(sheet) >= 12
    for term in sheet:
        assert term["en"] and term["zh"] and term["forbid"], term
        for variant in term["forbid"]:
            assert not variant.search(term["zh"]), f"{term['en']}: the rendering {term['zh']!r} is forbidden by its own sheet"
