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

from companion.grading.ch06 import window_sink_mask
from companion.masks import causal_mask
from scoring import result

BOOK = Path(__file__).resolve().parents[1] / "book"


def visible_trees(notebook):
    """The parsed source of each code cell the chapter's page shows (not tagged remove-input/remove-cell)."""
    for cell in json.loads((BOOK / notebook).read_text())["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] != "code" or {"remove-input", "remove-cell"} & set(tags):
            continue
        try:
            tree = ast.parse("".join(cell["source"]))
        except SyntaxError:  # a cell with IPython magics
            continue
        yield tree


def chapter_code(notebook, *names):
    """The named top-level functions and classes of the chapter's visible code cells, executed verbatim."""
    found = {}
    for tree in visible_trees(notebook):
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
                found[node.name] = ast.unparse(node)
    assert set(found) == set(names), f"{notebook} no longer shows {sorted(set(names) - set(found))}"
    ns = {"torch": torch, "nn": nn, "F": F, "math": math, "__sources__": found}
    for name in names:
        exec(compile(found[name], f"{notebook}:{name}", "exec"), ns)  # noqa: S102
    return ns


def chapter_lines(notebook, *targets):
    """The first assignment to each named variable in the chapter's visible code cells, as source lines."""
    found = {}
    for tree in visible_trees(notebook):
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                found.setdefault(node.targets[0].id, ast.unparse(node))
    assert set(targets) <= set(found), f"{notebook} no longer assigns {sorted(set(targets) - set(found))}"
    return [found[t] for t in targets]


def run_lines(lines, **names):
    ns = {"torch": torch, "causal_mask": causal_mask, **names}
    for line in lines:
        exec(line, ns)  # noqa: S102
    return ns


def earned(ex_id, *students):
    return result(ex_id, *students)[:2]


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


def test_6_1_the_chapters_causal_and_padding():
    pad_line, causal_line, decoder_line = chapter_lines("ch06_masks.ipynb", "pad", "causal", "decoder")

    def chapter(document_ids):  # cells 4, 6, 8 with the padding indicator read off the ids
        return run_lines([pad_line, causal_line, decoder_line], attention_mask=(document_ids >= 0).long(),
                         T=document_ids.shape[1])["decoder"]

    got, points = earned("6.1", chapter)
    assert got < points and got <= 1


def test_6_2_the_chapters_sliding_window():
    (sliding_line,) = chapter_lines("ch06_masks.ipynb", "sliding")

    def chapter(t, s, window):  # cell 40 at T_w = t, and at T_w = s keeping the last t rows
        return run_lines([sliding_line], T_w=t, window=window)["sliding"]

    def on_s_keys_last_rows(t, s, window):  # right, but needs an (s, s) mask
        return run_lines([sliding_line], T_w=s, window=window)["sliding"][-t:]

    got, points = earned("6.2", chapter)
    assert got < points and got <= 1
    got, points = earned("6.2", on_s_keys_last_rows)
    assert got == points - 1


def test_6_3_the_chapters_cross_attention_mask():
    (cross_line,) = chapter_lines("ch06_masks.ipynb", "cross")

    def chapter(decoder_attention_mask, encoder_attention_mask):  # cell 12, and the empty rows of its mask
        cross = run_lines([cross_line], source_attention_mask=encoder_attention_mask,
                          T_dec=decoder_attention_mask.shape[1])["cross"]
        return cross, ~cross[:, 0].any(dim=-1)

    got, points = earned("6.3", chapter)
    assert got < points and got <= 1


def test_6_4_the_chapters_reach():
    reach = chapter_code("ch06_masks.ipynb", "reach")["reach"]

    def wrapped(t, i, n_layers, window, n_sink=0):
        return reach(window_sink_mask(t, window, n_sink), n_layers)[i]

    got, points = earned("6.4", wrapped)
    assert got < points and got <= 3


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
    ("ch06_masks.ipynb", ("reach",)),
    ("ch05_residuals_norm.ipynb", ("rms_norm", "PostLNBlock", "PreLNBlock")),
])
def test_the_audited_chapter_code_is_still_shown(notebook, names):
    chapter_code(notebook, *names)


def chapter_method_lines(notebook, cls_name, method, targets):
    """The statements of a method of a chapter's visible class that assign the named variables, as source."""
    for tree in visible_trees(notebook):
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == cls_name:
                fn = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == method)
                found = [ast.unparse(s) for s in fn.body if isinstance(s, ast.Assign)
                         and any(isinstance(t, ast.Name) and t.id in targets for t in s.targets)]
                assert len(found) == len(targets), f"{cls_name}.{method} no longer assigns {targets}"
                return "\n".join(found)
    raise AssertionError(f"{notebook} no longer shows {cls_name}")


def test_4_2_the_chapters_two_masks():
    # EncoderDecoder.forward's src_mask (padding, (B, 1, 1, S)) and causal ((T, T)), built for the target and joined
    lines = chapter_method_lines("ch04_encoder_decoder.ipynb", "EncoderDecoder", "forward", ("src_mask", "causal"))

    def joined(tgt_valid):
        ns = {"torch": torch, "src_valid": tgt_valid, "tgt_in": tgt_valid}
        exec(lines, ns)  # noqa: S102
        return ns["causal"] & ns["src_mask"]

    def as_float(tgt_valid, dtype=torch.float32):  # the boolean mask as 1/0
        return joined(tgt_valid).to(dtype)

    def as_minus_inf(tgt_valid, dtype=torch.float32):  # PyTorch's -inf convention
        return torch.zeros(joined(tgt_valid).shape, dtype=dtype).masked_fill(~joined(tgt_valid), float("-inf"))

    assert earned("4.2", lambda tgt_valid, dtype=torch.float32: joined(tgt_valid))[0] == 0
    assert earned("4.2", as_float)[0] == 0
    assert earned("4.2", as_minus_inf)[0] == 0


def test_5_2_the_chapters_rms_norm():
    fn = chapter_code("ch05_residuals_norm.ipynb", "rms_norm")["rms_norm"]

    class Wrapped(nn.Module):  # the chapter's rms_norm in a module; p accepted, not used
        def __init__(self, d_model, p=1.0, eps=1e-6):
            super().__init__()
            self.eps, self.weight = eps, nn.Parameter(torch.ones(d_model))

        def forward(self, x):
            return fn(x, self.weight, self.eps)

    got, points = earned("5.2", Wrapped)
    assert got <= 1 < points  # only p = 1


def test_5_3_the_chapters_blocks():
    ns = chapter_code("ch05_residuals_norm.ipynb", "PostLNBlock", "PreLNBlock")
    for name in ("PostLNBlock", "PreLNBlock"):
        assert earned("5.3", ns[name])[0] == 0

    class WithAlpha(ns["PreLNBlock"]):  # the chapter's pre-LN block with a zero alpha on each sublayer: norms kept
        def __init__(self, attn, ffn, d_model):
            super().__init__(attn, ffn, d_model)
            self.alpha = nn.Parameter(torch.zeros(1))

        def forward(self, x, mask=None):
            x = x + self.alpha * self.attn(self.norm1(x), mask)
            return x + self.alpha * self.ffn(self.norm2(x))

    got, points = earned("5.3", WithAlpha)
    assert got <= 3 < points
