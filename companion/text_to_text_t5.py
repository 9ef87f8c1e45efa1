"""Train one small T5 on the prefixed toy tasks of :mod:`companion.text_to_text` (Chapter 11).

A character-level vocabulary (:class:`CharVocab`: padding 0, EOS 1, unknown 2,
the characters of the tasks, then sentinels ``<extra_id_0>``... at the end as
in T5) turns ``"sort: 3 1 4" -> "1 3 4"`` pairs into id tensors; one
:class:`~companion.models.encoder_decoder.EncoderDecoder` with a T5 config
learns all three tasks at once, told apart only by the prefix.

``scripts/ch11_text_to_text.py`` runs :func:`train_text_to_text` once and
ships ``companion/checkpoints/ch11_text_to_text.pt`` (weights) and ``.json``
(config, per-task exact match, learning curve, wall time); the chapter loads
both with :func:`load_text_to_text`.

:func:`pretrain_span_corruption` first trains the same model by span corruption
(T5's objective, :mod:`companion.span_corruption`) on windows of the course
corpus in the same characters; ``train_text_to_text(recipe, model=...)`` then
continues from it. ``scripts/ch11_pretraining.py`` compares the two starts over
three seeds and records the runs in ``ch11_pretraining.json``
(:func:`load_pretraining_record`).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

import torch

from ._checks import check_positive_int
from .models.encoder_decoder import EncoderDecoder, EncoderDecoderConfig, generate_seq2seq
from .models.transformer import seq2seq_loss
from .models.t5 import t5_config
from .text_to_text import TASKS, make_example
from .device import to_device
from .training import TrainConfig, train

__all__ = ["CharVocab", "TextToTextRecipe", "encode_pairs", "exact_match_by_task", "heldout_pairs", "training_inputs",
           "round_to_float16", "evaluate_heldout", "train_text_to_text", "load_text_to_text", "CHECKPOINT",
           "corpus_characters", "span_corruption_batch", "training_examples", "pretrain_span_corruption", "load_pretraining_record",
           "PRETRAINING_RECORD", "PRETRAINING_CONTROL_RECORD", "CONTROL_EXAMPLES"]

CHECKPOINT = "ch11_text_to_text"
PRETRAINING_RECORD = "ch11_pretraining"  # scripts/ch11_pretraining.py: with and without span corruption, three seeds
# scripts/ch11_pretraining.py --control tasks: the pre-trained arm again, span corruption over the tasks' own strings
PRETRAINING_CONTROL_RECORD = "ch11_pretraining_control"
CONTROL_EXAMPLES = 20_000  # the control's text: this many examples of the seed's training stream
CHARS = "0123456789 +:abcdefghijklmnopqrstuvwxyz"


class CharVocab:
    """Characters as ids: 0 padding, 1 EOS, 2 unknown, then :data:`CHARS`, then ``n_sentinels`` sentinels."""

    pad_id, eos_id, unk_id = 0, 1, 2

    def __init__(self, chars: str = CHARS, n_sentinels: int = 8) -> None:
        if len(set(chars)) != len(chars):
            raise ValueError("chars must not repeat a character")
        self.chars = chars
        self.n_sentinels = check_positive_int("n_sentinels", n_sentinels)
        self._index = {c: 3 + i for i, c in enumerate(chars)}
        self.size = 3 + len(chars) + n_sentinels

    def __len__(self) -> int:
        return self.size

    def sentinel(self, i: int) -> int:
        """Id of ``<extra_id_i>``: counting down from the end of the vocabulary, as in T5."""
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.n_sentinels:
            raise ValueError(f"sentinel index must be an int in [0, {self.n_sentinels}), got {i!r}")
        return self.size - 1 - i

    def encode(self, text: str, *, eos: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return [self._index.get(c, self.unk_id) for c in text] + ([self.eos_id] if eos else [])

    def decode(self, ids) -> str:
        """Characters up to the first EOS; padding and the decoder start are skipped."""
        out = []
        for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids):
            if i == self.eos_id:
                break
            if i >= 3 + len(self.chars):
                out.append(f"<extra_id_{self.size - 1 - i}>")
            elif i >= 3:
                out.append(self.chars[i - 3])
        return "".join(out)


def _right_pad(rows: list[list[int]], pad_id: int) -> torch.Tensor:
    """Lists of ids as one (B, L) tensor, right-padded with ``pad_id`` to the longest row."""
    out = torch.full((len(rows), max(map(len, rows))), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r)
    return out


def encode_pairs(vocab: CharVocab, pairs: list[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(src, src_mask, tgt)``: inputs and targets with EOS, right-padded with 0; each ``(B, L)``."""
    if not pairs:
        raise ValueError("pairs must hold at least one (input, target) pair")
    src = [vocab.encode(x) for x, _ in pairs]
    tgt = [vocab.encode(y) for _, y in pairs]

    s = _right_pad(src, vocab.pad_id)
    return s, s != vocab.pad_id, _right_pad(tgt, vocab.pad_id)


@torch.no_grad()
def exact_match_by_task(model: EncoderDecoder, vocab: CharVocab, pairs: list[tuple[str, str]], *,
                        batch_size: int = 256) -> dict[str, float]:
    """Fraction of ``pairs`` whose greedy output equals the target exactly, per task (the input's prefix)."""
    hits: dict[str, list[bool]] = {}
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        src, mask, tgt = to_device(encode_pairs(vocab, chunk), next(model.parameters()).device)
        out = generate_seq2seq(model, src, src_attention_mask=mask, max_new_tokens=tgt.shape[1] + 2).cpu()
        for (x, y), row in zip(chunk, out):
            hits.setdefault(x.split(":")[0], []).append(vocab.decode(row[1:]) == y)
    return {task: sum(h) / len(h) for task, h in hits.items()}


@dataclass(frozen=True)
class TextToTextRecipe:
    """Everything that fixes a run: model sizes, optimisation, data."""

    d_model: int = 128
    d_kv: int = 32
    n_heads: int = 4
    d_ff: int = 512
    n_layers: int = 3
    version: str = "1.0"
    # T5's 32 buckets are exact only up to distance 7 in the encoder; 64 buckets with max_distance 64
    # are exact up to 15, the whole span of the digits. With 32 buckets (2 layers, 1500 steps) reverse
    # stayed at 0% exact match, sort at 18%; with 64 buckets and 2 layers, the same.
    n_buckets: int = 64
    max_distance: int = 64
    train: TrainConfig = field(default_factory=lambda: TrainConfig(steps=2700, lr=2e-3, warmup_steps=100,
                                                                   weight_decay=0.01, eval_every=250))
    batch_size: int = 64
    seed: int = 0
    n_heldout: int = 600  # per task
    n_monitor: int = 100  # per task, for the learning curve

    def model_config(self, vocab: CharVocab) -> EncoderDecoderConfig:
        return t5_config(len(vocab), d_model=self.d_model, d_kv=self.d_kv, d_ff=self.d_ff, n_layers=self.n_layers,
                         n_heads=self.n_heads, version=self.version, dropout=0.0, max_positions=64,
                         n_buckets=self.n_buckets, max_distance=self.max_distance,
                         pad_id=vocab.pad_id, eos_id=vocab.eos_id)


def heldout_pairs(n_per_task: int, seed: int, exclude: set[str] = frozenset()) -> list[tuple[str, str]]:
    """``n_per_task`` examples of each task whose inputs are not in ``exclude`` (inputs seen in training)."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    for task in TASKS:
        seen: set[str] = set()
        while len(seen) < n_per_task:
            x, y = make_example(task, rng)
            if x not in exclude and x not in seen:
                seen.add(x)
                out.append((x, y))
    return out


def training_examples(seed: int, n: int) -> list[tuple[str, str]]:
    """The first ``n`` (input, target) pairs of the training stream of seed ``seed``, in the order
    :func:`train_text_to_text` draws them (``random.Random(seed)``, the tasks in turn)."""
    rng = random.Random(seed)
    return [make_example(TASKS[i % len(TASKS)], rng) for i in range(n)]


def training_inputs(recipe: TextToTextRecipe) -> set[str]:
    """Every input the training stream of ``recipe`` shows (replayed from its seed, as :func:`train_text_to_text` draws them)."""
    return {x for x, _ in training_examples(recipe.seed, recipe.train.steps * recipe.batch_size)}


@torch.no_grad()
def round_to_float16(model: torch.nn.Module) -> torch.nn.Module:
    """Round every parameter to float16 precision (kept as float32): the precision the checkpoint is stored in."""
    for p in model.parameters():
        p.copy_(p.half().float())
    return model


def evaluate_heldout(model: EncoderDecoder, vocab: CharVocab, recipe: TextToTextRecipe) -> dict[str, float]:
    """Exact match per task on ``recipe.n_heldout`` examples per task whose inputs training never showed."""
    test = heldout_pairs(recipe.n_heldout, seed=recipe.seed + 2000, exclude=training_inputs(recipe))
    return exact_match_by_task(model, vocab, test)


def corpus_characters(vocab: CharVocab, text: str | None = None) -> str:
    """The course corpus (``companion.corpus``) in ``vocab``'s characters: lower-cased, every other
    character (punctuation, newlines) turned into a space, runs of spaces collapsed to one."""
    if text is None:
        from .corpus import load_text
        text = load_text()
    allowed = set(vocab.chars)
    return " ".join("".join(c if c in allowed else " " for c in text.lower()).split())


def span_corruption_batch(vocab: CharVocab, text: str, batch_size: int, length: int, generator: torch.Generator, *,
                          noise_density: float = 0.15, mean_noise_span_length: float = 3.0):
    """``(src, src_mask, tgt)`` of ``batch_size`` span-corrupted windows of ``length`` characters of ``text``.

    Each window starts at a random character; :func:`~companion.span_corruption.random_spans_noise_mask`
    chooses its noise spans and :func:`~companion.span_corruption.span_corrupt` writes the input (spans
    replaced by ``vocab``'s sentinels) and the target (each sentinel, then its span); both end with EOS.
    """
    from .span_corruption import random_spans_noise_mask, span_corrupt

    starts = torch.randint(0, len(text) - length, (batch_size,), generator=generator).tolist()
    src, tgt = [], []
    for s in starts:
        ids = vocab.encode(text[s : s + length], eos=False)
        mask = random_spans_noise_mask(length, noise_density, mean_noise_span_length, generator=generator)
        x, y = span_corrupt(ids, mask, len(vocab), vocab.eos_id)
        src.append(x)
        tgt.append(y)

    s = _right_pad(src, vocab.pad_id)
    return s, s != vocab.pad_id, _right_pad(tgt, vocab.pad_id)


def pretrain_span_corruption(recipe: TextToTextRecipe, cfg: TrainConfig, *, length: int = 48,
                             text: str | None = None, progress: bool = False,
                             device: str | torch.device | None = None) -> dict[str, Any]:
    """Build the model of ``recipe`` (seeded as :func:`train_text_to_text` seeds it) and pre-train it by span
    corruption on windows of ``length`` characters of the course corpus, ``cfg.steps`` steps of
    ``recipe.batch_size`` windows.

    Returns ``model`` (on the CPU, ready for ``train_text_to_text(recipe, model=...)``), ``vocab`` and
    ``record`` (steps, final training loss, wall time).
    """
    torch.manual_seed(recipe.seed)
    vocab = CharVocab()
    model = EncoderDecoder(recipe.model_config(vocab))
    chars = corpus_characters(vocab, text)
    gen = torch.Generator().manual_seed(recipe.seed + 3000)

    def loss_fn(m, batch):
        src, mask, tgt = batch
        return seq2seq_loss(m, src, tgt, bos_id=m.cfg.decoder_start_id, src_attention_mask=mask)

    t0 = time.perf_counter()
    hist = train(model, loss_fn, lambda step: span_corruption_batch(vocab, chars, recipe.batch_size, length, gen),
                 cfg, progress=progress, desc="span corruption", device=device)
    wall = time.perf_counter() - t0
    tail = hist.train_loss[-50:]
    record = dict(steps=cfg.steps, length=length, final_train_loss=round(sum(tail) / len(tail), 4),
                  wall_time_s=round(wall, 1))
    return dict(model=model.cpu(), vocab=vocab, record=record)


def train_text_to_text(recipe: TextToTextRecipe = TextToTextRecipe(), *, progress: bool = False,
                       device: str | torch.device | None = None,
                       model: EncoderDecoder | None = None) -> dict[str, Any]:
    """Train one T5 on the mixture of :data:`companion.text_to_text.TASKS` and evaluate it.

    Training draws fresh examples (tasks in turn) from a seeded stream; the
    held-out sets contain only inputs never seen in training. The weights are
    rounded to float16 precision (the checkpoint's) before the final evaluation. Returns a dict with
    ``model``, ``vocab`` and ``record`` (JSON-ready: config, steps, learning
    curve of per-task exact match on a monitoring set, final held-out exact
    match per task, wall time of the training loop). ``device`` (e.g. ``pick_device()``) trains and
    evaluates there; the model comes back on the CPU. Without it everything runs where it did (the CPU).
    ``model`` (e.g. from :func:`pretrain_span_corruption`) starts training from its weights instead of a
    fresh initialisation; the data stream and the held-out sets are the same.
    """
    torch.manual_seed(recipe.seed)
    vocab = CharVocab()
    if model is None:
        model = EncoderDecoder(recipe.model_config(vocab))
    elif model.cfg != recipe.model_config(vocab):
        raise ValueError("model's config differs from recipe.model_config(CharVocab())")
    rng = random.Random(recipe.seed)
    seen_inputs: set[str] = set()

    def get_batch(step: int):
        pairs = [make_example(TASKS[(step * recipe.batch_size + i) % len(TASKS)], rng) for i in range(recipe.batch_size)]
        seen_inputs.update(x for x, _ in pairs)
        return encode_pairs(vocab, pairs)

    def loss_fn(m, batch):
        src, mask, tgt = batch
        return seq2seq_loss(m, src, tgt, bos_id=m.cfg.decoder_start_id, src_attention_mask=mask)

    monitor = heldout_pairs(recipe.n_monitor, seed=recipe.seed + 1000)
    curve: list[dict[str, Any]] = []

    def eval_fn(m):
        src, mask, tgt = to_device(encode_pairs(vocab, monitor), device)
        loss = float(loss_fn(m, (src, mask, tgt)))
        curve.append(dict(loss=round(loss, 4), exact_match=exact_match_by_task(m, vocab, monitor)))
        return loss

    t0 = time.perf_counter()
    hist = train(model, loss_fn, get_batch, recipe.train, eval_fn=eval_fn, progress=progress, desc="text-to-text",
                 device=device)
    wall = time.perf_counter() - t0
    for point, step in zip(curve, hist.eval_steps):
        point["step"] = step
    # The checkpoint stores float16 weights (half the file); the held-out numbers are those of exactly these weights.
    round_to_float16(model)
    record = dict(
        recipe={k: v for k, v in asdict(recipe).items() if k != "train"}, train=asdict(recipe.train),
        model_config=asdict(model.cfg), n_parameters=sum(p.numel() for p in model.parameters()),
        steps=recipe.train.steps, examples_seen=recipe.train.steps * recipe.batch_size,
        distinct_training_inputs=len(seen_inputs), heldout_per_task=recipe.n_heldout,
        exact_match=evaluate_heldout(model, vocab, recipe), weights="float16", curve=curve,
        final_train_loss=round(sum(hist.train_loss[-50:]) / len(hist.train_loss[-50:]), 4),
        wall_time_s=round(wall, 1), threads=torch.get_num_threads(),
    )
    return dict(model=model.cpu().eval(), vocab=vocab, record=record)


def load_text_to_text() -> tuple[EncoderDecoder, CharVocab, dict[str, Any]]:
    """``(model, vocab, record)`` of the shipped run of ``scripts/ch11_text_to_text.py``."""
    from .checkpoints import load_checkpoint

    ckpt = load_checkpoint(CHECKPOINT)
    record = json.loads((resources.files("companion.checkpoints") / f"{CHECKPOINT}.json").read_text(encoding="utf-8"))
    model = EncoderDecoder(EncoderDecoderConfig(**ckpt["config"]))
    model.load_state_dict({k: v.float() for k, v in ckpt["state_dict"].items()})  # stored as float16
    vocab = CharVocab(ckpt["chars"], ckpt["n_sentinels"])
    return model.eval(), vocab, record


def load_pretraining_record(control: bool = False) -> dict[str, Any]:
    """The record of ``scripts/ch11_pretraining.py``: its protocol and one entry per run (seed, pre-trained or not,
    held-out exact match per task, learning curve, times).

    ``control=True``: the record of ``--control tasks`` (pre-trained runs only, span corruption over the tasks'
    own strings instead of the course corpus).
    """
    ref = resources.files("companion.checkpoints") / f"{PRETRAINING_CONTROL_RECORD if control else PRETRAINING_RECORD}.json"
    return json.loads(ref.read_text(encoding="utf-8"))
