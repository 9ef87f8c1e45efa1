"""companion.device, and the models, generation and training on the test device.

Run on a GPU with ``COMPANION_TEST_DEVICE=cuda`` (or ``pytest --device cuda``);
by default the device is the CPU and the cross-device comparisons compare the
CPU with itself. Models run in float64 on the device so that greedy tokens and
beam choices cannot flip on rounding differences between devices.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from companion import device as dev
from companion.generation import beam_search, generate
from companion.training import TrainConfig, lm_loss, train

from test_placement import FORWARDS, _gpt


# ---------------------------------------------------------------- pick_device, mixed_precision, to_device

def test_pick_device_follows_the_environment_and_refuses_a_missing_device(monkeypatch):
    monkeypatch.setenv(dev.ENV_VAR, "cpu")
    assert dev.pick_device() == torch.device("cpu")
    monkeypatch.setenv(dev.ENV_VAR, "meta")
    assert dev.pick_device() == torch.device("meta")
    monkeypatch.setenv(dev.ENV_VAR, "gpu0")
    with pytest.raises(ValueError, match=r"\$COMPANION_DEVICE must name a device .* got 'gpu0'"):
        dev.pick_device()
    monkeypatch.setenv(dev.ENV_VAR, "cuda:99")
    with pytest.raises(RuntimeError, match="asks for device 'cuda:99', which this machine does not have"):
        dev.pick_device()
    monkeypatch.delenv(dev.ENV_VAR)
    expected = "cuda" if torch.cuda.is_available() else ("mps" if dev._mps_available() else "cpu")
    assert dev.pick_device().type == expected
    assert dev.pick_device("cpu") == torch.device("cpu")  # an argument wins over the machine's choice


def test_mixed_precision_follows_the_device(monkeypatch):
    assert dev.mixed_precision("cpu") == dev.MixedPrecision("cpu", None, False)
    assert dev.mixed_precision("cpu", cpu_bf16=True) == dev.MixedPrecision("cpu", torch.bfloat16, False)
    assert dev.mixed_precision("mps").dtype is None
    # A GPU's answer depends on its compute capability: 7.5 (T4) has no bf16 units, 8.0 (A100) and 9.0 (H100) do.
    for capability, dtype, scale in (((7, 5), torch.float16, True), ((8, 0), torch.bfloat16, False),
                                     ((9, 0), torch.bfloat16, False)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        monkeypatch.setattr(torch.version, "hip", None)
        assert dev.mixed_precision("cuda") == dev.MixedPrecision("cuda", dtype, scale), capability
    fp32 = dev.mixed_precision("cpu")
    with fp32.autocast():
        assert not torch.is_autocast_enabled("cpu")
    assert not fp32.grad_scaler().is_enabled()


def test_to_device_moves_every_tensor_of_a_batch():
    from companion.toy_tasks import make_batch

    x = torch.zeros(2, 3)
    moved = dev.to_device({"a": (x, [x, 1]), "b": "text"}, "meta")
    assert moved["a"][0].is_meta and moved["a"][1][0].is_meta and moved["a"][1][1] == 1 and moved["b"] == "text"
    batch = dev.to_device(make_batch(4, max_len=5, generator=torch.Generator().manual_seed(0)), "meta")
    assert batch.src.is_meta and batch.src_mask.is_meta and batch.tgt.is_meta and len(batch) == 4
    assert dev.to_device(x, None) is x


# ---------------------------------------------------------------- models and generation on the test device

def _float64_on(model: torch.nn.Module, device) -> torch.nn.Module:
    return copy.deepcopy(model).double().to(device).eval()


def _main_output(out) -> torch.Tensor:
    """The logits (or hidden states) of a model's output: a tensor, ``.logits``, or a NamedTuple's first field."""
    if isinstance(out, torch.Tensor):
        return out
    return out.logits if hasattr(out, "logits") else out[0]


@pytest.mark.parametrize("case", [c for c in FORWARDS if c.name in ("GPT-2 style", "SmallLM rope", "SmallLM alibi",
                                                                     "BERT mlm", "DeBERTa v3", "Llama (GQA)",
                                                                     "Qwen3 style (q/k norm, Dh not D/H)")],
                         ids=lambda c: c.name)
def test_forward_on_the_device_equals_the_cpu(case, device):
    torch.manual_seed(0)
    cpu = case.build().double().eval()
    on_device = _float64_on(cpu, device)
    ids = torch.randint(0, 23, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = _main_output(cpu(ids)), _main_output(on_device(ids.to(device)))
    assert got.device.type == device.type
    torch.testing.assert_close(got.cpu(), want, rtol=1e-9, atol=1e-9)


def test_generation_on_the_device_equals_the_cpu(device):
    torch.manual_seed(0)
    cpu = _gpt().double().eval()
    gpu = _float64_on(cpu, device)
    prompt = torch.tensor([[3, 1, 4], [1, 5, 9]])
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    for kw in (dict(), dict(use_cache=False), dict(eos_token_id=7), dict(attention_mask=mask)):
        want = generate(cpu, prompt, 6, **kw)
        got = generate(gpu, prompt.to(device), 6, **{k: v.to(device) if torch.is_tensor(v) else v for k, v in kw.items()})
        assert got.device.type == device.type and torch.equal(got.cpu(), want), kw
    g = torch.Generator(device=device).manual_seed(0)  # a sampler's generator lives on the device it draws on
    sampled = generate(gpu, prompt.to(device), 5, do_sample=True, top_k=5, top_p=0.9, generator=g)
    assert sampled.shape == (2, 8) and sampled.device.type == device.type


@pytest.mark.parametrize("use_cache", [True, False])
def test_beam_search_on_the_device_equals_the_cpu(device, use_cache):
    torch.manual_seed(0)
    cpu = _gpt().double().eval()
    gpu = _float64_on(cpu, device)
    prompt = torch.tensor([[3, 1, 4], [1, 5, 9]])
    kw = dict(num_beams=3, max_new_tokens=5, eos_token_id=7, num_return_sequences=2, use_cache=use_cache,
              length_penalty=0.8)
    want = beam_search(cpu, prompt, **kw)
    got = beam_search(gpu, prompt.to(device), **kw)
    assert got.sequences.device.type == got.scores.device.type == device.type
    assert torch.equal(got.sequences.cpu(), want.sequences) and torch.equal(got.lengths.cpu(), want.lengths)
    torch.testing.assert_close(got.scores.cpu(), want.scores)


# ---------------------------------------------------------------- training on the test device

def _batches(step: int):
    """Counting modulo 23 from a random start: every next token is predictable."""
    start = torch.randint(0, 23, (4, 1), generator=torch.Generator().manual_seed(step))
    x = (start + torch.arange(9)) % 23  # (4, 9)
    return x, (x + 1) % 23


CFG = TrainConfig(steps=4, lr=1e-2, warmup_steps=1, eval_every=2)


def test_train_on_the_cpu_is_unchanged_by_device_and_precision_arguments():
    torch.manual_seed(0)
    base = _gpt()
    runs = []
    for kw in (dict(), dict(device="cpu"), dict(device=torch.device("cpu"), mixed_precision=True)):
        model = copy.deepcopy(base)
        hist = train(model, lm_loss, _batches, CFG, progress=False, **kw)
        runs.append((hist, [p.detach().clone() for p in model.parameters()]))
    for hist, params in runs[1:]:
        assert hist.train_loss == runs[0][0].train_loss and hist.grad_norm == runs[0][0].grad_norm
        assert all(torch.equal(a, b) for a, b in zip(params, runs[0][1]))


@pytest.mark.parametrize("mixed_precision", [False, True])
def test_train_on_the_device_moves_model_and_batches(device, mixed_precision):
    torch.manual_seed(0)
    model = _gpt()
    held_out = _batches(99)

    def eval_fn(m):
        return lm_loss(m, dev.to_device(held_out, device)).item()

    before = eval_fn(copy.deepcopy(model).to(device))
    cfg = dataclasses.replace(CFG, steps=30, eval_every=30)
    hist = train(model, lm_loss, _batches, cfg, eval_fn=eval_fn, progress=False, device=device,
                 mixed_precision=mixed_precision)
    assert next(model.parameters()).device.type == device.type
    assert all(map(torch.isfinite, map(torch.tensor, hist.train_loss)))
    assert hist.final_eval < before - 0.3, (before, hist.final_eval)


def test_the_grader_compares_a_result_left_on_the_device(device):
    from companion.grading.core import CheckFailed, expect_tensor

    want = torch.arange(6.0).view(2, 3)
    expect_tensor(want.to(device), want)
    with pytest.raises(CheckFailed, match=r"largest error at index \(1, 2\): expected 5, got 7"):
        expect_tensor(torch.tensor([[0.0, 1, 2], [3, 4, 7]]).to(device), want)


# ---------------------------------------------------------------- helpers that take a model's or a batch's device

def test_mlm_special_tokens_mask_on_the_device(device):
    from companion.mlm import special_tokens_mask

    ids = torch.tensor([[0, 5, 7, 1, 2]])
    cpu = special_tokens_mask(ids, [0, 1, 2], torch.tensor([[1, 1, 1, 1, 0]]))
    there = special_tokens_mask(ids.to(device), [0, 1, 2], torch.tensor([[1, 1, 1, 1, 0]]).to(device))
    assert there.device.type == torch.device(device).type
    assert cpu.tolist() == there.cpu().tolist() == [[True, False, False, True, True]]


def test_scaling_forward_feeds_the_model_on_its_device(device):
    from companion.experiments.scaling import ScalingConfig, _forward, family_models

    for name, model in family_models(ScalingConfig()).items():
        with torch.no_grad():
            out = _forward(name, model.to(device), 8)()
        main = out if isinstance(out, torch.Tensor) else out[0]
        assert main.device.type == torch.device(device).type, name


def test_text_to_text_trains_on_the_device_and_returns_a_cpu_model(device):
    from companion.text_to_text_t5 import TextToTextRecipe, train_text_to_text

    recipe = TextToTextRecipe(d_model=16, d_kv=4, n_heads=2, d_ff=32, n_layers=1, batch_size=4, n_monitor=2,
                              n_heldout=2)
    recipe = dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, steps=3, warmup_steps=1, eval_every=3))
    here = train_text_to_text(recipe, device=device)
    assert all(p.device.type == "cpu" for p in here["model"].parameters())
    assert set(here["record"]["exact_match"]) == {"reverse", "sort", "add"}
    if torch.device(device).type == "cpu":  # on the CPU, device= changes nothing
        plain = train_text_to_text(recipe)
        assert plain["record"]["curve"] == here["record"]["curve"]
        assert plain["record"]["final_train_loss"] == here["record"]["final_train_loss"]
