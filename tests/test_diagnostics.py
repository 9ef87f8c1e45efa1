"""companion.diagnostics: gradient measurements on the depth experiments' SmallLM."""

import pytest
import torch
import torch.nn.functional as F

from companion.diagnostics import (
    block_grad_norms,
    grad_profile,
    lm_loss,
)
from companion.models.small_lm import SmallLM, SmallLMConfig
from companion.viz import grad_profile_explorer, plot_grad_profiles

V, T = 11, 7


def batch(b=3, t=T, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(V, (b, t), generator=g)
    return x, torch.randint(V, (b, t), generator=g)


def cfg(**kw):
    base = dict(vocab_size=V, max_positions=13, n_layers=3, d_model=12, n_heads=3, d_ff=29)
    return SmallLMConfig(**{**base, **kw})


@pytest.mark.parametrize("norm_first", [True, False])
def test_stack_is_causal(norm_first):
    torch.manual_seed(0)
    model = SmallLM(cfg(norm_first=norm_first))
    x, _ = batch()
    x2 = x.clone()
    x2[:, -1] = (x2[:, -1] + 1) % V
    out, out2 = model(x), model(x2)
    assert out.shape == (3, T, V)
    torch.testing.assert_close(out[:, :-1], out2[:, :-1], rtol=1e-5, atol=1e-5)
    assert (out[:, -1] - out2[:, -1]).abs().max() > 1e-4


def test_final_norm_follows_the_placement_unless_given():
    assert isinstance(SmallLM(cfg(norm_first=True)).norm_f, torch.nn.LayerNorm)  # GPT-2's ln_f
    assert isinstance(SmallLM(cfg(norm_first=False)).norm_f, torch.nn.Identity)
    assert isinstance(SmallLM(cfg(norm_first=False, final_norm=True)).norm_f, torch.nn.LayerNorm)


def test_lm_loss_is_cross_entropy_and_uniform_at_zero_logits():
    torch.manual_seed(0)
    model = SmallLM(cfg())
    x, y = batch()
    want = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    torch.testing.assert_close(lm_loss(model, (x, y)), want)
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.bias.zero_()
    torch.testing.assert_close(lm_loss(model, (x, y)), torch.log(torch.tensor(float(V))))


def test_block_grad_norms_equal_norm_of_concatenated_gradients():
    torch.manual_seed(0)
    model = SmallLM(cfg())
    lm_loss(model, batch()).backward()
    got = block_grad_norms(model)
    for i, block in enumerate(model.blocks):
        flat = torch.cat([p.grad.flatten() for p in block.parameters()])
        torch.testing.assert_close(got[i], flat.norm())
    torch.testing.assert_close(block_grad_norms(model, "ffn.down.weight")[1], model.blocks[1].ffn.down.weight.grad.norm())
    with pytest.raises(ValueError, match="no parameter 'nope'"):
        block_grad_norms(model, "nope")


def test_block_grad_norms_needs_backward():
    with pytest.raises(ValueError, match="backward"):
        block_grad_norms(SmallLM(cfg()))


@pytest.mark.parametrize("norm_first", [True, False])
def test_grad_profile_matches_an_independent_autograd_computation(norm_first):
    c = cfg(norm_first=norm_first)
    x, y = batch()
    prof = grad_profile(c, (x, y), seeds=(4,))
    assert prof.block.shape == (1, 3) and prof.stream.shape == (1, 4) and prof.stream_rms.shape == (1, 4)
    torch.manual_seed(4)
    model = SmallLM(c)
    # the residual stream written out: x_0 = token + position embeddings, x_l = block l's output
    hidden = [model.tok_emb(x) + model.pos_emb.weight[: x.shape[1]]]
    for block in model.blocks:
        hidden.append(block(hidden[-1], is_causal=True))
    logits = model.lm_head(model.norm_f(hidden[-1]))
    torch.testing.assert_close(logits, model(x), rtol=0, atol=0)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    w2_params = [b.ffn.down.weight for b in model.blocks]
    grads = torch.autograd.grad(loss, hidden + w2_params)
    # gradients: autograd.grad of a subset may take other kernels than backward(), so up to rounding
    torch.testing.assert_close(prof.stream[0], torch.stack([g.norm() for g in grads[:4]]))
    torch.testing.assert_close(prof.w2[0], torch.stack([g.norm() for g in grads[4:]]))
    # the forward pass is the same computation as grad_profile's: the same bits
    torch.testing.assert_close(prof.loss[0], loss.detach(), rtol=0, atol=0)
    torch.testing.assert_close(prof.stream_rms[0], torch.stack([h.detach().pow(2).mean().sqrt() for h in hidden]),
                               rtol=0, atol=0)


def test_post_ln_stream_has_unit_rms_and_pre_ln_stream_grows():
    """A LayerNorm output with unit weight and zero bias has RMS 1; pre-LN adds to its stream."""
    x, y = batch(t=13)
    post = grad_profile(cfg(norm_first=False, n_layers=4), (x, y), seeds=2)
    torch.testing.assert_close(post.stream_rms[:, 1:], torch.ones(2, 4), rtol=1e-3, atol=1e-3)
    pre = grad_profile(cfg(norm_first=True, n_layers=4), (x, y), seeds=2)
    assert (pre.stream_rms[:, 1:] > pre.stream_rms[:, :-1]).all()


def test_grad_profile_is_deterministic_per_seed():
    b = batch()
    p1, p2 = grad_profile(cfg(), b, seeds=(0, 1)), grad_profile(cfg(), b, seeds=(0, 1))
    torch.testing.assert_close(p1.w2, p2.w2)
    assert not torch.allclose(p1.w2[0], p1.w2[1])


def test_config_errors():
    with pytest.raises(ValueError, match="d_model=10 is not divisible by n_heads=3"):
        cfg(d_model=10)
    with pytest.raises(ValueError, match="init must be"):
        cfg(init="he")
    with pytest.raises(TypeError, match="n_layers must be a positive int"):
        cfg(n_layers=2.0)
    with pytest.raises(ValueError, match="cannot index beyond their table"):
        SmallLM(cfg())(torch.zeros(1, 14, dtype=torch.long))


def test_plot_grad_profiles_draws_one_line_per_profile_and_checks_quantity():
    import matplotlib

    matplotlib.use("Agg")
    profs = {"post-LN": grad_profile(cfg(norm_first=False), batch(), seeds=1),
             "pre-LN": grad_profile(cfg(norm_first=True), batch(), seeds=1)}
    ax = plot_grad_profiles(profs, "stream")
    assert len(ax.lines) == 2 and len(ax.lines[0].get_xdata()) == 4  # x_0 .. x_3
    torch.testing.assert_close(torch.tensor(ax.lines[1].get_ydata(), dtype=torch.float32), profs["pre-LN"].stream[0])
    with pytest.raises(ValueError, match="quantity must be one of"):
        plot_grad_profiles(profs, "loss")


def test_grad_profile_explorer_builds_a_widget():
    import matplotlib

    matplotlib.use("Agg")
    pytest.importorskip("ipywidgets")
    widget = grad_profile_explorer(V, batch(), seeds=1)
    assert len(widget.children) == 4


def test_seeded_model_and_first_batch_reproduce_the_shipped_warmup_runs():
    """scripts/ch05_warmup.py recorded each run's loss before its first step: the same seed gives the same model."""
    from companion.data import CharTokenizer, load_pydoc_text, random_batch, train_val_split
    from companion.diagnostics import load_warmup_results

    shipped = load_warmup_results()
    text = load_pydoc_text()
    tok = CharTokenizer(text)
    train_ids, _ = train_val_split(tok.encode(text))
    firsts = {(r["n_layers"], r["norm_first"], r["seed"]): r["train_loss"][0] for r in shipped["runs"]}
    assert len(firsts) == 12  # 6 and 12 layers, post-LN and pre-LN, seeds 0-2 (the warm-up differs only later)
    for (n_layers, norm_first, seed), recorded in firsts.items():
        c = SmallLMConfig(vocab_size=tok.vocab_size, n_layers=n_layers, norm_first=norm_first, **shipped["settings"])
        torch.manual_seed(seed)  # as warmup_run: the model, then the first training batch of its generator
        model = SmallLM(c)
        batch = random_batch(train_ids, c.max_positions, shipped["run"]["batch_size"], torch.Generator().manual_seed(seed))
        with torch.no_grad():
            assert abs(lm_loss(model, batch).item() - recorded) < 1e-5, (n_layers, norm_first, seed)


def test_seed_spread_gives_mean_min_and_max_and_refuses_no_seeds():
    from companion.experiments import seed_spread

    assert seed_spread([0.5, 0.25, 1.0]) == {"mean": 0.5833, "min": 0.25, "max": 1.0}  # 1.75 / 3
    with pytest.raises(ValueError, match="at least one seed"):
        seed_spread([])
