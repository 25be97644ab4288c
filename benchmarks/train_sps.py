"""How many env steps per second does fastrl PPO train at, against Stable-Baselines3 PPO with the same settings?

    python -m benchmarks.train_sps [--quick] [--envs CartPole-v1 LunarLander-v2] [--out PATH]

End to end (collect + update), in one process, interleaved A/B/A/B and reported as medians:
- ``fastrl``: ``Trainer(cfg)``, then ``collect(); update()`` in a loop; no logger, no checkpoints.
- ``sb3[gym]``: ``PPO("MlpPolicy", make_vec_env(gymnasium id, n_envs))``, DummyVecEnv: SB3 as users run it.
- ``sb3[envpool]``: the same SB3 learner on the same EnvPool C++ envs fastrl uses (``common.EnvPoolVecEnv``),
  so the difference is the learner alone.
Two settings per env: ``sb3-default`` (SB3's PPO defaults with 8 envs: n_steps 2048, batch 64, 10 epochs, ...)
and ``fastrl-tuned`` (configs/ppo/<env>.yaml, SB3 given the same hyperparameters).

Rollout only: ``Trainer.collect()`` against raw ``envpool.make(...).step`` on pre-generated random actions,
same n_envs and EnvPool threads: the per-step cost of fastrl's hot path (policy forward, buffer writes).

Writes JSON (default ``benchmarks/results/<machine-tag>/train_sps.json``) and prints Markdown tables.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import (default_out, interleaved, machine_info, markdown_table, make_envpool_vec_env,
                               package_version, rate_summary, write_json)

REPO = Path(__file__).resolve().parent.parent
TUNED_CONFIGS = {"CartPole-v1": REPO / "configs/ppo/cartpole.yaml", "LunarLander-v2": REPO / "configs/ppo/lunarlander.yaml"}
# Gymnasium 1.x dropped LunarLander-v2; v3 is the same task with bug fixes.
GYM_IDS = {"LunarLander-v2": "LunarLander-v3"}

# SB3's PPO defaults (stable_baselines3/ppo/ppo.py) with 8 envs, in fastrl's terms.
SB3_DEFAULT = dict(n_envs=8, n_steps=2048, n_minibatches=8 * 2048 // 64, n_epochs=10, lr=3e-4, anneal_lr=False,
                   gamma=0.99, gae_lambda=0.95, clip_coef=0.2, clip_vloss=False, ent_coef=0.0, vf_coef=0.5,
                   max_grad_norm=0.5, norm_adv=True, adam_eps=1e-5, hidden_sizes=[64, 64], activation="tanh",
                   shared_trunk=False, normalize_obs=False, normalize_reward=False, target_kl=0.0)
# Whatever the setting: no logging, no evaluation, CPU, nothing that is not the learner or the env.
QUIET = dict(device="cpu", progress=False, tensorboard=False, wandb="disabled", eval_episodes=0, checkpoint_interval=0,
             total_steps=10**9, stop_at_return=0.0)  # the tuned CartPole config's own stop rule off


# ---------------------------------------------------------------------------------------------- configs
def fastrl_config(env_id: str, setting: str, threads: int, **extra):
    from fastrl.config import make_config
    base = dict(SB3_DEFAULT) if setting == "sb3-default" else {}
    yaml_path = str(TUNED_CONFIGS[env_id]) if setting == "fastrl-tuned" else None
    return make_config({**base, **QUIET, "env": env_id, "torch_threads": threads, **extra}, yaml_path)


def sb3_kwargs(cfg) -> dict:
    """SB3 PPO keyword arguments equal to fastrl config ``cfg`` (the lr schedule aside: SB3 keeps lr constant)."""
    from torch import nn
    activation = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "silu": nn.SiLU}[cfg.activation]
    if cfg.shared_trunk or cfg.normalize_obs or cfg.normalize_reward or cfg.target_kl:
        raise ValueError("the SB3 mirror covers separate trunks, no normalization and no target_kl only")
    return dict(n_steps=cfg.n_steps, batch_size=cfg.minibatch_size, n_epochs=cfg.n_epochs, learning_rate=cfg.lr,
                gamma=cfg.gamma, gae_lambda=cfg.gae_lambda, clip_range=cfg.clip_coef,
                clip_range_vf=cfg.clip_coef if cfg.clip_vloss else None, normalize_advantage=cfg.norm_adv,
                ent_coef=cfg.ent_coef, vf_coef=cfg.vf_coef, max_grad_norm=cfg.max_grad_norm or 1e10,
                policy_kwargs=dict(net_arch=dict(pi=list(cfg.hidden_sizes), vf=list(cfg.hidden_sizes)),
                                   activation_fn=activation, ortho_init=True,
                                   optimizer_kwargs=dict(eps=cfg.adam_eps)),
                device="cpu", verbose=0, seed=cfg.seed)


# ---------------------------------------------------------------------------------------------- contenders
class FastrlContender:
    def __init__(self, cfg):
        from fastrl.run.trainer import Trainer
        self.trainer = Trainer(cfg)
        self.steps_per_iteration = self.trainer.steps_per_iteration

    def run(self, iterations: int) -> float:
        trainer = self.trainer
        start = time.perf_counter()
        for _ in range(iterations):
            trainer.collect()
            trainer.update()
        return time.perf_counter() - start

    def collect_only(self) -> float:
        start = time.perf_counter()
        self.trainer.collect()
        return time.perf_counter() - start

    def sections(self) -> dict:
        """Seconds per named Trainer section since the last call (``policy``, ``env``, ``update``)."""
        return {k.removeprefix("time/").removesuffix("_s"): v for k, v in self.trainer.timer.pop().items()}

    def close(self):
        self.trainer.env.close()


class SB3Contender:
    def __init__(self, cfg, backend: str):
        from stable_baselines3 import PPO
        if backend == "gym":
            from stable_baselines3.common.env_util import make_vec_env
            from stable_baselines3.common.vec_env import DummyVecEnv
            self.env_id = GYM_IDS.get(cfg.env, cfg.env)
            vec_env = make_vec_env(self.env_id, n_envs=cfg.n_envs, seed=cfg.seed, vec_env_cls=DummyVecEnv)
        else:
            self.env_id = cfg.env
            vec_env = make_envpool_vec_env(cfg.env, cfg.n_envs, seed=cfg.seed)
        self.model = PPO("MlpPolicy", vec_env, **sb3_kwargs(cfg))
        self.steps_per_iteration = cfg.n_envs * cfg.n_steps

    def run(self, iterations: int) -> float:
        start = time.perf_counter()
        self.model.learn(total_timesteps=iterations * self.steps_per_iteration, reset_num_timesteps=False,
                         progress_bar=False)
        return time.perf_counter() - start

    def close(self):
        self.model.get_env().close()


def sb3_unavailable(env_id: str, backend: str) -> str | None:
    """Why SB3 cannot run ``env_id`` on ``backend`` here, or None (on ``gym``: ``peers_common``'s check)."""
    if backend == "gym":
        from benchmarks.peers_common import sb3_unavailable as gym_unavailable
        return gym_unavailable(env_id)
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return "stable-baselines3 is not installed (pip install -e '.[bench]')"
    return None


# ---------------------------------------------------------------------------------------------- end to end
def iterations_for(steps_per_iteration: int, quick: bool) -> int:
    """Enough full iterations that one measurement covers >= 16k (quick) / 32k env steps, at least 1 / 2."""
    target, minimum = (16_384, 1) if quick else (32_768, 2)
    return max(minimum, math.ceil(target / steps_per_iteration))


def end_to_end(env_id: str, setting: str, threads: int, repeats: int, quick: bool, sb3_backends: list) -> dict:
    cfg = fastrl_config(env_id, setting, threads)
    iterations = iterations_for(cfg.batch_size, quick)
    steps = iterations * cfg.batch_size
    hyper = {k: getattr(cfg, k) for k in ("n_envs", "n_steps", "n_minibatches", "n_epochs", "lr", "anneal_lr", "gamma",
                                          "gae_lambda", "clip_coef", "clip_vloss", "ent_coef", "vf_coef",
                                          "max_grad_norm", "norm_adv", "adam_eps", "hidden_sizes", "activation")}
    hyper["minibatch_size"] = cfg.minibatch_size
    result = {"env": env_id, "setting": setting, "hyperparameters": hyper, "iterations_per_measurement": iterations,
              "steps_per_measurement": steps, "repeats": repeats, "sps": {}, "skipped": {}, "sb3_env_ids": {}}
    contenders = {"fastrl": FastrlContender(cfg)}
    for backend in sb3_backends:
        why = sb3_unavailable(env_id, backend)
        if why:
            result["skipped"][f"sb3[{backend}]"] = why
            continue
        contender = SB3Contender(cfg, backend)
        contenders[f"sb3[{backend}]"] = contender
        result["sb3_env_ids"][f"sb3[{backend}]"] = contender.env_id
    try:
        for contender in contenders.values():  # warm-up: one full iteration each (allocations, lazy init)
            contender.run(1)
        fastrl = contenders["fastrl"]
        fastrl.sections()
        samples = interleaved({name: (lambda c=c: c.run(iterations)) for name, c in contenders.items()}, repeats)
        measured = sum(samples["fastrl"])
        sections = fastrl.sections()
        sections["other"] = measured - sum(sections.values())
        result["fastrl_time_share"] = {k: v / measured for k, v in sections.items()}
    finally:
        for contender in contenders.values():
            contender.close()
    for name, seconds in samples.items():
        result["sps"][name] = rate_summary(seconds, steps)
    for name in result["sps"]:
        if name != "fastrl":
            result[f"fastrl_over_{name}"] = result["sps"]["fastrl"]["median"] / result["sps"][name]["median"]
    return result


# ---------------------------------------------------------------------------------------------- rollout only
def raw_envpool(env_id: str, n_envs: int, n_steps: int, seed: int = 0):
    """A function that steps an EnvPool batch ``n_steps`` times on pre-generated random actions; returns seconds."""
    import envpool
    env = envpool.make(env_id, env_type="gymnasium", num_envs=n_envs, seed=seed)
    space, rng = env.action_space, np.random.default_rng(seed)
    if hasattr(space, "n"):
        actions = rng.integers(0, space.n, size=(n_steps, n_envs), dtype=np.int32)
    else:
        actions = rng.uniform(space.low, space.high, size=(n_steps, n_envs, *space.shape)).astype(np.float32)
    env.reset()

    def run() -> float:
        start = time.perf_counter()
        for t in range(n_steps):
            env.step(actions[t])
        return time.perf_counter() - start
    return run, env


def rollout(env_id: str, n_envs: int, threads: int, repeats: int, quick: bool) -> dict:
    n_steps = max(64, (8192 if quick else 16384) // n_envs)
    trainer = FastrlContender(fastrl_config(env_id, "sb3-default", threads, n_envs=n_envs, n_steps=n_steps,
                                            n_minibatches=1))
    raw, env = raw_envpool(env_id, n_envs, n_steps)
    try:
        trainer.collect_only(), raw()  # warm-up
        trainer.sections()
        samples = interleaved({"raw_envpool": raw, "fastrl_collect": trainer.collect_only}, repeats)
        measured = sum(samples["fastrl_collect"])
        sections = trainer.sections()
        sections["other"] = measured - sum(sections.values())
    finally:
        trainer.close()
        env.close()
    steps = n_steps * n_envs
    sps = {name: rate_summary(seconds, steps) for name, seconds in samples.items()}
    fastrl_us = 1e6 * statistics.median(samples["fastrl_collect"]) / n_steps
    raw_us = 1e6 * statistics.median(samples["raw_envpool"]) / n_steps
    return {"env": env_id, "n_envs": n_envs, "n_steps": n_steps, "repeats": repeats, "sps": sps,
            "fastrl_over_raw": sps["fastrl_collect"]["median"] / sps["raw_envpool"]["median"],
            "us_per_batched_step": {"fastrl_collect": fastrl_us, "raw_envpool": raw_us, "overhead": fastrl_us - raw_us},
            "fastrl_time_share": {k: v / measured for k, v in sections.items()}}


# ---------------------------------------------------------------------------------------------- report
def _share(shares: dict) -> str:
    return " / ".join(f"{100 * shares.get(k, 0.0):.0f}" for k in ("policy", "env", "update", "other"))


def tables(report: dict) -> str:
    info = report["machine"]
    out = [f"## train_sps on {info['machine']} ({info['cpu_model']}), torch {info['torch']}, "
           f"{report['threads']} torch threads, {'quick' if report['quick'] else 'full'}, {info['timestamp']}", ""]
    if report["end_to_end"]:
        backends = [f"sb3[{b}]" for b in report["sb3_backends"]]
        headers = ["env", "setting", "N x T", "mb x ep", "fastrl SPS", *[f"{b} SPS" for b in backends],
                   *[f"fastrl / {b}" for b in backends], "fastrl policy/env/update/other %"]
        rows = []
        for r in report["end_to_end"]:
            h = r["hyperparameters"]
            sps = r["sps"]
            rows.append([r["env"], r["setting"], f"{h['n_envs']} x {h['n_steps']}", f"{h['minibatch_size']} x {h['n_epochs']}",
                         sps["fastrl"]["median"], *[sps[b]["median"] if b in sps else "skipped" for b in backends],
                         *[f"{r[f'fastrl_over_{b}']:.2f}x" if b in sps else "-" for b in backends],
                         _share(r["fastrl_time_share"])])
        out += ["End to end (collect + update), median steps/s over interleaved repeats:", "",
                markdown_table(headers, rows), ""]
        for r in report["end_to_end"]:
            for name, why in r["skipped"].items():
                out.append(f"- {r['env']} {r['setting']}: {name} skipped: {why}")
    if report["rollout"]:
        headers = ["env", "n_envs", "raw EnvPool SPS", "fastrl collect SPS", "fastrl / raw", "raw us/step",
                   "fastrl us/step", "overhead us/step", "fastrl policy/env/other %"]
        rows = []
        for r in report["rollout"]:
            us = r["us_per_batched_step"]
            rows.append([r["env"], r["n_envs"], r["sps"]["raw_envpool"]["median"], r["sps"]["fastrl_collect"]["median"],
                         f"{r['fastrl_over_raw']:.2f}x", f"{us['raw_envpool']:.1f}", f"{us['fastrl_collect']:.1f}",
                         f"{us['overhead']:.1f}",
                         " / ".join(f"{100 * r['fastrl_time_share'].get(k, 0.0):.0f}" for k in ("policy", "env", "other"))])
        out += ["", "Rollout only (Trainer.collect() vs raw EnvPool stepping random actions), median steps/s; "
                "us/step is per batched step of all n_envs:", "", markdown_table(headers, rows)]
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.train_sps", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter measurements and fewer repeats")
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "LunarLander-v2"], help="EnvPool env ids")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<machine>/train_sps.json)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for every contender (default 1: 64x64 MLPs gain nothing from more, and "
                             "on a busy machine extra OpenMP threads spin against EnvPool's; 0 = torch's default)")
    parser.add_argument("--repeats", type=int, default=0, help="measurements per contender (default 2 quick, 3 full)")
    parser.add_argument("--settings", nargs="+", default=["sb3-default", "fastrl-tuned"],
                        choices=["sb3-default", "fastrl-tuned"], help="end-to-end settings")
    parser.add_argument("--sb3-backends", nargs="*", default=["gym", "envpool"], choices=["gym", "envpool"],
                        help="SB3 env backends: gym (DummyVecEnv, as users run it), envpool (same envs as fastrl)")
    parser.add_argument("--rollout-envs", nargs="+", type=int, default=[8, 64], help="n_envs for the rollout-only part")
    parser.add_argument("--skip", nargs="*", default=[], choices=["end_to_end", "rollout"], help="parts to skip")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    repeats = args.repeats or (2 if args.quick else 3)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    report = {"benchmark": "train_sps", "machine": machine_info(), "threads": threads, "quick": args.quick,
              "repeats": repeats, "sb3_backends": args.sb3_backends,
              "versions": {p: package_version(p) for p in ("fastrl", "stable_baselines3", "envpool", "gymnasium", "box2d")},
              "command": "python -m benchmarks.train_sps " + " ".join(sys.argv[1:] if argv is None else argv),
              "end_to_end": [], "rollout": []}
    started = time.perf_counter()
    if "end_to_end" not in args.skip:
        for env_id in args.envs:
            for setting in args.settings:
                print(f"[train_sps] end to end: {env_id} {setting}", file=sys.stderr, flush=True)
                report["end_to_end"].append(end_to_end(env_id, setting, threads, repeats, args.quick, args.sb3_backends))
    if "rollout" not in args.skip:
        for env_id in args.envs:
            for n_envs in args.rollout_envs:
                print(f"[train_sps] rollout: {env_id} n_envs={n_envs}", file=sys.stderr, flush=True)
                report["rollout"].append(rollout(env_id, n_envs, threads, 2 * repeats + 1, args.quick))
    report["wall_time_s"] = time.perf_counter() - started
    report["machine"]["load_average_at_end"] = machine_info()["load_average_at_start"]
    path = write_json(report, args.out or default_out("train_sps"))
    print(tables(report))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
