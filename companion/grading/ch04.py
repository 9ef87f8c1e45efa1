"""Checks for the Chapter 4 exercises (the original encoder-decoder).

Each case builds random inputs, runs the student's code and compares with the
reference in :mod:`companion.models.transformer`, or with ``torch.nn``'s own
post-LN layer holding the same weights.
"""

from __future__ import annotations

import torch
from torch import nn

from ..blocks import TransformerBlock
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


# ----------------------------------------------------------------- 4.2 decoder mask


def _mask_of(student, valid, name):
    got = student(valid)
    if isinstance(got, torch.Tensor) and got.dtype != torch.bool:
        raise CheckFailed(f"{name}: the mask must be boolean (True = may attend), got dtype {got.dtype}")
    expect_tensor(got, decoder_self_mask(valid), name=name)


def _mask_no_padding(student):
    _mask_of(student, torch.ones(2, 5, dtype=torch.long), "mask for 2 unpadded targets of length 5")


def _mask_padding(student):
    valid = (torch.arange(7)[None, :] < torch.tensor([7, 4, 1])[:, None]).long()
    _mask_of(student, valid, "mask for targets of lengths 7, 4, 1 (padded to 7)")


def _mask_bool_input(student):
    valid = torch.tensor([[True, True, True, False, False, False, False, False, False]])
    _mask_of(student, valid, "mask for a boolean (B, T) input")


def _mask_length_one(student):
    _mask_of(student, torch.tensor([[1], [1], [1]]), "mask for T = 1")


def _mask_left_padding(student):
    valid = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    _mask_of(student, valid, "mask for left-padded targets (padding first)")


register(Exercise(
    id="4.2",
    title="The decoder's combined mask",
    targets=("decoder_self_mask",),
    forbidden=("companion.models.transformer",),  # the reference itself
    cases=(
        Case("no padding: the causal mask, shape (B, 1, T, T)", 2, _mask_no_padding),
        Case("right padding of different lengths", 2, _mask_padding),
        Case("boolean input", 1, _mask_bool_input),
        Case("length 1", 1, _mask_length_one),
        Case("left padding", 1, _mask_left_padding),
    ),
))


# ----------------------------------------------------------------- 4.3 post-LN layer


def _build_layer(cls, d_model, n_heads, d_ff):
    torch.manual_seed(3)
    layer = cls(d_model, n_heads, d_ff)
    torch_layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout=0.0, activation="relu",
                                             batch_first=True, norm_first=False)
    with torch.no_grad():
        for norm in (torch_layer.norm1, torch_layer.norm2):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_(0, 0.1)
    ref = TransformerBlock.from_torch(torch_layer)
    try:
        layer.load_state_dict(ref.state_dict())
    except Exception as err:  # noqa: BLE001
        raise CheckFailed(f"could not load the reference weights into your layer: {str(err).splitlines()[0]}") from None
    if hasattr(layer, "eval"):
        layer.eval()
    return layer, torch_layer.train(), ref  # torch in training mode with dropout 0: no fast path


def _layer_matches_torch(cls):
    layer, torch_layer, _ = _build_layer(cls, 12, 3, 20)
    x = torch.randn(2, 7, 12)
    with torch.no_grad():
        expect_tensor(layer(x), torch_layer(x), name="output vs nn.TransformerEncoderLayer(norm_first=False)")


def _layer_with_padding(cls):
    layer, torch_layer, _ = _build_layer(cls, 12, 3, 20)
    x = torch.randn(3, 13, 12)
    valid = torch.arange(13)[None, :] < torch.tensor([13, 8, 2])[:, None]
    with torch.no_grad():
        expect_tensor(layer(x, padding_mask(valid)), torch_layer(x, src_key_padding_mask=~valid),
                      name="output with a padding mask (B, 1, 1, S)")


def _layer_not_pre_ln(cls):
    layer, _, ref = _build_layer(cls, 8, 2, 16)
    x = torch.randn(2, 5, 8) * 3 + 1
    pre = TransformerBlock(8, 2, 16, norm_first=True)
    pre.load_state_dict(ref.state_dict())
    with torch.no_grad():
        got, want, pre_out = layer(x), ref(x), pre.eval()(x)
    if isinstance(got, torch.Tensor) and got.shape == pre_out.shape and torch.allclose(got, pre_out, atol=1e-4):
        raise CheckFailed("this is the pre-LN wiring x + sublayer(norm(x)); the original is norm(x + sublayer(x))")
    expect_tensor(got, want, name="output on inputs with mean 1 and std 3")


def _layer_causal(cls):
    layer, _, ref = _build_layer(cls, 10, 5, 14)
    x = torch.randn(2, 6, 10)
    mask = causal_mask(6)
    with torch.no_grad():
        expect_tensor(layer(x, mask), ref(x, mask), name="output with a causal mask (T, T)")


register(Exercise(
    id="4.3",
    title="A post-LN encoder layer",
    targets=("PostLNEncoderLayer",),
    forbidden=("companion.blocks.TransformerBlock", "companion.models.transformer"),  # the reference itself
    cases=(
        Case("matches nn.TransformerEncoderLayer (post-LN) with the same weights", 3, _layer_matches_torch),
        Case("passes the mask to self-attention (padding)", 2, _layer_with_padding),
        Case("normalises after the residual sum (post-LN, not pre-LN)", 2, _layer_not_pre_ln),
        Case("works with a causal mask and other sizes", 1, _layer_causal),
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
