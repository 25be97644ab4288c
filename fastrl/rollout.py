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
- The sampling noise (``[N, A]``: U(0, 1) for discrete, N(0, 1) for continuous actions) is drawn per step from
  torch's global CPU generator, exactly the draws ``rand_like`` / ``randn_like`` make in the eager forward, so the
  compiled and eager rollouts take the same actions from the same seed (up to float rounding of the logits).
- Row views of the buffer are built once; the graph writes through them (static shapes, no recompiles per ``t``).
- CPU only: on CUDA the buffer lives in pinned host memory and the trainer keeps its compiled forward (CUDA graphs
  under ``reduce-overhead``) with host copies.
"""
from __future__ import annotations

import math
from contextlib import nullcontext

import torch

from fastrl.amp import CompiledOrEager


def sampling_noise(action_spec):
    """``(width, draw)``: the per-step sampling noise has ``width`` columns (the number of actions, discrete, or of
    action dims, continuous) and is drawn with ``draw`` (``torch.rand``: U(0, 1) for Gumbel-max; ``torch.randn``)."""
    if action_spec.kind == "discrete":
        return action_spec.n, torch.rand
    return math.prod(action_spec.shape), torch.randn


# Tests turn this off to check that the hot loops never need a recompile (what makes skipping the guards safe).
SKIP_GUARDS = True


def skip_guards(enabled: bool):
    """A context in which compiled functions skip guard evaluation (``torch.compiler.set_stance(...,
    skip_guard_eval_unsafe=True)``): about 40-140 us per call on the 2-core CPU.

    Only for a hot loop whose compiled functions have already compiled for every input they will see (static
    shapes, dtypes and Python constants): the trainers enter it from their second iteration on."""
    if not (enabled and SKIP_GUARDS):
        return nullcontext()
    return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)


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

    def __init__(self, agent, views, action_spec, autocast, mode: str, env=None):
        self.agent, self.views, self.autocast = agent, views, autocast
        n_steps, n_envs = views.action.shape[:2]
        width, self._draw = sampling_noise(action_spec)
        self.noise_shape = (n_envs, width)
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
        noise = self._draw(self.noise_shape)
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
            self.env.stats.record(self.finished_return[:n_steps][done].numpy(),
                                  self.finished_length[:n_steps][done].numpy())

    # ------------------------------------------------------------------ the compiled functions
    def _act(self, obs, noise, row_obs, row_action, row_logp, row_value):
        with self.autocast():
            action, logp, _, value = self.agent.get_action_and_value(obs, None, noise)
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
