"""T5 (Raffel et al., 2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer").

T5 is the shared :class:`~companion.models.encoder_decoder.EncoderDecoder` with
this config (:func:`t5_config`):

* pre-LN layers with **RMSNorm** (no mean, no bias; "layer norm without bias"
  in the paper, ``T5LayerNorm`` in Hugging Face), a final norm after each stack;
* **no biases** anywhere, and attention scores ``q k^T`` **without** the
  ``1/sqrt(d_kv)`` factor (Mesh TensorFlow folds it into the initialisation of ``W_Q``);
* ``d_kv`` per head independent of ``d_model`` (t5-3B/11B: 128 with ``d_model = 1024``);
* **relative position bias**: one learned scalar per (bucket, head), computed
  once per stack and added in every layer; no absolute positions;
* feed-forward: ReLU (T5 v1.0) or gated GELU (T5 v1.1, Flan-T5);
* output head: tied to the embedding (v1.0), then the decoder output is
  multiplied by ``d_model**-0.5`` first; untied and unscaled in v1.1.

:func:`from_hf_t5` loads a Hugging Face ``T5ForConditionalGeneration`` (object
or local folder, ``transformers`` 4.x and 5.x names), :data:`T5_SIZES` and
:func:`t5_size_table` give the published sizes with their parameter counts
computed from the configs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..calculators import parameter_count
from ._hf import LoadReport, copy_by_name_map, fuse_rows, hf_source
from .encoder_decoder import EncoderDecoder, EncoderDecoderConfig

__all__ = ["t5_config", "T5_SMALL", "T5_SIZES", "t5_size_table", "config_from_hf_t5", "from_hf_t5", "load_pretrained_t5",
           "hf_t5_name_map"]


def t5_config(
    vocab_size: int = 32128,
    *,
    d_model: int = 512,
    d_kv: int = 64,
    d_ff: int = 2048,
    n_layers: int = 6,
    n_decoder_layers: int | None = None,
    n_heads: int = 8,
    version: str = "1.0",
    tie_embeddings: bool | None = None,
    n_buckets: int = 32,
    max_distance: int = 128,
    max_positions: int = 512,
    dropout: float = 0.1,
    norm_eps: float = 1e-6,
    pad_id: int = 0,
    eos_id: int = 1,
) -> EncoderDecoderConfig:
    """The :class:`EncoderDecoderConfig` of a T5 model; defaults are t5-small's.

    ``version="1.0"``: ReLU feed-forward, head tied to the embedding and scaled by
    ``d_model**-0.5``. ``version="1.1"`` (also Flan-T5): gated GELU (tanh
    approximation, Hugging Face's ``gelu_new``), untied and unscaled head.
    ``tie_embeddings`` overrides the version's choice (the scaling follows it).
    The decoder starts from the padding token, as in T5.
    """
    if version not in ("1.0", "1.1"):
        raise ValueError(f"version must be '1.0' or '1.1', got {version!r}")
    v11 = version == "1.1"
    tie = (not v11) if tie_embeddings is None else tie_embeddings
    return EncoderDecoderConfig(
        vocab_size=vocab_size, d_model=d_model, n_heads=n_heads, d_head=d_kv, d_ff=d_ff,
        n_encoder_layers=n_layers, n_decoder_layers=n_layers if n_decoder_layers is None else n_decoder_layers,
        norm="rmsnorm", norm_eps=norm_eps, norm_first=True, bias=False, scale_attention=False,
        activation="gelu_tanh" if v11 else "relu", gated=v11,
        positions="relative", n_buckets=n_buckets, max_distance=max_distance, max_positions=max_positions,
        final_norm=True, tie_embeddings=tie, scale_output=tie, dropout=dropout,
        pad_id=pad_id, eos_id=eos_id, decoder_start_id=pad_id, init="t5",
    )


T5_SMALL = t5_config()  # t5-small: 60.5M parameters, vocabulary 32,128

# Published configurations (Raffel et al. 2020, table 14 and the released gin/HF configs;
# T5 v1.1 and Flan-T5 share one architecture per size). "published" is the size quoted
# in the paper (None: no count is quoted for v1.1); the count itself is computed by
# t5_size_table(). t5-large counts 738M although the paper says 770M.
T5_SIZES: dict[str, dict[str, Any]] = {
    "t5-small": dict(d_model=512, d_kv=64, d_ff=2048, n_layers=6, n_heads=8, version="1.0", published="60M"),
    "t5-base": dict(d_model=768, d_kv=64, d_ff=3072, n_layers=12, n_heads=12, version="1.0", published="220M"),
    "t5-large": dict(d_model=1024, d_kv=64, d_ff=4096, n_layers=24, n_heads=16, version="1.0", published="770M"),
    "t5-3b": dict(d_model=1024, d_kv=128, d_ff=16384, n_layers=24, n_heads=32, version="1.0", published="2.8B"),
    "t5-11b": dict(d_model=1024, d_kv=128, d_ff=65536, n_layers=24, n_heads=128, version="1.0", published="11B"),
    "t5-v1_1-small": dict(d_model=512, d_kv=64, d_ff=1024, n_layers=8, n_heads=6, version="1.1", published=None),
    "t5-v1_1-base": dict(d_model=768, d_kv=64, d_ff=2048, n_layers=12, n_heads=12, version="1.1", published=None),
    "t5-v1_1-large": dict(d_model=1024, d_kv=64, d_ff=2816, n_layers=24, n_heads=16, version="1.1", published=None),
    "t5-v1_1-xl": dict(d_model=2048, d_kv=64, d_ff=5120, n_layers=24, n_heads=32, version="1.1", published=None),
    "t5-v1_1-xxl": dict(d_model=4096, d_kv=64, d_ff=10240, n_layers=24, n_heads=64, version="1.1", published=None),
}


def t5_size_table(names: list[str] | None = None) -> list[dict[str, Any]]:
    """One row per T5 size: its config fields, ``params`` counted on the meta device, and ``published``.

    Nothing is allocated: each model is built on ``torch.device("meta")``.
    """
    rows = []
    for name in T5_SIZES if names is None else names:
        if name not in T5_SIZES:
            raise ValueError(f"unknown T5 size {name!r}; known: {', '.join(T5_SIZES)}")
        spec = dict(T5_SIZES[name])
        published = spec.pop("published")
        rows.append(dict(name=name, **spec, params=parameter_count(t5_config(**spec)), published=published))
    return rows


# ---------------------------------------------------------------- Hugging Face

def config_from_hf_t5(hf_config: Any, *, untied_head: bool | None = None) -> EncoderDecoderConfig:
    """The course config of a Hugging Face ``T5Config`` (an object or a ``config.json`` namespace).

    Whether the head is scaled: ``scale_decoder_outputs`` (``transformers`` 5.x)
    or ``tie_word_embeddings`` (4.x and ``config.json`` files). ``untied_head``
    says whether the weights hold a separate head (read from the tensors).
    """
    get = lambda name, default=None: getattr(hf_config, name, default)  # noqa: E731
    proj = get("feed_forward_proj", "relu")
    if proj not in ("relu", "gated-gelu"):
        raise ValueError(f"feed_forward_proj {proj!r} is not supported: expected 'relu' (T5) or 'gated-gelu' (T5 v1.1)")
    scaled = get("scale_decoder_outputs", None)
    if scaled is None:
        scaled = get("tie_word_embeddings", True) is not False
    tie = scaled if untied_head is None else not untied_head
    cfg = t5_config(
        get("vocab_size"), d_model=get("d_model"), d_kv=get("d_kv"), d_ff=get("d_ff"), n_layers=get("num_layers"),
        n_decoder_layers=get("num_decoder_layers") or get("num_layers"), n_heads=get("num_heads"),
        version="1.1" if proj == "gated-gelu" else "1.0", n_buckets=get("relative_attention_num_buckets", 32),
        max_distance=get("relative_attention_max_distance", 128), dropout=get("dropout_rate", 0.1),
        norm_eps=get("layer_norm_epsilon", 1e-6), pad_id=get("pad_token_id", 0) or 0, eos_id=get("eos_token_id", 1),
    )
    start = get("decoder_start_token_id", cfg.pad_id)
    return cfg.replace(tie_embeddings=tie, scale_output=bool(scaled),
                       decoder_start_id=cfg.pad_id if start is None else start)


def hf_t5_name_map(cfg: EncoderDecoderConfig) -> dict[str, str]:
    """Our parameter name -> Hugging Face T5 tensor name (fused ``qkv``/``kv`` rows are built by :func:`from_hf_t5`)."""
    m = {"tok_emb.weight": "shared.weight",
         "encoder_bias.relative_attention_bias.weight": "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
         "decoder_bias.relative_attention_bias.weight": "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
         "encoder_norm.weight": "encoder.final_layer_norm.weight", "decoder_norm.weight": "decoder.final_layer_norm.weight"}
    if not cfg.tie_embeddings:
        m["lm_head.weight"] = "lm_head.weight"
    ffn = {"gate": "wi_0", "up": "wi_1", "down": "wo"} if cfg.gated else {"up": "wi", "down": "wo"}
    for stack, n in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers)):
        ffn_layer = 2 if stack == "decoder" else 1
        for i in range(n):
            ours, hf = f"{stack}.{i}", f"{stack}.block.{i}.layer"
            m[f"{ours}.self_attn.qkv.weight"] = f"{hf}.0.SelfAttention.qkv.weight"  # fused below
            m[f"{ours}.self_attn.out.weight"] = f"{hf}.0.SelfAttention.o.weight"
            m[f"{ours}.norm1.weight"] = f"{hf}.0.layer_norm.weight"
            if stack == "decoder":
                m[f"{ours}.cross_attn.q.weight"] = f"{hf}.1.EncDecAttention.q.weight"
                m[f"{ours}.cross_attn.kv.weight"] = f"{hf}.1.EncDecAttention.kv.weight"  # fused below
                m[f"{ours}.cross_attn.out.weight"] = f"{hf}.1.EncDecAttention.o.weight"
                m[f"{ours}.norm_cross.weight"] = f"{hf}.1.layer_norm.weight"
            for our_name, hf_name in ffn.items():
                m[f"{ours}.ffn.{our_name}.weight"] = f"{hf}.{ffn_layer}.DenseReluDense.{hf_name}.weight"
            m[f"{ours}.norm2.weight"] = f"{hf}.{ffn_layer}.layer_norm.weight"
    return m


def _fused(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``sd`` with the fused projections: ``qkv`` = rows of q, k, v (self-attention); ``kv`` = rows of k, v (cross)."""
    return fuse_rows(fuse_rows(sd, ("q", "k", "v"), "qkv", r"\.SelfAttention$"), ("k", "v"), "kv", r"\.EncDecAttention$")


def _untied_head(sd: dict[str, torch.Tensor]) -> bool:
    head = sd.get("lm_head.weight")
    return head is not None and not (head is sd["shared.weight"] or torch.equal(head, sd["shared.weight"]))


@torch.no_grad()
def from_hf_t5(source, *, return_report: bool = False) -> EncoderDecoder | tuple[EncoderDecoder, LoadReport]:
    """The course's T5 holding the weights of a Hugging Face ``T5ForConditionalGeneration`` (object or saved folder).

    Works with the tensor names of ``transformers`` 4.x and 5.x. A head that
    differs from the embedding is loaded untied; a tied one is shared. Every
    tensor is accounted for: a missing, unexpected or mis-shaped one raises a
    ``ValueError`` naming it.
    """
    hf_config, sd = hf_source(source)
    if "shared.weight" not in sd or not any(k.startswith("decoder.") for k in sd):
        raise ValueError("expected the weights of a T5ForConditionalGeneration (shared.weight and a decoder)")
    cfg = config_from_hf_t5(hf_config, untied_head=_untied_head(sd))
    with torch.device("meta"):
        model = EncoderDecoder(cfg)
    model = model.to_empty(device="cpu")
    if cfg.tie_embeddings:
        model.lm_head.weight = model.tok_emb.weight
    ignore = [r"^(encoder|decoder)\.embed_tokens\.weight$"]
    if cfg.tie_embeddings:
        ignore.append(r"^lm_head\.weight$")
    report = copy_by_name_map(model, _fused(sd), hf_t5_name_map(cfg), ignore=ignore)
    model.eval()
    return (model, report) if return_report else model


def load_pretrained_t5(path: str | Path) -> EncoderDecoder:
    """Read a local Hugging Face T5 folder (``config.json`` + ``model.safetensors`` or ``pytorch_model.bin``).

    No ``transformers`` import: in Colab, fetch a checkpoint with
    ``huggingface_hub.snapshot_download("google-t5/t5-small")`` and pass the folder it returns.
    """
    return from_hf_t5(Path(path))  # (a missing folder is named in the error: read_hf_folder checks it)
