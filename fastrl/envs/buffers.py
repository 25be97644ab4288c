"""Preallocated time-major rollout storage as a TensorDict ``[T, N]`` with TorchRL-style key names (not TorchRL's
layout: ``fastrl.to_torchrl`` converts a rollout for TorchRL's losses and value estimators).

Keys: ``observation [T, N, *obs]`` (native dtype: uint8 frames stay uint8), ``action``,
``sample_log_prob``, ``state_value``, ``valid`` (False on auto-reset steps) and under ``"next"``:
``reward``, ``done``, ``terminated``, ``truncated``, ``state_value`` (V of the observation that
followed the step, the real final observation for truncated episodes). ``advantage`` and
``value_target`` are filled by the algorithm; a recurrent policy's rollout adds ``episode_start`` and
``recurrent_state``.
"""
from __future__ import annotations

import torch

from fastrl._startup import import_tensordict
from fastrl.envs.spaces import ActionSpec

TensorDict = import_tensordict().TensorDict  # before any other tensordict import: see fastrl._startup


def make_rollout_buffer(n_steps: int, n_envs: int, obs_shape: tuple, obs_dtype: torch.dtype, action_spec: ActionSpec,
                        device: torch.device | str = "cpu", state_size: int = 0) -> TensorDict:
    """Allocate the ``[T, N]`` buffer once. Host storage is pinned when the learner is on CUDA. ``state_size`` S (a
    recurrent policy's): with ``episode_start [T, N]`` and ``recurrent_state [T, N, S]`` (see ``fastrl.run.recurrent``)."""
    T, N = n_steps, n_envs
    action_dtype = torch.int64 if action_spec.kind == "discrete" else torch.float32  # MultiDiscrete: one per part

    def f32():
        return torch.zeros(T, N, dtype=torch.float32)

    def flag():
        return torch.zeros(T, N, dtype=torch.bool)

    buffer = TensorDict({
        "observation": torch.zeros(T, N, *obs_shape, dtype=obs_dtype),
        "action": torch.zeros(T, N, *action_spec.shape, dtype=action_dtype),
        "sample_log_prob": f32(),
        "state_value": f32(),
        "advantage": f32(),
        "value_target": f32(),
        "valid": flag(),
        "next": TensorDict({"reward": f32(), "done": flag(), "terminated": flag(), "truncated": flag(),
                            "state_value": f32()}, batch_size=[T, N]),
    }, batch_size=[T, N])
    if state_size:
        buffer["episode_start"], buffer["recurrent_state"] = flag(), torch.zeros(T, N, state_size)
    if torch.device(device).type == "cuda":
        buffer = buffer.pin_memory()
    return buffer

