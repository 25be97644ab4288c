"""EnvPool's asynchronous mode behind fastrl's step contract: ``n_envs`` envs in ``n_groups`` fixed groups of
``group_size`` envs, each group stepping in C++ while the policy acts on another.

EnvPool is built with ``batch_size = group_size < n_envs``. ``send(action, env_ids)`` hands a group's actions over
and returns at once; ``recv()`` returns the first ``group_size`` envs that finished, which may mix groups (a
recv batch holds whichever envs were ready, in any order) and carries their ids. ``AsyncBatchedEnv`` keeps every
per-env contract of ``fastrl.envs.batched.BatchedEnv``, indexed by env id instead of by position:

- ``valid`` is False on exactly the step after an episode ended (the auto-reset step), per env;
- the step that ends an episode returns its real final observation (truncations bootstrap from it);
- ``stats`` (``EpisodeStats``) count each env's episodes, Atari's by the real game score, as the sync env does.
  Episodes enter its ring in the order they finish, which in async mode is the order of wall-clock completion.

Env ``i`` is seeded ``seed + i`` as in ``BatchedEnv``, so env ``i`` of an async env and of a sync env built with
the same seed follow the same trajectory for the same actions (``tests/test_async.py``).

``reset()`` resets all envs and returns the first observation of each, ``[n_envs, *obs]``, with no env in
flight. Grouping results back into whole groups (so a group acts as one batch, and at most ``n_envs`` results are
ever waited for) is the caller's job: see ``fastrl.distributed.async_collect``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fastrl.config import UserError
from fastrl.envs.batched import BatchedEnv, NormalizedEnv, probe_env
from fastrl.envs.registry import atari_kwargs, is_atari, resolve_backend
from fastrl.envs.stats import EnvStep

ASYNC_GROUPS = 2  # groups in flight: one steps while the policy acts on the other


@dataclass
class AsyncStep(EnvStep):
    """One ``recv()``: an ``EnvStep`` of ``B`` envs (``observation [B, *obs]``, ``reward [B]``, ...) and their
    ``env_ids [B] int64``."""
    env_ids: np.ndarray = None


def async_unsupported(env_id: str, backend: str, n_envs: int, n_groups: int = ASYNC_GROUPS, processes: int = 1,
                      who: str = "process") -> str | None:
    """Why ``env_id`` cannot run in async mode with ``n_envs`` envs per process (one line), or None when it can.
    ``processes``: how many processes (``who``: actors, ranks) share the run's n_envs, so the fix names the
    multiple of the run's own n_envs."""
    if resolve_backend(env_id, backend) != "envpool":
        return f"{env_id} runs on the Gymnasium vector env, and async collection needs an EnvPool env"
    if n_envs < n_groups or n_envs % n_groups:
        together = f" (all {processes} {who}s' envs together)" if processes > 1 else ""
        return (f"async collection splits each {who}'s {n_envs} envs into {n_groups} equal groups: make n_envs"
                f"{together} a multiple of {n_groups * processes}")
    return None


class AsyncBatchedEnv(BatchedEnv):
    """``n_envs`` EnvPool envs in ``n_groups`` groups of ``group_size``: ``send(action, env_ids)`` / ``recv()``.

    Per ``recv()``: one C++ wait for ``group_size`` results, then numpy bookkeeping on ``[group_size]`` arrays (no
    per-env Python loop). Spaces, ``obs_scale``, ``action_spec`` and ``stats`` as ``BatchedEnv``'s, which builds the
    pool (with EnvPool's ``batch_size``); its sync ``step()`` is not used.
    """

    def __init__(self, env_id: str, n_envs: int, seed: int, n_groups: int = ASYNC_GROUPS, num_threads: int = 0,
                 env_kwargs: dict | None = None, n_members: int = 1):
        why = async_unsupported(env_id, "envpool", n_envs, n_groups)
        if why:
            raise UserError(f"env_mode=async: {why}; or use --env-mode sync")
        self.n_groups, self.group_size = n_groups, n_envs // n_groups
        super().__init__(env_id, n_envs, seed, "envpool", num_threads,
                         env_kwargs={**(env_kwargs or {}), "batch_size": self.group_size}, n_members=n_members)

    def _recv(self):
        obs, reward, terminated, truncated, info = self._env.recv()
        return obs, reward, terminated, truncated, info, info["env_id"].astype(np.int64)

    def reset(self) -> torch.Tensor:
        """Reset every env; return the first observations ``[n_envs, *obs]`` in env order. Nothing stays in flight."""
        self._env.async_reset()
        self._restart()
        first = torch.zeros(self.n_envs, *self.observation_shape, dtype=self.observation_dtype)
        for _ in range(self.n_groups):
            obs, *_, env_ids = self._recv()
            first[torch.from_numpy(env_ids)] = self._obs(obs)
        return first

    def send(self, action: torch.Tensor, env_ids: np.ndarray) -> None:
        """Step the envs ``env_ids`` (int ``[k]``, k a multiple of ``group_size``) with ``action`` (CPU ``[k, ...]``)."""
        self._env.send(self._action(action), env_ids.astype(np.int32, copy=False))

    def recv(self) -> AsyncStep:
        """The next ``group_size`` finished env steps (whichever envs were ready), with their env ids."""
        obs, reward, terminated, truncated, info, env_ids = self._recv()
        flags = self._flags(reward, terminated, truncated, info, env_ids)
        return AsyncStep(self._obs(obs), *map(torch.from_numpy, flags), env_ids=env_ids)


def make_async_env(cfg, n_envs: int | None = None, seed: int | None = None,
                   n_groups: int = ASYNC_GROUPS, members: list | None = None) -> NormalizedEnv:
    """The async env ``cfg`` describes, in the NormalizedEnv wrapper the trainer checkpoints (normalization off:
    ``async_unsupported`` refuses it), as ``fastrl.envs.batched.make_env`` builds the sync one. ``members`` (K > 1): the
    envs are K members' blocks, each with its own episode statistics (``fastrl.distributed.async_collect.GroupedRollout``
    groups each member's envs as its single run does)."""
    kwargs = atari_kwargs(cfg, True) if is_atari(cfg.env) else None
    env = AsyncBatchedEnv(cfg.env, n_envs or cfg.n_envs, cfg.seed if seed is None else seed, n_groups, cfg.env_threads,
                          env_kwargs=kwargs, n_members=len(members or [cfg]))
    return NormalizedEnv(env, False, False, [m.gamma for m in members or [cfg]], cfg.obs_clip, cfg.reward_clip)


def resolve_env_mode(cfg, n_envs: int) -> str:
    """``cfg.env_mode`` for a process with ``n_envs`` envs: ``sync`` or ``async``.

    ``auto`` picks async where it can run (``async_unsupported``; never for a recurrent policy, which steps every env
    together) and measured faster: for image observations (a CNN policy), sync for flat ones. Measured on the shared
    2-core development machine (CPU, 1 torch thread, load average 1.2-1.4 from other jobs; ``Trainer.collect()``
    steps/s, medians of 5 interleaved rollouts, async with 2 groups over sync): CartPole-v1 0.51x at 8 envs and 0.73x
    at 64, LunarLander-v2 0.95x at 64 (a small MLP's forward costs about as much as the env step, and halving its
    batch doubles its per-call overhead while the two cores are busy anyway); Breakout-v5 (Nature-CNN) 1.09x at 8
    envs and 1.01x at 64 (the forward of one group overlaps the emulator steps of the other). Not yet measured on
    CUDA, where auto keeps the same rule.
    """
    if cfg.env_mode != "auto":
        return cfg.env_mode
    # normalize_* and time_feature run sync only (Config.validate refuses them with env_mode=async), and a recurrent
    # policy too (the trainer and the actors refuse it with async)
    if (cfg.time_feature or cfg.normalize_obs or cfg.normalize_reward or cfg.recurrent != "none"
            or async_unsupported(cfg.env, cfg.env_backend, n_envs)):
        return "sync"
    observation_shape = probe_env(cfg)[0]
    return "async" if len(observation_shape) == 3 else "sync"
