"""How fast is fastrl against SB3 at SB3's own settings? The ``sb3-zoo`` and ``sb3-default`` parts of
``python -m benchmarks.peers``.

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
"""
from __future__ import annotations

import statistics
import sys

import torch

from benchmarks.common import markdown_table
from benchmarks.peers_common import (COMPILE_LIBS, LIB_EXTRA, THRESHOLDS, aggregate, fastrl_config, fmt, run_fastrl,
                                     run_sb3, sb3_unavailable, warm_compile_cache)


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


# sb3-zoo's "fastrl[default]": the embedded default command itself (python -m fastrl.train), beside SB3 in one run.
DEFAULT_BUDGET = 250_000


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


def sb3_table(entry: dict) -> str:
    """One row per library of an ``sb3-zoo`` / ``sb3-default`` entry."""
    headers = ["lib", "compile", "reached 475", "steps to 475 (median)", "s to 475 (median)", "s to 475 / SB3's",
               "steps/s (median)", "steps/s after 1st iteration", "steps/s / SB3's", "final mean-100"]
    rows = []
    for lib, s in entry["summary"].items():
        reached = f"{s['reached']}/{s['seeds']}" if entry["threshold"] else "-"
        rows.append([lib, entry.get("compile", {}).get(lib, "-"), reached, fmt(s["steps_to_threshold_median"]),
                     fmt(s["time_to_threshold_s_median"], ".1f"), fmt(s.get("time_to_threshold_over_sb3"), ".2f"),
                     fmt(s["sps_median"]), fmt(s.get("sps_after_first_iteration_median")),
                     fmt(s.get("sps_over_sb3"), ".2f"), fmt(s["final_return_median"], ".1f")])
    for lib, why in entry["skipped"].items():
        rows.append([lib, "skipped: " + why] + [""] * (len(headers) - 2))
    return markdown_table(headers, rows)
