"""Pre-training data for encoders: masked-language-model (MLM) masking, next-sentence pairs, packing.

BERT (Devlin et al., 2019, section 3.1 and appendix A.1) selects 15% of the
token positions at random; a selected position is replaced by ``[MASK]`` 80%
of the time, by a random token 10% of the time and left unchanged 10% of the
time, and the loss is computed only at the selected positions (label ``-100``,
PyTorch's ``ignore_index``, everywhere else). Special tokens (``[CLS]``,
``[SEP]``) and padding are never selected.

The random part is split from the deterministic part so it can be checked by
hand: :func:`apply_mlm_draws` takes the uniform draws as inputs, and
:func:`mask_tokens` makes the draws with a ``torch.Generator`` and calls it.

Two details differ between implementations; both are options here:

* selection: each eligible position independently with probability 0.15
  (Hugging Face's ``DataCollatorForLanguageModeling``, a Bernoulli draw per
  token) -- what :func:`mask_tokens` does. Google's ``create_pretraining_data.py``
  instead shuffles the candidate positions and takes exactly
  ``min(max_predictions_per_seq, max(1, round(0.15 * len(tokens))))`` of them,
  where ``len(tokens)`` counts [CLS] and [SEP] too, so the fraction of eligible
  tokens is close to 0.15, not exactly 0.15, and is capped by ``max_predictions_per_seq``;
* random replacement: Hugging Face draws from the *whole* vocabulary
  (``torch.randint(len(tokenizer), ...)``, special tokens included), and so does
  Google's ``create_pretraining_data.py``; here the default draws from the
  non-special ids only (``random_ids``), so ``[MASK]`` or ``[PAD]`` never appear as
  a "random word". Pass ``random_ids=range(vocab_size)`` for Hugging Face's choice.

Next-sentence prediction (NSP) pairs: :func:`make_nsp_pairs` (label 0 =
IsNext, 1 = NotNext, Hugging Face's ``next_sentence_label`` convention).
RoBERTa (Liu et al., 2019, sections 4.1-4.2) replaced BERT's *static* masking
(the data duplicated 10 times, each copy with its own mask, fixed for the
whole training: :func:`static_masking`) by *dynamic* masking (a fresh mask
every time a sequence is fed: :class:`DynamicMasking`), and NSP pairs by
FULL-SENTENCES packing (:func:`pack_full_sentences`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from ._checks import check_token_ids

__all__ = [
    "IGNORE_INDEX", "MaskingDraws", "draw_mlm", "apply_mlm_draws", "mask_tokens", "special_tokens_mask",
    "static_masking", "DynamicMasking", "NSPPair", "make_nsp_pairs", "pack_full_sentences",
]

IGNORE_INDEX = -100  # label of positions without a loss (torch.nn.functional.cross_entropy's default ignore_index)


def _check_ids(name: str, x: object) -> torch.Tensor:
    """Token ids of shape (T,) or (B, T): :func:`companion._checks.check_token_ids`'s rule, with either rank."""
    return check_token_ids(name, x, None, ("T",) if isinstance(x, torch.Tensor) and x.dim() == 1 else ("B", "T"))


def _check_fraction(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


def special_tokens_mask(input_ids: torch.Tensor, special_ids: Iterable[int],
                        attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean tensor, True where a position may **not** be selected: a special id, or padding (mask 0)."""
    input_ids = _check_ids("input_ids", input_ids)
    special = torch.tensor(sorted({int(i) for i in special_ids}), dtype=input_ids.dtype, device=input_ids.device)
    blocked = torch.isin(input_ids, special)
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
            got = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__
            raise ValueError(f"attention_mask must be a tensor of the shape of input_ids {tuple(input_ids.shape)}, got {got}")
        blocked |= attention_mask == 0
    return blocked


@dataclass(frozen=True)
class MaskingDraws:
    """The random numbers one MLM masking needs, all of the shape of ``input_ids``.

    ``select`` and ``action`` are uniform in [0, 1); ``random_tokens`` are the
    replacement ids used where the action is "random token".
    """

    select: torch.Tensor
    action: torch.Tensor
    random_tokens: torch.Tensor


def draw_mlm(shape: Sequence[int], random_ids: torch.Tensor, generator: torch.Generator | None = None) -> MaskingDraws:
    """Draw the uniforms and the candidate random tokens for one masking of a tensor of ``shape``."""
    random_ids = torch.as_tensor(random_ids, dtype=torch.long)
    if random_ids.dim() != 1 or random_ids.numel() == 0:
        raise ValueError(f"random_ids must be a non-empty 1-D list of ids, got shape {tuple(random_ids.shape)}")
    select = torch.rand(tuple(shape), generator=generator)
    action = torch.rand(tuple(shape), generator=generator)
    pick = torch.randint(random_ids.numel(), tuple(shape), generator=generator)
    return MaskingDraws(select, action, random_ids[pick])


def apply_mlm_draws(
    input_ids: torch.Tensor,
    draws: MaskingDraws,
    blocked: torch.Tensor,
    mask_id: int,
    *,
    mlm_probability: float = 0.15,
    mask_fraction: float = 0.8,
    random_fraction: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The deterministic half of MLM masking: returns ``(masked_input_ids, labels)``.

    A position is selected when it is not ``blocked`` and ``draws.select < mlm_probability``.
    A selected position becomes ``mask_id`` when ``draws.action < mask_fraction``,
    ``draws.random_tokens`` when ``mask_fraction <= action < mask_fraction + random_fraction``,
    and keeps its token otherwise. Labels hold the original id at selected
    positions and :data:`IGNORE_INDEX` elsewhere. ``input_ids`` is not modified.
    """
    input_ids = _check_ids("input_ids", input_ids)
    p = _check_fraction("mlm_probability", mlm_probability)
    fm = _check_fraction("mask_fraction", mask_fraction)
    fr = _check_fraction("random_fraction", random_fraction)
    if fm + fr > 1.0 + 1e-12:
        raise ValueError(f"mask_fraction + random_fraction must be at most 1, got {fm} + {fr} = {fm + fr}")
    for name in ("select", "action", "random_tokens"):
        t = getattr(draws, name)
        if not isinstance(t, torch.Tensor) or t.shape != input_ids.shape:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"draws.{name} must have the shape of input_ids {tuple(input_ids.shape)}, got {got}")
    if not isinstance(blocked, torch.Tensor) or blocked.shape != input_ids.shape or blocked.dtype != torch.bool:
        raise ValueError(f"blocked must be a bool tensor of the shape of input_ids {tuple(input_ids.shape)}")
    selected = (draws.select < p) & ~blocked
    to_mask = selected & (draws.action < fm)
    to_random = selected & (draws.action >= fm) & (draws.action < fm + fr)
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    out = input_ids.clone()
    out[to_mask] = mask_id
    out[to_random] = draws.random_tokens.to(out.dtype)[to_random]
    return out, labels


def mask_tokens(
    input_ids: torch.Tensor,
    *,
    mask_id: int,
    special_ids: Iterable[int],
    vocab_size: int,
    attention_mask: torch.Tensor | None = None,
    random_ids: Sequence[int] | torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    mlm_probability: float = 0.15,
    mask_fraction: float = 0.8,
    random_fraction: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's MLM masking of a batch: returns ``(masked_input_ids, labels)``.

    Never selects ``special_ids`` nor padding (``attention_mask == 0``). Random
    replacements come from ``random_ids`` (default: every id below ``vocab_size``
    that is not in ``special_ids``). Pass a seeded ``torch.Generator`` for a
    reproducible masking.
    """
    input_ids = _check_ids("input_ids", input_ids)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= 0:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
    special = {int(i) for i in special_ids}
    if int(mask_id) not in special:
        raise ValueError(f"mask_id {mask_id} must be one of special_ids {sorted(special)}")
    if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab_size):
        raise ValueError(f"input_ids must lie in [0, vocab_size={vocab_size}), got values in "
                         f"[{int(input_ids.min())}, {int(input_ids.max())}]")
    if random_ids is None:
        random_ids = [i for i in range(vocab_size) if i not in special]
    draws = draw_mlm(input_ids.shape, torch.as_tensor(random_ids, dtype=torch.long), generator)
    blocked = special_tokens_mask(input_ids, special, attention_mask)
    return apply_mlm_draws(input_ids, draws, blocked, int(mask_id), mlm_probability=mlm_probability,
                           mask_fraction=mask_fraction, random_fraction=random_fraction)


def static_masking(input_ids: torch.Tensor, *, dupe_factor: int = 10, generator: torch.Generator | None = None,
                   **mask_kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's static masking: ``dupe_factor`` copies of the batch, each masked once, fixed for all epochs.

    ``input_ids`` has shape (B, T); returns ``(masked, labels)`` of shape
    (dupe_factor * B, T): rows ``k*B .. k*B+B-1`` are copy ``k``. Google's
    ``create_pretraining_data.py`` uses ``dupe_factor=10``; RoBERTa (section 4.1)
    calls this the static baseline. Other arguments as for :func:`mask_tokens`.
    """
    input_ids = _check_ids("input_ids", input_ids)
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape (B, T), got {tuple(input_ids.shape)}")
    if isinstance(dupe_factor, bool) or not isinstance(dupe_factor, int) or dupe_factor <= 0:
        raise ValueError(f"dupe_factor must be a positive int, got {dupe_factor!r}")
    attention = mask_kwargs.pop("attention_mask", None)
    outs, labels = [], []
    for _ in range(dupe_factor):
        o, lab = mask_tokens(input_ids, attention_mask=attention, generator=generator, **mask_kwargs)
        outs.append(o)
        labels.append(lab)
    return torch.cat(outs), torch.cat(labels)


class DynamicMasking:
    """RoBERTa's dynamic masking: each call masks the batch afresh (a new mask every time a sequence is seen).

    >>> masker = DynamicMasking(mask_id=3, special_ids=[0, 1, 2, 3], vocab_size=50, seed=0)
    >>> x = torch.randint(4, 50, (2, 9))
    >>> (a, _), (b, _) = masker(x), masker(x)   # two epochs: two different masks (almost surely)

    Keyword arguments are those of :func:`mask_tokens`.
    """

    def __init__(self, *, seed: int | None = None, **mask_kwargs) -> None:
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)
        self.mask_kwargs = mask_kwargs

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        return mask_tokens(input_ids, attention_mask=attention_mask, generator=self.generator, **self.mask_kwargs)


@dataclass(frozen=True)
class NSPPair:
    """Two segments for next-sentence prediction; ``label`` 0 = IsNext (B follows A), 1 = NotNext."""

    a: list
    b: list
    label: int


def _check_documents(documents: object) -> list[list]:
    if not isinstance(documents, (list, tuple)) or not all(isinstance(d, (list, tuple)) for d in documents):
        raise TypeError("documents must be a list of documents, each a list of sentences")
    return [list(d) for d in documents]


def make_nsp_pairs(documents: Sequence[Sequence], *, generator: torch.Generator | None = None,
                   not_next_probability: float = 0.5) -> list[NSPPair]:
    """One NSP pair per pair of consecutive sentences of every document.

    For sentence ``i`` of a document, A is sentence ``i``; with probability
    ``1 - not_next_probability`` B is sentence ``i + 1`` (IsNext, label 0), otherwise
    B is a random sentence of a *different* document (NotNext, label 1), as in
    BERT section 3.1. Sentences can be anything (strings, lists of ids). At least
    two documents are needed to draw a NotNext pair.
    """
    docs = _check_documents(documents)
    p = _check_fraction("not_next_probability", not_next_probability)
    if len(docs) < 2:
        raise ValueError(f"need at least 2 documents (NotNext draws B from another document), got {len(docs)}")
    if any(len(d) == 0 for d in docs):
        raise ValueError("every document must hold at least one sentence")
    pairs = []
    for di, doc in enumerate(docs):
        for i in range(len(doc) - 1):
            if float(torch.rand((), generator=generator)) < p:
                other = int(torch.randint(len(docs) - 1, (), generator=generator))
                other += other >= di  # any document but this one
                j = int(torch.randint(len(docs[other]), (), generator=generator))
                pairs.append(NSPPair(doc[i], docs[other][j], 1))
            else:
                pairs.append(NSPPair(doc[i], doc[i + 1], 0))
    return pairs


def pack_full_sentences(documents: Sequence[Sequence[Sequence[int]]], seq_len: int, *, sep_id: int,
                        truncate_long: bool = True) -> list[list[int]]:
    """RoBERTa's FULL-SENTENCES inputs: whole sentences, taken in order, packed into blocks of at most ``seq_len``.

    Sentences (lists of ids) of consecutive documents are appended to the current
    block while they fit; a block may cross a document boundary, where one extra
    ``sep_id`` is inserted (RoBERTa, section 4.2). A sentence never splits between
    two blocks; one longer than ``seq_len`` alone is cut to ``seq_len``
    (``truncate_long=True``) or raises. Add the per-block special tokens (``<s>``,
    ``</s>``) afterwards, with ``seq_len`` reduced by their number.
    """
    docs = _check_documents(documents)
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0:
        raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
    blocks: list[list[int]] = []
    current: list[int] = []
    for di, doc in enumerate(docs):
        for si, sentence in enumerate(doc):
            sentence = [int(t) for t in sentence]
            if len(sentence) > seq_len:
                if not truncate_long:
                    raise ValueError(f"sentence {si} of document {di} has {len(sentence)} tokens > seq_len={seq_len}")
                sentence = sentence[:seq_len]
            boundary = [sep_id] if (si == 0 and current) else []
            if len(current) + len(boundary) + len(sentence) > seq_len:
                if current:
                    blocks.append(current)
                current, boundary = [], []
            current += boundary + sentence
    if current:
        blocks.append(current)
    return blocks
