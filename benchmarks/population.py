"""Population scaling: K seeds in one process (``--n-seeds K``) against one seed, and against K separate processes.

    python -m benchmarks.population [--ks 1 4 16] [--envs CartPole-v1 LunarLander-v2] [--separate 4] [--quick]

Every run is a fresh ``python -m fastrl.train`` process with ``compile: auto`` and an empty compile cache (a user's
first run: imports, compiling, the final evaluation and start-up all count). Per env and K:
- ``process_s``: the process wall time; ``over_one_seed``: that over the K = 1 run's (the plain single run);
- ``agent_steps_per_s``: env steps of all members over the process wall time;
- the members' last-100-episode returns (min and median) and how many reached the env's threshold.
``--separate K``: the same K seeds as K single-run processes, one after another and two at a time (CartPole only),
for the comparison the issue asks for.

Budgets: CartPole-v1 runs the embedded default (its 250k steps per member); LunarLander-v2 runs configs/ppo/lunarlander
for 100k steps per member, CartPoleNoVel-v1 configs/ppo/cartpole_novel_lstm (an LSTM policy) for 16k, and the masked
env of benchmarks/masking.py (a Python Gymnasium env, ``MaskedChoice``, and the same env torch-native,
``MASKED_CHOICE`` on ``env_backend: torch``) for 16k, with that benchmark's hyperparameters (scaling figures, not
solves). JSON to benchmarks/results/<machine>/population.json.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.common import default_out, load_average, machine_info, markdown_table, write_json

_MASKED = ["--n-envs", "8", "--n-steps", "64", "--n-epochs", "4", "--n-minibatches", "4", "--lr", "3e-3"]
SETTINGS = {"CartPole-v1": ([], 250_000, 475.0), "LunarLander-v2": (["--config", "ppo/lunarlander"], 100_000, 200.0),
            "CartPoleNoVel-v1": (["--config", "ppo/cartpole_novel_lstm"], 16_384, 475.0),
            "benchmarks.masking:MaskedChoice": (_MASKED, 16_384, 45.0),
            "benchmarks.masking:MASKED_CHOICE": (_MASKED + ["--env-backend", "torch"], 16_384, 45.0)}


def run_process(env: str, k: int, seed: int, run_dir: Path, total_steps: int, cache: Path) -> dict:
    flags, _, threshold = SETTINGS[env]
    cmd = [sys.executable, "-m", "fastrl.train", *flags, "--env", env, "--seed", str(seed), "--total-steps",
           str(total_steps), "--run-dir", str(run_dir), "--progress", "false", "--wandb", "disabled",
           "--tensorboard", "false", "--plot", "false"]
    if k > 1:
        cmd += ["--n-seeds", str(k)]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "XDG_CACHE_HOME": str(cache),
                        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")})
    process_s = time.perf_counter() - start
    summary = json.loads((run_dir / "summary.json").read_text())
    returns = [m["episode_return_mean"] for m in summary.get("members", [])] or [summary["episode_return_mean"]]
    returns = [r if r is not None else float("nan") for r in returns]
    return {"env": env, "k": k, "seed": seed, "process_s": process_s, "training_s": summary["wall_time_s"],
            "agent_steps": summary["total_steps"], "agent_steps_per_s": summary["total_steps"] / process_s,
            "return_min": min(returns), "return_median": statistics.median(returns),
            "members_reached": sum(r >= threshold for r in returns), "members": len(returns)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.population")
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--envs", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--separate", type=int, default=4, help="K for the separate-process comparison (0: skip)")
    parser.add_argument("--quick", action="store_true", help="tiny budgets (a smoke test of this script)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    info = machine_info()
    info["load_average_start"] = load_average()
    rows, separate = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for env in args.envs:
            steps = 2048 if args.quick else SETTINGS[env][1]
            for k in args.ks:
                rows.append(run_process(env, k, 1, tmp / f"{env}-{k}", steps, tmp / f"cache-{env}-{k}"))
                base = next(r for r in rows if r["env"] == env and r["k"] == args.ks[0])
                rows[-1]["over_one_seed"] = rows[-1]["process_s"] / base["process_s"]
                print(json.dumps(rows[-1]), flush=True)
        if args.separate and "CartPole-v1" in args.envs:
            steps = 2048 if args.quick else SETTINGS["CartPole-v1"][1]
            seeds = list(range(1, args.separate + 1))
            start = time.perf_counter()
            one_by_one = [run_process("CartPole-v1", 1, s, tmp / f"seq-{s}", steps, tmp / f"cache-seq-{s}")
                          for s in seeds]
            sequential_s = time.perf_counter() - start
            start = time.perf_counter()
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(lambda s: run_process("CartPole-v1", 1, s, tmp / f"par-{s}", steps,
                                                    tmp / f"cache-par-{s}"), seeds))
            two_at_a_time_s = time.perf_counter() - start
            in_one = next((r for r in rows if r["env"] == "CartPole-v1" and r["k"] == args.separate), None)
            separate.append({"k": args.separate, "sequential_s": sequential_s, "two_at_a_time_s": two_at_a_time_s,
                             "one_process_s": in_one["process_s"] if in_one else None,
                             "single_process_median_s": statistics.median(r["process_s"] for r in one_by_one),
                             "members_reached_sequential": sum(r["members_reached"] for r in one_by_one)})
            print(json.dumps(separate[-1]), flush=True)
    info["load_average_end"] = load_average()
    out = Path(args.out) if args.out else default_out("population")
    write_json({"machine": info, "population": rows, "separate": separate}, out)
    print(markdown_table(
        ["env", "K", "process s", "x one seed", "agent steps/s", "members >= threshold", "min return"],
        [[r["env"], r["k"], f"{r['process_s']:.1f}", f"{r['over_one_seed']:.2f}", f"{r['agent_steps_per_s']:,.0f}",
          f"{r['members_reached']}/{r['members']}", f"{r['return_min']:.1f}"] for r in rows]))
    for s in separate:
        print(f"\n{s['k']} seeds of CartPole: one process {s['one_process_s']:.1f} s; separate processes one after "
              f"another {s['sequential_s']:.1f} s, two at a time {s['two_at_a_time_s']:.1f} s")
    print(f"\nload average at start {info['load_average_start']}, at end {info['load_average_end']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
