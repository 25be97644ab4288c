"""How fast is fastrl against rejax (JAX) at rejax's own config? The ``rejax`` part of ``python -m benchmarks.peers``.

``rejax``: rejax PPO with its own CartPole-v1 config (``REJAX_PPO_CARTPOLE``: 5 envs x 100 steps, 5 epochs, 5
minibatches, lr 7.5e-4, 1e5 steps), jitted end to end on the CPU (``pin_jax_to_cpu``; one XLA thread with --threads 1):
compile seconds, training steps/s (evaluation compiled out), and the env steps of its first evaluation (128 sampled
episodes every 1,000 steps) >= 475, whose training seconds are those steps / its steps/s. fastrl at the same config
(``fastrl_from_rejax`` states the mapping term by term and the three terms that differ) with ``RejaxEval``, a callback
that evaluates the same way and stops at the first mean >= 475; its evaluation seconds are left out of its training
seconds. Torch runs on ``--threads`` threads (1) on every side, recorded in the JSON.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import markdown_table
from benchmarks.peers_common import (COMPILE_LIBS, LIB_EXTRA, THRESHOLDS, fastrl_config, fastrl_curve, fmt,
                                     median_or_none, warm_compile_cache)


# rejax's own CartPole-v1 PPO config (configs/cartpole.yaml of github.com/keraJLi/rejax; rejax 0.1.3 ships no configs).
REJAX_SOURCE = "https://github.com/keraJLi/rejax/blob/0be4f63ec83b38bddad7bc3ead378b34e06c9721/configs/cartpole.yaml"


REJAX_PPO_CARTPOLE = dict(env="CartPole-v1", agent_kwargs=dict(activation="tanh"), num_envs=5, num_steps=100,
                          num_epochs=5, num_minibatches=5, learning_rate=0.00075, max_grad_norm=0.5,
                          total_timesteps=100_000, eval_freq=1000, gamma=0.99, gae_lambda=0.95, clip_eps=0.2,
                          ent_coef=0.01, vf_coef=0.5)


REJAX_EVAL_EPISODES = 128  # rejax's eval_callback: 128 episodes of the sampling policy, max_steps_in_episode each


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

    def evaluate(self, policy, device) -> float:
        from fastrl.envs.batched import make_env
        from fastrl.run.evaluate import play_first_episodes
        if self.env is None:
            self.env = make_env(self.cfg, n_envs=self.episodes, seed=self.cfg.seed + 1_000_003, training=False)
        with torch.no_grad():
            return play_first_episodes(policy, self.env, device, deterministic=False).mean().item()

    def __call__(self, metrics, run):
        if run.global_step < self.next_at:
            return True
        while self.next_at <= run.global_step:
            self.next_at += self.every
        start = time.perf_counter()
        mean = self.evaluate(run.policy, run.trainer.device)
        self.evals.append([run.global_step, mean, time.perf_counter() - start])
        return mean < self.threshold

    def close(self):
        if self.env is not None:
            self.env.close()


def run_fastrl_rejax(cfg, every: int, episodes: int, threshold: float) -> dict:
    """fastrl at rejax's config with ``RejaxEval``; training seconds leave the evaluations out."""
    from fastrl.run.session import run
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


def rejax_table(entry: dict) -> str:
    headers = ["lib", "compile s (median)", "steps/s (median)", "steps/s after 1st iteration", "steps/s / rejax's",
               "reached 475", "steps to 1st eval >= 475 (median)", "training s to it (median)"]
    rows = [[lib, fmt(s.get("compile_s_median"), ".1f") if lib == "rejax" else entry["compile"].get(lib, "-"),
             fmt(s["sps_median"]), fmt(s.get("sps_after_first_iteration_median")), fmt(s.get("sps_over_rejax"), ".2f"),
             f"{s['reached']}/{s['seeds']}", fmt(s["steps_to_threshold_median"]),
             fmt(s["time_to_threshold_s_median"], ".2f")] for lib, s in entry["summary"].items()]
    for lib, why in entry["skipped"].items():
        rows.append([lib, "skipped: " + why] + [""] * (len(headers) - 2))
    return markdown_table(headers, rows)
