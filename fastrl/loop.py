"""The one run loop every algorithm flows through.

A trainer (``fastrl.trainer.Trainer`` for PPO/A2C, ``fastrl.actor_learner.ActorLearnerTrainer`` for IMPALA/APPO)
brings the algorithm; the loop brings everything else, once, for all of them::

    while not trainer.finished() and no stop signal:
        trainer.collect()                  # a rollout (PPO/A2C) or a batch of actor slots (IMPALA/APPO)
        metrics = trainer.update()         # gradient steps; non-finite ones skipped inside the optimizer step
        every log_interval: episode stats, logging, periodic evaluation, rollback guard, stop_at_return
        every checkpoint_interval: checkpoint (never from non-finite weights)
        callbacks(metrics, run), if any    # user code (fastrl.callbacks); a False ends the run as its budget would
    final checkpoint, final evaluation (also an eval/* row in every sink), videos (capture_video),
    summary.json (one schema), learning_curve.png (plot)

The trainer interface:
- ``cfg``, ``agent`` (the ``nn.Module`` that acts and is evaluated), ``global_step`` (env steps, all ranks),
  ``iteration`` (updates), ``total_steps`` (the budget), ``lr_scale``, ``should_stop`` (a callable the loop sets:
  True once a stop signal came; a trainer that waits polls it);
- ``finished()``; ``collect() -> bool`` (False: interrupted by a stop while waiting); ``update() -> dict`` of 0-d
  tensors, with ``losses/nonfinite_updates``; ``log_extras() -> dict`` (per-interval diagnostics);
  ``episode_summary() -> dict`` (last-100-episode figures: ``episode_return_mean``, ``episode_length_mean``,
  ``episode_window_full``, ``episodes``); ``normalizer_state()`` (for evaluation envs, or None);
  ``state_dict()`` / ``load_state_dict()``; ``weights_state()`` / ``roll_back(state, lr_factor)``;
  ``summary_extras() -> dict``; ``close()`` (idempotent).

A population (``fastrl.population.PopulationTrainer``, ``--n-seeds``/``--vary``) adds: ``member_rows(elapsed_s)``
(one metrics row per member, logged after the run's row; its per-member rollback guards run there, so
``member_guards`` turns the run-level guard off), ``evaluate_members()`` (the evaluation figures become member
means), ``population_summary()`` (summary.json's ``members`` and aggregates); its ``episode_summary()`` carries
``episode_return_min``, which ``stop_at_return`` waits on.
"""
from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch

from fastrl import distributed
from fastrl.callbacks import RunContext, run_callbacks
from fastrl.checkpoint import checkpoint_path, save_checkpoint
from fastrl.evaluate import EvaluationStopped, describe, evaluate, record_videos
from fastrl.guards import RollbackGuard, all_finite
from fastrl.logger import NullLogger, RunLogger
from fastrl.plot import write_run_plot
from fastrl.rundir import restart_count, write_config


def process_seconds() -> float | None:
    """Seconds since this process started (imports and start-up included), from /proc; None elsewhere."""
    try:
        start_ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        uptime_s = float(open("/proc/uptime").read().split()[0])
        return uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def install_stop_handlers(flag: dict) -> dict:
    """SIGINT/SIGTERM set ``flag["stop"]``: the run ends after the current iteration. Returns the previous handlers."""
    def handler(signum, _frame):
        flag["stop"] = signum
    if threading.current_thread() is not threading.main_thread():
        return {}  # Python sets handlers only in the main thread (e.g. fastrl.train called from a worker thread)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in previous:
        signal.signal(sig, handler)
    return previous


def save_if_finite(trainer, run_dir: Path) -> bool:
    """Write a checkpoint, unless the weights hold a NaN/Inf: a poisoned checkpoint is never written."""
    if not all_finite(trainer.agent):
        print(f"fastrl: skipped the checkpoint at step {trainer.global_step}: the weights are not finite",
              file=sys.stderr)
        return False
    save_checkpoint(trainer.state_dict(), checkpoint_path(run_dir, trainer.global_step), trainer.cfg.keep_checkpoints)
    return True


def evaluate_trainer(trainer, normalizer_state=None, **evaluate_kwargs) -> dict:
    """Evaluation on separate envs: ``eval_seeds`` x ``eval_episodes`` episodes (``evaluate_kwargs``: a stop check
    and a progress label, see ``fastrl.evaluate.evaluate``)."""
    cfg = trainer.cfg
    state = trainer.normalizer_state() if normalizer_state is None else normalizer_state
    if hasattr(trainer, "evaluate_members"):  # a population: each member on its own seeds; the figures are means
        per_member = trainer.evaluate_members(state, **evaluate_kwargs)
        return {"eval/return_mean": sum(m for m, _ in per_member) / len(per_member),
                "eval/return_std": sum(s for _, s in per_member) / len(per_member),
                "eval/return_min": min(m for m, _ in per_member)}
    returns = evaluate(trainer.agent, cfg, state, cfg.eval_episodes, cfg.eval_seeds, trainer.device, **evaluate_kwargs)
    return {"eval/return_mean": returns.mean().item(), "eval/return_std": returns.std(unbiased=False).item()}


def final_evaluation(trainer, normalizer_state, should_stop) -> dict | None:
    """The end-of-run evaluation, announced in one line and reporting progress while it runs; None when a stop
    signal ended it (within one env step)."""
    cfg = trainer.cfg
    label = None if cfg.quiet else "final evaluation"
    if label:
        print(f"fastrl: {label}: {describe(cfg, cfg.eval_episodes, cfg.eval_seeds)}", file=sys.stderr, flush=True)
    try:
        return evaluate_trainer(trainer, normalizer_state, should_stop=should_stop, label=label)
    except EvaluationStopped:
        print("fastrl: final evaluation stopped by a signal; summary.json records no evaluation", file=sys.stderr,
              flush=True)
        return None


def _plain(metrics: dict) -> dict:
    return {k: (v.item() if torch.is_tensor(v) else v) for k, v in metrics.items()}


# One logged name per figure, as CleanRL names them; the trainer's episode_summary() keys stay the summary's.
EPISODE_METRICS = {"episode_return_mean": "charts/episodic_return", "episode_length_mean": "charts/episodic_length",
                   "episodes": "charts/episodes", "episode_window_full": "charts/episode_window_full"}


def episode_metrics(recent: dict) -> dict:
    """``episode_summary()`` under its logged names (``charts/episodic_return``, ...)."""
    return {EPISODE_METRICS.get(key, f"charts/{key}"): value for key, value in recent.items()}


def run_loop(trainer, run_dir: Path, dist_info: distributed.DistInfo, callbacks=()) -> dict:
    """Train to the end of the budget, a stop signal, ``stop_at_return`` or a callback's False; write the run's files;
    return the summary. ``callbacks``: called after every iteration, see ``fastrl.callbacks``."""
    cfg = trainer.cfg
    logger = NullLogger()
    if dist_info.is_main:
        write_config(run_dir, cfg)
        logger = RunLogger(run_dir, cfg.to_dict(), trainer.total_steps, trainer.global_step, cfg.tensorboard, cfg.wandb,
                           cfg.wandb_project, cfg.progress)
    guard = RollbackGuard(cfg.rollback, cfg.rollback_drop, cfg.rollback_lr_factor, cfg.max_rollbacks,
                          cfg.rollback_patience, cfg.max_nonfinite_iterations)
    threshold = None  # (steps, seconds) when stop_at_return was reached
    stop = {"stop": None}
    previous_handlers = install_stop_handlers(stop)
    trainer.should_stop = lambda: stop["stop"] is not None
    start_time = time.perf_counter()
    start_step = trainer.global_step
    last_log_time, last_log_step = start_time, trainer.global_step
    run_context, stopped_by_callback = RunContext(trainer, run_dir, logger, dist_info.is_main, start_step), False
    try:
        while not trainer.finished() and stop["stop"] is None:
            if not trainer.collect():
                break
            metrics = trainer.update()
            if trainer.iteration % cfg.log_interval == 0 or trainer.finished():
                now = time.perf_counter()
                recent = trainer.episode_summary()
                sps = (trainer.global_step - last_log_step) / max(now - last_log_time, 1e-9)
                last_log_time, last_log_step = now, trainer.global_step
                record = {"charts/SPS": sps, "time/elapsed_s": now - start_time, **episode_metrics(recent),
                          **_plain(metrics), **trainer.log_extras()}
                if cfg.eval_interval and cfg.eval_episodes and trainer.iteration % cfg.eval_interval == 0:
                    # Rank 0 evaluates; every rank judges the same figure, so all roll back together.
                    record.update(distributed.broadcast_object(evaluate_trainer(trainer) if dist_info.is_main else {}))
                    judged, window_full = record["eval/return_mean"], True
                else:
                    judged, window_full = recent.get("episode_return_mean"), recent.get("episode_window_full", False)
                reason = None if getattr(trainer, "member_guards", False) else guard.observe(
                    judged, window_full, record.get("losses/nonfinite_updates", 0.0), trainer.weights_state,
                    trainer.global_step)
                if reason is not None:
                    trainer.roll_back(guard.best_state, cfg.rollback_lr_factor)
                    record.update({"events/rollback": guard.rollbacks, "events/rollback_reason": reason,
                                   "events/rollback_to_step": guard.best_step, "charts/lr_scale": trainer.lr_scale})
                    print(f"fastrl: rollback {guard.rollbacks}/{cfg.max_rollbacks} ({reason}) to the weights of step "
                          f"{guard.best_step}; lr scale now {trainer.lr_scale:g}", file=sys.stderr)
                logger.log(record, trainer.global_step)
                if hasattr(trainer, "member_rows"):  # a population: one row per member, each with "member"
                    for row in trainer.member_rows(now - start_time):
                        logger.log(row, trainer.global_step)
                logger.progress(trainer.global_step, {"sps": int(sps),
                                                      "return": recent.get("episode_return_mean", float("nan"))})
                # A population stops once every member is there (episode_return_min), a single run at its mean.
                reached = recent.get("episode_return_min", recent.get("episode_return_mean", -math.inf))
                if cfg.stop_at_return and reached >= cfg.stop_at_return:
                    threshold = (trainer.global_step, time.perf_counter() - start_time)
                    break
            if dist_info.is_main and cfg.checkpoint_interval and trainer.iteration % cfg.checkpoint_interval == 0:
                save_if_finite(trainer, run_dir)
            if callbacks and not run_callbacks(callbacks, {**_plain(metrics), **episode_metrics(trainer.episode_summary())},
                                                run_context):
                stopped_by_callback = True
                break
        wall_time = time.perf_counter() - start_time
        final_episodes = trainer.episode_summary()
        summary = {"algo": cfg.algo, "env": cfg.env, "seed": cfg.seed,
                   "total_steps": trainer.global_step, "wall_time_s": wall_time,
                   "sps": (trainer.global_step - start_step) / max(wall_time, 1e-9),
                   "episode_return_mean": final_episodes.get("episode_return_mean"),
                   "episodes": final_episodes.get("episodes", 0),
                   "iterations": trainer.iteration, "stopped_by_signal": stop["stop"] is not None,
                   "stopped_by_callback": stopped_by_callback,
                   "resumed_from_step": start_step, "rollbacks": guard.rollbacks,
                   "reached_return": threshold is not None,
                   "steps_to_return": threshold[0] if threshold else None,
                   "time_to_return_s": threshold[1] if threshold else None,
                   "restart_count": restart_count(), "process_time_s": process_seconds()}
        if dist_info.is_main:
            save_if_finite(trainer, run_dir)
        normalizer = trainer.normalizer_state()
        summary.update(trainer.summary_extras())
        trainer.close()  # IMPALA's actors stop here, so the evaluation has the cores to itself
        summary["eval_return_mean"] = summary["eval_return_std"] = None
        final_eval = None
        if dist_info.is_main:
            if cfg.eval_episodes and stop["stop"] is None:
                final_eval = final_evaluation(trainer, normalizer, lambda: stop["stop"] is not None)
                summary["stopped_by_signal"] = stop["stop"] is not None
            if final_eval:
                summary["eval_return_mean"] = final_eval["eval/return_mean"]
                summary["eval_return_std"] = final_eval["eval/return_std"]
                logger.log(final_eval, trainer.global_step)  # the final evaluation reaches every sink too
                for m, (mean, std) in enumerate(getattr(trainer, "member_eval", ())):
                    logger.log({"member": m, "eval/return_mean": mean, "eval/return_std": std}, trainer.global_step)
            if cfg.capture_video and stop["stop"] is None:
                record_videos(trainer.agent, cfg, normalizer, run_dir / "videos", trainer.device)
            summary["run_dir"] = str(run_dir)
        if hasattr(trainer, "population_summary"):
            summary.update(trainer.population_summary())
        hashes = distributed.gather_objects(distributed.parameter_hash(trainer.agent))
        if dist_info.is_main:
            summary["world_size"] = dist_info.world_size
            summary["param_hashes"] = hashes
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
            if cfg.plot:
                write_run_plot(run_dir)  # never fails the run: a missing matplotlib is one warning line
        return summary
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        logger.close()
        trainer.close()
