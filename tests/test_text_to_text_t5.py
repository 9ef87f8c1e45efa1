"""The Chapter 11 text-to-text recipe: character vocabulary, batching, held-out sets, the shipped run."""

from __future__ import annotations

import dataclasses
from importlib import resources

import pytest
import torch

from companion.checkpoints import checkpoint_names
from companion.text_to_text import TASKS, make_mixture
from companion.text_to_text_t5 import (CHECKPOINT, PRETRAINING_RECORD, CharVocab, TextToTextRecipe, corpus_characters,
                                       encode_pairs, evaluate_heldout, heldout_pairs, load_pretraining_record,
                                       PRETRAINING_CONTROL_RECORD, training_examples,
                                       load_text_to_text, pretrain_span_corruption, span_corruption_batch,
                                       train_text_to_text, training_inputs)
from companion.training import TrainConfig


def test_vocabulary_round_trip_and_sentinels_at_the_end():
    vocab = CharVocab()
    for x, y in make_mixture(30, seed=3):
        assert vocab.decode(vocab.encode(x)) == x and vocab.decode(vocab.encode(y)) == y
        assert vocab.encode(x)[-1] == vocab.eos_id and vocab.unk_id not in vocab.encode(x)
    assert vocab.sentinel(0) == len(vocab) - 1 and vocab.sentinel(7) == len(vocab) - 8
    assert vocab.decode([vocab.sentinel(1), 3, vocab.eos_id, 5]) == "<extra_id_1>0"
    assert vocab.encode("A", eos=False) == [vocab.unk_id]
    with pytest.raises(ValueError, match="sentinel index"):
        vocab.sentinel(8)
    with pytest.raises(TypeError, match="str"):
        vocab.encode(5)


def test_encode_pairs_pads_right_and_marks_real_tokens():
    vocab = CharVocab()
    pairs = [("add: 1 + 2", "3"), ("sort: 3 1", "1 3")]
    src, mask, tgt = encode_pairs(vocab, pairs)
    assert src.shape == (2, 11) and tgt.shape == (2, 4)
    assert mask.sum(1).tolist() == [11, 10] and src[1, 10] == vocab.pad_id
    assert tgt[0].tolist() == [vocab.encode("3")[0], vocab.eos_id, 0, 0]
    with pytest.raises(ValueError, match="at least one"):
        encode_pairs(vocab, [])


def test_heldout_excludes_training_inputs_and_balances_tasks():
    seen = {x for x, _ in heldout_pairs(50, seed=1)}
    test = heldout_pairs(50, seed=1, exclude=seen)
    assert not seen & {x for x, _ in test}
    assert [x.split(":")[0] for x, _ in test].count("sort") == 50 and len(test) == 150


def test_a_few_steps_run_and_the_record_is_complete():
    recipe = TextToTextRecipe(d_model=16, d_kv=4, n_heads=2, d_ff=32, n_layers=1, batch_size=6, n_heldout=4, n_monitor=3,
                              train=TrainConfig(steps=3, lr=1e-3, eval_every=2))
    out = train_text_to_text(recipe)
    rec = out["record"]
    assert set(rec["exact_match"]) == set(TASKS) and [p["step"] for p in rec["curve"]] == [2, 3]
    assert rec["steps"] == 3 and rec["examples_seen"] == 18 and rec["wall_time_s"] >= 0
    assert rec["n_parameters"] == sum(p.numel() for p in out["model"].parameters())
    assert len(training_inputs(recipe)) == rec["distinct_training_inputs"]  # the replay sees what training saw
    assert all(torch.equal(p.detach().half().float(), p.detach()) for p in out["model"].parameters())  # float16-exact


@pytest.mark.skipif(CHECKPOINT not in checkpoint_names(), reason="scripts/ch11_text_to_text.py has not been run")
def test_shipped_checkpoint_reproduces_its_recorded_exact_match():
    model, vocab, record = load_text_to_text()
    assert dataclasses.asdict(model.cfg) == record["model_config"]
    train = dict(record["train"], betas=tuple(record["train"]["betas"]))
    recipe = TextToTextRecipe(**record["recipe"], train=TrainConfig(**train))
    got = evaluate_heldout(model, vocab, recipe)
    for task in TASKS:  # the same held-out examples and weights; a few argmax ties may flip on another CPU
        assert abs(got[task] - record["exact_match"][task]) <= 0.01, task


def test_corpus_characters_keep_only_the_vocabulary():
    vocab = CharVocab()
    text = corpus_characters(vocab, "The \"assert\" statement:\n\n  x = 1  ")
    assert text == "the assert statement: x 1"
    assert set(corpus_characters(vocab)) <= set(vocab.chars)


def test_span_corruption_batch_hides_spans_behind_sentinels():
    vocab = CharVocab()
    text = "abcdefghij klmnopqrst uvwxyz 0123456789 " * 4
    src, mask, tgt = span_corruption_batch(vocab, text, 5, 20, torch.Generator().manual_seed(0))
    assert src.shape[0] == tgt.shape[0] == 5 and mask.dtype == torch.bool
    for s, t in zip(src, tgt):
        x, y = vocab.decode(s), vocab.decode(t)  # each span: 3 noise characters in 1 span of a 20-character window
        assert x.count("<extra_id_0>") == 1 and y.startswith("<extra_id_0>") and len(y) == len("<extra_id_0>") + 3
        start = x.index("<extra_id_0>")
        assert (x[:start] + y[len("<extra_id_0>"):] + x[start + len("<extra_id_0>"):]) in text  # the span goes back


def test_pretraining_then_multitask_starts_from_the_pretrained_weights():
    recipe = TextToTextRecipe(d_model=16, d_kv=4, n_heads=2, d_ff=32, n_layers=1, batch_size=4, n_heldout=2, n_monitor=2,
                              train=TrainConfig(steps=2, lr=1e-3, eval_every=2))
    text = "the quick brown fox jumps over the lazy dog " * 20
    pre = pretrain_span_corruption(recipe, TrainConfig(steps=3, lr=1e-3, eval_every=3), length=16, text=text)
    fresh = train_text_to_text(dataclasses.replace(recipe, train=TrainConfig(steps=1, lr=1e-12, eval_every=1)))["model"]
    assert pre["record"]["steps"] == 3 and pre["record"]["final_train_loss"] > 0
    assert not torch.equal(pre["model"].tok_emb.weight, fresh.tok_emb.weight)  # pre-training changed the weights
    out = train_text_to_text(recipe, model=pre["model"])
    assert out["model"] is pre["model"] and set(out["record"]["exact_match"]) == set(TASKS)
    with pytest.raises(ValueError, match="config"):
        train_text_to_text(dataclasses.replace(recipe, d_ff=64), model=pre["model"])


@pytest.mark.skipif(not (resources.files("companion.checkpoints") / f"{PRETRAINING_RECORD}.json").is_file(),
                    reason="scripts/ch11_pretraining.py has not been run")
def test_pretraining_record_holds_both_runs_of_every_seed():
    record = load_pretraining_record()
    seeds = record["protocol"]["seeds_completed"]  # the planned seeds whose two runs are recorded
    assert set(seeds) <= set(record["protocol"]["seeds"]) and len(seeds) >= 2
    assert sorted((r["seed"], r["pretrained"]) for r in record["runs"]) == sorted((s, p) for s in seeds for p in (False, True))
    for run in record["runs"]:
        assert set(run["exact_match"]) == set(TASKS) and (run["pretrain"] is not None) == run["pretrained"]
        assert abs(run["mean_exact_match"] - sum(run["exact_match"].values()) / len(TASKS)) < 1e-12


@pytest.mark.skipif(not (resources.files("companion.checkpoints") / f"{PRETRAINING_CONTROL_RECORD}.json").is_file(),
                    reason="scripts/ch11_pretraining.py --control tasks has not been run")
def test_pretraining_control_pairs_with_the_main_record():
    """The control repeats the pre-trained arm of the main record's seeds, with the same protocol but its text."""
    record, control = load_pretraining_record(), load_pretraining_record(control=True)
    assert control["protocol"]["control"] == "tasks" and record["protocol"].get("control") is None
    same = {k for k in record["protocol"] if k not in ("seeds", "seeds_completed", "control")}
    assert {k: control["protocol"][k] for k in same} == {k: record["protocol"][k] for k in same}
    seeds = control["protocol"]["seeds_completed"]
    assert len(seeds) >= 3 and set(seeds) <= set(record["protocol"]["seeds_completed"])
    assert sorted(r["seed"] for r in control["runs"]) == sorted(seeds) and all(r["pretrained"] for r in control["runs"])
    for run in control["runs"]:
        assert set(run["exact_match"]) == set(TASKS) and run["pretrain"]["steps"] == record["protocol"]["pretrain_steps"]


def test_the_control_text_is_the_training_stream():
    """--control tasks pre-trains on the first examples of the multi-task training stream: no held-out answer."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "ch11_pretraining.py"
    spec = importlib.util.spec_from_file_location("ch11_pretraining", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    recipe = dataclasses.replace(TextToTextRecipe(), seed=4)
    recipe = dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, steps=5, warmup_steps=0))  # 320 examples
    first = training_examples(4, 300)
    assert script.task_text(4, n=300) == " ".join(f"{x} {y}" for x, y in first)
    assert {x for x, _ in first} <= training_inputs(recipe)
    assert not {x for x, _ in first} & {x for x, _ in heldout_pairs(50, 4, exclude=training_inputs(recipe))}
