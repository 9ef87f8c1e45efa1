"""Fine-tune the Chapter 7 tiny BERT on three corpus-built tasks and record the results.

Writes ``companion/checkpoints/ch07_finetune.json``: for each task (next sentence,
capitalisation, replaced word), the sizes of the train and test splits, the
baselines, and the test accuracy of the pre-trained BERT and of the same
architecture fine-tuned from a random initialisation (same steps), each with its
wall time. Needs ``ch07_tiny_bert.pt`` (``scripts/ch07_pretrain_bert.py``).

The tasks and their train/test splits are built once (seed ``DATA_SEED``). Each
fine-tuning seed (``--seeds``) sets the initialisation of the new head (and, for
the from-scratch runs, of the whole encoder) and the order of the training
batches; the pre-trained encoder is always the shipped checkpoint, one
pre-training run. Per task and initialisation the record keeps every seed's
result and the mean, min and max of the accuracy (``accuracy`` is the mean);
the seed-dependent bag-of-words baseline is run once per seed too.

Runs of different seeds made apart (one seed per machine) are merged with
``--merge`` into one record; a record of the older one-seed schema merges too.

Usage (from the repository root)::

    python scripts/ch07_finetune_bert.py --seeds 0 1 2 --threads 1
    python scripts/ch07_finetune_bert.py --merge a.json b.json --out companion/checkpoints/ch07_finetune.json
    python scripts/ch07_finetune_bert.py --steps 50 --seeds 0 --out /tmp/ft.json   # a quick try
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from companion.experiments import seed_spread  # noqa: E402
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
DATA_SEED = 0  # builds the tasks and their splits, whatever the fine-tuning seeds
SEEDS = (0, 1, 2)
ROOT = Path(__file__).resolve().parents[1]


def build_tasks(tokenizer, documents):
    """``{name: (train, test)}`` for the three tasks, 80/20 random splits."""
    sentences = [s for d in documents for s in d]
    return {
        "next_sentence": split_task(next_sentence_task(documents, tokenizer, seed=DATA_SEED), seed=DATA_SEED),
        "capitalisation": split_task(capitalisation_task(sentences, tokenizer), seed=DATA_SEED),
        "replaced_word": split_task(replaced_word_task(sentences, tokenizer, seed=DATA_SEED), seed=DATA_SEED),
    }


def new_model(kind: str, cfg):
    return {"sequence": lambda: BertForSequenceClassification(cfg, 2),
            "token": lambda: BertForTokenClassification(cfg, 2),
            "span": lambda: BertForQuestionAnswering(cfg)}[kind]()


spread = seed_spread


def runs_of(record: dict) -> dict:
    """``{task: {"kind", "train_examples", "test_examples", "pretrained": [run], "scratch": [run],
    "baselines": {name: [value per seed]}}}`` from a record, this schema or the older one-seed schema."""
    seeds = record["seeds"] if "seeds" in record else [record["seed"]]
    out = {}
    for name, row in record["tasks"].items():
        entry = {k: row[k] for k in ("kind", "train_examples", "test_examples")}
        for init in ("pretrained", "scratch"):
            entry[init] = row[init].get("per_seed") or [
                {"seed": seeds[0], **{k: row[init][k] for k in ("accuracy", "seconds", "first_loss", "last_loss")}}]
        if "baseline_spread" in row:
            entry["baselines"] = {k: list(v["per_seed"]) for k, v in row["baseline_spread"].items()}
        else:
            entry["baselines"] = {k: [v] for k, v in row["baselines"].items()}
        out[name] = entry
    return out


def summarise(meta: dict, runs: dict) -> dict:
    """The record: ``meta`` plus, per task, every seed's runs and the mean, min and max of the accuracy."""
    out = {**meta, "tasks": {}}
    for name, entry in runs.items():
        row = {k: entry[k] for k in ("kind", "train_examples", "test_examples")}
        row["baselines"] = {k: spread(v)["mean"] for k, v in entry["baselines"].items()}
        row["baseline_spread"] = {k: {**spread(v), "per_seed": [round(x, 4) for x in v]}
                                  for k, v in entry["baselines"].items()}
        for init in ("pretrained", "scratch"):
            per_seed = sorted(entry[init], key=lambda r: r["seed"])
            acc = spread([r["accuracy"] for r in per_seed])
            row[init] = {"accuracy": acc["mean"], "min": acc["min"], "max": acc["max"],
                         "seconds": round(sum(r["seconds"] for r in per_seed) / len(per_seed), 1),
                         "first_loss": round(sum(r["first_loss"] for r in per_seed) / len(per_seed), 4),
                         "last_loss": round(sum(r["last_loss"] for r in per_seed) / len(per_seed), 4),
                         "per_seed": per_seed}
        out["tasks"][name] = row
    return out


def merge(paths: list[Path]) -> dict:
    """One record from records of disjoint seeds (runs made apart, e.g. one seed per machine)."""
    records = [json.loads(p.read_text()) for p in paths]
    same = ("steps", "lr", "batch_size")
    if any(tuple(r[k] for k in same) != tuple(records[0][k] for k in same) for r in records):
        raise ValueError(f"records differ in {same}; only runs of the same recipe can be merged")
    runs = runs_of(records[0])
    for rec in records[1:]:
        for name, entry in runs_of(rec).items():
            for init in ("pretrained", "scratch"):
                if {r["seed"] for r in entry[init]} & {r["seed"] for r in runs[name][init]}:
                    raise ValueError(f"seed recorded twice for {name}/{init}")
                runs[name][init] += entry[init]
            for k, v in entry["baselines"].items():
                runs[name]["baselines"][k] += v
    seeds = sorted({r["seed"] for e in runs.values() for r in e["pretrained"]})
    meta = {k: records[0][k] for k in same}
    meta.update(seed=DATA_SEED, data_seed=DATA_SEED, seeds=seeds,
                threads=sorted({r.get("threads", 2) for r in records}),
                pretrained_checkpoint=PRETRAINED, merged_from=len(records))
    return summarise(meta, runs)


PRETRAINED = "ch07_tiny_bert.pt (the shipped one, the same for every seed)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--merge", type=Path, nargs="+", help="merge these records (disjoint seeds) into --out")
    parser.add_argument("--out", type=Path, default=ROOT / "companion/checkpoints/ch07_finetune.json")
    args = parser.parse_args()
    if args.merge:
        args.out.write_text(json.dumps(merge(args.merge), indent=1) + "\n")
        return
    torch.set_num_threads(args.threads)
    mlm, tokenizer = load_tiny_bert()
    tasks = build_tasks(tokenizer, corpus_documents(load_pydoc_text()))
    meta = {"steps": args.steps, "lr": LR, "batch_size": BATCH_SIZE, "seed": DATA_SEED, "data_seed": DATA_SEED,
            "seeds": args.seeds, "threads": args.threads, "pretrained_checkpoint": PRETRAINED}
    runs = {name: {"kind": train.kind, "train_examples": len(train), "test_examples": len(test),
                   "pretrained": [], "scratch": [], "baselines": {}} for name, (train, test) in tasks.items()}
    for seed in args.seeds:
        for name, (train, test) in tasks.items():
            if train.kind == "sequence":
                baselines = {"majority": majority_baseline(train, test),
                             "bag_of_words": bag_of_words_baseline(train, test, tokenizer.vocab_size, seed=seed)}
            elif train.kind == "token":
                baselines = {"majority": majority_baseline(train, test),
                             "word_lookup": casing_lookup_baseline(train, test)}
            else:
                baselines = {"most_frequent_span": span_position_baseline(train, test),
                             "rarest_token": rarest_word_baseline(train, test)}
            for k, v in baselines.items():
                runs[name]["baselines"].setdefault(k, []).append(v)
            for init in ("pretrained", "scratch"):
                torch.manual_seed(seed)
                model = new_model(train.kind, mlm.cfg)
                if init == "pretrained":
                    missing, unexpected = model.bert.load_state_dict(mlm.bert.state_dict(), strict=False)
                    assert not unexpected and all(k.startswith("pooler.") for k in missing), (missing, unexpected)
                result = finetune(model, train, test, steps=args.steps, lr=LR, batch_size=BATCH_SIZE, seed=seed,
                                  progress=False)
                runs[name][init].append({"seed": seed, "accuracy": round(result.accuracy, 4),
                                         "seconds": round(result.seconds, 1),
                                         "first_loss": round(result.train_loss[0], 4),
                                         "last_loss": round(sum(result.train_loss[-20:]) / 20, 4)})
                print(f"seed {seed} {name:15s} {init:10s} accuracy {result.accuracy:.3f} in {result.seconds:.0f} s",
                      flush=True)
            print(f"seed {seed} {name:15s} baselines {baselines}", flush=True)
            done = {n: e for n, e in runs.items() if e["pretrained"]}
            args.out.write_text(json.dumps(summarise(meta, done), indent=1) + "\n")  # a partial record survives

if __name__ == "__main__":
    main()
