"""fastrl against Stable-Baselines3 and rejax (JAX): learning curves, time to threshold, steps/s; the zoo's scores.

    python -m benchmarks.peers [--quick] [--part peers|learning|all|sb3-zoo|sb3-default|rejax|speed]
                               [--algos ppo a2c] [--envs ...] [--seeds N] [--no-compiled] [--out-dir DIR]

``all`` is peers + learning; ``speed`` is sb3-zoo + sb3-default + rejax (issue 10's comparisons, one command).

``peers``: for every (env, algo, seed), in the same process and alternating which goes first:
- ``fastrl``: ``fastrl.train.run(make_config(...))`` on EnvPool envs, with ``stop_at_return`` = the env's threshold.
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

``sb3-zoo``: SB3 like for like at exactly SB3's settings: ``PPO("MlpPolicy", env)`` with the rl-baselines3-zoo's
CartPole-v1 keys (``ZOO_PPO_CARTPOLE``: 8 envs x 32 steps, minibatch 256, 20 epochs, gamma 0.98, lambda 0.8, lr
lin_0.001, clip lin_0.2, 1e5 steps; SB3's defaults otherwise: no value clipping, vf_coef 0.5, max_grad_norm 0.5, 64-64
tanh, Adam eps 1e-5), and fastrl with the same terms (``fastrl_from_sb3``: clip_vloss false, anneal_clip, lr_floor 0,
vf_coef 1.0 for SB3's 0.5 x MSE). Libs ``sb3``, ``fastrl`` (compile off), ``fastrl[compiled]`` (compile default: the
gradient step and the rollout step compiled, the env step EnvPool's) and ``fastrl[torch-env]`` (compile default with
env_backend torch: the torch-native CartPole stepped inside the compiled rollout graph, as rejax steps gymnax's), their
inductor caches warmed by one untimed run each, per seed in one process, the order alternating. Stop rule: the mean
return of the last 100 episodes >= 475, checked after every update on both sides. Medians of env steps and training
seconds to 475, steps/s (fastrl also after its first iteration, which holds any compiling).
``sb3-default``: ``PPO("MlpPolicy", env)`` as it comes (``SB3_PPO_DEFAULTS``: 1 env, n_steps 2048, minibatch 64, 10
epochs, lr 3e-4, clip 0.2, gamma 0.99, lambda 0.95), fastrl at the same terms, eager and compiled: steps/s over a
fixed budget (``SB3_DEFAULT_BUDGET``), no stop.
``rejax``: rejax PPO with its own CartPole-v1 config (``REJAX_PPO_CARTPOLE``: 5 envs x 100 steps, 5 epochs, 5
minibatches, lr 7.5e-4, 1e5 steps), jitted end to end on the CPU (``pin_jax_to_cpu``; one XLA thread with --threads 1):
compile seconds, training steps/s (evaluation compiled out), and the env steps of its first evaluation (128 sampled
episodes every 1,000 steps) >= 475, whose training seconds are those steps / its steps/s. fastrl at the same config
(``fastrl_from_rejax`` states the mapping term by term and the three terms that differ) with ``RejaxEval``, a callback
that evaluates the same way and stops at the first mean >= 475; its evaluation seconds are left out of its training
seconds. Torch runs on ``--threads`` threads (1) on every side, recorded in the JSON.

JSON goes to benchmarks/results/<machine-tag>/peers.json (``learning.json`` for the learning part;
``peers_sb3_zoo.json``, ``peers_sb3_default.json``, ``peers_rejax.json`` for the others, or ``--out-dir``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import gymnasium
import numpy as np
import torch

from benchmarks.common import default_out, machine_info, markdown_table, package_version, write_json

REPO = Path(__file__).resolve().parent.parent
# Gymnasium 1.x dropped LunarLander-v2; v3 is the same task with bug fixes (EnvPool has both).
GYM_IDS = {"LunarLander-v2": "LunarLander-v3"}
THRESHOLDS = {"CartPole-v1": 475.0, "Acrobot-v1": -100.0, "LunarLander-v2": 200.0, "HalfCheetah-v4": None}

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
QUIET = dict(device="cpu", progress=True, tensorboard=False, wandb="disabled", eval_episodes=0, checkpoint_interval=0)
MAX_CURVE_POINTS = 400


# ---------------------------------------------------------------------------------------------- configs
def peer_config(algo: str, env_id: str, seed: int, total_steps: int, threshold, threads: int, progress: bool = True,
                **extra):
    """The fastrl Config of one run; SB3 is built from the same object (``sb3_model``)."""
    from fastrl.config import make_config
    yaml_path, overrides = HYPERPARAMETERS[(algo, env_id)]
    values = {"algo": algo, **overrides, **QUIET, "env": env_id, "seed": seed, "total_steps": total_steps,
              "torch_threads": threads, "stop_at_return": threshold or 0.0, "progress": progress, **extra}
    return make_config(values, str(REPO / yaml_path) if yaml_path else None)


def hyperparameters(cfg) -> dict:
    keys = ("algo", "n_envs", "n_steps", "n_epochs", "n_minibatches", "lr", "anneal_lr", "lr_floor", "gamma",
            "gae_lambda", "clip_coef", "clip_vloss", "ent_coef", "vf_coef", "max_grad_norm", "norm_adv", "adam_eps",
            "optimizer", "rmsprop_alpha", "rmsprop_eps", "hidden_sizes", "activation", "normalize_obs",
            "normalize_reward", "time_feature", "log_interval")
    return {k: getattr(cfg, k) for k in keys}


def lr_schedule(cfg, n_iterations: int):
    """SB3 ``learning_rate(progress_remaining)`` equal to fastrl's per-iteration linear schedule.

    SB3 updates progress_remaining = 1 - k/n after the k-th rollout and trains on it; fastrl trains that rollout with
    fraction 1 - (k-1)/n. Hence the 1/n shift.
    """
    if not cfg.anneal_lr:
        return cfg.lr
    lr, floor = cfg.lr, cfg.lr_floor
    return lambda progress: floor + min(1.0, max(progress + 1.0 / n_iterations, 0.0)) * (lr - floor)


class TimeFeature(gymnasium.Wrapper):
    """A Gymnasium env whose observations end with fastrl's ``time_feature`` (1 - t / max_episode_steps, t the steps
    taken in the episode), as the RL Zoo's TimeFeatureWrapper gives them: SB3's side of a comparison."""

    def __init__(self, env):
        super().__init__(env)
        self.limit, self.steps_taken = env.spec.max_episode_steps, 0
        low, high = env.observation_space.low, env.observation_space.high
        self.observation_space = gymnasium.spaces.Box(np.append(low, 0.0).astype(np.float32),
                                                      np.append(high, 1.0).astype(np.float32))

    def _with_feature(self, obs):
        return np.append(obs, 1.0 - min(self.steps_taken, self.limit) / self.limit).astype(np.float32)

    def reset(self, **kwargs):
        self.steps_taken = 0
        obs, info = self.env.reset(**kwargs)
        return self._with_feature(obs), info

    def step(self, action):
        self.steps_taken += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._with_feature(obs), reward, terminated, truncated, info


def sb3_env(cfg):
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
    env = make_vec_env(GYM_IDS.get(cfg.env, cfg.env), n_envs=cfg.n_envs, seed=cfg.seed, vec_env_cls=DummyVecEnv,
                       wrapper_class=TimeFeature if cfg.time_feature else None)
    if cfg.normalize_obs or cfg.normalize_reward:  # Monitor sits inside, so episode returns stay raw
        env = VecNormalize(env, norm_obs=cfg.normalize_obs, norm_reward=cfg.normalize_reward, clip_obs=cfg.obs_clip,
                           clip_reward=cfg.reward_clip, gamma=cfg.gamma)
    return env


def sb3_model(cfg, n_iterations: int):
    """SB3 PPO or A2C with ``cfg``'s hyperparameters (see the module docstring for the two loss conventions)."""
    from stable_baselines3 import A2C, PPO
    from torch import nn
    if cfg.shared_trunk or cfg.target_kl:
        raise ValueError("the SB3 mirror covers separate policy/value trunks and no target_kl only")
    activation = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "silu": nn.SiLU}[cfg.activation]
    optimizer = cfg.optimizer if cfg.optimizer != "auto" else ("rmsprop" if cfg.algo == "a2c" else "adam")
    if optimizer == "rmsprop":
        opt = dict(optimizer_class=torch.optim.RMSprop,
                   optimizer_kwargs=dict(alpha=cfg.rmsprop_alpha, eps=cfg.rmsprop_eps, weight_decay=0))
    else:
        opt = dict(optimizer_class=torch.optim.Adam, optimizer_kwargs=dict(eps=cfg.adam_eps))
    policy_kwargs = dict(net_arch=dict(pi=list(cfg.hidden_sizes), vf=list(cfg.hidden_sizes)), activation_fn=activation,
                         ortho_init=cfg.ortho_init, log_std_init=cfg.init_log_std, **opt)
    common = dict(learning_rate=lr_schedule(cfg, n_iterations), n_steps=cfg.n_steps, gamma=cfg.gamma,
                  gae_lambda=cfg.gae_lambda, ent_coef=cfg.ent_coef, vf_coef=cfg.vf_coef / 2,
                  max_grad_norm=cfg.max_grad_norm or 1e10, normalize_advantage=cfg.norm_adv,
                  policy_kwargs=policy_kwargs, use_sde=cfg.use_sde, sde_sample_freq=cfg.sde_sample_freq, device="cpu",
                  verbose=0, seed=cfg.seed)
    env = sb3_env(cfg)
    if cfg.algo == "a2c":
        return A2C("MlpPolicy", env, use_rms_prop=optimizer == "rmsprop", rms_prop_eps=cfg.rmsprop_eps, **common)
    return PPO("MlpPolicy", env, batch_size=cfg.minibatch_size, n_epochs=cfg.n_epochs, clip_range=cfg.clip_coef,
               clip_range_vf=cfg.clip_coef if cfg.clip_vloss else None, **common)


def sb3_unavailable(env_id: str) -> str | None:
    """Why SB3 cannot run ``env_id`` here, or None."""
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return "stable-baselines3 is not installed (pip install -e '.[bench]')"
    import gymnasium
    gym_id = GYM_IDS.get(env_id, env_id)
    try:
        gymnasium.make(gym_id).close()
    except Exception as e:  # missing Box2D / MuJoCo, unknown id
        return f"gymnasium.make({gym_id!r}) failed: {str(e).splitlines()[0]}"
    return None


# ---------------------------------------------------------------------------------------------- curves
def thin(curve: list, max_points: int = MAX_CURVE_POINTS) -> list:
    """Keep at most about ``max_points`` evenly spaced points (always the first and the last)."""
    if len(curve) <= max_points:
        return curve
    stride = len(curve) / max_points
    keep = sorted({int(i * stride) for i in range(max_points)} | {len(curve) - 1})
    return [curve[i] for i in keep]


def fastrl_curve(rows: list) -> list:
    """``[[env steps, wall s, mean return of the last 100 episodes or None], ...]`` from metrics.jsonl rows."""
    curve, wall = [], 0.0
    for row in rows:
        if all(key == "global_step" or key.startswith("eval/") for key in row):
            continue  # the final evaluation's row
        if "time/elapsed_s" in row:
            wall = row["time/elapsed_s"]
        else:
            wall += row.get("time/collect_s", 0.0) + row.get("time/update_s", 0.0)
        curve.append([row["global_step"], wall, row.get("charts/episodic_return")])
    return curve


def first_crossing(curve: list, threshold) -> tuple:
    """(env steps, wall s) of the first point whose return reaches ``threshold``; (None, None) if none does."""
    if threshold is None:
        return None, None
    for step, wall, ret in curve:
        if ret is not None and ret >= threshold:
            return step, wall
    return None, None


def summarize_run(lib: str, curve: list, threshold, wall_s: float, total_steps: int, **extra) -> dict:
    steps_to, time_to = first_crossing(curve, threshold)
    final = next((ret for _, _, ret in reversed(curve) if ret is not None), None)
    return {"lib": lib, "total_steps": total_steps, "wall_time_s": wall_s, "sps": total_steps / max(wall_s, 1e-9),
            "final_return": final, "reached": steps_to is not None, "steps_to_threshold": steps_to,
            "time_to_threshold_s": time_to, "curve": thin(curve), **extra}


# ---------------------------------------------------------------------------------------------- runs
def run_fastrl(cfg) -> dict:
    from fastrl.train import run
    with tempfile.TemporaryDirectory(prefix="fastrl-peers-") as tmp:
        summary = run(dataclasses.replace(cfg, run_dir=tmp))
        rows = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    curve = fastrl_curve(rows)
    timed_s = curve[-1][1] if curve else 0.0
    return summarize_run("fastrl", curve, cfg.stop_at_return or None, timed_s, summary["total_steps"],
                         loop_wall_time_s=summary["wall_time_s"], eval_return_mean=summary.get("eval_return_mean"),
                         eval_return_std=summary.get("eval_return_std"),
                         rollbacks=sum("events/rollback_to_step" in row for row in rows),
                         wall_clock="time/elapsed_s" if rows and "time/elapsed_s" in rows[-1] else
                         "sum of time/collect_s + time/update_s")


def run_sb3(cfg, model=None, total_timesteps: int = 0) -> dict:
    """SB3 with ``cfg``'s hyperparameters (or ``model``, built elsewhere, for ``total_timesteps``); the callback
    records the curve every ``cfg.log_interval`` rollouts and stops at ``cfg.stop_at_return``."""
    from stable_baselines3.common.callbacks import BaseCallback
    from tqdm import tqdm

    n_iterations = max(1, cfg.total_steps // cfg.batch_size)  # the same iterations fastrl runs
    total_timesteps = total_timesteps or n_iterations * cfg.batch_size
    threshold = cfg.stop_at_return or None

    class Curve(BaseCallback):
        """Logs after each update (at the next rollout's start, and at the end), like fastrl's per-iteration log."""

        def __init__(self):
            super().__init__()
            self.curve, self.stop, self.rollouts = [], False, 0

        def _on_training_start(self):
            self.bar = tqdm(total=total_timesteps, unit="step", unit_scale=True, dynamic_ncols=True,
                            file=sys.stderr, mininterval=0.5, desc="sb3", disable=not cfg.progress)
            self.start = time.perf_counter()

        def _point(self):
            wall = time.perf_counter() - self.start
            buf = self.model.ep_info_buffer
            ret = statistics.fmean(ep["r"] for ep in buf) if buf else None
            self.curve.append([self.num_timesteps, wall, ret])
            self.bar.n = self.num_timesteps
            self.bar.set_postfix({"return": f"{ret:.4g}" if ret is not None else "nan"}, refresh=False)
            self.bar.refresh()
            if threshold is not None and ret is not None and ret >= threshold:
                self.stop = True

        def _on_rollout_start(self):
            if self.num_timesteps and self.rollouts % cfg.log_interval == 0:
                self._point()
            self.rollouts += 1

        def _on_step(self):
            return not self.stop

        def _on_training_end(self):
            if not self.stop:
                self._point()
            self.bar.close()

    model = model or sb3_model(cfg, n_iterations)
    callback = Curve()
    try:
        model.learn(total_timesteps=total_timesteps, callback=callback, log_interval=None)
    finally:
        model.get_env().close()
    curve = callback.curve
    wall = curve[-1][1] if curve else 0.0
    return summarize_run("sb3", curve, threshold, wall, curve[-1][0] if curve else 0,
                         env_id=GYM_IDS.get(cfg.env, cfg.env))


def median_or_none(values: list):
    """Median where every value is known; None (not reached by enough runs) when over half are unknown."""
    known = sorted(v for v in values if v is not None)
    if len(known) * 2 <= len(values) and len(known) < len(values):
        return None
    padded = known + [math.inf] * (len(values) - len(known))
    m = statistics.median(padded)
    return None if math.isinf(m) else m


def aggregate(runs: list) -> dict:
    return {"seeds": len(runs), "reached": sum(r["reached"] for r in runs),
            "steps_to_threshold_median": median_or_none([r["steps_to_threshold"] for r in runs]),
            "time_to_threshold_s_median": median_or_none([r["time_to_threshold_s"] for r in runs]),
            "sps_median": statistics.median(r["sps"] for r in runs),
            "final_return_median": median_or_none([r["final_return"] for r in runs])}


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


# ---------------------------------------------------------------------------------------------- SB3, its own settings
# rl-baselines3-zoo hyperparams/ppo.yml, CartPole-v1 (the keys the zoo sets; SB3's defaults otherwise).
ZOO_PPO_SOURCE = "https://github.com/DLR-RM/rl-baselines3-zoo/blob/0088472b8cb622732bdbc4aa3d0d0abde86c67ed/hyperparams/ppo.yml"
ZOO_PPO_CARTPOLE = dict(n_envs=8, n_timesteps=100_000, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98,
                        n_epochs=20, ent_coef=0.0, learning_rate="lin_0.001", clip_range="lin_0.2")
# What ``PPO("MlpPolicy", env)`` uses (SB3 2.x): the constructor's defaults, MlpPolicy's net_arch (separate 64-64
# policy and value trunks), Tanh, orthogonal init, Adam with eps 1e-5. test_benchmarks checks this table against SB3.
SB3_PPO_DEFAULTS = dict(n_envs=1, learning_rate=3e-4, n_steps=2048, batch_size=64, n_epochs=10, gamma=0.99,
                        gae_lambda=0.95, clip_range=0.2, clip_range_vf=None, normalize_advantage=True, ent_coef=0.0,
                        vf_coef=0.5, max_grad_norm=0.5, net_arch=[64, 64], activation="tanh", ortho_init=True,
                        adam_eps=1e-5)
SB3_DEFAULT_BUDGET = {"full": 40_960, "quick": 4_096}  # a steps/s part: 20 (quick: 2) rollouts of 2048 steps
COMPILE_LIBS = {"fastrl": "off", "fastrl[compiled]": "default", "fastrl[torch-env]": "default",
                "fastrl[default]": "off"}  # lib -> its `compile`
# lib -> further config keys: fastrl[torch-env] steps the torch-native CartPole inside its compiled rollout graph (as
# gymnax's CartPole runs inside rejax's jitted loop); every other lib steps EnvPool.
LIB_EXTRA = {"fastrl[torch-env]": {"env_backend": "torch"}}
# sb3-zoo's "fastrl[default]": the embedded default command itself (python -m fastrl.train), beside SB3 in one run.
DEFAULT_BUDGET = 250_000
SPEED_PARTS = ["sb3-zoo", "sb3-default", "rejax"]


class Linear:
    """SB3 schedule ``progress_remaining * initial``: the zoo's ``lin_<initial>`` (a class, so SB3 can pickle it)."""

    def __init__(self, initial: float):
        self.initial = initial

    def __call__(self, progress_remaining: float) -> float:
        return progress_remaining * self.initial


def zoo_value(value):
    """``(initial value, linear?)`` of a zoo hyperparameter: ``"lin_0.2"`` -> ``(0.2, True)``, ``0.2`` -> ``(0.2, False)``."""
    if isinstance(value, str) and value.startswith("lin_"):
        return float(value[4:]), True
    return float(value), False


def sb3_settings(part: str) -> dict:
    """Every PPO hyperparameter of the part: ``sb3-zoo`` the zoo's CartPole-v1 keys over SB3's defaults,
    ``sb3-default`` SB3's defaults."""
    return {**SB3_PPO_DEFAULTS, **(ZOO_PPO_CARTPOLE if part == "sb3-zoo" else {})}


def fastrl_from_sb3(h: dict) -> dict:
    """fastrl config keys equal, term by term, to the SB3 PPO hyperparameters ``h`` (``sb3_settings``).

    n_envs, n_steps, n_epochs, gamma, gae_lambda, ent_coef, max_grad_norm -> the same keys; batch_size (a minibatch)
    -> n_minibatches = n_envs * n_steps / batch_size; learning_rate ``lin_x`` -> lr x, anneal_lr, lr_floor 0 (a
    constant: anneal_lr false); clip_range ``lin_x`` -> clip_coef x, anneal_clip (a constant: anneal_clip false);
    clip_range_vf None -> clip_vloss false; normalize_advantage -> norm_adv; vf_coef -> 2 * vf_coef (SB3's value
    loss is the MSE, fastrl's 1/2 MSE); net_arch / activation -> hidden_sizes / activation, separate trunks;
    Adam eps -> adam_eps. Both sides anneal per rollout: fastrl trains rollout k (k = 0..n-1) at 1 - k/n of the
    initial value, SB3 at 1 - (k+1)/n (its progress is updated before the update); one rollout apart.
    """
    if h["clip_range_vf"] is not None:
        raise ValueError("fastrl clips the value loss (max of clipped and unclipped), not SB3's clipped prediction")
    batch = h["n_envs"] * h["n_steps"]
    if batch % h["batch_size"]:
        raise ValueError(f"n_envs * n_steps = {batch} is not a multiple of batch_size {h['batch_size']}")
    lr, anneal_lr = zoo_value(h["learning_rate"])
    clip, anneal_clip = zoo_value(h["clip_range"])
    return dict(algo="ppo", env="CartPole-v1", n_envs=h["n_envs"], n_steps=h["n_steps"],
                n_minibatches=batch // h["batch_size"], n_epochs=h["n_epochs"], lr=lr, anneal_lr=anneal_lr,
                lr_floor=0.0, gamma=h["gamma"], gae_lambda=h["gae_lambda"], clip_coef=clip, anneal_clip=anneal_clip,
                clip_vloss=False, ent_coef=h["ent_coef"], vf_coef=2 * h["vf_coef"], max_grad_norm=h["max_grad_norm"],
                norm_adv=h["normalize_advantage"], hidden_sizes=list(h["net_arch"]), activation=h["activation"],
                shared_trunk=False, optimizer="adam", adam_eps=h["adam_eps"], normalize_obs=False,
                normalize_reward=False, target_kl=0.0, log_interval=1)


def fastrl_config(overrides: dict, seed: int, total_steps: int, threads: int, compile_mode: str,
                  threshold=None, progress: bool = True, **extra):
    from fastrl.config import make_config
    return make_config({**overrides, **QUIET, "seed": seed, "total_steps": total_steps, "torch_threads": threads,
                        "compile": compile_mode, "stop_at_return": threshold or 0.0, "progress": progress, **extra})


def sb3_native(part: str, seed: int):
    """SB3's PPO as its users write it: ``PPO("MlpPolicy", env)``, plus the zoo's keys for ``sb3-zoo``."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv
    h = sb3_settings(part)
    env = make_vec_env("CartPole-v1", n_envs=h["n_envs"], seed=seed, vec_env_cls=DummyVecEnv)
    kwargs = {}
    if part == "sb3-zoo":
        kwargs = {k: v for k, v in ZOO_PPO_CARTPOLE.items() if k not in ("n_envs", "n_timesteps")}
        for key in ("learning_rate", "clip_range"):
            value, linear = zoo_value(kwargs[key])
            kwargs[key] = Linear(value) if linear else value
    return PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kwargs)


def warm_compile_cache(overrides: dict, threads: int, libs=("fastrl[compiled]",)) -> None:
    """One untimed two-iteration run per compiled lib with ``compile default``: the update and rollout graphs land in
    the on-disk inductor cache, as a user's second run finds them (the cold compile is benchmarks/learner.py's
    figure)."""
    batch = overrides["n_envs"] * overrides["n_steps"]
    for lib in libs:
        if COMPILE_LIBS.get(lib) != "default":
            continue
        print(f"[peers] warming the compile cache for {lib} (untimed)", file=sys.stderr, flush=True)
        run_fastrl(fastrl_config(overrides, 0, 2 * batch, threads, "default", progress=False, **LIB_EXTRA.get(lib, {})))


def steady_sps(curve: list):
    """Steps/s after the first iteration (which holds any compiling), from a fastrl curve; None if too short."""
    if len(curve) < 2 or curve[-1][1] <= curve[0][1]:
        return None
    return (curve[-1][0] - curve[0][0]) / (curve[-1][1] - curve[0][1])


def bench_sb3(part: str, seeds: int, threads: int, libs: list, budget: int, progress: bool = True) -> dict:
    """``sb3-zoo``: each lib to the last-100 mean of 475 (or the budget); ``sb3-default``: steps/s over ``budget``.

    Per seed the libs run in the same process, the order alternating by seed."""
    h = sb3_settings(part)
    overrides = fastrl_from_sb3(h)
    threshold = THRESHOLDS["CartPole-v1"] if part == "sb3-zoo" else None
    entry = {"env": "CartPole-v1", "algo": "ppo", "part": part, "threshold": threshold, "budget_steps": budget,
             "sb3_hyperparameters": h, "fastrl_overrides": overrides, "compile": {k: v for k, v in COMPILE_LIBS.items()
                                                                                if k in libs},
             "runs": {}, "skipped": {}}
    if "sb3" in libs and (why := sb3_unavailable("CartPole-v1")):
        entry["skipped"]["sb3"] = why
    warm_compile_cache(overrides, threads, libs)
    for seed in range(1, seeds + 1):
        for lib in (libs if seed % 2 else libs[::-1]):
            if lib in entry["skipped"]:
                continue
            print(f"[{part}] {lib} seed {seed} (budget {budget:,} steps"
                  f"{'' if threshold is None else f', stop at {threshold:g}'})", file=sys.stderr, flush=True)
            cfg = fastrl_config(overrides, seed, budget, threads, COMPILE_LIBS.get(lib, "off"), threshold, progress,
                                **LIB_EXTRA.get(lib, {}))
            if lib == "fastrl[default]":  # `python -m fastrl.train` as is: its own settings and budget, eager as on a
                cfg = fastrl_config({}, seed, DEFAULT_BUDGET, threads, "off", threshold, progress)  # fresh machine
            if lib == "sb3":
                run = run_sb3(cfg, sb3_native(part, seed), total_timesteps=budget)
            else:
                run = run_fastrl(cfg)
                run["sps_after_first_iteration"] = steady_sps(run["curve"])
            run.update(seed=seed, torch_threads=torch.get_num_threads())
            entry["runs"].setdefault(lib, []).append(run)
            print(f"[{part}] -> {run['total_steps']:,} steps in {run['wall_time_s']:.1f}s, {run['sps']:,.0f} steps/s, "
                  f"return {run['final_return']}", file=sys.stderr, flush=True)
    entry["summary"] = {lib: aggregate(runs) for lib, runs in entry["runs"].items()}
    for lib, runs in entry["runs"].items():
        steady = [r["sps_after_first_iteration"] for r in runs if r.get("sps_after_first_iteration")]
        entry["summary"][lib]["sps_after_first_iteration_median"] = statistics.median(steady) if steady else None
    sb3 = entry["summary"].get("sb3")
    for lib, s in entry["summary"].items():
        if sb3 and lib != "sb3":
            s["sps_over_sb3"] = s["sps_median"] / sb3["sps_median"]
            if s["time_to_threshold_s_median"] and sb3["time_to_threshold_s_median"]:
                s["time_to_threshold_over_sb3"] = s["time_to_threshold_s_median"] / sb3["time_to_threshold_s_median"]
    return entry


# ---------------------------------------------------------------------------------------------- rejax (JAX)
# rejax's own CartPole-v1 PPO config (configs/cartpole.yaml of github.com/keraJLi/rejax; rejax 0.1.3 ships no configs).
REJAX_SOURCE = "https://github.com/keraJLi/rejax/blob/0be4f63ec83b38bddad7bc3ead378b34e06c9721/configs/cartpole.yaml"
REJAX_PPO_CARTPOLE = dict(env="CartPole-v1", agent_kwargs=dict(activation="tanh"), num_envs=5, num_steps=100,
                          num_epochs=5, num_minibatches=5, learning_rate=0.00075, max_grad_norm=0.5,
                          total_timesteps=100_000, eval_freq=1000, gamma=0.99, gae_lambda=0.95, clip_eps=0.2,
                          ent_coef=0.01, vf_coef=0.5)
REJAX_EVAL_EPISODES = 128  # rejax's eval_callback: 128 episodes of the sampling policy, max_steps_in_episode each
SPEED_BUDGETS = {"sb3-zoo": {"full": ZOO_PPO_CARTPOLE["n_timesteps"], "quick": 30_000},
                 "sb3-default": SB3_DEFAULT_BUDGET,
                 "rejax": {"full": REJAX_PPO_CARTPOLE["total_timesteps"], "quick": 20_000}}


def fastrl_from_rejax(r: dict) -> dict:
    """fastrl config keys equal, term by term, to rejax PPO config ``r`` (rejax 0.1.3's PPO, read from its source).

    num_envs, num_steps, num_epochs, num_minibatches -> n_envs, n_steps, n_epochs, n_minibatches; learning_rate
    (constant) -> lr, anneal_lr false; gamma, gae_lambda, ent_coef -> the same; clip_eps -> clip_coef, and rejax
    clips the value loss with clip_eps too (0.5 * max of clipped and unclipped squared errors) -> clip_vloss true,
    vf_coef the same (both 1/2 MSE); agent_kwargs (64-64 hidden, activation) -> hidden_sizes, activation, separate
    actor and critic trunks; optax.adam defaults -> adam_eps 1e-8 (rejax's two Adams, actor and critic, equal one
    Adam over both disjoint networks); per-minibatch advantage normalisation -> norm_adv; no observation or reward
    normalisation (rejax's defaults) -> normalize_obs / normalize_reward false; total_timesteps -> total_steps.
    Not equal, and kept as each library does it: rejax's max_grad_norm is ``optax.clip``, an element-wise clip of
    each gradient at 0.5, fastrl's a global-norm clip at 0.5; rejax cuts GAE at time-limit truncations as at
    terminations, fastrl bootstraps them; rejax initialises with flax's lecun-normal, fastrl orthogonally.
    eval_freq / 128 sampled episodes -> the benchmark's own evaluation callback (``RejaxEval``).
    """
    agent = r.get("agent_kwargs", {})
    return dict(algo="ppo", env=r["env"], n_envs=r["num_envs"], n_steps=r["num_steps"], n_epochs=r["num_epochs"],
                n_minibatches=r["num_minibatches"], lr=r["learning_rate"], anneal_lr=False, gamma=r["gamma"],
                gae_lambda=r["gae_lambda"], clip_coef=r["clip_eps"], anneal_clip=False, clip_vloss=True,
                ent_coef=r["ent_coef"], vf_coef=r["vf_coef"], max_grad_norm=r["max_grad_norm"], norm_adv=True,
                hidden_sizes=list(agent.get("hidden_layer_sizes", (64, 64))), activation=agent.get("activation", "swish"),
                shared_trunk=False, optimizer="adam", adam_eps=1e-8, normalize_obs=False, normalize_reward=False,
                target_kl=0.0, log_interval=1)


def rejax_unavailable() -> str | None:
    try:
        import gymnax  # noqa: F401
        import rejax  # noqa: F401
    except ImportError as e:
        return f"rejax is not installed ({e.name}; pip install -e '.[jax]')"
    return None


def pin_jax_to_cpu(threads: int) -> None:
    """Before jax is imported: the CPU backend, and (threads == 1) XLA's intra-op pool off, like torch's 1 thread."""
    import os
    os.environ["JAX_PLATFORMS"] = "cpu"
    if threads == 1 and "intra_op_parallelism_threads" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()


def run_rejax(config: dict, seeds: int, threshold: float) -> list:
    """rejax PPO per seed: compile seconds (ahead of time), training steps/s (evaluation off), and the env steps and
    training seconds to its first evaluation >= ``threshold`` (evaluation on, every ``eval_freq`` steps, plus one at
    step 0; the seconds are steps / training steps/s, the evaluations left out as on fastrl's side)."""
    import jax
    import jax.numpy as jnp
    from rejax import PPO

    def no_eval(algo, ts, rng):
        return jnp.zeros(()), jnp.zeros(())

    def compiled(cfg, evaluate=True):
        algo = PPO.create(**cfg)
        if not evaluate:
            algo = algo.replace(eval_callback=no_eval)
        start = time.perf_counter()
        fn = jax.jit(algo.train).lower(jax.random.PRNGKey(0)).compile()
        return fn, time.perf_counter() - start

    total = config["total_timesteps"]
    with_eval, compile_eval_s = compiled(config)
    train_only, compile_s = compiled({**config, "eval_freq": total, "skip_initial_evaluation": True}, False)
    runs = []
    for seed in range(1, seeds + 1):
        start = time.perf_counter()
        jax.block_until_ready(train_only(jax.random.PRNGKey(seed)))
        train_s = time.perf_counter() - start
        start = time.perf_counter()
        _, (_, returns) = with_eval(jax.random.PRNGKey(seed))
        returns = jax.device_get(returns)
        wall_with_evals_s = time.perf_counter() - start
        means = [float(m) for m in returns.mean(axis=1)]
        evals = [[i * config["eval_freq"], m] for i, m in enumerate(means)]  # evaluation 0 is at step 0
        steps = next((s for s, m in evals if m >= threshold), None)
        sps = total / train_s
        runs.append({"lib": "rejax", "seed": seed, "total_steps": total, "compile_s": compile_s,
                     "compile_with_eval_s": compile_eval_s, "train_s": train_s, "sps": sps,
                     "wall_with_evals_s": wall_with_evals_s, "reached": steps is not None,
                     "steps_to_threshold": steps, "time_to_threshold_s": None if steps is None else steps / sps,
                     "final_eval": means[-1], "evals": evals})
        print(f"[rejax] seed {seed}: {sps:,.0f} steps/s, first eval >= {threshold:g} at {steps} steps",
              file=sys.stderr, flush=True)
    return runs


class RejaxEval:
    """A fastrl callback evaluating as rejax does: every ``every`` env steps, ``episodes`` episodes (one each on
    fresh envs) of the sampling policy; stops the run at the first mean >= ``threshold``. ``evals``: ``[env steps,
    mean return, seconds it took]``."""

    def __init__(self, cfg, every: int, episodes: int, threshold: float):
        self.cfg, self.every, self.episodes, self.threshold = cfg, every, episodes, threshold
        self.next_at, self.env, self.evals = every, None, []

    def evaluate(self, agent, device) -> float:
        from fastrl.envs import make_env
        from fastrl.evaluate import play_first_episodes
        if self.env is None:
            self.env = make_env(self.cfg, n_envs=self.episodes, seed=self.cfg.seed + 1_000_003, training=False)
        with torch.no_grad():
            return play_first_episodes(agent, self.env, device, deterministic=False).mean().item()

    def __call__(self, metrics, run):
        if run.global_step < self.next_at:
            return True
        while self.next_at <= run.global_step:
            self.next_at += self.every
        start = time.perf_counter()
        mean = self.evaluate(run.agent, run.trainer.device)
        self.evals.append([run.global_step, mean, time.perf_counter() - start])
        return mean < self.threshold

    def close(self):
        if self.env is not None:
            self.env.close()


def run_fastrl_rejax(cfg, every: int, episodes: int, threshold: float) -> dict:
    """fastrl at rejax's config with ``RejaxEval``; training seconds leave the evaluations out."""
    from fastrl.train import run
    evaluator = RejaxEval(cfg, every, episodes, threshold)
    try:
        with tempfile.TemporaryDirectory(prefix="fastrl-peers-") as tmp:
            summary = run(dataclasses.replace(cfg, run_dir=tmp), None, [evaluator])
            rows = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    finally:
        evaluator.close()
    elapsed = {row["global_step"]: row["time/elapsed_s"] for row in rows if "time/elapsed_s" in row}

    def training_s(step):  # the loop's clock at ``step``, less the evaluations before it (each runs after its row)
        return elapsed[step] - sum(s for at, _, s in evaluator.evals if at < step)

    steps = next((at for at, mean, _ in evaluator.evals if mean >= threshold), None)
    curve = fastrl_curve(rows)
    last = summary["total_steps"]
    train_s = training_s(last) if last in elapsed else summary["wall_time_s"]
    first_step = curve[0][0] if curve else 0
    steady = (last - first_step) / (train_s - training_s(first_step)) if len(curve) > 1 else None
    return {"lib": "fastrl", "seed": cfg.seed, "compile": cfg.compile, "total_steps": last, "train_s": train_s,
            "sps": last / max(train_s, 1e-9), "sps_after_first_iteration": steady,
            "eval_s": sum(s for _, _, s in evaluator.evals), "reached": steps is not None, "steps_to_threshold": steps,
            "time_to_threshold_s": None if steps is None else training_s(steps),
            "final_eval": evaluator.evals[-1][1] if evaluator.evals else None, "evals": evaluator.evals}


def bench_rejax(seeds: int, threads: int, libs: list, budget: int, progress: bool = True) -> dict:
    threshold = THRESHOLDS["CartPole-v1"]
    config = {**REJAX_PPO_CARTPOLE, "total_timesteps": budget}
    overrides = fastrl_from_rejax(config)
    entry = {"env": "CartPole-v1", "algo": "ppo", "part": "rejax", "threshold": threshold, "budget_steps": budget,
             "rejax_config": config, "rejax_source": REJAX_SOURCE, "fastrl_overrides": overrides,
             "eval_every_steps": config["eval_freq"], "eval_episodes": REJAX_EVAL_EPISODES,
             "compile": {k: v for k, v in COMPILE_LIBS.items() if k in libs}, "runs": {}, "skipped": {}}
    if "rejax" in libs and (why := rejax_unavailable()):
        entry["skipped"]["rejax"] = why
    if "rejax" in libs and "rejax" not in entry["skipped"]:
        print("[rejax] compiling rejax PPO (with and without evaluation)", file=sys.stderr, flush=True)
        entry["runs"]["rejax"] = run_rejax(config, seeds, threshold)
    warm_compile_cache(overrides, threads, libs)
    for seed in range(1, seeds + 1):
        for lib in (lib for lib in libs if lib in COMPILE_LIBS and lib != "fastrl[default]"):
            print(f"[rejax] {lib} seed {seed} (budget {budget:,} steps, evaluation every {config['eval_freq']} steps)",
                  file=sys.stderr, flush=True)
            cfg = fastrl_config(overrides, seed, budget, threads, COMPILE_LIBS[lib], progress=progress,
                                **LIB_EXTRA.get(lib, {}))
            run = run_fastrl_rejax(cfg, config["eval_freq"], REJAX_EVAL_EPISODES, threshold)
            run.update(lib=lib, torch_threads=torch.get_num_threads())
            entry["runs"].setdefault(lib, []).append(run)
            print(f"[rejax] {lib} -> {run['sps']:,.0f} steps/s, first eval >= {threshold:g} at "
                  f"{run['steps_to_threshold']} steps", file=sys.stderr, flush=True)
    summary = {}
    for lib, runs in entry["runs"].items():
        steady = [r.get("sps_after_first_iteration") for r in runs if r.get("sps_after_first_iteration")]
        summary[lib] = {"seeds": len(runs), "reached": sum(r["reached"] for r in runs),
                        "steps_to_threshold_median": median_or_none([r["steps_to_threshold"] for r in runs]),
                        "time_to_threshold_s_median": median_or_none([r["time_to_threshold_s"] for r in runs]),
                        "sps_median": statistics.median(r["sps"] for r in runs),
                        "sps_after_first_iteration_median": statistics.median(steady) if steady else None,
                        "compile_s_median": statistics.median(r["compile_s"] for r in runs) if lib == "rejax" else None}
    if "rejax" in summary:
        for lib, s in summary.items():
            if lib != "rejax":
                s["sps_over_rejax"] = s["sps_median"] / summary["rejax"]["sps_median"]
    entry["summary"] = summary
    return entry


# ---------------------------------------------------------------------------------------------- report
def _fmt(v, spec=",.0f"):
    return "-" if v is None else format(v, spec)


def peers_table(results: list) -> str:
    headers = ["env", "algo", "threshold", "lib", "reached", "steps to thr. (median)", "s to thr. (median)",
               "steps/s (median)", "final return (median)"]
    rows = []
    for e in results:
        for lib, s in e["summary"].items():
            rows.append([e["env"], e["algo"], _fmt(e["threshold"], "g"), lib, f"{s['reached']}/{s['seeds']}",
                         _fmt(s["steps_to_threshold_median"]), _fmt(s["time_to_threshold_s_median"], ".1f"),
                         _fmt(s["sps_median"]), _fmt(s["final_return_median"], ".1f")])
        for lib, why in e["skipped"].items():
            rows.append([e["env"], e["algo"], _fmt(e["threshold"], "g"), lib, "skipped", why, "", "", ""])
    return markdown_table(headers, rows)


def sb3_table(entry: dict) -> str:
    """One row per library of an ``sb3-zoo`` / ``sb3-default`` entry."""
    headers = ["lib", "compile", "reached 475", "steps to 475 (median)", "s to 475 (median)", "s to 475 / SB3's",
               "steps/s (median)", "steps/s after 1st iteration", "steps/s / SB3's", "final mean-100"]
    rows = []
    for lib, s in entry["summary"].items():
        reached = f"{s['reached']}/{s['seeds']}" if entry["threshold"] else "-"
        rows.append([lib, entry.get("compile", {}).get(lib, "-"), reached, _fmt(s["steps_to_threshold_median"]),
                     _fmt(s["time_to_threshold_s_median"], ".1f"), _fmt(s.get("time_to_threshold_over_sb3"), ".2f"),
                     _fmt(s["sps_median"]), _fmt(s.get("sps_after_first_iteration_median")),
                     _fmt(s.get("sps_over_sb3"), ".2f"), _fmt(s["final_return_median"], ".1f")])
    for lib, why in entry["skipped"].items():
        rows.append([lib, "skipped: " + why] + [""] * (len(headers) - 2))
    return markdown_table(headers, rows)


def rejax_table(entry: dict) -> str:
    headers = ["lib", "compile s (median)", "steps/s (median)", "steps/s after 1st iteration", "steps/s / rejax's",
               "reached 475", "steps to 1st eval >= 475 (median)", "training s to it (median)"]
    rows = [[lib, _fmt(s.get("compile_s_median"), ".1f") if lib == "rejax" else entry["compile"].get(lib, "-"),
             _fmt(s["sps_median"]), _fmt(s.get("sps_after_first_iteration_median")), _fmt(s.get("sps_over_rejax"), ".2f"),
             f"{s['reached']}/{s['seeds']}", _fmt(s["steps_to_threshold_median"]),
             _fmt(s["time_to_threshold_s_median"], ".2f")] for lib, s in entry["summary"].items()]
    for lib, why in entry["skipped"].items():
        rows.append([lib, "skipped: " + why] + [""] * (len(headers) - 2))
    return markdown_table(headers, rows)


def learning_table(results: list) -> str:
    headers = ["env", "algo", "zoo score", "zoo steps", "fastrl steps", "fastrl eval (median)",
               "fastrl train mean-100 (median)", "seeds"]
    rows = [[e["env"] if e["zoo"]["zoo_env"] == e["env"] else f"{e['env']} (zoo: {e['zoo']['zoo_env']})", e["algo"],
             f"{e['zoo']['score']:.1f} ± {e['zoo']['std']:.1f}", f"{e['zoo']['steps']:,}",
             f"{statistics.median(r['total_steps'] for r in e['runs']) if e['runs'] else e['budget_steps']:,.0f}",
             _fmt(e["eval_return_median"], ".1f"), _fmt(e["train_return_median"], ".1f"), e["seeds"]] for e in results]
    return markdown_table(headers, rows)


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
