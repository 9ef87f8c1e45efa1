"""Mixture of experts: Switch-style routing with capacity, its auxiliary losses, top-2 routing (Chapter 14).

Fedus et al. (2022), "Switch Transformers", section 2. A **router** (a linear
layer, D -> E) scores each token for E expert feed-forward networks; with top-1
routing each token goes to its best expert only, and the expert's output is
multiplied by the router probability of that expert (so the router gets a
gradient). Each expert takes at most ``capacity`` tokens of a group (here: of a
sequence): tokens are served in order of position, and a token arriving at a
full expert is **dropped**: the layer outputs zero for it, so it passes through
the block's residual connection unchanged.

Two auxiliary losses keep the router healthy:

* the **load-balancing loss** (equations 4-6), ``E * sum_i f_i * P_i``, where
  ``f_i`` is the fraction of tokens whose top choice is expert i and ``P_i`` the
  mean router probability of expert i. It is exactly 1 when routing is uniform
  (``f_i = P_i = 1/E``) and grows as load concentrates;
* the **router z-loss** (Zoph et al., 2022, "ST-MoE"), the mean of
  ``logsumexp(logits)^2``, which keeps the logits small.

:func:`route_top1` and :func:`route_top2` compute the dispatch (which token goes
to which expert, after capacity) and the combine weights; :class:`MoEFeedForward`
is a drop-in for :class:`companion.blocks.FeedForward` that computes the experts
batched (each expert runs once on its gathered tokens; outputs are scattered
back with ``index_add``). :func:`moe_reference` is the obvious per-token loop it
is tested against. A GPT whose every feed-forward network is a mixture is
built by composition, :func:`moe_gpt` with a :class:`MoEConfig`: the course's
:class:`~companion.models.gpt.GPT` takes the factory of its feed-forward networks
and knows nothing of experts. Weights of Hugging Face's ``SwitchTransformersSparseMLP`` load
with :func:`from_hf_switch_mlp`.

Capacity is counted per call and sequence: in cached decoding (one new token per
call) a token always has a place, so a model whose prefill dropped tokens can
give slightly different logits decoded token by token than in one full pass.

Shape legend: B groups (sequences), T tokens per group, D model size, E experts.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_positive_int
from .blocks import FeedForward
from .models.gpt import GPT, GPTConfig

__all__ = ["MoEConfig", "moe_gpt", "moe_aux_loss", "moe_parameter_counts", "moe_layer_flops", "expert_capacity", "Routing", "route_top1", "route_top2", "load_balancing_loss", "router_z_loss",
           "expert_load", "drop_rate", "MoEFeedForward", "moe_reference", "from_hf_switch_mlp",
           "hf_switch_has_capacity", "HF_SWITCH_CAPACITY_RELEASES"]


def expert_capacity(tokens_per_group: int, n_experts: int, capacity_factor: float) -> int:
    """Tokens an expert may take from one group: ``ceil(capacity_factor * tokens_per_group / n_experts)``."""
    check_positive_int("tokens_per_group", tokens_per_group)
    check_positive_int("n_experts", n_experts)
    if not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be positive, got {capacity_factor!r}")
    return max(1, math.ceil(capacity_factor * tokens_per_group / n_experts))


class Routing(NamedTuple):
    dispatch: torch.Tensor  # (B, T, E) bool: token (b, t) is processed by expert e (after capacity)
    combine: torch.Tensor  # (B, T, E) float: the weight of expert e's output for the token (0 if not dispatched)
    probs: torch.Tensor  # (B, T, E) router probabilities
    choice: torch.Tensor  # (B, T, k) the experts each token chose, before capacity


def _check_logits(logits: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or not logits.is_floating_point():
        raise ValueError(f"router logits must be a float tensor (B, T, E), got {getattr(logits, 'shape', type(logits).__name__)}")


def _capacity_mask(one_hot: torch.Tensor, capacity: int, already: torch.Tensor | None = None) -> torch.Tensor:
    """Keep the first ``capacity`` tokens of each group per expert, in position order (after ``already`` taken)."""
    priority = torch.cumsum(one_hot, dim=1)  # (B, T, E): 1 for the first token choosing e, 2 for the second...
    if already is not None:
        priority = priority + already.unsqueeze(1)
    return one_hot.bool() & (priority <= capacity)


def route_top1(logits: torch.Tensor, capacity: int) -> Routing:
    """Switch routing: each token to its most probable expert, first come first served up to ``capacity``."""
    _check_logits(logits)
    check_positive_int("capacity", capacity)
    probs = logits.float().softmax(-1)  # router in float32 ("selective precision", section 2.4)
    choice = probs.argmax(-1, keepdim=True)  # (B, T, 1)
    one_hot = F.one_hot(choice[..., 0], logits.shape[-1])  # (B, T, E)
    dispatch = _capacity_mask(one_hot, capacity)
    combine = probs * dispatch  # the chosen expert's probability where it is served
    return Routing(dispatch, combine.to(logits.dtype), probs, choice)


def route_top2(logits: torch.Tensor, capacity: int, *, normalize: bool = True, causal: bool = False) -> Routing:
    """Top-2 routing: GShard's order by default, every token's first choice served before any second choice.

    The two weights are the two probabilities, renormalised to sum to 1 when
    ``normalize`` (as Mixtral does); a choice dropped by capacity weighs 0.

    GShard's order counts the first choices of the whole group before serving a
    second choice, so whether token t's second choice finds a place depends on
    the first choices of the tokens after it. In a causal language model that
    leaks the future into the routing of earlier tokens. With ``causal`` the
    choices are served in position order instead (token 0's first and second
    choice, then token 1's, ...), so a token's routing depends only on itself
    and the tokens before it.
    """
    _check_logits(logits)
    check_positive_int("capacity", capacity)
    e = logits.shape[-1]
    if e < 2:
        raise ValueError(f"top-2 routing needs at least 2 experts, got {e}")
    probs = logits.float().softmax(-1)
    top_p, choice = probs.topk(2, dim=-1)  # (B, T, 2)
    weights = top_p / top_p.sum(-1, keepdim=True) if normalize else top_p
    first, second = F.one_hot(choice[..., 0], e), F.one_hot(choice[..., 1], e)  # (B, T, E)
    if causal:
        b, t = choice.shape[:2]
        both = torch.stack([first, second], dim=2).reshape(b, 2 * t, e)  # first, second of token 0, then token 1...
        served = _capacity_mask(both, capacity).reshape(b, t, 2, e)
        served_first, served_second = served[:, :, 0], served[:, :, 1]
    else:
        served_first = _capacity_mask(first, capacity)
        taken = served_first.sum(1)  # (B, E): places used by first choices
        served_second = _capacity_mask(second, capacity, already=taken)
    combine = served_first * weights[..., :1] + served_second * weights[..., 1:]
    return Routing(served_first | served_second, combine.to(logits.dtype), probs, choice)


def load_balancing_loss(probs: torch.Tensor, choice: torch.Tensor) -> torch.Tensor:
    """Switch's auxiliary loss ``E * sum_i f_i P_i``, averaged over groups; 1 at uniform routing.

    ``probs`` (B, T, E) router probabilities; ``choice`` (B, T, k) chosen experts (a token
    counts once per expert it chose, before capacity).
    """
    _check_logits(probs)
    if (not isinstance(choice, torch.Tensor) or choice.dtype not in (torch.int32, torch.int64) or choice.dim() != 3
            or choice.shape[:2] != probs.shape[:2]):
        raise ValueError(f"choice must be an integer tensor (B, T, k) = ({probs.shape[0]}, {probs.shape[1]}, k), "
                         f"got {getattr(choice, 'dtype', type(choice).__name__)} {tuple(getattr(choice, 'shape', ()))}")
    e = probs.shape[-1]
    chose = F.one_hot(choice, e).amax(-2).float()  # (B, T, E)
    f = chose.mean(1)  # (B, E): fraction of the group's tokens that chose expert i
    p = probs.float().mean(1)  # (B, E): mean probability of expert i
    return (e * (f * p).sum(-1)).mean()


def expert_load(routing: Routing) -> torch.Tensor:
    """(E,) fraction of the routing choices that went to each expert, before capacity (sums to 1)."""
    if not isinstance(routing, Routing):
        raise TypeError(f"routing must be a Routing, got {type(routing).__name__}")
    counts = torch.bincount(routing.choice.flatten(), minlength=routing.probs.shape[-1]).float()  # (E,)
    return counts / counts.sum()


def drop_rate(routing: Routing) -> float:
    """Fraction of the routing choices (token, expert) that capacity refused; for top-1, the dropped tokens."""
    if not isinstance(routing, Routing):
        raise TypeError(f"routing must be a Routing, got {type(routing).__name__}")
    served = int(routing.dispatch.sum())
    return 1.0 - served / routing.choice.numel()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE's router z-loss: the mean over tokens of ``logsumexp(logits)^2``."""
    _check_logits(logits)
    return (torch.logsumexp(logits.float(), dim=-1) ** 2).mean()


class MoEFeedForward(nn.Module):
    """A mixture of ``n_experts`` feed-forward networks behind a router; a drop-in for ``FeedForward``.

    ``forward(x)`` returns (B, T, D) and stores the auxiliary losses of the call in
    ``self.aux`` (``{"load_balancing": ..., "z": ...}``) and the routing in
    ``self.last_routing``, so that a training loop can add them and a plot can read them.
    """

    def __init__(self, d_model: int, d_ff: int, n_experts: int, *, top_k: int = 1, capacity_factor: float = 1.25,
                 activation: str = "relu", bias: bool = False, router_bias: bool = False, causal: bool = False) -> None:
        super().__init__()
        check_positive_int("n_experts", n_experts)
        if top_k not in (1, 2):
            raise ValueError(f"top_k must be 1 or 2, got {top_k!r}")
        if not capacity_factor > 0:
            raise ValueError(f"capacity_factor must be positive, got {capacity_factor!r}")
        self.d_model, self.n_experts, self.top_k, self.capacity_factor = d_model, n_experts, top_k, capacity_factor
        self.causal = causal  # top-2: serve choices in position order (see route_top2); top-1 always does
        self.router = nn.Linear(d_model, n_experts, bias=router_bias)
        self.experts = nn.ModuleList(FeedForward(d_model, d_ff, activation=activation, bias=bias)
                                     for _ in range(n_experts))
        self.aux: dict[str, torch.Tensor] = {}
        self.last_routing: Routing | None = None
        self.capacity: int | None = None  # fixed capacity (tokens per expert and group); None: from the factor

    def route(self, x: torch.Tensor) -> tuple[Routing, torch.Tensor]:
        """``(routing, router logits)`` for ``x`` (B, T, D)."""
        logits = self.router(x)  # (B, T, E)
        capacity = self.capacity or expert_capacity(x.shape[1], self.n_experts, self.capacity_factor * self.top_k)
        if self.top_k == 1:
            return route_top1(logits, capacity), logits
        return route_top2(logits, capacity, causal=self.causal), logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (B, T, {self.d_model}), got {getattr(x, 'shape', type(x).__name__)}")
        routing, logits = self.route(x)
        self.aux = {"load_balancing": load_balancing_loss(routing.probs, routing.choice), "z": router_z_loss(logits)}
        self.last_routing = routing
        flat = x.reshape(-1, self.d_model)  # (N, D)
        dispatch = routing.dispatch.reshape(-1, self.n_experts)  # (N, E)
        combine = routing.combine.reshape(-1, self.n_experts)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            idx = dispatch[:, e].nonzero().squeeze(-1)  # the tokens this expert serves
            if idx.numel():
                y = expert(flat.index_select(0, idx)) * combine.index_select(0, idx)[:, e:e + 1]
                out.index_add_(0, idx, y)  # dropped tokens stay 0: the residual carries them
        return out.view_as(x)


@dataclass(frozen=True)
class MoEConfig:
    """How every feed-forward network of :func:`moe_gpt` becomes a mixture of experts."""

    n_experts: int  # E, expert FFNs per layer (each as wide as the dense FFN it replaces)
    top_k: int = 1  # experts per token (1: Switch, 2: GShard/Mixtral)
    capacity_factor: float = 1.25  # expert capacity = factor * top_k * tokens per sequence / n_experts
    causal: bool = True  # top-2 in a causal GPT: serve choices in position order, so no token sees a later one

    def __post_init__(self) -> None:
        check_positive_int("n_experts", self.n_experts)
        if self.top_k not in (1, 2) or isinstance(self.top_k, bool):
            raise ValueError(f"top_k must be 1 or 2, got {self.top_k!r}")
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k={self.top_k} exceeds n_experts={self.n_experts}")
        if isinstance(self.capacity_factor, bool) or not isinstance(self.capacity_factor, (int, float)) \
                or not self.capacity_factor > 0:
            raise ValueError(f"capacity_factor must be a positive number, got {self.capacity_factor!r}")
        if not isinstance(self.causal, bool):
            raise ValueError(f"causal must be True or False, got {self.causal!r}")


def moe_gpt(cfg: GPTConfig, moe: MoEConfig) -> GPT:
    """The course's :class:`~companion.models.gpt.GPT` of ``cfg`` with a :class:`MoEFeedForward` in every block.

    Each expert has the dense FFN's size, activation and biases (``cfg.ff_size``,
    ``cfg.activation``, ``cfg.bias``); the router has no bias. Everything else,
    including GPT-2's scaled initialisation of every residual projection (each
    expert's ``down``), is the dense GPT's.
    """
    if not isinstance(moe, MoEConfig):
        raise TypeError(f"moe must be a MoEConfig, got {type(moe).__name__}")

    def ffn(cfg: GPTConfig, layer_idx: int) -> MoEFeedForward:
        return MoEFeedForward(cfg.d_model, cfg.ff_size, moe.n_experts, top_k=moe.top_k,
                              capacity_factor=moe.capacity_factor, activation=cfg.activation, bias=cfg.bias,
                              causal=moe.causal)

    return GPT(cfg, ffn=ffn)


def moe_reference(layer: MoEFeedForward, x: torch.Tensor) -> torch.Tensor:
    """The obvious loop: for every token, every expert that serves it, weighted; for testing."""
    routing, _ = layer.route(x)
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            for e in range(layer.n_experts):
                if routing.dispatch[b, t, e]:
                    out[b, t] += routing.combine[b, t, e] * layer.experts[e](x[b, t][None, None])[0, 0]
    return out


# Hugging Face's SwitchTransformersSparseMLP, read release by release: in 4.x (the layer came in 4.25) the router
# counts each expert's tokens along every sequence and drops those past `expert_capacity`, as MoEFeedForward does.
# 5.0 to 5.17 flatten the batch before the router, whose running count then runs along a length-1 axis: no token
# is ever dropped. 5.18 routes the unflattened sequences again. (Read in the released wheels of 5.0.0, 5.15.0,
# 5.15.1, 5.16.1, 5.17.0, 5.18.0, 5.19.0 and 5.23.0; tests/switch_parity.py checks the installed release.)
HF_SWITCH_CAPACITY_RELEASES = "transformers 4.x and 5.18 or later"


def hf_switch_has_capacity(version: str | None = None) -> bool:
    """Whether Hugging Face's Switch layer in transformers ``version`` (default: the installed one) drops the
    tokens past ``expert_capacity`` in each sequence, as :class:`MoEFeedForward` does: true for
    :data:`HF_SWITCH_CAPACITY_RELEASES`; 5.0 to 5.17 never drop a token, so only tokens within capacity compare."""
    if version is None:
        import transformers

        version = transformers.__version__
    match = re.match(r"(\d+)\.(\d+)", version) if isinstance(version, str) else None
    if match is None:
        raise ValueError(f"expected a transformers version such as '5.18.0', got {version!r}")
    major, minor = int(match[1]), int(match[2])
    return major < 5 or (major, minor) >= (5, 18)


@torch.no_grad()
def from_hf_switch_mlp(hf_mlp, *, capacity: int) -> MoEFeedForward:
    """A top-1 :class:`MoEFeedForward` holding Hugging Face ``SwitchTransformersSparseMLP`` weights.

    ``capacity`` is HF's ``expert_capacity`` (tokens per expert and sequence).
    """
    router = hf_mlp.router.classifier
    experts = [hf_mlp.experts[f"expert_{i}"] for i in range(hf_mlp.router.num_experts)]
    d_ff, d_model = experts[0].wi.weight.shape
    act = type(experts[0].act).__name__.lower()
    if "relu" not in act:
        raise ValueError(f"only ReLU experts are supported, got {type(experts[0].act).__name__}")
    layer = MoEFeedForward(d_model, d_ff, len(experts), activation="relu", bias=False,
                           router_bias=router.bias is not None)
    layer.capacity = capacity
    layer.router.load_state_dict(router.state_dict())
    for ours, theirs in zip(layer.experts, experts):
        ours.up.weight.copy_(theirs.wi.weight)
        ours.down.weight.copy_(theirs.wo.weight)
    return layer.eval()


def moe_aux_loss(model: nn.Module, *, balance_weight: float = 0.01, z_weight: float = 0.001) -> torch.Tensor:
    """The auxiliary losses of the last forward pass, summed over every :class:`MoEFeedForward` in ``model``:
    ``balance_weight * load_balancing + z_weight * z`` (Switch's 0.01, ST-MoE's 0.001). 0 for a dense model."""
    first = next(model.parameters(), None)
    total = torch.zeros((), device=None if first is None else first.device)  # on the model's device
    for m in model.modules():
        if isinstance(m, MoEFeedForward) and m.aux:
            total = total + balance_weight * m.aux["load_balancing"] + z_weight * m.aux["z"]
    return total


def moe_parameter_counts(model: nn.Module) -> dict[str, int]:
    """``{"total": ..., "active": ...}``: all parameters, and those one token uses (its ``top_k`` experts of
    every MoE layer, plus everything that is not an expert). A tied matrix counts once."""
    total = sum(p.numel() for p in model.parameters())
    idle = 0
    for m in model.modules():
        if isinstance(m, MoEFeedForward):
            per_expert = sum(p.numel() for p in m.experts[0].parameters())
            idle += (m.n_experts - m.top_k) * per_expert
    return {"total": total, "active": total - idle}


def moe_layer_flops(d_model: int, d_ff: int, n_experts: int, top_k: int, tokens: int) -> int:
    """Matrix FLOPs of one MoE layer's forward pass when no token is dropped (multiply-add = 2 FLOPs):
    the router (D x E per token) and ``top_k`` expert FFNs (2 D F per token each)."""
    for name, v in (("d_model", d_model), ("d_ff", d_ff), ("n_experts", n_experts), ("top_k", top_k), ("tokens", tokens)):
        check_positive_int(name, v)
    return tokens * (2 * d_model * n_experts + top_k * 2 * (2 * d_model * d_ff))
