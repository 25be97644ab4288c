"""The synchronous rollout step as one compiled function (CPU).

``CompiledRolloutStep`` replaces the eager per-step sequence "policy forward, sampling, four buffer writes" with one
``torch.compile(fullgraph=True)`` graph per step: ``step(obs, t) -> action``. Inside the graph: the forward,
Gumbel-max (discrete) or Gaussian (continuous) sampling from noise drawn outside, and the writes of
``observation``, ``action``, ``sample_log_prob`` and ``state_value`` into row ``t`` of the ``[T, N]`` buffer. The
env step stays one call outside the graph (EnvPool's C++ step cannot be traced). An env whose step is a pure
tensor function (``env_backend: torch``) needs none of this: its whole iteration is one function
(``fastrl.run.iteration``).

Conventions:
- The sampling noise (``[N, A]``: U(0, 1) for discrete, N(0, 1) for continuous actions) is drawn per step outside
  the graph by ``draw_noise()`` (the trainer's: each member's rows from its own generator), the draws the eager
  rollout makes, so the compiled and eager rollouts take the same actions from the same seed (up to float rounding
  of the logits).
- ``policy`` is the trainer's ``fastrl.learn.stacked.MemberPolicy``: the agent itself at K = 1, vmapped members else.
- Row views of the buffer are built once; the graph writes through them (static shapes, no recompiles per ``t``).
- CPU only: on CUDA the buffer lives in pinned host memory and the trainer keeps its compiled forward (CUDA graphs
  under ``reduce-overhead``) with host copies.
"""
from __future__ import annotations

import math

import torch

from fastrl.run.compile import CompiledOrEager


def sampling_noise(action_spec):
    """``(width, draw)``: the per-step sampling noise has ``width`` columns (the number of actions, discrete, or of
    action dims, continuous) and is drawn with ``draw`` (``torch.rand``: U(0, 1) for Gumbel-max; ``torch.randn``)."""
    if action_spec.kind == "discrete":
        return action_spec.n, torch.rand
    return math.prod(action_spec.shape), torch.randn


def has_pure_step(env) -> bool:
    """Whether ``env`` steps as a pure tensor function (``TorchEnv.pure_step``, no normalization wrappers), so that
    a whole iteration can be one function (``fastrl.run.iteration``)."""
    inner = getattr(env, "env", env)
    normalized = getattr(env, "normalize_obs", False) or getattr(env, "normalize_reward", False)
    return hasattr(inner, "pure_step") and not normalized


class CompiledRolloutStep:
    """One compiled rollout step writing into ``views`` (``fastrl.distributed.async_collect.RolloutViews`` of the buffer), with
    the sampling noise from ``draw_noise()``. ``mode``: a ``torch.compile`` mode, or ``"off"`` (the same function,
    run eagerly)."""

    def __init__(self, policy, views, mode: str, draw_noise):
        self.policy, self.views, self.draw_noise = policy, views, draw_noise
        v = views
        self.rows = [(v.observation[t], v.action[t], v.sample_log_prob[t], v.state_value[t])
                     for t in range(views.action.shape[0])]
        self.fn = CompiledOrEager(self._act, mode, "the rollout step", fullgraph=True)

    @property
    def compiled(self) -> bool:
        return self.fn.compiled

    def __call__(self, obs: torch.Tensor, t: int) -> torch.Tensor:
        """The action ``[N]`` taken at step ``t``."""
        return self.fn(obs, self.draw_noise(), *self.rows[t])

    def _act(self, obs, noise, row_obs, row_action, row_logp, row_value):
        action, logp, _, value = self.policy.get_action_and_value(obs, None, noise)
        row_obs.copy_(obs)
        row_action.copy_(action)
        row_logp.copy_(logp)
        row_value.copy_(value)
        return action
