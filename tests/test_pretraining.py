"""MLM pre-training data and the shipped tiny BERT (companion.pretraining)."""

from __future__ import annotations

import json
from importlib import resources

import pytest
import torch

from companion.mlm import IGNORE_INDEX
from companion.pretraining import (MLMBlocks, build_mlm_blocks, corpus_documents, evaluate_mlm, mask_held_out,
                                   mlm_baselines, split_blocks, split_sentences)
from companion.tokenizers.wordpiece import WordPiece

TEXT = """First topic
***********

Alpha beta gamma.  Delta
epsilon? Zeta eta.

   code_line = 1
   -------------

Second topic
************

Theta iota kappa.
"""


def tiny_tokenizer():
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa code _ line = 1 . ? first second topic".split()
    return WordPiece(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words)


def test_documents_and_sentences_by_hand():
    docs = corpus_documents(TEXT)
    assert docs == [["First topic", "Alpha beta gamma.", "Delta epsilon?", "Zeta eta.", "code_line = 1"],
                    ["Second topic", "Theta iota kappa."]]
    assert split_sentences("One two. Three\nfour.\n\n*****\n") == ["One two.", "Three four."]
    with pytest.raises(ValueError, match="non-empty"):
        corpus_documents("   ")


def test_blocks_hold_every_sentence_in_order_between_cls_and_sep():
    tok = tiny_tokenizer()
    docs = corpus_documents(TEXT)
    blocks = build_mlm_blocks(docs, tok, seq_len=8)
    cls_id, sep_id, pad_id = (tok.vocab[t] for t in ("[CLS]", "[SEP]", "[PAD]"))
    content = []
    for ids, att in zip(blocks.input_ids.tolist(), blocks.attention_mask.tolist()):
        n = sum(att)
        assert att == [1] * n + [0] * (8 - n) and ids[n:] == [pad_id] * (8 - n)
        assert ids[0] == cls_id and ids[n - 1] == sep_id
        content += ids[1:n - 1]
    expected = []
    for di, doc in enumerate(docs):
        for si, sentence in enumerate(doc):
            if di and not si:
                expected.append(sep_id)  # a document boundary inside a block ...
            expected += [tok.token_to_id(t) for t in tok.tokenize(sentence)]
    # ... unless the boundary falls between two blocks: drop those [SEP]s from the comparison
    assert [t for t in content if t != sep_id] == [t for t in expected if t != sep_id]
    assert blocks.n_tokens == int(blocks.attention_mask.sum())


def test_split_blocks_holds_out_every_tenth():
    ids = torch.arange(25).unsqueeze(1).repeat(1, 3)
    train, held = split_blocks(MLMBlocks(ids, torch.ones_like(ids)))
    assert held.input_ids[:, 0].tolist() == [9, 19] and len(train) == 23
    with pytest.raises(ValueError, match="too few"):
        split_blocks(MLMBlocks(ids[:5], torch.ones_like(ids[:5])))


class _Echo(torch.nn.Module):
    """Logits with `margin` on each input id and 0 elsewhere: predicts its input, so loss and accuracy are known."""

    def __init__(self, vocab, margin):
        super().__init__()
        self.vocab, self.margin = vocab, margin

    def forward(self, ids, attention_mask):
        return torch.nn.functional.one_hot(ids, self.vocab).float() * self.margin


def test_evaluate_mlm_against_a_hand_computed_loss():
    labels = torch.tensor([[IGNORE_INDEX, 3, 1, IGNORE_INDEX], [2, IGNORE_INDEX, IGNORE_INDEX, 0]])
    answer = torch.tensor([[0, 3, 2, 0], [2, 0, 0, 0]])  # right at 3 of the 4 selected positions
    model = _Echo(vocab=5, margin=2.0)
    loss, acc = evaluate_mlm(model, answer, torch.ones_like(answer), labels, batch_size=1)
    right = -torch.log(torch.exp(torch.tensor(2.0)) / (torch.exp(torch.tensor(2.0)) + 4))
    wrong = -torch.log(1 / (torch.exp(torch.tensor(2.0)) + 4))
    assert acc == pytest.approx(0.75)
    assert loss == pytest.approx(float(3 * right + wrong) / 4, rel=1e-6)


def test_baselines_by_hand():
    ids = torch.tensor([[2, 7, 7, 8, 3], [2, 7, 9, 3, 0]])
    train = MLMBlocks(ids, (ids != 0).long())
    labels = torch.tensor([[IGNORE_INDEX, 7, 8, IGNORE_INDEX, IGNORE_INDEX]])
    out = mlm_baselines(train, labels, special_ids=[0, 1, 2, 3, 4], vocab_size=12)
    assert out["most_frequent_accuracy"] == pytest.approx(0.5)  # 7 is the most frequent; right once of twice
    # add-one unigram over 12 ids; non-special counts 7: 3, 8: 1, 9: 1 -> p(7) = 4/17, p(8) = 2/17
    expected = -(torch.log(torch.tensor(4 / 17)) + torch.log(torch.tensor(2 / 17))) / 2
    assert out["unigram_loss"] == pytest.approx(float(expected), rel=1e-6)


# --- the shipped checkpoint ---------------------------------------------------------------------------

def _summary():
    ref = resources.files("companion.checkpoints") / "ch07_tiny_bert.json"
    return json.loads(ref.read_text())


def test_shipped_tiny_bert_reproduces_its_recorded_held_out_accuracy():
    from companion.data import load_pydoc_text
    from companion.pretraining import load_tiny_bert

    summary = _summary()
    model, tok = load_tiny_bert()
    assert model.cfg.vocab_size == tok.vocab_size == summary["config"]["vocab_size"]
    blocks = build_mlm_blocks(corpus_documents(load_pydoc_text()), tok, summary["seq_len"])
    train, held = split_blocks(blocks)
    assert (len(train), len(held)) == (summary["train_blocks"], summary["held_out_blocks"])
    masked = mask_held_out(held, mask_id=tok.vocab["[MASK]"], special_ids=tok.special_ids,
                           vocab_size=tok.vocab_size)
    assert int((masked[2] != IGNORE_INDEX).sum()) == summary["held_out_masked"]
    loss, acc = evaluate_mlm(model, *masked)
    # float16 storage of the weights moves the last digits only
    assert acc == pytest.approx(summary["final"]["held_out_accuracy"], abs=0.01)
    assert loss == pytest.approx(summary["final"]["held_out_loss"], abs=0.02)
    assert acc > summary["baselines"]["most_frequent_accuracy"] + 0.08
    assert loss < summary["baselines"]["unigram_loss"] - 0.5


def test_recorded_curve_is_complete_and_improves():
    s = _summary()
    c = s["curve"]
    assert len(c["eval_steps"]) == len(c["eval_loss"]) == len(c["eval_accuracy"])
    assert c["eval_steps"][-1] == s["train"]["steps"] == len(c["train_loss"])
    assert c["eval_loss"][-1] < c["eval_loss"][0] and c["eval_accuracy"][-1] > c["eval_accuracy"][0]
    assert set(s["config"]) >= {"vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_positions", "norm_eps"}
    assert s["seconds"] > 0 and s["threads"] >= 1
