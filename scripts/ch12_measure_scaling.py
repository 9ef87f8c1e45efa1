"""Record Chapter 12's scaling measurements in companion/checkpoints/ch12_scaling.json.

Forward time, peak tensor memory and FLOPs of an encoder, a decoder and an
encoder-decoder of one width as the sequence grows, and one teacher-forced pass
against token-by-token generation. One thread, CPU time of the process
(robust to other jobs on a shared machine); the JSON also records the load average.

    python scripts/ch12_measure_scaling.py
"""

import json
import os
import platform
from dataclasses import asdict
from pathlib import Path

import torch

from companion.experiments.scaling import ScalingConfig, family_models, measure_scaling, training_vs_generation

LENGTHS = [128, 256, 512, 1024, 2048]
GENERATED = 256


def main() -> None:
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    cfg = ScalingConfig()
    scaling = measure_scaling(LENGTHS, repeats=5, cfg=cfg)
    generation = training_vs_generation(family_models(cfg)["decoder"], GENERATED)
    out = {
        "config": asdict(cfg), "lengths": LENGTHS, "generated_tokens": GENERATED, "threads": 1, "clock": "process_time",
        "torch": torch.__version__, "machine": platform.machine(), "cpu_count": os.cpu_count(),
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "scaling": scaling, "training_vs_generation": generation,
    }
    path = Path(__file__).resolve().parents[1] / "companion" / "checkpoints" / "ch12_scaling.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
