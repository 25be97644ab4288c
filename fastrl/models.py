"""Actor-critic models: encoders, policy/value heads and the action distributions they need.

API (CleanRL's): ``get_value(obs) -> [B]`` and
``get_action_and_value(obs, action=None) -> (action, logp [B], entropy [B], value [B])``.
Discrete actions are int64 ``[B]``; continuous actions are float32 ``[B, *action_shape]``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from fastrl.envs import ActionSpec

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "silu": nn.SiLU}
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def orthogonal_init(layer: nn.Module, gain: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, hidden_sizes: list, activation: str) -> nn.Sequential:
    layers, dim = [], in_dim
    for width in hidden_sizes:
        layers += [orthogonal_init(nn.Linear(dim, width)), ACTIVATIONS[activation]()]
        dim = width
    return nn.Sequential(*layers)


def categorical_logp_entropy(logits: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [B, A]``, ``action [B]`` int64 -> ``logp [B]``, ``entropy [B]``."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    logp = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy


def categorical_sample(logits: torch.Tensor) -> torch.Tensor:
    """Gumbel-max sampling: no host sync, compiles cleanly. ``[B, A] -> [B]`` int64."""
    uniform = torch.rand_like(logits, dtype=torch.float32).clamp_(1e-20, 1.0)
    return torch.argmax(logits.float() - torch.log(-torch.log(uniform)), dim=-1)


def gaussian_logp_entropy(mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor):
    """Diagonal Gaussian, state-independent ``log_std [A]``. ``mean, action [B, A]`` -> ``logp [B]``, ``entropy [B]``."""
    mean = mean.float()
    z = (action - mean) * torch.exp(-log_std)
    logp = (-0.5 * z.square() - log_std - _LOG_SQRT_2PI).sum(-1)
    entropy = (0.5 + _LOG_SQRT_2PI + log_std).sum(-1).expand(mean.shape[0])
    return logp, entropy


class ActorCritic(nn.Module):
    """MLP actor-critic over flat observations, with a shared trunk or separate policy/value trunks."""

    def __init__(self, obs_shape: tuple, action_spec: ActionSpec, hidden_sizes=(64, 64), activation: str = "tanh",
                 shared_trunk: bool = False, init_log_std: float = 0.0):
        super().__init__()
        in_dim = math.prod(obs_shape)
        self.action_spec = action_spec
        self.discrete = action_spec.kind == "discrete"
        out_dim = action_spec.n if self.discrete else math.prod(action_spec.shape)
        self.shared_trunk = shared_trunk
        self.actor_trunk = mlp(in_dim, list(hidden_sizes), activation)
        self.critic_trunk = self.actor_trunk if shared_trunk else mlp(in_dim, list(hidden_sizes), activation)
        self.policy_head = orthogonal_init(nn.Linear(hidden_sizes[-1], out_dim), gain=0.01)
        self.value_head = orthogonal_init(nn.Linear(hidden_sizes[-1], 1), gain=1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((out_dim,), float(init_log_std)))

    def _features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = obs.flatten(1).float()
        actor = self.actor_trunk(x)
        critic = actor if self.shared_trunk else self.critic_trunk(x)
        return actor, critic

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.flatten(1).float()
        return self.value_head(self.critic_trunk(x)).squeeze(-1).float()

    def get_action_and_value(self, obs: torch.Tensor, action: torch.Tensor | None = None):
        actor, critic = self._features(obs)
        out = self.policy_head(actor)
        value = self.value_head(critic).squeeze(-1).float()
        if self.discrete:
            if action is None:
                action = categorical_sample(out)
            logp, entropy = categorical_logp_entropy(out, action)
        else:
            log_std = self.log_std
            if action is None:
                action = out.float() + torch.randn_like(out, dtype=torch.float32) * log_std.exp()
            action = action.view(out.shape)
            logp, entropy = gaussian_logp_entropy(out, log_std, action)
            action = action.view(-1, *self.action_spec.shape)
        return action, logp, entropy, value

    @torch.no_grad()
    def act_deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        """The mode of the policy: argmax for discrete, the mean for continuous actions."""
        actor, _ = self._features(obs)
        out = self.policy_head(actor)
        if self.discrete:
            return out.argmax(-1)
        return out.float().view(-1, *self.action_spec.shape)


def make_agent(cfg, obs_shape: tuple, action_spec: ActionSpec) -> ActorCritic:
    return ActorCritic(obs_shape, action_spec, cfg.hidden_sizes, cfg.activation, cfg.shared_trunk, cfg.init_log_std)
