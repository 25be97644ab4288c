"""Every seed of a run, derived in one place from the run seed (and the torchrun rank).

- ``env_seed(seed, rank, n_envs)``: the base seed of a rank's envs (env i gets base + i). Contiguous in the run seed
  (seed s + 1 starts where s's ``n_envs`` envs end), so one batched env of ``K * n_envs`` envs seeded
  ``env_seed(s, 0, n_envs)`` holds exactly the envs of the single runs s, ..., s + K - 1: a population's members.
- ``member_generator(seed, purpose, rank)``: a ``torch.Generator`` for one stream of one member (``action``: the
  rollout's sampling noise; ``minibatch``: the update's shuffles), seeded from ``(seed, purpose, rank)`` through
  NumPy's ``SeedSequence``, so streams of different purposes, seeds and ranks never coincide.
- ``seed_process(seed, rank)``: Python's and NumPy's global generators (what third-party code may draw from).
- Initial weights: ``torch.manual_seed(seed)`` before building the agent, the same on every rank.
- IMPALA/APPO actors and evaluation envs: ``actor_env_seed`` and ``fastrl.run.evaluate.eval_seed``, from the run seed too.
"""
from __future__ import annotations

import random

import numpy as np
import torch

_PURPOSES = {"action": 1, "minibatch": 2, "actor": 3}


def env_seed(run_seed: int, rank: int, n_envs: int) -> int:
    """Base seed of this rank's envs (env i gets base + i): distinct across ranks and runs."""
    return ((run_seed + rank * 10_007) * n_envs) % (2**31 - 1)


def actor_env_seed(run_seed: int, actor_id: int, restart: int, n_actors: int, n_envs: int) -> int:
    """Base env seed of an IMPALA/APPO actor incarnation: distinct across actors, restarts and runs."""
    return (run_seed * 100_003 + (actor_id + restart * n_actors) * n_envs) % (2**31 - 1)


def derived_seed(seed: int, purpose: str, rank: int = 0, index: int = 0) -> int:
    """A 63-bit seed for one stream: ``purpose`` (action, minibatch, actor) of run ``seed`` on ``rank``
    (``index``: e.g. an actor's id and restart)."""
    words = np.random.SeedSequence([seed % 2**32, _PURPOSES[purpose], rank, index]).generate_state(2, np.uint32)
    return int(words[0]) << 31 | int(words[1]) >> 1


def member_generator(seed: int, purpose: str, rank: int = 0, device: torch.device | str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(derived_seed(seed, purpose, rank))


def seed_process(seed: int, rank: int = 0) -> None:
    """Python's and NumPy's global generators, per rank."""
    random.seed(seed + rank)
    np.random.seed((seed + rank) % 2**32)
