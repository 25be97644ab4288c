"""How long does the bare default command, ``python -m fastrl.train``, take as a whole process?

    python -m benchmarks.default_process [--trees . /tmp/startup-base] [--runs 3] [--seeds 1 2 3 4 5] [--quick]
        [--out FILE] [--extra FLAGS...]

Each tree (a checkout of fastrl) runs the command as it stands (CartPole, every default: TensorBoard, wandb offline,
the final evaluation, the plot) in a fresh process with that tree first on ``PYTHONPATH``, ``--runs`` times,
interleaved (tree A, tree B, A, B, ...) so load drifts hit all alike, for each of ``--seeds`` (``--seed S``). Reported
per tree: the median process wall time (start to exit), the median training seconds (summary.json's ``wall_time_s``)
and the rest (start-up and tear-down), each seed's steps and final evaluation, and whether its runs learned exactly
what the first tree's did on the same seed (equal parameter hashes and episode figures). The load average is recorded at the start and the end; figures are worth publishing below 1.5.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import default_out, load_average, machine_info, markdown_table, write_json

# What must match between trees for "the same learning" (the figures of the same seed).
LEARNING_KEYS = ("total_steps", "episodes", "episode_return_mean", "eval_return_mean", "param_hashes")


def run_once(tree: Path, run_dir: Path, extra: list[str], seed: int | None = None) -> dict:
    seed_flags = ["--seed", str(seed)] if seed is not None else []
    cmd = [sys.executable, "-m", "fastrl.train", "--run-dir", str(run_dir), *seed_flags, *extra]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=run_dir.parent)
    process_s = time.perf_counter() - start
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"tree": str(tree), "seed": summary.get("seed"), "process_s": process_s, "training_s": summary["wall_time_s"],
            "outside_training_s": process_s - summary["wall_time_s"],
            "learning": {key: summary.get(key) for key in LEARNING_KEYS}}


def tree_commit(tree: Path) -> str:
    """The tree's checked-out commit (short hash, ``+`` when it has uncommitted changes), or ``?``."""
    def git(*args):
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "--short", "HEAD") or "?"
    return commit + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.default_process")
    parser.add_argument("--trees", nargs="+", default=["."], help="fastrl checkouts to compare (each on PYTHONPATH)")
    parser.add_argument("--runs", type=int, default=3, help="runs per tree (the median is reported)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="run each of these seeds (default: the command's own seed)")
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="flags appended to the command")
    parser.add_argument("--quick", action="store_true", help="one run per tree of 8k steps (a smoke test of this script)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.extra = 1, [*args.extra, "--total-steps", "8192"]
    trees = [Path(tree).resolve() for tree in args.trees]
    info = machine_info()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            for seed in args.seeds or [None]:
                for t, tree in enumerate(trees):
                    run_dir = Path(tmp) / f"tree{t}-run{run}-seed{seed}"
                    rows.append({"run": run, **run_once(tree, run_dir, args.extra, seed)})
                    print(json.dumps(rows[-1]), flush=True)
    reference = {r["seed"]: r["learning"] for r in reversed(rows) if r["tree"] == str(trees[0])}
    table = []
    for tree in trees:
        mine = [r for r in rows if r["tree"] == str(tree)]
        table.append({"tree": f"{tree} ({tree_commit(tree)})", "runs": len(mine),
                      "process s (median)": round(statistics.median(r["process_s"] for r in mine), 2),
                      "training s (median)": round(statistics.median(r["training_s"] for r in mine), 2),
                      "outside training s (median)": round(statistics.median(r["outside_training_s"] for r in mine), 2),
                      "steps per seed": ", ".join(f"{r['learning']['total_steps']:,}" for r in mine),
                      "eval per seed": ", ".join(f"{r['learning']['eval_return_mean']:.0f}" for r in mine),
                      "same learning": all(r["learning"] == reference[r["seed"]] for r in mine)})
    report = {"benchmark": "default_process", "command": "python -m fastrl.train " + " ".join(args.extra), **info,
              "load_average_at_end": load_average(), "runs": rows, "table": table}
    path = write_json(report, args.out or default_out("default_process"))
    print(markdown_table(list(table[0]), [list(row.values()) for row in table]))
    print(f"load average at start {info['load_average_at_start']}, at end {report['load_average_at_end']}; "
          f"results in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
