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

``GroupedRollout`` is the loop itself, writing into any ``[T, N]`` rollout (``RolloutViews``): the trainer's
buffer (``Trainer._collect``) or an IMPALA actor's shared-memory slot (``fastrl.distributed.actors``).

Per ``recv``: one C++ wait, index writes of ``[B]`` results into the buffer, and for each group completed, one
policy forward on its ``[B]`` observations, slice writes and ``send``. No per-env Python loop, no ``.item()``.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, NamedTuple

import numpy as np
import torch

# The fields of a rollout row that an env step writes (``EnvStep``'s and ``RolloutViews``' names alike).
ENV_FIELDS = ("reward", "done", "terminated", "truncated", "valid")


class RolloutViews(NamedTuple):
    """The ``[T, N]`` tensors a rollout writes (views into a buffer; see ``fastrl.envs.buffers``); a recurrent
    policy's buffer adds ``episode_start`` and ``recurrent_state`` (else None)."""
    observation: torch.Tensor
    action: torch.Tensor
    sample_log_prob: torch.Tensor
    state_value: torch.Tensor
    valid: torch.Tensor
    reward: torch.Tensor
    done: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    next_value: torch.Tensor
    episode_start: torch.Tensor | None = None
    recurrent_state: torch.Tensor | None = None

    @classmethod
    def of(cls, buffer) -> "RolloutViews":
        nxt = buffer["next"]
        return cls(buffer["observation"], buffer["action"], buffer["sample_log_prob"], buffer["state_value"],
                   buffer["valid"], nxt["reward"], nxt["done"], nxt["terminated"], nxt["truncated"],
                   nxt["state_value"], buffer.get("episode_start", None), buffer.get("recurrent_state", None))

    def write_policy(self, t: int, observation, action, sample_log_prob, state_value) -> None:
        """Row ``t``'s policy side: the observation acted on, the action, its log-probability and the value."""
        self.observation[t].copy_(observation)
        self.action[t].copy_(action)
        self.sample_log_prob[t].copy_(sample_log_prob)
        self.state_value[t].copy_(state_value)

    def write_env(self, t: int, step) -> None:
        """Row ``t``'s env side from an ``EnvStep``: reward and the done / terminated / truncated / valid flags."""
        for name in ENV_FIELDS:
            getattr(self, name)[t].copy_(getattr(step, name))


class Timer:
    """Named wall-clock sections, summed per log interval."""

    def __init__(self):
        self.totals: dict = {}

    @contextmanager
    def section(self, name: str):
        start = time.perf_counter()
        yield
        self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - start

    def pop(self) -> dict:
        out, self.totals = {f"time/{k}_s": v for k, v in self.totals.items()}, {}
        return out


class GroupedRollout:
    """The async rollout loop over an ``AsyncBatchedEnv`` (see the module docstring), into any ``RolloutViews``.

    ``device``: where the policy runs (on CUDA the staging buffer is pinned and copies are non-blocking)."""

    def __init__(self, env, device: torch.device | str = "cpu"):
        self.env, self.device = env, torch.device(device)
        n_envs, n_groups, size = env.n_envs, env.n_groups, env.group_size
        self.n_groups, self.group_size = n_groups, size
        # A population of K members (K blocks of n envs): group g holds the g-th part of every member's block, so
        # each member's envs are grouped as in its single run and every group forward covers all K members.
        k = getattr(env, "n_members", 1)
        n, part = n_envs // k, n_envs // k // n_groups
        self.group_of_env = np.arange(n_envs) % n // part  # env m * n + i (member m's env i) is in group i // part
        self.group_env_ids = [np.flatnonzero(self.group_of_env == g) for g in range(n_groups)]
        self.group_cols = [slice(g * size, (g + 1) * size) if k == 1 else torch.from_numpy(ids)
                           for g, ids in enumerate(self.group_env_ids)]
        # Where each env's newest observation waits until its whole group has arrived.
        pending = torch.zeros(n_envs, *env.observation_shape, dtype=env.observation_dtype)
        self.pending_obs = pending.pin_memory() if self.device.type == "cuda" else pending

    def _act(self, views: RolloutViews, policy_step, timer, group: int, t: int, obs: torch.Tensor) -> None:
        """Policy forward on ``group``'s observations ``obs [B, *obs]`` (step ``t``), row writes, then send."""
        cols = self.group_cols[group]
        with timer.section("policy"):
            action, logp, _, value = policy_step(obs.to(self.device, non_blocking=True))
            for view, value_ in ((views.observation, obs), (views.action, action), (views.sample_log_prob, logp),
                                 (views.state_value, value)):
                view[t][cols] = value_
            action_cpu = action.cpu()
        self.env.send(action_cpu, self.group_env_ids[group])

    def run(self, views: RolloutViews, next_obs: torch.Tensor, policy_step: Callable, bootstrap_value: Callable,
            timer: Timer, on_recv: Callable | None = None) -> torch.Tensor:
        """Fill ``views`` (``[T, N]``) starting from ``next_obs [N, *obs]`` (every env's current observation, no env in
        flight); return the observations after step T-1 (a new tensor). ``policy_step(obs) -> (action, logp,
        entropy, value)`` and ``bootstrap_value(obs) -> value`` as the trainer's; ``timer.section("policy"|"env")``
        times the two; ``on_recv()`` is called after every recv (a heartbeat)."""
        env, size, pending = self.env, self.group_size, self.pending_obs
        n_steps = views.observation.shape[0]
        step_of_group = np.zeros(self.n_groups, dtype=np.int64)  # the row each group's in-flight step writes
        arrived = np.zeros(self.n_groups, dtype=np.int64)
        for group in range(self.n_groups):  # group 0 steps while the policy acts on group 1
            self._act(views, policy_step, timer, group, 0, next_obs[self.group_cols[group]])
        in_flight = self.n_groups
        while in_flight:
            with timer.section("env"):
                step = env.recv()
            if on_recv is not None:
                on_recv()
            groups = self.group_of_env[step.env_ids]
            index = (torch.from_numpy(step_of_group[groups]), torch.from_numpy(step.env_ids))
            for name in ENV_FIELDS:
                getattr(views, name).index_put_(index, getattr(step, name))
            pending.index_copy_(0, index[1], step.observation)
            arrived += np.bincount(groups, minlength=self.n_groups)
            for group in np.flatnonzero(arrived == size).tolist():  # whole groups: at most n_groups per recv
                arrived[group] = 0
                step_of_group[group] += 1
                if step_of_group[group] < n_steps:
                    self._act(views, policy_step, timer, group, int(step_of_group[group]),
                              pending[self.group_cols[group]])
                else:
                    in_flight -= 1  # parked until the next rollout
        last_obs = pending.clone()  # every env's observation after its step T-1
        with timer.section("policy"):
            views.next_value[:-1].copy_(views.state_value[1:])
            views.next_value[-1].copy_(bootstrap_value(last_obs.to(self.device, non_blocking=True)))
        return last_obs

