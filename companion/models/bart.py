"""BART (Lewis et al., 2020, "BART: Denoising Sequence-to-Sequence Pre-training for Natural Language Generation, Translation, and Comprehension").

BART is the shared :class:`~companion.models.encoder_decoder.EncoderDecoder`
with this config (:func:`bart_config`), a BERT-like encoder and a GPT-like decoder:

* **post-LN** layers (``x = LayerNorm(x + sublayer(x))``) with LayerNorm and
  biases everywhere, attention scores scaled by ``1/sqrt(d_head)``, GELU feed-forward;
* **learned absolute positions**, one table per stack, whose row of position
  ``p`` is ``p + 2`` (the "offset 2" kept from fairseq, where rows 0 and 1
  were reserved for padding);
* a **LayerNorm on the embeddings** (token + position) of each stack, token
  embeddings optionally scaled by ``sqrt(d_model)`` (``scale_embedding``; off in
  ``facebook/bart-*``, on in mBART);
* no final norm after either stack; the head is tied to the embedding and adds
  a ``final_logits_bias`` (zeros in the released checkpoints);
* the decoder starts from ``</s>`` (``decoder_start_token_id = 2``), padding is 1.

:func:`from_hf_bart` loads a Hugging Face ``BartForConditionalGeneration``
(object or local folder).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ._hf import LoadReport, activation_from_hf, copy_by_name_map, fuse_rows, hf_source
from .encoder_decoder import EncoderDecoder, EncoderDecoderConfig

__all__ = ["bart_config", "BART_BASE", "BART_SIZES", "config_from_hf_bart", "from_hf_bart", "load_pretrained_bart", "hf_bart_name_map"]

BART_POSITION_OFFSET = 2


def bart_config(
    vocab_size: int = 50265,
    *,
    d_model: int = 768,
    n_heads: int = 12,
    d_ff: int = 3072,
    n_encoder_layers: int = 6,
    n_decoder_layers: int = 6,
    max_positions: int = 1024,
    scale_embeddings: bool = False,
    activation: str = "gelu",
    dropout: float = 0.1,
    norm_eps: float = 1e-5,
    pad_id: int = 1,
    eos_id: int = 2,
    decoder_start_id: int = 2,
) -> EncoderDecoderConfig:
    """The :class:`EncoderDecoderConfig` of a BART model; defaults are ``facebook/bart-base``'s."""
    return EncoderDecoderConfig(
        vocab_size=vocab_size, d_model=d_model, n_heads=n_heads, d_ff=d_ff,
        n_encoder_layers=n_encoder_layers, n_decoder_layers=n_decoder_layers,
        norm="layernorm", norm_eps=norm_eps, norm_first=False, bias=True, scale_attention=True,
        activation=activation, gated=False, positions="learned", max_positions=max_positions,
        position_offset=BART_POSITION_OFFSET, scale_embeddings=scale_embeddings, embedding_norm=True,
        final_norm=False, tie_embeddings=True, scale_output=False, final_logits_bias=True, dropout=dropout,
        pad_id=pad_id, eos_id=eos_id, decoder_start_id=decoder_start_id, init="bart",
    )


BART_BASE = bart_config()  # facebook/bart-base

BART_SIZES: dict[str, dict[str, Any]] = {  # Lewis et al. (2020), section 3 and the released configs
    "bart-base": dict(d_model=768, n_heads=12, d_ff=3072, n_encoder_layers=6, n_decoder_layers=6, published="140M"),
    "bart-large": dict(d_model=1024, n_heads=16, d_ff=4096, n_encoder_layers=12, n_decoder_layers=12, published="400M"),
}


def config_from_hf_bart(hf_config: Any) -> EncoderDecoderConfig:
    """The course config of a Hugging Face ``BartConfig`` (an object or a ``config.json`` namespace)."""
    get = lambda name, default=None: getattr(hf_config, name, default)  # noqa: E731
    act = activation_from_hf(get("activation_function", "gelu"), ("gelu", "relu"))
    if get("normalize_before", False) or get("add_final_layer_norm", False):
        raise ValueError("pre-LN BART variants (mBART: normalize_before/add_final_layer_norm) are not supported")
    if get("encoder_attention_heads") != get("decoder_attention_heads") or get("encoder_ffn_dim") != get("decoder_ffn_dim"):
        raise ValueError("encoder and decoder must share the number of heads and the FFN size")
    return bart_config(
        get("vocab_size"), d_model=get("d_model"), n_heads=get("encoder_attention_heads"), d_ff=get("encoder_ffn_dim"),
        n_encoder_layers=get("encoder_layers"), n_decoder_layers=get("decoder_layers"),
        max_positions=get("max_position_embeddings"), scale_embeddings=bool(get("scale_embedding", False)),
        activation=act, dropout=get("dropout", 0.1), pad_id=get("pad_token_id", 1), eos_id=get("eos_token_id", 2),
        decoder_start_id=get("decoder_start_token_id", 2),
    )


def hf_bart_name_map(cfg: EncoderDecoderConfig) -> dict[str, str]:
    """Our parameter/buffer name -> Hugging Face BART tensor name (fused ``qkv``/``kv`` rows are built by :func:`from_hf_bart`)."""
    m = {"tok_emb.weight": "model.shared.weight", "final_logits_bias": "final_logits_bias",
         "encoder_pos_emb.weight": "model.encoder.embed_positions.weight",
         "decoder_pos_emb.weight": "model.decoder.embed_positions.weight"}
    for stack in ("encoder", "decoder"):
        for x in ("weight", "bias"):
            m[f"{stack}_embed_norm.{x}"] = f"model.{stack}.layernorm_embedding.{x}"
    for stack, n in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers)):
        for i in range(n):
            ours, hf = f"{stack}.{i}", f"model.{stack}.layers.{i}"
            for x in ("weight", "bias"):
                m[f"{ours}.self_attn.qkv.{x}"] = f"{hf}.self_attn.qkv_proj.{x}"  # fused below
                m[f"{ours}.self_attn.out.{x}"] = f"{hf}.self_attn.out_proj.{x}"
                m[f"{ours}.norm1.{x}"] = f"{hf}.self_attn_layer_norm.{x}"
                if stack == "decoder":
                    m[f"{ours}.cross_attn.q.{x}"] = f"{hf}.encoder_attn.q_proj.{x}"
                    m[f"{ours}.cross_attn.kv.{x}"] = f"{hf}.encoder_attn.kv_proj.{x}"  # fused below
                    m[f"{ours}.cross_attn.out.{x}"] = f"{hf}.encoder_attn.out_proj.{x}"
                    m[f"{ours}.norm_cross.{x}"] = f"{hf}.encoder_attn_layer_norm.{x}"
                m[f"{ours}.ffn.up.{x}"] = f"{hf}.fc1.{x}"
                m[f"{ours}.ffn.down.{x}"] = f"{hf}.fc2.{x}"
                m[f"{ours}.norm2.{x}"] = f"{hf}.final_layer_norm.{x}"
    return m


def _fused(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``sd`` with the fused projections: ``qkv_proj`` (self-attention) and ``kv_proj`` (cross-attention)."""
    sd = fuse_rows(sd, ("q_proj", "k_proj", "v_proj"), "qkv_proj", r"\.self_attn$")
    return fuse_rows(sd, ("k_proj", "v_proj"), "kv_proj", r"\.encoder_attn$")


@torch.no_grad()
def from_hf_bart(source, *, return_report: bool = False) -> EncoderDecoder | tuple[EncoderDecoder, LoadReport]:
    """The course's BART holding the weights of a Hugging Face ``BartForConditionalGeneration`` (object or saved folder).

    Every tensor is accounted for: a missing, unexpected or mis-shaped one raises
    a ``ValueError`` naming it. A head that differs from the embedding is refused
    (BART ties them).
    """
    hf_config, sd = hf_source(source)
    if "model.shared.weight" not in sd or "final_logits_bias" not in sd:
        raise ValueError("expected the weights of a BartForConditionalGeneration (model.shared.weight, final_logits_bias)")
    head = sd.get("lm_head.weight")
    if head is not None and not torch.equal(head, sd["model.shared.weight"]):
        raise ValueError("lm_head.weight differs from model.shared.weight: BART ties its head to the embedding")
    cfg = config_from_hf_bart(hf_config)
    with torch.device("meta"):
        model = EncoderDecoder(cfg)
    model = model.to_empty(device="cpu")
    model.lm_head.weight = model.tok_emb.weight
    ignore = [r"^model\.(encoder|decoder)\.embed_tokens\.weight$", r"^lm_head\.weight$"]
    report = copy_by_name_map(model, _fused(sd), hf_bart_name_map(cfg), ignore=ignore)
    model.eval()
    return (model, report) if return_report else model


def load_pretrained_bart(path: str | Path) -> EncoderDecoder:
    """Read a local Hugging Face BART folder (``config.json`` + ``model.safetensors`` or ``pytorch_model.bin``).

    No ``transformers`` import: in Colab, fetch a checkpoint with
    ``huggingface_hub.snapshot_download("facebook/bart-base")`` and pass the folder it returns.
    """
    return from_hf_bart(Path(path))  # (a missing folder is named in the error: read_hf_folder checks it)
