"""An agent's parameters as one flat vector, and the forward of K members that share one architecture.

A run of K members (K = 1: a single run) keeps every member's parameters in one float32 tensor ``[K, P]``
(``FlatLayout`` says where each ``nn.Parameter`` lives in ``P``). The optimizer math then runs on one tensor
(``fastrl.learn.optim``), ``torch.func.vmap`` maps the update over the member axis, and a checkpoint or an evaluation
reads member m's weights as a module through ``FlatLayout.load_into``.

``MemberPolicy`` is the rollout's acting function for K members over ``[K * B]`` observations (member m owns rows
``[m * B, (m + 1) * B)``): at K = 1 it calls the agent module itself, whose parameters are views of ``params[0]``
(``FlatLayout.bind``), so a single run pays nothing for the member axis; at K > 1 it vmaps ``functional_call``.
"""
from __future__ import annotations

from itertools import accumulate

import torch
from torch import nn
from torch.func import functional_call, vmap

from fastrl.learn.masking import action_mask
from fastrl.kernels.recurrent import lstm_sequence
from fastrl.learn.models import ActorCritic, RecurrentActorCritic, action_logp_entropy, gsde_distribution


class AgentMethod(nn.Module):
    """``forward`` calls ``agent.<method>``: what ``functional_call`` needs to call a method other than forward."""

    def __init__(self, agent: nn.Module, method: str):
        super().__init__()
        self.agent, self.method = agent, method

    def forward(self, *args):
        return getattr(self.agent, self.method)(*args)


def parameter_slots(module: nn.Module, params: list) -> list:
    """``(name, index into params)`` for every module attribute that holds one of ``params``.

    A parameter reachable by two paths of one shared submodule (a shared trunk) is one slot, named by its first
    path; a parameter assigned to two modules (tied weights) is two slots with one index, so autograd sums its
    gradient. (``functional_call(tie_weights=True)`` swaps a shared submodule's attribute twice and restores the
    wrong tensor, replacing the module's parameter.)
    """
    index = {id(p): i for i, p in enumerate(params)}
    slots, seen = [], set()
    for prefix, sub in module.named_modules(remove_duplicate=False):
        for attr, p in sub._parameters.items():
            if p is None or id(p) not in index or (id(sub), attr) in seen:
                continue
            seen.add((id(sub), attr))
            slots.append((f"{prefix}.{attr}" if prefix else attr, index[id(p)]))
    return slots


class FlatLayout:
    """Where each of ``agent.parameters()`` lives in a flat ``[P]`` vector (in that order)."""

    def __init__(self, agent: nn.Module):
        params = list(agent.parameters())
        self.shapes = [p.shape for p in params]
        self.numels = [p.numel() for p in params]
        self.size = sum(self.numels)
        self.offsets = [0, *accumulate(self.numels)]
        self.methods = {name: AgentMethod(agent, name) for name in ("get_action_and_value", "get_value")}
        self.slots = {name: parameter_slots(module, params) for name, module in self.methods.items()}
        self.agent = agent
        self.index_of = {id(p): i for i, p in enumerate(params)}
        # An MLP, or an LSTM over one: K members as batched matmuls, no vmap.
        self.batched = isinstance(agent, ActorCritic) or (isinstance(agent, RecurrentActorCritic)
                                                          and agent.kind == "lstm" and isinstance(agent.base, ActorCritic))

    def flatten(self, agent: nn.Module) -> torch.Tensor:
        """The agent's parameters as one ``[P]`` float32 tensor (a copy)."""
        return torch.cat([p.detach().reshape(-1).float() for p in agent.parameters()])

    def views(self, flat: torch.Tensor) -> list:
        """``[P]`` -> one view per parameter, shaped as it; ``[K, P]`` -> one per parameter, shaped ``[K, *shape]``."""
        return [flat[..., a:b].view((*flat.shape[:-1], *shape))
                for a, b, shape in zip(self.offsets[:-1], self.offsets[1:], self.shapes)]

    def bind(self, agent: nn.Module, flat: torch.Tensor) -> None:
        """Make the agent's parameters views of ``flat [P]``: writes to ``flat`` are the module's new weights."""
        with torch.no_grad():
            for p, view in zip(agent.parameters(), self.views(flat)):
                view.copy_(p)
                p.data = view

    def load_into(self, agent: nn.Module, flat: torch.Tensor) -> nn.Module:
        """Copy ``flat [P]`` into the agent's parameters; returns the agent."""
        with torch.no_grad():
            for p, view in zip(agent.parameters(), self.views(flat)):
                p.copy_(view)
        return agent

    def call(self, method: str, flat, *args):
        """``agent.<method>(*args)`` with the weights ``flat [P]`` (differentiable in ``flat``), or with ``flat`` a
        list of one tensor per parameter (``views``' order and shapes; differentiable in each)."""
        views = flat if isinstance(flat, (list, tuple)) else self.views(flat)
        named = {name: views[i] for name, i in self.slots[method]}
        return functional_call(self.methods[method], named, args, tie_weights=False)

    @staticmethod
    def flat_gradient(grads) -> torch.Tensor:
        """Per-parameter gradients (``views``' order) -> one ``[P]`` tensor: a concatenation. (The gradient taken with
        respect to the flat vector itself is a sum of one zero-padded slice per parameter, which inductor fuses into
        one kernel that tests every slice's bounds at every element: 75% of a compiled Walker2d update step.)"""
        return torch.cat([g.reshape(-1) for g in grads])

    def call_members(self, method: str, flat: torch.Tensor, *args, views: list | None = None):
        """``agent.<method>`` of K members: weights ``flat [K, P]``, every argument ``[K, B, ...]`` (None passes
        through). An MLP actor-critic runs as batched matmuls (``members_actor_critic``; ``views``: ``flat``'s
        ``views``, if the caller keeps them), other agents under vmap."""
        if self.batched:
            members = members_lstm if isinstance(self.agent, RecurrentActorCritic) else members_actor_critic
            return members(self, self.views(flat) if views is None else views, method, *args)
        in_dims = (0, *(None if a is None else 0 for a in args))
        return vmap(lambda w, *a: self.call(method, w, *a), in_dims=in_dims)(flat, *args)


def _members_linear(layout: FlatLayout, views: list, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``layer`` of K members on ``x [K, B, in]``: one ``baddbmm`` with the members' ``[K, out, in]`` weights."""
    weight, bias = views[layout.index_of[id(layer.weight)]], views[layout.index_of[id(layer.bias)]]
    return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))


def _members_sequential(layout: FlatLayout, views: list, sequential: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    for layer in sequential:
        x = _members_linear(layout, views, layer, x) if isinstance(layer, nn.Linear) else layer(x)
    return x


def members_actor_critic(layout: FlatLayout, views: list, method: str, obs, action=None, noise=None):
    """``ActorCritic.get_action_and_value`` / ``get_value`` of K members at once (``views``: each parameter
    ``[K, *shape]``; ``obs [K, B, ...]``): the same ops as the module's, with batched matmuls."""
    agent = layout.agent
    x = agent.trunk_input(obs.flatten(2))
    critic = _members_sequential(layout, views, agent.critic_trunk, x)
    value = _members_linear(layout, views, agent.value_head, critic).squeeze(-1).float()
    if method == "get_value":
        return value
    actor = critic if agent.shared_trunk else _members_sequential(layout, views, agent.actor_trunk, x)
    out = _members_linear(layout, views, agent.policy_head, actor)
    k, b = out.shape[:2]
    log_std, exploration = None, None
    if agent.use_sde:  # gSDE's per-row log-std and exploration from each member's [L, A] log-std
        if action is None and noise is None:
            noise = torch.randn(k, b, agent.noise_width, device=out.device)
        member_log_std = views[layout.index_of[id(agent.log_std)]]
        log_std, exploration = gsde_distribution(
            actor, member_log_std, None if action is not None else noise.reshape(k, b, -1))
        noise = None
    return (*_members_action(layout, views, agent, out, action, noise, log_std, exploration,
                             action_mask(obs.flatten(2), agent.mask_width)), value)


def _rows(x: torch.Tensor | None) -> torch.Tensor | None:
    """``[K, B, ...]`` -> ``[K * B, ...]`` (None passes)."""
    return None if x is None else x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _members_action(layout: FlatLayout, views: list, agent: nn.Module, out, action, noise, log_std=None,
                    exploration=None, mask=None) -> tuple:
    """The action distribution of K members' policy outputs ``out [K, B, A]``, row by row as the module's (members and
    rows flattened together; a member's ``log_std`` repeated over its rows unless given per row): ``(action [K, B,
    ...], logp [K, B], entropy [K, B])``."""
    k, b = out.shape[:2]
    if log_std is None and not agent.discrete:
        log_std = views[layout.index_of[id(agent.log_std)]].unsqueeze(1).expand(k, b, -1)
    action, logp, entropy = action_logp_entropy(_rows(out), agent.action_spec, _rows(log_std), _rows(action),
                                                _rows(noise), _rows(exploration), _rows(mask))
    return action.reshape(k, b, *action.shape[1:]), logp.view(k, b), entropy.view(k, b)


def members_lstm(layout: FlatLayout, views: list, method: str, obs, *args):
    """``RecurrentActorCritic.get_action_and_value(obs, action, noise, state, episode_start)`` / ``get_value(obs,
    state, episode_start)`` of K members at once, for an LSTM over an MLP trunk: ``obs [K, T * B, ...]``, ``state
    [K, B, S]`` (None: zeros, B = T * B), ``episode_start [K, T * B]``; the same ops as the module's with batched
    matmuls, and ``kernels.lstm_sequence`` over the member axis."""
    args = (None, None, *args) if method == "get_value" else args
    action, noise, state, episode_start = args + (None,) * (4 - len(args))
    agent = layout.agent
    base, core, size = agent.base, agent.core, agent.hidden_size

    def weight(param):
        return views[layout.index_of[id(param)]]
    features = _members_sequential(layout, views, base.actor_trunk, base.trunk_input(obs.flatten(2)))
    k, rows = features.shape[:2]
    state = features.new_zeros(k, rows, agent.state_size) if state is None else state.to(features.dtype)
    bias = (weight(core.bias_ih) + weight(core.bias_hh)).unsqueeze(1)
    gates = torch.baddbmm(bias, features, weight(core.weight_ih).transpose(1, 2)).view(k, -1, state.shape[1], 4 * size)
    keep = None if episode_start is None else (~episode_start.bool()).view(*gates.shape[:3], 1).to(gates.dtype)
    out, (hidden, cell) = lstm_sequence(gates, state[..., :size], state[..., size:], weight(core.weight_hh), keep)
    out = out.reshape(k, rows, size)
    value = _members_linear(layout, views, base.value_head, out).squeeze(-1).float()
    if method == "get_value":
        return value
    logits = _members_linear(layout, views, base.policy_head, out)
    return (*_members_action(layout, views, base, logits, action, noise), value,
            torch.cat([hidden, cell], dim=-1).float())


class MemberPolicy:
    """The acting functions of K members over member-major rows ``[K * B, ...]`` (see the module docstring).

    ``get_action_and_value(obs, action=None, noise=None)`` and ``get_value(obs)`` as the agent's, with ``noise``
    ``[K * B, width]`` drawn by the caller from each member's own generator."""

    def __init__(self, agent: nn.Module, layout: FlatLayout, params: torch.Tensor, autocast):
        self.agent, self.layout, self.params, self.autocast = agent, layout, params, autocast
        self.n_members = params.shape[0]
        # Eagerly, the per-parameter views of ``params`` (written in place by the update) are made once, not per
        # step (about 30 us of a 3-member CartPole step); a compiled rollout step slices ``params`` in its graph.
        self._views = layout.views(params) if layout.batched and self.n_members > 1 else None

    def _eager_views(self):
        return None if torch.compiler.is_compiling() else self._views

    def get_action_and_value(self, obs: torch.Tensor, action=None, noise: torch.Tensor | None = None, *carry):
        """``carry``: a recurrent policy's ``(state, episode_start)``, ``[K * B, ...]`` rows like ``obs``."""
        with self.autocast():
            if self.n_members == 1:
                return self.agent.get_action_and_value(obs, action, noise, *carry)
            out = self.layout.call_members("get_action_and_value", self.params,
                                           *self._split(obs, action, noise, *carry), views=self._eager_views())
        return tuple(None if x is None else x.reshape(-1, *x.shape[2:]) for x in out)

    def get_value(self, obs: torch.Tensor, *carry) -> torch.Tensor:
        with self.autocast():
            if self.n_members == 1:
                return self.agent.get_value(obs, *carry)
            return self.layout.call_members("get_value", self.params, *self._split(obs, *carry),
                                            views=self._eager_views()).reshape(-1)

    def _split(self, *rows):
        """Member-major ``[K * B, ...]`` rows as ``[K, B, ...]`` (None passes)."""
        k = self.n_members
        return tuple(None if x is None else x.view(k, x.shape[0] // k, *x.shape[1:]) for x in rows)
