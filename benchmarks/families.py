"""The three families side by side (Chapter 12).

* ``train_vs_generate``: one teacher-forced forward pass over T tokens (what
  training does, every position at once) against producing the same T tokens
  one at a time with a KV cache, on the chapter's small decoder. Both do about
  the same FLOPs (``companion.experiments.scaling.training_vs_generation``
  counts them); the ratio is the price of running them in sequence.
* ``family_forward``: forward time of the encoder, the decoder and the encoder-decoder
  of ``companion.experiments.scaling`` on T tokens in total, decoder against each.
"""

from __future__ import annotations

import torch

from benchmarks.common import Row, Settings, on_device, paired_median_seconds
from companion.experiments.scaling import family_models
from companion.generation import generate

DEVICES = ("cpu", "cuda", "mps")  # models and ids on Settings.device


def train_vs_generate(settings: Settings) -> list[Row]:
    model = on_device(settings, family_models()["decoder"])
    rows = []
    for t in ((64,) if settings.quick else (64, 256)):
        ids = on_device(settings, torch.randint(1, model.cfg.vocab_size, (1, t), generator=torch.Generator().manual_seed(t)))
        with torch.no_grad():
            ta, tb = paired_median_seconds(lambda: generate(model, ids[:, :1], t - 1), lambda: model(ids), settings)
        rows.append(Row("generate T tokens vs one training pass", f"decoder D=128, 2 layers, T={t}",
                        "generate (cache)", 1e3 * ta, "one pass", 1e3 * tb, "ms"))
    return rows


def family_forward(settings: Settings) -> list[Row]:
    models = {name: on_device(settings, m) for name, m in family_models().items()}
    rows = []
    for t in ((256,) if settings.quick else (256, 1024)):
        g = torch.Generator().manual_seed(t)
        ids = on_device(settings, torch.randint(1, 256, (1, t), generator=g))
        half = ids[:, : t // 2]
        calls = {"encoder": lambda: models["encoder"](ids), "encoder-decoder": lambda: models["encoder-decoder"](half, half)}
        with torch.no_grad():
            for name, fn in calls.items():
                ta, tb = paired_median_seconds(lambda: models["decoder"](ids), fn, settings)
                rows.append(Row("forward time, T tokens in total", f"D=128, 2 layers per stack, T={t}", "decoder",
                                1e3 * ta, name, 1e3 * tb, "ms"))
    return rows


BENCHMARKS = {"train_vs_generate": train_vs_generate, "family_forward": family_forward}
