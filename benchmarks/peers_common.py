"""What every peer part shares: SB3 built as fastrl's twin (``sb3_model``, ``sb3_env``), one fastrl run and one SB3 run
with their curves (env steps, wall seconds, mean return of the last 100 episodes), and the curves' summaries."""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import gymnasium
import numpy as np
import torch



REPO = Path(__file__).resolve().parent.parent


# Gymnasium 1.x dropped LunarLander-v2; v3 is the same task with bug fixes (EnvPool has both).
GYM_IDS = {"LunarLander-v2": "LunarLander-v3"}


THRESHOLDS = {"CartPole-v1": 475.0, "Acrobot-v1": -100.0, "LunarLander-v2": 200.0, "HalfCheetah-v4": None}


QUIET = dict(device="cpu", progress=True, tensorboard=False, wandb="disabled", eval_episodes=0, checkpoint_interval=0)


MAX_CURVE_POINTS = 400


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


def run_fastrl(cfg) -> dict:
    from fastrl.run.session import run
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


COMPILE_LIBS = {"fastrl": "off", "fastrl[compiled]": "default", "fastrl[torch-env]": "default",
                "fastrl[default]": "off"}  # lib -> its `compile`


# lib -> further config keys: fastrl[torch-env] steps the torch-native CartPole inside its compiled rollout graph (as
# gymnax's CartPole runs inside rejax's jitted loop); every other lib steps EnvPool.
LIB_EXTRA = {"fastrl[torch-env]": {"env_backend": "torch"}}


def fastrl_config(overrides: dict, seed: int, total_steps: int, threads: int, compile_mode: str,
                  threshold=None, progress: bool = True, **extra):
    from fastrl.config import make_config
    return make_config({**overrides, **QUIET, "seed": seed, "total_steps": total_steps, "torch_threads": threads,
                        "compile": compile_mode, "stop_at_return": threshold or 0.0, "progress": progress, **extra})


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


def fmt(v, spec=",.0f"):
    return "-" if v is None else format(v, spec)
