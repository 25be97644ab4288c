"""Population runs: the members of ``--n-seeds K`` / ``--vary KEY=v1,v2``, and the statistics over them.

A population is not a trainer of its own: ``fastrl.run.trainer.Trainer`` carries a member axis K through every tensor of
the run state, and a single run is K = 1. This module holds what is particular to K > 1:

- ``member_configs(cfg)``: the grid of every ``vary`` combination, each repeated ``n_seeds`` times; member ``m`` runs
  with seed ``cfg.seed + m`` and its variant's values, and equals the single run of that config.
- ``variant_name``: the label of what ``--vary`` set for a member (``MemberState.member_info``).
- ``members_record``: what each member ran (``members.yaml`` beside a population's ``config.yaml``).
- ``aggregate`` / ``interquartile_mean``: the members' final figures as rliable reports a score over runs;
  ``variant_summaries``: the same per variant (over its seeds), never across variants.
"""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from fastrl.config import Config, UserError, check_applicable
from fastrl.defaults import VARY_KEYS



def member_configs(cfg: Config) -> list[Config]:
    """The members: every combination of ``cfg.vary`` (in key order), each for ``n_seeds`` seeds; member ``m`` has
    seed ``cfg.seed + m``. Each is a validated single-run config (``n_seeds`` 1, no ``vary``)."""
    keys = list(cfg.vary)
    members = []
    for combo in itertools.product(*(cfg.vary[k] for k in keys)):
        for _ in range(cfg.n_seeds):
            values = dict(zip(keys, combo), seed=cfg.seed + len(members), n_seeds=1, vary={})
            try:
                check_applicable(cfg.algo, dict(zip(keys, combo)))
                members.append(dataclasses.replace(cfg, **values).validate())
            except UserError as e:
                raise UserError(f"member {len(members)} ({', '.join(f'{k}={v}' for k, v in zip(keys, combo))}): "
                                f"{e}") from None
    return members


def varied_keys(cfg: Config, members: list[Config]) -> list[str]:
    """The keys that make the members' variants: ``cfg.vary``'s, or (members given explicitly, as ``fastrl.cli.tune``'s
    trials) the ``VARY_KEYS`` in which some member differs from ``cfg``."""
    if cfg.vary:
        return list(cfg.vary)
    return [key for key in VARY_KEYS if any(getattr(m, key) != getattr(cfg, key) for m in members)]


def variant_name(hyperparameters: dict) -> str:
    """``lr=0.001,gamma=0.99``: the label of a member's variant (empty for plain seeds)."""
    return ",".join(f"{key}={str(value).lower() if isinstance(value, bool) else format(value, 'g')}"
                    for key, value in hyperparameters.items())


def run_name(variant: str, seed: int) -> str:
    """``lr=0.001-seed3`` (``seed3`` for plain seeds): a member's name as a run of its own (a TensorBoard run)."""
    return f"{variant}-seed{seed}" if variant else f"seed{seed}"


def members_record(member_infos: list[dict]) -> list[dict]:
    """``members.yaml``: per member its index, seed and the values its variant sets; member m ran ``config.yaml``
    with these (and ``n_seeds: 1``, no ``vary``)."""
    return [{"member": info["member"], "seed": info["seed"], "variant": variant_name(info["hyperparameters"]),
             **info["hyperparameters"]} for info in member_infos]


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
    return {"n": int(x.size), "mean": float(x.mean()), "median": float(np.median(x)), "std": float(x.std()),
            "iqm": interquartile_mean(x),
            "iqm_ci95": [float(np.percentile(iqms, 2.5)), float(np.percentile(iqms, 97.5))]}


def variant_summaries(members: list[dict], keys=("episode_return_mean", "eval_return_mean"), seed: int = 0) -> list:
    """Per variant (in member order), over its seeds: ``variant``, ``hyperparameters``, ``members`` (indices) and,
    per key of ``keys`` that its members report, ``aggregate``'s figures. ``members``: summary.json's member rows."""
    groups: dict = {}
    for row in members:
        groups.setdefault(variant_name(row["hyperparameters"]), []).append(row)
    out = []
    for name, rows in groups.items():
        entry = {"variant": name, "hyperparameters": rows[0]["hyperparameters"], "members": [r["member"] for r in rows]}
        for key in keys:
            values = [r[key] for r in rows if r.get(key) is not None]
            if values:
                entry[key] = aggregate(values, seed=seed)
        out.append(entry)
    return out
