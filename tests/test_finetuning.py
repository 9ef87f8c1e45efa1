"""Fine-tuning tasks, scoring and baselines (companion.finetuning)."""

from __future__ import annotations

import pytest
import torch

from companion.finetuning import (TaskData, accuracy, bag_of_words_baseline, capitalisation_task,
                                  casing_lookup_baseline, encode_words, finetune, majority_baseline,
                                  next_sentence_task, predict, rarest_word_baseline, replaced_word_task,
                                  span_position_baseline, split_task)
from companion.mlm import IGNORE_INDEX
from companion.models.bert import BertConfig, BertForQuestionAnswering
from companion.tokenizers.wordpiece import WordPiece

WORDS = ("the cat sat on a mat python is fun none true class def return ##s dog ran . , ? "
         "alpha beta gamma delta one two three four five").split()


def tok():
    return WordPiece(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS)


def test_capitalisation_labels_sit_on_the_first_piece_of_each_word():
    t = tok()
    data = capitalisation_task(["The cats sat on Python.", "a dog ran"], t)
    ids = data.input_ids[0].tolist()
    pieces = [t.id_to_token[i] for i in ids]
    assert pieces[:9] == ["[CLS]", "the", "cat", "##s", "sat", "on", "python", ".", "[SEP]"]
    assert data.labels[0, :9].tolist() == [IGNORE_INDEX, 1, 0, IGNORE_INDEX, 0, 0, 1, IGNORE_INDEX, IGNORE_INDEX]
    # "Python." is one word: its label is on "python", the "." piece carries none
    assert data.attention_mask[1].tolist() == [1] * 5 + [0] * 4  # [CLS] a dog ran [SEP], then padding
    assert (data.labels[1, 5:] == IGNORE_INDEX).all()


def test_replaced_word_span_covers_exactly_the_intruder():
    t = tok()
    sentences = ["the cat sat on a mat", "python is fun one two three", "alpha beta gamma delta five",
                 "the dog ran on a mat"] * 5
    data = replaced_word_task(sentences, t, seed=3)
    assert data.kind == "span" and len(data) > 0
    for ids, (s, e), att in zip(data.input_ids.tolist(), data.labels.tolist(), data.attention_mask.tolist()):
        n = sum(att)
        assert 1 <= s <= e < n - 1  # inside the sentence, never [CLS] or [SEP]
        words = t.decode(ids[1:n - 1]).split()
        originals = [x.split() for x in sentences if len(x.split()) == len(words)]
        diffs = [[i for i, (a, b) in enumerate(zip(o, words)) if a != b] for o in originals]
        assert any(len(d) == 1 for d in diffs)  # exactly one word differs from some original
        answer = t.decode(ids[s:e + 1])
        assert any(len(d) == 1 and words[d[0]] == answer for d in diffs)


def test_next_sentence_labels_follow_the_documents():
    t = tok()
    docs = [["the cat sat", "on a mat", "the dog ran"], ["one two", "three four", "five"]]
    data = next_sentence_task(docs, t, seed=0)
    assert data.kind == "sequence"
    sep = t.vocab["[SEP]"]
    for ids, seg, lab in zip(data.input_ids.tolist(), data.segment_ids.tolist(), data.labels.tolist()):
        first = ids.index(sep)
        a = t.decode(ids[1:first])
        b = t.decode(ids[first + 1: ids.index(sep, first + 1)])
        follows = any(d[i] == a and d[i + 1] == b for d in docs for i in range(len(d) - 1))
        assert lab == int(follows)
        assert seg[first] == 0 and seg[first + 1] == 1


def test_encode_words_maps_pieces_to_words():
    ids, word_of = encode_words(tok(), ["cats", "ran"])
    assert word_of == [0, 0, 1] and len(ids) == 3


def _data(kind, labels, ids=None):
    n = labels.shape[0]
    ids = torch.ones(n, 4, dtype=torch.long) if ids is None else ids
    return TaskData(ids, torch.ones_like(ids), torch.zeros_like(ids), labels, kind)


def test_accuracy_per_kind_by_hand():
    span = _data("span", torch.tensor([[1, 2], [2, 2], [1, 3]]))
    assert accuracy(torch.tensor([[1, 2], [2, 3], [1, 3]]), span) == pytest.approx(2 / 3)  # exact match only
    token = _data("token", torch.tensor([[IGNORE_INDEX, 1, 0, IGNORE_INDEX]]))
    assert accuracy(torch.tensor([[0, 1, 1, 0]]), token) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="shape"):
        accuracy(torch.tensor([1, 2]), span)


def test_baselines_by_hand():
    train = _data("sequence", torch.tensor([1, 1, 0]))
    test = _data("sequence", torch.tensor([1, 0, 0, 0]))
    assert majority_baseline(train, test) == pytest.approx(0.25)
    spans_train = _data("span", torch.tensor([[1, 1], [1, 1], [2, 3]]))
    spans_test = _data("span", torch.tensor([[1, 1], [2, 3]]))
    assert span_position_baseline(spans_train, spans_test) == pytest.approx(0.5)
    ids = torch.tensor([[2, 5, 5, 3], [2, 6, 7, 3]])
    toks = TaskData(ids, torch.ones_like(ids), torch.zeros_like(ids),
                    torch.tensor([[IGNORE_INDEX, 1, 0, IGNORE_INDEX], [IGNORE_INDEX, 0, 0, IGNORE_INDEX]]), "token")
    # token 5 was 1 once and 0 once: a tie goes to the label seen first; 6 and 7 -> 0
    assert casing_lookup_baseline(toks, toks) == pytest.approx(3 / 4)
    rare_train = TaskData(torch.tensor([[2, 5, 5, 5, 3]]), torch.ones(1, 5, dtype=torch.long),
                          torch.zeros(1, 5, dtype=torch.long), torch.tensor([[1, 1]]), "span")
    rare_test = TaskData(torch.tensor([[2, 5, 9, 5, 3], [2, 9, 5, 5, 3]]), torch.ones(2, 5, dtype=torch.long),
                         torch.zeros(2, 5, dtype=torch.long), torch.tensor([[2, 2], [2, 2]]), "span")
    assert rarest_word_baseline(rare_train, rare_test) == pytest.approx(0.5)  # 9 is unseen: picked in both


def test_bag_of_words_learns_a_lexical_rule_and_cannot_see_order():
    g = torch.Generator().manual_seed(0)
    n, t = 200, 6
    ids = torch.randint(5, 30, (n, t), generator=g)
    seg = (torch.arange(t) >= 3).long().expand(n, t).clone()
    labels = (ids[:, :3] == 7).any(1).long()  # a lexical rule: token 7 in segment A
    data = TaskData(ids, torch.ones_like(ids), seg, labels, "sequence")
    assert bag_of_words_baseline(data, data, 30) > 0.95
    order = TaskData(ids, torch.ones_like(ids), seg, (ids[:, 0] < ids[:, 1]).long(), "sequence")
    swapped = order.subset(slice(None))
    swapped.input_ids = ids[:, [1, 0, 2, 3, 4, 5]]  # the same bags with the opposite label
    swapped.labels = 1 - order.labels
    both = TaskData(torch.cat([order.input_ids, swapped.input_ids]), torch.ones(2 * n, t, dtype=torch.long),
                    torch.cat([seg, seg]), torch.cat([order.labels, swapped.labels]), "sequence")
    assert bag_of_words_baseline(both, both, 30) <= 0.6  # every bag appears with both labels


def test_span_prediction_never_ends_before_it_starts_and_finetune_learns_a_position():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=40, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_positions=16, dropout=0.0)
    model = BertForQuestionAnswering(cfg)
    ids = torch.randint(5, 40, (64, 8))
    ids[:, 0], ids[:, -1] = 2, 3
    marker = torch.randint(1, 6, (64,))
    ids[torch.arange(64), marker] = 4  # the answer is the position of token 4
    data = TaskData(ids, torch.ones_like(ids), torch.zeros_like(ids), torch.stack([marker, marker], 1), "span")
    pred = predict(model, data)
    assert (pred[:, 1] >= pred[:, 0]).all()
    result = finetune(model, data, data, steps=150, lr=3e-3, batch_size=32)
    assert result.accuracy > 0.9 and result.train_loss[-1] < result.train_loss[0]


def test_split_and_bad_inputs():
    data = _data("sequence", torch.arange(10))
    train, test = split_task(data, 0.2)
    assert len(train) == 8 and len(test) == 2
    assert sorted(torch.cat([train.labels, test.labels]).tolist()) == list(range(10))
    with pytest.raises(ValueError, match="test_fraction"):
        split_task(data, 1.0)
    with pytest.raises(TypeError, match="list of str"):
        capitalisation_task("not a list", tok())
    with pytest.raises(ValueError, match="steps"):
        finetune(torch.nn.Identity(), data, data, steps=0)


def test_recorded_finetuning_results_are_complete_and_sane():
    import json
    from importlib import resources

    rec = json.loads((resources.files("companion.checkpoints") / "ch07_finetune.json").read_text())
    assert set(rec["tasks"]) == {"next_sentence", "capitalisation", "replaced_word"}
    assert len(rec["seeds"]) >= 3 and len(set(rec["seeds"])) == len(rec["seeds"])  # a spread, not one draw
    for name, row in rec["tasks"].items():
        assert row["train_examples"] > 4 * row["test_examples"] * 0.9 and row["test_examples"] >= 100
        for init in ("pretrained", "scratch"):
            r = row[init]
            assert [s["seed"] for s in r["per_seed"]] == rec["seeds"], (name, init)
            accs = [s["accuracy"] for s in r["per_seed"]]
            assert r["min"] == min(accs) and r["max"] == max(accs), (name, init)
            assert abs(r["accuracy"] - sum(accs) / len(accs)) < 1e-4, (name, init)
            assert 0.0 <= r["min"] <= r["accuracy"] <= r["max"] <= 1.0 and r["seconds"] > 0
            for s in r["per_seed"]:
                assert s["last_loss"] < s["first_loss"], (name, init, s["seed"])
        assert all(0.0 <= v <= 1.0 for v in row["baselines"].values())
        for k, b in row["baseline_spread"].items():
            assert len(b["per_seed"]) == len(rec["seeds"]) and b["min"] <= row["baselines"][k] <= b["max"]
    # what the chapter's prose claims about the recorded runs, seed by seed (min and max)
    t = rec["tasks"]
    rw, cap, nsp = t["replaced_word"], t["capitalisation"], t["next_sentence"]
    assert rw["pretrained"]["min"] > rw["scratch"]["max"] + 0.05  # "outside the spread"
    assert rw["pretrained"]["min"] > max(rw["baselines"].values()) + 0.05
    assert rw["scratch"]["max"] < max(rw["baselines"].values()) + 0.02  # "no better than the guesses"
    assert cap["pretrained"]["min"] > cap["scratch"]["max"]  # "ahead on every seed"
    assert cap["pretrained"]["accuracy"] - cap["scratch"]["accuracy"] < 0.01  # "by less than a point"
    assert min(cap["pretrained"]["min"], cap["scratch"]["min"]) > max(cap["baselines"].values())
    bow = nsp["baseline_spread"]["bag_of_words"]
    assert bow["min"] == bow["max"]  # "the same on every seed"
    assert nsp["baselines"]["bag_of_words"] > nsp["baselines"]["majority"] + 0.1  # "shared words give much away"
    assert bow["max"] < nsp["pretrained"]["min"] and nsp["pretrained"]["max"] - bow["min"] < 0.1  # "a few points"
    assert nsp["pretrained"]["min"] > nsp["scratch"]["max"]


def test_finetune_script_merges_records_of_disjoint_seeds(tmp_path):
    """scripts/ch07_finetune_bert.py --merge: the one-seed record of the older schema and a
    per-seed record join into one record whose spread covers every seed."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "ch07_finetune_bert.py"
    spec = importlib.util.spec_from_file_location("ch07_finetune_bert", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    def run(seed, acc):
        return {"accuracy": acc, "seconds": 1.0, "first_loss": 1.0, "last_loss": 0.5, **({"seed": seed} if seed is not None else {})}

    old = {"steps": 4, "lr": 0.1, "batch_size": 2, "seed": 0, "threads": 2, "tasks": {"t": {
        "kind": "sequence", "train_examples": 8, "test_examples": 2, "baselines": {"majority": 0.5},
        "pretrained": run(None, 0.9), "scratch": run(None, 0.6)}}}
    new = script.summarise({"steps": 4, "lr": 0.1, "batch_size": 2, "seeds": [1, 2], "threads": 1}, {"t": {
        "kind": "sequence", "train_examples": 8, "test_examples": 2, "baselines": {"majority": [0.5, 0.5]},
        "pretrained": [run(1, 0.7), run(2, 0.8)], "scratch": [run(1, 0.6), run(2, 0.7)]}})
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    rec = script.merge([tmp_path / "old.json", tmp_path / "new.json"])
    row = rec["tasks"]["t"]
    assert rec["seeds"] == [0, 1, 2] and [r["seed"] for r in row["pretrained"]["per_seed"]] == [0, 1, 2]
    assert (row["pretrained"]["min"], row["pretrained"]["max"]) == (0.7, 0.9)
    assert abs(row["pretrained"]["accuracy"] - 0.8) < 1e-9
    assert row["baseline_spread"]["majority"]["per_seed"] == [0.5, 0.5, 0.5]
    with pytest.raises(ValueError, match="seed recorded twice"):
        script.merge([tmp_path / "new.json", tmp_path / "new.json"])
    (tmp_path / "other.json").write_text(json.dumps({**old, "steps": 5}))
    with pytest.raises(ValueError, match="same recipe"):
        script.merge([tmp_path / "old.json", tmp_path / "other.json"])
