"""Checks for the Chapter 9 exercises (GPT).

Each case builds random inputs, runs the student's code and compares it with the
reference in :mod:`companion.models.gpt` and :mod:`companion.tokenizers.bpe`.
Exercise 9.5 compares the student's whole GPT with the reference given the same
weights; 9.6 runs the student's training loop on the course corpus
(:mod:`companion.data`) inside the student's process (:func:`run_student`) and
judges the weights it returns here.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter

import torch
from torch import nn

from ..attention import MultiHeadAttention
from ..models.gpt import GPT, GPTConfig, evaluate_lm
from ..calculators import count_parameters
from ..tokenizers.bpe import merge_pair, pair_counts
from .core import Case, CheckFailed, Exercise, describe_exception, expect_tensor, expect_true, register, run_student


# ----------------------------------------------------------------- 9.1 causal self-attention

def _reference_attention(d_model: int, n_heads: int, seed: int) -> MultiHeadAttention:
    """The attention of a GPT block (fused qkv D -> 3D, out D -> D), called with ``is_causal=True``."""
    torch.manual_seed(seed)
    layer = MultiHeadAttention(d_model, n_heads).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.3)
    return layer


def _run_attention(student, layer: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    return student(x, layer.qkv.weight.detach(), layer.qkv.bias.detach(),
                   layer.out.weight.detach(), layer.out.bias.detach(), layer.n_heads)


def _attn_random(student):
    layer = _reference_attention(24, 3, 0)
    x = torch.randn(2, 7, 24)
    with torch.no_grad():
        expect_tensor(_run_attention(student, layer, x), layer(x, is_causal=True), name="output for B=2, T=7, D=24, H=3")


def _attn_heads(student):
    layer = _reference_attention(20, 5, 1)
    x = torch.randn(3, 13, 20)
    with torch.no_grad():
        want = layer(x, is_causal=True)
        got = _run_attention(student, layer, x)
    expect_tensor(got, want, name="output for T=13, D=20, H=5 (head size 4)")


def _attn_causal(student):
    layer = _reference_attention(16, 2, 2)
    x = torch.randn(1, 9, 16)
    x2 = x.clone()
    x2[:, 5:] += 3.0  # change positions 5..8 only
    with torch.no_grad():
        a, b = _run_attention(student, layer, x), _run_attention(student, layer, x2)
    expect_true(isinstance(a, torch.Tensor) and a.shape == (1, 9, 16), f"the output must have shape (1, 9, 16), got {getattr(a, 'shape', type(a).__name__)}")
    changed = (a[:, :5] - b[:, :5]).abs().max().item()
    expect_true(changed < 1e-5, f"changing tokens 5..8 changed the outputs of tokens 0..4 by {changed:.3g}: position i must not see j > i")


def _attn_length_one(student):
    layer = _reference_attention(12, 4, 3)
    x = torch.randn(4, 1, 12)
    with torch.no_grad():
        expect_tensor(_run_attention(student, layer, x), layer(x, is_causal=True), name="output for T=1")


register(Exercise(
    id="9.1",
    title="Causal self-attention with a fused qkv projection",
    targets=("causal_self_attention",),
    forbidden=("companion.models", "companion.attention"),  # the reference itself
    cases=(
        Case("random input (B=2, T=7, D=24, H=3)", 3, _attn_random),
        Case("five heads of size 4, T=13", 2, _attn_heads),
        Case("no position sees the future", 2, _attn_causal),
        Case("a single token", 1, _attn_length_one),
    ),
))


# ----------------------------------------------------------------- 9.2 one BPE training step

def _bpe_reference(words: dict[tuple[int, ...], int], new_id: int):
    counts = pair_counts(words)
    best = max(counts.values())
    pair = min(p for p, c in counts.items() if c == best)
    merged = Counter()
    for w, f in words.items():
        merged[tuple(merge_pair(w, pair, new_id))] += f
    return pair, dict(merged)


def _check_bpe(student, words, new_id, what):
    result = student(dict(words), new_id)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise CheckFailed(f"bpe_step should return a pair (pair, new_words), got {type(result).__name__}")
    pair, new_words = result
    want_pair, want_words = _bpe_reference(words, new_id)
    expect_true(tuple(pair) == want_pair, f"{what}: expected the pair {want_pair}, got {pair}")
    got = {tuple(w): f for w, f in dict(new_words).items()}
    expect_true(got == want_words, f"{what}: after merging {want_pair} -> {new_id} expected {want_words}, got {got}")


def _bpe_by_hand(student):
    # "low" x5, "lower" x2, "newest" x6, "widest" x3 (Sennrich et al., 2016, figure 1), as bytes.
    words = {tuple(w.encode()): f for w, f in {"low": 5, "lower": 2, "newest": 6, "widest": 3}.items()}
    _check_bpe(student, words, 256, "Sennrich et al.'s example")


def _bpe_random(student):
    g = torch.Generator().manual_seed(9)
    words = {}
    for _ in range(12):
        n = int(torch.randint(1, 8, (1,), generator=g))
        w = tuple(int(i) for i in torch.randint(0, 5, (n,), generator=g))
        words[w] = words.get(w, 0) + int(torch.randint(1, 9, (1,), generator=g))
    _check_bpe(student, words, 300, "random words over 5 symbols")


def _bpe_overlap(student):
    _check_bpe(student, {(7, 7, 7): 1, (7, 7, 7, 7): 1}, 256, "overlapping pairs 7 7 7")


def _bpe_tie(student):
    _check_bpe(student, {(3, 4): 2, (1, 2): 2, (9, 9, 1): 1}, 400, "a tie between (1, 2) and (3, 4)")


register(Exercise(
    id="9.2",
    title="One step of BPE training",
    targets=("bpe_step",),
    forbidden=("companion.tokenizers",),  # the reference itself
    cases=(
        Case("Sennrich et al.'s low/lower/newest/widest", 2, _bpe_by_hand),
        Case("random words", 2, _bpe_random),
        Case("overlapping occurrences merge left to right", 2, _bpe_overlap),
        Case("ties go to the smallest pair", 1, _bpe_tie),
    ),
))


# ----------------------------------------------------------------- 9.3 GPT-2's Conv1D weights

def _conv_case(student, d_in, d_out, seed):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(d_in, d_out, generator=g)  # Conv1D layout (in, out)
    bias = torch.randn(d_out, generator=g)
    x = torch.randn(2, 5, d_in, generator=g)
    linear = student(weight.clone(), bias.clone())
    expect_true(isinstance(linear, nn.Linear), f"linear_from_conv1d must return an nn.Linear, got {type(linear).__name__}")
    expect_true(tuple(linear.weight.shape) == (d_out, d_in),
                f"nn.Linear({d_in}, {d_out}).weight has shape ({d_out}, {d_in}), got {tuple(linear.weight.shape)}")
    with torch.no_grad():
        expect_tensor(linear(x), x @ weight + bias, name=f"output of the layer {d_in} -> {d_out} (Conv1D computes x @ W + b)")


register(Exercise(
    id="9.3",
    title="Load a GPT-2 Conv1D weight into nn.Linear",
    targets=("linear_from_conv1d",),
    forbidden=("companion.models",),  # the reference itself
    cases=(
        Case("c_attn-like: 8 -> 24", 2, lambda s: _conv_case(s, 8, 24, 0)),
        Case("c_proj-like: 24 -> 8", 2, lambda s: _conv_case(s, 24, 8, 1)),
        Case("square 6 -> 6 (a transposition error cannot hide behind a shape error)", 2, lambda s: _conv_case(s, 6, 6, 2)),
    ),
))


# ----------------------------------------------------------------- 9.4 parameter count

def _count_case(student, cfg: GPTConfig):
    with torch.device("meta"):
        want = count_parameters(GPT(cfg))
    got = student(cfg)
    expect_true(isinstance(got, int) and not isinstance(got, bool), f"gpt_param_count must return an int, got {type(got).__name__}")
    fields = (f"vocab_size={cfg.vocab_size}, max_positions={cfg.max_positions}, d_model={cfg.d_model}, "
              f"n_layers={cfg.n_layers}, ff_size={cfg.ff_size}, tie_embeddings={cfg.tie_embeddings}, "
              f"final_norm={cfg.final_norm}")
    expect_true(got == want, f"for {fields} expected {want:,} parameters, got {got:,} (off by {got - want:+,})")


_SMALL = GPTConfig(vocab_size=101, max_positions=17, d_model=24, n_layers=3, n_heads=4)

register(Exercise(
    id="9.4",
    title="Count a GPT's parameters in closed form",
    targets=("gpt_param_count",),
    forbidden=("companion.models",),  # the reference itself
    cases=(
        Case("a small GPT-2 style config", 2, lambda s: _count_case(s, _SMALL)),
        Case("d_ff different from 4 * d_model", 1, lambda s: _count_case(s, dataclasses.replace(_SMALL, d_ff=50))),
        Case("untied output layer", 1, lambda s: _count_case(s, dataclasses.replace(_SMALL, tie_embeddings=False))),
        Case("GPT-1 style: no final LayerNorm", 1, lambda s: _count_case(s, dataclasses.replace(_SMALL, norm_first=False, final_norm=False))),
        Case("GPT-2 XL", 1, lambda s: _count_case(s, GPTConfig(vocab_size=50257, max_positions=1024, d_model=1600, n_layers=48, n_heads=25)), timeout=30.0),
    ),
))


# ----------------------------------------------------------------- 9.5 your GPT

# MyGPT names its modules as the chapter's MiniGPT does, and those names are the reference's
# state-dict keys (companion.models.gpt.GPT): the name map of the statement is the identity, so
# the expected layout is the reference's own state dict.
_GPT_A = GPTConfig(vocab_size=101, max_positions=13, d_model=24, n_layers=2, n_heads=3)
_GPT_B = GPTConfig(vocab_size=37, max_positions=11, d_model=20, n_layers=3, n_heads=5)
_LAYOUT_HINT = ("name the modules as the chapter's MiniGPT: tok_emb, pos_emb, blocks.{i}.norm1, "
                "blocks.{i}.self_attn.qkv, blocks.{i}.self_attn.out, blocks.{i}.norm2, blocks.{i}.ffn.up, "
                "blocks.{i}.ffn.down, norm_f, lm_head")


def _cfg_text(cfg: GPTConfig) -> str:
    return (f"V={cfg.vocab_size}, max_positions={cfg.max_positions}, D={cfg.d_model}, "
            f"L={cfg.n_layers}, H={cfg.n_heads}")


def _expected_layout(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in GPT(cfg).state_dict().items()}


def _parameter_names(model) -> list[str]:
    """Runs where the student's model lives: its parameter names (a tied weight once)."""
    return [name for name, _ in model.named_parameters()]


def _build_gpt(cls, cfg: GPTConfig):
    """``cls(cfg)`` with its layout checked: every reference name with its shape, no other parameter."""
    model = cls(cfg)
    state = model.state_dict()
    if not isinstance(state, dict):
        raise CheckFailed(f"MyGPT(cfg).state_dict() should be a dict of tensors, got {type(state).__name__}")
    want = _expected_layout(cfg)
    missing = [k for k in want if k not in state]
    if missing:
        more = f" (and {len(missing) - 1} more names)" if len(missing) > 1 else ""
        raise CheckFailed(f"for {_cfg_text(cfg)}, MyGPT has no {missing[0]} of shape {want[missing[0]]}{more}: "
                          f"{_LAYOUT_HINT}")
    for name, shape in want.items():
        got = tuple(getattr(state[name], "shape", ()))
        if got != shape:
            raise CheckFailed(f"for {_cfg_text(cfg)}, {name} should have shape {shape}, got {got}")
    extra = [n for n in run_student(_parameter_names, model) if n not in want]
    if extra:
        raise CheckFailed(f"MyGPT has a parameter {extra[0]} that the reference GPT does not have; "
                          f"the model holds exactly these: {_LAYOUT_HINT} (biases in every nn.Linear but lm_head)")
    return model


def _reference_gpt(cfg: GPTConfig, seed: int) -> GPT:
    """A reference GPT with every weight moved by noise (LayerNorms off 1 and 0, so a swap shows)."""
    torch.manual_seed(seed)
    ref = GPT(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return ref


def _gpt_with_reference_weights(cls, cfg: GPTConfig, seed: int):
    """The student's model holding the reference's weights (through the name map), and the reference."""
    model = _build_gpt(cls, cfg)
    ref = _reference_gpt(cfg, seed)
    state = dict(model.state_dict())  # keeps any buffer of the student's own (a mask, say)
    state.update({k: v.detach().clone() for k, v in ref.state_dict().items()})
    model.load_state_dict(state)
    return model, ref


def _gpt_logits(cls, formula, cfg: GPTConfig, seed: int, t: int):
    model, ref = _gpt_with_reference_weights(cls, cfg, seed)
    idx = torch.randint(0, cfg.vocab_size, (2, t), generator=torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        want = ref(idx)
        got = model(idx)
    expect_tensor(got, want, name=f"logits of MyGPT ({_cfg_text(cfg)}) on token ids of shape (2, {t}), "
                                  "with the reference's weights", atol=1e-4)


def _gpt_layout(cls, formula):
    _build_gpt(cls, _GPT_A)
    _build_gpt(cls, _GPT_B)


def _gpt_causal(cls, formula):
    model, _ = _gpt_with_reference_weights(cls, _GPT_A, 3)
    idx = torch.randint(0, _GPT_A.vocab_size, (2, 13), generator=torch.Generator().manual_seed(4))
    later = idx.clone()
    later[:, 8:] = (idx[:, 8:] + 1) % _GPT_A.vocab_size  # change tokens 8..12 only
    with torch.no_grad():
        a, b = model(idx), model(later)
    shape = (2, 13, _GPT_A.vocab_size)
    for out in (a, b):
        expect_true(isinstance(out, torch.Tensor) and tuple(out.shape) == shape,
                    f"the logits must have shape {shape}, got {tuple(getattr(out, 'shape', ())) or type(out).__name__}")
    moved = (a[:, :8] - b[:, :8]).abs().max().item()
    expect_true(moved < 1e-5, f"changing tokens 8..12 changed the logits of tokens 0..7 by up to {moved:.3g}: "
                              "every attention layer must be causal (position i sees j <= i only)")


def _tie_probe(model) -> str:
    """Runs where the student's model lives: "" if moving tok_emb.weight moves lm_head.weight, else why not."""
    try:
        emb, head = model.tok_emb.weight, model.lm_head.weight
    except AttributeError as err:
        return f"MyGPT needs tok_emb and lm_head, each with a weight ({err})"
    with torch.no_grad():
        before = head.detach().clone()
        emb[0, 0] += 1.0
        moved = not torch.equal(head.detach(), before)
        emb[0, 0] -= 1.0
    return "" if moved else ("changing tok_emb.weight left lm_head.weight unchanged: tie the head to the token "
                             "embedding (self.lm_head.weight = self.tok_emb.weight), one tensor used twice")


def _gpt_tied(cls, formula):
    model = _build_gpt(cls, _GPT_A)
    why = run_student(_tie_probe, model)
    expect_true(why == "", str(why))


def _n_parameters(model) -> int:
    """Runs where the student's model lives: its number of parameters, a tied weight counted once."""
    return sum(p.numel() for p in model.parameters())


def _gpt_count(cls, formula):
    cfg = _GPT_B
    model = _build_gpt(cls, cfg)
    got = run_student(_n_parameters, model)
    try:
        yours = formula(cfg)
    except Exception as err:  # noqa: BLE001 - the student's 9.4, a stub or a bug: say which function failed
        text = getattr(err, "description", "") or describe_exception(err)
        raise CheckFailed(f"this case compares MyGPT with your gpt_param_count of exercise 9.4, which failed: {text}") from None
    with torch.device("meta"):
        want = count_parameters(GPT(cfg))
    expect_true(got == want, f"MyGPT({_cfg_text(cfg)}) has {got:,} parameters, the reference GPT {want:,} "
                             f"(off by {got - want:+,}); the tied head must not add a second V x D matrix")
    expect_true(yours == want, f"MyGPT has {got:,} parameters, as it should, but your gpt_param_count(cfg) of "
                               f"exercise 9.4 says {yours!r} for {_cfg_text(cfg)}: fix your formula")


register(Exercise(
    id="9.5",
    title="Your GPT",
    targets=("MyGPT", "gpt_param_count"),
    forbidden=("companion.models", "companion.attention", "companion.blocks", "companion.moe"),  # GPT and its parts
    cases=(
        Case("module names and shapes are the chapter's MiniGPT's", 2, _gpt_layout),
        Case("with the reference's weights, the same logits (V=101, T=13, D=24, H=3, L=2)", 3,
             lambda cls, f: _gpt_logits(cls, f, _GPT_A, 1, 13)),
        Case("the same logits with five heads, three layers and T=7 < max_positions", 2,
             lambda cls, f: _gpt_logits(cls, f, _GPT_B, 2, 7)),
        Case("changing a later token leaves earlier logits unchanged", 2, _gpt_causal),
        Case("the head is tied to the token embedding", 2, _gpt_tied),
        Case("its parameter count equals your 9.4 formula", 1, _gpt_count),
    ),
))


# ----------------------------------------------------------------- 9.6 your training loop

# The run the check asks for: the student's train(model, train_ids, steps, batch_size, seq_len, lr, seed)
# on a reference GPT (so that only the loop is judged) of 2 blocks of width 48 reading 32 characters.
_LOOP = {"batch_size": 16, "seq_len": 32, "lr": 3e-3, "seed": 0}
_LOOP_STEPS = 200
_LOOP_INIT_SEED = 1234  # the model's initial weights
_LEAK_STEPS = 100
_VAL_CHARS = 16_385  # the held-out text the check scores: the first 16,385 characters of the validation part
# The chapter's five-step loop (AdamW at lr 3e-3, zero_grad, backward, step; the solution's train) reached
# 2.481 to 2.559 nats per character on that text after 200 steps, over 10 seeds of its batches and of the
# model's initial weights (1 thread, about 1.5 s of CPU per run); the band adds a margin of 0.14. A loop that
# never clears its gradients ends at 3.5 to 3.8 in the same run, one that never steps at 4.5.
_REFERENCE_RANGE = (2.48, 2.56)
_LOSS_BAND = 2.70


@functools.lru_cache(maxsize=1)
def _corpus() -> tuple[int, torch.Tensor, torch.Tensor]:
    """(vocabulary size, training ids, validation ids) of the chapter's character-level corpus."""
    from ..data import CharTokenizer, load_pydoc_text, train_val_split

    text = load_pydoc_text()
    tok = CharTokenizer(text)
    train_ids, val_ids = train_val_split(tok.encode(text), 0.1)
    return tok.vocab_size, train_ids, val_ids


def _loop_cfg() -> GPTConfig:
    return GPTConfig(vocab_size=_corpus()[0], max_positions=_LOOP["seq_len"], d_model=48, n_layers=2, n_heads=4)


def _train_in_student(train, steps: int, batch_size: int, seq_len: int, lr: float, seed: int) -> dict:
    """Runs where the student's code lives: build the model, run their loop on it, return plain data.

    A hook on one weight sees every backward pass: it records a pass that finds the weight moved
    since the previous pass (an optimizer step came between) while its ``.grad`` still holds
    something, i.e. gradients that were never cleared.
    """
    torch.manual_seed(_LOOP_INIT_SEED)
    model = GPT(_loop_cfg())
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    watched = model.blocks[0].ffn.up.weight
    probe = {"forward": 0, "backward": 0, "stale": 0}
    last: list[torch.Tensor | None] = [None]

    def on_grad(grad):
        probe["backward"] += 1
        value = watched.detach()
        if (last[0] is not None and not torch.equal(value.cpu(), last[0]) and watched.grad is not None
                and bool(watched.grad.abs().max() > 0)):
            probe["stale"] += 1
        last[0] = value.cpu().clone()

    def on_forward(module, args):
        probe["forward"] += 1

    hooks = [watched.register_hook(on_grad), model.register_forward_pre_hook(on_forward)]
    try:
        losses = train(model, _corpus()[1].clone(), steps, batch_size, seq_len, lr, seed)
    finally:
        for h in hooks:
            h.remove()
    try:
        losses = [float(v) for v in losses]
    except Exception:  # noqa: BLE001 - not a list of numbers: the case says what came
        losses = type(losses).__name__
    final = {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}
    return {"initial": initial, "final": final, "losses": losses, "probe": probe}


def _run_loop(train, steps: int) -> dict:
    out = run_student(_train_in_student, train, steps, **_LOOP)
    ok = (isinstance(out, dict) and isinstance(out.get("initial"), dict) and isinstance(out.get("final"), dict)
          and isinstance(out.get("probe"), dict))
    expect_true(ok, "the training run sent back nothing usable (did train replace the model's state?)")
    return out


def _loop_call(steps: int) -> str:
    b, t, lr, seed = _LOOP["batch_size"], _LOOP["seq_len"], _LOOP["lr"], _LOOP["seed"]
    return f"train(model, train_ids, steps={steps}, batch_size={b}, seq_len={t}, lr={lr:g}, seed={seed})"


def _never_stepped(out: dict, steps: int) -> str:
    """The message for a loop that did not update the weights, or ""."""
    if out["probe"].get("forward", 0) == 0:
        return f"{_loop_call(steps)} never called the model it was given: train that model, do not build another"
    initial, final = out["initial"], out["final"]
    changed = [k for k in initial if k in final and not torch.equal(initial[k], final[k])]
    if not changed:
        return (f"after {_loop_call(steps)} every weight equals its initial value: the loop never updated the "
                "model. Build the optimizer on model.parameters() and call optimizer.step() after loss.backward()")
    return ""


def _trained(out: dict) -> GPT:
    model = GPT(_loop_cfg()).eval()
    try:
        model.load_state_dict(out["final"])
    except Exception as err:  # noqa: BLE001 - the loop replaced or reshaped the model's weights
        raise CheckFailed(f"the model's weights after training do not fit the model any more ({str(err)[:200]})") from None
    finite = all(torch.isfinite(v).all() for v in out["final"].values() if v.is_floating_point())
    expect_true(finite, "after training the model's weights hold NaN or inf: the loss diverged (is lr the one given?)")
    return model


@torch.no_grad()
def _copy_losses(model: GPT) -> tuple[float, float]:
    """Cross-entropy of the trained model, on held-out windows, for the token AT each position and the one BEFORE it.

    A model trained on next-token targets is poor at both (it was never asked for them); one whose
    targets leaked into its inputs learns to copy a token it sees, and scores far below its next-token loss.
    """
    ids = _corpus()[2][:_VAL_CHARS]
    t = _LOOP["seq_len"]
    n = (len(ids) - 1) // t
    x = ids[1 : n * t + 1].view(n, t)  # (N, T): windows starting at the second id, so each has a "before"
    before = ids[: n * t].view(n, t)
    logp = model(x).log_softmax(-1)  # (N, T, V)
    at = -logp.gather(-1, x[..., None]).mean().item()
    prev = -logp.gather(-1, before[..., None]).mean().item()
    return at, prev


def _leaked(model: GPT, held_out: float) -> str:
    at, prev = _copy_losses(model)
    if min(at, prev) < min(held_out - 1.0, 2.0):
        which = "the token at the same position" if at <= prev else "the token just before"
        return (f"the trained model predicts {which} ({min(at, prev):.2f} nats per character), a token it can see, "
                f"far better than the next one ({held_out:.2f} nats): the targets leaked into the inputs. With inputs "
                "x = ids[i : i + seq_len] the targets are the next tokens, y = ids[i + 1 : i + seq_len + 1]")
    return ""


def _held_out(model: GPT) -> float:
    return evaluate_lm(model, _corpus()[2][:_VAL_CHARS], _LOOP["seq_len"])


def _loop_steps(train):
    out = _run_loop(train, 3)
    why = _never_stepped(out, 3)
    expect_true(why == "", why)


def _loop_losses(train):
    out = _run_loop(train, 3)
    losses = out["losses"]
    expect_true(isinstance(losses, list) and len(losses) == 3,
                f"{_loop_call(3)} should return its 3 training losses (a list of numbers, one per step), got "
                f"{f'a list of {len(losses)}' if isinstance(losses, list) else losses}")
    expect_true(all(1.0 < v < 10.0 for v in losses),
                f"the 3 losses returned, {[round(v, 3) for v in losses]}, are not those of a fresh model "
                f"(about ln {_corpus()[0]} = 4.6 nats per character): return loss.item() of each step")


def _loop_zero_grad(train):
    steps = 5
    out = _run_loop(train, steps)
    why = _never_stepped(out, steps)
    expect_true(why == "", f"{why} (so the gradients cannot be checked)")
    probe = out["probe"]
    expect_true(probe.get("backward", 0) >= 2, f"{_loop_call(steps)} ran {probe.get('backward', 0)} backward passes, "
                                               "expected one per step")
    expect_true(probe.get("stale", 0) == 0,
                f"the gradients were never cleared: in {probe['stale']} of {probe['backward']} backward passes the "
                "gradient of a weight still held the earlier steps' gradients after an optimizer step (backward adds "
                "to .grad). Call optimizer.zero_grad() once per step, before loss.backward()")


def _loop_no_leak(train):
    out = _run_loop(train, _LEAK_STEPS)
    why = _never_stepped(out, _LEAK_STEPS)
    expect_true(why == "", why)
    model = _trained(out)
    why = _leaked(model, _held_out(model))
    expect_true(why == "", why)


def _loop_learns(train):
    out = _run_loop(train, _LOOP_STEPS)
    why = _never_stepped(out, _LOOP_STEPS)
    expect_true(why == "", why)
    model = _trained(out)
    held_out = _held_out(model)
    why = _leaked(model, held_out)
    expect_true(why == "", why)
    if held_out >= _LOSS_BAND:
        hint = ("the gradients were never cleared (see that case)" if out["probe"].get("stale", 0)
                else "check the learning rate, that each step draws a new random batch, and that the loss is the "
                     "mean cross-entropy of the logits (B, T, V) against the next tokens (B, T)")
        raise CheckFailed(f"after {_loop_call(_LOOP_STEPS)} the held-out loss is {held_out:.3f} nats per character; "
                          f"the chapter's loop reaches {_REFERENCE_RANGE[0]:.2f} to {_REFERENCE_RANGE[1]:.2f} in the "
                          f"same steps and this case needs below {_LOSS_BAND:.2f}: {hint}")


register(Exercise(
    id="9.6",
    title="Your training loop",
    targets=("train",),
    # the course's loop, loss, batches and models would do the work
    forbidden=("companion.training", "companion.models", "companion.experiments", "companion.data.random_batch"),
    cases=(
        Case("three steps update the weights", 2, _loop_steps),
        Case("returns one training loss per step", 1, _loop_losses),
        Case("clears the gradients between steps", 2, _loop_zero_grad),
        Case("targets are the next tokens, not leaked into the inputs", 2, _loop_no_leak, timeout=30.0),
        Case(f"{_LOOP_STEPS} steps bring the held-out loss below {_LOSS_BAND:.2f} nats per character", 4, _loop_learns,
             timeout=60.0),
    ),
))
