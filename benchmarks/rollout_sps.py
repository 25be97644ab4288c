"""Rollout and end-to-end throughput: is ``collect()`` close to raw EnvPool speed, synchronously and asynchronously?

    python -m benchmarks.rollout_sps [--quick] [--envs ID ...] [--n-envs N ...] [--no-train] [--out PATH]

1. Rollout steps/s, ``Trainer.collect()`` (policy forward + env step + buffer write), with ``env_mode`` sync and
   async, on CartPole-v1, LunarLander-v2, Pong-v5 and Breakout-v5 at 8, 64 and 256 envs (``--quick``: 8 and 64),
   against raw EnvPool in both modes, all four measured in the same run, interleaved (order rotated each round):
   - raw sync: ``env.step(actions)`` on all envs, pre-generated random actions;
   - raw async: the same envs built with ``batch_size = n_envs / 2`` (the two groups fastrl's async mode uses),
     ``recv()`` then ``send()`` of pre-generated actions to the envs that came back;
   - the same env options (Atari preprocessing) and worker threads everywhere.
   One ``rollout[]`` row per env, n_envs and mode, with ``raw_sps`` (raw EnvPool in the row's mode),
   ``raw_sync_sps``, ``raw_async_sps``, ``rollout_sps``, and ``rollout_over_raw`` = rollout / the faster raw mode
   (the speed EnvPool alone reaches), besides ``rollout_over_raw_sync`` and ``rollout_over_raw_async``. The
   Trainer's Timer splits each rollout into ``policy`` and ``env`` seconds (``time_share``).
2. End-to-end training steps/s (collect + update), PPO, on Breakout-v5 (eager sync, eager async, bf16, compiled) and
   on one Procgen game (CoinrunEasy-v0, sync and async; skipped with the reason when the Qt 5 runtime is missing).
JSON goes to benchmarks/results/<machine-tag>/rollout_sps.json; a table is printed.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from benchmarks.common import default_out, machine_info, markdown_table, rate_summary, write_json
from fastrl.config import UserError, make_config
from fastrl.envs.async_env import ASYNC_GROUPS
from fastrl.envs.registry import atari_kwargs, is_atari
from fastrl.run.trainer import Trainer

QUIET = dict(progress=False, tensorboard=False, wandb="disabled", eval_episodes=0)
ENVS = ("CartPole-v1", "LunarLander-v2", "Pong-v5", "Breakout-v5")
MODES = ("sync", "async")


def _envpool_kwargs(env_id: str, threads: int) -> dict:
    kwargs = atari_kwargs(make_config(dict(env=env_id)), training=True) if is_atari(env_id) else {}
    if threads:
        kwargs["num_threads"] = threads
    return kwargs


def _random_actions(space, shape: tuple, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if hasattr(space, "n"):
        return rng.integers(0, space.n, size=shape)
    return rng.uniform(space.low, space.high, size=(*shape, *space.shape)).astype(np.float32)


def raw_envpool(env_id: str, n_envs: int, threads: int, steps: int, mode: str):
    """A callable timing ``steps`` raw EnvPool steps per env (``steps * n_envs`` in all), and the env to close.

    ``sync``: ``step`` on all envs. ``async``: ``batch_size = n_envs / ASYNC_GROUPS``, every group kept in flight:
    ``recv`` one batch, ``send`` its envs' next actions."""
    import envpool
    kwargs = _envpool_kwargs(env_id, threads)
    if mode == "sync":
        env = envpool.make(env_id, env_type="gymnasium", num_envs=n_envs, seed=0, **kwargs)
        env.reset()
        actions = _random_actions(env.action_space, (steps, n_envs))

        def run() -> float:
            start = time.perf_counter()
            for t in range(steps):
                env.step(actions[t])
            return time.perf_counter() - start
        return run, env
    batch = n_envs // ASYNC_GROUPS
    env = envpool.make(env_id, env_type="gymnasium", num_envs=n_envs, batch_size=batch, seed=0, **kwargs)
    env.async_reset()
    n_recv = steps * ASYNC_GROUPS
    actions = _random_actions(env.action_space, (n_recv, batch))

    def run() -> float:
        start = time.perf_counter()
        for k in range(n_recv):
            *_, info = env.recv()
            env.send(actions[k], info["env_id"])
        return time.perf_counter() - start
    return run, env


def rollout(env_id: str, n_envs: int, threads: int, steps: int, mode: str, extra: dict):
    """A callable timing one ``Trainer.collect()`` of ``steps`` per env, the trainer, and its summed sections."""
    cfg = make_config(dict(env=env_id, n_envs=n_envs, n_steps=steps, n_minibatches=1, env_threads=threads,
                           env_mode=mode, **QUIET, **extra))
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
    """Rows: one per env, n_envs and mode; raw sync, raw async, rollout sync and rollout async interleaved."""
    results = []
    for env_id in env_ids:
        for n_envs in env_counts:
            raws = {mode: raw_envpool(env_id, n_envs, threads, steps, mode) for mode in MODES}
            rolls = {mode: rollout(env_id, n_envs, threads, steps, mode, {}) for mode in MODES}
            fns = {**{f"raw_{m}": raws[m][0] for m in MODES}, **{f"rollout_{m}": rolls[m][0] for m in MODES}}
            for m in MODES:
                raws[m][0]()  # warm-up
            seconds = {name: [] for name in fns}
            names = list(fns)
            for r in range(repeats):  # interleaved, the order rotated each round
                for name in names[r % len(names):] + names[:r % len(names)]:
                    seconds[name].append(fns[name]())
            work = steps * n_envs
            rates = {name: rate_summary(s, work) for name, s in seconds.items()}
            raw_best = max(rates["raw_sync"]["median"], rates["raw_async"]["median"])
            for mode in MODES:
                roll, sections = rates[f"rollout_{mode}"], rolls[mode][2]
                total = sum(v for k, v in sections.items() if k != "time/collect_s") or 1.0
                row = {"env": env_id, "n_envs": n_envs, "mode": mode, "env_threads": threads,
                       "raw_sps": rates[f"raw_{mode}"], "raw_sync_sps": rates["raw_sync"],
                       "raw_async_sps": rates["raw_async"], "rollout_sps": roll,
                       "rollout_over_raw": roll["median"] / raw_best,
                       "rollout_over_raw_sync": roll["median"] / rates["raw_sync"]["median"],
                       "rollout_over_raw_async": roll["median"] / rates["raw_async"]["median"],
                       "time_share": {k.removeprefix("time/").removesuffix("_s"): v / total
                                      for k, v in sections.items() if k != "time/collect_s"},
                       "torch_threads": torch.get_num_threads()}
                results.append(row)
                print(f"{env_id} n_envs={n_envs} {mode}: raw sync {rates['raw_sync']['median']:,.0f}/s, raw async "
                      f"{rates['raw_async']['median']:,.0f}/s, rollout {roll['median']:,.0f}/s "
                      f"({row['rollout_over_raw']:.0%} of the faster raw), time share {row['time_share']}", flush=True)
            for mode in MODES:
                rolls[mode][1].close()
                raws[mode][1].close()
    return results


def bench_train(env_id, n_envs, n_steps, iterations, variants, threads):
    results = []
    for name, extra in variants.items():
        cfg = make_config(dict(env=env_id, n_envs=n_envs, n_steps=n_steps, n_epochs=1, n_minibatches=2,
                               env_threads=threads, **QUIET, **extra))
        try:
            trainer = Trainer(cfg)
        except UserError as e:  # e.g. Procgen without the Qt 5 runtime
            results.append({"variant": name, "env": env_id, "skipped": str(e)})
            print(f"train {env_id} {name}: skipped ({e})", flush=True)
            continue
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
        row = {"variant": name, "env": env_id, "env_mode": trainer.env_mode, "n_envs": n_envs, "n_steps": n_steps,
               "iterations": iterations, "sps": iterations * n_envs * n_steps / elapsed, "warmup_s": warmup,
               "compiled": bool(trainer.update_call.compiled), "compile_plan": trainer.plan.to_dict(),
               "sections_s": sections}
        results.append(row)
        print(f"train {env_id} {name}: {row['sps']:,.0f} steps/s (warm-up {warmup:.1f}s) {sections}", flush=True)
        trainer.close()
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rollout_sps", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 and 64 envs, fewer steps and repeats (a smoke run)")
    parser.add_argument("--envs", nargs="+", default=list(ENVS), help=f"EnvPool ids (default: {' '.join(ENVS)})")
    parser.add_argument("--n-envs", nargs="+", type=int, default=None, help="env counts (default 8 64 256; quick 8 64)")
    parser.add_argument("--steps", type=int, default=None, help="steps per env per sample (default 64; quick 16)")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 3; quick 2)")
    parser.add_argument("--env-threads", type=int, default=0, help="EnvPool worker threads (0 = EnvPool's default)")
    parser.add_argument("--no-train", action="store_true", help="skip the end-to-end training part")
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled end-to-end variant")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<machine>/rollout_sps.json)")
    args = parser.parse_args(argv)
    steps = args.steps or (16 if args.quick else 64)
    repeats = args.repeats or (2 if args.quick else 3)
    env_counts = tuple(args.n_envs or ((8, 64) if args.quick else (8, 64, 256)))
    info = machine_info()
    rollout_rows = bench_rollout(args.envs, env_counts, steps, repeats, args.env_threads)
    train_rows = []
    if not args.no_train:
        variants = {"eager": {"compile": "off"}, "eager-async": {"compile": "off", "env_mode": "async"},
                    "bf16": {"compile": "off", "amp": "bf16"}}
        if not args.no_compile:
            variants["compiled"] = {"compile": "default"}
        train_steps, train_iterations = (16, 2) if args.quick else (64, 3)
        train_rows = bench_train("Breakout-v5", 8, train_steps, train_iterations, variants, args.env_threads)
        train_rows += bench_train("CoinrunEasy-v0", 8, train_steps, train_iterations,
                                  {"eager": {"compile": "off"}, "eager-async": {"compile": "off", "env_mode": "async"}},
                                  args.env_threads)
    report = {"benchmark": "rollout_sps", "quick": args.quick, "machine": info, "steps_per_sample": steps,
              "repeats": repeats, "async_groups": ASYNC_GROUPS, "rollout": rollout_rows, "train": train_rows}
    path = write_json(report, args.out or default_out("rollout_sps"))
    print()
    print(markdown_table(["env", "n_envs", "mode", "raw sync steps/s", "raw async steps/s", "rollout steps/s",
                          "rollout / faster raw", "policy %", "env %"],
                         [[r["env"], r["n_envs"], r["mode"], r["raw_sync_sps"]["median"], r["raw_async_sps"]["median"],
                           r["rollout_sps"]["median"], f"{r['rollout_over_raw']:.0%}",
                           f"{r['time_share'].get('policy', 0):.0%}", f"{r['time_share'].get('env', 0):.0%}"]
                          for r in rollout_rows]))
    if train_rows:
        print()
        print(markdown_table(["env", "variant", "train steps/s", "warm-up s", "compiled"],
                             [[r["env"], r["variant"], r.get("sps", "skipped"), r.get("warmup_s"), r.get("compiled")]
                              for r in train_rows]))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
