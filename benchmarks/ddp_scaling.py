"""Data-parallel scaling: PPO steps/s under torchrun with 1 and 2 ranks, and the all-reduce share of update time.

Each rank runs the same per-rank workload (``n_envs`` x ``n_steps`` per iteration, ``--per-rank true``), so ideal
scaling doubles the global steps/s. Runs are interleaved (1, 2, 1, 2, ...) and the medians reported.

    python -m benchmarks.ddp_scaling [--quick] [--ranks 1 2] [--env CartPole-v1] [--out PATH]

On a GPU node pass ``--device cuda --ranks 1 2 4 8`` (one GPU per rank, NCCL).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import default_out, machine_info, markdown_table, write_json


def run_once(ranks: int, args, run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", "-m",
           "fastrl.train", "--env", args.env, "--n-envs", str(args.n_envs), "--n-steps", str(args.n_steps),
           "--n-epochs", "4", "--n-minibatches", "4", "--per-rank", "true", "--total-steps", str(args.iterations * ranks * args.n_envs * args.n_steps),
           "--device", args.device, "--wandb", "disabled", "--tensorboard", "false", "--progress", "false",
           "--eval-episodes", "0", "--run-dir", str(run_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = rows[args.warmup:]  # the first iterations include allocation and warm-up
    steps = len(rows) * ranks * args.n_envs * args.n_steps  # one row per iteration (log_interval 1)
    seconds = sum(r["time/collect_s"] + r["time/update_s"] for r in rows)  # rank 0's clock
    update = sum(r.get("time/update_s", 0) for r in rows)
    allreduce = sum(r.get("time/allreduce_s", 0) for r in rows)
    return {"sps": steps / seconds, "update_s": update, "allreduce_s": allreduce,
            "allreduce_share": allreduce / update if update else 0.0}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations and repeats")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--n-envs", type=int, default=32)
    parser.add_argument("--n-steps", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    args.iterations = 8 if args.quick else 20
    args.warmup = 2
    repeats = 1 if args.quick else args.repeats
    results: dict = {r: [] for r in args.ranks}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repeats):
            for ranks in args.ranks:
                results[ranks].append(run_once(ranks, args, Path(tmp) / f"r{ranks}_{rep}"))
    base = statistics.median(r["sps"] for r in results[args.ranks[0]]) / args.ranks[0]
    rows, report_rows = [], []
    for ranks in args.ranks:
        sps = statistics.median(r["sps"] for r in results[ranks])
        share = statistics.median(r["allreduce_share"] for r in results[ranks])
        efficiency = sps / (base * ranks)
        report_rows.append({"ranks": ranks, "sps_median": sps, "allreduce_share_of_update": share,
                            "scaling_efficiency": efficiency, "runs": results[ranks]})
        rows.append([ranks, f"{sps:,.0f}", f"{share:.1%}", f"{efficiency:.0%}"])
    report = {"benchmark": "ddp_scaling", **machine_info(args.device), "env": args.env, "n_envs_per_rank": args.n_envs,
              "n_steps": args.n_steps, "iterations": args.iterations, "repeats": repeats, "results": report_rows}
    path = write_json(report, args.out or default_out("ddp_scaling", args.device))
    print(markdown_table(["ranks", "global steps/s (median)", "all-reduce share of update", "scaling efficiency"], rows))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
