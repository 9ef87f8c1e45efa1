"""Decoding a language model: greedy, sampling (temperature, top-k, top-p) and beam search (Chapter 10).

Shape legend: B batch, T prompt length, N generated tokens, V vocabulary,
K beams (``num_beams``).

Every function here works with any *causal language model*: a callable
``model(idx, cache=None) -> logits`` taking token ids ``idx`` of shape
``(B, T)`` and returning logits ``(B, T, V)``. What else the decoders use, if
the model has it (the protocol :class:`CausalLM`; :class:`companion.models.gpt.GPT`
has all of it):

* ``model.new_cache()``: an empty cache. With it, ``idx`` holds only the new
  tokens and the model appends each layer's keys and values to the cache
  (Chapter 9). Without a cache the whole sequence is fed again at every step
  ("full recomputation"); both give the same tokens.
* ``model.max_positions``: the longest sequence it can read (checked up front).
* ``model(idx, cache=..., attention_mask=...)``: a ``(B, S)`` mask, 1 on real
  tokens, over everything seen so far. Prompts of different lengths are
  **left-padded** into one batch and generate what each would alone (Hugging
  Face ``generate`` does the same).

The samplers follow the definitions of Hugging Face ``transformers``
(``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper``,
applied in that order) and :func:`beam_search` reproduces
``model.generate(num_beams=K, do_sample=False, length_penalty=..., early_stopping=...)``
including its finishing rules; the tests check both against ``transformers``.

The length penalty is Hugging Face's form, ``sum log p / L ** length_penalty``
(``transformers/generation/utils.py``, the beam-search scorer), the one the tests
compare with; GNMT (Wu et al., 2016, section 7) divides by
``((5 + L) / 6) ** alpha`` instead, which this module does not implement.

References: Holtzman et al. (2020), "The Curious Case of Neural Text
Degeneration" (top-p); Fan et al. (2018), "Hierarchical Neural Story
Generation" (top-k); Wolf et al. (2020), Hugging Face ``transformers``
(the samplers' order, beam search's finishing rules and its length penalty).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from ._checks import ShapeChecker, check_positive_int
from .kv_cache import KVCache

__all__ = [
    "apply_temperature",
    "top_k_filter",
    "top_p_filter",
    "filter_logits",
    "entropy",
    "sample_next_token",
    "generate",
    "BeamSearchOutput",
    "beam_search",
    "beam_search_step",
    "new_cache",
    "CausalLM",
]

LanguageModel = Callable[..., torch.Tensor]


# --------------------------------------------------------------------------- logits -> distribution

def _check_logits(logits: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor) or not logits.dtype.is_floating_point:
        got = logits.dtype if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise TypeError(f"logits must be a floating-point tensor of shape (..., V), got {got}")
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have shape (..., V) with V >= 1, got {tuple(logits.shape)}")


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature``: ``p_i = exp(z_i / tau) / sum_j exp(z_j / tau)``.

    ``tau < 1`` sharpens the distribution (towards greedy as ``tau -> 0``),
    ``tau > 1`` flattens it (towards uniform as ``tau -> inf``).
    """
    _check_logits(logits)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")
    return logits / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the ``k`` largest logits of each row, set the others to ``-inf``.

    A logit tied with the k-th largest is kept too (as in ``transformers``),
    so a row may keep more than ``k`` tokens when values tie.
    """
    _check_logits(logits)
    check_positive_int("k", k)
    k = min(k, logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1): the k-th largest logit
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter: keep the smallest set of most probable tokens whose probability sums to at least ``p``.

    Sort the probabilities in decreasing order, ``p_(1) >= p_(2) >= ...``; token
    ``(i)`` is kept iff the mass strictly before it, ``p_(1) + ... + p_(i-1)``,
    is below ``p``. The most probable token is therefore always kept. Others
    get ``-inf``. ``p = 1`` keeps everything.
    """
    _check_logits(logits)
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
        raise ValueError(f"p must lie in (0, 1], got {p!r}")
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (..., V)
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # (..., V): mass of more probable tokens
    keep_sorted = mass_before < p
    keep_sorted[..., 0] = True  # the top token always survives, even for tiny p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)  # back to vocabulary order
    return logits.masked_fill(~keep, float("-inf"))


def filter_logits(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """Temperature, then top-k, then top-p (the order ``transformers`` applies them)."""
    out = apply_temperature(logits, temperature)
    if top_k is not None:
        out = top_k_filter(out, top_k)
    if top_p is not None:
        out = top_p_filter(out, top_p)
    return out


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy ``H = -sum_i p_i log p_i`` (nats) of ``softmax(logits)``, one value per row; ``-inf`` logits count as 0."""
    _check_logits(logits)
    log_p = logits.float().log_softmax(dim=-1)
    p_log_p = torch.where(log_p.isneginf(), torch.zeros_like(log_p), log_p.exp() * log_p)
    return -p_log_p.sum(dim=-1)


def sample_next_token(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Draw one token per row from ``softmax(filter_logits(logits))``.

    Args:
        logits: ``(B, V)`` next-token logits.
        generator: a seeded ``torch.Generator`` makes the draws reproducible.

    Returns:
        ``(B,)`` token ids (long).
    """
    ShapeChecker().check("logits", logits, ("B", "V"))
    _check_logits(logits)
    probs = filter_logits(logits.float(), temperature=temperature, top_k=top_k, top_p=top_p).softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)  # (B,)


# --------------------------------------------------------------------------- the cache

@runtime_checkable
class CausalLM(Protocol):
    """What :func:`generate` and :func:`beam_search` use from a model, beyond being callable."""

    max_positions: int  # longest sequence (prompt + new tokens) the model reads

    def new_cache(self):  # an empty cache for one generation call
        ...

    def __call__(self, idx: torch.Tensor, *, cache=None, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        ...


def _model_config(model: LanguageModel):
    """The companion config of ``model`` (``model.cfg``, or ``model.config`` for stand-ins), or None."""
    return getattr(model, "cfg", None) or getattr(model, "config", None)


def new_cache(model: LanguageModel):
    """An empty cache for ``model``: ``model.new_cache()``, else a :class:`KVCache` of ``model.cfg.n_layers`` slots."""
    if callable(getattr(model, "new_cache", None)):
        return model.new_cache()
    config = _model_config(model)
    if config is None or not hasattr(config, "n_layers"):
        raise TypeError(
            f"use_cache=True needs a model with a new_cache() method or cfg.n_layers (a companion GPT), "
            f"got {type(model).__name__}"
        )
    return KVCache(config.n_layers)


def _max_positions(model: LanguageModel) -> int | None:
    limit = getattr(model, "max_positions", None)
    return limit if limit is not None else getattr(_model_config(model), "max_positions", None)


def _check_prompt(model: LanguageModel, idx: torch.Tensor, max_new_tokens: int, attention_mask=None) -> None:
    ShapeChecker().check("idx", idx, ("B", "T"))
    if idx.dtype != torch.long:
        raise TypeError(f"idx must hold token ids as torch.long, got {idx.dtype}")
    if idx.shape[1] == 0:
        raise ValueError("idx must hold a prompt of at least one token, got length 0")
    check_positive_int("max_new_tokens", max_new_tokens)
    limit = _max_positions(model)
    if limit is not None and idx.shape[1] + max_new_tokens > limit:
        raise ValueError(
            f"prompt length {idx.shape[1]} + max_new_tokens {max_new_tokens} exceeds the model's max_positions {limit}"
        )
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != tuple(idx.shape):
            got = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__
            raise ValueError(f"attention_mask must have the shape of idx {tuple(idx.shape)}, got {got}")
        if not bool(attention_mask[:, -1].bool().all()):
            raise ValueError("prompts must be left-padded: the last position of every row must be a real token")


def _call(model: LanguageModel, idx: torch.Tensor, cache, attention_mask: torch.Tensor | None) -> torch.Tensor:
    # Models that know nothing of padding are still called as model(idx, cache=cache).
    if attention_mask is None:
        return model(idx, cache=cache)
    return model(idx, cache=cache, attention_mask=attention_mask)


# --------------------------------------------------------------------------- greedy and sampling

@torch.no_grad()
def generate(
    model: LanguageModel,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Extend ``idx`` (B, T) by up to ``max_new_tokens`` tokens, greedily or by sampling.

    Greedy: ``x_{t+1} = argmax_i z_i``. Sampling: ``x_{t+1} ~ softmax(filter_logits(z))``.
    With ``use_cache`` the prompt is run once ("prefill") and every later step
    feeds one token per row; without it every step reruns the whole sequence.
    A row that produced ``eos_token_id`` is finished: it is padded with
    ``pad_token_id`` (default ``eos_token_id``), and generation stops early
    when every row is finished (as in ``transformers``). ``attention_mask``
    ``(B, T)`` marks the real tokens of left-padded prompts (1) and the padding (0).

    Returns:
        ``(B, T + N)`` token ids, ``N <= max_new_tokens``.
    """
    _check_prompt(model, idx, max_new_tokens, attention_mask)
    pad = eos_token_id if pad_token_id is None else pad_token_id
    cache = new_cache(model) if use_cache else None
    unfinished = torch.ones(idx.shape[0], dtype=torch.bool, device=idx.device)  # (B,)
    step_input = idx
    for _ in range(max_new_tokens):
        logits = _call(model, step_input, cache, attention_mask)[:, -1, :]  # (B, V): only the last position predicts
        if do_sample:
            next_token = sample_next_token(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
        else:
            next_token = logits.argmax(dim=-1)  # (B,)
        if eos_token_id is not None:
            next_token = torch.where(unfinished, next_token, torch.full_like(next_token, pad))
            unfinished = unfinished & (next_token != eos_token_id)
        idx = torch.cat([idx, next_token[:, None]], dim=1)  # (B, T + n)
        if attention_mask is not None:
            attention_mask = F.pad(attention_mask, (0, 1), value=1)  # (B, T + n): the new token is real
        if eos_token_id is not None and not bool(unfinished.any()):  # (reading a GPU value waits for the GPU)
            break
        step_input = next_token[:, None] if use_cache else idx  # (B, 1) with a cache, (B, T + n) without
    return idx


# --------------------------------------------------------------------------- beam search

@dataclass(frozen=True)
class BeamSearchOutput:
    """Result of :func:`beam_search`."""

    sequences: torch.Tensor  # (B * R, T + N) prompt + continuation, best first per prompt, padded with pad_token_id
    scores: torch.Tensor  # (B * R,) sum of log-probabilities / (generated length ** length_penalty)
    lengths: torch.Tensor  # (B * R,) number of generated tokens of each sequence (EOS included)


def beam_search_step(
    log_probs: torch.Tensor,
    beam_scores: torch.Tensor,
    n_candidates: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One expansion step of beam search for one prompt.

    Every beam ``b`` and token ``v`` make a candidate with score
    ``beam_scores[b] + log_probs[b, v]``; keep the ``n_candidates`` best.

    Args:
        log_probs: ``(K, V)`` next-token log-probabilities of the K beams.
        beam_scores: ``(K,)`` running sums of log-probabilities.
        n_candidates: how many candidates to keep (at most ``K * V``).

    Returns:
        ``(scores, beam, token)``, each ``(n_candidates,)``, sorted by
        decreasing score: the candidate's score, the beam it extends, its token.
    """
    sc = ShapeChecker()
    sc.check("log_probs", log_probs, ("K", "V"))
    sc.check("beam_scores", beam_scores, ("K",))
    check_positive_int("n_candidates", n_candidates)
    n_beams, vocab = log_probs.shape
    if n_candidates > n_beams * vocab:
        raise ValueError(f"n_candidates={n_candidates} exceeds the K * V = {n_beams * vocab} candidates")
    total = (beam_scores[:, None] + log_probs).reshape(-1)  # (K * V,)
    scores, flat = torch.topk(total, n_candidates)  # sorted, best first
    return scores, flat // vocab, flat % vocab


@torch.no_grad()
def beam_search(
    model: LanguageModel,
    idx: torch.Tensor,
    *,
    num_beams: int,
    max_new_tokens: int,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    num_return_sequences: int = 1,
    use_cache: bool = True,
    attention_mask: torch.Tensor | None = None,
) -> BeamSearchOutput:
    """Beam search with the finishing rules of ``transformers``' ``generate(num_beams=K, do_sample=False)``.

    Per prompt the search keeps K *running* beams and up to K *finished*
    hypotheses. Each step:

    1. Score every continuation ``running_score[b] + log p(v | beam b)`` and keep
       the best ``2K`` candidates (2K so that K remain even if K of them end).
    2. A candidate *ends* if its token is ``eos_token_id`` or the length limit is
       reached. Ended candidates among the best K are offered to the finished
       set with the score ``sum log p / L ** length_penalty`` (L = generated
       length, EOS included; Hugging Face's length penalty, not GNMT's
       ``((5 + L) / 6) ** alpha``); the finished set keeps its K best.
    3. The K best candidates that did not end become the new running beams.
    4. A prompt is *done* when ``early_stopping is True`` and K hypotheses are
       finished, or when K are finished and the best running beam cannot beat
       the worst of them any more: its score divided by ``L ** length_penalty``,
       with L the current length, or the maximal length when
       ``early_stopping == "never"`` and ``length_penalty > 0``.

    The search stops when every prompt is done or at ``max_new_tokens``.

    Args:
        idx: ``(B, T)`` prompts.
        num_beams: K.
        length_penalty: exponent of the length normalisation (0: plain sum of log-probs;
            > 0 favours longer sequences).
        early_stopping: ``True``, ``False`` or ``"never"``, as in ``transformers``.
        eos_token_id: the end-of-sequence token, or ``None`` (then every beam runs to ``max_new_tokens``).
        pad_token_id: fills sequences shorter than the longest returned one (default ``eos_token_id``).
        num_return_sequences: R <= K best hypotheses returned per prompt.
        use_cache: decode with a KV cache (reordered to follow the beams) or recompute.
        attention_mask: ``(B, T)``, 1 on real tokens of left-padded prompts, 0 on padding.
    """
    _check_prompt(model, idx, max_new_tokens, attention_mask)
    k = check_positive_int("num_beams", num_beams)
    r = check_positive_int("num_return_sequences", num_return_sequences)
    if r > k:
        raise ValueError(f"num_return_sequences={r} cannot exceed num_beams={k}")
    if early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
    batch, prompt_len = idx.shape
    max_len = prompt_len + max_new_tokens
    n_candidates = 2 * k

    device = idx.device  # every tensor made here lives where the prompts and the model's outputs are
    dead = torch.finfo(torch.float32).min  # the score of a beam that must never be chosen (scores are fp32)
    running = idx.repeat_interleave(k, dim=0)  # (B*K, T): K copies of each prompt
    mask = None if attention_mask is None else attention_mask.repeat_interleave(k, dim=0)  # (B*K, T)
    running_scores = torch.full((batch, k), dead, device=device)
    running_scores[:, 0] = 0.0  # only beam 0 is live at the start, so the first step has no duplicates
    finished: list[list[tuple[float, torch.Tensor]]] = [[] for _ in range(batch)]  # (score, tokens), best first
    done = [False] * batch
    cache = new_cache(model) if use_cache else None
    step_input = running
    for cur_len in range(prompt_len, max_len):
        logits = _call(model, step_input, cache, mask)[:, -1, :]  # (B*K, V)
        log_probs = F.log_softmax(logits.float(), dim=-1).view(batch, k, -1)  # (B, K, V)
        at_limit = cur_len + 1 >= max_len
        gen_len = cur_len + 1 - prompt_len
        next_rows = torch.empty(batch * k, dtype=torch.long, device=device)  # which row each new beam continues
        next_tokens = torch.empty(batch * k, dtype=torch.long, device=device)
        for b in range(batch):
            scores, beam, token = beam_search_step(log_probs[b], running_scores[b], n_candidates)
            ends = torch.full_like(token, at_limit, dtype=torch.bool)
            if eos_token_id is not None:
                ends |= token == eos_token_id
            # 2. ended candidates among the best K enter the finished set (unless this prompt is done)
            full = len(finished[b]) == k
            if not done[b] and not (full and early_stopping is True):
                for i in range(k):
                    if ends[i]:
                        row = running[b * k + beam[i : i + 1], :cur_len][0]  # (cur_len,), indexed on the device
                        tokens = torch.cat([row, token[i : i + 1]])
                        finished[b].append((float(scores[i]) / gen_len**length_penalty, tokens))
                finished[b] = sorted(finished[b], key=lambda h: -h[0])[:k]
            # 3. the best K candidates that did not end continue
            alive = torch.topk(scores.masked_fill(ends, dead), k).indices
            running_scores[b] = scores[alive].masked_fill(ends[alive], dead)
            next_rows[b * k : (b + 1) * k] = b * k + beam[alive]
            next_tokens[b * k : (b + 1) * k] = token[alive]
            # 4. can this prompt still improve?
            if len(finished[b]) == k and not done[b]:
                best_len = max_new_tokens if (early_stopping == "never" and length_penalty > 0) else gen_len
                best_possible = float(running_scores[b, 0]) / best_len**length_penalty
                done[b] = best_possible <= finished[b][-1][0]
            if early_stopping is True and len(finished[b]) == k:
                done[b] = True
        if at_limit or all(done):
            break
        running = torch.cat([running[next_rows], next_tokens[:, None]], dim=1)  # (B*K, cur_len + 1)
        if mask is not None:
            mask = F.pad(mask[next_rows], (0, 1), value=1)  # (B*K, cur_len + 1)
        if cache is not None:
            cache.reorder(next_rows)  # beam i now continues row next_rows[i]
            step_input = next_tokens[:, None]  # (B*K, 1)
        else:
            step_input = running

    pad = pad_token_id if pad_token_id is not None else (eos_token_id if eos_token_id is not None else -1)
    best = [h for hyps in finished for h in hyps[:r]]
    lengths = torch.tensor([len(t) - prompt_len for _, t in best], device=device)
    sequences = torch.full((len(best), max(len(t) for _, t in best)), pad, dtype=torch.long, device=device)
    for i, (_, t) in enumerate(best):
        sequences[i, : len(t)] = t
    scores = torch.tensor([s for s, _ in best], device=device)
    return BeamSearchOutput(sequences=sequences, scores=scores, lengths=lengths)
