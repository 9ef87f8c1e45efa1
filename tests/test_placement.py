"""Placement: every model, the caches and generation compute on the device their inputs are on.

No GPU is needed. A model is built on the CPU as a learner builds it, moved with
``model.to("meta")`` as a learner moves it to ``cuda``, and fed ids on the
``meta`` device (shapes and dtypes, no values). A tensor created on the CPU
inside the computation and combined with a device tensor then raises at once
("Tensor on device cpu is not on the expected device meta!"), as it would on a
GPU; so does a tensor kept as a plain attribute, which ``.to()`` does not move.
Meta tensors hold no values: where the code reads one (``.item()``, ``bool(t)``,
an EOS check, a token-id range check), :func:`_meta_values` answers with a
stand-in, so that the rest of the computation is checked too.

The table ``FORWARDS`` is data: one row per model, a factory and a call. Add a
row for a new model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

META = torch.device("meta")


def _ids(vocab: int, shape=(2, 7)) -> torch.Tensor:
    return torch.randint(0, vocab, shape).to(META)


@contextlib.contextmanager
def _meta_values():
    """Let code that reads values run on meta, with stand-in values, so that placement is checked past it.

    On a meta tensor ``bool(t)`` gives True, ``int(t)`` and ``t`` as an index 0, ``float(t)`` and ``t.item()`` 0.0 (every other
    tensor is untouched): a token-id range check ``int(ids.min()) < 0`` passes, a stopping rule
    ``bool(unfinished.any())`` continues, beam search's bookkeeping runs. ``nonzero`` on meta assumes every
    element is non-zero (torch's own switch). The path taken is one of the real ones; the values are not.
    """
    import torch.fx.experimental._config as fx_config

    fakes = {"__bool__": True, "__int__": 0, "__index__": 0, "__float__": 0.0, "item": 0.0}
    saved = {name: torch.Tensor.__dict__.get(name) for name in fakes}

    def stand_in(name, value):
        original = getattr(torch._C.TensorBase, name)

        def method(self, *args):
            return value if self.device.type == "meta" else original(self, *args)
        return method

    nonzero = fx_config.meta_nonzero_assume_all_nonzero
    try:
        for name, value in fakes.items():
            setattr(torch.Tensor, name, stand_in(name, value))
        fx_config.meta_nonzero_assume_all_nonzero = True
        yield
    finally:
        fx_config.meta_nonzero_assume_all_nonzero = nonzero
        for name, old in saved.items():
            if old is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, old)


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], torch.nn.Module]  # builds the model on the CPU
    call: Callable[[torch.nn.Module], object]  # runs its forward pass on meta inputs


def _gpt(**kw):
    from companion.models.gpt import GPT, GPTConfig

    return GPT(GPTConfig(**{"vocab_size": 23, "max_positions": 16, "d_model": 16, "n_layers": 2, "n_heads": 2, **kw}))


def _gpt1():
    import dataclasses

    from companion.models.gpt import GPT, GPT1

    return GPT(dataclasses.replace(GPT1, vocab_size=23, max_positions=16, d_model=16, n_layers=2, n_heads=2, d_ff=32))


def _small_lm(**kw):
    def build():
        from companion.models.small_lm import SmallLM, SmallLMConfig

        return SmallLM(SmallLMConfig(vocab_size=23, max_positions=16, n_layers=2, d_model=16, n_heads=2, d_ff=32, **kw))
    return build


def _transformer():
    from companion.models.transformer import Transformer, TransformerConfig

    return Transformer(TransformerConfig(vocab_size=23, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2,
                                         n_decoder_layers=2, max_positions=16, dropout=0.0))


def _t5(version):
    def build():
        from companion.models.encoder_decoder import EncoderDecoder
        from companion.models.t5 import t5_config

        return EncoderDecoder(t5_config(23, d_model=16, d_kv=8, d_ff=32, n_layers=2, n_heads=2, version=version,
                                        max_positions=16, dropout=0.0))
    return build


def _bart():
    from companion.models.bart import bart_config
    from companion.models.encoder_decoder import EncoderDecoder

    return EncoderDecoder(bart_config(23, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2, n_decoder_layers=2,
                                      max_positions=16, dropout=0.0))


def _bert_cfg(**kw):
    from companion.models.bert import BertConfig

    return BertConfig(**{"vocab_size": 23, "d_model": 16, "n_layers": 2, "n_heads": 2, "d_ff": 32,
                         "max_positions": 16, "dropout": 0.0, **kw})


def _bert(head="model", **kw):
    def build():
        from companion.models import bert

        cfg = _bert_cfg(**kw)
        return {"model": lambda: bert.BertModel(cfg), "mlm": lambda: bert.BertForMaskedLM(cfg),
                "pretraining": lambda: bert.BertForPreTraining(cfg),
                "sequence": lambda: bert.BertForSequenceClassification(cfg, 3),
                "token": lambda: bert.BertForTokenClassification(cfg, 3),
                "qa": lambda: bert.BertForQuestionAnswering(cfg)}[head]()
    return build


def _electra():
    from companion.models.electra import ElectraDiscriminator

    return ElectraDiscriminator(_bert_cfg(embedding_size=8))


def _deberta(absolute):
    def build():
        from companion.models.deberta import DebertaConfig, DebertaModel

        return DebertaModel(DebertaConfig(vocab_size=23, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_positions=16,
                                          n_position_buckets=8, absolute_positions=absolute, dropout=0.0))
    return build


def _llama(**kw):
    def build():
        from companion.models.llama import Llama, LlamaConfig

        return Llama(LlamaConfig(**{"vocab_size": 23, "d_model": 16, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                                    "d_ff": 24, "max_positions": 16, **kw}))
    return build


def _lm_call(model):
    return model(_ids(23))


def _seq2seq_call(model):
    src, tgt = _ids(23, (2, 9)), _ids(23, (2, 7))
    return model(src, tgt, src_attention_mask=torch.ones(2, 9, dtype=torch.long).to(META))


def _encoder_call(model):
    return model(_ids(23), attention_mask=torch.ones(2, 7, dtype=torch.long).to(META))


FORWARDS = [
    Case("GPT-2 style", _gpt, _lm_call),
    Case("GPT-1 (post-LN) config", _gpt1, _lm_call),
    Case("GPT with GQA", lambda: _gpt(n_kv_heads=1), _lm_call),
    Case("GPT with padding", _gpt,
         lambda m: m(_ids(23), attention_mask=torch.ones(2, 7, dtype=torch.long).to(META))),
    Case("Llama (GQA)", _llama(), _lm_call),
    Case("Qwen3 style (q/k norm, Dh not D/H)", _llama(d_head=6, qk_norm=True), _lm_call),
    Case("Qwen2 style with padding", _llama(qkv_bias=True, tie_embeddings=True),
         lambda m: m(_ids(23), attention_mask=torch.ones(2, 7, dtype=torch.long).to(META))),
    *(Case(f"SmallLM {p}", _small_lm(position=p, activation="gelu", init="torch", head_bias=False), _lm_call)
      for p in ("none", "sinusoidal", "learned", "rope", "t5", "alibi")),  # Chapter 3's models
    Case("SmallLM pre-LN", _small_lm(norm_first=True), _lm_call),  # Chapter 5's
    Case("SmallLM post-LN", _small_lm(norm_first=False), _lm_call),
    Case("Transformer (Chapter 4)", _transformer, _seq2seq_call),
    Case("T5 v1.0", _t5("1.0"), _seq2seq_call),
    Case("T5 v1.1", _t5("1.1"), _seq2seq_call),
    Case("BART", _bart, _seq2seq_call),
    Case("BERT", _bert(), _encoder_call),
    *(Case(f"BERT {head}", _bert(head), _encoder_call) for head in ("mlm", "pretraining", "sequence", "token", "qa")),
    Case("RoBERTa", _bert(positions_from_padding=True, pad_id=1), _encoder_call),
    Case("ALBERT", _bert("mlm", embedding_size=8, share_layers=True), _encoder_call),
    Case("ELECTRA discriminator", _electra, _encoder_call),
    Case("DeBERTa v3", _deberta(False), _encoder_call),
    Case("DeBERTa with absolute positions", _deberta(True), _encoder_call),
]


def _run_on_meta(case: Case):
    torch.manual_seed(0)
    model = case.build().eval().to(META)
    with torch.no_grad(), _meta_values():
        return case.call(model)


def _is_meta(out) -> bool:
    tensors = [out] if isinstance(out, torch.Tensor) else [x for x in out if isinstance(x, torch.Tensor)]
    return bool(tensors) and all(t.device == META for t in tensors)


@pytest.mark.parametrize("case", FORWARDS, ids=lambda c: c.name)
def test_forward_pass_stays_on_the_inputs_device(case):
    out = _run_on_meta(case)
    assert _is_meta(out), f"{case.name}: output not on meta: {type(out).__name__}"


def _moe_gpt():
    from companion.models.gpt import GPTConfig
    from companion.moe import MoEConfig, moe_gpt

    return moe_gpt(GPTConfig(vocab_size=23, max_positions=16, d_model=16, n_layers=2, n_heads=2),
                   MoEConfig(n_experts=4, top_k=2))


def test_moe_gpt_stays_on_the_device():
    model = _moe_gpt().eval().to(META)
    with torch.no_grad(), _meta_values():
        out = model(_ids(23))
    assert out.device == META


@pytest.mark.parametrize("name", ["sliding_window", "bigbird", "linformer", "performer", "tiled"])
def test_efficient_attention_stays_on_the_device(name):
    from companion import efficient_attention as ea
    from companion.tiled_attention import tiled_attention

    q, k, v = (torch.randn(2, 2, 16, 8).to(META) for _ in range(3))
    if name == "sliding_window":
        try:
            out = ea.sliding_window_attention(q, k, v, 2, causal=True, global_tokens=[0])
        except NotImplementedError as error:  # torch has no meta kernel for unique (global tokens de-duplicated)
            if "_unique2" not in str(error):
                raise
            pytest.skip("sliding_window_attention runs torch.unique on the device, which meta cannot compute")
    elif name == "bigbird":
        with _meta_values():
            out = ea.bigbird_attention(q, k, v, 4, n_random_blocks=1, generator=torch.Generator().manual_seed(0))
    elif name == "linformer":
        e, f = ea.linformer_projections(16, 4, generator=torch.Generator().manual_seed(0))
        out = ea.linformer_attention(q, k, v, e.to(META), f.to(META))
    elif name == "performer":
        w = ea.orthogonal_random_features(8, 8, generator=torch.Generator().manual_seed(0))
        out = ea.performer_attention(q, k, v, w.to(META), causal=True)
    else:
        out = tiled_attention(q, k, v, causal=True, block_q=4, block_k=4)
    assert out.device == META


def test_caches_append_and_reorder_on_the_device():
    from companion.kv_cache import EncoderDecoderCache, KVCache

    k, v = torch.randn(2, 2, 3, 4).to(META), torch.randn(2, 2, 3, 4).to(META)
    cache = KVCache(2)
    for layer in range(2):
        cache.append(layer, k, v)
    keys, values = cache.append(0, k, v)
    assert keys.device == META and keys.shape == (2, 2, 6, 4)
    cache.reorder(torch.tensor([1, 0]).to(META))
    cache.reorder(torch.tensor([1, 0]))  # a CPU index is moved to the cache's device
    assert cache.keys[0].device == META and cache.length == 6
    cache.crop(2)
    assert cache.keys[0].shape == (2, 2, 2, 4)
    both = EncoderDecoderCache(2)
    for layer in range(2):
        both.self_attn.append(layer, k, v)
        both.cross_attn.append(layer, k, v)
    both.reorder(torch.tensor([0, 0]).to(META))
    assert both.self_attn.keys[1].device == META and both.cross_attn.values[0].device == META


# ---------------------------------------------------------------- generation

def _meta_gpt():
    return _gpt().eval().to(META)


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("eos", [None, 5])
def test_greedy_generation_stays_on_the_device(use_cache, eos):
    from companion.generation import generate

    with _meta_values():
        out = generate(_meta_gpt(), _ids(23, (2, 3)), 4, use_cache=use_cache, eos_token_id=eos)
    assert out.device == META and out.shape == (2, 7)


def test_padded_generation_stays_on_the_device():
    from companion.generation import generate

    with _meta_values():
        out = generate(_meta_gpt(), _ids(23, (2, 3)), 4, attention_mask=torch.ones(2, 3, dtype=torch.long).to(META))
    assert out.device == META and out.shape == (2, 7)


@pytest.mark.parametrize("padded", [False, True])
def test_llama_generation_with_its_cache_stays_on_the_device(padded):
    from companion.generation import generate

    model = _llama(qk_norm=True)().eval().to(META)
    mask = torch.ones(2, 3, dtype=torch.long).to(META) if padded else None
    with _meta_values():
        out = generate(model, _ids(23, (2, 3)), 4, attention_mask=mask)
    assert out.device == META and out.shape == (2, 7)


def test_sampling_stays_on_the_device():
    from companion.generation import generate

    with _meta_values():
        out = generate(_meta_gpt(), _ids(23, (2, 3)), 3, do_sample=True, temperature=0.7, top_k=5, top_p=0.9)
    assert out.device == META and out.shape == (2, 6)


def test_encoder_decoder_generation_stays_on_the_device():
    from companion.generation import beam_search, generate

    model = _t5("1.1")().eval().to(META)
    with _meta_values():
        lm = model.decoder_lm(_ids(23, (2, 9)), torch.ones(2, 9, dtype=torch.long).to(META))
        start = torch.zeros(2, 1, dtype=torch.long).to(META)
        out = generate(lm, start, 4)
        beams = beam_search(lm, start, num_beams=3, max_new_tokens=4, eos_token_id=1)
    assert out.device == META and out.shape == (2, 5)
    assert beams.sequences.device == beams.scores.device == META


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("eos", [None, 5])
def test_beam_search_stays_on_the_device(use_cache, eos):
    """Every tensor beam search creates lives on the model's device (before the fix: running_scores and the
    rows each beam continues were made on the CPU, "Tensor on device cpu is not on the expected device meta!")."""
    from companion.generation import beam_search, beam_search_step

    scores, beam, token = beam_search_step(torch.randn(3, 23).to(META), torch.zeros(3).to(META), 6)
    assert scores.device == beam.device == token.device == META
    with _meta_values():
        out = beam_search(_meta_gpt(), _ids(23, (2, 3)), num_beams=3, max_new_tokens=4, use_cache=use_cache,
                          eos_token_id=eos, num_return_sequences=2)
    assert out.sequences.device == out.scores.device == out.lengths.device == META
    assert out.sequences.shape[0] == 4


# ---------------------------------------------------------------- other modules that compute on a model's outputs

class _SpanModel(torch.nn.Module):
    """Start and end logits (B, T) from ids, as a span head returns them."""

    def __init__(self, vocab: int = 23):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, 2)

    def forward(self, input_ids, attention_mask=None, segment_ids=None):
        start, end = self.emb(input_ids).unbind(-1)
        return start, end


def test_span_prediction_stays_on_the_device():
    """finetuning.predict builds its 'end >= start' mask where the scores are (before the fix: on the CPU)."""
    from companion.finetuning import TaskData, predict

    ids = _ids(23, (3, 6))
    ones = torch.ones(3, 6, dtype=torch.long).to(META)
    data = TaskData(ids, ones, torch.zeros_like(ones), torch.zeros(3, 2, dtype=torch.long).to(META), "span")
    pred = predict(_SpanModel().to(META), data)
    assert pred.device == META and pred.shape == (3, 2)


def test_moe_aux_loss_is_on_the_models_device():
    """0 for a dense model, but a 0 on the model's device, so that loss + aux stays there."""
    from companion.moe import moe_aux_loss

    model = _meta_gpt()
    assert moe_aux_loss(model).device == META
    moe = _moe_gpt().eval().to(META)
    with torch.no_grad(), _meta_values():
        moe(_ids(23))
    assert moe_aux_loss(moe).device == META


def test_the_token_id_check_reads_no_value_off_the_cpu():
    """check_token_ids reads the id range only on the CPU: on a GPU that read would make the host wait for the
    device at every forward pass. On meta (any read raises there) the check passes on dtype and shape alone."""
    from companion._checks import check_token_ids

    ids = torch.zeros(2, 3, dtype=torch.long, device=META)
    assert check_token_ids("idx", ids, 10) is ids
    with pytest.raises(TypeError, match="int64 or int32"):
        check_token_ids("idx", ids.float(), 10)
    with pytest.raises(ValueError, match=r"idx must lie in \[0, 10\)"):
        check_token_ids("idx", torch.tensor([[3, 12]]), 10)  # on the CPU the range is checked


@pytest.mark.parametrize("build", [_t5("1.1"), _bart], ids=["T5 v1.1", "BART"])
def test_an_encoder_decoder_step_reads_no_value_off_the_cpu(build):
    """A decoding step reads nothing from the device (each read would make the host wait for a GPU at every
    step): on meta, where any read raises, encode and a cached decode step run without stand-in values."""
    model = build().eval().to(META)
    src_mask = torch.ones(2, 9, dtype=torch.long).to(META)
    with torch.no_grad():
        memory = model.encode(_ids(23, (2, 9)), src_mask)
        cache = model.new_cache()
        logits = model.decode(_ids(23, (2, 1)), memory, src_mask, cache=cache)
    assert logits.device == META and logits.shape == (2, 1, 23)
