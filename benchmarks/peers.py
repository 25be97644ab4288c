"""fastrl against Stable-Baselines3 and rejax (JAX): learning curves, time to threshold, steps/s; the zoo's scores.

    python -m benchmarks.peers [--quick] [--part peers|learning|all|sb3-zoo|sb3-default|rejax|speed]
                               [--algos ppo a2c] [--envs ...] [--seeds N] [--no-compiled] [--out-dir DIR]

``all`` is peers + learning; ``speed`` is sb3-zoo + sb3-default + rejax (issue 10's comparisons, one command).

Each part answers one question in its own module: ``peers`` and ``learning`` in ``benchmarks/peers_learning.py``,
``sb3-zoo`` and ``sb3-default`` in ``benchmarks/peers_sb3.py``, ``rejax`` in ``benchmarks/peers_rejax.py``; SB3's
set-up and the run and curve helpers they share in ``benchmarks/peers_common.py``.

JSON goes to benchmarks/results/<machine-tag>/peers.json (``learning.json`` for the learning part;
``peers_sb3_zoo.json``, ``peers_sb3_default.json``, ``peers_rejax.json`` for the others, or ``--out-dir``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import torch

from benchmarks.common import default_out, machine_info, package_version, write_json
from benchmarks.peers_learning import (LEARNING_PROFILES, PROFILES, THRESHOLDS, ZOO_SOURCE, bench_learning,
                                       bench_peers, learning_table, peers_table)
from benchmarks.peers_rejax import REJAX_PPO_CARTPOLE, REJAX_SOURCE, bench_rejax, pin_jax_to_cpu, rejax_table
from benchmarks.peers_sb3 import SB3_DEFAULT_BUDGET, ZOO_PPO_CARTPOLE, ZOO_PPO_SOURCE, bench_sb3, sb3_table

SPEED_PARTS = ["sb3-zoo", "sb3-default", "rejax"]
SPEED_BUDGETS = {"sb3-zoo": {"full": ZOO_PPO_CARTPOLE["n_timesteps"], "quick": 30_000},
                 "sb3-default": SB3_DEFAULT_BUDGET,
                 "rejax": {"full": REJAX_PPO_CARTPOLE["total_timesteps"], "quick": 20_000}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="1 seed, CartPole-v1 + Acrobot-v1, short budgets; learning: PPO CartPole only")
    parser.add_argument("--part", choices=["peers", "learning", "all", *SPEED_PARTS, "speed"], default="all",
                        help="all = peers + learning; speed = sb3-zoo + sb3-default + rejax")
    parser.add_argument("--envs", nargs="+", default=None, choices=list(THRESHOLDS),
                        help="peers envs (default: the profile's)")
    parser.add_argument("--algos", nargs="+", default=None, choices=["ppo", "a2c"],
                        help="algorithms (default: ppo a2c)")
    parser.add_argument("--libs", nargs="+", default=["fastrl", "sb3"], choices=["fastrl", "sb3"])
    parser.add_argument("--seeds", type=int, default=0, help="seeds per case (default 3 full, 1 quick)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both libraries (default 1)")
    parser.add_argument("--eval-episodes", type=int, default=10, help="learning part: deterministic eval episodes")
    parser.add_argument("--max-steps", type=int, default=0,
                        help="cap every run's step budget (a smoke test; learning rows then miss the zoo's budget)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--out", default=None, help="peers JSON (default benchmarks/results/<machine>/peers.json)")
    parser.add_argument("--learning-out", default=None,
                        help="learning JSON (default benchmarks/results/<machine>/learning.json)")
    parser.add_argument("--out-dir", default=None,
                        help="folder of the sb3-zoo / sb3-default / rejax JSON (default benchmarks/results/<machine>/)")
    parser.add_argument("--no-compiled", action="store_true",
                        help="sb3-zoo / sb3-default / rejax: fastrl eager only (no fastrl[compiled] runs)")
    args = parser.parse_args(argv)
    profile = "quick" if args.quick else "full"
    envs = args.envs or PROFILES[profile]["envs"]
    algos = args.algos or PROFILES[profile]["algos"]
    seeds = args.seeds or PROFILES[profile]["seeds"]
    speed_parts = SPEED_PARTS if args.part == "speed" else [args.part] if args.part in SPEED_PARTS else []
    if "rejax" in speed_parts:
        pin_jax_to_cpu(args.threads)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*precision lowered.*")
    common = {"machine": machine_info(), "quick": args.quick, "threads": args.threads,
              "versions": {p: package_version(p) for p in ("fastrl", "stable_baselines3", "envpool", "gymnasium",
                                                          "box2d", "mujoco", "torch", "rejax", "gymnax", "jax")},
              "command": "python -m benchmarks.peers " + " ".join(sys.argv[1:] if argv is None else argv)}
    if args.part in ("peers", "all"):
        started = time.perf_counter()
        results = bench_peers(envs, algos, seeds, profile, args.threads, args.libs, args.max_steps,
                              not args.no_progress)
        report = {"benchmark": "peers", **common, "seeds": seeds, "results": results,
                  "wall_time_s": time.perf_counter() - started}
        report["machine"]["load_average_at_end"] = machine_info()["load_average_at_start"]
        path = write_json(report, args.out or default_out("peers"))
        print(peers_table(results))
        print(f"\nwrote {path}")
    if args.part in ("learning", "all"):
        pairs = [(a, e) for a, e in LEARNING_PROFILES[profile] if a in algos]
        started = time.perf_counter()
        results = bench_learning(pairs, seeds, args.threads, args.eval_episodes, args.max_steps, not args.no_progress)
        report = {"benchmark": "learning", **common, "seeds": seeds, "zoo_source": ZOO_SOURCE, "results": results,
                  "wall_time_s": time.perf_counter() - started}
        path = write_json(report, args.learning_out or default_out("learning"))
        print(learning_table(results))
        print(f"\nwrote {path}")
    for part in speed_parts:
        started = time.perf_counter()
        libs = ["rejax" if part == "rejax" else "sb3", "fastrl"] + (
            [] if args.no_compiled else ["fastrl[compiled]", "fastrl[torch-env]"])
        if part == "sb3-zoo" and profile == "full" and not args.max_steps:  # the default at its own 250k budget
            libs.append("fastrl[default]")
        budget = SPEED_BUDGETS[part][profile]
        budget = min(budget, args.max_steps) if args.max_steps else budget
        if part == "rejax":
            entry = bench_rejax(seeds, args.threads, libs, budget, not args.no_progress)
            table, sources = rejax_table(entry), {"rejax_source": REJAX_SOURCE}
        else:
            entry = bench_sb3(part, seeds, args.threads, libs, budget, not args.no_progress)
            table, sources = sb3_table(entry), {"zoo_source": ZOO_PPO_SOURCE} if part == "sb3-zoo" else {}
        report = {"benchmark": part, **common, "seeds": seeds, **sources, "result": entry,
                  "wall_time_s": time.perf_counter() - started}
        if part == "rejax":
            report["xla_flags"] = os.environ.get("XLA_FLAGS", "")
            report["jax_platforms"] = os.environ.get("JAX_PLATFORMS")
        name = "peers_" + part.replace("-", "_")
        path = write_json(report, Path(args.out_dir) / f"{name}.json" if args.out_dir else default_out(name))
        print(table)
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
