"""Fine-tune the Chapter 7 tiny BERT on three corpus-built tasks and record the results.

Writes ``companion/checkpoints/ch07_finetune.json``: for each task (next sentence,
capitalisation, replaced word), the sizes of the train and test splits, the
baselines, and the test accuracy of the pre-trained BERT and of the same
architecture fine-tuned from a random initialisation (same steps, same seed),
each with its wall time. Needs ``ch07_tiny_bert.pt`` (``scripts/ch07_pretrain_bert.py``).

Usage (from the repository root)::

    python scripts/ch07_finetune_bert.py
    python scripts/ch07_finetune_bert.py --steps 50 --out /tmp/ft.json   # a quick try
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from companion.data import load_pydoc_text
from companion.finetuning import (bag_of_words_baseline, capitalisation_task, casing_lookup_baseline, finetune,
                                  majority_baseline, next_sentence_task, rarest_word_baseline, replaced_word_task,
                                  span_position_baseline, split_task)
from companion.models.bert import (BertForQuestionAnswering, BertForSequenceClassification,
                                   BertForTokenClassification)
from companion.pretraining import corpus_documents, load_tiny_bert

STEPS = 400
LR = 3e-4
BATCH_SIZE = 32
SEED = 0
ROOT = Path(__file__).resolve().parents[1]


def build_tasks(tokenizer, documents):
    """``{name: (train, test)}`` for the three tasks, 80/20 random splits."""
    sentences = [s for d in documents for s in d]
    return {
        "next_sentence": split_task(next_sentence_task(documents, tokenizer, seed=SEED), seed=SEED),
        "capitalisation": split_task(capitalisation_task(sentences, tokenizer), seed=SEED),
        "replaced_word": split_task(replaced_word_task(sentences, tokenizer, seed=SEED), seed=SEED),
    }


def new_model(kind: str, cfg):
    return {"sequence": lambda: BertForSequenceClassification(cfg, 2),
            "token": lambda: BertForTokenClassification(cfg, 2),
            "span": lambda: BertForQuestionAnswering(cfg)}[kind]()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "companion/checkpoints/ch07_finetune.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    mlm, tokenizer = load_tiny_bert()
    tasks = build_tasks(tokenizer, corpus_documents(load_pydoc_text()))
    out = {"steps": args.steps, "lr": LR, "batch_size": BATCH_SIZE, "seed": SEED, "threads": args.threads,
           "tasks": {}}
    for name, (train, test) in tasks.items():
        t0 = time.perf_counter()
        if train.kind == "sequence":
            baselines = {"majority": majority_baseline(train, test),
                         "bag_of_words": bag_of_words_baseline(train, test, tokenizer.vocab_size)}
        elif train.kind == "token":
            baselines = {"majority": majority_baseline(train, test), "word_lookup": casing_lookup_baseline(train, test)}
        else:
            baselines = {"most_frequent_span": span_position_baseline(train, test),
                         "rarest_token": rarest_word_baseline(train, test)}
        row = {"kind": train.kind, "train_examples": len(train), "test_examples": len(test),
               "baselines": {k: round(v, 4) for k, v in baselines.items()},
               "baseline_seconds": round(time.perf_counter() - t0, 1)}
        for init in ("pretrained", "scratch"):
            torch.manual_seed(SEED)
            model = new_model(train.kind, mlm.cfg)
            if init == "pretrained":
                missing, unexpected = model.bert.load_state_dict(mlm.bert.state_dict(), strict=False)
                assert not unexpected and all(k.startswith("pooler.") for k in missing), (missing, unexpected)
            result = finetune(model, train, test, steps=args.steps, lr=LR, batch_size=BATCH_SIZE, seed=SEED,
                              progress=True)
            row[init] = {"accuracy": round(result.accuracy, 4), "seconds": round(result.seconds, 1),
                         "first_loss": round(result.train_loss[0], 4),
                         "last_loss": round(sum(result.train_loss[-20:]) / 20, 4)}
            print(f"{name:15s} {init:10s} accuracy {result.accuracy:.3f} in {result.seconds:.0f} s")
        print(f"{name:15s} baselines {row['baselines']}")
        out["tasks"][name] = row
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
