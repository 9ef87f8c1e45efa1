"""Checks for the Chapter 4 exercises (the original encoder-decoder).

Each case builds random inputs, runs the student's code and compares with the
reference in :mod:`companion.models.transformer`; 4.3 (DeepNorm) with a
functional post-LN layer written here from the weights it loads into the
student's layer (equal to ``nn.TransformerEncoderLayer`` at alpha = 1, see
``tests/test_grading_ch04_redesign.py``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..masks import causal_mask, padding_mask
from ..models.transformer import (
    Transformer,
    TransformerConfig,
    decoder_self_mask,
    greedy_decode,
    shift_right,
)
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, input_after_call, register, run_student

# ----------------------------------------------------------------- 4.1 shift right


def _shift_random(student):
    tgt = torch.randint(3, 13, (3, 7))
    expect_tensor(student(tgt.clone(), 1, 0), shift_right(tgt, 1, 0), name="shift_right(tgt of shape (3, 7), bos_id=1, pad_id=0)")


def _shift_padded(student):
    tgt = torch.tensor([[5, 6, 7, 2, 0, 0], [8, 2, 0, 0, 0, 0], [9, 9, 9, 9, 9, 2]])
    expect_tensor(student(tgt.clone(), 1, 0), shift_right(tgt, 1, 0), name="shift_right of right-padded targets")


def _shift_ignore_index(student):
    tgt = torch.tensor([[5, 6, 2, -100, -100], [7, 2, -100, -100, -100]])
    expect_tensor(student(tgt.clone(), 1, 0), shift_right(tgt, 1, 0),
                  name="shift_right of labels with -100 (ignored positions must become pad_id)")


def _shift_other_ids(student):
    tgt = torch.randint(0, 50, (2, 5))
    expect_tensor(student(tgt.clone(), 49, 7), shift_right(tgt, 49, 7), name="shift_right with bos_id=49, pad_id=7")


def _shift_length_one_and_inplace(student):
    tgt = torch.tensor([[4], [9]])
    expect_tensor(student(tgt, 1, 0), torch.tensor([[1], [1]]), name="shift_right of a length-1 target")
    tgt = torch.randint(3, 13, (2, 6))
    after = run_student(input_after_call, student, tgt.clone(), 1, 0)
    expect_true(torch.equal(after, tgt), "shift_right changed its input tensor in place; return a new tensor")


register(Exercise(
    id="4.1",
    title="Shift right for teacher forcing",
    targets=("shift_right",),
    forbidden=("companion.models.transformer",),  # the reference itself
    cases=(
        Case("random targets (B=3, T=7)", 2, _shift_random),
        Case("right-padded targets with EOS", 1, _shift_padded),
        Case("labels -100 become pad_id", 1, _shift_ignore_index),
        Case("other bos_id and pad_id", 1, _shift_other_ids),
        Case("length 1, and the input is not modified", 1, _shift_length_one_and_inplace),
    ),
))


# ----------------------------------------------------------------- 4.2 decoder mask as an additive bias


def _bias_reference(valid, dtype):
    """0 where the package's boolean decoder mask allows, finfo(dtype).min where it blocks (filled once)."""
    allowed = decoder_self_mask(valid)  # (B, 1, T, T)
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


def _bias_of(student, valid, dtype, name):
    got = student(valid.clone(), dtype)
    want = _bias_reference(valid, dtype)
    if isinstance(got, torch.Tensor) and got.shape == want.shape:
        _explain_bias(got, want, dtype, name, valid)
    expect_tensor(got, want, name=name, atol=0, rtol=0)
    return got


def _explain_bias(got, want, dtype, name, valid=None):
    """Name the usual mistakes: a boolean mask, -inf, two biases added, 1/0 or an inverted convention."""
    if got.dtype == torch.bool:
        raise CheckFailed(f"{name}: this is the boolean mask (True = may attend); return an additive bias of dtype "
                          f"{dtype}: 0 where a query may attend, torch.finfo({dtype}).min where it may not")
    if got.dtype != dtype:
        return  # expect_tensor names the dtype
    g = got.detach().to("cpu", torch.float64)
    blocked = want != 0
    allowed = ~blocked
    if torch.isinf(g).any() and bool((g[allowed] == 0).all()):
        twice = torch.isneginf(g) & blocked
        if bool(torch.isneginf(g[blocked]).all()):
            raise CheckFailed(f"{name}: blocked entries are -inf; the convention here is torch.finfo({dtype}).min "
                              "(as in Hugging Face's attention masks), which keeps a row with every key blocked "
                              "finite instead of NaN after the softmax")
        if twice.any():
            raise CheckFailed(f"{name}: {int(twice.sum())} entries blocked both by the causal mask and by padding "
                              f"are -inf: adding two biases of finfo.min overflows in {dtype}; fill each blocked "
                              "entry with finfo.min once (e.g. masked_fill on the combined boolean mask)")
    if bool((g[allowed] == 1).all()) and bool((g[blocked] == 0).all()):
        raise CheckFailed(f"{name}: got 1 where a query may attend and 0 where it may not (the boolean mask as a "
                          f"float); the bias is 0 where it may attend and torch.finfo({dtype}).min where it may not")
    b, _, t, _ = want.shape
    if b and t and torch.is_tensor(valid):
        rows = torch.ones(t, t, dtype=torch.bool).tril() & valid.bool()[:, None, :, None]  # padding on the queries
        if torch.equal(g == 0, rows) and not torch.equal(rows, allowed):
            raise CheckFailed(f"{name}: the padding blocks the padded queries (rows i); it must block the padded "
                              "keys (columns j): a real query may not attend to a padding token")
    if blocked.any() and bool((g[blocked] == 0).all()) and bool((g[allowed] != 0).all()):
        raise CheckFailed(f"{name}: the convention is inverted: 0 must mark the pairs that may attend, "
                          "finfo.min the blocked ones")


def _bias_no_padding(student):
    _bias_of(student, torch.ones(2, 5, dtype=torch.long), torch.float32,
             "bias for 2 unpadded targets of length 5 (float32)")


def _bias_padding(student):
    valid = (torch.arange(7)[None, :] < torch.tensor([7, 4, 1])[:, None]).long()
    _bias_of(student, valid, torch.float32, "bias for targets of lengths 7, 4, 1 padded to 7 (float32)")


def _bias_dtypes(student):
    valid = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]])
    for dtype in (torch.float16, torch.bfloat16):
        _bias_of(student, valid, dtype, f"bias in {dtype} (its own finfo.min)")


def _bias_bool_and_length_one(student):
    valid = torch.tensor([[True, True, True, False, False, False, False, False, False]])
    _bias_of(student, valid, torch.float32, "bias for a boolean (B, T) input")
    _bias_of(student, torch.tensor([[1], [1], [1]]), torch.float32, "bias for T = 1")


def _bias_left_padding(student):
    valid = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    bias = _bias_of(student, valid, torch.float32, "bias for left-padded targets (padding first)")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 8, generator=g) for _ in range(3))
    # what F.scaled_dot_product_attention computes with a float attn_mask, written out (the package's
    # kernel calls stay in companion/attention.py): softmax(q k^T / sqrt(d) + bias) v
    def attend(mask_or_bias):
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if mask_or_bias.dtype == torch.bool:
            scores = scores.masked_fill(~mask_or_bias, float("-inf"))
        else:
            scores = scores + mask_or_bias
        return scores.softmax(dim=-1) @ v

    out = attend(bias)
    expect_true(bool(torch.isfinite(out).all()),
                "attention with your bias (softmax(q k^T / sqrt(d) + bias) v, as F.scaled_dot_product_attention "
                "computes it) gives NaN in the rows of the left padding (every key blocked); finfo.min keeps them "
                "finite")
    real = decoder_self_mask(valid).any(-1, keepdim=True)  # rows with at least one key allowed
    want = attend(decoder_self_mask(valid))
    expect_tensor(torch.where(real, out, 0.0), torch.where(real, want, 0.0),
                  name="attention output of the rows with a key allowed (vs the boolean mask)")


register(Exercise(
    id="4.2",
    title="The decoder's combined mask as an additive bias",
    targets=("decoder_attention_bias",),
    forbidden=("companion.models.transformer",),  # the reference itself
    cases=(
        Case("no padding: 0 on and below the diagonal, finfo.min above, shape (B, 1, T, T)", 2, _bias_no_padding),
        Case("right padding of different lengths: blocked twice is still finfo.min", 2, _bias_padding),
        Case("float16 and bfloat16: the dtype's own minimum", 1, _bias_dtypes),
        Case("a boolean input, and length 1", 1, _bias_bool_and_length_one),
        Case("left padding: finite attention in fully blocked rows", 1, _bias_left_padding),
    ),
))


# ----------------------------------------------------------------- 4.3 DeepNorm encoder layer

# The parameters of the chapter's EncoderLayer (its Attention's q, k, v, out; feed_forward's Sequential; two norms).
_LAYER_KEYS = tuple(f"{m}.{p}" for m in ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.out", "ffn.0", "ffn.2",
                                         "norm1", "norm2") for p in ("weight", "bias"))


def _deepnorm_reference(sd, x, mask, n_heads, alpha, eps=1e-5):
    """LN(alpha x + Attention(x)), then LN(alpha x + FFN(x)), from a state dict with the chapter's names."""
    b, t, d = x.shape

    def lin(name, z):
        return F.linear(z, sd[f"{name}.weight"], sd[f"{name}.bias"])

    def split(z):
        return z.view(b, t, n_heads, d // n_heads).transpose(1, 2)

    q, k, v = (split(lin(f"self_attn.{p}", x)) for p in "qkv")
    scores = q @ k.transpose(-2, -1) / math.sqrt(d // n_heads)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    attn = lin("self_attn.out", (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d))
    x = F.layer_norm(alpha * x + attn, (d,), sd["norm1.weight"], sd["norm1.bias"], eps)
    ffn = lin("ffn.2", torch.relu(lin("ffn.0", x)))
    return F.layer_norm(alpha * x + ffn, (d,), sd["norm2.weight"], sd["norm2.bias"], eps)


def _new_layer(cls, d_model, n_heads, d_ff, n_layers):
    layer = cls(d_model, n_heads, d_ff, n_layers)
    if hasattr(layer, "eval"):
        layer.eval()
    try:
        keys = tuple(layer.state_dict())
    except Exception as err:  # noqa: BLE001
        raise CheckFailed(f"could not read your layer's state_dict(): {str(err).splitlines()[0]}") from None
    if sorted(keys) != sorted(_LAYER_KEYS):
        missing = sorted(set(_LAYER_KEYS) - set(keys))
        extra = sorted(set(keys) - set(_LAYER_KEYS))
        raise CheckFailed("keep the chapter's modules and names (self_attn = Attention with q, k, v, out; "
                          f"ffn = feed_forward; norm1, norm2); missing {missing}, unexpected {extra}")
    return layer


def _deepnorm_forward(cls, d_model, n_heads, d_ff, n_layers, b, t, lengths, causal, seed):
    layer = _new_layer(cls, d_model, n_heads, d_ff, n_layers)
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for key in _LAYER_KEYS:
        shape = {"ffn.0.weight": (d_ff, d_model), "ffn.0.bias": (d_ff,), "ffn.2.weight": (d_model, d_ff)}.get(
            key, (d_model, d_model) if key.endswith("weight") and not key.startswith("norm") else (d_model,))
        if key.startswith("norm"):
            sd[key] = (1.0 if key.endswith("weight") else 0.0) + 0.3 * torch.randn(shape, generator=g)
        else:
            sd[key] = torch.randn(shape, generator=g) / math.sqrt(shape[-1])
    try:
        layer.load_state_dict({k: v.clone() for k, v in sd.items()})
    except Exception as err:  # noqa: BLE001
        raise CheckFailed(f"could not load weights into your layer: {str(err).splitlines()[0]}") from None
    x = torch.randn(b, t, d_model, generator=g) * 2 + 0.5
    mask = None
    if lengths is not None:
        mask = padding_mask(torch.arange(t)[None, :] < torch.tensor(lengths)[:, None])
    if causal:
        mask = causal_mask(t) if mask is None else mask & causal_mask(t)
    alpha = (2 * n_layers) ** 0.25
    want = _deepnorm_reference(sd, x, mask, n_heads, alpha)
    with torch.no_grad():
        got = layer(x.clone()) if mask is None else layer(x.clone(), mask)
    if isinstance(got, torch.Tensor) and got.shape == want.shape:
        plain = _deepnorm_reference(sd, x, mask, n_heads, 1.0)
        if torch.allclose(got, plain, atol=1e-4):
            raise CheckFailed(f"this is the chapter's post-LN layer (alpha = 1); DeepNorm scales the residual x by "
                              f"alpha = (2N)^(1/4) = {alpha:.4f} for N = {n_layers} before each LayerNorm")
    what = "" if mask is None else (" with a causal mask" if lengths is None else " with a padding mask")
    expect_tensor(got, want, name=f"output of LN(alpha x + sublayer(x)), N = {n_layers} (alpha = {alpha:.4f}){what}")


def _xavier_ratio(w):
    fan_out, fan_in = w.shape
    return float(w.std()) / math.sqrt(2.0 / (fan_in + fan_out))


def _deepnorm_init(cls, names, gain_of, what):
    n_layers = 12
    layer = _new_layer(cls, 64, 4, 96, n_layers)
    sd = layer.state_dict()
    beta = (8 * n_layers) ** -0.25
    for name in names:
        gain = gain_of(beta)
        w = sd[f"{name}.weight"].detach().float()
        ratio = _xavier_ratio(w)
        if not 0.85 * gain < ratio < 1.15 * gain:
            raise CheckFailed(f"{what}: {name}.weight has std {float(w.std()):.4f} = {ratio:.3f} times Xavier's "
                              f"sqrt(2 / (fan_in + fan_out)); expected {gain:.3f} times (gain "
                              f"{'beta = (8N)^(-1/4)' if gain != 1.0 else '1'}, N = {n_layers})")


register(Exercise(
    id="4.3",
    title="A DeepNorm encoder layer",
    targets=("DeepNormEncoderLayer",),
    forbidden=("companion.blocks", "companion.models"),
    cases=(
        Case("keeps the chapter's modules and parameter names", 1, lambda c: _new_layer(c, 12, 3, 20, 4)),
        Case("LN(alpha x + sublayer(x)) with alpha = (2N)^(1/4), N = 6", 3,
             lambda c: _deepnorm_forward(c, 12, 3, 20, 6, 2, 7, None, False, 0)),
        Case("N = 50, a padding mask, a causal mask, other sizes", 2,
             lambda c: (_deepnorm_forward(c, 10, 5, 14, 50, 3, 9, [9, 5, 1], False, 1),
                        _deepnorm_forward(c, 16, 2, 24, 3, 2, 6, None, True, 2))),
        Case("v, out and both FFN weights: Xavier normal with gain beta = (8N)^(-1/4)", 1,
             lambda c: _deepnorm_init(c, ("self_attn.v", "self_attn.out", "ffn.0", "ffn.2"), lambda beta: beta,
                                      "DeepNorm's scaled initialisation")),
        Case("q and k weights: Xavier normal with gain 1", 1,
             lambda c: _deepnorm_init(c, ("self_attn.q", "self_attn.k"), lambda beta: 1.0,
                                      "the query and key weights keep gain 1")),
    ),
))


# ----------------------------------------------------------------- 4.4 greedy decoding

BOS, EOS, PAD = 1, 2, 0


class _ScriptedModel(nn.Module):
    """A stand-in for :class:`Transformer` whose next token is known: it reverses the source.

    At decoder position ``t`` it predicts ``answer[t]`` (the reversed source,
    then EOS) if the decoder input so far equals ``[BOS, answer[:t]]``, and a
    wrong token otherwise, so that a loop which does not feed its own
    predictions back is caught.
    """

    def __init__(self, vocab_size: int = 13) -> None:
        super().__init__()
        self.cfg = TransformerConfig(vocab_size=vocab_size, d_model=2, n_heads=1, d_ff=2,
                                     n_encoder_layers=1, n_decoder_layers=1, pad_id=PAD, dropout=0.0)
        self.vocab_size = vocab_size

    def encode(self, src, src_attention_mask=None):
        if src_attention_mask is None:
            src_attention_mask = src != PAD
        return torch.stack([src.float(), src_attention_mask.float()], dim=-1)  # (B, S, 2)

    def decode(self, tgt_in, memory, src_attention_mask, tgt_attention_mask=None):
        b, t = tgt_in.shape
        src, valid = memory[..., 0].long(), memory[..., 1].bool()
        logits = torch.zeros(b, t, self.vocab_size)
        for i in range(b):
            answer = src[i][valid[i]].flip(0).tolist() + [EOS] * (t + 1)
            expected_in = [BOS] + answer
            for pos in range(t):
                ok = tgt_in[i, : pos + 1].tolist() == expected_in[: pos + 1]
                logits[i, pos, answer[pos] if ok else 3] = 5.0
        return logits

    def forward(self, src, tgt_in, src_attention_mask=None, tgt_attention_mask=None):
        return self.decode(tgt_in, self.encode(src, src_attention_mask), src_attention_mask)


def _call(student, model, src, max_new_tokens, **kw):
    return student(model, src, bos_id=BOS, eos_id=EOS, max_new_tokens=max_new_tokens, **kw)


def _greedy_scripted(student):
    model = _ScriptedModel()
    src = torch.tensor([[4, 5, 6, 7], [8, 9, 10, 11]])
    want = greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_new_tokens=9)
    expect_tensor(_call(student, model, src, 9), want, name="decoded ids of two length-4 sources (reversed + EOS)")


def _greedy_padded_stop(student):
    model = _ScriptedModel()
    src = torch.tensor([[4, 5, 6, 7, 8, 9, 10], [11, 12, 0, 0, 0, 0, 0], [3, 0, 0, 0, 0, 0, 0]])
    want = greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_new_tokens=12)
    expect_tensor(_call(student, model, src, 12, src_attention_mask=src != PAD), want,
                  name="ids for sources of lengths 7, 2, 1: pad_id after each EOS, stop once all are done")


def _greedy_budget(student):
    model = _ScriptedModel()
    src = torch.tensor([[4, 5, 6, 7, 8, 9]])
    for n in (1, 3):
        want = greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_new_tokens=n)
        expect_tensor(_call(student, model, src, n), want, name=f"ids with max_new_tokens={n} (no EOS yet)")


def _greedy_real_model(student):
    torch.manual_seed(7)
    cfg = TransformerConfig(vocab_size=11, d_model=16, n_heads=2, d_ff=24, n_encoder_layers=1,
                            n_decoder_layers=2, max_positions=16, dropout=0.3)
    model = Transformer(cfg).train()  # dropout on: your loop must switch it off
    src = torch.randint(3, 11, (3, 5))
    want = greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_new_tokens=6)
    got = _call(student, model, src, 6)
    model.eval()
    expect_tensor(got, want, name="ids from a random Transformer whose dropout is on (use model.eval())")


register(Exercise(
    id="4.4",
    title="Greedy decoding",
    targets=("greedy_decode",),
    forbidden=("companion.models.transformer", "companion.generation"),  # the reference itself
    cases=(
        Case("feeds its own predictions back (scripted model)", 3, _greedy_scripted),
        Case("pads after EOS and stops when every sequence is done", 2, _greedy_padded_stop),
        Case("respects max_new_tokens", 1, _greedy_budget),
        Case("a real Transformer, dropout switched off", 2, _greedy_real_model),
    ),
))
