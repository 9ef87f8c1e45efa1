"""A tiny ELECTRA against a tiny BERT with the same pre-training compute, compared after fine-tuning.

ELECTRA's claim (Clark et al., 2020, section 3.2 and figure 1): at equal pre-training
compute, replaced-token detection gives a better encoder than masked language
modelling, because the discriminator learns from every token, not from the 15%
that are masked. Measured here at toy scale: the same encoder (Chapter 7's tiny
BERT sizes) pre-trained with the same number of floating-point operations
(counted by ``torch.utils.flop_counter`` on one training step of each) either as
a BERT (MLM, ``BERT_STEPS`` steps) or as an ELECTRA discriminator (with a
generator half its width sharing its embeddings, as many steps as the same
FLOPs buy), then fine-tuned on two of Chapter 7's tasks with the same recipe.
Counting FLOPs instead of seconds keeps the comparison independent of the
machine and of whatever else runs on it.

Writes ``companion/checkpoints/ch08_electra_vs_bert.json``.

Usage (from the repository root)::

    python scripts/ch08_electra_vs_bert.py
    python scripts/ch08_electra_vs_bert.py --bert-steps 10 --finetune-steps 10 --out /tmp/e.json   # a quick try
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from companion.data import load_pydoc_text
from companion.finetuning import capitalisation_task, finetune, replaced_word_task, split_task
from companion.models.bert import (BertConfig, BertForMaskedLM, BertForQuestionAnswering, BertForTokenClassification)
from companion.calculators import count_parameters
from companion.models.electra import ElectraDiscriminator, electra_loss
from companion.pretraining import (build_mlm_blocks, corpus_documents, load_tiny_bert, masked_batches, mlm_loss,
                                   split_blocks)
from companion.training import TrainConfig, train

BERT_STEPS = 600
BATCH_SIZE = 32
LR = 2e-3
SEED = 0
ROOT = Path(__file__).resolve().parents[1]


def build(kind: str, cfg: BertConfig) -> nn.Module:
    torch.manual_seed(SEED)
    if kind == "bert":
        return BertForMaskedLM(cfg)
    disc = ElectraDiscriminator(cfg)
    gen_cfg = BertConfig(**{**cfg.__dict__, "d_model": cfg.d_model // 2, "n_heads": cfg.n_heads // 2,
                            "d_ff": cfg.d_ff // 2, "embedding_size": cfg.d_model})
    gen = BertForMaskedLM(gen_cfg)
    for name in ("token", "position", "segment"):  # the generator shares the discriminator's embeddings
        setattr(gen.bert.embeddings, name, getattr(disc.bert.embeddings, name))
    gen.mlm.tok_emb = disc.bert.embeddings.tok_emb
    return nn.ModuleDict({"generator": gen, "discriminator": disc})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bert-steps", type=int, default=BERT_STEPS)
    parser.add_argument("--finetune-steps", type=int, default=400)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "companion/checkpoints/ch08_electra_vs_bert.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shipped, tok = load_tiny_bert()  # its tokenizer and its sizes; the weights are not used
    cfg = shipped.cfg
    documents = corpus_documents(load_pydoc_text())
    train_blocks, _ = split_blocks(build_mlm_blocks(documents, tok, cfg.max_positions))
    mask_args = dict(mask_id=tok.vocab["[MASK]"], special_ids=tok.special_ids, vocab_size=tok.vocab_size)
    sampler = torch.Generator().manual_seed(SEED + 2)

    def batches():  # the same batches and masks for every model trained here
        return masked_batches(train_blocks, BATCH_SIZE, seed=SEED, **mask_args)

    losses = {
        "bert": mlm_loss,
        "electra": lambda m, b: electra_loss(m["generator"], m["discriminator"], b[0], b[2], b[1],
                                             sampler=sampler).total,
    }
    sentences = [s for d in documents for s in d]
    tasks = {"replaced_word": split_task(replaced_word_task(sentences, tok, seed=SEED), seed=SEED),
             "capitalisation": split_task(capitalisation_task(sentences, tok), seed=SEED)}
    out = {"bert_steps": args.bert_steps, "batch_size": BATCH_SIZE, "lr": LR, "threads": args.threads,
           "finetune_steps": args.finetune_steps, "config": dict(cfg.__dict__), "models": {}}
    for kind in ("bert", "electra"):
        model = build(kind, cfg)
        with FlopCounterMode(display=False) as counter:  # the FLOPs of one training step, forward and backward
            losses[kind](model, batches()(0)).backward()
        step_flops = counter.get_total_flops()
        if kind == "bert":
            budget = step_flops * args.bert_steps
        steps = max(10, round(budget / step_flops))
        model = build(kind, cfg)
        t0 = time.perf_counter()
        hist = train(model, losses[kind], batches(), TrainConfig(steps=steps, lr=LR, warmup_steps=steps // 10,
                                                                 min_lr_ratio=0.1, weight_decay=0.01), desc=kind)
        seconds = time.perf_counter() - t0
        encoder = model.bert if kind == "bert" else model["discriminator"].bert
        row = {"steps": steps, "flops_per_step": step_flops, "pretrain_flops": step_flops * steps,
               "seconds": round(seconds, 1), "final_train_loss": round(hist.train_loss[-1], 4),
               "parameters": count_parameters(model), "encoder_parameters": count_parameters(encoder)}
        for task, (tr, te) in tasks.items():
            torch.manual_seed(SEED)
            head = BertForQuestionAnswering(cfg) if tr.kind == "span" else BertForTokenClassification(cfg, 2)
            missing, unexpected = head.bert.load_state_dict(encoder.state_dict(), strict=False)
            assert not missing and not unexpected, (missing, unexpected)
            result = finetune(head, tr, te, steps=args.finetune_steps, lr=3e-4, seed=SEED)
            row[task] = round(result.accuracy, 4)
        out["models"][kind] = row
        print(kind, row)
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
