"""Advantages for a rollout and its diagnostics, shared by PPO and A2C (their update is ``fastrl.learn.update``).

No env or file code here. Every mean is over ``valid`` samples: auto-reset steps never reach a
loss, an advantage normalization or a statistic. A2C's advantages are these too: with its default
``gae_lambda=1`` GAE is the n-step return bootstrapped from V of the rollout's last next-observation.
"""
from __future__ import annotations

import torch

from fastrl import kernels
from fastrl._startup import import_tensordict

TensorDict = import_tensordict().TensorDict  # before any other tensordict import: see fastrl._startup


def masked_mean(x: torch.Tensor, valid: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The mean of ``x`` over its ``valid`` entries: all of them, or along ``dim`` (kept, size 1)."""
    if dim is None:
        return (x * valid).sum() / valid.sum().clamp(min=1)
    return (x * valid).sum(dim, keepdim=True) / valid.sum(dim, keepdim=True).clamp(min=1)


def compute_advantages(batch: TensorDict, gamma: float, lam: float) -> None:
    """Fill ``advantage`` and ``value_target`` ``[T, N]`` in place with GAE.

    ``next_value`` is V(observation that followed the step): truncated episodes bootstrap from their
    final observation, terminated ones get no bootstrap, and ``done`` cuts the trace.
    """
    nxt = batch["next"]
    advantage, value_target = kernels.gae(nxt["reward"], batch["state_value"], nxt["state_value"], nxt["done"],
                                          nxt["terminated"], gamma, lam)
    batch["advantage"].copy_(advantage)
    batch["value_target"].copy_(value_target)


def explained_variance(value: torch.Tensor, target: torch.Tensor, valid: torch.Tensor,
                       dim: int | None = None) -> torch.Tensor:
    """1 - Var[target - value] / Var[target] over valid samples (NaN-free: 0-variance targets give 0): over all of
    them (0-d), or along ``dim`` (K members' ``[K, B]`` with ``dim=-1``: ``[K]``)."""
    var_target = masked_mean((target - masked_mean(target, valid, dim)).square(), valid, dim)
    resid = target - value
    var_resid = masked_mean((resid - masked_mean(resid, valid, dim)).square(), valid, dim)
    out = torch.where(var_target > 0, 1 - var_resid / var_target.clamp(min=1e-12), torch.zeros_like(var_target))
    return out if dim is None else out.squeeze(dim)
