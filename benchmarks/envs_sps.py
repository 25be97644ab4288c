"""Raw environment throughput: EnvPool against Gymnasium's vector envs, random actions, no learner.

    python -m benchmarks.envs_sps [--quick] [--envs CartPole-v1 ...] [--n-envs 8 32] [--out PATH]

For each (env, n_envs), in one run and interleaved (order reversed every round), it steps:
- ``envpool``: ``envpool.make(id, env_type="gymnasium", num_envs=n)`` (sync, EnvPool's default worker threads);
- ``gym_sync``: ``gymnasium.vector.SyncVectorEnv`` (one process, a Python loop over envs);
- ``gym_async``: ``gymnasium.vector.AsyncVectorEnv`` (one subprocess per env, shared memory).
Actions are pre-generated, so the time is the env's alone. All three auto-reset on the step after an episode ends.
Reports the median env steps/s (n_envs x batched steps per second). JSON goes to
benchmarks/results/<machine-tag>/envs_sps.json.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings

import numpy as np

from benchmarks.common import (default_out, interleaved, machine_info, markdown_table, package_version, rate_summary,
                               write_json)

GYM_IDS = {"LunarLander-v2": "LunarLander-v3"}  # Gymnasium 1.x has only v3 (v2 with bug fixes)
BACKENDS = ("envpool", "gym_sync", "gym_async")


def make(backend: str, env_id: str, n_envs: int, seed: int = 0):
    if backend == "envpool":
        import envpool
        return envpool.make(env_id, env_type="gymnasium", num_envs=n_envs, seed=seed)
    import gymnasium
    gym_id = GYM_IDS.get(env_id, env_id)
    fns = [lambda: gymnasium.make(gym_id) for _ in range(n_envs)]
    vector = gymnasium.vector.SyncVectorEnv if backend == "gym_sync" else gymnasium.vector.AsyncVectorEnv
    return vector(fns)


def random_actions(space, steps: int, n_envs: int, seed: int = 0) -> np.ndarray:
    """``[steps, n_envs, ...]`` actions from the single-env ``space`` (Discrete or Box)."""
    rng = np.random.default_rng(seed)
    if hasattr(space, "n"):
        return rng.integers(0, space.n, size=(steps, n_envs)).astype(np.int32)
    return rng.uniform(space.low, space.high, size=(steps, n_envs, *space.shape)).astype(np.float32)


def stepper(env, actions: np.ndarray):
    """A callable that steps ``env`` through ``actions`` and returns the seconds it took."""
    def run() -> float:
        start = time.perf_counter()
        for a in actions:
            env.step(a)
        return time.perf_counter() - start
    return run


def unavailable(backend: str, env_id: str) -> str | None:
    try:
        env = make(backend, env_id, 1)
        env.close()
    except Exception as e:  # missing Box2D / MuJoCo, unknown id
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def bench(env_id: str, n_envs: int, backends: list, steps: int, repeats: int) -> dict:
    row = {"env": env_id, "n_envs": n_envs, "batched_steps": steps, "repeats": repeats, "sps": {}, "skipped": {}}
    envs, contenders = {}, {}
    try:
        for backend in backends:
            why = unavailable(backend, env_id)
            if why:
                row["skipped"][backend] = why
                continue
            env = envs[backend] = make(backend, env_id, n_envs)
            space = env.single_action_space if hasattr(env, "single_action_space") else env.action_space
            env.reset(seed=0) if backend != "envpool" else env.reset()
            actions = random_actions(space, steps, n_envs)
            contenders[backend] = stepper(env, actions)
            contenders[backend]()  # warm-up (subprocess start, first resets)
        samples = interleaved(contenders, repeats)
    finally:
        for env in envs.values():
            env.close()
    for name, seconds in samples.items():
        row["sps"][name] = rate_summary(seconds, steps * n_envs)
    if "envpool" in row["sps"]:
        for name in row["sps"]:
            if name != "envpool":
                row[f"envpool_over_{name}"] = row["sps"]["envpool"]["median"] / row["sps"][name]["median"]
    return row


def table(rows: list, backends: list) -> str:
    headers = ["env", "n_envs", *[f"{b} steps/s" for b in backends],
               *[f"envpool / {b}" for b in backends if b != "envpool"]]
    body = [[r["env"], r["n_envs"], *[r["sps"][b]["median"] if b in r["sps"] else "skipped" for b in backends],
             *[f"{r[f'envpool_over_{b}']:.1f}x" if f"envpool_over_{b}" in r else "-"
               for b in backends if b != "envpool"]]
            for r in rows]
    return markdown_table(headers, body)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.envs_sps", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CartPole-v1 and LunarLander-v2 at 8 envs, short samples")
    parser.add_argument("--envs", nargs="+", default=None,
                        help="env ids (default CartPole-v1 Acrobot-v1 LunarLander-v2 HalfCheetah-v4)")
    parser.add_argument("--n-envs", type=int, nargs="+", default=None, help="batch sizes (default 8 32; quick 8)")
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--repeats", type=int, default=0, help="samples per contender (default 3 quick, 5 full)")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<machine>/envs_sps.json)")
    args = parser.parse_args(argv)
    envs = args.envs or (["CartPole-v1", "LunarLander-v2"] if args.quick else
                         ["CartPole-v1", "Acrobot-v1", "LunarLander-v2", "HalfCheetah-v4"])
    counts = args.n_envs or ([8] if args.quick else [8, 32])
    repeats = args.repeats or (3 if args.quick else 5)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*precision lowered.*")
    started = time.perf_counter()
    rows = []
    for env_id in envs:
        for n_envs in counts:
            steps = max(16, (2048 if args.quick else 8192) // n_envs)
            print(f"[envs_sps] {env_id} n_envs={n_envs}", file=sys.stderr, flush=True)
            rows.append(bench(env_id, n_envs, args.backends, steps, repeats))
    report = {"benchmark": "envs_sps", "machine": machine_info(), "quick": args.quick, "backends": args.backends,
              "versions": {p: package_version(p) for p in ("envpool", "gymnasium", "box2d", "mujoco")},
              "results": rows, "wall_time_s": time.perf_counter() - started}
    path = write_json(report, args.out or default_out("envs_sps"))
    print(table(rows, args.backends))
    for r in rows:
        for name, why in r["skipped"].items():
            print(f"- {r['env']} {name} skipped: {why}")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
