"""Asynchronous rollout collection (``env_mode: async``): the trainer's ``[T, N]`` buffer filled from an
``AsyncBatchedEnv``, one env group stepping in C++ while the policy acts on another.

The buffer is exactly what the sync loop (``Trainer._collect``) writes: time-major, each env's T steps in order,
row t of env i holding ``obs_t``, the action taken on it (with its log-prob and value) and the step's reward and
flags; ``next.state_value[t] = state_value[t + 1]`` (on a truncated step, V of the episode's real final
observation, which the reset step's row holds) and V of the observation after step T-1 for the last row.

Groups are fixed (env ids ``g * B ... (g + 1) * B - 1``) and act as wholes: a recv batch, which may mix groups,
is written by env id (vectorized index writes) and a group acts once all B of its envs have arrived, so every env
of a group is at the same step t. Each group makes T steps per ``collect()``, then waits (parked) for the next
one: the update needs the whole rollout, and the next rollout's actions need the updated weights. At most N
results are waited for at any time, and only whole groups are in flight, so ``recv`` (which waits for B results)
never waits for an env that was not sent.

Per ``recv``: one C++ wait, index writes of ``[B]`` results into the buffer, and for each group completed, one
policy forward on its ``[B]`` observations, slice writes and ``send``. No per-env Python loop, no ``.item()``.
"""
from __future__ import annotations

import numpy as np
import torch


class AsyncCollector:
    """Fills ``trainer.buffer`` from ``trainer.env`` (a NormalizedEnv around an ``AsyncBatchedEnv``), reading
    ``trainer.policy_step``, ``bootstrap_value``, ``timer`` and ``next_obs`` afresh at each ``collect()``."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.env = trainer.env.env
        n_envs, n_groups, size = self.env.n_envs, self.env.n_groups, self.env.group_size
        self.n_groups, self.group_size = n_groups, size
        self.group_env_ids = [np.arange(g * size, (g + 1) * size) for g in range(n_groups)]
        self.group_of_env = np.arange(n_envs) // size
        # Where each env's newest observation waits until its whole group has arrived.
        pending = torch.zeros(n_envs, *self.env.observation_shape, dtype=self.env.observation_dtype)
        self.pending_obs = pending.pin_memory() if trainer.device.type == "cuda" else pending

    def _act(self, group: int, t: int, obs: torch.Tensor) -> None:
        """Policy forward on ``group``'s observations ``obs [B, *obs]`` (step ``t``), row writes, then send."""
        tr = self.trainer
        cols = slice(group * self.group_size, (group + 1) * self.group_size)
        with tr.timer.section("policy"):
            action, logp, _, value = tr.policy_step(obs.to(tr.device, non_blocking=True))
            tr._obs[t, cols].copy_(obs)
            tr._action[t, cols].copy_(action)
            tr._logp[t, cols].copy_(logp)
            tr._value[t, cols].copy_(value)
            action_cpu = action.cpu()
        self.env.send(action_cpu, self.group_env_ids[group])

    def collect(self) -> None:
        """One ``[T, N]`` rollout; advances ``trainer.next_obs`` and ``trainer.global_step`` as the sync loop does."""
        tr, env, n_steps = self.trainer, self.env, self.trainer.cfg.n_steps
        size, pending = self.group_size, self.pending_obs
        step_of_group = np.zeros(self.n_groups, dtype=np.int64)  # the row each group's in-flight step writes
        arrived = np.zeros(self.n_groups, dtype=np.int64)
        for group in range(self.n_groups):  # group 0 steps while the policy acts on group 1
            cols = slice(group * size, (group + 1) * size)
            self._act(group, 0, tr.next_obs[cols])
        in_flight = self.n_groups
        while in_flight:
            with tr.timer.section("env"):
                step = env.recv()
            groups = self.group_of_env[step.env_ids]
            index = (torch.from_numpy(step_of_group[groups]), torch.from_numpy(step.env_ids))
            tr._reward.index_put_(index, step.reward)
            tr._terminated.index_put_(index, step.terminated)
            tr._truncated.index_put_(index, step.truncated)
            tr._done.index_put_(index, step.done)
            tr._valid.index_put_(index, step.valid)
            pending.index_copy_(0, index[1], step.observation)
            arrived += np.bincount(groups, minlength=self.n_groups)
            for group in np.flatnonzero(arrived == size).tolist():  # whole groups: at most n_groups per recv
                arrived[group] = 0
                step_of_group[group] += 1
                if step_of_group[group] < n_steps:
                    self._act(group, int(step_of_group[group]), pending[group * size:(group + 1) * size])
                else:
                    in_flight -= 1  # parked until the next collect()
        next_obs = pending.clone()  # every env's observation after its step T-1
        with tr.timer.section("policy"):
            tr._next_value[:-1].copy_(tr._value[1:])
            tr._next_value[-1].copy_(tr.bootstrap_value(next_obs.to(tr.device, non_blocking=True)))
        tr.next_obs = next_obs
        tr.global_step += tr.steps_per_iteration
