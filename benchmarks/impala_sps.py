"""IMPALA throughput: actor steps/s, learner samples/s, policy lag and queue statistics for 1-2 actors.

    python -m benchmarks.impala_sps [--quick] [--env CartPole-v1] [--actors 1 2] [--out FILE]

Each case is a real ``fastrl.run.session.run`` run (spawned actors, shared-memory slots) on the tuned CartPole
config's shapes (16 envs x 32 steps per rollout, one rollout and one V-trace step per update). Rates are medians over the log
intervals after the first (which holds the actors' start-up: spawning and importing torch). The queue
columns answer "is the learner ever idle while data is waiting?": ``learner wait`` is the fraction of
time the learner had no full slot, ``idle w/ data`` the time from a slot becoming full to the waiting
learner taking it, and ``full at pickup`` how many slots were full when the learner looked (> 1 means
actors are ahead of the learner). JSON goes to benchmarks/results/<machine>/impala_sps.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.common import default_out, machine_info, markdown_table, write_json


def run_case(env: str, n_actors: int, sync_interval: int, total_steps: int, algo: str = "impala") -> dict:
    from fastrl.config import make_config

    with tempfile.TemporaryDirectory() as tmp:
        cfg = make_config({"algo": algo, "env": env, "n_actors": n_actors, "n_envs": 16 * n_actors, "n_steps": 32,
                           "n_slots": 4 * n_actors, "learner_batch": 1, "n_minibatches": 1, "sync_interval": sync_interval,
                           "total_steps": total_steps, "lr": 1e-3, "gamma": 0.98, "log_interval": 10,
                           "eval_episodes": 0, "tensorboard": False, "wandb": "disabled", "progress": False,
                           "run_dir": tmp, "seed": 1})
        from fastrl.run.session import run
        summary = run(cfg)
        rows = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    steady = rows[1:] or rows

    def med(key):
        return statistics.median(r[key] for r in steady)

    span_s = sum(r["queue/learner_wait_s"] + r["time/update_s"] for r in steady)
    wall_steady = (steady[-1]["global_step"] - rows[0]["global_step"]) / max(med("charts/SPS"), 1e-9)
    return {
        "env": env, "algo": algo, "n_actors": n_actors, "sync_interval": sync_interval or "auto",
        "total_steps": summary["total_steps"], "wall_time_s": summary["wall_time_s"],
        "actor_steps_per_s": med("charts/actor_sps"), "learner_samples_per_s": med("charts/SPS"),
        "policy_lag_mean": summary["policy_lag_mean"], "policy_lag_max": summary["policy_lag_max"],
        "learner_wait_frac": sum(r["queue/learner_wait_s"] for r in steady) / max(wall_steady, 1e-9),
        "learner_update_frac": sum(r["time/update_s"] for r in steady) / max(wall_steady, 1e-9),
        "idle_with_full_slot_ms_mean": statistics.mean(r["queue/idle_with_full_slot_ms_mean"] for r in steady),
        "idle_with_full_slot_ms_max": max(r["queue/idle_with_full_slot_ms_max"] for r in steady),
        "full_slots_at_pickup_mean": statistics.mean(r["queue/full_slots_at_pickup_mean"] for r in steady),
        "actor_wait_s_total": sum(r["queue/actor_wait_s"] for r in steady),
        "accounted_s": span_s,
        "episode_return_mean": summary["episode_return_mean"],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.impala_sps", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k steps per case instead of 400k")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sync", type=int, nargs="+", default=[1, 0], help="sync_interval values (0 = auto)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    total = 100_000 if args.quick else 400_000
    results = [run_case(args.env, n, s, total) for n in args.actors for s in args.sync]
    report = {"benchmark": "impala_sps", **machine_info(), "quick": args.quick, "results": results}
    path = write_json(report, args.out or default_out("impala_sps"))
    headers = ["actors", "sync", "actor steps/s", "learner samples/s", "lag mean", "lag max", "learner wait",
               "idle w/ data ms (mean/max)", "full at pickup", "return"]
    rows = [[r["n_actors"], r["sync_interval"], r["actor_steps_per_s"], r["learner_samples_per_s"],
             round(r["policy_lag_mean"], 2), r["policy_lag_max"], f"{100 * r['learner_wait_frac']:.0f}%",
             f"{r['idle_with_full_slot_ms_mean']:.2f}/{r['idle_with_full_slot_ms_max']:.2f}",
             round(r["full_slots_at_pickup_mean"], 2), round(r["episode_return_mean"] or 0, 1)] for r in results]
    print(markdown_table(headers, rows))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
