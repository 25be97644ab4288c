"""Population runs: the members of ``--n-seeds K`` / ``--vary KEY=v1,v2``, and the statistics over them.

A population is not a trainer of its own: ``fastrl.trainer.Trainer`` carries a member axis K through every tensor of
the run state, and a single run is K = 1. This module holds what is particular to K > 1:

- ``member_configs(cfg)``: the grid of every ``vary`` combination, each repeated ``n_seeds`` times; member ``m`` runs
  with seed ``cfg.seed + m`` and its variant's values, and equals the single run of that config.
- ``member_hyperparameters`` / ``variant_name``: what ``--vary`` set for a member, and its label.
- ``aggregate`` / ``interquartile_mean``: the members' final figures as rliable reports a score over runs.
"""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from fastrl.config import VARY_KEYS, Config, UserError

__all__ = ["VARY_KEYS", "member_configs", "member_hyperparameters", "variant_name", "aggregate",
           "interquartile_mean"]


def member_configs(cfg: Config) -> list[Config]:
    """The members: every combination of ``cfg.vary`` (in key order), each for ``n_seeds`` seeds; member ``m`` has
    seed ``cfg.seed + m``. Each is a validated single-run config (``n_seeds`` 1, no ``vary``)."""
    keys = list(cfg.vary)
    members = []
    for combo in itertools.product(*(cfg.vary[k] for k in keys)):
        for _ in range(cfg.n_seeds):
            values = dict(zip(keys, combo), seed=cfg.seed + len(members), n_seeds=1, vary={})
            try:
                members.append(dataclasses.replace(cfg, **values).validate())
            except UserError as e:
                raise UserError(f"member {len(members)} ({', '.join(f'{k}={v}' for k, v in zip(keys, combo))}): "
                                f"{e}") from None
    return members


def member_hyperparameters(member: Config, cfg: Config) -> dict:
    """What ``--vary`` set for this member (empty for plain seeds)."""
    return {key: getattr(member, key) for key in cfg.vary}


def variant_name(hyperparameters: dict) -> str:
    """``lr=0.001,gamma=0.99``: the label of a member's variant (empty for plain seeds)."""
    return ",".join(f"{key}={value:g}" for key, value in hyperparameters.items())


def interquartile_mean(values) -> float:
    """The mean of the middle 50% (rliable's IQM): sorted values, the lowest and highest quarter trimmed, with
    fractional weights where a quarter splits an element."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = x.size
    lo, hi = 0.25 * n, 0.75 * n
    weights = np.clip(np.minimum(np.arange(1, n + 1), hi) - np.maximum(np.arange(n), lo), 0.0, 1.0)
    return float((x * weights).sum() / weights.sum())


def aggregate(values, seed: int = 0, n_bootstrap: int = 2000) -> dict:
    """``mean``, ``std``, ``iqm`` and the IQM's percentile-bootstrap 95% interval (members resampled with
    replacement), as rliable reports a score over runs."""
    x = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    samples = x[rng.integers(0, x.size, size=(n_bootstrap, x.size))]
    iqms = np.array([interquartile_mean(row) for row in samples])
    return {"n": int(x.size), "mean": float(x.mean()), "std": float(x.std()), "iqm": interquartile_mean(x),
            "iqm_ci95": [float(np.percentile(iqms, 2.5)), float(np.percentile(iqms, 97.5))]}
