"""MLM masking, NSP pairs, static/dynamic masking and FULL-SENTENCES packing (companion.mlm)."""

from __future__ import annotations

import math

import pytest
import torch

from companion.mlm import (
    IGNORE_INDEX, DynamicMasking, MaskingDraws, apply_mlm_draws, make_nsp_pairs, mask_tokens,
    pack_full_sentences, special_tokens_mask, static_masking,
)

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIAL = [PAD, UNK, CLS, SEP, MASK]
V = 60


def _batch(b: int, t: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (b, t), generator=g)
    ids[:, 0], ids[:, -1] = CLS, SEP
    ids[:, t // 2] = SEP
    attention = torch.ones_like(ids)
    lengths = torch.randint(t // 2 + 2, t + 1, (b,), generator=g)
    for r, n in enumerate(lengths.tolist()):
        ids[r, n:] = PAD
        attention[r, n:] = 0
    return ids, attention


def test_apply_draws_by_hand():
    ids = torch.tensor([[CLS, 10, 11, 12, 13, 14, SEP, PAD]])
    att = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]])
    blocked = special_tokens_mask(ids, SPECIAL, att)
    assert blocked.tolist() == [[True, False, False, False, False, False, True, True]]
    draws = MaskingDraws(
        select=torch.tensor([[0.0, 0.1, 0.5, 0.01, 0.14, 0.149, 0.0, 0.0]]),
        action=torch.tensor([[0.0, 0.5, 0.0, 0.85, 0.95, 0.8, 0.0, 0.0]]),
        random_tokens=torch.tensor([[50, 51, 52, 53, 54, 55, 56, 57]]),
    )
    out, labels = apply_mlm_draws(ids, draws, blocked, MASK)
    # position 1: selected, action 0.5 < 0.8 -> [MASK]; 2: not selected; 3: 0.85 -> random (53);
    # 4: 0.95 -> unchanged; 5: 0.8 -> random (boundary belongs to the random band); specials/padding never.
    assert out.tolist() == [[CLS, MASK, 11, 53, 13, 55, SEP, PAD]]
    assert labels.tolist() == [[-100, 10, -100, 12, 13, 14, -100, -100]]
    assert ids.tolist() == [[CLS, 10, 11, 12, 13, 14, SEP, PAD]]  # input untouched


def test_frequencies_on_a_large_sample():
    ids, att = _batch(400, 257)
    g = torch.Generator().manual_seed(1)
    out, labels = mask_tokens(ids, mask_id=MASK, special_ids=SPECIAL, vocab_size=V, attention_mask=att, generator=g)
    eligible = (att == 1) & ~torch.isin(ids, torch.tensor(SPECIAL))
    selected = labels != IGNORE_INDEX
    assert not (selected & ~eligible).any()  # never a special token or padding
    assert torch.equal(labels[selected], ids[selected])
    assert torch.equal(out[~selected], ids[~selected])
    n, k = int(eligible.sum()), int(selected.sum())

    def within(count: int, total: int, p: float) -> bool:  # 5 binomial standard deviations
        return abs(count - total * p) <= 5 * math.sqrt(total * p * (1 - p))

    assert within(k, n, 0.15), (k, n)
    n_random_ids = V - len(SPECIAL)
    as_mask = int((out[selected] == MASK).sum())
    changed = int(((out[selected] != MASK) & (out[selected] != ids[selected])).sum())
    same = int((out[selected] == ids[selected]).sum())
    assert within(as_mask, k, 0.8)
    # a random draw equals the original token with probability 1/n_random_ids
    assert within(changed, k, 0.1 * (1 - 1 / n_random_ids))
    assert within(same, k, 0.1 + 0.1 / n_random_ids)
    replaced = out[selected & (out != MASK) & (out != ids)]
    assert not torch.isin(replaced, torch.tensor(SPECIAL)).any()  # random tokens are never special
    assert len(set(replaced.tolist())) == n_random_ids  # and drawn from the whole non-special range


def test_reproducible_with_a_generator_and_dynamic_differs():
    ids, att = _batch(4, 33)
    kw = dict(mask_id=MASK, special_ids=SPECIAL, vocab_size=V, attention_mask=att)
    a = mask_tokens(ids, generator=torch.Generator().manual_seed(7), **kw)
    b = mask_tokens(ids, generator=torch.Generator().manual_seed(7), **kw)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    masker = DynamicMasking(mask_id=MASK, special_ids=SPECIAL, vocab_size=V, seed=7)
    e1, e2 = masker(ids, att), masker(ids, att)
    assert not torch.equal(e1[1], e2[1])  # a fresh mask each epoch
    assert torch.equal(e1[1], a[1])  # the first call is the seeded masking


def test_static_masking_copies():
    ids, att = _batch(3, 20)
    out, labels = static_masking(ids, dupe_factor=10, mask_id=MASK, special_ids=SPECIAL, vocab_size=V,
                                 attention_mask=att, generator=torch.Generator().manual_seed(0))
    assert out.shape == (30, 20) and labels.shape == (30, 20)
    copies = labels.view(10, 3, 20)
    assert len({tuple(c.flatten().tolist()) for c in copies}) > 1  # the copies have different masks
    for c in copies:  # each copy masks the same original tokens
        sel = c != IGNORE_INDEX
        assert torch.equal(c[sel], ids[sel])


def test_mask_errors():
    ids, _ = _batch(2, 8)
    with pytest.raises(ValueError, match="mask_id"):
        mask_tokens(ids, mask_id=99, special_ids=SPECIAL, vocab_size=V)
    with pytest.raises(ValueError, match="vocab_size"):
        mask_tokens(ids, mask_id=MASK, special_ids=SPECIAL, vocab_size=10)
    with pytest.raises(TypeError, match="integer"):
        mask_tokens(ids.float(), mask_id=MASK, special_ids=SPECIAL, vocab_size=V)
    with pytest.raises(ValueError, match="at most 1"):
        mask_tokens(ids, mask_id=MASK, special_ids=SPECIAL, vocab_size=V, mask_fraction=0.8, random_fraction=0.3)
    with pytest.raises(ValueError, match="attention_mask"):
        mask_tokens(ids, mask_id=MASK, special_ids=SPECIAL, vocab_size=V, attention_mask=torch.ones(2, 9))
    with pytest.raises(ValueError, match="mlm_probability"):
        mask_tokens(ids, mask_id=MASK, special_ids=SPECIAL, vocab_size=V, mlm_probability=1.5)


def test_nsp_pairs_half_and_half():
    docs = [[f"d{d}s{s}" for s in range(20)] for d in range(60)]
    pairs = make_nsp_pairs(docs, generator=torch.Generator().manual_seed(0))
    assert len(pairs) == 60 * 19
    for p in pairs:
        da, sa = p.a[1:].split("s")
        db, sb = p.b[1:].split("s")
        if p.label == 0:
            assert (da, int(sb)) == (db, int(sa) + 1)
        else:
            assert db != da  # B from another document
    n, k = len(pairs), sum(p.label for p in pairs)
    assert abs(k - n / 2) <= 5 * math.sqrt(n / 4)
    with pytest.raises(ValueError, match="2 documents"):
        make_nsp_pairs([["a", "b"]])
    with pytest.raises(TypeError, match="list of documents"):
        make_nsp_pairs("abc")


def test_pack_full_sentences():
    docs = [[[1, 1, 1], [2, 2]], [[3, 3, 3, 3]], [[4] * 9, [5]]]
    # by hand, seq_len 8: [1 1 1 2 2 | sep] then 3333 would make 10 > 8 -> new block;
    # [3 3 3 3] + sep + 4*9 cut to 8 does not fit -> new block; [4]*8, then [5] does not fit
    assert pack_full_sentences(docs, 8, sep_id=0) == [[1, 1, 1, 2, 2], [3, 3, 3, 3], [4] * 8, [5]]
    assert pack_full_sentences([[[1], [2]], [[3]]], 8, sep_id=0) == [[1, 2, 0, 3]]
    with pytest.raises(ValueError, match="seq_len"):
        pack_full_sentences(docs, 8, sep_id=0, truncate_long=False)
    with pytest.raises(ValueError, match="seq_len"):
        pack_full_sentences(docs, 0, sep_id=0)
