"""Issue 41's targets, side by side in one run: fastrl's whole process against rejax's (PPO, CartPole-v1).

    python -m benchmarks.iteration [--runs 3] [--parts single seeds16 population] [--jax-python PATH] [--out FILE]

Every contender is one fresh process, timed start to exit (import, compile, training, fastrl's final evaluation),
run ``--runs`` times round-robin so that load drifts hit all alike; medians are reported, with the load average at
the start and the end. Parts:

- ``single``: PureJaxRL's config (``configs/ppo/cartpole_purejaxrl.yaml``: 4 envs x 128 steps, 4 epochs x 4
  minibatches, lr 2.5e-4, 500k steps, the torch-native env, so the whole iteration is one compiled function):
  ``python -m fastrl.train --config ppo/cartpole_purejaxrl`` against a rejax process at the same settings (import,
  ``jax.jit`` compile, train one seed, evaluate).
- ``seeds16``: the same with ``--n-seeds 16`` against rejax's 16 seeds vmapped in one jit.
- ``population``: the default command, ``python -m fastrl.train``, against ``--n-seeds 4``.

Where rejax differs at the same settings (its own choices, kept): a constant learning rate (fastrl anneals it, as
PureJaxRL does), ``optax.clip`` (element-wise gradient clip at 0.5; fastrl: global-norm clip), flax's lecun-normal
initial weights (fastrl: orthogonal), GAE cut at truncations (fastrl bootstraps them). rejax runs under
``--jax-python`` (a Python with ``pip install -e '.[jax]'``, JAX_PLATFORMS=cpu); thread counts are each library's
default on this machine. Final evaluations: fastrl's deterministic 50 episodes; rejax's own callback (128 sampled
episodes).
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

PUREJAXRL = dict(num_envs=4, num_steps=128, num_epochs=4, num_minibatches=4, learning_rate=2.5e-4, gamma=0.99,
                 gae_lambda=0.95, clip_eps=0.2, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5,
                 total_timesteps=500_000)
# A rejax process: import, jit (vmapped over the seeds), train, and its final evaluation; prints one JSON line.
REJAX_SCRIPT = """
import json, sys
import jax, jax.numpy as jnp
from rejax import PPO
cfg, seeds = json.loads(sys.argv[1]), int(sys.argv[2])
algo = PPO.create(env="CartPole-v1", agent_kwargs=dict(activation="tanh", hidden_layer_sizes=(64, 64)),
                  eval_freq=cfg["total_timesteps"], skip_initial_evaluation=True, **cfg)
train = jax.jit(jax.vmap(algo.train))
_, (_, returns) = train(jax.random.split(jax.random.PRNGKey(0), seeds))
returns = jax.device_get(returns)  # [seeds, evaluations, episodes]
print(json.dumps({"final_eval": [float(r[-1].mean()) for r in returns]}))
"""


def run_process(cmd: list, env: dict | None = None) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return time.perf_counter() - start, out.stdout


def fastrl_contender(flags: list):
    def run() -> dict:
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(tmp) / "run"
            seconds, _ = run_process([sys.executable, "-m", "fastrl.train", "--run-dir", str(run_dir), "--progress",
                                      "false", "--wandb", "disabled", *flags])
            summary = json.loads((run_dir / "summary.json").read_text())
        evals = [m["eval_return_mean"] for m in summary.get("members", [])] or [summary.get("eval_return_mean")]
        return {"process_s": seconds, "training_s": summary["wall_time_s"], "final_eval": evals,
                "compiled": summary.get("compiled")}
    return run


def rejax_contender(python: str, seeds: int):
    def run() -> dict:
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        seconds, out = run_process([python, "-c", REJAX_SCRIPT, json.dumps(PUREJAXRL), str(seeds)], env)
        return {"process_s": seconds, **json.loads(out.strip().splitlines()[-1])}
    return run


def parts(names: list, jax_python: str) -> dict:
    """``{part: {contender: run()}}``; the first contender of each part is the one the ratios divide by."""
    pure = ["--config", "ppo/cartpole_purejaxrl"]
    table = {"single": {"rejax": rejax_contender(jax_python, 1), "fastrl": fastrl_contender(pure)},
             "seeds16": {"rejax x16": rejax_contender(jax_python, 16),
                         "fastrl x16": fastrl_contender([*pure, "--n-seeds", "16"])},
             "population": {"fastrl default": fastrl_contender([]),
                            "fastrl --n-seeds 4": fastrl_contender(["--n-seeds", "4"])}}
    return {name: table[name] for name in names}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.iteration", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--parts", nargs="+", default=["single", "seeds16", "population"],
                        choices=["single", "seeds16", "population"])
    parser.add_argument("--jax-python", default=os.environ.get("FASTRL_JAX_PYTHON", sys.executable),
                        help="a Python with rejax installed (default: $FASTRL_JAX_PYTHON, else this one)")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<machine>/iteration.json)")
    args = parser.parse_args(argv)
    report = {"benchmark": "iteration", "machine": machine_info(), "runs": args.runs, "load_average_start":
              load_average(), "command": "python -m benchmarks.iteration " + " ".join(argv or sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "parts": {}}
    for part, contenders in parts(args.parts, args.jax_python).items():
        samples = {name: [] for name in contenders}
        for _ in range(args.runs):
            for name, run in contenders.items():
                samples[name].append(run())
                print(f"[{part}] {name}: {samples[name][-1]['process_s']:.1f} s", file=sys.stderr, flush=True)
        report["parts"][part] = samples
    report["load_average_end"] = load_average()
    path = write_json(report, args.out or default_out("iteration"))
    print("\n".join(section(report)))
    print(f"JSON: {path}")
    return 0


def section(report: dict) -> list:
    """The Markdown table of a report: per part and contender, the median process seconds, the ratio to the part's
    first contender, and the final evaluations' median and minimum over every run (and member)."""
    rows = []
    for part, samples in report["parts"].items():
        base = statistics.median(s["process_s"] for s in next(iter(samples.values())))
        for name, runs in samples.items():
            median = statistics.median(s["process_s"] for s in runs)
            evals = [e for s in runs for e in s["final_eval"] if e is not None]
            rows.append([part, name, len(runs), f"{median:.1f}", f"{median / base:.2f}x",
                         f"{statistics.median(evals):.1f}" if evals else "-", f"{min(evals):.1f}" if evals else "-"])
    return [f"`{report['command']}`, {report['date']}, {report['machine'].get('cpu_model', '')} ({report['machine'].get('machine', '')}); load average at the "
            f"start {report['load_average_start']}, at the end {report['load_average_end']}.", "",
            markdown_table(["part", "contender", "runs", "median process s", "ratio", "median final eval",
                            "min final eval"], rows)]


if __name__ == "__main__":
    sys.exit(main())
