"""Checks for the Chapter 8 exercises (BERT's variants).

References: a loop over the tokens (position ids of packed documents), the
parameter count of :class:`companion.models.bert.BertModel` built on the meta
device (ALBERT), the replaced-token-detection loss written with
``torch.nn.functional`` (ELECTRA) and DistilBERT's three loss terms as Hugging
Face's distillation example computes them with ``torch.nn.functional``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models.bert import BertConfig, BertModel
from ..calculators import count_parameters
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, register


# ----------------------------------------------------------------- 8.1 position ids of packed documents

def _packed_reference(ids: torch.Tensor, pad_id: int, bos_id: int) -> torch.Tensor:
    """A plain loop: the count restarts at every bos_id; padding keeps pad_id and does not advance it."""
    out = torch.full_like(ids, pad_id)
    for r in range(ids.shape[0]):
        n = 0
        for c in range(ids.shape[1]):
            tok = int(ids[r, c])
            if tok == pad_id:
                continue
            n = 1 if tok == bos_id else n + 1
            out[r, c] = pad_id + n
    return out


def _packed_case(student, ids, pad_id, bos_id, what):
    got = student(ids.clone(), pad_id, bos_id)
    expect_tensor(got, _packed_reference(ids, pad_id, bos_id),
                  name=f"position ids ({what}; each document must restart at pad_id + 1 = {pad_id + 1} on its bos_id)")


def _packed_batch(b, t, pad_id, bos_id, seed):
    """Rows of documents <s> w w ... packed back to back, then right padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((b, t), pad_id)
    for r in range(b):
        c = 0
        used = int(torch.randint(t // 2, t + 1, (1,), generator=g))
        while c < used:
            n = min(int(torch.randint(1, 7, (1,), generator=g)), used - c)
            ids[r, c] = bos_id
            ids[r, c + 1:c + n] = torch.randint(max(pad_id, bos_id) + 1, 60, (n - 1,), generator=g)
            c += n
    return ids


register(Exercise(
    id="8.1",
    title="Position ids for packed documents",
    targets=("packed_position_ids",),
    forbidden=("transformers", "companion.models"),
    cases=(
        Case("one document per row: RoBERTa's numbering", 1,
             lambda s: _packed_case(s, torch.tensor([[0, 7, 8, 2, 1, 1], [0, 9, 2, 1, 1, 1]]), 1, 0, "one document a row")),
        Case("a worked example: three documents in one row", 2,
             lambda s: _packed_case(s, torch.tensor([[0, 7, 8, 2, 0, 9, 2, 0, 5, 1]]), 1, 0,
                                    "[[0, 7, 8, 2, 0, 9, 2, 0, 5, 1]]")),
        Case("a packed batch with right padding (B=4, T=17)", 2,
             lambda s: _packed_case(s, _packed_batch(4, 17, 1, 0, 0), 1, 0, "B=4, T=17, pad_id 1, bos_id 0")),
        Case("pad_id 0, bos_id 2: one-token documents, padding inside a document, a row of padding only", 1,
             lambda s: _packed_case(s, torch.tensor([[2, 2, 5, 2, 0, 0], [0, 0, 0, 0, 0, 0], [0, 2, 6, 0, 7, 2]]),
                                    0, 2, "pad_id 0, bos_id 2, padding inside a document")),
    ),
))


# ----------------------------------------------------------------- 8.2 ALBERT's parameter count

def _albert_reference(cfg: BertConfig) -> int:
    with torch.device("meta"):
        return count_parameters(BertModel(cfg, pooler=True))


def _count_case(student, what, **kw):
    cfg = BertConfig(**kw)
    want = _albert_reference(cfg)
    got = student(cfg.vocab_size, cfg.embed_dim, cfg.d_model, cfg.n_layers, cfg.d_ff, cfg.max_positions,
                  cfg.n_segments, cfg.share_layers)
    expect_true(isinstance(got, int) and not isinstance(got, bool),
                f"encoder_parameters must return an int, got {type(got).__name__}")
    if got != want:
        raise CheckFailed(f"{what}: expected {want:,} parameters, got {got:,} (difference {got - want:+,})")


register(Exercise(
    id="8.2",
    title="Count the parameters of BERT and ALBERT encoders",
    targets=("encoder_parameters",),
    forbidden=("transformers", "companion.models"),
    cases=(
        Case("BERT-base (E = D, no sharing)", 2, lambda s: _count_case(s, "BERT-base")),
        Case("ALBERT-base (E = 128, shared layers)", 2, lambda s: _count_case(
            s, "ALBERT-base", vocab_size=30000, embedding_size=128, share_layers=True)),
        Case("factorised but not shared (E = 64, D = 256, 6 layers)", 1, lambda s: _count_case(
            s, "E=64, D=256, not shared", vocab_size=5000, embedding_size=64, d_model=256, n_heads=4, d_ff=1024,
            n_layers=6)),
        Case("ALBERT-xxlarge", 1, lambda s: _count_case(
            s, "ALBERT-xxlarge", vocab_size=30000, embedding_size=128, d_model=4096, n_layers=12, n_heads=64,
            d_ff=16384, share_layers=True)),
    ),
))


# ----------------------------------------------------------------- 8.3 ELECTRA's replaced-token detection loss

def _rtd_reference(logits, original, corrupted, attention_mask):
    target = (original != corrupted).float()
    real = attention_mask.bool()
    return F.binary_cross_entropy_with_logits(logits[real], target[real])


def _rtd_case(student, b, t, seed, what, all_real=False):
    g = torch.Generator().manual_seed(seed)
    original = torch.randint(5, 40, (b, t), generator=g)
    corrupted = original.clone()
    swap = torch.rand(b, t, generator=g) < 0.2
    corrupted[swap] = torch.randint(5, 40, (int(swap.sum()),), generator=g)  # some samples equal the original
    att = torch.ones(b, t, dtype=torch.long)
    if not all_real:
        lengths = torch.randint(2, t + 1, (b,), generator=g)
        att = (torch.arange(t) < lengths[:, None]).long()
    logits = 3 * torch.randn(b, t, generator=g)
    logits[att == 0] = 1e4  # padding carries garbage scores that must not count
    got = student(logits.clone(), original.clone(), corrupted.clone(), att.clone())
    expect_tensor(got, _rtd_reference(logits, original, corrupted, att), name=f"RTD loss ({what})")


register(Exercise(
    id="8.3",
    title="ELECTRA's replaced-token detection loss",
    targets=("rtd_loss",),
    forbidden=("transformers", "companion.models"),
    cases=(
        Case("no padding (B=3, T=8)", 2, lambda s: _rtd_case(s, 3, 8, 0, "B=3, T=8", all_real=True)),
        Case("padding must not count (B=4, T=11)", 2, lambda s: _rtd_case(s, 4, 11, 1, "padded B=4, T=11")),
        Case("a sampled token equal to the original is 'original'", 2, lambda s: _rtd_case(s, 2, 16, 2, "B=2, T=16")),
    ),
))


# ----------------------------------------------------------------- 8.4 DistilBERT's triple loss

def _distil_reference(s_logits, t_logits, s_hidden, t_hidden, labels, attention_mask, T, alphas, restrict):
    """As Hugging Face's distillation example computes it: nn.KLDivLoss(batchmean) on the selected rows, T^2,
    CrossEntropyLoss(ignore_index=-100), CosineEmbeddingLoss(mean) with target 1 on the real tokens."""
    real = attention_mask.bool()
    rows = labels != -100 if restrict else real
    kl = F.kl_div(F.log_softmax(s_logits[rows] / T, dim=-1), F.softmax(t_logits[rows] / T, dim=-1),
                  reduction="batchmean") * T ** 2
    mlm = F.cross_entropy(s_logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    cos = F.cosine_embedding_loss(s_hidden[real], t_hidden[real], torch.ones(int(real.sum())))
    a_ce, a_mlm, a_cos = alphas
    return a_ce * kl + a_mlm * mlm + a_cos * cos


def _distil_batch(b, t, v, d, seed):
    """Right-padded rows; padding holds huge logits and hidden states, as a real model's padded outputs may."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, t + 1, (b,), generator=g)
    lengths[0] = t
    real = torch.arange(t) < lengths[:, None]
    s_logits, t_logits = 2 * torch.randn(b, t, v, generator=g), 2 * torch.randn(b, t, v, generator=g)
    s_hidden, t_hidden = torch.randn(b, t, d, generator=g), torch.randn(b, t, d, generator=g)
    targets = torch.randint(v, (b, t), generator=g)
    picked = (torch.rand(b, t, generator=g) < 0.3) & real
    picked[:, 0] = True  # at least one masked position a row
    labels = torch.where(picked, targets, torch.full_like(targets, -100))
    s_logits[~real], t_logits[~real] = 1e4 * torch.randn(int((~real).sum()), v, generator=g), 0.0
    s_hidden[~real] = 1e3
    t_hidden[~real] = -1e3 * torch.randn(int((~real).sum()), d, generator=g)
    return s_logits, t_logits, s_hidden, t_hidden, labels, real.long()


def _distil_case(student, seed, T, alphas, restrict, what, b=3, t=9, v=11, d=6):
    batch = _distil_batch(b, t, v, d, seed)
    want = _distil_reference(*batch, T, alphas, restrict)
    got = student(*(x.clone() for x in batch), T, alphas, restrict)
    expect_tensor(got, want, name=f"{what} (T={T}, alphas={alphas}, restrict_to_masked={restrict})")


register(Exercise(
    id="8.4",
    title="DistilBERT's triple loss over a padded batch",
    targets=("distil_loss",),
    forbidden=("transformers", "companion.distillation"),
    cases=(
        Case("the soft-target term over the real tokens only", 2,
             lambda s: _distil_case(s, 0, 2.0, (1.0, 0.0, 0.0), False,
                                    "soft-target term alone, over the real tokens (padding holds logits of 1e4)")),
        Case("the soft-target term at the masked positions only", 1,
             lambda s: _distil_case(s, 1, 4.0, (1.0, 0.0, 0.0), True,
                                    "soft-target term alone, over the positions whose label is not -100")),
        Case("the MLM term: cross-entropy at temperature 1", 1,
             lambda s: _distil_case(s, 2, 3.0, (0.0, 1.0, 0.0), False,
                                    "MLM term alone: cross-entropy of the student's logits (not divided by T) "
                                    "at the labelled positions")),
        Case("the cosine term over the real tokens", 1,
             lambda s: _distil_case(s, 3, 2.0, (0.0, 0.0, 1.0), False,
                                    "cosine term alone: mean of 1 - cos(h_student, h_teacher) over the real tokens")),
        Case("DistilBERT's weights 5, 2, 1 at T = 2", 1,
             lambda s: _distil_case(s, 4, 2.0, (5.0, 2.0, 1.0), True, "the weighted sum", b=4, t=13, v=17, d=8)),
    ),
))
