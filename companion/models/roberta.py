"""RoBERTa: BERT's architecture, trained differently (Chapter 8).

Liu et al. (2019), "RoBERTa: A Robustly Optimized BERT Pretraining Approach".
The network is :class:`~companion.models.bert.BertModel` with two switches of
:class:`~companion.models.bert.BertConfig`:

* ``positions_from_padding=True``: position ids come from the input ids as in
  fairseq, real tokens numbered ``pad_id + 1, pad_id + 2, ...`` and padding given
  ``pad_id`` (:func:`~companion.models.bert.padding_position_ids`); with
  ``pad_id = 1`` the position table has 512 + 2 rows;
* ``n_segments=1``: no sentence pairs in pre-training, one segment row.

What RoBERTa changed is the training (section 4): dynamic masking
(:class:`companion.mlm.DynamicMasking`), no next-sentence prediction,
FULL-SENTENCES inputs (:func:`companion.mlm.pack_full_sentences`), larger batches,
more data and a byte-level BPE vocabulary of 50K (Chapter 9's tokenizer).

:func:`from_hf_roberta` loads Hugging Face ``RobertaModel`` or ``RobertaForMaskedLM``.
"""

from __future__ import annotations

from ._hf import copy_by_name_map, hf_source
from .bert import _HF_IGNORE, BertConfig, BertForMaskedLM, BertModel, _encoder_names, _fuse_qkv, config_from_hf

__all__ = ["ROBERTA_BASE", "ROBERTA_LARGE", "roberta_config_from_hf", "from_hf_roberta"]

# roberta-base / roberta-large: BERT's sizes, 50,265 BPE tokens, 514 positions, pad id 1, LayerNorm eps 1e-5
ROBERTA_BASE = BertConfig(vocab_size=50265, max_positions=514, n_segments=1, norm_eps=1e-5, pad_id=1,
                          positions_from_padding=True)
ROBERTA_LARGE = BertConfig(vocab_size=50265, d_model=1024, n_layers=24, n_heads=16, d_ff=4096, max_positions=514,
                           n_segments=1, norm_eps=1e-5, pad_id=1, positions_from_padding=True)


def roberta_config_from_hf(hf_config) -> BertConfig:
    """``BertConfig`` equivalent to a Hugging Face ``RobertaConfig``."""
    return config_from_hf(hf_config, model_type="roberta", positions_from_padding=True)


def from_hf_roberta(source) -> BertModel | BertForMaskedLM:
    """The course's model holding a Hugging Face ``RobertaModel`` or ``RobertaForMaskedLM`` (object or folder)."""
    hf_config, sd = hf_source(source)
    cfg = roberta_config_from_hf(hf_config)
    has_mlm = "lm_head.dense.weight" in sd
    if has_mlm:
        model, ours, theirs = BertForMaskedLM(cfg), "bert.", "roberta."
    else:
        theirs = "roberta." if any(k.startswith("roberta.") for k in sd) else ""
        model, ours = BertModel(cfg, pooler=f"{theirs}pooler.dense.weight" in sd), ""
    bert = model.bert if has_mlm else model
    names = _encoder_names(bert, ours, theirs)
    if has_mlm:
        names.update({"mlm.dense.weight": "lm_head.dense.weight", "mlm.dense.bias": "lm_head.dense.bias",
                      "mlm.norm.weight": "lm_head.layer_norm.weight", "mlm.norm.bias": "lm_head.layer_norm.bias",
                      "mlm.bias": "lm_head.bias"})
    # the decoder's weight is the embedding (tied) and its bias is lm_head.bias (tied)
    copy_by_name_map(model, _fuse_qkv(sd), names, ignore=_HF_IGNORE + (r"^lm_head\.decoder\.(weight|bias)$",))
    return model.eval()
