"""Does the embedded default solve CartPole-v1, and how fast: eager against the compiled update, side by side.

    python -m benchmarks.default_solve [--seeds 1 2 3 4 5] [--modes off auto] [--quick] [--out FILE]

Each run is a fresh process, ``python -m fastrl.train --seed S --compile MODE --stop-at-return 475`` (the last-100
rule), interleaved by seed (off, default, off, default, ...) so load drifts hit both alike. Reported per mode: how many
seeds reached 475, the median steps and training seconds to 475, and the median process wall time (imports,
compiling and the final evaluation included). ``default`` compiles the update step; its inductor cache is warmed by
one untimed run first, as a second run on a user's machine finds it (the cold compile is ``benchmarks/learner.py``'s
figure; ``compile: auto`` on CPU compiles this run only once that cache is warm).
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


def run_once(seed: int, mode: str, run_dir: Path, total_steps: int) -> dict:
    cmd = [sys.executable, "-m", "fastrl.train", "--seed", str(seed), "--compile", mode, "--stop-at-return", "475",
           "--total-steps", str(total_steps), "--run-dir", str(run_dir), "--progress", "false", "--wandb", "disabled"]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    process_s = time.perf_counter() - start
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"seed": seed, "mode": mode, "reached": summary["reached_return"], "steps_to_475": summary["steps_to_return"],
            "time_to_475_s": summary["time_to_return_s"], "training_s": summary["wall_time_s"],
            "process_s": process_s, "last_100": summary["episode_return_mean"], "eval": summary["eval_return_mean"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.default_solve")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--modes", nargs="+", default=["off", "default"])
    parser.add_argument("--total-steps", type=int, default=250_000, help="the default's own budget")
    parser.add_argument("--quick", action="store_true", help="one seed, 8k steps (a smoke test of this script)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.total_steps = args.seeds[:1], 8192
    info = machine_info()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if "default" in args.modes and not args.quick:
            run_once(0, "default", Path(tmp) / "warm", args.total_steps)  # fills the on-disk compile cache
        for seed in args.seeds:
            for mode in args.modes:
                rows.append(run_once(seed, mode, Path(tmp) / f"{mode}-{seed}", args.total_steps))
                print(json.dumps(rows[-1]), flush=True)
    table = []
    for mode in args.modes:
        mine = [r for r in rows if r["mode"] == mode]
        solved = [r for r in mine if r["reached"]]
        table.append({"compile": mode, "solved": f"{len(solved)}/{len(mine)}",
                      "steps to 475 (median)": statistics.median(r["steps_to_475"] for r in solved) if solved else None,
                      "training s to 475 (median)": round(statistics.median(r["time_to_475_s"] for r in solved), 1)
                      if solved else None,
                      "process s (median)": round(statistics.median(r["process_s"] for r in mine), 1)})
    report = {"benchmark": "default_solve", **info, "load_average_at_end": load_average(), "runs": rows, "table": table}
    path = write_json(report, args.out or default_out("default_solve"))
    print(markdown_table(list(table[0]), [list(row.values()) for row in table]))
    print(f"load average at start {info['load_average_at_start']}; results in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
