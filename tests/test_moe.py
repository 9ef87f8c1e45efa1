"""Mixture of experts (companion.moe): routing, capacity, auxiliary losses, batched = loop = Hugging Face."""

from __future__ import annotations

import re

import pytest
import torch

from companion.moe import (MoEFeedForward, expert_capacity, from_hf_switch_mlp, hf_switch_has_capacity,
                           load_balancing_loss, moe_gpt, MoEConfig, moe_reference, route_top1, route_top2,
                           router_z_loss)

transformers = pytest.importorskip("transformers")


def test_load_balancing_loss_is_one_at_uniform_routing_and_e_when_collapsed():
    e, t = 4, 8
    probs = torch.full((2, t, e), 1 / e)
    choice = (torch.arange(t) % e).expand(2, t).unsqueeze(-1)  # every expert chosen by a quarter of the tokens
    assert load_balancing_loss(probs, choice).item() == pytest.approx(1.0, abs=1e-7)
    collapsed_probs = torch.zeros(2, t, e)
    collapsed_probs[..., 0] = 1.0
    assert load_balancing_loss(collapsed_probs, torch.zeros(2, t, 1, dtype=torch.long)).item() == pytest.approx(e)


def test_auxiliary_losses_equal_hugging_face():
    from transformers.models.switch_transformers.modeling_switch_transformers import (load_balancing_loss_func,
                                                                                      router_z_loss_func)
    logits = torch.randn(3, 10, 5, generator=torch.Generator().manual_seed(0)) * 3
    probs = logits.softmax(-1)
    choice = probs.argmax(-1)
    torch.testing.assert_close(load_balancing_loss(probs, choice.unsqueeze(-1)), load_balancing_loss_func(probs, choice))
    torch.testing.assert_close(router_z_loss(logits), router_z_loss_func(logits))


def test_capacity_serves_tokens_in_order_and_drops_the_rest():
    # 5 tokens all prefer expert 1; capacity 2: tokens 0 and 1 are served, 2-4 dropped
    logits = torch.tensor([[[0.0, 5.0, 0.0]] * 5])
    r = route_top1(logits, capacity=2)
    assert r.dispatch[0, :, 1].tolist() == [True, True, False, False, False]
    assert not r.dispatch[0, :, [0, 2]].any()
    assert torch.allclose(r.combine[0, :2, 1], logits[0, :2].softmax(-1)[:, 1])
    assert (r.combine[0, 2:] == 0).all()
    assert expert_capacity(64, 8, 1.25) == 10 and expert_capacity(5, 3, 1.0) == 2


def test_top2_serves_every_first_choice_before_second_choices():
    # expert 0 is everyone's second choice; token 2 has it as first choice; capacity 1
    logits = torch.tensor([[[2.0, 3.0, 0.0], [2.0, 0.0, 3.0], [3.0, 2.0, 0.0]]])
    r = route_top2(logits, capacity=1)
    assert r.dispatch[0, 2, 0] and not r.dispatch[0, 0, 0] and not r.dispatch[0, 1, 0]
    p = logits.softmax(-1)[0, 2]
    # token 2: first choice 0 (served), second choice 1 (token 0 took expert 1 first): weight 0
    assert r.combine[0, 2, 0].item() == pytest.approx((p[0] / (p[0] + p[1])).item())
    assert r.combine[0, 2, 1].item() == 0.0


@pytest.mark.parametrize("top_k,factor", [(1, 1.0), (1, 0.5), (2, 1.0), (2, 0.6)])
def test_batched_experts_equal_the_per_token_loop(top_k, factor):
    torch.manual_seed(0)
    layer = MoEFeedForward(8, 16, 4, top_k=top_k, capacity_factor=factor)
    x = torch.randn(3, 11, 8)
    out = layer(x)
    torch.testing.assert_close(out, moe_reference(layer, x), atol=1e-6, rtol=1e-6)
    dropped = ~layer.last_routing.dispatch.any(-1)
    if factor < 1:
        assert dropped.any()  # a small capacity drops tokens ...
        assert (out[dropped] == 0).all()  # ... whose output is zero: the residual carries them
    assert set(layer.aux) == {"load_balancing", "z"}


def test_gradients_reach_the_router_through_the_combine_weights():
    torch.manual_seed(1)
    layer = MoEFeedForward(8, 16, 4)
    layer(torch.randn(2, 6, 8)).sum().backward()
    assert layer.router.weight.grad is not None and layer.router.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("capacity", [64, 3])
def test_equal_to_hugging_face_switch_sparse_mlp(capacity):
    if capacity == 3 and not hf_switch_has_capacity():
        pytest.skip(f"transformers {transformers.__version__}'s Switch layer drops no token (5.0 to 5.17); "
                    "test_hf_switch_capacity_of_the_installed_release_is_what_its_layer_does checks that")
    cfg = transformers.SwitchTransformersConfig(d_model=16, d_ff=32, num_experts=4, expert_capacity=capacity,
                                                dropout_rate=0.0, router_jitter_noise=0.0)
    from transformers.models.switch_transformers.modeling_switch_transformers import SwitchTransformersSparseMLP
    torch.manual_seed(0)
    hf = SwitchTransformersSparseMLP(cfg).eval()
    with torch.no_grad():
        hf.router.classifier.weight.normal_(0, 1.0)  # a confident router, so that capacity 3 drops tokens
    ours = from_hf_switch_mlp(hf, capacity=capacity)
    x = torch.randn(2, 12, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref, out = hf(x), ours(x)
    ref = ref[0] if isinstance(ref, tuple) else ref  # transformers 4.x returns (output, (router logits, indices))
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    if capacity == 3:
        assert (~ours.last_routing.dispatch.any(-1)).any()


def test_bad_inputs():
    with pytest.raises(ValueError, match="top_k"):
        MoEFeedForward(8, 16, 4, top_k=3)
    with pytest.raises(ValueError, match="capacity_factor"):
        expert_capacity(8, 2, 0.0)
    with pytest.raises(ValueError, match=r"choice must be an integer tensor \(B, T, k\) = \(2, 5, k\)"):
        load_balancing_loss(torch.rand(2, 5, 3), torch.zeros(2, 5, dtype=torch.long))  # (B, T): missing k
    with pytest.raises(ValueError, match="choice"):
        load_balancing_loss(torch.rand(2, 5, 3), torch.zeros(2, 5, 1))  # float indices
    with pytest.raises(ValueError, match=r"\(B, T, 8\)"):
        MoEFeedForward(8, 16, 4)(torch.randn(3, 8))


def test_moe_gpt_trains_and_reports_auxiliary_losses():
    from companion.models.gpt import GPT, GPTConfig
    from companion.calculators import count_parameters
    from companion.moe import MoEConfig, moe_aux_loss, moe_gpt

    torch.manual_seed(0)
    dense = GPT(GPTConfig(vocab_size=20, max_positions=16, d_model=16, n_layers=2, n_heads=2))
    moe = moe_gpt(GPTConfig(vocab_size=20, max_positions=16, d_model=16, n_layers=2, n_heads=2), MoEConfig(n_experts=4))
    assert all(isinstance(b.ffn, MoEFeedForward) for b in moe.blocks)
    ffn_params = count_parameters(dense.blocks[0].ffn)  # each expert is one dense FFN
    expert_params = count_parameters(moe.blocks[0].ffn.experts[0])
    assert expert_params == ffn_params
    assert count_parameters(moe) - count_parameters(dense) == 2 * (3 * ffn_params + 16 * 4)  # 3 more experts + router
    idx = torch.randint(0, 20, (3, 12))
    logits = moe(idx)
    aux = moe_aux_loss(moe)
    assert logits.shape == (3, 12, 20) and aux.item() > 0
    (logits.logsumexp(-1).mean() + aux).backward()
    assert moe.blocks[0].ffn.router.weight.grad is not None
    assert moe_aux_loss(dense).item() == 0.0


@pytest.mark.parametrize("top_k", [1, 2])
def test_flops_counted_by_torch_equal_the_formula(top_k):
    from torch.utils.flop_counter import FlopCounterMode

    from companion.moe import moe_layer_flops

    torch.manual_seed(0)
    layer = MoEFeedForward(16, 48, 4, top_k=top_k, capacity_factor=4.0)  # capacity for every token: none dropped
    x = torch.randn(2, 10, 16)
    with FlopCounterMode(display=False) as counter:
        layer(x)
    assert not (~layer.last_routing.dispatch.any(-1)).any()
    assert counter.get_total_flops() == moe_layer_flops(16, 48, 4, top_k, tokens=20)


def test_active_and_total_parameters_by_hand():
    from companion.models.gpt import GPT, GPTConfig
    from companion.moe import MoEConfig, moe_gpt, moe_parameter_counts

    cfg = dict(vocab_size=20, max_positions=16, d_model=16, n_layers=2, n_heads=2, d_ff=32)
    dense = GPT(GPTConfig(**cfg))
    for top_k in (1, 2):
        moe = moe_gpt(GPTConfig(**cfg), MoEConfig(n_experts=4, top_k=top_k))
        counts = moe_parameter_counts(moe)
        expert = 16 * 32 + 32 + 32 * 16 + 16  # one FFN with biases
        router = 16 * 4
        assert counts["total"] == sum(p.numel() for p in moe.parameters())
        # active = the dense model with top_k FFNs per layer, plus the routers
        dense_total = sum(p.numel() for p in dense.parameters())
        assert counts["active"] == dense_total + 2 * ((top_k - 1) * expert + router)


def test_expert_load_and_drop_rate_equal_a_count_by_hand():
    from companion.moe import drop_rate, expert_load

    logits = torch.randn(3, 13, 5, generator=torch.Generator().manual_seed(2)) * 2
    for route, k in ((route_top1, 1), (route_top2, 2)):
        r = route(logits, capacity=2)
        choices = [int(e) for e in r.choice.flatten()]
        load = [choices.count(e) / len(choices) for e in range(5)]
        torch.testing.assert_close(expert_load(r), torch.tensor(load))
        refused = 0
        for b in range(3):
            for t in range(13):
                for j in range(k):
                    refused += not bool(r.dispatch[b, t, r.choice[b, t, j]])
        assert drop_rate(r) == pytest.approx(refused / (3 * 13 * k))
        assert 0 < drop_rate(r) < 1  # capacity 2 of 13 tokens per group must refuse some
    with pytest.raises(TypeError, match="Routing"):
        drop_rate(logits)


def test_top2_load_balancing_loss_equals_hugging_face_with_two_choices():
    from transformers.models.switch_transformers.modeling_switch_transformers import load_balancing_loss_func
    probs = (torch.randn(2, 9, 6, generator=torch.Generator().manual_seed(3)) * 2).softmax(-1)
    choice = probs.topk(2, dim=-1).indices  # (B, T, 2)
    torch.testing.assert_close(load_balancing_loss(probs, choice), load_balancing_loss_func(probs, choice))
    # each token counts for two experts: at uniform routing the loss is 2
    uniform = torch.full((1, 6, 3), 1 / 3)
    two = torch.tensor([[[0, 1], [1, 2], [2, 0], [0, 1], [1, 2], [2, 0]]])
    assert load_balancing_loss(uniform, two).item() == pytest.approx(2.0)


def test_moe_gpt_scales_expert_output_projections_like_the_dense_ffn():
    from companion.models.gpt import GPTConfig
    from companion.moe import MoEConfig, moe_gpt

    torch.manual_seed(0)
    cfg = dict(vocab_size=20, max_positions=16, d_model=64, n_layers=8, n_heads=2)
    moe = moe_gpt(GPTConfig(**cfg), MoEConfig(n_experts=3))
    want = 0.02 / (2 * 8) ** 0.5  # GPT-2's 1/sqrt(2 n_layers) on every residual projection
    for block in moe.blocks:
        for expert in block.ffn.experts:
            assert expert.down.weight.std().item() == pytest.approx(want, rel=0.1)
            assert expert.up.weight.std().item() == pytest.approx(0.02, rel=0.1)


@pytest.mark.parametrize("bad", [dict(top_k=3), dict(top_k=2, n_experts=1), dict(capacity_factor=0.0),
                                 dict(capacity_factor="1")])
def test_moe_config_rejects_bad_expert_settings(bad):
    from companion.moe import MoEConfig

    with pytest.raises(ValueError, match="top_k|capacity_factor"):
        MoEConfig(**{"n_experts": 4, **bad})


def test_gpt_knows_no_experts():
    """Chapter 14 composes: GPT takes its feed-forward factory; gpt.py neither imports companion.moe nor names experts."""
    import dataclasses
    import inspect

    from companion.models import gpt
    from companion.models.gpt import GPT, GPTConfig
    from companion.moe import MoEConfig, moe_gpt

    src = inspect.getsource(gpt)
    assert not re.search(r"^\s*(from|import) [.\w]*moe", src, re.M)  # no import of companion.moe, anywhere in it
    assert not re.search(r"^import re$", src, re.M)  # no regular expression over parameter names
    assert not {"n_experts", "expert_top_k", "capacity_factor"} & {f.name for f in dataclasses.fields(GPTConfig)}
    cfg = GPTConfig(vocab_size=20, max_positions=16, d_model=16, n_layers=2, n_heads=2)
    torch.manual_seed(0)
    dense = GPT(cfg)
    torch.manual_seed(0)
    explicit = GPT(cfg, ffn=gpt.dense_ffn)  # the default, passed by hand: the same model, weight for weight
    assert all(torch.equal(a, b) for a, b in zip(dense.state_dict().values(), explicit.state_dict().values()))
    moe = moe_gpt(cfg, MoEConfig(n_experts=2))
    assert all(isinstance(block.ffn, MoEFeedForward) and len(block.ffn.experts) == 2 for block in moe.blocks)
    with pytest.raises(TypeError, match="MoEConfig"):
        moe_gpt(cfg, {"n_experts": 2})


@pytest.mark.parametrize("version, has_capacity", [
    ("4.25.1", True), ("4.57.6", True), ("5.0.0", False), ("5.9.0", False), ("5.15.0", False),
    ("5.17.0", False), ("5.18.0", True), ("5.18.0.dev0", True), ("5.23.0", True), ("6.0.0", True),
])
def test_hf_switch_capacity_releases(version, has_capacity):
    # the releases read in transformers' source: 5.0 to 5.17 route the flattened batch and never drop a token
    assert hf_switch_has_capacity(version) is has_capacity


@pytest.mark.parametrize("bad", ["", "five", "v5.18", 5.18, b"5.18"])
def test_hf_switch_capacity_rejects_what_is_no_version(bad):
    with pytest.raises(ValueError, match="expected a transformers version"):
        hf_switch_has_capacity(bad)


def test_hf_switch_capacity_of_the_installed_release_is_what_its_layer_does():
    """The guard against the installed layer itself (tests/switch_parity.py; the Colab simulation runs the same
    comparison on a release without the per-sequence capacity, tests/test_colab.py)."""
    from switch_parity import compare

    result = compare()
    assert result["dropped"], "the check needs dropped tokens"
    assert result["equal"] is result["guard"], result


def _leak_logits():
    """B=1, T=4, E=3: token 0 prefers expert 0 then 1; tokens 1 and 3 choose expert 1 first, token 2 expert 2."""
    return torch.tensor([[[2.0, 1.0, -3.0], [-1.0, 2.0, 0.0], [-1.0, 0.0, 2.0], [-1.0, 2.0, 0.0]]])


def test_gshard_top2_order_lets_a_later_token_change_an_earlier_routing():
    logits = _leak_logits()
    later = logits.clone()
    later[0, 3] = torch.tensor([-1.0, 0.0, 2.0])  # only the last token changes its first choice
    before, after = route_top2(logits, capacity=2), route_top2(later, capacity=2)
    assert not before.dispatch[0, 0, 1] and after.dispatch[0, 0, 1]  # token 0's second choice depends on token 3
    causal_before, causal_after = (route_top2(x, capacity=2, causal=True) for x in (logits, later))
    assert causal_before.dispatch[0, 0, 1] and torch.equal(causal_before.dispatch[0, :3], causal_after.dispatch[0, :3])


@pytest.mark.parametrize("seed", range(5))
def test_causal_top2_routing_of_a_prefix_ignores_the_tokens_after_it(seed):
    g = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(3, 12, 4, generator=g)
    full = route_top2(logits, capacity=4, causal=True)
    for t in (1, 5, 11):
        prefix = route_top2(logits[:, :t], capacity=4, causal=True)
        assert torch.equal(full.dispatch[:, :t], prefix.dispatch)
        assert torch.equal(full.combine[:, :t], prefix.combine)


def test_moe_gpt_with_top2_is_causal():
    from companion.models.gpt import GPT, GPTConfig

    cfg = GPTConfig(vocab_size=11, max_positions=16, d_model=16, n_layers=2, n_heads=2, d_ff=32)
    torch.manual_seed(0)
    model = moe_gpt(cfg, MoEConfig(n_experts=4, top_k=2, capacity_factor=0.5)).eval()
    x = torch.randint(0, 11, (4, 16), generator=torch.Generator().manual_seed(1))
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % 11
    with torch.no_grad():
        # equal up to rounding: an expert's matrix product may round differently when it serves other rows
        torch.testing.assert_close(model(x)[:, :-1], model(y)[:, :-1], rtol=0, atol=1e-6)
