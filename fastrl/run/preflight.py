"""Checks that run before any work starts: every combination of config, env, device and launch that would
otherwise fail later (with a traceback, or silently) is refused here with one line saying what is wrong and how
to fix it. (A run directory it cannot create or write is refused when it is claimed: ``fastrl.run.rundir``.)

``check_run(cfg)`` assumes ``cfg`` is a validated ``Config`` (``make_config`` checked each key and the keys'
combinations); it adds what only the machine, the launch and the env can tell:

- launch: under torchrun (``WORLD_SIZE`` > 1) impala/appo are refused, and ``n_envs`` must split evenly into
  per-rank batches that ``n_minibatches`` divides;
- device: CUDA present, the GPU index exists, one GPU per torchrun rank;
- precision: fp16 needs CUDA, bf16 a GPU that has it; deterministic CUDA needs cuBLAS's workspace setting;
- memory: the rollout buffer, model and envs must fit in the memory this machine has (``fastrl.run.footprint``);
- env x model: one env is built (then closed) to learn the observation shape and dtype; the encoder must fit
  them, and normalize_obs needs float observations;
- env x launch: impala/appo actors rebuild the env by name, so a factory known to this process only is refused.
"""
from __future__ import annotations

import functools
import os
import re

import torch

from fastrl.config import Config, UserError
from fastrl.defaults import ACTOR_LEARNER_ALGOS
from fastrl.envs.batched import probe_env
from fastrl.run.footprint import check_run_memory
from fastrl.run.threads import rank_n_envs

_CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")


def check_run(cfg: Config, world_size: int | None = None) -> None:
    """Raise ``UserError`` (one line: what is wrong, how to fix it) if ``cfg`` cannot run here.

    ``world_size``: the number of torchrun processes; None reads ``WORLD_SIZE`` (1 without torchrun).
    Builds one environment to look at its spaces, and the encoder once on CPU; nothing else is created.
    """
    if world_size is None:
        world_size = _env_int("WORLD_SIZE", 1)
    check_launch(cfg, world_size)
    device = check_device(cfg, world_size, _env_int("LOCAL_RANK", 0))
    check_precision(cfg, device)
    from fastrl.envs.registry import is_process_local  # actors rebuild the env by name, in fresh processes
    if cfg.algo in ACTOR_LEARNER_ALGOS and is_process_local(cfg.env):
        what = "a vector env object" if cfg.env.startswith("vector:") else "defined inside a function or as a lambda"
        raise UserError(f"{cfg.algo}'s actor processes cannot rebuild env {cfg.env!r}, {what}: define its class or "
                        "factory at the top level of a module, or use --algo ppo")
    if cfg.actors == "ray":  # fastrl.distributed.ray_actors imports the actor-learner machinery (a second of start-up)
        from fastrl.distributed.ray_actors import check_ray
        check_ray(cfg)
    observation_shape, observation_dtype, action_spec = probe_env(cfg)
    check_run_memory(cfg, observation_shape, observation_dtype, action_spec, device, world_size)
    check_model(cfg, observation_shape, observation_dtype)
    check_env_mode(cfg, world_size)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip().isdigit() else default


def check_launch(cfg: Config, world_size: int) -> None:
    """torchrun: impala/appo run their own processes; the PPO/A2C batch must split evenly across ranks."""
    if world_size <= 1:
        return
    if cfg.algo in ACTOR_LEARNER_ALGOS:  # Ray actors too: one learner, the Ray driver, on one device
        raise UserError(f"{cfg.algo} runs its own actor processes (local or Ray) and one learner, with no DDP across "
                        "GPUs: launch it with python, not torchrun")
    if not cfg.per_rank and cfg.n_envs % world_size:
        raise UserError(f"n_envs={cfg.n_envs} does not split evenly across {world_size} torchrun ranks: make "
                        f"n_envs a multiple of {world_size}, or pass --per-rank true (n_envs per rank)")
    rank_envs = rank_n_envs(cfg, world_size)
    rank_batch = rank_envs * cfg.n_steps
    if rank_batch % cfg.n_minibatches:
        raise UserError(f"each of the {world_size} torchrun ranks collects {rank_envs} envs x {cfg.n_steps} steps = "
                        f"{rank_batch} samples, which n_minibatches={cfg.n_minibatches} does not divide; pick "
                        "n_minibatches that divides it")


def check_device(cfg: Config, world_size: int = 1, local_rank: int = 0) -> torch.device:
    """The learner device this process will use, or UserError if this machine does not have it."""
    if cfg.device.startswith("cuda"):
        if not torch.cuda.is_available():
            build = "a CPU-only torch build" if torch.version.cuda is None else "no usable CUDA device"
            raise UserError(f"device={cfg.device} needs CUDA, but this machine has {build}: use --device cpu (or auto)")
        if world_size > 1 and cfg.device != "cuda":
            raise UserError(f"device={cfg.device} would put every torchrun rank on one GPU: use --device cuda "
                            "(each rank takes cuda:LOCAL_RANK)")
    from fastrl.distributed.torchrun import resolve_device
    device = resolve_device(cfg.device, local_rank)
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            if cfg.device == "cuda" or cfg.device == "auto":
                raise UserError(f"torchrun process LOCAL_RANK={local_rank} has no GPU of its own (this node has "
                                f"{count}): start at most {count} processes per node (--nproc_per_node)")
            raise UserError(f"device={cfg.device} does not exist: this machine has {count} CUDA device(s), "
                            f"cuda:0 to cuda:{count - 1}")
    return device


def check_precision(cfg: Config, device: torch.device) -> None:
    """amp and deterministic settings that the device cannot honour."""
    if cfg.amp == "fp16" and device.type != "cuda":
        where = " (device=auto found no CUDA)" if cfg.device == "auto" else ""
        raise UserError(f"amp=fp16 needs a CUDA device, and this run's device is {device.type}{where}: use --amp bf16 "
                        "(CPU and CUDA) or --amp off")
    if cfg.amp == "bf16" and device.type == "cuda":
        with torch.cuda.device(device):  # autocast's own test; on pre-Ampere GPUs it allocates on the current device
            supported = torch.cuda.is_bf16_supported()
        if not supported:
            raise UserError(f"amp=bf16 is not supported on {torch.cuda.get_device_name(device)}: use --amp fp16 or "
                            "--amp off")
    cublas = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if cfg.deterministic and device.type == "cuda" and cublas not in _CUBLAS_DETERMINISTIC:
        raise UserError("deterministic on CUDA needs cuBLAS's deterministic workspace: export "
                        "CUBLAS_WORKSPACE_CONFIG=:4096:8 before starting the run, or drop --deterministic")


def check_env_mode(cfg: Config, world_size: int = 1) -> None:
    """env_mode=async needs an EnvPool env and, on each rank (or impala/appo actor), n_envs that split into equal
    env groups."""
    if cfg.env_mode != "async":
        return
    from fastrl.envs.async_env import async_unsupported
    if cfg.algo in ACTOR_LEARNER_ALGOS:
        n_envs, processes, who = cfg.n_envs_per_actor, cfg.n_actors, "actor"
    else:
        n_envs = cfg.n_envs if cfg.per_rank else cfg.n_envs // max(world_size, 1)
        processes, who = (1 if cfg.per_rank else max(world_size, 1)), "rank"
    why = async_unsupported(cfg.env, cfg.env_backend, n_envs, processes=processes, who=who)
    if why:
        raise UserError(f"env_mode=async: {why}; or use --env-mode sync (or auto)")


def check_model(cfg: Config, observation_shape: tuple, observation_dtype: torch.dtype) -> None:
    """The encoder ``cfg`` asks for must take the env's observations; normalize_obs needs float ones."""
    from fastrl.learn.models import resolve_encoder
    shape = tuple(observation_shape)
    dtype_name = str(observation_dtype).removeprefix("torch.")
    if cfg.normalize_obs and not observation_dtype.is_floating_point:
        raise UserError(f"normalize_obs needs float observations, and {cfg.env} gives {dtype_name} ones (stored as "
                        f"{dtype_name}, scaled inside the model): drop normalize_obs")
    encoder = resolve_encoder(cfg.encoder, shape, cfg.env)
    if encoder == "mlp":
        return
    named = f"encoder={cfg.encoder}" if cfg.encoder == encoder else f"encoder={cfg.encoder} (here {encoder})"
    if len(shape) != 3:
        raise UserError(f"{named} needs image observations [C, H, W], and {cfg.env} gives shape {shape}: "
                        "use --encoder mlp (or auto)")
    if shape[2] <= 4 < shape[0]:  # e.g. (96, 96, 3): an RGB or stacked image with its channels last
        raise UserError(f"{cfg.env}'s observations of shape {shape} look channels-last [H, W, C], and {named} takes "
                        "channels-first [C, H, W] images: use --encoder mlp")
    if not encoder_fits(encoder, shape):
        fitting = [name for name in ("impala_resnet", "minigrid_cnn", "nature_cnn")
                   if name != encoder and encoder_fits(name, shape)]
        hint = f"use --encoder {' or '.join(fitting + ['mlp'])}"
        raise UserError(f"{named} does not fit {cfg.env}'s observations of shape {shape} (read as channels-first "
                        f"[C, H, W], too small for its convolutions): {hint}")


@functools.lru_cache(maxsize=64)
def encoder_fits(encoder: str, shape: tuple) -> bool:
    """Whether the conv encoder ``encoder`` can be built for ``[C, H, W]`` = ``shape`` (kernels fit the frames)."""
    from fastrl.learn.models import ENCODERS
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        try:
            ENCODERS[encoder](shape)
        except RuntimeError as e:
            if re.search(r"size|Kernel", str(e)):
                return False
            raise
    return True
