"""Does fastrl learn as fast as SB3 at the same hyperparameters, and as well as the zoo's scores? The ``peers`` and
``learning`` parts of ``python -m benchmarks.peers``.

``peers``: for every (env, algo, seed), in the same process and alternating which goes first:
- ``fastrl``: ``fastrl.run.session.run(make_config(...))`` on EnvPool envs, with ``stop_at_return`` = the env's threshold.
- ``sb3``: SB3 ``PPO`` / ``A2C`` (``MlpPolicy``) on Gymnasium ``DummyVecEnv`` envs (SB3 as users run it), with the
  same hyperparameters and a callback that records the curve and stops at the same threshold.
Each run ends when the mean return of the last 100 episodes reaches the threshold (checked every ``log_interval``
iterations, the same for both), or at the step budget. HalfCheetah-v4 has no threshold: the return at the budget.
Reported per (env, algo, library): median over seeds of env steps and wall seconds to the threshold, steps/s, and
the final return; the curves (env steps, wall seconds, mean return of the last 100 episodes) go to the JSON too.

``learning``: fastrl alone at the rl-baselines3-zoo's step budgets, beside the zoo's published score
(``ZOO``: deterministic evaluation of one trained agent). fastrl reports its deterministic evaluation
(``eval_episodes`` x ``eval_seeds``) and the training mean of the last 100 episodes.

What "the same hyperparameters" means, term by term (``sb3_model``): rollout shape, epochs, minibatch size, lr and
its linear schedule (an exact per-iteration match), gamma, GAE lambda, clip range, entropy and value coefficients,
grad-norm clip, advantage normalisation, network sizes and activation, optimizer and its eps, observation and
reward normalisation (SB3 ``VecNormalize``). Two loss conventions differ and are matched by meaning, not by name:
SB3's value loss is the plain MSE where fastrl's (CleanRL's) is 1/2 MSE, so SB3 gets ``vf_coef / 2``; and SB3 clips
the value prediction (``clip_range_vf``) where fastrl takes the max of clipped and unclipped losses.
Wall time: SB3 from ``learn()``'s start; fastrl from ``time/elapsed_s`` in metrics.jsonl when present, else the
running sum of its ``time/collect_s + time/update_s`` sections (model construction excluded on both sides).
"""
from __future__ import annotations

import statistics
import sys


from benchmarks.common import markdown_table
from benchmarks.peers_common import (QUIET, REPO, THRESHOLDS, aggregate, fmt, hyperparameters, median_or_none,
                                     run_fastrl, run_sb3, sb3_unavailable)


# Hyperparameters per (algo, env): a tuned YAML from configs/ (or None) and overrides on top of it. The inline sets
# (Acrobot, A2C on LunarLander / HalfCheetah) are zoo-inspired starting points, not tuned for fastrl.
HYPERPARAMETERS = {
    ("ppo", "CartPole-v1"): ("configs/ppo/cartpole.yaml", {}),
    ("ppo", "Acrobot-v1"): (None, dict(n_envs=16, n_steps=128, n_epochs=4, n_minibatches=4, lr=1e-3, gamma=0.99,
                                       gae_lambda=0.94, ent_coef=0.0)),
    ("ppo", "LunarLander-v2"): ("configs/ppo/lunarlander.yaml", {}),
    ("ppo", "HalfCheetah-v4"): ("configs/ppo/mujoco.yaml", {}),
    ("a2c", "CartPole-v1"): ("configs/a2c/cartpole.yaml", {}),
    ("a2c", "Acrobot-v1"): (None, dict(algo="a2c", n_envs=16, ent_coef=0.0, log_interval=25)),
    ("a2c", "LunarLander-v2"): (None, dict(algo="a2c", n_envs=8, gamma=0.995, lr=8.3e-4, ent_coef=1e-5,
                                           log_interval=25)),
    ("a2c", "HalfCheetah-v4"): (None, dict(algo="a2c", n_envs=8, n_steps=8, gamma=0.99, gae_lambda=0.9, lr=3e-4,
                                           ent_coef=0.0, normalize_obs=True, normalize_reward=True, log_interval=25)),
}


# Step budgets of the peers part (a run stops earlier once it reaches the threshold).
BUDGETS = {
    "full": {("ppo", "CartPole-v1"): 200_000, ("ppo", "Acrobot-v1"): 500_000, ("ppo", "LunarLander-v2"): 2_000_000,
             ("ppo", "HalfCheetah-v4"): 1_000_000, ("a2c", "CartPole-v1"): 500_000, ("a2c", "Acrobot-v1"): 500_000,
             ("a2c", "LunarLander-v2"): 1_000_000, ("a2c", "HalfCheetah-v4"): 1_000_000},
    "quick": {("ppo", "CartPole-v1"): 150_000, ("ppo", "Acrobot-v1"): 100_000, ("ppo", "LunarLander-v2"): 300_000,
              ("ppo", "HalfCheetah-v4"): 50_000, ("a2c", "CartPole-v1"): 200_000, ("a2c", "Acrobot-v1"): 100_000,
              ("a2c", "LunarLander-v2"): 200_000, ("a2c", "HalfCheetah-v4"): 50_000},
}


PROFILES = {  # envs, algos and seeds of each profile
    "full": dict(envs=["CartPole-v1", "Acrobot-v1", "LunarLander-v2", "HalfCheetah-v4"], algos=["ppo", "a2c"], seeds=3),
    "quick": dict(envs=["CartPole-v1", "Acrobot-v1"], algos=["ppo", "a2c"], seeds=1),
}


# rl-baselines3-zoo benchmark.md (github.com/DLR-RM/rl-baselines3-zoo, commit 0088472b): mean reward of one trained
# agent under deterministic evaluation (stochastic for Atari), after n_timesteps of training.
ZOO_SOURCE = "https://github.com/DLR-RM/rl-baselines3-zoo/blob/0088472b8cb622732bdbc4aa3d0d0abde86c67ed/benchmark.md"


ZOO = {
    ("ppo", "CartPole-v1"): dict(zoo_env="CartPole-v1", score=500.0, std=0.0, steps=100_000),
    ("ppo", "Acrobot-v1"): dict(zoo_env="Acrobot-v1", score=-73.506, std=18.201, steps=1_000_000),
    ("ppo", "LunarLander-v2"): dict(zoo_env="LunarLander-v2", score=242.119, std=31.823, steps=1_000_000),
    ("ppo", "HalfCheetah-v4"): dict(zoo_env="HalfCheetah-v3", score=5819.099, std=663.530, steps=1_000_000),
    ("a2c", "CartPole-v1"): dict(zoo_env="CartPole-v1", score=500.0, std=0.0, steps=500_000),
    ("a2c", "Acrobot-v1"): dict(zoo_env="Acrobot-v1", score=-83.353, std=17.213, steps=500_000),
    ("a2c", "LunarLander-v2"): dict(zoo_env="LunarLander-v2", score=155.751, std=80.419, steps=200_000),
    ("a2c", "HalfCheetah-v4"): dict(zoo_env="HalfCheetah-v3", score=3041.174, std=157.265, steps=1_000_000),
}


LEARNING_PROFILES = {  # (algo, env) pairs of the learning part
    "full": list(ZOO),
    "quick": [("ppo", "CartPole-v1")],
}


def peer_config(algo: str, env_id: str, seed: int, total_steps: int, threshold, threads: int, progress: bool = True,
                **extra):
    """The fastrl Config of one run; SB3 is built from the same object (``sb3_model``)."""
    from fastrl.config import make_config
    yaml_path, overrides = HYPERPARAMETERS[(algo, env_id)]
    values = {"algo": algo, **overrides, **QUIET, "env": env_id, "seed": seed, "total_steps": total_steps,
              "torch_threads": threads, "stop_at_return": threshold or 0.0, "progress": progress, **extra}
    return make_config(values, str(REPO / yaml_path) if yaml_path else None)


def bench_peers(envs: list, algos: list, seeds: int, profile: str, threads: int, libs: list, max_steps: int = 0,
                progress: bool = True) -> list:
    cases = [(env_id, algo) for env_id in envs for algo in algos]
    total, done, results = len(cases) * seeds * len(libs), 0, []
    for env_id, algo in cases:
        threshold, budget = THRESHOLDS[env_id], BUDGETS[profile][(algo, env_id)]
        budget = min(budget, max_steps) if max_steps else budget
        cfg0 = peer_config(algo, env_id, 1, budget, threshold, threads)
        entry = {"env": env_id, "algo": algo, "threshold": threshold, "budget_steps": budget,
                 "hyperparameters": hyperparameters(cfg0), "sb3_vf_coef": cfg0.vf_coef / 2, "runs": {}, "skipped": {}}
        why = sb3_unavailable(env_id) if "sb3" in libs else None
        if why:
            entry["skipped"]["sb3"] = why
        for seed in range(1, seeds + 1):
            order = libs if seed % 2 else libs[::-1]  # alternate who goes first: load drifts on a shared machine
            for lib in order:
                done += 1
                if lib in entry["skipped"]:
                    continue
                print(f"[peers {done}/{total}] {env_id} {algo} {lib} seed {seed} (budget {budget:,} steps"
                      f"{'' if threshold is None else f', stop at {threshold:g}'})", file=sys.stderr, flush=True)
                cfg = peer_config(algo, env_id, seed, budget, threshold, threads, progress)
                run = run_fastrl(cfg) if lib == "fastrl" else run_sb3(cfg)
                run["seed"] = seed
                entry["runs"].setdefault(lib, []).append(run)
                print(f"[peers {done}/{total}] -> {run['total_steps']:,} steps in {run['wall_time_s']:.1f}s, "
                      f"{run['sps']:,.0f} steps/s, return {run['final_return']}", file=sys.stderr, flush=True)
        entry["summary"] = {lib: aggregate(runs) for lib, runs in entry["runs"].items()}
        results.append(entry)
    return results


def bench_learning(pairs: list, seeds: int, threads: int, eval_episodes: int, max_steps: int = 0,
                   progress: bool = True) -> list:
    results = []
    for i, (algo, env_id) in enumerate(pairs, 1):
        zoo = ZOO[(algo, env_id)]
        budget = min(zoo["steps"], max_steps) if max_steps else zoo["steps"]
        runs = []
        for seed in range(1, seeds + 1):
            print(f"[learning {i}/{len(pairs)}] {env_id} {algo} seed {seed}: {budget:,} steps (zoo budget "
                  f"{zoo['steps']:,})", file=sys.stderr, flush=True)
            cfg = peer_config(algo, env_id, seed, budget, None, threads, progress, eval_episodes=eval_episodes,
                              eval_seeds=1)
            run = run_fastrl(cfg)
            run["seed"] = seed
            runs.append(run)
        evals = [r["eval_return_mean"] for r in runs if r["eval_return_mean"] is not None]
        results.append({"env": env_id, "algo": algo, "budget_steps": budget, "zoo": zoo, "seeds": seeds,
                        "eval_episodes": eval_episodes, "hyperparameters": hyperparameters(cfg),
                        "eval_return_median": statistics.median(evals) if evals else None,
                        "train_return_median": median_or_none([r["final_return"] for r in runs]),
                        "runs": runs})
    return results


def peers_table(results: list) -> str:
    headers = ["env", "algo", "threshold", "lib", "reached", "steps to thr. (median)", "s to thr. (median)",
               "steps/s (median)", "final return (median)"]
    rows = []
    for e in results:
        for lib, s in e["summary"].items():
            rows.append([e["env"], e["algo"], fmt(e["threshold"], "g"), lib, f"{s['reached']}/{s['seeds']}",
                         fmt(s["steps_to_threshold_median"]), fmt(s["time_to_threshold_s_median"], ".1f"),
                         fmt(s["sps_median"]), fmt(s["final_return_median"], ".1f")])
        for lib, why in e["skipped"].items():
            rows.append([e["env"], e["algo"], fmt(e["threshold"], "g"), lib, "skipped", why, "", "", ""])
    return markdown_table(headers, rows)


def learning_table(results: list) -> str:
    headers = ["env", "algo", "zoo score", "zoo steps", "fastrl steps", "fastrl eval (median)",
               "fastrl train mean-100 (median)", "seeds"]
    rows = [[e["env"] if e["zoo"]["zoo_env"] == e["env"] else f"{e['env']} (zoo: {e['zoo']['zoo_env']})", e["algo"],
             f"{e['zoo']['score']:.1f} ± {e['zoo']['std']:.1f}", f"{e['zoo']['steps']:,}",
             f"{statistics.median(r['total_steps'] for r in e['runs']) if e['runs'] else e['budget_steps']:,.0f}",
             fmt(e["eval_return_median"], ".1f"), fmt(e["train_return_median"], ".1f"), e["seeds"]] for e in results]
    return markdown_table(headers, rows)
