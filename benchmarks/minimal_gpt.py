"""The course's GPT against the fastest minimal GPT we could write (Chapter 13's speed goal).

``MinimalGPT`` is what a speed-minded single-file GPT does (nanoGPT's ``model.py``
is the best-known example; this one is our own, about 50 lines): fused QKV,
``F.scaled_dot_product_attention(..., is_causal=True)``, pre-LN blocks, exact GELU
(as nanoGPT's ``nn.GELU()``; the course GPT is built with ``activation="gelu"`` to
compute the same function), a final LayerNorm and a head tied to the token
embedding, no dropout calls and no checks. It is loaded with the course model's weights, so both compute the
same function (checked before timing). Each row is the training step (forward,
cross-entropy, backward, AdamW) in tokens per second, at the thread count of
the run; run it at 1 and 2 threads: ``--threads 1`` / ``--threads 2``. The two
steps alternate one by one (a, b, a, b, ...), so both see the same machine.

* ``same AdamW``: both models with PyTorch's default AdamW (unfused on the CPU):
  the models alone are compared. They issue the same operations, so the
  ratio is 1 up to the noise of the machine.
* ``each its AdamW``: the course's step uses :func:`companion.training.make_optimizer`
  (what :func:`companion.training.train` uses: the fused AdamW kernel on the CPU
  and CUDA); the minimal GPT uses what nanoGPT's ``configure_optimizers`` picks
  (fused on CUDA only, the unfused loop on the CPU). Same groups (decay on
  matrices only), learning rate and betas.

Config: 4 layers, width 128, 4 heads, 65-token vocabulary (characters), batch
12 x 64: the configuration measured in issue 13.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from .common import Row, Settings, on_device, paired_median_seconds

VOCAB, D_MODEL, N_LAYERS, N_HEADS, BLOCK, BATCH = 65, 128, 4, 4, 64, 12
DEVICES = ("cpu", "cuda", "mps")


class _Block(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, Dh)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class MinimalGPT(nn.Module):
    def __init__(self, vocab: int, d: int, n_layers: int, n_heads: int, block: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(_Block(d, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.tok.weight)  # tied head


def _pair():
    from companion.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    ours = GPT(GPTConfig(vocab_size=VOCAB, max_positions=BLOCK, d_model=D_MODEL, n_layers=N_LAYERS,
                         n_heads=N_HEADS, dropout=0.0, activation="gelu"))
    minimal = MinimalGPT(VOCAB, D_MODEL, N_LAYERS, N_HEADS, BLOCK)
    sd = ours.state_dict()
    names = {"tok.weight": "tok_emb.weight", "pos.weight": "pos_emb.weight", "ln_f.weight": "norm_f.weight",
             "ln_f.bias": "norm_f.bias"}
    for i in range(N_LAYERS):
        for a, b in (("ln1", "norm1"), ("ln2", "norm2"), ("qkv", "self_attn.qkv"), ("proj", "self_attn.out"),
                     ("up", "ffn.up"), ("down", "ffn.down")):
            for w in ("weight", "bias"):
                names[f"blocks.{i}.{a}.{w}"] = f"blocks.{i}.{b}.{w}"
    minimal.load_state_dict({k: sd[v].clone() for k, v in names.items()})
    return ours, minimal


def _step(model, opt, x, y):
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


LR, WEIGHT_DECAY, BETAS = 1e-4, 0.1, (0.9, 0.95)


def _adamw(model: nn.Module, fused: bool | None) -> torch.optim.AdamW:
    """AdamW with decay on matrices only: nanoGPT's ``configure_optimizers`` (fused=None: PyTorch's default)."""
    from companion.training import weight_decay_groups

    return torch.optim.AdamW(weight_decay_groups(model, WEIGHT_DECAY), lr=LR, betas=BETAS, fused=fused)


def training(settings: Settings) -> list[Row]:
    from companion.training import TrainConfig, make_optimizer

    ours, minimal = on_device(settings, *_pair())
    g = torch.Generator().manual_seed(0)
    batch = BATCH if settings.device == "cpu" else 8 * BATCH  # a GPU idles on the CPU's batch
    x, y = on_device(settings, torch.randint(0, VOCAB, (batch, BLOCK), generator=g),
                     torch.randint(0, VOCAB, (batch, BLOCK), generator=g))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), minimal(x), atol=1e-5, rtol=1e-5)
    ours.train(), minimal.train()
    # One step per timed call, alternating: 20 pairs per repeat (the median of 100 by default).
    steps = dataclasses.replace(settings, repeats=20 * settings.repeats, warmup=max(3, settings.warmup))
    tokens = batch * BLOCK
    where = f"{torch.get_num_threads()} thread(s)" if settings.device == "cpu" else settings.device
    setting = f"4x128, 4 heads, B={batch}, T={BLOCK}, {where}"
    course_cfg = TrainConfig(lr=LR, weight_decay=WEIGHT_DECAY, betas=BETAS)
    nanogpt_fused = True if settings.device.startswith("cuda") else None  # configure_optimizers: fused on CUDA only

    def timed(a, b, opt_a, opt_b):
        ta, tb = paired_median_seconds(lambda: _step(a, opt_a, x, y), lambda: _step(b, opt_b, x, y), steps)
        return tokens / ta, tokens / tb

    rows = []
    for label, opt_ours, opt_minimal in (
        ("same AdamW", _adamw(ours, None), _adamw(minimal, None)),
        ("each its AdamW", make_optimizer(ours, course_cfg), _adamw(minimal, nanogpt_fused)),
    ):
        a_value, b_value = timed(ours, minimal, opt_ours, opt_minimal)
        rows.append(Row(f"GPT training step vs a minimal fused GPT, {label}", setting, "companion", a_value,
                        "minimal GPT", b_value, "tok/s"))
    if settings.compile:
        compiled_ours, compiled_minimal = torch.compile(ours), torch.compile(minimal)
        a_value, b_value = timed(compiled_ours, compiled_minimal, make_optimizer(ours, course_cfg),
                                 _adamw(minimal, nanogpt_fused))
        rows.append(Row("GPT training step vs a minimal fused GPT, each its AdamW, torch.compile", setting,
                        "companion compiled", a_value, "minimal GPT compiled", b_value, "tok/s"))
    return rows


BENCHMARKS = {"training": training}
