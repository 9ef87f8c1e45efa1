"""Checks for the Chapter 8 exercises (BERT's variants).

References: :func:`companion.models.bert.padding_position_ids` (RoBERTa's positions),
the parameter count of :class:`companion.models.bert.BertModel` built on the meta
device (ALBERT), :func:`companion.distillation.soft_target_loss` (DistilBERT) and
the replaced-token-detection loss written with ``torch.nn.functional`` (ELECTRA).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..distillation import soft_target_loss
from ..models.bert import BertConfig, BertModel, padding_position_ids
from ..calculators import count_parameters
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, register


# ----------------------------------------------------------------- 8.1 RoBERTa's position ids

def _pos_case(student, ids, pad_id, what):
    got = student(ids.clone(), pad_id)
    expect_tensor(got, padding_position_ids(ids, pad_id), name=f"position ids ({what})")


def _pos_random(student, b, t, pad_id, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(pad_id + 1, 50, (b, t), generator=g)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    ids[torch.arange(t) >= lengths[:, None]] = pad_id
    _pos_case(student, ids, pad_id, f"B={b}, T={t}, right padding, pad_id={pad_id}")


register(Exercise(
    id="8.1",
    title="RoBERTa's position ids from the input ids",
    targets=("roberta_position_ids",),
    forbidden=("transformers", "companion.models"),
    cases=(
        Case("a worked example (pad_id 1)", 2,
             lambda s: _pos_case(s, torch.tensor([[0, 7, 8, 2, 1, 1]]), 1, "[[0, 7, 8, 2, 1, 1]]")),
        Case("a padded batch (B=4, T=9)", 2, lambda s: _pos_random(s, 4, 9, 1, 0)),
        Case("another pad id (0) and a row of padding only", 1,
             lambda s: _pos_case(s, torch.tensor([[5, 6, 0], [0, 0, 0]]), 0, "pad_id 0, an empty row")),
        Case("padding in the middle (left padding)", 1,
             lambda s: _pos_case(s, torch.tensor([[1, 1, 0, 9, 2]]), 1, "left-padded row")),
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


# ----------------------------------------------------------------- 8.4 DistilBERT's soft-target loss

def _soft_case(student, n, v, temperature, seed, what):
    g = torch.Generator().manual_seed(seed)
    s_logits, t_logits = 2 * torch.randn(n, v, generator=g), 2 * torch.randn(n, v, generator=g)
    got = student(s_logits.clone(), t_logits.clone(), temperature)
    expect_tensor(got, soft_target_loss(s_logits, t_logits, temperature), name=f"soft-target loss ({what})")


def _soft_large(student):
    s_logits = torch.tensor([[300.0, 0.0, -300.0], [0.0, 200.0, 0.0]])
    t_logits = torch.tensor([[0.0, 300.0, -300.0], [0.0, 0.0, 250.0]])
    got = student(s_logits.clone(), t_logits.clone(), 1.0)
    expect_tensor(got, soft_target_loss(s_logits, t_logits, 1.0), name="soft-target loss with logits of +-300")


register(Exercise(
    id="8.4",
    title="DistilBERT's soft-target loss with a temperature",
    targets=("soft_target_loss",),
    forbidden=("transformers", "companion.distillation"),
    cases=(
        Case("T = 1 (plain KL divergence)", 2, lambda s: _soft_case(s, 5, 7, 1.0, 0, "T=1")),
        Case("T = 2, DistilBERT's value (the T^2 factor)", 2, lambda s: _soft_case(s, 6, 11, 2.0, 1, "T=2")),
        Case("T = 4 and one row", 1, lambda s: _soft_case(s, 1, 30, 4.0, 2, "T=4, N=1")),
        Case("large logits stay finite (log-softmax, not log of softmax)", 1, lambda s: _soft_large(s)),
    ),
))

