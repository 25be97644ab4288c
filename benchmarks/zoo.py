"""The zoo: every CPU config of configs/ trained as a population of seeds at the RL Zoo's budget, beside the zoo's
published PPO figure, with the wall time a single SB3 run would need at SB3's steps/s measured here.

    python -m benchmarks.zoo [--configs ppo/acrobot ...] [--seeds 3] [--out-dir DIR] [--quick] [--redo]
                             [--quiet-below LOAD] [--max-wait S]
    python -m benchmarks.zoo --configs ppo/swimmer --sb3-seeds 1 [2 ...]   # SB3 itself to the budget, scored

Per config (``ROWS``):
- fastrl: one ``python -m fastrl.train --config C --n-seeds S --total-steps B`` process (seeds 1..S as one population;
  IMPALA/APPO, which run no populations, as S processes one after another). Its process wall time counts everything:
  start-up, compiling, training and the final evaluation.
- The score: each seed's deterministic evaluation at the end (``eval_episodes`` x ``eval_seeds`` episodes of its mode
  policy), then the median and the interquartile mean over the seeds; also the median of the seeds' training means
  over their last 100 episodes.
- SB3: ``stable_baselines3.PPO`` / ``A2C`` built with the same hyperparameters (``benchmarks.peers_common.sb3_model``; where
  the zoo's own run differs, its settings, ``ZooRow.zoo_settings``: ppo/hopper and ppo/walker2d run CleanRL's
  settings, and SB3 is timed on the zoo's whole Hopper, Walker2d and Swimmer settings), on the Gymnasium twin of the env
  (``DummyVecEnv``, as the zoo runs it), timed over at least two whole iterations (``SB3_TIMING_STEPS``) at 1 torch
  thread and at every core (fastrl picks between those per phase, see ``fastrl.run.threads.torch_thread_counts``);
  ``sb3_single_run_s`` is the budget at the faster rate: what the zoo's single run would take on this machine. (Rows
  from before 2026-12-03 22:30 UTC timed SB3 at 1 thread only, as fastrl then ran its populations.)
- ``--sb3-seeds``: instead of the table, SB3 at those same settings trained to the budget (1 torch thread) and scored by
  10 deterministic episodes (``train_sb3``): whether the zoo's figure holds for SB3 itself on this machine.
- Learning curves: each seed's last-100 mean against its own env steps; the PNG shows the median with a band from the
  lowest to the highest seed.

Results go to ``<out-dir>/<machine>/zoo.json`` (default out-dir ``bench-results``; ``--out-dir benchmarks/results``
updates the committed results, from which ``python -m benchmarks.report`` writes RESULTS.md's table) and the curves
to ``<out-dir>/<machine>/plots/zoo_<config>.png``. Each finished config is kept in ``<out-dir>/<machine>/zoo/`` and
skipped when the same command runs again (``--redo`` trains it afresh), so one table can be filled over several
sittings; every row names its own date and load average. Before each row the script waits (at most ``--max-wait``
seconds) for the 1-minute load average to fall below ``--quiet-below`` (1.2), so that rows run back to back each start
on a quiet machine.
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
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.common import (RESULTS_DIR, code_version, load_average, machine_info, machine_tag, markdown_table,
                               write_json)

REPO = Path(__file__).resolve().parent.parent
ZOO_SOURCE = "https://github.com/DLR-RM/rl-baselines3-zoo/blob/0088472b8cb622732bdbc4aa3d0d0abde86c67ed/benchmark.md"
CLEANRL_SOURCE = "https://docs.cleanrl.dev/rl-algorithms/ppo/#ppo_continuous_actionpy"
SB3_TIMING_STEPS = 8_192


@dataclass(frozen=True)
class ZooRow:
    """One config of the table: its budget (the zoo's, in env steps per seed), the zoo's PPO (or A2C) figure for the
    same task (None where the zoo has none), CleanRL's published 1M figure where it has one, and the Gymnasium id SB3
    is timed on."""
    config: str
    steps: int
    zoo: float | None
    gym_env: str
    cleanrl: str | None = None
    zoo_settings: tuple = ()  # (key, value) pairs where the zoo's own run differs from the config: SB3 runs them


ONE_ENV = (("n_envs", 1), ("n_steps", 512))  # the zoo's MuJoCo runs collect 512 steps with one env
# The zoo's whole Hopper-v3 and Walker2d-v3 settings (hyperparams/ppo.yml), for configs that left them (CleanRL's
# settings learn more here): SB3 is timed on the zoo's own run, not on the config's.
ZOO_RUN_SETTINGS = (("anneal_lr", False), ("clip_vloss", False), ("hidden_sizes", [256, 256]), ("activation", "relu"),
                    ("init_log_std", -2.0), ("ortho_init", False), ("normalize_obs", True), ("normalize_reward", True))
ZOO_HOPPER = ONE_ENV + ZOO_RUN_SETTINGS + (
    ("n_epochs", 5), ("n_minibatches", 16), ("lr", 9.80828e-5), ("gamma", 0.999), ("gae_lambda", 0.99),
    ("ent_coef", 0.00229519), ("vf_coef", 1.671342), ("max_grad_norm", 0.7), ("clip_coef", 0.2))
ZOO_WALKER2D = ONE_ENV + ZOO_RUN_SETTINGS + (
    ("n_epochs", 20), ("n_minibatches", 16), ("lr", 5.05041e-5), ("gamma", 0.99), ("gae_lambda", 0.95),
    ("ent_coef", 0.000585045), ("vf_coef", 1.743846), ("max_grad_norm", 1.0), ("clip_coef", 0.1))
# The zoo's whole Swimmer-v3 entry: 1 env x 2048 steps, minibatches of 64, SB3's other defaults, gamma 0.9999, the
# TimeFeatureWrapper, observations normalized and rewards not (the config runs 8 x 256 without the time feature).
ZOO_SWIMMER = (("n_envs", 1), ("n_steps", 2048), ("n_minibatches", 32), ("time_feature", True),
               ("normalize_reward", False))
ROWS = (
    ZooRow("ppo/cartpole", 100_000, 500.0, "CartPole-v1",
           zoo_settings=(("n_envs", 8), ("n_steps", 32), ("n_epochs", 20), ("n_minibatches", 1), ("lr", 1e-3))),
    ZooRow("ppo/cartpole_zoo", 100_000, 500.0, "CartPole-v1"),
    ZooRow("ppo/cartpole_purejaxrl", 500_000, 500.0, "CartPole-v1"),  # PureJaxRL's config, the torch-native env
    ZooRow("ppo/acrobot", 1_000_000, -73.5, "Acrobot-v1"),
    ZooRow("ppo/mountaincar", 1_000_000, -110.0, "MountainCar-v0"),
    ZooRow("ppo/mountaincar_continuous", 300_000, None, "MountainCarContinuous-v0"),
    ZooRow("ppo/pendulum", 100_000, -172.0, "Pendulum-v1",
           zoo_settings=(("n_envs", 4), ("n_steps", 1024))),  # the zoo's rollout shape; the config runs 16 x 256
    ZooRow("ppo/lunarlander", 1_000_000, 242.1, "LunarLander-v3"),
    ZooRow("ppo/lunarlander_continuous", 1_000_000, 271.0, "LunarLanderContinuous-v3"),
    ZooRow("ppo/halfcheetah", 1_000_000, 5819.1, "HalfCheetah-v5", "1,442 ± 46", ONE_ENV),
    ZooRow("ppo/mujoco", 1_000_000, 5819.1, "HalfCheetah-v5", "1,442 ± 46"),
    ZooRow("ppo/hopper", 1_000_000, 2410.0, "Hopper-v5", "2,383 ± 271", ZOO_HOPPER),
    ZooRow("ppo/walker2d", 1_000_000, 3479.0, "Walker2d-v5", "2,288 ± 572", ZOO_WALKER2D),
    ZooRow("ppo/ant", 1_000_000, 1327.0, "Ant-v5"),
    ZooRow("ppo/swimmer", 1_000_000, 282.0, "Swimmer-v5", zoo_settings=ZOO_SWIMMER),
    ZooRow("ppo/minigrid", 60_000, None, "MiniGrid-Empty-5x5-v0"),
    ZooRow("ppo/frozenlake", 300_000, None, "FrozenLake-v1"),
    ZooRow("a2c/cartpole", 500_000, 500.0, "CartPole-v1"),
    ZooRow("impala/cartpole", 120_000, None, "CartPole-v1"),
    ZooRow("impala/lunarlander", 4_000_000, None, "LunarLander-v3"),  # the config's own budget
)
# Configs sized for a GPU (or for hours of CPU), or compared elsewhere: named in the table with the reason, not trained
# by this script.
GPU_CONFIGS = {
    "ppo/atari": "10M steps of a Nature-CNN: a GPU run",
    "ppo/procgen": "25M steps of an IMPALA-ResNet: a GPU run",
    "a2c/atari": "10M steps of a Nature-CNN: a GPU run",
    "impala/atari": "a Nature-CNN learner: a GPU run",
    "ppo/bipedalwalker": "5M steps with 780k gradient steps: hours on a 2-core CPU, a GPU run",
    "ppo/humanoid": "10M steps: a GPU run",
    "ppo/cartpole_novel_lstm": "a recurrent policy: benchmarks/recurrent.py runs it beside sb3-contrib's RecurrentPPO "
                               "(this table times SB3's feed-forward PPO, not like for like)",
}
QUICK_STEPS = 20_000


def fastrl_command(row: ZooRow, seeds: int, steps: int, run_dir: Path, seed: int = 1) -> list[str]:
    command = [sys.executable, "-m", "fastrl.train", "--config", row.config, "--total-steps", str(steps),
               "--seed", str(seed), "--run-dir", str(run_dir), "--progress", "false", "--wandb", "disabled",
               "--tensorboard", "false", "--plot", "false", "--stop-at-return", "0"]
    return command + (["--n-seeds", str(seeds)] if seeds > 1 else [])


def member_curves(run_dir: Path) -> list[list]:
    """Per seed ``[[its env steps, its last-100 mean], ...]`` from metrics.jsonl (member rows of a population, the
    plain rows of a single run)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    members = {}
    population = any("member" in row for row in rows)
    for row in rows:
        ret = row.get("charts/episodic_return")
        if ret is None or (population and "member" not in row):
            continue
        step = row.get("member_step", row["global_step"])
        members.setdefault(row.get("member", 0), []).append([step, ret])
    return [members[m] for m in sorted(members)]


def train_fastrl(row: ZooRow, seeds: int, steps: int, work: Path) -> dict:
    """Run the config's seeds (one population, or one process per seed for IMPALA/APPO) and read their scores."""
    algo = row.config.split("/")[0]
    population = algo in ("ppo", "a2c")
    runs = [(work / "run", fastrl_command(row, seeds, steps, work / "run"))] if population else \
        [(work / f"seed{s}", fastrl_command(row, 1, steps, work / f"seed{s}", seed=s)) for s in range(1, seeds + 1)]
    start = time.perf_counter()
    for run_dir, command in runs:
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip().splitlines()[-1:]}")
    process_s = time.perf_counter() - start
    evals, lasts, curves = [], [], []
    for run_dir, _ in runs:
        summary = json.loads((run_dir / "summary.json").read_text())
        members = summary.get("members") or [summary]
        evals += [m["eval_return_mean"] for m in members]
        lasts += [m["episode_return_mean"] for m in members]
        curves += member_curves(run_dir)
    return {"process_s": process_s, "eval_returns": evals, "last100_returns": lasts, "curves": curves,
            "command": " ".join(["python", *runs[0][1][1:]]).replace(str(work), "DIR")}


def sb3_config(row: ZooRow, **overrides):
    """The config SB3 runs for ``row``: the row's config on the Gymnasium twin, ``row.zoo_settings`` over it."""
    from fastrl.config import make_config
    return make_config({"env": row.gym_env, "env_backend": "gymnasium", **dict(row.zoo_settings), **overrides},
                       row.config)


def time_sb3(row: ZooRow, steps: int) -> dict:
    """SB3 with the config's hyperparameters (where the zoo's own run differs, ``row.zoo_settings``: the zoo's rollout
    shape, epochs or, for configs that left the zoo's settings, all of them) on the Gymnasium twin: steps/s over
    ``SB3_TIMING_STEPS`` (at least two iterations) and the single run's projected wall time at the zoo's budget."""
    from benchmarks.peers_common import sb3_model
    from fastrl.run.threads import torch_threads
    algo = row.config.split("/")[0]
    if algo not in ("ppo", "a2c"):
        return {"sb3_skipped": f"SB3 has no {algo}"}
    try:
        import gymnasium
        import stable_baselines3  # noqa: F401
        gymnasium.make(row.gym_env).close()
    except Exception as e:  # noqa: BLE001 - a missing SB3, Box2D, MuJoCo or MiniGrid: the row says why
        return {"sb3_skipped": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"}
    cfg = sb3_config(row)
    timed = max(SB3_TIMING_STEPS, 2 * cfg.batch_size)
    sps_by_threads = {}
    for count in sb3_thread_counts():
        with torch_threads(count):
            model = sb3_model(cfg, max(1, steps // cfg.batch_size))
            start = time.perf_counter()
            model.learn(total_timesteps=timed)
            seconds = time.perf_counter() - start
            model.get_env().close()
        sps_by_threads[count] = model.num_timesteps / seconds
    best = max(sps_by_threads, key=sps_by_threads.get)
    sps = sps_by_threads[best]
    return {"sb3_sps": sps, "sb3_single_run_s": steps / sps, "sb3_timed_steps": model.num_timesteps,
            "sb3_threads": best, "sb3_sps_by_threads": {str(k): v for k, v in sps_by_threads.items()}}


def train_sb3(row: ZooRow, steps: int, seed: int) -> dict:
    """One SB3 run to the zoo's budget with the settings ``time_sb3`` times (the config's, ``row.zoo_settings`` over
    them), at 1 torch thread, then the deterministic return of 10 episodes on its own env with the normalizer frozen:
    does SB3 itself reach the zoo's figure on this machine?"""
    import numpy as np
    from benchmarks.peers_common import sb3_model
    from fastrl.run.threads import torch_threads
    cfg = sb3_config(row, seed=seed)
    load, started = load_average(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with torch_threads(1):
        model = sb3_model(cfg, max(1, steps // cfg.batch_size))
        start = time.perf_counter()
        model.learn(total_timesteps=steps)
        train_s = time.perf_counter() - start
        env = model.get_env()
        if hasattr(env, "training"):  # VecNormalize: frozen statistics, raw rewards
            env.training, env.norm_reward = False, False
        returns, episode, obs = [], 0.0, env.reset()
        while len(returns) < 10:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, done, _ = env.step(action)
            raw = env.get_original_reward() if hasattr(env, "get_original_reward") else reward
            episode += float(raw[0])
            if done[0]:
                returns.append(episode)
                episode = 0.0
        env.close()
    return {"config": row.config, "gym_env": row.gym_env, "settings": dict(row.zoo_settings), "seed": seed,
            "steps": model.num_timesteps, "train_s": train_s, "eval_returns": returns,
            "eval_mean": float(np.mean(returns)),
            "last100_mean": float(np.mean([e["r"] for e in model.ep_info_buffer])),
            "zoo": row.zoo, "load_average_at_start": load, "started": started, "code": code_version(),
            "command": f"python -m benchmarks.zoo --configs {row.config} --sb3-seeds {seed}"
                       + (" --quick" if steps != row.steps else "")}


def sb3_thread_counts() -> list[int]:
    """The torch thread counts SB3 is timed at: 1 and every core (at most 8), as fastrl picks per phase between them;
    SB3's single run is projected at the faster."""
    return sorted({1, min(os.cpu_count() or 1, 8)})


def compile_cache_files() -> int:
    """Files in fastrl's inductor cache (``fastrl.run.compile.compile_cache_dir``, the directory the training process
    compiles into: whatever torch wrote into this process's environment does not change it) when a row starts: 0
    means every graph the row compiles is built from nothing (a cold start)."""
    from fastrl.run.compile import compile_cache_dir
    root = compile_cache_dir()
    return sum(len(files) for _, _, files in os.walk(root)) if root.is_dir() else 0


def median(values: list):
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def wait_for_quiet(below: float, max_wait_s: float, poll_s: float = 5.0) -> list | None:
    """Sleep until the 1-minute load average is below ``below`` (a row's speed figures count only from a quiet start)
    or ``max_wait_s`` has passed; returns the load average then. ``below`` <= 0 does not wait."""
    deadline = time.monotonic() + max_wait_s
    load = load_average()
    while below > 0 and load and load[0] >= below and time.monotonic() < deadline:
        time.sleep(poll_s)
        load = load_average()
    return load


def score_row(row: ZooRow, seeds: int, steps: int, out: Path, quick: bool) -> dict:
    from fastrl.run.compile import compile_cache_dir
    from fastrl.run.population import interquartile_mean
    load, started = load_average(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
    cache_files, cache_dir = compile_cache_files(), compile_cache_dir()
    with tempfile.TemporaryDirectory(prefix="fastrl-zoo-") as tmp:
        run = train_fastrl(row, seeds, steps, Path(tmp))
    sb3 = time_sb3(row, steps)
    evals = [v for v in run["eval_returns"] if v is not None]
    result = {**asdict(row), "budget": steps, "seeds": seeds, "quick": quick, **run, **sb3,
              "eval_median": median(evals), "eval_iqm": interquartile_mean(evals) if evals else None,
              "last100_median": median(run["last100_returns"]), "load_average_at_start": load,
              "compile_cache_files_at_start": cache_files, "compile_cache_dir": str(cache_dir),
              "started": started, "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "code": code_version()}
    if sb3.get("sb3_single_run_s"):
        result["faster_than_sb3_single_run"] = run["process_s"] < sb3["sb3_single_run_s"]
    write_json(result, out / "zoo" / f"{row.config.replace('/', '_')}.json")
    plot_curves(result, out / "plots" / f"zoo_{row.config.replace('/', '_')}.png")
    return result


def plot_curves(result: dict, path: Path) -> Path | None:
    """Median last-100 mean over the seeds against env steps, with a band from the lowest to the highest seed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        return None
    curves = [c for c in result["curves"] if c]
    if not curves:
        return None
    first = max(c[0][0] for c in curves)
    grid = np.linspace(first, result["budget"], 100)
    ys = np.array([np.interp(grid, [p[0] for p in c], [p[1] for p in c], left=np.nan) for c in curves])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.fill_between(grid, np.nanmin(ys, 0), np.nanmax(ys, 0), alpha=0.25, label=f"{len(curves)} seeds: min-max")
    ax.plot(grid, np.nanmedian(ys, 0), label="median")
    if result.get("zoo") is not None:
        ax.axhline(result["zoo"], color="tab:orange", linestyle="--", label="RL Zoo PPO")
    ax.set(title=f"{result['config']} ({result['gym_env']})", xlabel="env steps per seed", ylabel="last-100 mean return")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def table(rows: list) -> str:
    """The Markdown table of finished rows, then the configs this script does not train (and why)."""
    def fmt(v, spec=",.0f"):
        if v is not None and abs(v) < 10 and spec in (",.0f", ",.1f"):
            spec = ".3g"  # small returns (MiniGrid's 0..1) keep their digits
        return "-" if v is None else format(v, spec)
    def busy(r):  # a time taken with the machine loaded is no speed figure (scores stand)
        load = r.get("load_average_at_start")
        return " (load >= 1.5 at start: not a speed figure)" if load and load[0] >= 1.5 else ""
    lines = []
    for r in rows:
        vs_zoo = "-" if r.get("zoo") is None or r["eval_median"] is None else \
            ("at or above" if r["eval_median"] >= r["zoo"] else fmt(r["eval_median"] - r["zoo"]))
        n = r.get("sb3_threads", 1)
        sb3 = f"{fmt(r['sb3_single_run_s'])} ({n} thread{'s' * (n > 1)})" if r.get("sb3_single_run_s") else \
            f"- ({r.get('sb3_skipped', '')})"
        lines.append([r["config"], fmt(r["budget"]), r["seeds"], fmt(r["eval_median"], ",.1f"),
                      fmt(r["eval_iqm"], ",.1f"), fmt(r["last100_median"], ",.1f"),
                      ", ".join(fmt(v, ",.0f") for v in r["eval_returns"]), fmt(r.get("zoo"), ",.1f"), vs_zoo,
                      r.get("cleanrl") or "-", fmt(r["process_s"]) + busy(r), fmt(r.get("sb3_sps")), sb3,
                      r["timestamp"][:10], r["load_average_at_start"][0] if r["load_average_at_start"] else "-"])
    headers = ["config", "steps/seed", "seeds", "eval median", "eval IQM", "last-100 median", "eval per seed",
               "zoo PPO", "vs zoo", "CleanRL 1M", "fastrl process s (all seeds)", "SB3 steps/s",
               "SB3 single run s (projected)", "date", "load"]
    text = markdown_table(headers, lines) if lines else "(no rows yet)"
    skipped = [f"- `{name}`: {why}" for name, why in GPU_CONFIGS.items()]
    done = {r["config"] for r in rows}
    skipped += [f"- `{r.config}`: a CPU config not trained yet (`python -m benchmarks.zoo --configs {r.config}`)"
                for r in ROWS if r.config not in done]
    return text + "\n\nNot in this CPU table:\n" + "\n".join(skipped)


def collect(out: Path) -> list:
    found = {p.stem: json.loads(p.read_text()) for p in sorted((out / "zoo").glob("*.json"))}
    return [found[r.config.replace("/", "_")] for r in ROWS if r.config.replace("/", "_") in found]


def collect_sb3(out: Path) -> list:
    """The ``--sb3-seeds`` runs kept under ``out/zoo_sb3/``, in table order, then by seed."""
    order = {r.config: i for i, r in enumerate(ROWS)}
    runs = [json.loads(p.read_text()) for p in sorted((out / "zoo_sb3").glob("*.json"))]
    return sorted(runs, key=lambda r: (order.get(r["config"], len(order)), r["seed"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.zoo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=[r.config for r in ROWS], metavar="NAME",
                        help="configs to train (default: every CPU config)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out-dir", default="bench-results", metavar="DIR",
                        help="results under DIR/<machine>/ (benchmarks/results updates the committed ones)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS:,} steps per seed (a smoke test)")
    parser.add_argument("--redo", action="store_true", help="train configs that already have a result afresh")
    parser.add_argument("--quiet-below", type=float, default=1.2, metavar="LOAD",
                        help="before each row, wait (up to --max-wait s) for the 1-minute load average to fall below "
                             "LOAD, so that rows run one after another each start on a quiet machine (0: no wait)")
    parser.add_argument("--max-wait", type=float, default=300.0, metavar="S")
    parser.add_argument("--sb3-seeds", type=int, nargs="+", default=None, metavar="SEED",
                        help="instead of the table: train SB3 (the settings the table times it at) to the zoo's "
                             "budget on these seeds and evaluate it, into DIR/<machine>/zoo_sb3/")
    args = parser.parse_args(argv)
    known = {r.config: r for r in ROWS}
    unknown = [c for c in args.configs if c not in known]
    if unknown:
        gpu = [c for c in unknown if c in GPU_CONFIGS]
        why = f" ({'; '.join(f'{c}: {GPU_CONFIGS[c]}' for c in gpu)})" if gpu else ""
        parser.error(f"not CPU zoo configs: {', '.join(unknown)}{why}; choose from {', '.join(known)}")
    out = Path(args.out_dir).resolve() / machine_tag("cpu")
    if out.resolve() == (RESULTS_DIR / machine_tag("cpu")).resolve() and args.quick:
        parser.error("--quick results never go to the committed benchmarks/results: pass another --out-dir")
    if args.sb3_seeds:
        for name in args.configs:
            for seed in args.sb3_seeds:
                path = out / "zoo_sb3" / f"{name.replace('/', '_')}__seed{seed}.json"
                if path.is_file() and not args.redo:
                    print(f"# SB3 {name} seed {seed}: kept from an earlier run (--redo trains it afresh)", flush=True)
                    continue
                wait_for_quiet(args.quiet_below, args.max_wait)
                r = train_sb3(known[name], QUICK_STEPS if args.quick else known[name].steps, seed)
                write_json(r, path)
                print(f"# SB3 {name} seed {seed}: eval {r['eval_mean']:.1f} (zoo {r['zoo']}), last-100 "
                      f"{r['last100_mean']:.1f}, {r['train_s']:.0f} s -> {path}", flush=True)
        if (out / "zoo.json").is_file():  # the table's report lists them (RESULTS.md, python -m benchmarks.report)
            report = json.loads((out / "zoo.json").read_text())
            write_json({**report, "sb3_runs": collect_sb3(out)}, out / "zoo.json")
        return 0
    for name in args.configs:
        row = known[name]
        if (out / "zoo" / f"{name.replace('/', '_')}.json").is_file() and not args.redo:
            print(f"# {name}: kept from an earlier run (--redo trains it afresh)", flush=True)
            continue
        load = wait_for_quiet(args.quiet_below, args.max_wait)
        print(f"# {name}: {args.seeds} seeds x {QUICK_STEPS if args.quick else row.steps:,} steps "
              f"(load {load})", flush=True)
        r = score_row(row, args.seeds, QUICK_STEPS if args.quick else row.steps, out, args.quick)
        print(f"#   eval median {r['eval_median']}, per seed {r['eval_returns']}, {r['process_s']:.0f} s; "
              f"SB3 single run {r.get('sb3_single_run_s') or r.get('sb3_skipped')}", flush=True)
    rows = collect(out)
    report = {"machine": machine_info("cpu"), "zoo_source": ZOO_SOURCE, "cleanrl_source": CLEANRL_SOURCE,
              "sb3_thread_counts": sb3_thread_counts(), "rows": rows, "gpu_configs": GPU_CONFIGS,
              "sb3_runs": collect_sb3(out)}
    write_json(report, out / "zoo.json")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
