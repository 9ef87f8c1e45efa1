"""BERT benchmarks (Chapter 7): the companion BERT against Hugging Face ``BertForMaskedLM``, same weights.

1. Forward pass of a padded batch (inference, no gradient): tokens per second.
2. Masked-LM training step (forward, loss on the masked positions, backward, AdamW step): tokens per second.

Both sides run in the same process with the same thread count, timed
alternately (``common.paired_median_seconds``); their outputs are compared
before anything is timed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .common import Row, Settings, on_device, paired_median_seconds

DEVICES = ("cpu", "cuda", "mps")  # models and batches on Settings.device

# A 1.3M-parameter BERT: 4 layers, D=128, 4 heads, F=512, a WordPiece-sized vocabulary of 4,000.
VOCAB, D_MODEL, N_LAYERS, N_HEADS, D_FF, MAX_POS = 4000, 128, 4, 4, 512, 512


def _models():
    import transformers
    from transformers.utils import logging

    from companion.models.bert import from_hf_bert

    logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=D_MODEL, num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS,
        intermediate_size=D_FF, max_position_embeddings=MAX_POS, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    hf = transformers.BertForMaskedLM(cfg)
    return hf, from_hf_bert(hf)


def _batch(batch: int, t: int):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, VOCAB, (batch, t), generator=g)
    lengths = torch.randint(t // 2, t + 1, (batch,), generator=g)
    lengths[0] = t  # at least one full row, so T is the batch's true length
    attention_mask = (torch.arange(t) < lengths[:, None]).long()  # (B, T), right padding
    ids = ids.masked_fill(attention_mask == 0, 0)
    labels = torch.full_like(ids, -100)
    chosen = (torch.rand(batch, t, generator=g) < 0.15) & attention_mask.bool()
    labels[chosen] = ids[chosen]
    return ids, attention_mask, labels


def bench_forward(settings: Settings) -> list[Row]:
    hf, ours = on_device(settings, *_models())
    hf.eval(), ours.eval()
    batch, t = (8, 128) if settings.quick else (16, 256)
    ids, att, _ = on_device(settings, *_batch(batch, t))
    with torch.no_grad():
        a = ours(ids, att).mlm_logits
        b = hf(input_ids=ids, attention_mask=att).logits
        real = att.bool()
        if not torch.allclose(a[real], b[real], atol=1e-4, rtol=1e-4):
            raise AssertionError("the two BERTs disagree: the benchmark would compare different work")
        ta, tb = paired_median_seconds(lambda: ours(ids, att), lambda: hf(input_ids=ids, attention_mask=att), settings)
    tokens = int(att.sum())
    return [Row("BERT forward, padded batch", f"B={batch}, T={t}, {tokens} real tokens",
                "companion", tokens / ta, "HF BertForMaskedLM", tokens / tb, "tok/s")]


def _mlm_step(model, optimizer, ids, att, labels, hf: bool):
    logits = model(input_ids=ids, attention_mask=att).logits if hf else model(ids, att).mlm_logits  # (B, T, V)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def bench_mlm_training(settings: Settings) -> list[Row]:
    hf, ours = on_device(settings, *_models())
    hf.train(), ours.train()
    batch, t = (8, 128) if settings.quick else (16, 128)
    ids, att, labels = on_device(settings, *_batch(batch, t))
    opt_hf = torch.optim.AdamW(hf.parameters(), lr=1e-4)
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-4)
    steps = 2 if settings.quick else 3
    ta, tb = paired_median_seconds(
        lambda: [_mlm_step(ours, opt_ours, ids, att, labels, hf=False) for _ in range(steps)],
        lambda: [_mlm_step(hf, opt_hf, ids, att, labels, hf=True) for _ in range(steps)],
        settings,
    )
    tokens = steps * int(att.sum())
    return [Row("BERT MLM training step (fwd+bwd+AdamW)", f"B={batch}, T={t}, padded",
                "companion", tokens / ta, "HF BertForMaskedLM", tokens / tb, "tok/s")]


BENCHMARKS = {
    "forward": bench_forward,
    "mlm_training": bench_mlm_training,
}
