"""DeBERTa (v2/v3): disentangled attention with relative positions (Chapter 8).

He et al. (2021), "DeBERTa: Decoding-enhanced BERT with Disentangled Attention",
section 3.1. A token is represented by its content vector; positions enter
attention only as *relative* distances, through a shared table of relative
position embeddings ``R`` (one row per bucket of distance, 2k rows). The score of
query i for key j is the sum of three terms,

    content-to-content   q_i . k_j
    content-to-position  q_i . Kr[d(i, j)]      (c2p: the query's content, the key's relative position)
    position-to-content  k_j . Qr[d(i, j)]      (p2c: the key's content, the query's relative position)

all divided by ``sqrt(3 Dh)`` (the 3 counts the terms), where ``Qr = R W_q``
and ``Kr = R W_k`` are the position rows projected with the layer's own query and
key weights (``share_att_key``, as in every released v2/v3 model) and ``d(i, j)``
is the bucketed distance ``i - j`` shifted to a row index (:func:`relative_buckets`).
Distances up to ``n_position_buckets / 2`` get a row each; longer ones share rows
on a log scale (:func:`log_bucket_position`).

The course adds nothing to the attention kernel: :class:`DisentangledAttention`,
a :class:`~companion.attention.MultiHeadAttention` with its own ``forward``,
computes the two position terms from its projected queries and keys and hands
them to the kernel as an additive score ``bias``. The blocks are BERT's post-LN blocks. :func:`from_hf_deberta_v2` loads Hugging Face
``DebertaV2Model``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .._checks import check_positive_int, check_probability, check_token_ids
from ..attention import MultiHeadAttention
from ..blocks import Block, FeedForward, make_norm
from ..masks import padding_mask
from ._hf import activation_from_hf, copy_by_name_map, hf_source
from .bert import _fuse_qkv, _init_weights

__all__ = ["DebertaConfig", "log_bucket_position", "relative_buckets", "DisentangledAttention", "DebertaModel",
           "from_hf_deberta_v2"]


@dataclass(frozen=True)
class DebertaConfig:
    """Sizes of a DeBERTa-v2/v3 encoder. Defaults: DeBERTa-v3-base (without the vocabulary's exact size)."""

    vocab_size: int = 128100
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_ff: int = 3072
    max_positions: int = 512  # longest input; also the largest distance the log buckets reach
    n_position_buckets: int = 256  # k: distances |i - j| < k/2 get a row each, the rest share log-spaced rows
    absolute_positions: bool = False  # v3: no absolute position embedding at the input
    n_segments: int = 0  # v3: no segment embedding
    norm_eps: float = 1e-7
    dropout: float = 0.1
    activation: str = "gelu"
    pad_id: int = 0
    norm_relative: bool = True  # LayerNorm on the relative embedding table (norm_rel_ebd="layer_norm")

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_positions", "n_position_buckets"):
            check_positive_int(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.n_position_buckets < 4 or self.n_position_buckets % 2:
            raise ValueError(f"n_position_buckets must be an even int >= 4, got {self.n_position_buckets}")
        if self.max_positions <= self.n_position_buckets // 2:
            raise ValueError(f"max_positions ({self.max_positions}) must exceed n_position_buckets / 2 "
                             f"({self.n_position_buckets // 2})")
        check_probability("dropout", self.dropout)
        if self.activation not in ("gelu", "gelu_tanh", "relu"):
            raise ValueError(f"activation must be 'gelu', 'gelu_tanh' or 'relu', got {self.activation!r}")


def log_bucket_position(relative: torch.Tensor, bucket_size: int, max_position: int) -> torch.Tensor:
    """DeBERTa-v2's bucketing of a signed distance ``i - j``: exact while ``|d| <= bucket_size / 2``,
    then ``sign(d) * (mid + ceil((mid - 1) * log(|d| / mid) / log((max_position - 1) / mid)))``, mid = bucket_size / 2.

    >>> log_bucket_position(torch.tensor([0, 3, -4, 5, 100, -511]), bucket_size=8, max_position=512).tolist()
    [0, 3, -4, 5, 7, -7]
    """
    if not isinstance(relative, torch.Tensor) or relative.is_floating_point():
        raise TypeError("relative must be an integer tensor of distances")
    mid = bucket_size // 2
    d = relative.double()
    far = d.abs().clamp(min=mid)  # only used where |d| > mid
    log_pos = torch.ceil(torch.log(far / mid) / math.log((max_position - 1) / mid) * (mid - 1)) + mid
    return torch.where(d.abs() <= mid, d, torch.sign(d) * log_pos).long()


def relative_buckets(t: int, bucket_size: int, max_position: int) -> torch.Tensor:
    """Row index into the 2k-row relative table for query i and key j: ``clamp(bucket(i - j) + k, 0, 2k - 1)``,
    k = bucket_size. (T, T)."""
    pos = torch.arange(t)
    d = log_bucket_position(pos[:, None] - pos[None, :], bucket_size, max_position)
    return (d + bucket_size).clamp(0, 2 * bucket_size - 1)


class DisentangledAttention(MultiHeadAttention):
    """Self-attention with DeBERTa's two position terms added to the content scores (one layer).

    Same parameters as :class:`~companion.attention.MultiHeadAttention` (a fused
    ``qkv`` and ``out``); its ``forward`` also takes the model's (normalised)
    relative table ``table`` (2k, D) and the row index ``rows`` (T, T) of every
    query-key pair, and adds :meth:`position_scores` to the scaled scores as a bias.
    """

    def forward(self, x, mask=None, *, table, rows, head_mask=None):
        """``x`` (B, T, D) -> (B, T, D); ``table`` (2k, D), ``rows`` (T, T) from :func:`relative_buckets`."""
        q, k, v = self.heads(x)  # each (B, H, T, Dh)
        bias = self.position_scores(q, k, table, rows)  # (B, H, T, T)
        return self.out(self._attention(q, k, v, mask, bias=bias, head_mask=head_mask))  # (B, T, D)

    def position_scores(self, q: torch.Tensor, k: torch.Tensor, table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """c2p + p2c, scaled like the content scores: ``(B, H, T, T)``.

        ``Qr``/``Kr`` are the relative table projected by this layer's own query and
        key weights (share_att_key); entry ``[i, j]`` reads row ``rows[i, j] = d(i, j)``.
        """
        pos_q, pos_k, _ = self.heads(table[None])  # (1, H, 2k, Dh) each: the table as queries and keys
        t = q.shape[-2]
        c2p = q @ pos_k.transpose(-1, -2)  # (B, H, T, 2k): query content x every relative row
        c2p = torch.gather(c2p, -1, rows.expand(*c2p.shape[:-1], t))  # (B, H, T, T): row d(i, j)
        p2c = k @ pos_q.transpose(-1, -2)  # (B, H, T, 2k): key content x every relative row
        p2c = torch.gather(p2c, -1, rows.T.expand(*p2c.shape[:-1], t)).transpose(-1, -2)  # [i, j] = k_j . Qr[d(i, j)]
        return (c2p + p2c) * self.scale


class DebertaModel(nn.Module):
    """Embeddings (token, optional absolute position and segment; LayerNorm), post-LN blocks with
    disentangled attention, and the shared relative position table. Returns the hidden states (B, T, D)."""

    def __init__(self, cfg: DebertaConfig) -> None:
        super().__init__()
        if not isinstance(cfg, DebertaConfig):
            raise TypeError(f"cfg must be a DebertaConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_positions, cfg.d_model) if cfg.absolute_positions else None
        self.seg_emb = nn.Embedding(cfg.n_segments, cfg.d_model) if cfg.n_segments else None
        self.norm = make_norm("layernorm", cfg.d_model, cfg.norm_eps)
        self.drop = nn.Dropout(cfg.dropout)
        scale = 1.0 / math.sqrt(3 * cfg.d_model // cfg.n_heads)  # sqrt(3 Dh): three score terms
        self.blocks = nn.ModuleList()
        for i in range(cfg.n_layers):
            attn = DisentangledAttention(cfg.d_model, cfg.n_heads, scale=scale, dropout=cfg.dropout, layer_idx=i,
                                         backend="manual")
            ffn = FeedForward(cfg.d_model, cfg.d_ff, activation=cfg.activation)
            self.blocks.append(Block(attn, ffn, make_norm("layernorm", cfg.d_model, cfg.norm_eps),
                                     make_norm("layernorm", cfg.d_model, cfg.norm_eps), norm_first=False,
                                     dropout=cfg.dropout))
        self.relative = nn.Embedding(2 * cfg.n_position_buckets, cfg.d_model)  # R, shared by every layer
        self.relative_norm = make_norm("layernorm", cfg.d_model, cfg.norm_eps) if cfg.norm_relative else None
        self.apply(_init_weights)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        check_token_ids("input_ids", input_ids, self.cfg.vocab_size)
        t = input_ids.shape[1]
        if t > self.cfg.max_positions:
            raise ValueError(f"input has {t} tokens, more than max_positions={self.cfg.max_positions}")
        x = self.tok_emb(input_ids)
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(t, device=input_ids.device))
        if self.seg_emb is not None:
            x = x + self.seg_emb(torch.zeros_like(input_ids) if segment_ids is None else segment_ids)
        x = self.norm(x)
        mask = None
        if attention_mask is not None:
            if attention_mask.shape != input_ids.shape:
                raise ValueError(f"attention_mask must have input_ids' shape {tuple(input_ids.shape)}, "
                                 f"got {tuple(attention_mask.shape)}")
            x = x * attention_mask.unsqueeze(-1).to(x.dtype)  # padding embeddings zeroed, as DeBERTa does
            mask = padding_mask(attention_mask)  # (B, 1, 1, T)
        x = self.drop(x)
        table = self.relative.weight if self.relative_norm is None else self.relative_norm(self.relative.weight)
        rows = relative_buckets(t, self.cfg.n_position_buckets, self.cfg.max_positions).to(input_ids.device)  # (T, T)
        for block in self.blocks:
            x = block(x, mask, table=table, rows=rows)
        return x


def _config_from_hf(hf_config) -> DebertaConfig:
    if getattr(hf_config, "model_type", None) != "deberta-v2":
        raise TypeError(f"expected a DeBERTa-v2 config, got model_type={getattr(hf_config, 'model_type', None)!r}")
    checks = {"relative_attention": True, "share_att_key": True}
    for name, want in checks.items():
        if getattr(hf_config, name, None) != want:
            raise ValueError(f"only {name}={want} is supported (every released v2/v3 model), "
                             f"got {getattr(hf_config, name, None)!r}")
    if sorted(hf_config.pos_att_type or []) != ["c2p", "p2c"]:
        raise ValueError(f"only pos_att_type=['p2c', 'c2p'] is supported, got {hf_config.pos_att_type!r}")
    if getattr(hf_config, "conv_kernel_size", 0) > 0:
        raise ValueError("DeBERTa-v2's convolution layer (conv_kernel_size > 0) is not supported")
    if getattr(hf_config, "embedding_size", hf_config.hidden_size) != hf_config.hidden_size:
        raise ValueError("an embedding_size different from hidden_size is not supported")
    if getattr(hf_config, "attention_head_size", None) not in (None, hf_config.hidden_size // hf_config.num_attention_heads):
        raise ValueError("attention_head_size must be hidden_size / num_attention_heads")
    buckets = getattr(hf_config, "position_buckets", -1)
    max_rel = getattr(hf_config, "max_relative_positions", -1)
    max_rel = hf_config.max_position_embeddings if max_rel < 1 else max_rel
    if buckets <= 0:
        raise ValueError("only bucketed relative positions (position_buckets > 0) are supported")
    if max_rel != hf_config.max_position_embeddings:
        raise ValueError("max_relative_positions must equal max_position_embeddings (or be -1)")
    activation = activation_from_hf(hf_config.hidden_act, ("gelu", "gelu_tanh", "relu"))
    if hf_config.hidden_dropout_prob != hf_config.attention_probs_dropout_prob:
        raise ValueError("the course's DeBERTa has one dropout probability; this config uses two different ones")
    norm_rel = [x.strip() for x in getattr(hf_config, "norm_rel_ebd", "none").lower().split("|")]
    return DebertaConfig(
        vocab_size=hf_config.vocab_size, d_model=hf_config.hidden_size, n_layers=hf_config.num_hidden_layers,
        n_heads=hf_config.num_attention_heads, d_ff=hf_config.intermediate_size,
        max_positions=hf_config.max_position_embeddings, n_position_buckets=buckets,
        absolute_positions=getattr(hf_config, "position_biased_input", True), n_segments=hf_config.type_vocab_size,
        norm_eps=hf_config.layer_norm_eps, dropout=hf_config.hidden_dropout_prob, activation=activation,
        pad_id=hf_config.pad_token_id or 0, norm_relative="layer_norm" in norm_rel,
    )


@torch.no_grad()
def from_hf_deberta_v2(source) -> DebertaModel:
    """The course's DeBERTa holding a Hugging Face ``DebertaV2Model`` (object or saved folder)."""
    hf_config, sd = hf_source(source)
    cfg = _config_from_hf(hf_config)
    model = DebertaModel(cfg)
    p = "deberta." if any(k.startswith("deberta.") for k in sd) else ""
    names = {"tok_emb.weight": f"{p}embeddings.word_embeddings.weight", "norm.weight": f"{p}embeddings.LayerNorm.weight",
             "norm.bias": f"{p}embeddings.LayerNorm.bias", "relative.weight": f"{p}encoder.rel_embeddings.weight"}
    if model.pos_emb is not None:
        names["pos_emb.weight"] = f"{p}embeddings.position_embeddings.weight"
    if model.seg_emb is not None:
        names["seg_emb.weight"] = f"{p}embeddings.token_type_embeddings.weight"
    if model.relative_norm is not None:
        names.update({"relative_norm.weight": f"{p}encoder.LayerNorm.weight",
                      "relative_norm.bias": f"{p}encoder.LayerNorm.bias"})
    parts = {"self_attn.qkv": "attention.self.{query,key,value}_proj", "self_attn.out": "attention.output.dense",
             "norm1": "attention.output.LayerNorm", "ffn.up": "intermediate.dense", "ffn.down": "output.dense",
             "norm2": "output.LayerNorm"}
    for i in range(cfg.n_layers):
        for a, b in parts.items():
            for w in ("weight", "bias"):
                names[f"blocks.{i}.{a}.{w}"] = f"{p}encoder.layer.{i}.{b}.{w}"
    fused = dict(sd)
    for name in sd:  # query_proj, key_proj, value_proj -> one fused qkv
        for w in ("weight", "bias"):
            if name.endswith(f".attention.self.query_proj.{w}"):
                stem = name[: -len(f"query_proj.{w}")]
                fused[f"{stem}{{query,key,value}}_proj.{w}"] = torch.cat(
                    [sd[f"{stem}{x}_proj.{w}"] for x in ("query", "key", "value")])
                for x in ("query", "key", "value"):
                    del fused[f"{stem}{x}_proj.{w}"]
    copy_by_name_map(model, fused, names, ignore=(r"embeddings\.position_ids$",))
    return model.eval()
