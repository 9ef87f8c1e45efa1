"""ALBERT: BERT with fewer parameters (Chapter 8).

Lan et al. (2020), "ALBERT: A Lite BERT for Self-supervised Learning of Language
Representations", section 3.1. Two switches of :class:`~companion.models.bert.BertConfig`:

* **factorised embeddings**, ``embedding_size=E`` (128): the token table is
  V x E instead of V x D, followed by one E x D projection, so the embedding
  parameters fall from V D to V E + E D;
* **cross-layer sharing**, ``share_layers=True``: all blocks use one set of
  parameters (attention and feed-forward), so the encoder's parameters do not
  grow with depth.

The MLM head maps D -> E and decodes with the (tied) E-wide token table. ALBERT
also replaced NSP by sentence-order prediction (SOP: two consecutive segments,
swapped or not); its GELU is the tanh approximation (``gelu_new``).

:func:`from_hf_albert` loads Hugging Face ``AlbertModel`` or ``AlbertForMaskedLM``
(one hidden group with one layer, the shared layout of every released ALBERT).
"""

from __future__ import annotations

from ._hf import copy_by_name_map, hf_source
from .bert import BertConfig, BertForMaskedLM, BertModel, _encoder_names, _fuse_qkv, config_from_hf

__all__ = ["ALBERT_CONFIGS", "albert_config_from_hf", "from_hf_albert"]

_ALBERT = dict(vocab_size=30000, embedding_size=128, max_positions=512, activation="gelu_tanh", dropout=0.0,
               share_layers=True)
# Table 1 of the paper (and the released configs): published sizes 12M, 18M, 60M, 235M.
ALBERT_CONFIGS = {
    "base": BertConfig(d_model=768, n_layers=12, n_heads=12, d_ff=3072, **_ALBERT),
    "large": BertConfig(d_model=1024, n_layers=24, n_heads=16, d_ff=4096, **_ALBERT),
    "xlarge": BertConfig(d_model=2048, n_layers=24, n_heads=16, d_ff=8192, **_ALBERT),
    "xxlarge": BertConfig(d_model=4096, n_layers=12, n_heads=64, d_ff=16384, **_ALBERT),
}

_ALBERT_LAYER_NAMES = {"self_attn.qkv": "attention.{query,key,value}", "self_attn.out": "attention.dense",
                       "norm1": "attention.LayerNorm", "ffn.up": "ffn", "ffn.down": "ffn_output",
                       "norm2": "full_layer_layer_norm"}


def albert_config_from_hf(hf_config) -> BertConfig:
    """``BertConfig`` equivalent to a Hugging Face ``AlbertConfig`` (all layers in one shared group)."""
    if getattr(hf_config, "num_hidden_groups", 1) != 1 or getattr(hf_config, "inner_group_num", 1) != 1:
        raise ValueError("only num_hidden_groups=1 and inner_group_num=1 (every released ALBERT) are supported, "
                         f"got {hf_config.num_hidden_groups} and {hf_config.inner_group_num}")
    return config_from_hf(hf_config, model_type="albert", embedding_size=hf_config.embedding_size, share_layers=True)


def from_hf_albert(source) -> BertModel | BertForMaskedLM:
    """The course's model holding a Hugging Face ``AlbertModel`` or ``AlbertForMaskedLM`` (object or folder)."""
    hf_config, sd = hf_source(source)
    cfg = albert_config_from_hf(hf_config)
    has_mlm = "predictions.dense.weight" in sd
    theirs = "albert." if any(k.startswith("albert.") for k in sd) else ""
    if has_mlm:
        model, ours = BertForMaskedLM(cfg), "bert."
    else:
        model, ours = BertModel(cfg, pooler=f"{theirs}pooler.weight" in sd), ""
    bert = model.bert if has_mlm else model
    names = _encoder_names(bert, ours, theirs, layer="encoder.albert_layer_groups.0.albert_layers.0.",
                           parts=_ALBERT_LAYER_NAMES, project=f"{theirs}encoder.embedding_hidden_mapping_in")
    if bert.pooler is not None:  # ALBERT's pooler is a bare Linear named "pooler"
        names.update({f"{ours}pooler.weight": f"{theirs}pooler.weight", f"{ours}pooler.bias": f"{theirs}pooler.bias"})
    if has_mlm:
        names.update({"mlm.dense.weight": "predictions.dense.weight", "mlm.dense.bias": "predictions.dense.bias",
                      "mlm.norm.weight": "predictions.LayerNorm.weight", "mlm.norm.bias": "predictions.LayerNorm.bias",
                      "mlm.bias": "predictions.bias"})
    ignore = (r"embeddings\.position_ids$", r"embeddings\.token_type_ids$", r"^predictions\.decoder\.(weight|bias)$")
    copy_by_name_map(model, _fuse_qkv(sd), names, ignore=ignore)
    return model.eval()
