"""IMPALA actors in local processes vs Ray actors: actor env steps/s, learner steps/s and object-store bytes/s.

    python -m benchmarks.ray_actors [--quick] [--envs CartPole-v1 Breakout-v5] [--rounds 1] [--out FILE]

Each case is a real ``fastrl.run.session.run`` run with the same shapes for both pools (the same total envs: ``n_envs``, all
actors' together), side by side in one process: ``--actors local`` (spawned processes, shared-memory slots) and
``--actors ray`` (Ray actors on a single-node Ray cluster this script starts on 127.0.0.1, so both pools share the
same cores). Rates are medians over the log intervals after the first (which holds the actors' start-up). Ray's
extra columns: ``object store MB/s`` (rollout bytes that reached the learner per second of the run), ``bytes/step``
(per env step: uint8 frames stay uint8) and ``weights/publish`` (the one ``ray.put`` per publish). Rounds alternate
local and Ray so that drift in the machine's load hits both. JSON goes to
benchmarks/results/<machine>/ray_actors.json (``--out`` to put it elsewhere).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.common import default_out, machine_info, markdown_table, package_version, write_json

# Per env: the shapes both pools run (n_envs: all actors' envs together; n_steps per rollout).
SHAPES = {
    "CartPole-v1": dict(n_actors=2, n_envs=32, n_steps=32, n_slots=4, learner_batch=1, hidden_sizes=[64, 64]),
    "Breakout-v5": dict(n_actors=2, n_envs=16, n_steps=32, n_slots=4, learner_batch=1, encoder="nature_cnn",
                        gamma=0.99, ent_coef=0.01, env_mode="sync"),
}


def run_case(env: str, actors: str, total_steps: int) -> dict:
    from fastrl.config import make_config
    from fastrl.run.session import run

    with tempfile.TemporaryDirectory() as tmp:
        cfg = make_config({"algo": "impala", "env": env, "actors": actors, **SHAPES[env], "n_minibatches": 1,
                           "total_steps": total_steps, "lr": 6e-4, "log_interval": 5, "eval_episodes": 0,
                           "tensorboard": False, "wandb": "disabled", "progress": False, "plot": False,
                           "run_dir": tmp, "seed": 1, "device": "cpu"})
        summary = run(cfg)
        rows = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    steady = rows[1:] or rows

    def med(key):
        return statistics.median(r[key] for r in steady if key in r)

    out = {"env": env, "actors": actors, "n_actors": cfg.n_actors, "n_envs_per_actor": cfg.n_envs_per_actor,
           "total_envs": cfg.n_envs, "n_steps": cfg.n_steps, "total_steps": summary["total_steps"],
           "wall_time_s": summary["wall_time_s"], "actor_steps_per_s": med("charts/actor_sps"),
           "learner_steps_per_s": med("charts/SPS"), "policy_lag_mean": summary["policy_lag_mean"],
           "learner_wait_s": sum(r["queue/learner_wait_s"] for r in steady),
           "update_s": sum(r["time/update_s"] for r in steady), "actor_restarts": summary["actor_restarts"],
           "lost_rollouts": summary["lost_rollouts"]}
    if actors == "ray":
        out.update({"object_store_MBps": med("charts/object_store_MBps"),
                    "object_store_bytes": summary["object_store_bytes"],
                    "bytes_per_env_step": summary["object_store_bytes"] / max(summary["total_steps"], 1),
                    "rollout_object_MB": summary["object_store_bytes"] / max(summary["rollouts_received"], 1) / 1e6,
                    "weight_publishes": summary["weight_publishes"],
                    "weight_MB_per_publish": summary["weight_bytes"] / max(summary["weight_publishes"], 1) / 1e6})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ray_actors", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a quarter of the steps per case")
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "Breakout-v5"], choices=sorted(SHAPES))
    parser.add_argument("--rounds", type=int, default=1, help="local/ray pairs per env (medians are reported)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    # A loopback-only cluster that lives for this script: no token auth, so ray.init writes no ~/.ray/auth_token
    # (which would turn token auth on for clusters started later with `ray start`).
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    steps = {"CartPole-v1": 200_000, "Breakout-v5": 40_000}
    info = machine_info()  # the load average at start, before any case runs
    # One single-node cluster for every Ray case, on loopback, sized like the machine (the local pool's cores).
    ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR")
    results = []
    try:
        for env in args.envs:
            total = steps[env] // (4 if args.quick else 1)
            for _round in range(args.rounds):
                for actors in ("local", "ray"):
                    results.append({**run_case(env, actors, total), "round": _round})
    finally:
        ray.shutdown()
    summary = []
    for env in args.envs:
        by_pool = {a: [r for r in results if r["env"] == env and r["actors"] == a] for a in ("local", "ray")}
        med = {a: {k: statistics.median(r[k] for r in rs) for k in ("actor_steps_per_s", "learner_steps_per_s")}
               for a, rs in by_pool.items()}
        summary.append({"env": env, **{f"{a}_{k}": v for a, m in med.items() for k, v in m.items()},
                        "ray_over_local_actor_sps": med["ray"]["actor_steps_per_s"] / med["local"]["actor_steps_per_s"],
                        "ray_over_local_learner_sps": med["ray"]["learner_steps_per_s"]
                        / med["local"]["learner_steps_per_s"]})
    report = {"benchmark": "ray_actors", **info, "ray": package_version("ray"), "quick": args.quick,
              "rounds": args.rounds, "seed": 1, "command": "python -m benchmarks.ray_actors " + " ".join(argv or sys.argv[1:]),
              "results": results, "summary": summary}
    path = write_json(report, args.out or default_out("ray_actors"))
    headers = ["env", "pool", "envs", "actor steps/s", "learner steps/s", "lag mean", "object store MB/s",
               "bytes/step", "rollout MB", "weights MB/publish"]
    rows = [[r["env"], r["actors"], r["total_envs"], round(r["actor_steps_per_s"]), round(r["learner_steps_per_s"]),
             round(r["policy_lag_mean"], 2), round(r.get("object_store_MBps", 0.0), 1),
             round(r.get("bytes_per_env_step", 0.0)), round(r.get("rollout_object_MB", 0.0), 2),
             round(r.get("weight_MB_per_publish", 0.0), 2)] for r in results]
    print(markdown_table(headers, rows))
    print(markdown_table(["env", "ray / local actor steps/s", "ray / local learner steps/s"],
                         [[s["env"], round(s["ray_over_local_actor_sps"], 2), round(s["ray_over_local_learner_sps"], 2)]
                          for s in summary]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
