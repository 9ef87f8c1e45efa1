"""Chapter 16's recorded comparison of the Llama-style decoder with the Chapter 9 GPT (scripts/ch16_training.py)."""

import json
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from companion.calculators import count_parameters
from companion.experiments import seed_spread
from companion.models.gpt import GPT, GPTConfig
from companion.models.llama import Llama, LlamaConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rec():
    return json.loads((resources.files("companion.checkpoints") / "ch16_training.json").read_text())


def test_the_two_models_have_equal_parameters_and_the_shapes_the_chapter_states(rec):
    gpt, llama = GPT(GPTConfig(**rec["gpt_config"])), Llama(LlamaConfig(**rec["llama_config"]))
    assert rec["parameters"] == {"gpt": count_parameters(gpt), "llama": count_parameters(llama)}
    assert abs(rec["parameters"]["llama"] / rec["parameters"]["gpt"] - 1) < 0.005
    g, ll = rec["gpt_config"], rec["llama_config"]
    assert (g["n_layers"], g["d_model"], g["n_heads"]) == (ll["n_layers"], ll["d_model"], ll["n_heads"])
    assert ll["n_kv_heads"] < ll["n_heads"] and not ll["tie_embeddings"] and g["tie_embeddings"]


def test_the_summary_is_computed_from_the_three_seeds(rec):
    seeds = rec["seeds"]
    assert [s["seed"] for s in seeds] == [0, 1, 2]
    final = {k: [s["final_val_loss"][k] for s in seeds] for k in ("gpt", "llama", "llama_scaled_init")}
    assert rec["summary"]["final_val_loss"] == {k: seed_spread(v) for k, v in final.items()}
    assert rec["summary"]["llama_minus_gpt"] == seed_spread([b - a for a, b in zip(final["gpt"], final["llama"])])
    assert rec["summary"]["scaled_init_minus_llama"] == seed_spread(
        [b - a for a, b in zip(final["llama"], final["llama_scaled_init"])])
    for s in seeds:
        for c in s["curves"].values():
            assert c["eval_steps"][-1] == rec["steps"] and len(c["eval_steps"]) == len(c["eval_loss"])
            assert c["eval_seconds"] == sorted(c["eval_seconds"]) and c["eval_seconds"][0] > 0
            assert c["eval_loss"][-1] < c["eval_loss"][0]  # both learned


def test_the_scaled_arm_differs_from_the_llama_arm_only_in_its_residual_projections():
    sys.path.insert(0, str(ROOT / "scripts"))
    from ch16_training import configs, scale_residual_projections

    import torch

    _, cfg = configs(99)
    torch.manual_seed(0)
    plain = Llama(cfg)
    torch.manual_seed(0)
    scaled = scale_residual_projections(Llama(cfg))
    moved = {n for n, p in scaled.state_dict().items() if not torch.equal(p, plain.state_dict()[n])}
    assert moved == {f"blocks.{i}.{m}.weight" for i in range(cfg.n_layers) for m in ("self_attn.out", "ffn.down")}
    w, w0 = scaled.blocks[0].ffn.down.weight, plain.blocks[0].ffn.down.weight
    torch.testing.assert_close(w, w0 / (2 * cfg.n_layers) ** 0.5)


def test_the_script_runs_a_few_steps(tmp_path):
    proc = subprocess.run([sys.executable, "scripts/ch16_training.py", "--steps", "3", "--seeds", "0",
                           "--out-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads((tmp_path / "ch16_training.json").read_text())
    assert out["steps"] == 3 and out["device"] == "cpu" and len(out["seeds"]) == 1
