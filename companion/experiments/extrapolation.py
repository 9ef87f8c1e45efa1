"""Chapter 3's length-extrapolation experiment: six :class:`~companion.models.small_lm.SmallLM`
(one per positional scheme) trained on windows of one length and scored on longer ones.

The model lives in :mod:`companion.models.small_lm`; this module holds the
experiment around it: its configuration, the data, training one model,
evaluating by length, and loading the results and weights shipped in
``companion/checkpoints`` (written by ``scripts/ch03_train_extrapolation.py``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..data import CharTokenizer, load_pydoc_text, random_batch, train_val_split
from ..models.small_lm import POSITION_SCHEMES, SmallLM, SmallLMConfig
from ..training import History, TrainConfig, lm_loss, train

__all__ = [
    "ExperimentConfig",
    "ExtrapolationData",
    "make_data",
    "model_config",
    "train_position_lm",
    "evaluate_lengths",
    "load_extrapolation_results",
    "load_position_lm",
]


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


# The experiment's model: two pre-LN GELU layers with PyTorch's initialisation and no bias in the head.
MODEL = dict(n_layers=2, activation="gelu", init="torch", head_bias=False)


def model_config(scheme: str, vocab_size: int, exp: ExperimentConfig, **model_kwargs: Any) -> SmallLMConfig:
    """The :class:`SmallLMConfig` of the experiment's model with positional ``scheme``."""
    return SmallLMConfig(vocab_size, max_positions=exp.train_length, position=scheme, **{**MODEL, **model_kwargs})


def train_position_lm(
    scheme: str, exp: ExperimentConfig, data: ExtrapolationData, *, steps: int | None = None, progress: bool = True,
    **model_kwargs: Any,
) -> tuple[SmallLM, History]:
    """Train one :class:`SmallLM` with positional ``scheme`` on windows of ``exp.train_length``."""
    steps = exp.steps if steps is None else steps
    torch.manual_seed(exp.seed)
    model = SmallLM(model_config(scheme, data.tokenizer.vocab_size, exp, **model_kwargs))
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
    model: SmallLM, data: ExtrapolationData, exp: ExperimentConfig, lengths: tuple[int, ...] | None = None,
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


def load_position_lm(scheme: str, vocab_size: int) -> SmallLM:
    """The trained model of ``scheme`` from the shipped checkpoint, in float32 and eval mode."""
    if scheme not in POSITION_SCHEMES:
        raise ValueError(f"scheme must be one of {POSITION_SCHEMES}, got {scheme!r}")
    exp = ExperimentConfig(**{k: tuple(v) if isinstance(v, list) else v
                              for k, v in load_extrapolation_results()["config"].items()})
    with _checkpoint(CHECKPOINT_WEIGHTS).open("rb") as fh:
        states = torch.load(fh, map_location="cpu", weights_only=True)
    model = SmallLM(model_config(scheme, vocab_size, exp))
    model.load_state_dict({k: v.float() for k, v in states[scheme].items()}, strict=True)
    return model.eval()
