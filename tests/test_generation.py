"""Tests of companion.generation: samplers, beam search and cached decoding.

References: Hugging Face ``transformers`` (its logits warpers and ``generate``
on a GPT2LMHeadModel built from a small random config, loaded into the
companion GPT with ``from_hf_gpt2``), ``torch.distributions`` and sets of
allowed tokens computed by plain Python loops.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper  # noqa: E402

from companion.generation import (  # noqa: E402
    apply_temperature,
    beam_search,
    beam_search_step,
    entropy,
    filter_logits,
    generate,
    new_cache,
    sample_next_token,
    top_k_filter,
    top_p_filter,
)
from companion.kv_cache import kv_cache_bytes  # noqa: E402
from companion.models.gpt import from_hf_gpt2  # noqa: E402

V = 37
EOS = 5


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one thread avoids OpenMP spin-waiting on a busy machine (60x faster here)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def models():
    """A random GPT-2 (V=37, D=24, 2 layers, 3 heads) in HF and in the companion, same weights."""
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=V, n_positions=64, n_embd=24, n_layer=2, n_head=3,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=EOS,
    )
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        hf.transformer.wte.weight[EOS] *= 4.0  # make EOS likely, so that beams really finish early
    return hf, from_hf_gpt2(hf)


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(0, V, (2, 7), generator=torch.Generator().manual_seed(1))


# --------------------------------------------------------------------------- filters

def _random_logits(b=4, v=13, seed=0):
    return torch.randn(b, v, generator=torch.Generator().manual_seed(seed)) * 2.0


@pytest.mark.parametrize("k", [1, 3, 12, 13, 50])
def test_top_k_matches_transformers(k):
    logits = _random_logits()
    want = TopKLogitsWarper(top_k=k)(None, logits.clone())
    torch.testing.assert_close(top_k_filter(logits, k), want)


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.9, 0.99, 1.0])
def test_top_p_matches_transformers(p):
    logits = _random_logits(seed=1)
    want = TopPLogitsWarper(top_p=p)(None, logits.clone())
    torch.testing.assert_close(top_p_filter(logits, p), want)


def _allowed_top_k(row: torch.Tensor, k: int) -> set[int]:
    values = sorted(row.tolist(), reverse=True)
    return {i for i, z in enumerate(row.tolist()) if z >= values[k - 1]}


def _allowed_top_p(row: torch.Tensor, p: float) -> set[int]:
    probs = row.softmax(-1).tolist()
    kept, mass = set(), 0.0
    for i in sorted(range(len(probs)), key=lambda j: -probs[j]):
        if mass >= p:
            break
        kept.add(i)
        mass += probs[i]
    return kept


def _draws(row: torch.Tensor, n: int, seed: int, **kwargs) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return sample_next_token(row.expand(n, -1), generator=g, **kwargs)  # (n,)


@pytest.mark.parametrize("k", [1, 2, 5])
def test_top_k_samples_exactly_the_allowed_set(k):
    row = torch.linspace(-1.0, 1.5, 11)[torch.randperm(11, generator=torch.Generator().manual_seed(k))]
    allowed = _allowed_top_k(row, k)
    draws = _draws(row, 20000, seed=k, top_k=k)
    assert set(draws.tolist()) == allowed  # never outside, and every allowed token occurs
    probs = row[list(allowed)].softmax(-1)
    freq = torch.tensor([(draws == i).float().mean().item() for i in allowed])
    torch.testing.assert_close(freq, probs, atol=0.02, rtol=0.0)  # renormalised over the set


@pytest.mark.parametrize("p", [0.2, 0.5, 0.75, 0.95])
def test_top_p_samples_exactly_the_allowed_set(p):
    row = torch.linspace(-2.0, 2.0, 13)[torch.randperm(13, generator=torch.Generator().manual_seed(3))]
    allowed = _allowed_top_p(row, p)
    draws = _draws(row, 20000, seed=7, top_p=p)
    assert set(draws.tolist()) == allowed
    mass = row.softmax(-1)[list(allowed)].sum().item()
    assert mass >= p - 1e-6  # the nucleus covers at least p ...
    smaller = mass - row.softmax(-1)[list(allowed)].min().item()
    assert smaller < p  # ... and is the smallest such set


def test_top_k_keeps_ties_and_top_p_keeps_the_argmax():
    logits = torch.tensor([[1.0, 3.0, 2.0, 2.0, 0.0]])
    assert torch.isfinite(top_k_filter(logits, 2)).tolist() == [[False, True, True, True, False]]
    assert torch.isfinite(top_p_filter(logits, 1e-6)).tolist() == [[False, True, False, False, False]]
    assert torch.isfinite(top_p_filter(logits, 1.0)).all()


def test_temperature_and_entropy():
    logits = _random_logits(b=3, v=17, seed=2)
    torch.testing.assert_close(entropy(logits), torch.distributions.Categorical(logits=logits).entropy())
    temps = [0.05, 0.3, 0.7, 1.0, 1.5, 3.0, 100.0]
    h = torch.stack([entropy(apply_temperature(logits, t)) for t in temps])  # (7, 3)
    assert (h[1:] > h[:-1]).all(), "entropy must increase with the temperature"
    assert (h[0] < 0.1).all() and (h[-1] > math.log(17) - 0.01).all()  # near greedy, near uniform
    # filtered logits: entropy of the renormalised top-k distribution, at most log k
    assert (entropy(filter_logits(logits, top_k=4)) <= math.log(4) + 1e-6).all()


def test_filters_reject_bad_arguments():
    logits = _random_logits()
    for bad in (lambda: apply_temperature(logits, 0.0), lambda: top_k_filter(logits, 0),
                lambda: top_p_filter(logits, 0.0), lambda: top_p_filter(logits, 1.5),
                lambda: sample_next_token(logits[0])):
        with pytest.raises(ValueError):
            bad()
    with pytest.raises(TypeError):
        top_k_filter(torch.ones(2, 3, dtype=torch.long), 1)


def test_sampling_is_reproducible_with_a_generator(models, prompt):
    _, model = models
    runs = [generate(model, prompt, 15, do_sample=True, top_p=0.9, generator=torch.Generator().manual_seed(s))
            for s in (3, 3, 4)]
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


# --------------------------------------------------------------------------- against transformers.generate

@pytest.mark.parametrize("eos", [None, EOS])
def test_greedy_matches_transformers(models, prompt, eos):
    hf, model = models
    hf.generation_config.eos_token_id = eos
    want = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                       max_new_tokens=12, eos_token_id=eos, pad_token_id=1)
    for use_cache in (True, False):
        got = generate(model, prompt, 12, use_cache=use_cache, eos_token_id=eos, pad_token_id=1)
        assert torch.equal(got, want)


@pytest.mark.parametrize("settings", [
    dict(temperature=0.7), dict(top_k=5), dict(top_p=0.8), dict(temperature=1.3, top_k=10, top_p=0.9),
])
def test_sampling_matches_transformers_with_the_same_seed(models, prompt, settings):
    hf, model = models
    hf.generation_config.eos_token_id = None
    torch.manual_seed(123)  # transformers draws from the global generator
    want = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, max_new_tokens=12,
                       pad_token_id=1, top_k=settings.get("top_k", 0),
                       **{k: v for k, v in settings.items() if k != "top_k"})
    got = generate(model, prompt, 12, do_sample=True, generator=torch.Generator().manual_seed(123), **settings)
    assert torch.equal(got, want)


BEAM_SETTINGS = list(itertools.product([3, 4], [1.0, 0.0, 2.0, -0.5], [True, False, "never"], [None, EOS]))


@pytest.mark.parametrize("num_beams,length_penalty,early_stopping,eos", BEAM_SETTINGS)
def test_beam_search_matches_transformers(models, prompt, num_beams, length_penalty, early_stopping, eos):
    hf, model = models
    hf.generation_config.eos_token_id = eos
    want = hf.generate(
        prompt, attention_mask=torch.ones_like(prompt), num_beams=num_beams, do_sample=False,
        length_penalty=length_penalty, early_stopping=early_stopping, max_new_tokens=9,
        num_return_sequences=2, eos_token_id=eos, pad_token_id=1,
        return_dict_in_generate=True, output_scores=True,
    )
    for use_cache in (True, False):
        got = beam_search(model, prompt, num_beams=num_beams, max_new_tokens=9, length_penalty=length_penalty,
                          early_stopping=early_stopping, eos_token_id=eos, pad_token_id=1,
                          num_return_sequences=2, use_cache=use_cache)
        assert torch.equal(got.sequences, want.sequences)
        torch.testing.assert_close(got.scores, want.sequences_scores, atol=1e-4, rtol=1e-5)


def test_beam_search_finishes_early_with_eos(models, prompt):
    """The EOS settings above are meaningful: some hypotheses end before the length limit."""
    _, model = models
    out = beam_search(model, prompt, num_beams=3, max_new_tokens=9, length_penalty=0.0, eos_token_id=EOS,
                      num_return_sequences=2)
    assert (out.lengths < 9).any()
    ends = out.sequences[torch.arange(len(out.lengths)), prompt.shape[1] + out.lengths - 1]
    assert (ends[out.lengths < 9] == EOS).all()


@pytest.mark.parametrize("alpha", [0.0, 1.0, 2.0])
def test_beam_score_is_hugging_faces_length_penalty_not_gnmts(models, prompt, alpha):
    """A returned score is sum log p / L ** alpha (transformers' form), recomputed from the model's own log-probs."""
    _, model = models
    out = beam_search(model, prompt, num_beams=3, max_new_tokens=9, length_penalty=alpha, eos_token_id=EOS,
                      num_return_sequences=2)
    t = prompt.shape[1]
    with torch.no_grad():
        for seq, n, score in zip(out.sequences, out.lengths.tolist(), out.scores.tolist()):
            ids = seq[None, : t + n]
            log_p = model(ids[:, :-1]).log_softmax(-1)[0, t - 1 :].gather(-1, ids[0, t:, None]).sum().item()
            assert score == pytest.approx(log_p / n**alpha, abs=1e-4)
            if alpha > 0 and n > 1:  # GNMT's ((5 + L) / 6) ** alpha would give another score
                assert score != pytest.approx(log_p / ((5 + n) / 6) ** alpha, abs=1e-3)


def test_one_beam_is_greedy(models, prompt):
    _, model = models
    out = beam_search(model, prompt, num_beams=1, max_new_tokens=10)
    assert torch.equal(out.sequences, generate(model, prompt, 10))


def test_beam_search_step_against_brute_force():
    g = torch.Generator().manual_seed(5)
    log_probs = torch.randn(3, 7, generator=g).log_softmax(-1)
    beam_scores = torch.tensor([-1.0, -2.5, -0.3])
    scores, beam, token = beam_search_step(log_probs, beam_scores, 6)
    everything = sorted(((beam_scores[b] + log_probs[b, v]).item(), b, v) for b in range(3) for v in range(7))[::-1]
    assert [(b, v) for _, b, v in everything[:6]] == list(zip(beam.tolist(), token.tolist()))
    torch.testing.assert_close(scores, torch.tensor([s for s, _, _ in everything[:6]]))
    with pytest.raises(ValueError):
        beam_search_step(log_probs, beam_scores, 22)


# --------------------------------------------------------------------------- the KV cache

def test_cached_logits_equal_full_recomputation(models):
    _, model = models
    seq = torch.randint(0, V, (3, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(seq)  # (3, 20, V): every position at once
        cache = new_cache(model)
        steps = [model(seq[:, :7], cache=cache)]  # prefill with T=7, then 13 single tokens
        steps += [model(seq[:, t : t + 1], cache=cache) for t in range(7, 20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == 20


def test_cached_sampling_equals_uncached(models, prompt):
    _, model = models
    a = generate(model, prompt, 30, do_sample=True, temperature=1.2, generator=torch.Generator().manual_seed(9))
    b = generate(model, prompt, 30, do_sample=True, temperature=1.2, generator=torch.Generator().manual_seed(9),
                 use_cache=False)
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype,size", [(torch.float32, 4), (torch.float16, 2)])
def test_cache_bytes_match_the_formula(models, dtype, size):
    _, model = models
    cfg = model.cfg
    cache = new_cache(model)
    with torch.no_grad():
        model(torch.randint(0, V, (2, 11)), cache=cache)
    held = sum(t.numel() * t.element_size() for t in (*cache.keys, *cache.values))
    assert cache.nbytes() == held == 2 * cfg.n_layers * cfg.n_heads * cfg.d_head * 11 * 4 * 2
    # a cache of another dtype: build the tensors the model would append and count them
    half = new_cache(model)
    for layer in range(cfg.n_layers):
        k = torch.zeros(1, cfg.n_heads, 13, cfg.d_head, dtype=dtype)
        half.append(layer, k, k.clone())
    assert half.nbytes() == kv_cache_bytes(cfg.n_layers, cfg.n_heads, cfg.d_head, 13, bytes_per_element=size)


def test_generate_checks_its_arguments(models, prompt):
    _, model = models
    with pytest.raises(ValueError):
        generate(model, prompt, 60)  # 7 + 60 > max_positions 64
    with pytest.raises(TypeError):
        generate(model, prompt.float(), 3)
    with pytest.raises(ValueError):
        generate(model, prompt[0], 3)
    with pytest.raises(ValueError):
        beam_search(model, prompt, num_beams=2, max_new_tokens=3, num_return_sequences=3)
    with pytest.raises(ValueError):
        beam_search(model, prompt, num_beams=2, max_new_tokens=3, early_stopping="sometimes")


# --------------------------------------------------------------------------- left-padded batches

PAD = 2


@pytest.fixture(scope="module")
def padded_batch():
    """Three prompts of lengths 7, 3 and 5, left-padded with PAD into one (3, 7) batch."""
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(6, V, (n,), generator=g) for n in (7, 3, 5)]
    idx = torch.full((3, 7), PAD, dtype=torch.long)
    mask = torch.zeros(3, 7, dtype=torch.long)
    for i, p in enumerate(prompts):
        idx[i, 7 - len(p):] = p
        mask[i, 7 - len(p):] = 1
    return prompts, idx, mask


@pytest.mark.parametrize("eos", [None, EOS])
def test_left_padded_greedy_batch_matches_transformers_and_each_prompt_alone(models, padded_batch, eos):
    hf, model = models
    prompts, idx, mask = padded_batch
    hf.generation_config.eos_token_id = eos
    want = hf.generate(idx, attention_mask=mask, do_sample=False, max_new_tokens=10,
                       eos_token_id=eos, pad_token_id=PAD)
    for use_cache in (True, False):
        got = generate(model, idx, 10, attention_mask=mask, use_cache=use_cache, eos_token_id=eos, pad_token_id=PAD)
        assert torch.equal(got, want)
    # The padding changes nothing: each prompt alone continues the same way.
    for i, p in enumerate(prompts):
        alone = generate(model, p[None], 10, eos_token_id=eos, pad_token_id=PAD)[0, len(p):]
        assert torch.equal(alone, got[i, 7:7 + len(alone)])


@pytest.mark.parametrize("eos", [None, EOS])
def test_left_padded_beam_search_matches_transformers(models, padded_batch, eos):
    hf, model = models
    _, idx, mask = padded_batch
    hf.generation_config.eos_token_id = eos
    want = hf.generate(idx, attention_mask=mask, num_beams=3, do_sample=False, max_new_tokens=8,
                       num_return_sequences=2, eos_token_id=eos, pad_token_id=PAD,
                       return_dict_in_generate=True, output_scores=True)
    for use_cache in (True, False):
        got = beam_search(model, idx, num_beams=3, max_new_tokens=8, eos_token_id=eos, pad_token_id=PAD,
                          num_return_sequences=2, use_cache=use_cache, attention_mask=mask)
        assert torch.equal(got.sequences, want.sequences)
        torch.testing.assert_close(got.scores, want.sequences_scores, atol=1e-4, rtol=1e-5)


def test_padding_gives_the_logits_of_the_prompt_alone(models, padded_batch):
    _, model = models
    prompts, idx, mask = padded_batch
    with torch.no_grad():
        logits = model(idx, attention_mask=mask)
        for i, p in enumerate(prompts):
            torch.testing.assert_close(logits[i, 7 - len(p):], model(p[None])[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="left-padded"):
        generate(model, idx.flip(1), 3, attention_mask=mask.flip(1))
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        model(idx, attention_mask=mask[:, 1:])


def test_next_token_explorer_is_a_widget_that_redraws():
    import matplotlib.pyplot as plt

    widgets = pytest.importorskip("ipywidgets")
    from companion.viz import next_token_explorer

    logits = torch.randn(9, generator=torch.Generator().manual_seed(0))
    plt.close("all")
    box = next_token_explorer(logits, list("abcdefghi"), show_top=9)
    # a widget (displayed as such), not the function that ipywidgets.interact returns
    assert isinstance(box, widgets.interactive) and not callable(box)
    temperature, top_k, top_p, out = box.children
    assert isinstance(out, widgets.Output) and (top_k.min, top_k.max, top_p.max) == (1, 9, 1.0)
    top_k.value = 3  # each change draws one new figure with the new setting in its title
    title = plt.figure(plt.get_fignums()[-1]).axes[0].get_title()
    assert "top-k=3" in title and "3 tokens kept" in title
    plt.close("all")
