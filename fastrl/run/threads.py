"""How many envs and torch threads this process runs, decided once from the config, the device and the shapes."""
from __future__ import annotations

import os
from contextlib import contextmanager

import torch

from fastrl.config import Config


def rank_n_envs(cfg: Config, world_size: int) -> int:
    """Envs of each member on each rank: ``n_envs / world_size``, or ``n_envs`` with ``per_rank``."""
    return cfg.n_envs if cfg.per_rank else cfg.n_envs // world_size


WIDE_LAYER = 256


def torch_thread_counts(cfg: Config, device: torch.device, n_members: int = 1, flat_observations: bool = True,
                        widest_layer: int = 0, world_size: int = 1) -> tuple[int, int]:
    """``(collect, update)``: torch's intra-op threads while collecting and while updating (0: leave torch's own).

    ``torch_threads`` > 0 sets both. Auto (0) on CPU:
    - collect: 1, but all cores (at most 8) for a population of 4 or more MLP members. Small MLPs gain nothing from
      intra-op threads, and spinning OpenMP workers collapse throughput when the cores are shared (with EnvPool's
      threads, or other jobs). CNNs too: on the shared 2-core box a Nature-CNN forward of 8 frames took 5 ms on 1
      thread, 300 ms on 2. 4 and 16 CartPole members trained 1.2x and 1.25x faster on 2 threads than on 1.
    - update: all cores (at most 8) for an MLP population, or an MLP with a layer of ``WIDE_LAYER`` units or more
      (``widest_layer``). No env steps run then, and such matmuls share well (2 cores, 2026-12-03): 3 members'
      update ran 1.9x (HalfCheetah, 256x256, minibatch 64), 1.7x (Walker2d, Hopper: minibatch 32) and 1.24x (Ant,
      64x64) faster on 2 threads than on 1, a single Walker2d run's 1.75x; single 64x64 runs (CartPole,
      LunarLander, ppo/mujoco's HalfCheetah) gained nothing, and Ant's rollout ran 1.5x slower on 2. Under torchrun the ranks
      share the cores: 1.
    """
    if cfg.torch_threads or device.type != "cpu":
        return cfg.torch_threads, cfg.torch_threads
    cores = min(os.cpu_count() or 1, 8)
    collect = cores if n_members >= 4 and flat_observations else 1
    wide = n_members >= 2 or widest_layer >= WIDE_LAYER
    update = cores if flat_observations and wide and world_size == 1 else collect
    return collect, update


@contextmanager
def torch_threads(count: int):
    """Run the block on ``count`` intra-op threads (0: as it is), then restore the previous count."""
    previous = torch.get_num_threads()
    if count and count != previous:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)
