"""Masked-language-model pre-training of an encoder on the course corpus (Chapter 7).

The pieces, in the order the chapter uses them:

* :func:`corpus_documents` cuts the course corpus (:func:`companion.data.load_pydoc_text`)
  into documents (one per help topic) and each document into sentences;
* :func:`build_mlm_blocks` encodes the sentences with a WordPiece tokenizer and packs
  whole sentences into ``[CLS] ... [SEP]`` blocks (RoBERTa's FULL-SENTENCES inputs,
  :func:`companion.mlm.pack_full_sentences`), padded to one length;
* :func:`mlm_loss` and :func:`evaluate_mlm`: cross-entropy at the selected positions
  only (label ``-100`` elsewhere), and the masked-token accuracy;
* :func:`pretrain_mlm` trains with :func:`companion.training.train`, a fresh mask for
  every batch (:class:`companion.mlm.DynamicMasking`), and records the held-out
  loss and accuracy on a *fixed* masking of the held-out blocks;
* :func:`mlm_baselines`: what a model that ignores the context scores (always the
  most frequent token; the unigram distribution), the floor any encoder must beat.

Shape legend: N blocks, B batch, T block length, V vocabulary.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .mlm import IGNORE_INDEX, DynamicMasking, mask_tokens, pack_full_sentences
from .training import History, TrainConfig, train

__all__ = [
    "corpus_documents", "split_sentences", "MLMBlocks", "build_mlm_blocks", "mlm_loss", "evaluate_mlm",
    "split_blocks", "masked_batches", "MLMRecord", "pretrain_mlm", "load_tiny_bert", "mask_held_out", "mlm_baselines",
]

_HEADING = re.compile(r"^([^\n]+)\n\*{3,}$", re.M)  # a topic title underlined with asterisks
_RULE = re.compile(r"^\s*([*=\-~^+])\1{2,}\s*$")  # a line that only underlines (***, ===, ---)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")


def split_sentences(document: str) -> list[str]:
    """The sentences of one document: paragraphs (blank-line separated) cut after ``.``, ``!`` or ``?``.

    Wrapped lines of a paragraph are joined with spaces; underline rules (``*****``,
    ``-----``) are dropped. A code paragraph (no sentence end) stays one unit.
    """
    if not isinstance(document, str):
        raise TypeError(f"document must be a str, got {type(document).__name__}")
    sentences: list[str] = []
    for paragraph in re.split(r"\n\s*\n", document):
        lines = [ln.strip() for ln in paragraph.split("\n") if ln.strip() and not _RULE.match(ln)]
        if lines:
            sentences += [s for s in _SENTENCE_END.split(" ".join(lines)) if s]
    return sentences


def corpus_documents(text: str) -> list[list[str]]:
    """Documents of the pydoc corpus, one per top-level help topic, each a list of sentences.

    A topic starts at a title line underlined with asterisks. Text before the first
    title (none in the shipped corpus) is its own document.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("text must be a non-empty str")
    starts = [m.start() for m in _HEADING.finditer(text)]
    if not starts or starts[0] != 0:
        starts = [0] + starts
    bounds = starts + [len(text)]
    docs = [split_sentences(text[a:b]) for a, b in zip(bounds, bounds[1:])]
    return [d for d in docs if d]


@dataclass
class MLMBlocks:
    """Packed, padded pre-training inputs: ``input_ids`` and ``attention_mask``, both (N, T)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def n_tokens(self) -> int:
        """Real tokens (special tokens included, padding excluded)."""
        return int(self.attention_mask.sum())


def build_mlm_blocks(documents: list[list[str]], tokenizer, seq_len: int) -> MLMBlocks:
    """Encode every sentence with ``tokenizer`` (a :class:`~companion.tokenizers.wordpiece.WordPiece`)
    and pack whole sentences into blocks ``[CLS] s1 s2 ... [SEP]`` of at most ``seq_len`` tokens.

    A block may cross a document boundary, marked by an extra ``[SEP]``; blocks are
    padded with ``[PAD]`` (attention mask 0) to ``seq_len``.
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 3:
        raise ValueError(f"seq_len must be an int >= 3 ([CLS], one token, [SEP]), got {seq_len!r}")
    for name in ("cls_token", "sep_token", "pad_token", "tokenize", "token_to_id"):
        if not hasattr(tokenizer, name):
            raise TypeError(f"tokenizer must be a WordPiece tokenizer (no {name!r}), got {type(tokenizer).__name__}")
    cls_id, sep_id, pad_id = (tokenizer.token_to_id(t) for t in
                              (tokenizer.cls_token, tokenizer.sep_token, tokenizer.pad_token))
    encoded = [[[tokenizer.token_to_id(t) for t in tokenizer.tokenize(s)] for s in doc] for doc in documents]
    encoded = [[s for s in doc if s] for doc in encoded]
    blocks = pack_full_sentences([d for d in encoded if d], seq_len - 2, sep_id=sep_id)
    ids = torch.full((len(blocks), seq_len), pad_id, dtype=torch.long)
    mask = torch.zeros((len(blocks), seq_len), dtype=torch.long)
    for i, b in enumerate(blocks):
        row = [cls_id] + b + [sep_id]
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
    return MLMBlocks(ids, mask)


def split_blocks(blocks: MLMBlocks, every: int = 10) -> tuple[MLMBlocks, MLMBlocks]:
    """``(train, held_out)``: every ``every``-th block (the last of each run of ``every``) is held out.

    Blocks are consecutive stretches of text, so a held-out block shares no sentence
    with a training block.
    """
    if isinstance(every, bool) or not isinstance(every, int) or every < 2:
        raise ValueError(f"every must be an int >= 2, got {every!r}")
    held = torch.arange(len(blocks)) % every == every - 1
    if not held.any():
        raise ValueError(f"{len(blocks)} blocks are too few to hold out every {every}-th one")
    return (MLMBlocks(blocks.input_ids[~held], blocks.attention_mask[~held]),
            MLMBlocks(blocks.input_ids[held], blocks.attention_mask[held]))


def _logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    out = model(input_ids, attention_mask)
    logits = out.mlm_logits if hasattr(out, "mlm_logits") else out
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        raise TypeError("model must return (B, T, V) logits or an output with .mlm_logits")
    return logits


def mlm_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy over the selected positions of ``batch = (input_ids, attention_mask, labels)``.

    Only the selected rows of the hidden states reach the vocabulary projection's
    loss; positions labelled ``-100`` contribute nothing.
    """
    input_ids, attention_mask, labels = batch
    logits = _logits(model, input_ids, attention_mask)  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


@torch.no_grad()
def evaluate_mlm(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
                 *, batch_size: int = 64) -> tuple[float, float]:
    """Held-out ``(loss, accuracy)`` over every selected position (label != -100), in eval mode."""
    if input_ids.shape != labels.shape or input_ids.shape != attention_mask.shape:
        raise ValueError(f"input_ids, attention_mask and labels must share one shape, got "
                         f"{tuple(input_ids.shape)}, {tuple(attention_mask.shape)}, {tuple(labels.shape)}")
    was_training = model.training
    model.eval()
    total, correct, count = 0.0, 0, 0
    for i in range(0, len(input_ids), batch_size):
        sl = slice(i, i + batch_size)
        logits = _logits(model, input_ids[sl], attention_mask[sl])
        lab = labels[sl]
        sel = lab != IGNORE_INDEX
        total += float(F.cross_entropy(logits[sel], lab[sel], reduction="sum"))
        correct += int((logits[sel].argmax(-1) == lab[sel]).sum())
        count += int(sel.sum())
    model.train(was_training)
    if count == 0:
        raise ValueError("no position is selected (every label is -100)")
    return total / count, correct / count


@dataclass
class MLMRecord:
    """What :func:`pretrain_mlm` measured: the training history plus held-out accuracy at each evaluation."""

    history: History
    eval_accuracy: list[float] = field(default_factory=list)


def masked_batches(blocks: MLMBlocks, batch_size: int, *, seed: int = 0, **mask_args):
    """``get_batch(step) -> (masked_ids, attention_mask, labels)``: random blocks, masked afresh each time.

    The block draws and the masks come from two generators seeded from ``seed``, so
    two loops built with the same seed see the same batches and the same masks.
    ``mask_args`` go to :class:`companion.mlm.DynamicMasking` (``mask_id``,
    ``special_ids``, ``vocab_size``, ...).
    """
    if len(blocks) == 0:
        raise ValueError("blocks is empty")
    gen = torch.Generator().manual_seed(seed)
    masker = DynamicMasking(seed=seed + 1, **mask_args)

    def get_batch(step: int):
        idx = torch.randint(len(blocks), (batch_size,), generator=gen)
        ids, att = blocks.input_ids[idx], blocks.attention_mask[idx]
        masked, labels = masker(ids, att)
        return masked, att, labels

    return get_batch


def pretrain_mlm(model: nn.Module, train_blocks: MLMBlocks, held_out: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                 cfg: TrainConfig, *, batch_size: int, mask_id: int, special_ids: list[int], vocab_size: int,
                 seed: int = 0, progress: bool = True) -> MLMRecord:
    """Masked-LM pre-training: random batches of blocks, each masked afresh (dynamic masking).

    ``held_out = (input_ids, attention_mask, labels)`` is masked once (fixed) so that
    every evaluation scores the same positions.
    """
    if len(train_blocks) == 0:
        raise ValueError("train_blocks is empty")
    get_batch = masked_batches(train_blocks, batch_size, seed=seed, mask_id=mask_id, special_ids=special_ids,
                               vocab_size=vocab_size)
    accuracy: list[float] = []

    def eval_fn(m: nn.Module) -> float:
        loss, acc = evaluate_mlm(m, *held_out)
        accuracy.append(acc)
        return loss

    hist = train(model, mlm_loss, get_batch, cfg, eval_fn=eval_fn, progress=progress, desc="MLM pre-training")
    return MLMRecord(hist, accuracy)


def mask_held_out(blocks: MLMBlocks, *, mask_id: int, special_ids: list[int], vocab_size: int,
                  seed: int = 1234) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One fixed masking of ``blocks``: ``(masked input_ids, attention_mask, labels)``."""
    gen = torch.Generator().manual_seed(seed)
    masked, labels = mask_tokens(blocks.input_ids, attention_mask=blocks.attention_mask, generator=gen,
                                 mask_id=mask_id, special_ids=special_ids, vocab_size=vocab_size)
    return masked, blocks.attention_mask, labels


def mlm_baselines(train_blocks: MLMBlocks, labels: torch.Tensor, special_ids: list[int],
                  vocab_size: int) -> dict[str, float]:
    """Context-free baselines on the held-out ``labels``: accuracy of always predicting the most
    frequent (non-special) training token, and the cross-entropy (nats) of the unigram distribution
    of the training tokens with add-one smoothing over the ``vocab_size`` ids."""
    special = {int(i) for i in special_ids}
    ids = train_blocks.input_ids[train_blocks.attention_mask.bool()].tolist()
    counts = Counter(i for i in ids if i not in special)
    if not counts:
        raise ValueError("train_blocks hold no non-special token")
    targets = labels[labels != IGNORE_INDEX]
    if targets.numel() == 0:
        raise ValueError("no position is selected (every label is -100)")
    if int(targets.max()) >= vocab_size or max(counts) >= vocab_size:
        raise ValueError(f"ids must lie below vocab_size={vocab_size}")
    top = counts.most_common(1)[0][0]
    freq = torch.ones(vocab_size, dtype=torch.float64)
    for i, c in counts.items():
        freq[i] += c
    logp = (freq / freq.sum()).log()
    return {"most_frequent_accuracy": float((targets == top).double().mean()),
            "unigram_loss": float(-logp[targets].mean())}


def load_tiny_bert(name: str = "ch07_tiny_bert"):
    """The tiny BERT pre-trained by ``scripts/ch07_pretrain_bert.py``: ``(BertForMaskedLM, WordPiece)``, in eval mode.

    ``name``: a checkpoint shipped in ``companion/checkpoints`` or a path ending in ``.pt``.
    Weights are stored in float16 to keep the package small and cast back to float32 here.
    """
    from .checkpoints import load_checkpoint
    from .models.bert import BertConfig, BertForMaskedLM
    from .tokenizers.wordpiece import WordPiece

    ckpt = torch.load(name, map_location="cpu", weights_only=True) if str(name).endswith(".pt") \
        else load_checkpoint(name)
    model = BertForMaskedLM(BertConfig(**ckpt["config"]))
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in ckpt["state_dict"].items()})
    return model.eval(), WordPiece(ckpt["vocab"])
