"""Rollout and end-to-end throughput on Atari: is the rollout close to raw EnvPool speed?

    python -m benchmarks.rollout_sps [--quick] [--out PATH]

1. Rollout steps/s: ``Trainer.collect()`` (policy forward + env step + buffer write) on Pong-v5 and Breakout-v5
   with n_envs in {8, 32, 64}, against raw EnvPool steps/s (the same envs, options and worker threads, stepped
   with pre-generated random actions) in the same run, interleaved. The Trainer's Timer splits the rollout into
   ``policy`` and ``env`` seconds.
2. End-to-end training steps/s (collect + update) on Breakout-v5, PPO: eager vs bf16 autocast vs torch.compile.
JSON goes to benchmarks/results/<machine-tag>/rollout_sps.json; a table is printed.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from benchmarks.common import default_out, machine_info, markdown_table, rate_summary, write_json
from fastrl.config import make_config
from fastrl.envs import atari_kwargs
from fastrl.train import Trainer

QUIET = dict(progress=False, tensorboard=False, wandb="disabled", eval_episodes=0)


def raw_envpool(env_id: str, n_envs: int, threads: int, cfg, steps: int):
    """A callable timing ``steps`` raw EnvPool batch steps with pre-generated random actions."""
    import envpool
    kwargs = atari_kwargs(cfg, training=True)
    if threads:
        kwargs["num_threads"] = threads
    env = envpool.make(env_id, env_type="gymnasium", num_envs=n_envs, seed=0, **kwargs)
    env.reset()
    actions = np.random.default_rng(0).integers(0, env.action_space.n, size=(steps, n_envs))

    def run() -> float:
        start = time.perf_counter()
        for t in range(steps):
            env.step(actions[t])
        return time.perf_counter() - start
    return run, env


def rollout(env_id: str, n_envs: int, threads: int, steps: int, extra: dict):
    cfg = make_config(dict(env=env_id, n_envs=n_envs, n_steps=steps, n_minibatches=1, env_threads=threads, **QUIET,
                           **extra))
    trainer = Trainer(cfg)
    trainer.collect()  # warm-up
    trainer.timer.pop()
    sections = {}

    def run() -> float:
        start = time.perf_counter()
        trainer.collect()
        elapsed = time.perf_counter() - start
        for k, v in trainer.timer.pop().items():
            sections[k] = sections.get(k, 0.0) + v
        return elapsed
    return run, trainer, sections


def bench_rollout(env_ids, env_counts, steps, repeats, threads):
    results = []
    for env_id in env_ids:
        for n_envs in env_counts:
            cfg = make_config(dict(env=env_id))
            raw_fn, raw_env = raw_envpool(env_id, n_envs, threads, cfg, steps)
            roll_fn, trainer, sections = rollout(env_id, n_envs, threads, steps, {})
            raw_fn()
            raw_s, roll_s = [], []
            for r in range(repeats):  # interleaved, order flipped each round
                pair = (raw_fn, roll_fn) if r % 2 == 0 else (roll_fn, raw_fn)
                for fn in pair:
                    (raw_s if fn is raw_fn else roll_s).append(fn())
            work = steps * n_envs
            raw, roll = rate_summary(raw_s, work), rate_summary(roll_s, work)
            total = sum(sections.values()) or 1.0
            row = {"env": env_id, "n_envs": n_envs, "env_threads": threads, "raw_sps": raw, "rollout_sps": roll,
                   "rollout_over_raw": roll["median"] / raw["median"],
                   "time_share": {k.removeprefix("time/").removesuffix("_s"): v / total for k, v in sections.items()},
                   "torch_threads": torch.get_num_threads()}
            results.append(row)
            print(f"{env_id} n_envs={n_envs}: raw {raw['median']:,.0f}/s, rollout {roll['median']:,.0f}/s "
                  f"({row['rollout_over_raw']:.0%}), time share {row['time_share']}", flush=True)
            trainer.env.close()
            raw_env.close()
    return results


def bench_train(env_id, n_envs, n_steps, iterations, variants, threads):
    results = []
    for name, extra in variants.items():
        cfg = make_config(dict(env=env_id, n_envs=n_envs, n_steps=n_steps, n_epochs=1, n_minibatches=2,
                               env_threads=threads, **QUIET, **extra))
        trainer = Trainer(cfg)
        start = time.perf_counter()
        trainer.collect()
        trainer.update()  # warm-up (and compilation)
        warmup = time.perf_counter() - start
        trainer.timer.pop()
        start = time.perf_counter()
        for _ in range(iterations):
            trainer.collect()
            trainer.update()
        elapsed = time.perf_counter() - start
        sections = trainer.timer.pop()
        row = {"variant": name, "env": env_id, "n_envs": n_envs, "n_steps": n_steps, "iterations": iterations,
               "sps": iterations * n_envs * n_steps / elapsed, "warmup_s": warmup,
               "compiled": bool(trainer.loss_fn.compiled), "sections_s": sections}
        results.append(row)
        print(f"train {name}: {row['sps']:,.0f} steps/s (warm-up {warmup:.1f}s) {sections}", flush=True)
        trainer.env.close()
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rollout_sps", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats (a smoke run)")
    parser.add_argument("--env-threads", type=int, default=0, help="EnvPool worker threads (0 = EnvPool's default)")
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled end-to-end variant")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<machine>/rollout_sps.json)")
    args = parser.parse_args(argv)
    steps, repeats = (16, 2) if args.quick else (64, 3)
    env_counts = (8, 64) if args.quick else (8, 32, 64)
    info = machine_info()
    rollout_rows = bench_rollout(["Pong-v5", "Breakout-v5"], env_counts, steps, repeats, args.env_threads)
    variants = {"eager": {"compile": "off"}, "bf16": {"compile": "off", "amp": "bf16"}}
    if not args.no_compile:
        variants["compiled"] = {"compile": "default"}
    train_rows = bench_train("Breakout-v5", 8, 16 if args.quick else 64, 2 if args.quick else 3, variants,
                             args.env_threads)
    report = {"benchmark": "rollout_sps", "quick": args.quick, "machine": info, "steps_per_sample": steps,
              "repeats": repeats, "rollout": rollout_rows, "train": train_rows}
    path = write_json(report, args.out or default_out("rollout_sps"))
    print()
    print(markdown_table(["env", "n_envs", "raw EnvPool steps/s", "rollout steps/s", "rollout/raw", "policy %", "env %"],
                         [[r["env"], r["n_envs"], r["raw_sps"]["median"], r["rollout_sps"]["median"],
                           f"{r['rollout_over_raw']:.0%}", f"{r['time_share'].get('policy', 0):.0%}",
                           f"{r['time_share'].get('env', 0):.0%}"] for r in rollout_rows]))
    print()
    print(markdown_table(["variant", "train steps/s", "warm-up s", "compiled"],
                         [[r["variant"], r["sps"], r["warmup_s"], r["compiled"]] for r in train_rows]))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
