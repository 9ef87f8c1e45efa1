"""Knowledge distillation of BERT into a shallower student, as DistilBERT does (Chapter 8).

Sanh et al. (2019), "DistilBERT, a distilled version of BERT: smaller, faster,
cheaper and lighter", section 3:

* the **student** has the teacher's width and half its blocks, initialised from
  the teacher by taking one block out of two (:func:`student_from_teacher`);
  DistilBERT also drops the segment embeddings and the pooler (kept here: the
  course's student is a :class:`~companion.models.bert.BertForMaskedLM`);
* the **loss** is a weighted sum of three terms (:func:`distillation_loss`):
  ``alpha_ce`` times the KL divergence between the teacher's and the student's
  softened distributions ``softmax(z / T)`` at the masked positions, multiplied by
  ``T**2`` so that its gradients keep their scale when T changes (Hinton et al.,
  2015, section 2); ``alpha_mlm`` times the ordinary MLM cross-entropy; and
  ``alpha_cos`` times the cosine-embedding loss ``1 - cos(h_student, h_teacher)``
  between the last hidden states, averaged over real tokens. The weights 5, 2
  and 1 with T = 2 are those on the command line of Hugging Face's DistilBERT
  training example (its README; the script's own defaults differ, and the paper
  gives none). That script takes the KL term over every non-padding token
  unless given ``--restrict_ce_to_mask``; here it is taken at the masked
  positions only.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .mlm import IGNORE_INDEX
from .models.bert import BertConfig, BertForMaskedLM

__all__ = ["student_from_teacher", "soft_target_loss", "DistillationLoss", "distillation_loss"]


def student_from_teacher(teacher: BertForMaskedLM, *, keep: list[int] | None = None) -> BertForMaskedLM:
    """A student with the blocks ``keep`` of ``teacher`` (default: 0, 2, 4, ...), and copies of its
    embeddings and MLM head. The teacher is not modified."""
    if not isinstance(teacher, BertForMaskedLM):
        raise TypeError(f"teacher must be a BertForMaskedLM, got {type(teacher).__name__}")
    n = teacher.cfg.n_layers
    keep = list(range(0, n, 2)) if keep is None else list(keep)
    if not keep or any(not isinstance(i, int) or not 0 <= i < n for i in keep):
        raise ValueError(f"keep must list block indices in [0, {n}), got {keep!r}")
    cfg = BertConfig(**{**teacher.cfg.__dict__, "n_layers": len(keep)})
    student = BertForMaskedLM(cfg)
    teacher_state = teacher.state_dict()
    state = {}
    for name in student.state_dict():
        source = name
        if name.startswith("bert.blocks."):
            j, rest = name[len("bert.blocks."):].split(".", 1)
            source = f"bert.blocks.{keep[int(j)]}.{rest}"  # student block j <- teacher block keep[j]
        state[name] = teacher_state[source].detach().clone()
    student.load_state_dict(state)
    return student


def soft_target_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``T**2 * KL(softmax(teacher / T) || softmax(student / T))``, averaged over rows ((N, V) logits)."""
    if student_logits.shape != teacher_logits.shape or student_logits.dim() != 2:
        raise ValueError(f"logits must both be (N, V), got {tuple(student_logits.shape)} and "
                         f"{tuple(teacher_logits.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature!r}")
    log_p_student = F.log_softmax(student_logits / temperature, dim=-1)
    log_p_teacher = F.log_softmax(teacher_logits / temperature, dim=-1)
    kl = (log_p_teacher.exp() * (log_p_teacher - log_p_student)).sum(-1).mean()
    return kl * temperature ** 2


class DistillationLoss(NamedTuple):
    total: torch.Tensor
    soft: torch.Tensor  # T^2 KL at the masked positions
    mlm: torch.Tensor  # cross-entropy with the true tokens at the masked positions
    cosine: torch.Tensor  # mean 1 - cos(h_s, h_t) over real tokens


def distillation_loss(student: nn.Module, teacher: nn.Module, masked_ids: torch.Tensor, labels: torch.Tensor,
                      attention_mask: torch.Tensor, *, temperature: float = 2.0, alpha_ce: float = 5.0,
                      alpha_mlm: float = 2.0, alpha_cos: float = 1.0) -> DistillationLoss:
    """DistilBERT's loss for one masked batch; the teacher runs without gradients."""
    with torch.no_grad():
        t_out = teacher(masked_ids, attention_mask)
    s_out = student(masked_ids, attention_mask)
    sel = labels != IGNORE_INDEX  # (B, T)
    soft = soft_target_loss(s_out.mlm_logits[sel], t_out.mlm_logits[sel], temperature)
    mlm = F.cross_entropy(s_out.mlm_logits[sel], labels[sel])
    real = attention_mask.bool()
    cosine = (1.0 - F.cosine_similarity(s_out.hidden[real], t_out.hidden[real], dim=-1)).mean()
    return DistillationLoss(alpha_ce * soft + alpha_mlm * mlm + alpha_cos * cosine, soft, mlm, cosine)
