"""A tiny causal character language model with a choice of positional scheme (Chapter 3).

Built for the length-extrapolation experiment: the same pre-LN decoder with
``position`` one of ``"none"`` (NoPE: only the causal mask tells order),
``"sinusoidal"``, ``"learned"`` (added to the embeddings), ``"rope"``
(queries and keys rotated), ``"t5"`` (learned bucketed bias, computed once
and shared by all layers, as in T5) or ``"alibi"`` (fixed linear bias).

Shape legend: B batch, T length, D model size, H heads, Dh head size, V vocabulary.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from ..attention import MultiHeadAttention
from ..blocks import Block, FeedForward, make_norm
from ..data import CharTokenizer, load_pydoc_text, random_batch, train_val_split
from ..training import History, TrainConfig, lm_loss, train
from ..positional import (
    LearnedPositionalEmbedding,
    RelativePositionBias,
    alibi_bias,
    rope_cos_sin,
    sinusoidal_encoding,
)

__all__ = [
    "POSITION_SCHEMES",
    "PositionLMConfig",
    "PositionLM",
    "lm_loss",
    "ExperimentConfig",
    "ExtrapolationData",
    "make_data",
    "train_position_lm",
    "evaluate_lengths",
    "load_extrapolation_results",
    "load_position_lm",
]

PositionScheme = Literal["none", "sinusoidal", "learned", "rope", "t5", "alibi"]
POSITION_SCHEMES: tuple[str, ...] = ("none", "sinusoidal", "learned", "t5", "rope", "alibi")


@dataclass(frozen=True)
class PositionLMConfig:
    vocab_size: int  # V, characters of the corpus
    position: PositionScheme = "rope"  # how the model learns where tokens are
    d_model: int = 64  # D
    n_heads: int = 4  # H; d_head = D / H
    n_layers: int = 2  # decoder blocks
    d_ff: int = 256  # hidden size of the feed-forward network
    max_positions: int = 64  # rows of the learned table (only used by "learned")
    t5_num_buckets: int = 32  # T5's defaults
    t5_max_distance: int = 128
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        if self.position not in POSITION_SCHEMES:
            raise ValueError(f"position must be one of {POSITION_SCHEMES}, got {self.position!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(f"d_head={self.d_model // self.n_heads} must be even for RoPE and sinusoids")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


class _PositionBlock(Block):
    """The pre-LN block of :class:`PositionLM` (parameters registered norm1, norm2, attention, FFN, as trained)."""

    registration_order = ("norm1", "norm2", "self_attn", "ffn")

    def __init__(self, cfg: PositionLMConfig) -> None:
        norm1, norm2 = make_norm("layernorm", cfg.d_model), make_norm("layernorm", cfg.d_model)
        attn = MultiHeadAttention(cfg.d_model, cfg.n_heads)
        ffn = FeedForward(cfg.d_model, cfg.d_ff, activation="gelu")
        super().__init__(attn, ffn, norm1, norm2, norm_first=True)


def _rename_legacy_keys(module, state_dict, prefix, *args) -> None:
    # Checkpoints written before the model was built on companion.blocks.Block call the attention "attn".
    for key in [k for k in state_dict if k.startswith(prefix + "blocks.") and ".attn." in k]:
        state_dict[key.replace(".attn.", ".self_attn.")] = state_dict.pop(key)


class PositionLM(nn.Module):
    """Token embedding, optional absolute positions, ``n_layers`` pre-LN blocks, final LN, LM head."""

    def __init__(self, cfg: PositionLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.position == "learned":
            self.pos = LearnedPositionalEmbedding(cfg.max_positions, cfg.d_model)
        if cfg.position == "t5":
            self.rel_bias = RelativePositionBias(cfg.n_heads, bidirectional=False,
                                                 num_buckets=cfg.t5_num_buckets, max_distance=cfg.t5_max_distance)
            nn.init.zeros_(self.rel_bias.relative_attention_bias.weight)  # start as NoPE; unseen buckets stay 0
        self.blocks = nn.ModuleList(_PositionBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = make_norm("layernorm", cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._register_load_state_dict_pre_hook(_rename_legacy_keys, with_module=True)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids`` (B, T) -> logits (B, T, V)."""
        if ids.dim() != 2 or ids.dtype != torch.long:
            raise ValueError(f"ids must be a (B, T) long tensor, got shape {tuple(ids.shape)} and dtype {ids.dtype}")
        t, cfg, dev = ids.shape[1], self.cfg, ids.device
        x = self.embed(ids)  # (B, T, D)
        if cfg.position == "sinusoidal":
            x = x + sinusoidal_encoding(t, cfg.d_model).to(dev)
        elif cfg.position == "learned":
            x = x + self.pos(t)  # raises beyond max_positions
        bias = None  # an additive score bias, the same in every layer
        if cfg.position == "t5":
            bias = self.rel_bias(t)  # (1, H, T, T), computed once, shared by all layers
        elif cfg.position == "alibi":
            bias = alibi_bias(cfg.n_heads, t, device=dev)[None]  # (1, H, T, T)
        rope = rope_cos_sin(torch.arange(t, device=dev), cfg.d_head, base=cfg.rope_base) if cfg.position == "rope" else None
        for block in self.blocks:
            x = block(x, bias=bias, is_causal=True, rope=rope)  # the attention adds bias, then masks
        return self.head(self.norm(x))  # (B, T, V)


# ---------------------------------------------------------------- the extrapolation experiment

CHECKPOINT_JSON = "ch03_extrapolation.json"
CHECKPOINT_WEIGHTS = "ch03_position_lms.pt"


@dataclass(frozen=True)
class ExperimentConfig:
    train_length: int = 64  # T of every training window
    eval_lengths: tuple[int, ...] = (32, 64, 128, 256, 512, 1024)  # lengths the trained models are scored on
    eval_tokens: int = 16384  # predicted characters per evaluation length (windows = eval_tokens / length)
    batch_size: int = 32
    steps: int = 600  # optimizer steps per model
    lr: float = 3e-3
    warmup_steps: int = 30
    seed: int = 0  # same initial weights seed and same batches for every scheme
    position_bin: int = 32  # width of the bins of the loss-by-position curve

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ExtrapolationData:
    tokenizer: CharTokenizer
    train_ids: torch.Tensor  # (N_train,)
    val_ids: torch.Tensor  # (N_val,)


def make_data() -> ExtrapolationData:
    """The pydoc corpus as characters, split 90 / 10 into training and validation text."""
    text = load_pydoc_text()
    tok = CharTokenizer(text)
    train_ids, val_ids = train_val_split(tok.encode(text), 0.1)
    return ExtrapolationData(tok, train_ids, val_ids)


def train_position_lm(
    scheme: str, exp: ExperimentConfig, data: ExtrapolationData, *, steps: int | None = None, progress: bool = True,
    **model_kwargs: Any,
) -> tuple[PositionLM, History]:
    """Train one :class:`PositionLM` with positional ``scheme`` on windows of ``exp.train_length``."""
    steps = exp.steps if steps is None else steps
    torch.manual_seed(exp.seed)
    model = PositionLM(PositionLMConfig(data.tokenizer.vocab_size, position=scheme,
                                        max_positions=exp.train_length, **model_kwargs))
    gen = torch.Generator().manual_seed(exp.seed)
    cfg = TrainConfig(steps=steps, lr=exp.lr, warmup_steps=min(exp.warmup_steps, steps), eval_every=steps)
    hist = train(model, lm_loss, lambda step: random_batch(data.train_ids, exp.train_length, exp.batch_size, gen),
                 cfg, progress=progress, desc=scheme)
    return model, hist


def _eval_windows(ids: torch.Tensor, length: int, n_windows: int) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.linspace(0, len(ids) - length - 1, n_windows).long()  # evenly spaced, deterministic
    offsets = torch.arange(length)
    return ids[starts[:, None] + offsets], ids[starts[:, None] + offsets + 1]  # (N, L) each


@torch.no_grad()
def evaluate_lengths(
    model: PositionLM, data: ExtrapolationData, exp: ExperimentConfig, lengths: tuple[int, ...] | None = None,
) -> tuple[dict[str, float | None], list[float | None]]:
    """Mean validation loss at each length (``None`` where the model cannot run), and the
    loss by position at the longest length, averaged over bins of ``exp.position_bin`` positions."""
    model.eval()
    lengths = exp.eval_lengths if lengths is None else lengths
    by_length: dict[str, float | None] = {}
    per_position = None
    for length in lengths:
        x, y = _eval_windows(data.val_ids, length, max(1, exp.eval_tokens // length))
        try:
            losses = torch.cat([lm_loss(model, (xb, yb), reduction="none") for xb, yb in zip(x.split(16), y.split(16))])
        except ValueError:  # a learned table has no row for these positions
            by_length[str(length)] = None
            per_position = None if length == max(lengths) else per_position
            continue
        by_length[str(length)] = losses.mean().item()
        if length == max(lengths):
            per_position = losses.mean(0).view(-1, exp.position_bin).mean(1).tolist()  # (L / bin,)
    if per_position is None:  # fall back to the longest length the model could run
        runnable = [length for length in lengths if by_length[str(length)] is not None]
        x, y = _eval_windows(data.val_ids, max(runnable), max(1, exp.eval_tokens // max(runnable)))
        losses = lm_loss(model, (x, y), reduction="none")
        per_position = losses.mean(0).view(-1, exp.position_bin).mean(1).tolist()
    return by_length, per_position


def _checkpoint(name: str) -> Path:
    # A path inside the installed package (companion/checkpoints/), not relative to the repository,
    # so it works in an editable install, after `pip install` and in Colab alike.
    path = Path(__file__).resolve().parent.parent / "checkpoints" / name
    if not path.is_file():
        raise FileNotFoundError(f"{name} is missing from companion/checkpoints: run scripts/ch03_train_extrapolation.py")
    return path


def load_extrapolation_results() -> dict[str, Any]:
    """The results written by ``scripts/ch03_train_extrapolation.py`` (found inside the installed package)."""
    return json.loads(_checkpoint(CHECKPOINT_JSON).read_text(encoding="utf-8"))


def load_position_lm(scheme: str, vocab_size: int) -> PositionLM:
    """The trained model of ``scheme`` from the shipped checkpoint, in float32 and eval mode."""
    if scheme not in POSITION_SCHEMES:
        raise ValueError(f"scheme must be one of {POSITION_SCHEMES}, got {scheme!r}")
    exp = ExperimentConfig(**{k: tuple(v) if isinstance(v, list) else v
                              for k, v in load_extrapolation_results()["config"].items()})
    with _checkpoint(CHECKPOINT_WEIGHTS).open("rb") as fh:
        states = torch.load(fh, map_location="cpu", weights_only=True)
    model = PositionLM(PositionLMConfig(vocab_size, position=scheme, max_positions=exp.train_length))
    model.load_state_dict({k: v.float() for k, v in states[scheme].items()})
    return model.eval()
