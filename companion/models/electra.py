"""ELECTRA: a discriminator trained to spot replaced tokens (Chapter 8).

Clark et al. (2020), "ELECTRA: Pre-training Text Encoders as Discriminators
Rather Than Generators". A small masked-LM **generator** fills the masked
positions of a sentence with samples; the **discriminator**, the model kept
after pre-training, reads the corrupted sentence and predicts for *every* token
whether it was replaced (replaced-token detection, RTD). A sampled token equal
to the original counts as original. The loss (section 2) is

    L = L_MLM(generator) + lambda * L_Disc,   lambda = 50,

with L_Disc the mean binary cross-entropy over all real tokens. The generator
is not trained through the discriminator (sampling is not differentiable). The
two share their token embeddings (and, in the released models, position and
segment embeddings).

Both networks are :class:`~companion.models.bert.BertModel` s. The released
ELECTRA-small embeds in E = 128 and projects to D = 256 (``embedding_size``).
The discriminator head is ``Linear(act(Linear(h)))`` -> one logit per token
(:class:`ElectraDiscriminator`). :func:`from_hf_electra` loads Hugging Face
``ElectraForPreTraining``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..blocks import ACTIVATIONS
from ..mlm import IGNORE_INDEX
from ._hf import copy_by_name_map, hf_source
from .bert import (_HF_IGNORE, BertConfig, BertForMaskedLM, BertModel, _encoder_names, _fuse_qkv, _init_weights,
                   config_from_hf)

__all__ = ["ELECTRA_SMALL", "ElectraDiscriminator", "replaced_token_labels", "corrupt_with_generator",
           "ElectraLoss", "electra_loss", "electra_config_from_hf", "from_hf_electra"]

# ELECTRA-small (discriminator): D 256, 12 layers, 4 heads, F 1024, E 128 (table 6 of the paper).
ELECTRA_SMALL = BertConfig(d_model=256, n_layers=12, n_heads=4, d_ff=1024, embedding_size=128)


class ElectraDiscriminator(nn.Module):
    """An encoder and a per-token head: logit > 0 means "this token was replaced". Returns (B, T) logits.

    ``replaced_prior`` (optional) starts the head's output bias at the log-odds
    ``log(p / (1 - p))`` of the expected share ``p`` of replaced tokens, so that a
    fresh discriminator already answers with the base rate. From a zero bias
    (every token at probability 1/2, while only about 15% are replaced) the first
    updates all say "lower every logit"; with a short warm-up that common push
    can drive the encoder's hidden states towards one vector shared by every
    position, after which the discriminator outputs the base rate and learns
    nothing (Chapter 8's first ELECTRA run). Loading weights overwrites the bias.
    """

    def __init__(self, cfg: BertConfig, *, replaced_prior: float | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.bert = BertModel(cfg, pooler=False)
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.out = nn.Linear(cfg.d_model, 1)
        _init_weights(self.dense)
        _init_weights(self.out)
        if replaced_prior is not None:
            if isinstance(replaced_prior, bool) or not 0.0 < replaced_prior < 1.0:
                raise ValueError(f"replaced_prior must be a probability in (0, 1), got {replaced_prior!r}")
            with torch.no_grad():
                self.out.bias.fill_(math.log(replaced_prior / (1.0 - replaced_prior)))

    def forward(self, input_ids, attention_mask=None, segment_ids=None, position_ids=None) -> torch.Tensor:
        h = self.bert(input_ids, attention_mask, segment_ids, position_ids).hidden  # (B, T, D)
        return self.out(ACTIVATIONS[self.cfg.activation](self.dense(h))).squeeze(-1)  # (B, T)


def replaced_token_labels(original: torch.Tensor, corrupted: torch.Tensor) -> torch.Tensor:
    """1.0 where ``corrupted`` differs from ``original``, else 0.0 (a sample equal to the original is "original")."""
    if not isinstance(original, torch.Tensor) or not isinstance(corrupted, torch.Tensor) \
            or original.shape != corrupted.shape:
        raise ValueError(f"original and corrupted must be tensors of one shape, got "
                         f"{getattr(original, 'shape', type(original).__name__)} and "
                         f"{getattr(corrupted, 'shape', type(corrupted).__name__)}")
    return (original != corrupted).float()


def corrupt_with_generator(generator_logits: torch.Tensor, masked_ids: torch.Tensor, labels: torch.Tensor,
                           *, sampler: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(corrupted, originals)``: the discriminator's input, at each masked position (label != -100) a token sampled from the
    generator's softmax; elsewhere ``masked_ids`` unchanged. No gradient flows through the sample."""
    if generator_logits.shape[:2] != masked_ids.shape or labels.shape != masked_ids.shape:
        raise ValueError(f"generator_logits (B, T, V), masked_ids and labels (B, T) must agree, got "
                         f"{tuple(generator_logits.shape)}, {tuple(masked_ids.shape)}, {tuple(labels.shape)}")
    selected = labels != IGNORE_INDEX
    corrupted = masked_ids.clone()
    if selected.any():
        probs = generator_logits.detach()[selected].float().softmax(-1)  # (N, V)
        corrupted[selected] = torch.multinomial(probs, 1, generator=sampler).squeeze(-1)
    originals = torch.where(selected, labels, masked_ids)
    return corrupted, originals


class ElectraLoss(NamedTuple):
    total: torch.Tensor
    generator: torch.Tensor  # MLM cross-entropy at the masked positions
    discriminator: torch.Tensor  # mean BCE over all real tokens
    replaced_fraction: float  # share of real tokens that the generator actually changed
    replaced_detected: float  # share of the replaced tokens the discriminator flags (logit > 0)
    original_kept: float  # share of the original tokens it leaves unflagged (logit <= 0)


def electra_loss(generator: BertForMaskedLM, discriminator: ElectraDiscriminator, masked_ids: torch.Tensor,
                 labels: torch.Tensor, attention_mask: torch.Tensor, *, disc_weight: float = 50.0,
                 sampler: torch.Generator | None = None) -> ElectraLoss:
    """ELECTRA's pre-training loss for one batch masked with :func:`companion.mlm.mask_tokens`."""
    gen_logits = generator(masked_ids, attention_mask).mlm_logits  # (B, T, V)
    gen_loss = F.cross_entropy(gen_logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
    corrupted, originals = corrupt_with_generator(gen_logits, masked_ids, labels, sampler=sampler)
    target = replaced_token_labels(originals, corrupted)  # (B, T)
    disc_logits = discriminator(corrupted, attention_mask)
    real = attention_mask.bool()
    disc_loss = F.binary_cross_entropy_with_logits(disc_logits[real], target[real])
    flagged, replaced = disc_logits.detach()[real] > 0, target[real].bool()
    detected = float(flagged[replaced].float().mean()) if replaced.any() else float("nan")
    kept = float((~flagged[~replaced]).float().mean()) if (~replaced).any() else float("nan")
    return ElectraLoss(gen_loss + disc_weight * disc_loss, gen_loss, disc_loss, float(replaced.float().mean()),
                       detected, kept)


def electra_config_from_hf(hf_config) -> BertConfig:
    """``BertConfig`` equivalent to a Hugging Face ``ElectraConfig``."""
    e = hf_config.embedding_size
    return config_from_hf(hf_config, model_type="electra", embedding_size=None if e == hf_config.hidden_size else e)


def from_hf_electra(source) -> ElectraDiscriminator:
    """The course's discriminator holding a Hugging Face ``ElectraForPreTraining`` (object or folder)."""
    hf_config, sd = hf_source(source)
    if "discriminator_predictions.dense.weight" not in sd:
        raise ValueError("expected ElectraForPreTraining weights (a discriminator head 'discriminator_predictions')")
    cfg = electra_config_from_hf(hf_config)
    model = ElectraDiscriminator(cfg)
    names = _encoder_names(model.bert, "bert.", "electra.", project="electra.embeddings_project")
    names.update({"dense.weight": "discriminator_predictions.dense.weight",
                  "dense.bias": "discriminator_predictions.dense.bias",
                  "out.weight": "discriminator_predictions.dense_prediction.weight",
                  "out.bias": "discriminator_predictions.dense_prediction.bias"})
    copy_by_name_map(model, _fuse_qkv(sd), names, ignore=_HF_IGNORE)
    return model.eval()
