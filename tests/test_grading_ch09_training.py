"""Exercises 9.5 (your GPT) and 9.6 (your training loop): right answers pass, each wrong one fails with its message.

The wrong training loops are the three mistakes the statement of 9.6 names: one that never
steps the optimizer, one whose targets leak into its inputs, one that never clears its
gradients. Each must lose the case that judges that mistake, with a message naming it.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from companion.grading import get_exercise, run_exercise


# ----------------------------------------------------------------- a student's GPT (the solution's code)

def causal_self_attention(x, w_qkv, b_qkv, w_proj, b_proj, n_heads, causal=True):
    b, t, d = x.shape
    q, k, v = (x @ w_qkv.T + b_qkv).split(d, dim=-1)
    q, k, v = (z.view(b, t, n_heads, d // n_heads).transpose(1, 2) for z in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(d // n_heads)
    if causal:
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), torch.finfo(scores.dtype).min)
    out = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, t, d)
    return out @ w_proj.T + b_proj


class SelfAttention(nn.Module):
    causal = True

    def __init__(self, cfg):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x):
        return causal_self_attention(x, self.qkv.weight, self.qkv.bias, self.out.weight, self.out.bias,
                                     self.n_heads, self.causal)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.down = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x):
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class Block(nn.Module):
    pre_ln = True

    def __init__(self, cfg):
        super().__init__()
        self.norm1, self.self_attn = nn.LayerNorm(cfg.d_model), SelfAttention(cfg)
        self.norm2, self.ffn = nn.LayerNorm(cfg.d_model), MLP(cfg)

    def forward(self, x):
        if not self.pre_ln:  # post-LN, GPT-1's layout: a wrong answer
            x = self.norm1(x + self.self_attn(x))
            return self.norm2(x + self.ffn(x))
        x = x + self.self_attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class MyGPT(nn.Module):
    tied = True

    def __init__(self, cfg):
        super().__init__()
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_positions, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if self.tied:
            self.lm_head.weight = self.tok_emb.weight

    def forward(self, idx):
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm_f(x))


def gpt_param_count(cfg):
    d, f, v, p, n = cfg.d_model, cfg.ff_size, cfg.vocab_size, cfg.max_positions, cfg.n_layers
    block = (3 * d * d + 3 * d) + (d * d + d) + (2 * d * f + f + d) + 4 * d
    return v * d + p * d + n * block + (2 * d if cfg.final_norm else 0) + (0 if cfg.tie_embeddings else v * d)


def grade_gpt(cls=MyGPT, count=gpt_param_count):
    result = run_exercise(get_exercise("9.5"), cls, count)
    return {c.name: c for c in result.cases}


def failed(cases):
    return {name: c.message for name, c in cases.items() if not c.passed}


def test_the_solution_gpt_earns_every_point():
    assert failed(grade_gpt()) == {}


def test_a_wrong_module_name_is_named():
    class Renamed(SelfAttention):
        pass

    class BlockWithAttn(Block):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.attn = self.self_attn  # the module under another name only
            del self.self_attn

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.ffn(self.norm2(x))

    class Wrong(MyGPT):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.blocks = nn.ModuleList(BlockWithAttn(cfg) for _ in range(cfg.n_layers))

    bad = failed(grade_gpt(Wrong))
    assert len(bad) == 6  # every case needs the layout first
    assert "MyGPT has no blocks.0.self_attn.qkv.weight of shape (72, 24)" in bad["module names and shapes are the chapter's MiniGPT's"]


def test_an_untied_head_fails_the_tie_and_the_count():
    class Untied(MyGPT):
        tied = False

    bad = failed(grade_gpt(Untied))
    assert set(bad) == {"the head is tied to the token embedding", "its parameter count equals your 9.4 formula"}
    assert "changing tok_emb.weight left lm_head.weight unchanged" in bad["the head is tied to the token embedding"]
    assert "the tied head must not add a second V x D matrix" in bad["its parameter count equals your 9.4 formula"]


def test_attention_that_sees_the_future_fails_causality_and_the_logits():
    class Leaky(SelfAttention):
        causal = False

    class LeakyBlock(Block):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.self_attn = Leaky(cfg)

    class Wrong(MyGPT):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.blocks = nn.ModuleList(LeakyBlock(cfg) for _ in range(cfg.n_layers))

    bad = failed(grade_gpt(Wrong))
    assert "changing tokens 8..12 changed the logits of tokens 0..7" in bad["changing a later token leaves earlier logits unchanged"]
    assert "logits of MyGPT" in bad["with the reference's weights, the same logits (V=101, T=13, D=24, H=3, L=2)"]


def test_a_post_ln_block_gives_other_logits():
    class PostLN(Block):
        pre_ln = False

    class Wrong(MyGPT):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.blocks = nn.ModuleList(PostLN(cfg) for _ in range(cfg.n_layers))

    bad = failed(grade_gpt(Wrong))
    assert set(bad) == {"with the reference's weights, the same logits (V=101, T=13, D=24, H=3, L=2)",
                        "the same logits with five heads, three layers and T=7 < max_positions"}


def test_the_count_is_compared_with_the_students_own_formula():
    bad = failed(grade_gpt(count=lambda cfg: gpt_param_count(cfg) + 1))
    assert list(bad) == ["its parameter count equals your 9.4 formula"]
    assert "your gpt_param_count(cfg) of exercise 9.4 says" in bad["its parameter count equals your 9.4 formula"]

    def stub(cfg):
        raise NotImplementedError("replace this line with your code")

    bad = failed(grade_gpt(count=stub))
    assert "gpt_param_count of exercise 9.4, which failed: not implemented yet" in bad["its parameter count equals your 9.4 formula"]


# ----------------------------------------------------------------- training loops

def make_loop(mistake=None):
    """The solution's loop, or the same loop with one mistake."""

    def train(model, train_ids, steps, batch_size, seq_len, lr, seed):
        gen = torch.Generator().manual_seed(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        losses = []
        for _ in range(steps):
            starts = torch.randint(len(train_ids) - seq_len, (batch_size,), generator=gen)
            window = starts[:, None] + torch.arange(seq_len)  # (B, T)
            x, y = train_ids[window], train_ids[window + 1]
            if mistake == "leaks":
                y = x  # the loss on unshifted targets: each position is asked for the token it sees
            if mistake == "lags":
                x, y = y, x  # shifted the wrong way: each position is asked for the token before it
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            if mistake != "never zeroes":
                opt.zero_grad()
            loss.backward()
            if mistake != "never steps":
                opt.step()
            losses.append(loss.item())
        return losses

    return train


STEPS = "three steps update the weights"
LOSSES = "returns one training loss per step"
ZERO = "clears the gradients between steps"
LEAK = "targets are the next tokens, not leaked into the inputs"


@pytest.fixture(scope="module")
def graded_loops():
    ex = get_exercise("9.6")
    learns = ex.cases[-1].name
    out = {}
    for mistake in (None, "never steps", "leaks", "never zeroes"):
        result = run_exercise(ex, make_loop(mistake))
        out[mistake] = {c.name: c for c in result.cases}
    return learns, out


def test_the_solution_loop_earns_every_point(graded_loops):
    _, out = graded_loops
    assert failed(out[None]) == {}


def test_a_loop_that_never_steps_is_told_so(graded_loops):
    learns, out = graded_loops
    bad = failed(out["never steps"])
    assert set(bad) == {STEPS, ZERO, LEAK, learns}
    for name in (STEPS, LEAK, learns):
        assert "every weight equals its initial value" in bad[name] and "optimizer.step()" in bad[name], bad[name]


def test_a_loop_whose_targets_leak_is_told_so(graded_loops):
    learns, out = graded_loops
    bad = failed(out["leaks"])
    assert set(bad) == {LEAK, learns}
    for name in (LEAK, learns):
        assert "the targets leaked into the inputs" in bad[name] and "the token at the same position" in bad[name], bad[name]


def test_a_loop_that_never_zeroes_gradients_is_told_so(graded_loops):
    learns, out = graded_loops
    bad = failed(out["never zeroes"])
    assert set(bad) == {ZERO, learns}
    assert "the gradients were never cleared" in bad[ZERO] and "zero_grad()" in bad[ZERO]
    assert "the gradients were never cleared (see that case)" in bad[learns]


def test_a_loop_whose_targets_lag_the_inputs_is_told_so():
    ex = get_exercise("9.6")
    case = next(c for c in ex.cases if c.name == LEAK)
    result = run_exercise(type(ex)(ex.id, ex.title, ex.targets, (case,)), make_loop("lags"))
    assert not result.cases[0].passed
    assert "the token just before" in result.cases[0].message and "leaked" in result.cases[0].message


def test_a_loop_that_returns_no_losses_loses_that_case_only():
    def train(model, train_ids, steps, batch_size, seq_len, lr, seed):
        make_loop()(model, train_ids, steps, batch_size, seq_len, lr, seed)

    ex = get_exercise("9.6")
    quick = tuple(c for c in ex.cases if c.name in (STEPS, LOSSES, ZERO))
    result = run_exercise(type(ex)(ex.id, ex.title, ex.targets, quick), train)
    got = {c.name: c for c in result.cases}
    assert got[STEPS].passed and got[ZERO].passed and not got[LOSSES].passed
    assert "should return its 3 training losses" in got[LOSSES].message
