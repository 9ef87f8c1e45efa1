"""Exercises 2.3 and 2.4 as redesigned (issue 30, item 7): a right answer scores full marks, the chapter's code and
plausible wrong answers do not, and each failure names the mistake. The references here are written apart from the
solution notebook and from companion/grading/ch02.py."""

import math

import torch
from torch import nn

from companion.attention import scaled_dot_product_attention
from companion.grading import get_exercise, run_exercise


def earned(ex_id, *students):
    res = run_exercise(get_exercise(ex_id), *students)
    return res.earned, res.points, [c.message for c in res.cases if c.earned < c.points]


# ----------------------------------------------------------------- 2.3

def good_split(qkv, n_heads, n_kv_heads, layout):
    b, t, width = qkv.shape
    dh = width // (n_heads + 2 * n_kv_heads)
    if layout == "per_head":
        q, k, v = qkv.unflatten(-1, (n_heads, 3, dh)).permute(3, 0, 2, 1, 4)  # (3, B, H, T, dh)
        return q, k, v
    q, k, v = qkv.split([n_heads * dh, n_kv_heads * dh, n_kv_heads * dh], dim=-1)
    return tuple(z.unflatten(-1, (-1, dh)).permute(0, 2, 1, 3) for z in (q, k, v))


def good_merge(y):
    return y.permute(0, 2, 1, 3).flatten(2)


def thirds_split(qkv, n_heads, n_kv_heads, layout):  # the chapter's lines: three equal parts, any layout
    b, t, width = qkv.shape
    q, k, v = qkv.split(width // 3, dim=-1)
    return tuple(z.view(b, t, n_heads, -1).transpose(1, 2) for z in (q, k, v))


def test_2_3_right_answer_scores_full_marks():
    assert earned("2.3", good_split, good_merge)[:2] == (6, 6)


def test_2_3_the_chapters_split_into_thirds():
    got, points, messages = earned("2.3", thirds_split, good_merge)
    assert got == 2 < points  # the equal-heads 'blocks' case and merge_heads only
    assert any("[Q | K | V] blocks" in m for m in messages)


def test_2_3_key_value_heads_as_many_as_query_heads():
    def kv_with_h_heads(qkv, n_heads, n_kv_heads, layout):
        if layout == "per_head":
            return good_split(qkv, n_heads, n_kv_heads, layout)
        q, _, _ = good_split(qkv, n_heads, n_kv_heads, layout)
        k, v = (z.repeat_interleave(n_heads // n_kv_heads, dim=1)
                for z in good_split(qkv, n_heads, n_kv_heads, layout)[1:])  # already repeated for the queries
        return q, k, v

    got, _, messages = earned("2.3", kv_with_h_heads, good_merge)
    assert got == 4 and any("n_kv_heads = 2 heads" in m for m in messages)


def test_2_3_per_head_with_the_parts_in_the_wrong_order():
    def per_head_kqv(qkv, n_heads, n_kv_heads, layout):
        if layout != "per_head":
            return good_split(qkv, n_heads, n_kv_heads, layout)
        q, k, v = good_split(qkv, n_heads, n_kv_heads, layout)
        return k, q, v

    got, _, messages = earned("2.3", per_head_kqv, good_merge)
    assert got == 4 and any("'per_head'" in m for m in messages)


def test_2_3_merge_that_mixes_positions():
    got, _, messages = earned("2.3", good_split, lambda y: y.reshape(y.shape[0], y.shape[2], -1))
    assert got == 5 and any("merge_heads" in m for m in messages)


# ----------------------------------------------------------------- 2.4

class Good(nn.Module):
    def __init__(self, d_model, n_heads, d_head=None):
        super().__init__()
        if d_head is None:
            if d_model % n_heads:
                raise ValueError("not divisible")
            d_head = d_model // n_heads
        self.h, self.dh = n_heads, d_head
        self.q = nn.Linear(d_model, n_heads * d_head)
        self.kv = nn.Linear(d_model, 2 * n_heads * d_head)
        self.out = nn.Linear(n_heads * d_head, d_model)

    def heads(self, z):
        return z.unflatten(-1, (self.h, self.dh)).transpose(1, 2)

    def scale(self):
        return 1 / math.sqrt(self.dh)

    def forward(self, x, context=None, mask=None):
        context = x if context is None else context
        k, v = self.kv(context).split(self.h * self.dh, dim=-1)
        y = scaled_dot_product_attention(self.heads(self.q(x)), self.heads(k), self.heads(v), mask,
                                         scale=self.scale())
        return self.out(y.transpose(1, 2).flatten(2))


def test_2_4_right_answer_scores_full_marks():
    assert earned("2.4", Good)[:2] == (9, 9)


def test_2_4_scaled_by_d_model_over_heads():
    class WrongScale(Good):
        def __init__(self, d_model, n_heads, d_head=None):
            super().__init__(d_model, n_heads, d_head)
            self.d_model = d_model

        def scale(self):
            return 1 / math.sqrt(self.d_model // self.h)

    got, _, messages = earned("2.4", WrongScale)
    assert got == 7 and any("1/sqrt(d_head)" in m for m in messages)


def test_2_4_mask_dropped_in_cross_attention():
    class NoMaskAcross(Good):
        def forward(self, x, context=None, mask=None):
            return super().forward(x, context, mask if context is None else None)

    got, _, messages = earned("2.4", NoMaskAcross)
    assert got == 5 and any("without the mask" in m for m in messages)


def test_2_4_values_before_keys():
    class VK(Good):
        def forward(self, x, context=None, mask=None):
            context = x if context is None else context
            v, k = self.kv(context).split(self.h * self.dh, dim=-1)
            y = scaled_dot_product_attention(self.heads(self.q(x)), self.heads(k), self.heads(v), mask)
            return self.out(y.transpose(1, 2).flatten(2))

    assert earned("2.4", VK)[0] == 2  # the layout and the ValueError only


def test_2_4_no_value_error():
    class Floors(Good):
        def __init__(self, d_model, n_heads, d_head=None):
            super().__init__(d_model, n_heads, d_head or d_model // n_heads)

    got, _, messages = earned("2.4", Floors)
    assert got == 8 and any("ValueError" in m for m in messages)
