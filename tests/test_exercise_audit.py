"""Issue 30 item 7: an exercise must ask for more than the chapter shows. For each redesigned exercise, the closest
code of its chapter, read from the chapter's visible cells (not tagged remove-input/remove-cell) and run verbatim, is
submitted as the answer, alone and in a thin wrapper that only adapts its name and signature: neither scores full
marks. The chapter is read at test time, so a chapter that later grows the exercise's answer fails here."""

import ast
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from companion.grading import get_exercise, run_exercise

BOOK = Path(__file__).resolve().parents[1] / "book"


def chapter_code(notebook, *names):
    """The named top-level functions and classes of the chapter's visible code cells, executed verbatim."""
    found = {}
    for cell in json.loads((BOOK / notebook).read_text())["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] != "code" or {"remove-input", "remove-cell"} & set(tags):
            continue
        try:
            tree = ast.parse("".join(cell["source"]))
        except SyntaxError:  # a cell with IPython magics
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
                found[node.name] = ast.unparse(node)
    assert set(found) == set(names), f"{notebook} no longer shows {sorted(set(names) - set(found))}"
    ns = {"torch": torch, "nn": nn, "F": F, "math": math, "__sources__": found}
    for name in names:
        exec(compile(found[name], f"{notebook}:{name}", "exec"), ns)  # noqa: S102
    return ns


def earned(ex_id, *students):
    res = run_exercise(get_exercise(ex_id), *students)
    return res.earned, res.points


def test_4_3_the_chapters_encoder_layer():
    ns = chapter_code("ch04_encoder_decoder.ipynb", "Attention", "feed_forward", "EncoderLayer")
    layer = ns["EncoderLayer"]

    class Wrapped(layer):  # n_layers ignored, no dropout, the mask optional
        def __init__(self, d_model, n_heads, d_ff, n_layers):
            super().__init__(d_model, n_heads, d_ff, 0.0)

        def forward(self, x, mask=None):
            return super().forward(x, mask)

    assert earned("4.3", layer)[0] == 0
    got, points = earned("4.3", Wrapped)
    assert got < points and got <= 1


def test_8_1_the_chapters_roberta_position_ids():
    fn = chapter_code("ch08_variants.ipynb", "roberta_position_ids")["roberta_position_ids"]
    assert earned("8.1", fn)[0] == 0
    got, points = earned("8.1", lambda ids, pad_id, bos_id: fn(ids, pad_id))
    assert got < points and got <= 1


def test_8_4_the_chapters_soft_targets():
    fn = chapter_code("ch08_variants.ipynb", "soft_targets")["soft_targets"]
    assert earned("8.4", fn)[0] == 0

    def on_every_position(s, t, hs, ht, labels, att, T, alphas, restrict):
        return alphas[0] * fn(s.flatten(0, 1), t.flatten(0, 1), T)

    def on_the_selected_rows(s, t, hs, ht, labels, att, T, alphas, restrict):
        rows = labels != -100 if restrict else att.bool()
        return alphas[0] * fn(s[rows], t[rows], T)  # the soft-target term right, the other two missing

    assert earned("8.4", on_every_position)[0] == 0
    got, points = earned("8.4", on_the_selected_rows)
    assert got == 3 < points


def test_2_3_the_chapters_split_and_merge_lines():
    ns = chapter_code("ch02_attention.ipynb", "attention", "MultiHeadAttention")  # its forward holds the lines

    def split(qkv, n_heads, n_kv_heads, layout):  # MultiHeadAttention.forward's split and view/transpose
        B, T, D3 = qkv.shape
        q, k, v = qkv.split(D3 // 3, dim=-1)
        return tuple(z.view(B, T, n_heads, D3 // 3 // n_heads).transpose(1, 2) for z in (q, k, v))

    def merge(y):  # its merge line
        B, H, T, Dh = y.shape
        return y.transpose(1, 2).reshape(B, T, H * Dh)

    layer = ns["MultiHeadAttention"](12, 3)
    x = torch.randn(2, 5, 12)
    q, k, v = split(layer.qkv(x), 3, 3, "blocks")
    assert torch.allclose(layer.out(merge(ns["attention"](q, k, v))), layer(x), atol=1e-6)  # the chapter's lines
    got, points = earned("2.3", split, merge)
    assert got < points and got <= 2


def test_2_4_the_chapters_multi_head_attention():
    mha = chapter_code("ch02_attention.ipynb", "attention", "MultiHeadAttention")["MultiHeadAttention"]

    class Wrapped(mha):  # d_head and context accepted and ignored
        def __init__(self, d_model, n_heads, d_head=None):
            super().__init__(d_model, n_heads)

        def forward(self, x, context=None, mask=None):
            return super().forward(x, mask)

    assert earned("2.4", mha)[0] == 0
    assert earned("2.4", Wrapped)[0] == 0


def test_7_2_the_chapters_mask_80_10_10():
    ns = chapter_code("ch07_bert.ipynb", "mask_80_10_10")
    ns["IGNORE_INDEX"] = -100  # a global of the chapter
    tree = ast.parse(ns["__sources__"]["mask_80_10_10"])
    fn = tree.body[0]
    draws = {"select", "action", "replacement"}
    fn.body = [n for n in fn.body if not (isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) in draws)]
    fn.args.args = [ast.arg(a) for a in ("ids", "blocked", "mask_id", "select", "action", "replacement", "p")]
    for node in ast.walk(fn):
        if isinstance(node, ast.Compare) and isinstance(node.comparators[0], ast.Constant) and \
                node.comparators[0].value == 0.15:
            node.comparators[0] = ast.Name("p", ast.Load())  # 0.15 -> p
    exec(compile(ast.fix_missing_locations(tree), "ch07:mask_80_10_10", "exec"), ns)  # noqa: S102
    chapter = ns["mask_80_10_10"]

    def wrapped(input_ids, attention_mask, special_ids, mask_id, select, action, random_tokens, p,
                continuation=None):
        blocked = torch.isin(input_ids, torch.tensor(list(special_ids))) | (attention_mask == 0)
        return chapter(input_ids, blocked, mask_id, select, action, random_tokens, p)

    got, points = earned("7.2", wrapped)  # the draws now inputs: right where every token is a word (2 points)
    assert got == 2 < points


@pytest.mark.parametrize("notebook, names", [
    ("ch02_attention.ipynb", ("attention", "MultiHeadAttention")),
    ("ch04_encoder_decoder.ipynb", ("Attention", "feed_forward", "EncoderLayer")),
    ("ch07_bert.ipynb", ("mask_80_10_10",)),
    ("ch08_variants.ipynb", ("roberta_position_ids", "soft_targets")),
])
def test_the_audited_chapter_code_is_still_shown(notebook, names):
    chapter_code(notebook, *names)
