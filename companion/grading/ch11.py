"""Checks for the Chapter 11 exercises (T5 and BART).

References: the Viterbi search of :class:`companion.tokenizers.unigram.UnigramTokenizer`
(compared by total score, since ties may be broken either way),
:func:`companion.span_corruption.span_corrupt` and
:func:`companion.span_corruption.compute_input_and_target_lengths`,
:func:`companion.attention.scaled_dot_product_attention` with ``scale=1`` and a bias
(T5's attention), a plain loop for BART's text infilling with given spans, and for
"Your T5" (11.6) :class:`companion.models.encoder_decoder.EncoderDecoder` with
:func:`companion.models.t5.t5_config`, its weights copied into the student's model
by :func:`t5_name_map`.
"""

from __future__ import annotations

import math
import random

import torch
from torch import nn

from ..attention import scaled_dot_product_attention
from ..models.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from ..models.t5 import t5_config
from ..span_corruption import compute_input_and_target_lengths, random_spans_noise_mask, span_corrupt
from ..tokenizers.unigram import UnigramTokenizer, load_course_unigram
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, register


# ----------------------------------------------------------------- 11.1 Unigram segmentation (Viterbi)

def _seg_case(student, text, scores, what):
    ref = UnigramTokenizer(list(scores.items()), n_sentinels=0)
    best = sum(scores[p] for p in ref._viterbi(text))
    got = student(text, dict(scores))
    expect_true(isinstance(got, list) and all(isinstance(p, str) for p in got),
                f"{what}: unigram_segment must return a list of str, got {type(got).__name__}")
    expect_true("".join(got) == text, f"{what}: the pieces {got[:8]}... do not spell the text {text!r}")
    unknown = [p for p in got if p not in scores]
    expect_true(not unknown, f"{what}: pieces not in the vocabulary: {unknown[:5]}")
    total = sum(scores[p] for p in got)
    if not math.isclose(total, best, rel_tol=0, abs_tol=1e-9):
        raise CheckFailed(f"{what}: your segmentation scores {total:.4f}, the best one scores {best:.4f}")


_GREEDY_TRAP = {"a": -1.0, "b": -1.0, "c": -1.0, "ab": -1.5, "bc": -1.0, "abc": -5.0}


def _seg_random(student, seed):
    rng = random.Random(seed)
    alphabet = "abcd"
    scores = {c: -rng.uniform(2, 6) for c in alphabet}
    while len(scores) < 40:
        piece = "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 5)))
        scores[piece] = -rng.uniform(1, 9)
    for k in range(5):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 23)))
        _seg_case(student, text, scores, f"random vocabulary of 40 pieces, text {text!r}")


def _seg_course(student):
    tok = load_course_unigram()
    scores = dict(tok.pieces)
    for word in ("\u2581relative\u2581position\u2581buckets", "\u2581span\u2581corruption", "\u2581x"):
        _seg_case(student, word, scores, f"the course tokenizer's 1,997 pieces, text {word!r}")


register(Exercise(
    id="11.1",
    title="Unigram segmentation with Viterbi",
    targets=("unigram_segment",),
    forbidden=("sentencepiece", "tokenizers", "companion.tokenizers"),
    cases=(
        Case("longest match first is not the best", 2, lambda s: _seg_case(s, "abc", _GREEDY_TRAP, "text 'abc'")),
        Case("a single character and the empty text", 1, lambda s: (
            _seg_case(s, "b", _GREEDY_TRAP, "text 'b'"), _seg_case(s, "", _GREEDY_TRAP, "the empty text"))),
        Case("random vocabularies and texts", 2, lambda s: _seg_random(s, 0)),
        Case("the course tokenizer's vocabulary", 1, lambda s: _seg_course(s)),
    ),
))


# ----------------------------------------------------------------- 11.2 span corruption: T5's inputs and targets

def _sc_case(student, ids, mask, vocab_size, eos_id, what):
    want = span_corrupt(ids, torch.tensor(mask), vocab_size, eos_id)
    got = student(list(ids), list(mask), vocab_size, eos_id)
    expect_true(isinstance(got, tuple) and len(got) == 2,
                f"{what}: span_corrupt must return (inputs, targets), got {type(got).__name__}")
    for name, g, w in (("inputs", got[0], want[0]), ("targets", got[1], want[1])):
        g = [int(x) for x in g]
        if g != w:
            raise CheckFailed(f"{what}: {name} should be {w}, got {g}")


def _sc_random(student, length, seed, reference_mask):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 90, (length,), generator=g).tolist()
    if reference_mask:
        mask = random_spans_noise_mask(length, 0.15, 3.0, generator=g).tolist()
    else:
        mask = (torch.rand(length, generator=g) < 0.3).tolist()
    _sc_case(student, ids, mask, 100, 1, f"length {length}, {'T5' if reference_mask else 'arbitrary'} noise mask")


_DOG = [10, 11, 12, 13, 14, 15, 16, 17, 18]  # The quick brown fox jumps over the lazy dog


register(Exercise(
    id="11.2",
    title="Span corruption in T5's format",
    targets=("span_corrupt",),
    forbidden=("companion.span_corruption",),
    cases=(
        Case("the sequence ends with a noise span (no final sentinel in the target)", 2, lambda s: _sc_case(
            s, _DOG, [0, 0, 0, 1, 0, 0, 0, 1, 1], 100, 1, "noise 'fox' and 'lazy dog'")),
        Case("the sequence ends with kept tokens (a final sentinel in the target)", 2, lambda s: _sc_case(
            s, _DOG, [0, 0, 1, 1, 0, 0, 1, 0, 0], 100, 1, "noise 'brown fox' and 'the'")),
        Case("no noise at all, and noise from the first token", 1, lambda s: (
            _sc_case(s, _DOG[:4], [0, 0, 0, 0], 50, 1, "no noise"),
            _sc_case(s, _DOG[:5], [1, 1, 0, 1, 0], 50, 2, "noise first, EOS id 2"))),
        Case("T5's noise masks on odd lengths", 1, lambda s: [_sc_random(s, n, n, True) for n in (7, 31, 101)]),
        Case("arbitrary masks", 1, lambda s: [_sc_random(s, n, n, False) for n in (13, 40)]),
    ),
))


# ----------------------------------------------------------------- 11.3 how many raw tokens for 512 inputs

def _len_case(student, inputs_length, density, mean_span):
    want = compute_input_and_target_lengths(inputs_length, density, mean_span)
    got = student(inputs_length, density, mean_span)
    expect_true(isinstance(got, tuple) and len(got) == 2,
                f"corruption_lengths must return (n_tokens, targets_length), got {got!r}")
    got = (int(got[0]), int(got[1]))
    if got != want:
        raise CheckFailed(f"inputs_length={inputs_length}, noise_density={density}, mean span {mean_span}: "
                          f"expected (n_tokens, targets_length) = {want}, got {got}")


register(Exercise(
    id="11.3",
    title="Raw tokens and target length for a span-corrupted input",
    targets=("corruption_lengths",),
    forbidden=("companion.span_corruption",),
    cases=(
        Case("T5's setting: 512 inputs", 2, lambda s: _len_case(s, 512, 0.15, 3.0)),
        Case("other lengths", 2, lambda s: [_len_case(s, n, 0.15, 3.0) for n in (64, 127, 1024)]),
        Case("other densities and span lengths", 2, lambda s: [
            _len_case(s, n, d, m) for n, d, m in ((512, 0.3, 8.0), (256, 0.25, 2.0), (100, 0.1, 1.0))]),
    ),
))


# ----------------------------------------------------------------- 11.4 T5's attention: no scaling, a bias

def _att_case(student, b, h, t, s, dh, seed, mask_kind, what):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, dh, generator=g) for n in (t, s, s))
    bias = torch.randn(1, h, t, s, generator=g)
    mask = None
    if mask_kind == "padding":
        lengths = torch.randint(1, s + 1, (b,), generator=g)
        mask = (torch.arange(s) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)
    elif mask_kind == "causal":
        mask = torch.ones(t, s, dtype=torch.bool).tril(s - t)
    want = scaled_dot_product_attention(q, k, v, mask, bias=bias, scale=1.0)
    got = student(q.clone(), k.clone(), v.clone(), bias.clone(), None if mask is None else mask.clone())
    expect_tensor(got, want, name=f"T5 attention ({what})")


register(Exercise(
    id="11.4",
    title="T5's attention: a position bias and no 1/sqrt(d) scaling",
    targets=("t5_attention",),
    forbidden=("companion.attention", "torch.nn.functional.scaled_dot_product_attention", "transformers"),
    cases=(
        Case("no mask (B=2, H=3, T=S=5, d_kv=64)", 2, lambda s: _att_case(s, 2, 3, 5, 5, 64, 0, None, "no mask")),
        Case("padding mask on the keys (B=3, T=4, S=7)", 2, lambda s: _att_case(
            s, 3, 2, 4, 7, 8, 1, "padding", "padding mask")),
        Case("causal mask (decoder self-attention, T=S=6)", 1, lambda s: _att_case(
            s, 1, 4, 6, 6, 16, 2, "causal", "causal mask")),
        Case("cross-attention shapes (T=3 queries, S=9 keys, d_kv=5)", 1, lambda s: _att_case(
            s, 2, 2, 3, 9, 5, 3, None, "T=3, S=9")),
    ),
))


# ----------------------------------------------------------------- 11.5 BART's text infilling with given spans

def _infill_reference(ids, spans, mask_id):
    out, pos = [], 0
    for start, length in spans:
        out.extend(ids[pos:start])
        out.append(mask_id)
        pos = start + length
    return out + ids[pos:]


def _infill_case(student, ids, spans, mask_id, what):
    want = _infill_reference(ids, spans, mask_id)
    got = student(list(ids), [tuple(x) for x in spans], mask_id)
    expect_true(isinstance(got, list), f"{what}: text_infill must return a list, got {type(got).__name__}")
    got = [int(x) for x in got]
    if got != want:
        raise CheckFailed(f"{what}: expected {want}, got {got}")


def _infill_random(student, n, seed):
    rng = random.Random(seed)
    ids = [rng.randrange(5, 60) for _ in range(n)]
    spans, pos = [], 0
    while pos < n:
        start = rng.randint(pos, n - 1)
        length = min(rng.choice([0, 1, 2, 3, 3, 4, 6]), n - start)
        spans.append((start, length))
        pos = start + max(length, 1)
        if rng.random() < 0.3:
            break
    _infill_case(student, ids, spans, 4, f"{n} tokens, spans {spans}")


register(Exercise(
    id="11.5",
    title="BART's text infilling with given spans",
    targets=("text_infill",),
    forbidden=("companion.noising",),
    cases=(
        Case("one span of 3 tokens becomes one mask", 2, lambda s: _infill_case(
            s, [10, 11, 12, 13, 14, 15], [(1, 3)], 4, "span (1, 3)")),
        Case("a span of length 0 inserts a mask", 2, lambda s: _infill_case(
            s, [10, 11, 12, 13], [(2, 0)], 4, "span (2, 0)")),
        Case("spans at both ends, adjacent spans", 1, lambda s: (
            _infill_case(s, [10, 11, 12, 13, 14], [(0, 2), (4, 1)], 4, "spans (0, 2), (4, 1)"),
            _infill_case(s, [10, 11, 12, 13, 14], [(1, 1), (2, 2)], 4, "adjacent spans (1, 1), (2, 2)"))),
        Case("random spans, no spans", 1, lambda s: (
            [_infill_random(s, n, n) for n in (9, 17, 30)], _infill_case(s, [7, 8], [], 4, "no spans"))),
    ),
))


# ----------------------------------------------------------------- 11.6 Your T5, and your span corruption feeding it

# The student's parameter names (the chapter's T5Encoder, extended to a decoder) -> the reference's
# (companion.models.encoder_decoder.EncoderDecoder with companion.models.t5.t5_config).
_STACK_MAP = {"norm1": "norm1.weight", "qkv.weight": "self_attn.qkv.weight", "o.weight": "self_attn.out.weight",
              "norm2": "norm2.weight", "wi.weight": "ffn.up.weight", "wo.weight": "ffn.down.weight"}
_CROSS_MAP = {"norm_cross": "norm_cross.weight", "cross_q.weight": "cross_attn.q.weight",
              "cross_kv.weight": "cross_attn.kv.weight", "cross_o.weight": "cross_attn.out.weight"}


def t5_name_map(cfg: EncoderDecoderConfig) -> dict[str, str]:
    """MyT5's state-dict key -> the key of the same tensor in the course's :class:`EncoderDecoder` (T5 config)."""
    m = {"emb.weight": "tok_emb.weight",
         "encoder.rel.weight": "encoder_bias.relative_attention_bias.weight", "encoder.norm": "encoder_norm.weight",
         "decoder.rel.weight": "decoder_bias.relative_attention_bias.weight", "decoder.norm": "decoder_norm.weight"}
    for stack, n in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers)):
        parts = _STACK_MAP | (_CROSS_MAP if stack == "decoder" else {})
        for i in range(n):
            m |= {f"{stack}.layers.{i}.{ours}": f"{stack}.{i}.{ref}" for ours, ref in parts.items()}
    if not cfg.tie_embeddings:
        m["lm_head.weight"] = "lm_head.weight"
    return m


def _t5_cfg(tie: bool = True, n_layers: int = 2, n_decoder_layers: int = 3) -> EncoderDecoderConfig:
    # odd sizes: n_heads * d_kv = 24 != d_model = 20; 8 buckets up to distance 12, so that sequences
    # of 15 tokens reach the log-spaced buckets and the last one
    return t5_config(61, d_model=20, n_heads=3, d_kv=8, d_ff=36, n_layers=n_layers, n_decoder_layers=n_decoder_layers,
                     n_buckets=8, max_distance=12, dropout=0.0, tie_embeddings=tie)


def _t5_reference(cfg: EncoderDecoderConfig, seed: int, table_std: float = 1.0) -> EncoderDecoder:
    torch.manual_seed(seed)
    ref = EncoderDecoder(cfg).eval()
    with torch.no_grad():  # gains away from 1 and a position table that matters, so that a slip shows
        for name, p in ref.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif "relative_attention_bias" in name:
                p.normal_(0.0, table_std)
    return ref


def _t5_layout(cls, cfg: EncoderDecoderConfig):
    """The student's model for ``cfg``, its names and shapes checked against the name map."""
    torch.manual_seed(0)
    model = cls(cfg)
    got = {k: tuple(v.shape) for k, v in dict(model.state_dict()).items() if torch.is_floating_point(v)}
    ref = {k: tuple(v.shape) for k, v in EncoderDecoder(cfg).state_dict().items()}
    want = {ours: ref[theirs] for ours, theirs in t5_name_map(cfg).items()}
    extra = sorted(set(got) - set(want) - ({"lm_head.weight"} if cfg.tie_embeddings else set()))
    tables = [k for k in extra if ".layers." in k and ("rel" in k or "bias" in k)]
    if tables:
        raise CheckFailed(f"position tables inside the layers ({', '.join(tables[:4])}): T5 has one table per stack, "
                          "encoder.rel and decoder.rel (n_buckets, n_heads); compute the bias once in the stack's "
                          "forward and pass it to every layer")
    missing = sorted(set(want) - set(got))
    if missing:
        raise CheckFailed(f"MyT5(cfg) has no parameter {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"
                          f" (the name map of the statement; the model has {', '.join(sorted(got)[:6])} ...)")
    if extra:
        raise CheckFailed(f"parameters that T5 does not have: {', '.join(extra[:5])} (no biases anywhere; "
                          "a tied head has no lm_head)")
    for name, shape in want.items():
        if got[name] != shape:
            raise CheckFailed(f"{name} should have shape {shape} (cfg: d_model={cfg.d_model}, n_heads={cfg.n_heads}, "
                              f"d_kv={cfg.d_head}, d_ff={cfg.d_ff}, n_buckets={cfg.n_buckets}), got {got[name]}")
    if cfg.tie_embeddings and "lm_head.weight" in got and got["lm_head.weight"] != want["emb.weight"]:
        raise CheckFailed(f"lm_head.weight of a tied head should be emb.weight, shape {want['emb.weight']}")
    return model


def _t5_student(cls, ref: EncoderDecoder):
    """The student's model holding the reference's weights (under the student's names), in eval mode."""
    cfg = ref.cfg
    model = _t5_layout(cls, cfg)
    sd = ref.state_dict()
    weights = {ours: sd[theirs].clone() for ours, theirs in t5_name_map(cfg).items()}
    if cfg.tie_embeddings:
        weights["lm_head.weight"] = sd["tok_emb.weight"].clone()  # read only if the student keeps one
    model.load_state_dict(weights, strict=False)
    model.eval()
    return model


class _FirstLayerBias(nn.Module):
    """A block that ignores the position bias: with it from layer 1 on, only the first layer adds the bias."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, *args, **kwargs):
        kwargs["bias"] = None
        return self.block(*args, **kwargs)


def _t5_variants(ref: EncoderDecoder):
    """Plausible wrong T5s with the reference's weights: (what it does, what to fix, model)."""
    cfg, sd = ref.cfg, ref.state_dict()

    def with_cfg(**changes):
        m = EncoderDecoder(cfg.replace(**changes)).eval()
        m.load_state_dict(sd)
        return m

    out = [("divides the scores by sqrt(d_kv)", "T5 adds the bias to q k^T and does not scale",
            with_cfg(scale_attention=True)),
           ("normalises with a mean-subtracting LayerNorm", "T5's norm divides by the root mean square "
            "and subtracts no mean", with_cfg(norm="layernorm"))]
    bidi = with_cfg()
    bidi.decoder_bias.bidirectional = True
    out.append(("gives the decoder bidirectional buckets", "the decoder's buckets are unidirectional "
                "(relative_bucket(..., bidirectional=False))", bidi))
    first = with_cfg()
    for stack in (first.encoder, first.decoder):
        for i in range(1, len(stack)):
            stack[i] = _FirstLayerBias(stack[i])
    out.append(("adds the position bias in the first layer only", "add the bias computed once to the scores "
                "of every layer", first))
    if cfg.tie_embeddings:
        out.append(("does not rescale the tied head", "multiply the decoder output by d_model**-0.5 before "
                    "the tied head", with_cfg(scale_output=False)))
    return out


def _t5_compare(got, ref: EncoderDecoder, src, tgt_in, mask, what):
    with torch.no_grad():
        want = ref(src, tgt_in, mask)
    try:
        expect_tensor(got, want, name=f"logits ({what})", atol=1e-4, rtol=1e-4)
    except CheckFailed as err:
        if isinstance(got, torch.Tensor) and got.shape == want.shape:
            for does, fix, variant in _t5_variants(ref):
                with torch.no_grad():
                    if torch.allclose(got, variant(src, tgt_in, mask), atol=1e-4, rtol=1e-4):
                        raise CheckFailed(f"logits ({what}) equal those of a T5 that {does}: {fix}") from None
        raise CheckFailed(f"{err} (the reference's weights copied in by the name map)") from None


def _t5_batch(cfg, seed, lengths=(15, 11, 6), t=7):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(2, cfg.vocab_size, (len(lengths), max(lengths)), generator=g)
    mask = (torch.arange(src.shape[1]) < torch.tensor(lengths)[:, None]).long()  # (B, S), 1 = real token
    src = src.masked_fill(mask == 0, cfg.pad_id)
    tgt_in = torch.cat([torch.full((len(lengths), 1), cfg.decoder_start_id),
                        torch.randint(2, cfg.vocab_size, (len(lengths), t - 1), generator=g)], dim=1)
    return src, tgt_in, mask


def _t5_logits(cls):
    ref = _t5_reference(_t5_cfg(), 0)
    model = _t5_student(cls, ref)
    src, tgt_in, mask = _t5_batch(ref.cfg, 1)
    with torch.no_grad():
        got = model(src, tgt_in, mask)
    _t5_compare(got, ref, src, tgt_in, mask, "B=3, S=15 with rows of 15, 11 and 6 real tokens, T=7")


def _t5_shared_bias(cls):
    # three layers in each stack and a large position table: the bias dominates the scores
    ref = _t5_reference(_t5_cfg(n_layers=3, n_decoder_layers=3), 2, table_std=3.0)
    model = _t5_student(cls, ref)
    src, tgt_in, mask = _t5_batch(ref.cfg, 3, lengths=(14, 14), t=9)
    with torch.no_grad():
        got = model(src, tgt_in, None)
    _t5_compare(got, ref, src, tgt_in, mask, "3 layers per stack, position tables of std 3, no padding")


def _t5_causal(cls):
    ref = _t5_reference(_t5_cfg(), 4)
    model = _t5_student(cls, ref)
    src, tgt_in, mask = _t5_batch(ref.cfg, 5, lengths=(9, 5), t=8)
    changed = tgt_in.clone()
    changed[:, 5:] = (changed[:, 5:] + 7) % ref.cfg.vocab_size
    with torch.no_grad():
        a, b = model(src, tgt_in, mask), model(src, changed, mask)
    for name, out in (("decoder_input_ids", a), ("the changed decoder_input_ids", b)):
        expect_true(isinstance(out, torch.Tensor) and out.shape == (2, 8, ref.cfg.vocab_size),
                    f"logits for {name} should be a tensor of shape (2, 8, {ref.cfg.vocab_size}), got "
                    f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
    err = (a[:, :5] - b[:, :5]).abs().max().item()
    if not err <= 1e-5:
        raise CheckFailed(f"changing decoder tokens 5..7 changed the logits of positions 0..4 by up to {err:.3g}: "
                          "the decoder's self-attention must be causal (position t sees positions 0..t only)")
    with torch.no_grad():  # and not causal by being wrong: the logits are the reference's
        _t5_compare(b, ref, src, changed, mask, "B=2, T=8, decoder tokens 5..7 changed")


def _t5_untied(cls):
    ref = _t5_reference(_t5_cfg(tie=False), 6)
    model = _t5_student(cls, ref)
    src, tgt_in, mask = _t5_batch(ref.cfg, 7, lengths=(12, 7), t=5)
    with torch.no_grad():
        got = model(src, tgt_in, mask)
    try:
        _t5_compare(got, ref, src, tgt_in, mask, "tie_embeddings=False")
    except CheckFailed as err:
        with torch.no_grad():
            scaled = ref.head(ref.decode_hidden(tgt_in, ref.encode(src, mask), mask) * ref.cfg.d_model ** -0.5)
        comparable = isinstance(got, torch.Tensor) and got.shape == scaled.shape
        if comparable and torch.allclose(got, scaled, atol=1e-4, rtol=1e-4):
            raise CheckFailed("with tie_embeddings=False the logits are lm_head(h), without the d_model**-0.5 "
                              "factor (T5 rescales only a tied head)") from None
        raise err from None


def _as_ids(x, what):
    def one_id(i):
        return isinstance(i, int) or (isinstance(i, torch.Tensor) and i.numel() == 1)

    expect_true(isinstance(x, (list, tuple)) and all(one_id(i) for i in x),
                f"span_corrupt's {what} should be a list of ints, got {type(x).__name__}")
    return [int(i) for i in x]


def _pad(rows, value):
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows])  # (B, L)


def _span_batch(pairs, cfg):
    """Inputs padded (and their attention mask), decoder inputs = start id + target shifted right, labels."""
    src = _pad([list(i) for i, _ in pairs], cfg.pad_id)  # (B, S)
    mask = _pad([[1] * len(i) for i, _ in pairs], 0)  # (B, S)
    tgt_in = _pad([[cfg.decoder_start_id] + list(t[:-1]) for _, t in pairs], cfg.pad_id)  # (B, T)
    labels = _pad([list(t) for _, t in pairs], -100)  # (B, T), -100: no loss on padding
    return src, mask, tgt_in, labels


def _t5_span_loss(cls, corrupt):
    ref = _t5_reference(_t5_cfg(), 8)
    cfg = ref.cfg
    g = torch.Generator().manual_seed(9)
    texts = [torch.randint(2, cfg.vocab_size - 10, (n,), generator=g).tolist() for n in (23, 17, 30)]
    masks = [random_spans_noise_mask(len(t), 0.15, 3.0, generator=g).tolist() for t in texts]
    want, got = [], []
    for k, (text, noise) in enumerate(zip(texts, masks)):
        want.append(span_corrupt(text, torch.tensor(noise), cfg.vocab_size, cfg.eos_id))
        pair = corrupt(list(text), list(noise), cfg.vocab_size, cfg.eos_id)
        expect_true(isinstance(pair, tuple) and len(pair) == 2,
                    f"span_corrupt (11.2) must return (inputs, targets), got {type(pair).__name__}")
        pair = (_as_ids(pair[0], "inputs"), _as_ids(pair[1], "targets"))
        for name, g_ids, w_ids in (("inputs", pair[0], want[-1][0]), ("targets", pair[1], want[-1][1])):
            if g_ids != w_ids:
                raise CheckFailed(f"text {k} ({len(text)} tokens): your span_corrupt's {name} are {g_ids}, "
                                  f"expected {w_ids} (exercise 11.2)")
        got.append(pair)
    model = _t5_student(cls, ref)
    src, mask, tgt_in, labels = _span_batch(got, cfg)  # equal to the reference's batch: checked above
    with torch.no_grad():
        logits = model(src, tgt_in, mask)
    _t5_compare(logits, ref, src, tgt_in, mask, "the corrupted batch: inputs padded, decoder inputs shifted right")
    w_src, w_mask, w_tgt_in, w_labels = _span_batch(want, cfg)  # the reference's corruption, the reference's model
    with torch.no_grad():
        want_logits = ref(w_src, w_tgt_in, w_mask)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100).item()
    want_loss = nn.functional.cross_entropy(want_logits.flatten(0, 1), w_labels.flatten(), ignore_index=-100).item()
    if not math.isclose(loss, want_loss, rel_tol=1e-5, abs_tol=1e-5):
        raise CheckFailed(f"the loss of your T5 on your corrupted batch is {loss:.5f}, the reference's {want_loss:.5f}")


register(Exercise(
    id="11.6",
    title="Your T5",
    targets=("MyT5", "span_corrupt"),
    forbidden=("companion.models", "companion.positional", "companion.attention", "companion.span_corruption",
               "companion.blocks", "transformers"),
    cases=(
        Case("names and shapes of the name map", 1, lambda m, c: _t5_layout(m, _t5_cfg())),
        Case("logits equal the reference with copied weights (D=20, H=3, d_kv=8, padding in the encoder input)",
             3, lambda m, c: _t5_logits(m), timeout=30),
        Case("one position bias per stack, added in every layer (3 layers, a large table)", 2,
             lambda m, c: _t5_shared_bias(m), timeout=30),
        Case("the decoder is causal", 1, lambda m, c: _t5_causal(m), timeout=30),
        Case("an untied head is not rescaled", 1, lambda m, c: _t5_untied(m), timeout=30),
        Case("your span corruption feeds your T5: the loss equals the reference's", 2,
             lambda m, c: _t5_span_loss(m, c), timeout=30),
    ),
))
