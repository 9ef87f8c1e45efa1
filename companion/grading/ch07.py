"""Checks for the Chapter 7 exercises (BERT: input embeddings, MLM masking, WordPiece, mean pooling).

References: :func:`companion.mlm.apply_mlm_draws`,
:func:`companion.tokenizers.wordpiece.wordpiece_encode_word`, and for the
embeddings and the pooling the formulas written with ``torch.nn.functional``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..mlm import MaskingDraws, apply_mlm_draws, special_tokens_mask
from ..tokenizers.wordpiece import wordpiece_encode_word
from .core import Case, CheckFailed, Exercise, expect_tensor, expect_true, register


# ----------------------------------------------------------------- 7.1 BERT input embeddings

def _emb_weights(vocab: int, max_pos: int, n_types: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(vocab, d, generator=g), torch.randn(max_pos, d, generator=g),
            torch.randn(n_types, d, generator=g), 1 + 0.3 * torch.randn(d, generator=g),
            0.3 * torch.randn(d, generator=g))


def _emb_reference(ids, types, word, pos, typ, w, b, eps):
    t = ids.shape[1]
    x = F.embedding(ids, word) + F.embedding(types, typ) + pos[:t].unsqueeze(0)
    return F.layer_norm(x, (word.shape[1],), w, b, eps)


def _emb_case(student, b, t, vocab, max_pos, d, seed, eps=1e-12, what=""):
    word, pos, typ, w, bias = _emb_weights(vocab, max_pos, 2, d, seed)
    g = torch.Generator().manual_seed(seed + 100)
    ids = torch.randint(vocab, (b, t), generator=g)
    types = (torch.arange(t) >= t // 2).long().expand(b, t).clone()
    want = _emb_reference(ids, types, word, pos, typ, w, bias, eps)
    got = student(ids.clone(), types.clone(), word.clone(), pos.clone(), typ.clone(), w.clone(), bias.clone(), eps)
    expect_tensor(got, want, name=f"embeddings {what}(B={b}, T={t}, D={d})")


def _emb_positions_matter(student):
    word, pos, typ, w, bias = _emb_weights(11, 9, 2, 6, 5)
    ids = torch.full((1, 5), 3)  # the same token five times: only the positions tell them apart
    types = torch.zeros(1, 5, dtype=torch.long)
    got = student(ids, types, word, pos, typ, w, bias, 1e-12)
    expect_tensor(got, _emb_reference(ids, types, word, pos, typ, w, bias, 1e-12),
                  name="embeddings of one token repeated 5 times (positions 0..4 must differ)")


register(Exercise(
    id="7.1",
    title="BERT input embeddings: token + segment + position, then LayerNorm",
    targets=("bert_embeddings",),
    forbidden=("transformers", "companion.models"),
    cases=(
        Case("random ids, two segments (B=2, T=7, D=16)", 2, lambda s: _emb_case(s, 2, 7, 30, 12, 16, 0)),
        Case("odd sizes, T shorter than the position table (B=3, T=5, D=10)", 2,
             lambda s: _emb_case(s, 3, 5, 17, 20, 10, 1)),
        Case("the same token at every position", 1, _emb_positions_matter),
        Case("another epsilon (1e-5) and T equal to the table size", 1,
             lambda s: _emb_case(s, 1, 9, 13, 9, 8, 2, eps=1e-5, what="with eps=1e-5 ")),
    ),
))


# ----------------------------------------------------------------- 7.2 MLM masking from given draws

def _mlm_inputs(b, t, vocab, seed, n_special=5):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(n_special, vocab, (b, t), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
    att = torch.ones(b, t, dtype=torch.long)
    for r in range(b):
        n = int(torch.randint(max(2, t // 2), t + 1, (1,), generator=g))
        ids[r, n:], att[r, n:] = 0, 0
        ids[r, n - 1] = 3
    select = torch.rand(b, t, generator=g)
    action = torch.rand(b, t, generator=g)
    random_tokens = torch.randint(n_special, vocab, (b, t), generator=g)
    return ids, att, select, action, random_tokens


_SPECIAL = [0, 1, 2, 3, 4]
_MASK_ID = 4


def _mlm_check(student, ids, att, select, action, random_tokens, p, what):
    blocked = special_tokens_mask(ids, _SPECIAL, att)
    want_x, want_y = apply_mlm_draws(ids, MaskingDraws(select, action, random_tokens), blocked, _MASK_ID,
                                     mlm_probability=p)
    result = student(ids.clone(), att.clone(), list(_SPECIAL), _MASK_ID, select.clone(), action.clone(),
                     random_tokens.clone(), p)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise CheckFailed(f"mlm_mask should return a pair (masked_ids, labels), got {type(result).__name__}")
    got_x, got_y = result
    expect_tensor(got_y, want_y, name=f"labels ({what})")
    expect_tensor(got_x, want_x, name=f"masked input ids ({what})")


def _mlm_by_hand(student):
    ids = torch.tensor([[2, 10, 11, 12, 13, 14, 3, 0]])
    att = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]])
    select = torch.tensor([[0.0, 0.1, 0.5, 0.01, 0.14, 0.149, 0.0, 0.0]])
    action = torch.tensor([[0.0, 0.5, 0.0, 0.85, 0.95, 0.8, 0.0, 0.0]])
    rnd = torch.tensor([[50, 51, 52, 53, 54, 55, 56, 57]])
    _mlm_check(student, ids, att, select, action, rnd, 0.15, "a worked example with every outcome")


def _mlm_input_untouched(student):
    ids, att, select, action, rnd = _mlm_inputs(2, 9, 40, 3)
    keep = ids.clone()
    select = torch.zeros_like(select)  # everything eligible is selected
    student(ids, att, list(_SPECIAL), _MASK_ID, select, action, rnd, 0.15)
    expect_true(torch.equal(ids, keep), "mlm_mask changed input_ids in place; return a new tensor instead")


register(Exercise(
    id="7.2",
    title="MLM masking from given random draws (80% [MASK] / 10% random / 10% unchanged)",
    targets=("mlm_mask",),
    forbidden=("companion.mlm", "transformers"),
    cases=(
        Case("a worked example (boundaries 0.15 and 0.8 / 0.9)", 2, _mlm_by_hand),
        Case("random batch with padding (B=4, T=13)", 2,
             lambda s: _mlm_check(s, *_mlm_inputs(4, 13, 50, 0), 0.15, "B=4, T=13")),
        Case("selection probability 0.5, odd sizes (B=3, T=7)", 2,
             lambda s: _mlm_check(s, *_mlm_inputs(3, 7, 23, 1), 0.5, "p=0.5")),
        Case("every draw selects: specials and padding still never masked", 1,
             lambda s: _mlm_check(s, *(lambda a: (a[0], a[1], torch.zeros_like(a[2]), a[3], a[4]))(
                 _mlm_inputs(2, 11, 30, 2)), 0.15, "select draws all 0")),
        Case("input_ids not modified in place", 1, _mlm_input_untouched),
    ),
))


# ----------------------------------------------------------------- 7.3 WordPiece encoding of one word

_VOCAB = ["[UNK]", "un", "##aff", "##able", "##a", "a", "##b", "b", "play", "##ing", "##s", "p", "##l", "##ay",
          "playing", "##n", "##e", "x", "##x"]


def _wp_check(student, word, vocab, max_chars, what):
    want = wordpiece_encode_word(word, set(vocab), max_input_chars_per_word=max_chars)
    got = student(word, set(vocab), max_chars)
    expect_true(isinstance(got, list), f"wordpiece_word must return a list of strings, got {type(got).__name__}")
    expect_true(got == want, f"{what}: for {word!r} expected {want}, got {got}")


register(Exercise(
    id="7.3",
    title="WordPiece: greedy longest-match-first encoding of one word",
    targets=("wordpiece_word",),
    forbidden=("companion.tokenizers", "tokenizers", "transformers"),
    cases=(
        Case("BERT's example: unaffable", 1, lambda s: _wp_check(s, "unaffable", _VOCAB, 100, "un ##aff ##able")),
        Case("longest match first, not the first match", 2,
             lambda s: [_wp_check(s, w, _VOCAB, 100, "greedy") for w in ("playing", "plays", "playings", "aab")]),
        Case("stuck in the middle: the whole word is [UNK]", 2,
             lambda s: [_wp_check(s, w, _VOCAB, 100, "unknown") for w in ("playz", "zap", "unaffablez")]),
        Case("max_chars: a longer word is [UNK], an equal one is encoded", 1,
             lambda s: [_wp_check(s, w, _VOCAB, 6, "max_chars=6") for w in ("xxxxxx", "xxxxxxx")]),
        Case("a one-character word", 1, lambda s: [_wp_check(s, w, _VOCAB, 100, "single") for w in ("a", "q")]),
    ),
))


# ----------------------------------------------------------------- 7.4 mean pooling over the attention mask

def _pool_reference(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    from ..models.bert import mean_pool  # the course's sentence embedding

    return mean_pool(hidden, mask)


def _pool_case(student, b, t, d, seed, all_pad_rows=(), what=""):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, t, d, generator=g)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = (torch.arange(t) < lengths[:, None]).long()
    for r in all_pad_rows:
        mask[r] = 0
    hidden_padded = hidden.clone()
    hidden_padded[mask == 0] = 1e4  # padding holds garbage: it must not leak into the mean
    got = student(hidden_padded.clone(), mask.clone())
    expect_tensor(got, _pool_reference(hidden_padded, mask), name=f"pooled embeddings {what}(B={b}, T={t}, D={d})")


register(Exercise(
    id="7.4",
    title="Sentence embedding: mean pooling over the attention mask",
    targets=("mean_pool",),
    forbidden=("transformers", "sentence_transformers"),
    cases=(
        Case("random lengths (B=4, T=9, D=6)", 2, lambda s: _pool_case(s, 4, 9, 6, 0)),
        Case("odd sizes, one token per row possible (B=5, T=3, D=7)", 1, lambda s: _pool_case(s, 5, 3, 7, 1)),
        Case("an all-padding row gives zeros, not NaN", 2,
             lambda s: _pool_case(s, 3, 6, 4, 2, all_pad_rows=(1,), what="with row 1 all padding ")),
    ),
))
