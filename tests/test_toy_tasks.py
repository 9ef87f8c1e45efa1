"""companion.toy_tasks: digit-string tasks, checked against plain Python string operations."""

import pytest
import torch

from companion.toy_tasks import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    VOCAB_SIZE,
    decode_ids,
    encode_digits,
    heldout_set,
    is_heldout,
    make_batch,
    solve,
)


def _strings(batch):
    return [decode_ids(row) for row in batch.src]


@pytest.mark.parametrize("task", ["reverse", "sort"])
def test_batch_answers_match_python(task):
    gen = torch.Generator().manual_seed(0)
    batch = make_batch(37, task=task, min_len=2, max_len=9, generator=gen)
    for src, tgt in zip(_strings(batch), batch.tgt):
        want = src[::-1] if task == "reverse" else "".join(sorted(src))
        assert decode_ids(tgt) == want


def test_batch_layout_padding_and_eos():
    gen = torch.Generator().manual_seed(1)
    batch = make_batch(50, min_len=1, max_len=7, generator=gen)
    lengths = batch.src_mask.sum(1)
    assert batch.src.shape[1] == int(lengths.max()) and batch.tgt.shape[1] == batch.src.shape[1] + 1
    assert 1 <= int(lengths.min()) and int(lengths.max()) <= 7
    for row_src, row_mask, row_tgt, n in zip(batch.src, batch.src_mask, batch.tgt, lengths.tolist()):
        assert row_mask.tolist() == [1] * n + [0] * (len(row_mask) - n)
        assert (row_src[n:] == PAD_ID).all() and (row_src[:n] >= 3).all()
        assert row_tgt[n] == EOS_ID and (row_tgt[n + 1:] == PAD_ID).all() and (row_tgt[:n] >= 3).all()
    assert int(batch.src.max()) < VOCAB_SIZE and not (batch.tgt == BOS_ID).any()


def test_encode_decode_round_trip_and_errors():
    assert encode_digits("307") == [6, 3, 10]
    assert decode_ids([BOS_ID, 6, 3, 10, EOS_ID, 5, PAD_ID]) == "307"  # stops at EOS
    assert solve("30417") == "71403" and solve("30417", "sort") == "01347"
    for bad in ("", "12a", "٣"):
        with pytest.raises(ValueError):
            encode_digits(bad)
    with pytest.raises(ValueError):
        decode_ids([99])
    with pytest.raises(ValueError):
        make_batch(4, min_len=5, max_len=3)
    with pytest.raises(ValueError):
        make_batch(4, task="copy")


def test_heldout_split_is_a_function_of_the_string_only():
    digits = torch.tensor([[4, 0, 2, 9, 9], [4, 0, 2, 1, 7], [0, 4, 0, 2, 5]])
    lengths = torch.tensor([3, 3, 4])
    # rows 0 and 1 are both "402" (different junk after the end): same decision
    flags = is_heldout(digits, lengths)
    assert flags[0] == flags[1]
    # about one string in ten overall (all 10^4 strings of length 4)
    all4 = torch.tensor([[int(c) for c in f"{n:04d}"] for n in range(10_000)])
    frac = is_heldout(all4, torch.full((10_000,), 4)).float().mean().item()
    assert 0.08 < frac < 0.12
    # leading zeros matter: "0402" and "402" are different strings
    keys = {tuple(r) for r in all4[is_heldout(all4, torch.full((10_000,), 4))].tolist()}
    assert len(keys) == round(frac * 10_000)


def test_train_batches_never_contain_heldout_strings():
    test = heldout_set(300, min_len=1, max_len=6, seed=5)
    held = set(_strings(test))
    assert len(test) == 300 and is_heldout(test.src - 3, test.src_mask.sum(1)).all()
    gen = torch.Generator().manual_seed(2)
    seen = set()
    for _ in range(20):
        seen.update(_strings(make_batch(256, min_len=1, max_len=6, generator=gen)))
    assert len(seen) > 3000 and not (seen & held)


# --- text-to-text prefix tasks (Chapter 11) ---
def test_text_to_text_answers_are_correct():
    import pytest
    from companion.text_to_text import make_example, make_mixture

    for source, target in make_mixture(300, seed=1):
        prefix, body = source.split(": ", 1)
        if prefix == "add":
            a, b = body.split(" + ")
            assert int(target) == int(a) + int(b)
        else:
            toks = body.split()
            expected = list(reversed(toks)) if prefix == "reverse" else sorted(toks, key=int)
            assert target.split() == expected
    assert make_mixture(30, seed=2) == make_mixture(30, seed=2)
    with pytest.raises(ValueError, match="task"):
        import random
        make_example("copy", random.Random(0))
