"""BERT: a bidirectional Transformer encoder pre-trained as a masked language model (Chapter 7).

Devlin et al. (2019), "BERT: Pre-training of Deep Bidirectional Transformers
for Language Understanding". The model is assembled from the shared parts:

* input: token + segment + position embeddings, summed, then LayerNorm and dropout;
* encoder: ``n_layers`` post-LN :class:`~companion.blocks.Block` s, each a
  :class:`~companion.attention.MultiHeadAttention` (no causal mask, only the
  padding mask of :func:`~companion.masks.padding_mask`) and a GELU
  :class:`~companion.blocks.FeedForward`;
* pooler: ``tanh(W h_[CLS] + b)``, the input of the next-sentence head;
* masked-LM head: dense + GELU + LayerNorm, then a decoder whose weight **is**
  the token embedding matrix (tied) plus its own bias;
* next-sentence head: a linear layer on the pooled vector, 2 classes
  (0 = IsNext, 1 = NotNext, Hugging Face's order).

Weights of Hugging Face ``BertModel``, ``BertForMaskedLM`` and
``BertForPreTraining`` (objects, or folders written by ``save_pretrained``)
load with :func:`from_hf_bert`; :func:`load_pretrained` reads such a folder
without importing ``transformers``.

Shape legend: B batch, T length, D model size, F feed-forward size, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from .._checks import ShapeChecker, check_positive_int, check_probability, check_token_ids
from ..attention import MultiHeadAttention
from ..blocks import ACTIVATIONS  # the FFN's table: one GELU for both
from ..blocks import Block, FeedForward, make_norm
from ..masks import padding_mask
from ._hf import activation_from_hf, copy_by_name_map, fuse_rows, hf_source

__all__ = [
    "BertConfig", "BERT_BASE", "BERT_LARGE",
    "BertEmbeddings", "BertModel", "MLMHead", "BertForMaskedLM", "BertForPreTraining",
    "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering", "SpanLogits",
    "BertOutput", "PreTrainingOutput", "mean_pool",
    "config_from_hf", "from_hf_bert", "load_pretrained", "padding_position_ids",
]

@dataclass(frozen=True)
class BertConfig:
    """Sizes of a BERT model. Defaults are BERT-base (uncased)."""

    vocab_size: int = 30522  # V, WordPiece vocabulary
    d_model: int = 768  # D, width of the residual stream
    n_layers: int = 12  # encoder blocks
    n_heads: int = 12  # H, attention heads per block (D / H per head)
    d_ff: int = 3072  # F, hidden size of the feed-forward network (4 D)
    max_positions: int = 512  # rows of the learned position table
    n_segments: int = 2  # rows of the segment (token type) table: sentence A and B
    norm_eps: float = 1e-12  # epsilon of every LayerNorm (BERT's TensorFlow value)
    dropout: float = 0.1  # on embeddings, sublayer outputs and attention weights
    activation: str = "gelu"  # of the FFN and of the MLM head's transform: exact (erf) GELU
    pad_id: int = 0  # id of [PAD] (its embedding row is an ordinary trained row in BERT)
    # Chapter 8's variants, each a switch of the same model (defaults: BERT):
    embedding_size: int | None = None  # E: ALBERT/ELECTRA embed in E < D dims and project to D (None: E = D)
    share_layers: bool = False  # ALBERT: every block uses the parameters of the first
    positions_from_padding: bool = False  # RoBERTa: positions count real tokens and start at pad_id + 1

    @property
    def embed_dim(self) -> int:
        """E, the width of the embeddings and of the MLM head's output (``d_model`` unless factorised)."""
        return self.d_model if self.embedding_size is None else self.embedding_size

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_positions", "n_segments"):
            check_positive_int(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        check_probability("dropout", self.dropout)
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be positive, got {self.norm_eps!r}")
        if self.activation not in ("gelu", "gelu_tanh", "relu"):
            raise ValueError(f"activation must be 'gelu', 'gelu_tanh' or 'relu', got {self.activation!r}")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"pad_id={self.pad_id} must be a token id in [0, {self.vocab_size})")
        if self.embedding_size is not None:
            check_positive_int("embedding_size", self.embedding_size)
        for name in ("share_layers", "positions_from_padding"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.positions_from_padding and self.max_positions < self.pad_id + 2:
            raise ValueError(f"positions_from_padding needs max_positions > pad_id + 1 = {self.pad_id + 1} "
                             f"(positions start at pad_id + 1), got {self.max_positions}")


BERT_BASE = BertConfig()
BERT_LARGE = BertConfig(d_model=1024, n_layers=24, n_heads=16, d_ff=4096)


class BertOutput(NamedTuple):
    hidden: torch.Tensor  # (B, T, D), the last block's output
    pooled: torch.Tensor | None  # (B, D), tanh(W h_[CLS] + b); None without a pooler


class PreTrainingOutput(NamedTuple):
    mlm_logits: torch.Tensor  # (B, T, V)
    nsp_logits: torch.Tensor | None  # (B, 2): IsNext, NotNext; None for BertForMaskedLM
    hidden: torch.Tensor  # (B, T, D)


def padding_position_ids(input_ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """RoBERTa's (fairseq's) position ids: real tokens are numbered ``pad_id + 1, pad_id + 2, ...``
    in order, padding tokens get ``pad_id``. (B, T) -> (B, T).

    >>> padding_position_ids(torch.tensor([[0, 5, 6, 1, 1]]), pad_id=1).tolist()
    [[2, 3, 4, 1, 1]]
    """
    check_token_ids("input_ids", input_ids, None)
    real = (input_ids != pad_id).long()  # (B, T)
    return torch.cumsum(real, dim=1) * real + pad_id


class BertEmbeddings(nn.Module):
    """``LayerNorm(token[ids] + position[0..T-1] + segment[segment_ids])`` then dropout.

    With ``cfg.embedding_size`` = E < D (ALBERT, ELECTRA) the three tables are E wide and
    a linear map ``project`` takes the result to D. With ``cfg.positions_from_padding``
    (RoBERTa) the default positions come from :func:`padding_position_ids`.
    """

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        e = cfg.embed_dim
        self.tok_emb = nn.Embedding(cfg.vocab_size, e)
        self.pos_emb = nn.Embedding(cfg.max_positions, e)
        self.seg_emb = nn.Embedding(cfg.n_segments, e)
        self.norm = make_norm("layernorm", e, cfg.norm_eps)
        self.drop = nn.Dropout(cfg.dropout)
        self.project = nn.Linear(e, cfg.d_model) if e != cfg.d_model else None  # factorised: E -> D

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        sc = ShapeChecker()
        check_token_ids("input_ids", input_ids, self.cfg.vocab_size, sc=sc)
        t = input_ids.shape[1]
        if t > self.cfg.max_positions:
            raise ValueError(f"input has {t} tokens, more than max_positions={self.cfg.max_positions}")
        if segment_ids is None:
            segment_ids = torch.zeros_like(input_ids)
        check_token_ids("segment_ids", segment_ids, self.cfg.n_segments, sc=sc)
        if position_ids is None and self.cfg.positions_from_padding:
            position_ids = padding_position_ids(input_ids, self.cfg.pad_id)  # (B, T)
        elif position_ids is None:
            position_ids = torch.arange(t, device=input_ids.device)  # (T,), broadcast over B
        check_token_ids("position_ids", position_ids, self.cfg.max_positions,
                        ("T",) if position_ids.dim() == 1 else ("B", "T"), sc)
        x = self.tok_emb(input_ids) + self.pos_emb(position_ids) + self.seg_emb(segment_ids)  # (B, T, E)
        x = self.drop(self.norm(x))
        return x if self.project is None else self.project(x)  # (B, T, D)


def _block(cfg: BertConfig, layer_idx: int) -> Block:
    attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, dropout=cfg.dropout, layer_idx=layer_idx)
    ffn = FeedForward(cfg.d_model, cfg.d_ff, activation=cfg.activation)
    norm1 = make_norm("layernorm", cfg.d_model, cfg.norm_eps)
    norm2 = make_norm("layernorm", cfg.d_model, cfg.norm_eps)
    return Block(attn, ffn, norm1, norm2, norm_first=False, dropout=cfg.dropout)  # post-LN


class BertModel(nn.Module):
    """Embeddings, ``n_layers`` post-LN blocks and (optionally) the pooler."""

    def __init__(self, cfg: BertConfig, *, pooler: bool = True) -> None:
        super().__init__()
        if not isinstance(cfg, BertConfig):
            raise TypeError(f"cfg must be a BertConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.embeddings = BertEmbeddings(cfg)
        if cfg.share_layers:  # ALBERT: one set of block parameters, applied n_layers times
            shared = _block(cfg, 0)
            self.blocks = nn.ModuleList([shared] * cfg.n_layers)
        else:
            self.blocks = nn.ModuleList(_block(cfg, i) for i in range(cfg.n_layers))
        self.pooler = nn.Linear(cfg.d_model, cfg.d_model) if pooler else None
        self.apply(_init_weights)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                segment_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None) -> BertOutput:
        """``input_ids`` (B, T); ``attention_mask`` (B, T), 1 on tokens and 0 on padding."""
        x = self.embeddings(input_ids, segment_ids, position_ids)  # (B, T, D)
        mask = None
        if attention_mask is not None:
            if attention_mask.shape != input_ids.shape:
                raise ValueError(f"attention_mask must have input_ids' shape {tuple(input_ids.shape)}, "
                                 f"got {tuple(attention_mask.shape)}")
            mask = padding_mask(attention_mask)  # (B, 1, 1, T): every query sees every real key
        for block in self.blocks:
            x = block(x, mask)
        pooled = torch.tanh(self.pooler(x[:, 0])) if self.pooler is not None else None  # (B, D), from [CLS]
        return BertOutput(x, pooled)


class MLMHead(nn.Module):
    """``LayerNorm(act(W h + b)) E^T + b_V``: the decoder's weight is the token embedding ``E`` (tied)."""

    def __init__(self, cfg: BertConfig, tok_emb: nn.Embedding) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.embed_dim)  # D -> E (E = D except in ALBERT/ELECTRA)
        self.activation = cfg.activation  # checked by BertConfig
        self.norm = make_norm("layernorm", cfg.embed_dim, cfg.norm_eps)
        self.tok_emb = tok_emb  # shared module: the same Parameter, not a copy
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        h = self.norm(ACTIVATIONS[self.activation](self.dense(hidden)))  # (B, T, D)
        return nn.functional.linear(h, self.tok_emb.weight, self.bias)  # (B, T, V): h E^T + b


class BertForMaskedLM(nn.Module):
    """BERT (no pooler) with the masked-LM head, as RoBERTa and Hugging Face's ``BertForMaskedLM``."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.bert = BertModel(cfg, pooler=False)
        self.mlm = MLMHead(cfg, self.bert.embeddings.tok_emb)
        self.mlm.apply(_init_weights)

    def forward(self, input_ids, attention_mask=None, segment_ids=None, position_ids=None) -> PreTrainingOutput:
        out = self.bert(input_ids, attention_mask, segment_ids, position_ids)
        return PreTrainingOutput(self.mlm(out.hidden), None, out.hidden)


class BertForPreTraining(nn.Module):
    """BERT with both pre-training heads: masked LM on every position, next sentence on [CLS]."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.bert = BertModel(cfg, pooler=True)
        self.mlm = MLMHead(cfg, self.bert.embeddings.tok_emb)
        self.nsp = nn.Linear(cfg.d_model, 2)  # 0 = IsNext, 1 = NotNext
        self.mlm.apply(_init_weights)
        _init_weights(self.nsp)

    def forward(self, input_ids, attention_mask=None, segment_ids=None, position_ids=None) -> PreTrainingOutput:
        out = self.bert(input_ids, attention_mask, segment_ids, position_ids)
        return PreTrainingOutput(self.mlm(out.hidden), self.nsp(out.pooled), out.hidden)


# --- fine-tuning heads --------------------------------------------------------------------------------

def _check_n_labels(n_labels: object) -> int:
    if isinstance(n_labels, bool) or not isinstance(n_labels, int) or n_labels < 1:
        raise ValueError(f"n_labels must be a positive int, got {n_labels!r}")
    return n_labels


class BertForSequenceClassification(nn.Module):
    """One label per input: ``Linear(dropout(pooled))``, the pooled [CLS] vector of :class:`BertModel`.

    Returns logits (B, n_labels). Devlin et al. (2019), section 4.1 (GLUE).
    """

    def __init__(self, cfg: BertConfig, n_labels: int) -> None:
        super().__init__()
        self.cfg, self.n_labels = cfg, _check_n_labels(n_labels)
        self.bert = BertModel(cfg, pooler=True)
        self.dropout = nn.Dropout(cfg.dropout)
        self.classifier = nn.Linear(cfg.d_model, n_labels)
        _init_weights(self.classifier)

    def forward(self, input_ids, attention_mask=None, segment_ids=None, position_ids=None) -> torch.Tensor:
        return self.classifier(self.dropout(self.bert(input_ids, attention_mask, segment_ids, position_ids).pooled))


class BertForTokenClassification(nn.Module):
    """One label per token: ``Linear(dropout(h_t))`` on every final hidden state; logits (B, T, n_labels).

    Devlin et al. (2019), section 5.3 (named-entity recognition, the first sub-token of each word labelled).
    """

    def __init__(self, cfg: BertConfig, n_labels: int) -> None:
        super().__init__()
        self.cfg, self.n_labels = cfg, _check_n_labels(n_labels)
        self.bert = BertModel(cfg, pooler=False)
        self.dropout = nn.Dropout(cfg.dropout)
        self.classifier = nn.Linear(cfg.d_model, n_labels)
        _init_weights(self.classifier)

    def forward(self, input_ids, attention_mask=None, segment_ids=None, position_ids=None) -> torch.Tensor:
        return self.classifier(self.dropout(self.bert(input_ids, attention_mask, segment_ids, position_ids).hidden))


class SpanLogits(NamedTuple):
    start: torch.Tensor  # (B, T)
    end: torch.Tensor  # (B, T)


class BertForQuestionAnswering(nn.Module):
    """Span extraction (SQuAD, section 4.2): a start and an end score per token, ``h_t . S`` and ``h_t . E``.

    Returns :class:`SpanLogits` ``(start, end)``, each (B, T); padding positions are
    left to the loss (``masked_span_logits`` of the fine-tuning code sets them to -inf).
    """

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.bert = BertModel(cfg, pooler=False)
        self.span = nn.Linear(cfg.d_model, 2)  # columns: start, end
        _init_weights(self.span)

    def forward(self, input_ids, attention_mask=None, segment_ids=None, position_ids=None) -> SpanLogits:
        logits = self.span(self.bert(input_ids, attention_mask, segment_ids, position_ids).hidden)  # (B, T, 2)
        return SpanLogits(logits[..., 0], logits[..., 1])


def _init_weights(module: nn.Module) -> None:
    """BERT's initialisation: N(0, 0.02) weights, zero biases, LayerNorm at (1, 0)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Sentence embeddings: the mean of ``hidden`` (B, T, D) over real tokens, (B, D).

    ``attention_mask`` (B, T) is 1 on tokens and 0 on padding; a row with no
    token at all gives a zero vector (not NaN).
    """
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3:
        raise ValueError(f"hidden must have shape (B, T, D), got {getattr(hidden, 'shape', type(hidden).__name__)}")
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != hidden.shape[:2]:
        raise ValueError(f"attention_mask must have shape {tuple(hidden.shape[:2])}, "
                         f"got {getattr(attention_mask, 'shape', type(attention_mask).__name__)}")
    w = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    return (hidden * w).sum(1) / w.sum(1).clamp(min=1.0)  # (B, D)


# --- Hugging Face weights -------------------------------------------------------------------------

def config_from_hf(hf_config, *, model_type: str = "bert", **switches) -> BertConfig:
    """``BertConfig`` equivalent to a Hugging Face config of a BERT-like encoder (or a folder's config.json).

    ``model_type`` is the HF ``model_type`` expected (``"bert"``, ``"roberta"``, ``"albert"``,
    ``"electra"``); ``switches`` are the variant's own ``BertConfig`` fields
    (``positions_from_padding``, ``embedding_size``, ``share_layers``).
    """
    found = getattr(hf_config, "model_type", "bert")
    if found != model_type:
        raise TypeError(f"expected a {model_type} config, got model_type={found!r}")
    if getattr(hf_config, "position_embedding_type", "absolute") != "absolute":
        raise ValueError("only absolute (learned) position embeddings are supported, "
                         f"got {hf_config.position_embedding_type!r}")
    activation = activation_from_hf(getattr(hf_config, "hidden_act", "gelu"), ("gelu", "gelu_tanh", "relu"))
    if getattr(hf_config, "hidden_dropout_prob", 0.1) != getattr(hf_config, "attention_probs_dropout_prob", 0.1):
        raise ValueError("the course's BERT has one dropout probability; this config uses two different ones")
    return BertConfig(
        vocab_size=hf_config.vocab_size, d_model=hf_config.hidden_size, n_layers=hf_config.num_hidden_layers,
        n_heads=hf_config.num_attention_heads, d_ff=hf_config.intermediate_size,
        max_positions=hf_config.max_position_embeddings, n_segments=getattr(hf_config, "type_vocab_size", 2),
        norm_eps=getattr(hf_config, "layer_norm_eps", 1e-12), dropout=getattr(hf_config, "hidden_dropout_prob", 0.1),
        activation=activation, pad_id=getattr(hf_config, "pad_token_id", 0) or 0, **switches,
    )


_BERT_LAYER_NAMES = {"self_attn.qkv": "attention.self.{query,key,value}", "self_attn.out": "attention.output.dense",
                     "norm1": "attention.output.LayerNorm", "ffn.up": "intermediate.dense", "ffn.down": "output.dense",
                     "norm2": "output.LayerNorm"}


def _encoder_names(bert: BertModel, ours: str, theirs: str, *, layer: str = "encoder.layer.{i}.",
                   parts: dict[str, str] | None = None, project: str = "") -> dict[str, str]:
    """Our parameter names -> Hugging Face's for the embeddings, blocks and pooler of ``bert``.

    ``layer``: the source prefix of block ``i``; ``parts``: our block-relative names -> the
    source's; ``project``: the source name of the E -> D projection (factorised embeddings).
    With shared layers only block 0 is named (the others are the same parameters).
    """
    parts = _BERT_LAYER_NAMES if parts is None else parts
    names = {
        f"{ours}embeddings.tok_emb.weight": f"{theirs}embeddings.word_embeddings.weight",
        f"{ours}embeddings.pos_emb.weight": f"{theirs}embeddings.position_embeddings.weight",
        f"{ours}embeddings.seg_emb.weight": f"{theirs}embeddings.token_type_embeddings.weight",
        f"{ours}embeddings.norm.weight": f"{theirs}embeddings.LayerNorm.weight",
        f"{ours}embeddings.norm.bias": f"{theirs}embeddings.LayerNorm.bias",
    }
    n_named = 1 if bert.cfg.share_layers else len(bert.blocks)
    for i in range(n_named):
        for a, b in parts.items():
            for p in ("weight", "bias"):
                names[f"{ours}blocks.{i}.{a}.{p}"] = f"{theirs}{layer.format(i=i)}{b}.{p}"
    if bert.embeddings.project is not None:
        for p in ("weight", "bias"):
            names[f"{ours}embeddings.project.{p}"] = f"{project}.{p}"
    if bert.pooler is not None:
        names[f"{ours}pooler.weight"] = f"{theirs}pooler.dense.weight"
        names[f"{ours}pooler.bias"] = f"{theirs}pooler.dense.bias"
    return names


def _fuse_qkv(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every ``X.{query,key,value}.{weight,bias}`` stacked as our fused ``qkv`` holds them (BERT's
    ``attention.self``, ALBERT's ``attention``, RoBERTa's and ELECTRA's as BERT's)."""
    return fuse_rows(state_dict, ("query", "key", "value"), "{query,key,value}")


# Buffers some versions save, and the decoder that is tied to the token embedding.
_HF_IGNORE = (r"embeddings\.position_ids$", r"embeddings\.token_type_ids$",
              r"^cls\.predictions\.decoder\.(weight|bias)$")


@torch.no_grad()
def from_hf_bert(source) -> nn.Module:
    """The course's BERT holding the weights of a Hugging Face BERT (object or saved folder).

    ``BertModel`` gives a :class:`BertModel` (with the pooler if the source has
    one), ``BertForMaskedLM`` a :class:`BertForMaskedLM`, ``BertForPreTraining``
    a :class:`BertForPreTraining`, and the fine-tuning models
    ``BertForSequenceClassification``, ``BertForTokenClassification`` and
    ``BertForQuestionAnswering`` the course's classes of the same names; the
    kind is read from the tensor names.
    Every tensor is accounted for: a missing, unexpected or mis-shaped one
    raises a ``ValueError`` naming it.
    """
    hf_config, sd = hf_source(source)
    cfg = config_from_hf(hf_config)
    prefix = "bert." if any(k.startswith("bert.") for k in sd) else ""
    has_mlm = "cls.predictions.transform.dense.weight" in sd
    has_nsp = "cls.seq_relationship.weight" in sd
    head: dict[str, str] = {}
    if "classifier.weight" in sd and not has_mlm:
        n_labels = sd["classifier.weight"].shape[0]
        if "bert.pooler.dense.weight" in sd:
            model = BertForSequenceClassification(cfg, n_labels)
        else:
            model = BertForTokenClassification(cfg, n_labels)
        ours, head = "bert.", {"classifier.weight": "classifier.weight", "classifier.bias": "classifier.bias"}
    elif "qa_outputs.weight" in sd and not has_mlm:
        model, ours = BertForQuestionAnswering(cfg), "bert."
        head = {"span.weight": "qa_outputs.weight", "span.bias": "qa_outputs.bias"}
    elif has_nsp and has_mlm:
        model, ours = BertForPreTraining(cfg), "bert."
    elif has_mlm:
        model, ours = BertForMaskedLM(cfg), "bert."
    elif not prefix:
        model, ours = BertModel(cfg, pooler="pooler.dense.weight" in sd), ""
    else:
        raise ValueError("the source has 'bert.'-prefixed weights but no head the course knows: expected "
                         "BertModel, BertForMaskedLM, BertForPreTraining, BertForSequenceClassification, "
                         "BertForTokenClassification or BertForQuestionAnswering")
    bert = model if isinstance(model, BertModel) else model.bert
    names = _encoder_names(bert, ours, prefix)
    names.update(head)
    if has_mlm:
        names.update({"mlm.dense.weight": "cls.predictions.transform.dense.weight",
                      "mlm.dense.bias": "cls.predictions.transform.dense.bias",
                      "mlm.norm.weight": "cls.predictions.transform.LayerNorm.weight",
                      "mlm.norm.bias": "cls.predictions.transform.LayerNorm.bias",
                      "mlm.bias": "cls.predictions.bias"})
    if has_nsp:
        names.update({"nsp.weight": "cls.seq_relationship.weight", "nsp.bias": "cls.seq_relationship.bias"})
    copy_by_name_map(model, _fuse_qkv(sd), names, ignore=_HF_IGNORE)
    return model.eval()


def load_pretrained(path: str | Path) -> BertModel | BertForMaskedLM | BertForPreTraining:
    """Read a local Hugging Face BERT folder (``config.json`` + ``model.safetensors`` or ``pytorch_model.bin``).

    No ``transformers`` import: in Colab, fetch a checkpoint with
    ``huggingface_hub.snapshot_download("google-bert/bert-base-uncased")`` and
    pass the folder it returns.
    """
    return from_hf_bert(Path(path))  # (a missing folder is named in the error: read_hf_folder checks it)

