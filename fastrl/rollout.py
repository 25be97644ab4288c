"""The synchronous rollout step as one compiled function (CPU), and the hot-loop guard stance.

``CompiledRolloutStep`` replaces the eager per-step sequence "policy forward, sampling, four buffer writes" with one
``torch.compile(fullgraph=True)`` graph per step. Two forms:

- **policy** (any env): ``step(obs, t) -> action``. Inside the graph: the forward, Gumbel-max (discrete) or
  Gaussian (continuous) sampling from noise drawn outside, and the writes of ``observation``, ``action``,
  ``sample_log_prob`` and ``state_value`` into row ``t`` of the ``[T, N]`` buffer. The env step stays one call
  outside the graph (EnvPool's C++ step cannot be traced; as a ``torch.library`` custom op it would still run
  between the same kernels).
- **fused** (an env with a pure tensor step, ``env_backend: torch``): ``step(obs, t) -> next_obs``. The env step,
  its auto-reset, the reward / flag writes and the per-env running episode return and length are in the graph
  too; finished episodes are handed to ``EpisodeStats`` once per rollout (``finish()``), in the order the eager
  env would have recorded them.

Conventions:
- The sampling noise (``[N, A]``: U(0, 1) for discrete, N(0, 1) for continuous actions) is drawn per step outside
  the graph by ``draw_noise()`` (the trainer's: each member's rows from its own generator), the draws the eager
  rollout makes, so the compiled and eager rollouts take the same actions from the same seed (up to float rounding
  of the logits).
- ``policy`` is the trainer's ``fastrl.stacked.MemberPolicy``: the agent itself at K = 1, vmapped members else.
- Row views of the buffer are built once; the graph writes through them (static shapes, no recompiles per ``t``).
- CPU only: on CUDA the buffer lives in pinned host memory and the trainer keeps its compiled forward (CUDA graphs
  under ``reduce-overhead``) with host copies.
"""
from __future__ import annotations

import math

import torch

from fastrl.compile import CompiledOrEager


def sampling_noise(action_spec):
    """``(width, draw)``: the per-step sampling noise has ``width`` columns (the number of actions, discrete, or of
    action dims, continuous) and is drawn with ``draw`` (``torch.rand``: U(0, 1) for Gumbel-max; ``torch.randn``)."""
    if action_spec.kind == "discrete":
        return action_spec.n, torch.rand
    return math.prod(action_spec.shape), torch.randn


def has_fused_step(env) -> bool:
    """Whether ``env`` steps as a pure tensor function the rollout graph can contain (no normalization wrappers)."""
    inner = getattr(env, "env", env)
    normalized = getattr(env, "normalize_obs", False) or getattr(env, "normalize_reward", False)
    return hasattr(inner, "pure_step") and not normalized


class CompiledRolloutStep:
    """One compiled rollout step writing into ``views`` (``fastrl.async_collect.RolloutViews`` of the buffer).

    ``env``: given (and ``has_fused_step(env)``), the env step is fused into the graph (see the module docstring).
    ``mode``: a ``torch.compile`` mode, or ``"off"`` (the same function, run eagerly).
    """

    def __init__(self, policy, views, action_spec, mode: str, env=None, draw_noise=None):
        self.policy, self.views, self.draw_noise = policy, views, draw_noise
        n_steps, n_envs = views.action.shape[:2]
        if draw_noise is None:
            width, draw = sampling_noise(action_spec)
            self.draw_noise = lambda: draw(n_envs, width)
        self.fused = env is not None and has_fused_step(env)
        v = views
        if self.fused:
            self.env = getattr(env, "env", env)
            self.finished_return = torch.zeros(n_steps, n_envs, dtype=torch.float64)
            self.finished_length = torch.zeros(n_steps, n_envs, dtype=torch.int64)
            self.rows = [(v.observation[t], v.action[t], v.sample_log_prob[t], v.state_value[t], v.reward[t],
                          v.done[t], v.terminated[t], v.truncated[t], v.valid[t], self.finished_return[t],
                          self.finished_length[t]) for t in range(n_steps)]
            self.fn = CompiledOrEager(self._fused_step, mode, "the fused rollout step (policy + env)", fullgraph=True)
        else:
            self.rows = [(v.observation[t], v.action[t], v.sample_log_prob[t], v.state_value[t])
                         for t in range(n_steps)]
            self.fn = CompiledOrEager(self._act, mode, "the rollout step", fullgraph=True)

    @property
    def compiled(self) -> bool:
        return self.fn.compiled

    def __call__(self, obs: torch.Tensor, t: int) -> torch.Tensor:
        """Policy form: the action ``[N]`` taken at step ``t``. Fused form: the observation after step ``t``."""
        noise = self.draw_noise()
        if not self.fused:
            return self.fn(obs, noise, *self.rows[t])
        env = self.env
        stats = env.stats
        return self.fn(obs, noise, env.draw_reset_uniform(), *env.tensor_state, stats.running_return,
                       stats.running_length, *self.rows[t])

    def finish(self, n_steps: int) -> None:
        """Fused form, after a rollout of ``n_steps``: record its finished episodes in the env's ``EpisodeStats``
        (time-major, then env order: the order the per-step eager bookkeeping records them)."""
        if not self.fused:
            return
        done = self.views.done[:n_steps]
        if bool(done.any()):
            returns = self.finished_return[:n_steps][done].numpy()
            lengths = self.finished_length[:n_steps][done].numpy()
            stats = self.env.stats
            if hasattr(stats, "record_envs"):  # a population's: each episode to its member's ring too
                stats.record_envs(done.nonzero()[:, 1].numpy(), returns, lengths)
            else:
                stats.record(returns, lengths)

    # ------------------------------------------------------------------ the compiled functions
    def _act(self, obs, noise, row_obs, row_action, row_logp, row_value):
        action, logp, _, value = self.policy.get_action_and_value(obs, None, noise)
        row_obs.copy_(obs)
        row_action.copy_(action)
        row_logp.copy_(logp)
        row_value.copy_(value)
        return action

    def _fused_step(self, obs, noise, reset_uniform, physics, elapsed, prev_done, running_return, running_length,
                    row_obs, row_action, row_logp, row_value, row_reward, row_done, row_terminated, row_truncated,
                    row_valid, row_finished_return, row_finished_length):
        action = self._act(obs, noise, row_obs, row_action, row_logp, row_value)
        new_physics, new_elapsed, done, next_obs, reward, terminated, truncated, valid = self.env.pure_step(
            physics, elapsed, prev_done, action, reset_uniform)
        # EpisodeStats.update's bookkeeping: reset steps add nothing; an episode's totals are read where it ends.
        episode_return = running_return + reward.double() * valid
        episode_length = running_length + valid
        row_finished_return.copy_(episode_return)
        row_finished_length.copy_(episode_length)
        running_return.copy_(torch.where(done, torch.zeros_like(episode_return), episode_return))
        running_length.copy_(torch.where(done, torch.zeros_like(episode_length), episode_length))
        physics.copy_(new_physics)
        elapsed.copy_(new_elapsed)
        prev_done.copy_(done)
        row_reward.copy_(reward)
        row_done.copy_(done)
        row_terminated.copy_(terminated)
        row_truncated.copy_(truncated)
        row_valid.copy_(valid)
        return next_obs
