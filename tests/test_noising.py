"""BART's noising functions: counts and invariants checked by hand."""
import pytest
import torch

from companion.noising import (document_rotation, sentence_permutation, text_infilling,
                               token_deletion, token_masking)

IDS = list(range(10, 50))  # 40 distinct tokens
MASK = 3


def g(seed=0):
    return torch.Generator().manual_seed(seed)


def test_token_masking_and_deletion_counts():
    out = token_masking(IDS, MASK, 0.15, g())
    assert len(out) == 40 and out.count(MASK) == 6
    assert all(a == b for a, b in zip(IDS, out) if b != MASK)
    out = token_deletion(IDS, 0.15, g())
    assert len(out) == 34 and out == sorted(out) and set(out) <= set(IDS)


@pytest.mark.parametrize("seed", range(20))
def test_text_infilling_keeps_order_and_masks_at_most_ratio(seed):
    out = text_infilling(IDS, MASK, 0.3, 3.0, g(seed))
    kept = [t for t in out if t != MASK]
    assert kept == sorted(kept) and set(kept) <= set(IDS)
    assert len(IDS) - len(kept) <= 12  # at most round(0.3 * 40) tokens removed
    assert out.count(MASK) >= 1


def test_text_infilling_zero_ratio_is_identity():
    assert text_infilling(IDS, MASK, 0.0, 3.0, g()) == IDS


def test_sentence_permutation_and_rotation():
    sents = [[1, 2], [3], [4, 5, 6]]
    out = sentence_permutation(sents, g())
    assert sorted(out) == [1, 2, 3, 4, 5, 6] and len(out) == 6
    rot = document_rotation(IDS, g())
    k = IDS.index(rot[0])
    assert rot == IDS[k:] + IDS[:k]


def test_bad_ratio():
    with pytest.raises(ValueError, match="ratio"):
        token_deletion(IDS, 1.5)
