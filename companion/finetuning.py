"""Fine-tuning a pre-trained BERT on three small tasks built from the course corpus (Chapter 7).

Each task is generated from sentences of :func:`companion.pretraining.corpus_documents`
and exercises one of BERT's fine-tuning heads (Devlin et al., 2019, figure 4):

* **next sentence** (sentence-pair classification, :class:`~companion.models.bert.BertForSequenceClassification`):
  does sentence B follow sentence A in its document (label 1), or does it come from
  another document (label 0)? Built with :func:`companion.mlm.make_nsp_pairs`;
* **capitalisation** (token classification, :class:`~companion.models.bert.BertForTokenClassification`):
  the input is lower-cased (the uncased tokenizer would lower-case it anyway);
  each word's label says whether it was capitalised in the original (a sentence
  start, ``True``, ``None``, a class name). The label of a word sits on its first
  sub-token; the other sub-tokens carry ``-100``;
* **replaced word** (span extraction, :class:`~companion.models.bert.BertForQuestionAnswering`):
  one word of a sentence is replaced by a word taken from another sentence; the
  answer is the span from the first to the last sub-token of the intruder
  (ELECTRA's replaced-token detection, Chapter 8, asked as a span question).

Baselines, so that an accuracy means something: the majority class; a bag-of-words
logistic regression for next sentence (:func:`bag_of_words_baseline`); a per-word
lookup of the most frequent casing for capitalisation (:func:`casing_lookup_baseline`);
for the replaced word, the most frequent span position (:func:`span_position_baseline`)
and the rarest word of the sentence (:func:`rarest_word_baseline`).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .mlm import IGNORE_INDEX, make_nsp_pairs
from .training import weight_decay_groups

__all__ = [
    "TaskData", "next_sentence_task", "capitalisation_task", "replaced_word_task", "split_task", "encode_words",
    "finetune", "predict", "accuracy", "FinetuneResult",
    "majority_baseline", "bag_of_words_baseline", "casing_lookup_baseline", "span_position_baseline", "rarest_word_baseline",
]


@dataclass
class TaskData:
    """Encoded examples: ``input_ids``, ``attention_mask``, ``segment_ids`` (N, T) and ``labels``.

    ``labels`` is (N,) for a sentence label, (N, T) for token labels (``-100`` where
    unlabelled) and (N, 2) for a span (start, end token positions, inclusive).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    segment_ids: torch.Tensor
    labels: torch.Tensor
    kind: str  # "sequence", "token" or "span"

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def subset(self, idx) -> TaskData:
        return TaskData(self.input_ids[idx], self.attention_mask[idx], self.segment_ids[idx], self.labels[idx],
                        self.kind)


def encode_words(tokenizer, words: list[str]) -> tuple[list[int], list[int]]:
    """WordPiece ids of ``words`` and, for each id, the index of the word it came from."""
    ids, word_of = [], []
    for w_idx, word in enumerate(words):
        for tok in tokenizer.tokenize(word):
            ids.append(tokenizer.token_to_id(tok))
            word_of.append(w_idx)
    return ids, word_of


def _pad(rows: list[list[int]], value: int, length: int) -> torch.Tensor:
    out = torch.full((len(rows), length), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def _specials(tokenizer) -> tuple[int, int, int]:
    return (tokenizer.token_to_id(tokenizer.cls_token), tokenizer.token_to_id(tokenizer.sep_token),
            tokenizer.token_to_id(tokenizer.pad_token))


def _check_sentences(sentences: object, min_words: int) -> list[str]:
    if not isinstance(sentences, (list, tuple)) or not all(isinstance(s, str) for s in sentences):
        raise TypeError("sentences must be a list of str")
    kept = [s for s in sentences if len(s.split()) >= min_words]
    if not kept:
        raise ValueError(f"no sentence has at least {min_words} words")
    return kept


def next_sentence_task(documents: list[list[str]], tokenizer, *, max_length: int = 64, seed: int = 0) -> TaskData:
    """Sentence pairs ``[CLS] A [SEP] B [SEP]``; label 1 when B follows A, 0 when B is from another document.

    (The labels are the opposite of :class:`companion.mlm.NSPPair`'s, where 0 = IsNext,
    so that "1" reads as "yes, it follows".)
    """
    pairs = make_nsp_pairs(documents, generator=torch.Generator().manual_seed(seed))
    encs = [tokenizer.encode(p.a, p.b, max_length=max_length, truncation=True) for p in pairs]
    _, _, pad = _specials(tokenizer)
    length = max(len(e["input_ids"]) for e in encs)
    return TaskData(_pad([e["input_ids"] for e in encs], pad, length),
                    _pad([e["attention_mask"] for e in encs], 0, length),
                    _pad([e["token_type_ids"] for e in encs], 0, length),
                    torch.tensor([1 - p.label for p in pairs]), "sequence")


def capitalisation_task(sentences: list[str], tokenizer, *, max_length: int = 64) -> TaskData:
    """Lower-cased sentences; label 1 on the first sub-token of each word that started with a capital letter."""
    sentences = _check_sentences(sentences, 3)
    cls_id, sep_id, pad = _specials(tokenizer)
    rows, labels = [], []
    for s in sentences:
        words = s.split()
        ids, word_of = encode_words(tokenizer, [w.lower() for w in words])
        ids, word_of = ids[:max_length - 2], word_of[:max_length - 2]
        lab, seen = [IGNORE_INDEX], set()
        for w in word_of:
            lab.append(IGNORE_INDEX if w in seen else int(words[w][:1].isupper()))
            seen.add(w)
        rows.append([cls_id] + ids + [sep_id])
        labels.append(lab + [IGNORE_INDEX])
    length = max(map(len, rows))
    ids = _pad(rows, pad, length)
    att = (torch.arange(length) < torch.tensor([[len(r)] for r in rows])).long()
    return TaskData(ids, att, torch.zeros_like(ids), _pad(labels, IGNORE_INDEX, length), "token")


def replaced_word_task(sentences: list[str], tokenizer, *, max_length: int = 64, seed: int = 0) -> TaskData:
    """Each sentence with one word replaced by a word of another sentence; the label is the replaced word's
    (start, end) token span (first and last sub-token, inclusive).

    The replacement differs from the original (case-insensitively). Sentences whose
    encoding does not fit ``max_length`` whole are skipped, so the answer is always inside.
    """
    sentences = _check_sentences(sentences, 4)
    gen = torch.Generator().manual_seed(seed)
    cls_id, sep_id, pad = _specials(tokenizer)
    pool = [w for s in sentences for w in s.split()]
    rows, spans = [], []
    for s in sentences:
        words = s.split()
        i = int(torch.randint(len(words), (), generator=gen))
        new = pool[int(torch.randint(len(pool), (), generator=gen))]
        if new.lower() == words[i].lower():
            continue
        words[i] = new
        ids, word_of = encode_words(tokenizer, words)
        if len(ids) + 2 > max_length or i not in word_of:
            continue
        start = word_of.index(i) + 1  # +1: [CLS]
        end = len(word_of) - word_of[::-1].index(i)  # last sub-token of word i, shifted by [CLS]
        rows.append([cls_id] + ids + [sep_id])
        spans.append((start, end))
    if not rows:
        raise ValueError("no sentence could be turned into a replaced-word example")
    length = max(map(len, rows))
    ids = _pad(rows, pad, length)
    att = (torch.arange(length) < torch.tensor([[len(r)] for r in rows])).long()
    return TaskData(ids, att, torch.zeros_like(ids), torch.tensor(spans), "span")


def split_task(data: TaskData, test_fraction: float = 0.2, *, seed: int = 0) -> tuple[TaskData, TaskData]:
    """A random ``(train, test)`` split of the examples."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))
    n_test = max(1, round(test_fraction * len(data)))
    return data.subset(perm[n_test:]), data.subset(perm[:n_test])


# --- training and scoring ------------------------------------------------------------------------------

def _masked_span(logits: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    return logits.masked_fill(attention_mask == 0, float("-inf"))


def _loss(model: nn.Module, data: TaskData) -> torch.Tensor:
    out = model(data.input_ids, data.attention_mask, data.segment_ids)
    if data.kind == "sequence":
        return F.cross_entropy(out, data.labels)
    if data.kind == "token":
        return F.cross_entropy(out.flatten(0, 1), data.labels.flatten(), ignore_index=IGNORE_INDEX)
    start, end = (_masked_span(x, data.attention_mask) for x in out)
    return (F.cross_entropy(start, data.labels[:, 0]) + F.cross_entropy(end, data.labels[:, 1])) / 2


@torch.no_grad()
def predict(model: nn.Module, data: TaskData, *, batch_size: int = 128) -> torch.Tensor:
    """Predicted labels in the shape of ``data.labels`` (a span: the best start, then the best end at or after it)."""
    model.eval()
    preds = []
    for i in range(0, len(data), batch_size):
        part = data.subset(slice(i, i + batch_size))
        out = model(part.input_ids, part.attention_mask, part.segment_ids)
        if data.kind == "span":
            start, end = (_masked_span(x, part.attention_mask) for x in out)
            score = start.unsqueeze(2) + end.unsqueeze(1)  # (B, T, T): start s, end e
            t = score.shape[-1]
            score = score.masked_fill(~torch.ones(t, t, dtype=torch.bool, device=score.device).triu(), float("-inf"))  # e >= s
            best = score.flatten(1).argmax(-1)
            preds.append(torch.stack([best // t, best % t], dim=1))
        else:
            preds.append(out.argmax(-1))
    return torch.cat(preds)


def accuracy(pred: torch.Tensor, data: TaskData) -> float:
    """Sentence labels: fraction right; token labels: fraction of labelled tokens right; spans: exact match."""
    if pred.shape != data.labels.shape:
        raise ValueError(f"pred must have labels' shape {tuple(data.labels.shape)}, got {tuple(pred.shape)}")
    if data.kind == "token":
        sel = data.labels != IGNORE_INDEX
        return float((pred[sel] == data.labels[sel]).double().mean())
    if data.kind == "span":
        return float((pred == data.labels).all(1).double().mean())
    return float((pred == data.labels).double().mean())


@dataclass
class FinetuneResult:
    accuracy: float
    train_loss: list[float]
    seconds: float


def finetune(model: nn.Module, train_data: TaskData, test_data: TaskData, *, steps: int, batch_size: int = 32,
             lr: float = 1e-4, weight_decay: float = 0.01, warmup: float = 0.1, seed: int = 0,
             progress: bool = False) -> FinetuneResult:
    """AdamW with linear warm-up and linear decay (BERT's fine-tuning schedule); returns test accuracy."""
    from tqdm.auto import tqdm

    if train_data.kind != test_data.kind:
        raise ValueError(f"train and test data are different tasks: {train_data.kind} vs {test_data.kind}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(weight_decay_groups(model, weight_decay), lr=lr)  # unfused: the recorded runs used it
    n_warm = max(1, int(warmup * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / n_warm if s < n_warm else max(0.0, (steps - s) / max(1, steps - n_warm)))
    losses = []
    model.train()
    for _ in tqdm(range(steps), disable=not progress, desc="fine-tuning", mininterval=1.0):
        batch = train_data.subset(torch.randint(len(train_data), (batch_size,), generator=gen))
        loss = _loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    acc = accuracy(predict(model, test_data), test_data)
    return FinetuneResult(acc, losses, time.perf_counter() - start)


# --- baselines -----------------------------------------------------------------------------------------

def majority_baseline(train_data: TaskData, test_data: TaskData) -> float:
    """Accuracy of always predicting the most frequent training label (sentence and token tasks)."""
    lab = train_data.labels[train_data.labels != IGNORE_INDEX]
    top = Counter(lab.tolist()).most_common(1)[0][0]
    return accuracy(torch.full_like(test_data.labels, top), test_data)


def _bags(data: TaskData, vocab_size: int) -> torch.Tensor:
    """Features of a pair: bag of A, bag of B and their overlap (presence vectors), (N, 3 V)."""
    n = len(data)
    a = torch.zeros(n, vocab_size)
    b = torch.zeros(n, vocab_size)
    real = data.attention_mask.bool()
    seg_a = real & (data.segment_ids == 0)
    seg_b = real & (data.segment_ids == 1)
    rows = torch.arange(n).unsqueeze(1).expand_as(data.input_ids)
    a[rows[seg_a], data.input_ids[seg_a]] = 1.0
    b[rows[seg_b], data.input_ids[seg_b]] = 1.0
    return torch.cat([a, b, a * b], dim=1)


def bag_of_words_baseline(train_data: TaskData, test_data: TaskData, vocab_size: int, *, steps: int = 300,
                          lr: float = 0.1, weight_decay: float = 1e-4, seed: int = 0) -> float:
    """A logistic regression on bags of words (A, B and their overlap), full-batch, written with torch."""
    torch.manual_seed(seed)
    x_train, x_test = _bags(train_data, vocab_size), _bags(test_data, vocab_size)
    n_labels = int(train_data.labels.max()) + 1
    clf = nn.Linear(x_train.shape[1], n_labels)
    opt = torch.optim.Adam(clf.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(steps):
        loss = F.cross_entropy(clf(x_train), train_data.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return accuracy(clf(x_test).argmax(-1), test_data)


def casing_lookup_baseline(train_data: TaskData, test_data: TaskData) -> float:
    """Each first sub-token gets the label it had most often in training (unknown ones: the majority label)."""
    votes: dict[int, Counter] = defaultdict(Counter)
    sel = train_data.labels != IGNORE_INDEX
    for tok, lab in zip(train_data.input_ids[sel].tolist(), train_data.labels[sel].tolist()):
        votes[tok][lab] += 1
    overall = Counter(train_data.labels[sel].tolist()).most_common(1)[0][0]
    pred = test_data.input_ids.clone()
    flat = [votes[t].most_common(1)[0][0] if t in votes else overall for t in pred.flatten().tolist()]
    return accuracy(torch.tensor(flat).view_as(pred), test_data)


def span_position_baseline(train_data: TaskData, test_data: TaskData) -> float:
    """Always answer the (start, end) pair seen most often in training."""
    top = Counter(map(tuple, train_data.labels.tolist())).most_common(1)[0][0]
    return accuracy(torch.tensor(top).expand_as(test_data.labels).clone(), test_data)


def rarest_word_baseline(train_data: TaskData, test_data: TaskData) -> float:
    """Answer the first sub-token whose id was rarest in the training inputs (a one-token span).

    A context-free guess at the intruder: a word taken from elsewhere is often rare here.
    Spans of several sub-tokens count as right only if the whole span matches.
    """
    counts = Counter(train_data.input_ids[train_data.attention_mask.bool()].tolist())
    preds = []
    for ids, att in zip(test_data.input_ids.tolist(), test_data.attention_mask.tolist()):
        n = sum(att)
        inner = range(1, n - 1)  # without [CLS] and [SEP]
        best = min(inner, key=lambda t: (counts.get(ids[t], 0), t)) if n > 2 else 0
        preds.append((best, best))
    return accuracy(torch.tensor(preds), test_data)
