"""What a run (or an evaluation) will hold in memory, estimated from the config and one env's spaces before anything
is allocated, and compared with what the machine has: a run that cannot fit is refused in one line naming the sizes
and the flag to change, instead of ending in a MemoryError, an allocator traceback or the OOM killer.

The estimate is an upper bound of the big items, per population member and per torchrun rank on this node:
- the rollout buffer, ``[n_steps, n_envs]`` rows of observation, action and the per-step scalars (impala/appo: its
  ring of ``n_slots`` such rollouts of one actor's envs), twice (the update's flattened copy);
- the model: the MLP trunks' and heads' parameters, with their gradients and Adam's two moments (4 copies), and the
  activations of one minibatch (forward and backward);
- the envs: ``ENV_BYTES`` each (EnvPool's CartPole takes about 26 KB, Gymnasium's about 3 KB; measured on a 2-core
  x86 CPU) plus a few observation buffers.
CPU runs compare all of it with the host's available memory; CUDA runs compare the envs with the host's and the
buffer and model with the GPU's free memory.
"""
from __future__ import annotations

import math
import os

import torch

from fastrl.config import Config, UserError
from fastrl.defaults import ACTOR_LEARNER_ALGOS
from fastrl.run.storage import byte_size

ENV_BYTES = 32 << 10  # per env, beyond its observation buffers
SCALARS = 10  # per step: reward, done, terminated, value, log-prob, advantage, return, ... as 4-byte numbers


def available_host_bytes() -> int | None:
    """The host's available memory (/proc/meminfo's MemAvailable, what psutil reports on Linux too), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def observation_bytes(shape: tuple, dtype: torch.dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def env_bytes(n_envs: int, obs_bytes: int) -> int:
    return n_envs * (ENV_BYTES + 4 * obs_bytes)


def model_bytes(cfg: Config, shape: tuple, action_spec, minibatch: int) -> tuple[int, int]:
    """``(parameters x 4 (weights, gradients, Adam's moments), one minibatch's activations x 3)`` in float32 bytes."""
    in_dim = math.prod(shape) if len(shape) == 1 else 512  # an image's conv encoder ends in a few hundred features
    continuous = action_spec.kind == "continuous"  # a mean and a log-std per action dimension
    out_dim = max(action_spec.n, math.prod(action_spec.shape or (1,)), 1) * (2 if continuous else 1)
    trunks = [list(cfg.hidden_sizes)] if cfg.shared_trunk else [list(cfg.pi_sizes or cfg.hidden_sizes),
                                                                list(cfg.vf_sizes or cfg.hidden_sizes)]
    params = activations = 0
    for trunk, head in zip(trunks, (out_dim, 1) if len(trunks) == 2 else (out_dim + 1,)):
        widths = [in_dim, *trunk, head]
        params += sum((a + 1) * b for a, b in zip(widths, widths[1:]))
        activations += sum(widths)
    return 4 * 4 * params, 4 * 3 * minibatch * activations


# The flags that shrink each part of the estimate.
FLAGS = {"rollout buffer": ("--n-envs", "--n-steps"), "model": ("--hidden-sizes",),
         "minibatch activations": ("--n-envs", "--n-steps", "--hidden-sizes"),
         "envs": ("--n-envs",)}


def check_run_memory(cfg: Config, shape: tuple, dtype: torch.dtype, action_spec, device: torch.device,
                     world_size: int = 1) -> None:
    """Refuse ``cfg`` in one line when its estimated memory (see the module docstring) exceeds what this machine has
    available."""
    members = cfg.population_size
    n_envs = cfg.n_envs if cfg.per_rank or cfg.algo in ACTOR_LEARNER_ALGOS else max(cfg.n_envs // world_size, 1)
    # impala/appo: a ring of n_slots rollouts of one actor's envs each; ppo/a2c: one rollout of the rank's envs
    rollout_envs = cfg.n_slots * cfg.n_envs_per_actor if cfg.algo in ACTOR_LEARNER_ALGOS else n_envs
    obs = observation_bytes(shape, dtype)
    action = 4 * max(math.prod(action_spec.shape or (1,)), len(action_spec.nvec), 1)
    model, activations = model_bytes(cfg, shape, action_spec, max(cfg.batch_size // cfg.n_minibatches, 1))
    device_parts = {"rollout buffer": 2 * cfg.n_steps * rollout_envs * (obs + action + 4 * SCALARS),
                    "model": model, "minibatch activations": activations}
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    host_parts = {"envs": env_bytes(n_envs, obs)}
    if device.type == "cuda":
        _refuse_over(device_parts, members, 1, torch.cuda.mem_get_info(device)[0], f"{device} has free")
    else:
        host_parts.update(device_parts)
    _refuse_over(host_parts, members, ranks, available_host_bytes(), "this machine has available")


def _refuse_over(parts: dict, members: int, ranks: int, have: int | None, where: str) -> None:
    """One line naming the sizes and the flags that shrink the largest parts, when ``parts`` (bytes per member and
    rank) x ``members`` x ``ranks`` exceed ``have``."""
    per_member = sum(parts.values())
    need = per_member * members * ranks
    if have is None or need <= have:
        return
    if members > 1 and per_member * ranks <= have:
        fix = "--n-seeds or --vary (fewer members)"
    else:
        flags, left = [], need
        for name in sorted(parts, key=parts.get, reverse=True):  # the largest parts, until the rest would fit
            flags += [flag for flag in FLAGS[name] if flag not in flags]
            left -= parts[name] * members * ranks
            if left <= have:
                break
        fix = ", ".join(flags) + (" (or raise --n-minibatches)" if "minibatch activations" in parts and
                                  "--n-steps" in flags and "--hidden-sizes" in flags else "")
    each = ", ".join(f"{name} {byte_size(size)}" for name, size in parts.items())
    times = (f" x {members:,} members" if members > 1 else "") + (f" x {ranks} ranks on this node" if ranks > 1 else "")
    raise UserError(f"this run needs about {byte_size(need)} ({each}{times}), more than the {byte_size(have)} {where}: "
                    f"lower {fix}")


def check_eval_memory(n_envs: int, shape: tuple, dtype: torch.dtype, what: str) -> None:
    """Refuse an evaluation of ``n_envs`` envs at once (``--episodes`` x ``--seeds``) that cannot fit in memory."""
    need, have = env_bytes(n_envs, observation_bytes(shape, dtype)), available_host_bytes()
    if have is not None and need > have:
        raise UserError(f"{what} plays {n_envs:,} episodes at once, about {byte_size(need)} of envs, more than the "
                        f"{byte_size(have)} this machine has available: lower --episodes or --seeds")
