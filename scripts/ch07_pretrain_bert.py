"""Pre-train the tiny BERT of Chapter 7 with masked language modelling and ship it as a checkpoint.

Writes ``companion/checkpoints/ch07_tiny_bert.pt`` (config, float16 weights, the
WordPiece vocabulary, seeds) and ``companion/checkpoints/ch07_tiny_bert.json``
(the learning curve, held-out masked-token loss and accuracy, context-free
baselines, wall time and thread count). The chapter loads them with
``companion.pretraining.load_tiny_bert()``.

Recipe: a 4,000-token WordPiece vocabulary trained on the course corpus; whole
sentences packed into 128-token blocks; every 10th block held out; a fresh
15% / 80-10-10 mask for every batch (dynamic masking); no next-sentence task.

Usage (from the repository root)::

    python scripts/ch07_pretrain_bert.py                 # the shipped run
    python scripts/ch07_pretrain_bert.py --steps 50 --out /tmp/x   # a quick try
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from companion.data import load_pydoc_text
from companion.models.bert import BertConfig, BertForMaskedLM
from companion.calculators import count_parameters
from companion.pretraining import (build_mlm_blocks, corpus_documents, evaluate_mlm, mask_held_out,
                                   mlm_baselines, pretrain_mlm, split_blocks)
from companion.tokenizers.wordpiece import train_wordpiece
from companion.training import TrainConfig

VOCAB_SIZE = 4000
SEQ_LEN = 128
MODEL = dict(d_model=128, n_layers=4, n_heads=4, d_ff=512, max_positions=SEQ_LEN, dropout=0.1)
BATCH_SIZE = 32
TRAIN = TrainConfig(steps=1500, lr=2e-3, warmup_steps=100, min_lr_ratio=0.1, weight_decay=0.01, eval_every=100)
SEED = 0
ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=TRAIN.steps)
    parser.add_argument("--lr", type=float, default=TRAIN.lr)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "companion/checkpoints/ch07_tiny_bert",
                        help="path without suffix: writes OUT.pt and OUT.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    start = time.perf_counter()

    text = load_pydoc_text()
    tokenizer = train_wordpiece(text, VOCAB_SIZE)
    blocks = build_mlm_blocks(corpus_documents(text), tokenizer, SEQ_LEN)
    train_blocks, held_blocks = split_blocks(blocks)
    mask_id, special = tokenizer.vocab[tokenizer.mask_token], tokenizer.special_ids
    held_out = mask_held_out(held_blocks, mask_id=mask_id, special_ids=special, vocab_size=tokenizer.vocab_size)

    cfg = BertConfig(vocab_size=tokenizer.vocab_size, pad_id=tokenizer.vocab[tokenizer.pad_token], **MODEL)
    model = BertForMaskedLM(cfg)
    tcfg = dataclasses.replace(TRAIN, steps=args.steps, lr=args.lr, warmup_steps=min(TRAIN.warmup_steps, args.steps))
    record = pretrain_mlm(model, train_blocks, held_out, tcfg, batch_size=BATCH_SIZE, mask_id=mask_id,
                          special_ids=special, vocab_size=tokenizer.vocab_size, seed=SEED)
    seconds = time.perf_counter() - start
    loss, acc = evaluate_mlm(model, *held_out)
    hist = record.history

    args.out.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.to(torch.float16) if v.is_floating_point() else v for k, v in model.state_dict().items()}
    torch.save({"config": dataclasses.asdict(cfg), "state_dict": state,
                "vocab": [tokenizer.id_to_token[i] for i in range(tokenizer.vocab_size)],
                "seq_len": SEQ_LEN}, args.out.with_suffix(".pt"))
    summary = {
        "config": dataclasses.asdict(cfg), "parameters": count_parameters(model), "seq_len": SEQ_LEN,
        "batch_size": BATCH_SIZE, "train": dataclasses.asdict(tcfg), "seed": SEED, "threads": args.threads,
        "train_blocks": len(train_blocks), "held_out_blocks": len(held_blocks),
        "train_tokens": train_blocks.n_tokens, "held_out_tokens": held_blocks.n_tokens,
        "held_out_masked": int((held_out[2] != -100).sum()),
        "curve": {"eval_steps": hist.eval_steps, "eval_loss": [round(x, 4) for x in hist.eval_loss],
                  "eval_accuracy": [round(x, 4) for x in record.eval_accuracy],
                  "train_loss": [round(x, 4) for x in hist.train_loss]},
        "final": {"held_out_loss": round(loss, 4), "held_out_accuracy": round(acc, 4)},
        "baselines": {k: round(v, 4) for k, v in mlm_baselines(train_blocks, held_out[2], special, tokenizer.vocab_size).items()},
        "seconds": round(seconds, 1),
    }
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"held-out masked loss {loss:.3f}, accuracy {acc:.3f} in {seconds:.0f} s; baselines {summary['baselines']}")


if __name__ == "__main__":
    main()
