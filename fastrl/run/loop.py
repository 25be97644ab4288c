"""The one run loop every algorithm flows through.

A trainer (``fastrl.run.trainer.Trainer`` for PPO/A2C, ``fastrl.run.actor_learner.ActorLearnerTrainer`` for IMPALA/APPO)
brings the algorithm; the loop brings everything else, once, for all of them::

    while not trainer.finished() and no stop signal:
        trainer.collect()                  # a rollout (PPO/A2C) or a batch of actor slots (IMPALA/APPO)
        metrics = trainer.update()         # gradient steps; non-finite ones skipped inside the optimizer step
        every log_interval: episode stats, logging, periodic evaluation, rollback guard, stop_at_return
        every checkpoint_interval: checkpoint (never from non-finite weights)
        callbacks(metrics, run), if any    # user code (fastrl.run.callbacks); a False ends the run as its budget would
    final checkpoint, final evaluation (also an eval/* row in every sink), videos (capture_video),
    summary.json (one schema), learning_curve.png (plot)

Each row of a log interval carries the process's ``perf/*`` figures (``fastrl.run.resources``): CPU, memory, GPU
and the shares of the interval's wall time; summary.json their run means (memory: its peak).

The trainer interface:
- ``cfg``, ``agent`` (the ``nn.Module`` that acts and is evaluated), ``global_step`` (env steps, all ranks),
  ``iteration`` (updates), ``total_steps`` (the budget), ``lr_scale``, ``should_stop`` (a callable the loop sets:
  True once a stop signal came; a trainer that waits polls it);
- ``finished()``; ``collect() -> bool`` (False: interrupted by a stop while waiting); ``update() -> dict`` of 0-d
  tensors, with ``losses/nonfinite_updates``; ``log_extras() -> dict`` (per-interval diagnostics);
  ``episode_summary() -> dict`` (last-100-episode figures: ``episode_return_mean``, ``episode_length_mean``,
  ``episode_window_full``, ``episodes``); ``normalizer_state()`` (for evaluation envs);
  ``state_dict()`` / ``load_state_dict()``; ``weights_state()`` / ``roll_back(state, lr_factor)``;
  ``summary_extras() -> dict``; ``close()`` (idempotent).

Members: a trainer trains ``n_members`` agents (``members``: their configs; K = 1 for a single run, K > 1 for a
population, ``--n-seeds``/``--vary``), and the loop treats every run alike: one rollback guard, one evaluation and
one ``stop_at_return`` record per member, ``member_rows()`` (one metrics row per member, empty at K = 1, where the
run row is the member's), ``member_agent(m)``, ``member_info(m)``, ``member_episode_summary(m)``,
``normalizer_state(m)``, ``weights_state(m)`` / ``roll_back(state, lr_factor, m)``, ``weights_finite()``.
``fastrl.run.members.MemberState`` gives a trainer these from its per-member tensors. ``stop_at_return`` waits for
every member, each judged as its rollback guard is: on the periodic evaluation at a log step where one ran, else on
its last-100-episode mean.
"""
from __future__ import annotations

import math
import os
import signal
import sys
import time
from pathlib import Path

import torch

from fastrl.config import UserError
from fastrl.distributed import torchrun
from fastrl.envs.env_workers import EnvError
from fastrl.errors import print_line
from fastrl.run.callbacks import CallbackError, RunContext, run_callbacks
from fastrl.run.checkpoint import checkpoint_path, save_checkpoint
from fastrl.run.evaluate import EvaluationStopped, describe, evaluate, record_videos
from fastrl.run.guards import RollbackGuard
from fastrl.run.logger import POPULATION_KEYS, NullLogger, RunLogger
from fastrl.run.resources import ResourceMonitor
from fastrl.run.rundir import restart_count, write_config
from fastrl.run.runfiles import RunFiles
from fastrl.run.storage import strict_json
from fastrl.signals import StopWhileWaiting, install_stop_handlers, restore_handlers, stop_ends_env_waits


def process_seconds() -> float | None:
    """Seconds since this process started (imports and start-up included), from /proc; None elsewhere."""
    try:
        start_ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        uptime_s = float(open("/proc/uptime").read().split()[0])
        return uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def save_if_finite(trainer, run_dir: Path, files: RunFiles) -> bool:
    """Write a checkpoint, unless the weights hold a NaN/Inf: a poisoned checkpoint is never written. ``files``: the
    run directory's record, which lists it before it is written (a kill mid-write leaves it recorded) and after."""
    if not trainer.weights_finite():
        print_line(f"fastrl: skipped the checkpoint at step {trainer.global_step}: the weights are not finite")
        return False
    path = checkpoint_path(run_dir, trainer.global_step)
    relative = str(path.relative_to(run_dir))
    files.add(relative, hashed=False)
    save_checkpoint(trainer.state_dict(), path, trainer.cfg.keep_checkpoints)
    files.add(relative)
    files.sync()  # the pruned checkpoints leave the record, the sinks' new files join it
    return True


def evaluate_members(trainer, normalizer_states: list | None = None, **evaluate_kwargs) -> list[tuple[float, float]]:
    """Each member's evaluation on separate envs (``eval_seeds`` x ``eval_episodes`` episodes, the seeds of its single
    run): ``[(mean, std)]``. ``evaluate_kwargs``: a stop check and a progress label, see ``fastrl.run.evaluate.evaluate``."""
    states = normalizer_states or [trainer.normalizer_state(m) for m in range(trainer.n_members)]
    returns = [evaluate(trainer.member_agent(m), member, states[m], member.eval_episodes, member.eval_seeds,
                        trainer.device, **evaluate_kwargs) for m, member in enumerate(trainer.members)]
    return [(r.mean().item(), r.std(unbiased=False).item()) for r in returns]


def evaluation_figures(per_member: list) -> dict:
    """The run's evaluation figures: the members' means (a single run: its own), and the lowest member's."""
    out = {"eval/return_mean": sum(m for m, _ in per_member) / len(per_member),
           "eval/return_std": sum(s for _, s in per_member) / len(per_member)}
    if len(per_member) > 1:
        out["eval/return_min"] = min(m for m, _ in per_member)
    return out


def members_summary(trainer, member_eval: list | None, reached: list) -> dict:
    """summary.json's ``n_members``, ``members`` and the aggregates of the members' final figures (mean, median, std,
    IQM with a bootstrap 95% interval): for the last-100 training return and the final evaluation. Members of more
    than one variant: ``variants`` holds them per variant, over its seeds, and nothing is aggregated across
    variants."""
    from fastrl.run.population import variant_summaries
    members = [{**trainer.member_info(m),
                "episode_return_mean": trainer.member_episode_summary(m).get("episode_return_mean"),
                "eval_return_mean": member_eval[m][0] if member_eval else None,
                "steps_to_return": reached[m][0] if reached[m] else None,
                "time_to_return_s": reached[m][1] if reached[m] else None} for m in range(trainer.n_members)]
    out = {"n_members": trainer.n_members, "members": members}
    variants = variant_summaries(members, seed=trainer.cfg.seed)
    if len(variants) > 1:
        return {**out, "variants": variants}
    return {**out, **{f"members_{key}": value for key, value in variants[0].items() if key.endswith("return_mean")}}


def member_labels(trainer, m: int) -> dict:
    """What names member m's row in metrics.jsonl and its TensorBoard run: ``member``, ``seed``, ``variant``,
    ``member_step``."""
    from fastrl.run.population import variant_name
    info = trainer.member_info(m)
    return {"member": m, "seed": info["seed"], "variant": variant_name(info["hyperparameters"]),
            "member_step": trainer.global_step // trainer.n_members}


def final_evaluation(trainer, normalizer_states: list, should_stop) -> list | None:
    """The end-of-run evaluation of every member, announced in one line and reporting progress while it runs:
    ``[(mean, std)]`` per member, or None when a stop signal ended it (within one env step)."""
    cfg = trainer.cfg
    label = None if cfg.quiet else "final evaluation"
    if label:
        members = f"{trainer.n_members} members x " if trainer.n_members > 1 else ""
        print_line(f"fastrl: {label}: {members}{describe(cfg, cfg.eval_episodes, cfg.eval_seeds)}")
    try:
        with stop_ends_env_waits():
            return evaluate_members(trainer, normalizer_states, should_stop=should_stop, label=label)
    except (EvaluationStopped, StopWhileWaiting):
        print_line("fastrl: final evaluation stopped by a signal; summary.json records no evaluation")
        return None


def _plain(metrics: dict) -> dict:
    return {k: (v.item() if torch.is_tensor(v) else v) for k, v in metrics.items()}


# One logged name per figure, as CleanRL names them; the trainer's episode_summary() keys stay the summary's.
# charts/episodic_return is the mean return of the last 100 episodes; charts/episodic_return_last is one episode's own
# return, the last to end before the row: the figure CleanRL logs as charts/episodic_return, for every episode.
EPISODE_METRICS = {"episode_return_mean": "charts/episodic_return", "episode_length_mean": "charts/episodic_length",
                   "episodes": "charts/episodes", "episode_window_full": "charts/episode_window_full",
                   "episode_return_last": "charts/episodic_return_last"}


def episode_metrics(recent: dict) -> dict:
    """``episode_summary()`` under its logged names (``charts/episodic_return``, ...)."""
    return {EPISODE_METRICS.get(key, f"charts/{key}"): value for key, value in recent.items()}


def progress_returns(recent: dict, rows: list) -> dict:
    """The progress line's return figures: the recent mean (over the members of a seeds-only population), or, when
    the members run different ``--vary`` variants, each variant's mean over its seeds (the best and the worst
    variant when there are more than three), never one mean across variants."""
    by_variant: dict = {}
    for row in rows:  # member rows, under the logged names (episode_metrics)
        by_variant.setdefault(row.get("variant", ""), []).append(row.get(EPISODE_METRICS["episode_return_mean"]))
    if len(by_variant) <= 1:
        return {"return": recent.get("episode_return_mean", float("nan"))}
    means = {name: (sum(v) / len(v) if v and None not in v else float("nan")) for name, v in by_variant.items()}
    if len(means) <= 3:
        return {f"return[{name}]": value for name, value in means.items()}
    ranked = sorted((v, name) for name, v in means.items() if not math.isnan(v))
    if not ranked:
        return {"return": float("nan"), "variants": len(means)}
    (low, worst), (high, best) = ranked[0], ranked[-1]
    return {f"best[{best}]": high, f"worst[{worst}]": low, "variants": len(means)}


def run_loop(trainer, run_dir: Path, dist_info: torchrun.DistInfo, callbacks=(), agent_type=None) -> dict:
    """Train to the end of the budget, a stop signal, ``stop_at_return`` or a callback's False; write the run's files;
    return the summary. ``callbacks``: called after every iteration, see ``fastrl.run.callbacks``; ``agent_type``: what
    they see as ``run.agent`` (``fastrl.api.Agent``)."""
    cfg, n_members = trainer.cfg, trainer.n_members
    logger, files = NullLogger(), None
    if dist_info.is_main:
        files = RunFiles(run_dir)
        write_config(run_dir, cfg)
        files.add("config.yaml")
        if cfg.vary or n_members > 1:
            import yaml
            from fastrl.run.population import members_record  # each member's index, seed and variant values
            record = members_record([trainer.member_info(m) for m in range(n_members)])
            (run_dir / "members.yaml").write_text("# member m ran config.yaml with these values (n_seeds 1, no vary)\n"
                                                  + yaml.safe_dump(record, sort_keys=False))
            files.add("members.yaml")
        files.add("metrics.jsonl", hashed=False)
        logger = RunLogger(run_dir, cfg.to_dict(), trainer.total_steps, trainer.global_step, cfg.tensorboard, cfg.wandb,
                           cfg.wandb_project, cfg.progress, n_members=n_members, sink_process=True, plot=cfg.plot)
    guards = [RollbackGuard(m.rollback, m.rollback_drop, m.rollback_lr_factor, m.max_rollbacks, m.rollback_patience,
                            m.max_nonfinite_iterations) for m in trainer.members]
    # Members of different --vary variants: the run's own rows hold no mean across them (the members' rows do).
    several_variants = len({member_labels(trainer, m)["variant"] for m in range(n_members)}) > 1
    threshold = None  # (steps, seconds) when stop_at_return was reached (by every member)
    reached = [None] * n_members  # (member steps, seconds) when each member's last-100 mean first reached it
    stop = {"stop": None}
    previous_handlers = install_stop_handlers(stop)
    trainer.should_stop = lambda: stop["stop"] is not None
    monitor = ResourceMonitor(trainer.device, quiet=cfg.quiet or not dist_info.is_main)
    start_time = monitor.last_wall
    start_step = trainer.global_step
    last_log_time, last_log_step = start_time, trainer.global_step
    run_context = RunContext(trainer, run_dir, logger, dist_info.is_main, start_step, agent_type)
    stopped_by_callback = False
    # Raised once the summary is written: the user's env raised (EnvError: the run stops as a stop signal stops it),
    # or a callback has the wrong signature (CallbackError: the run ends as a callback's False ends it).
    error = None
    try:
        while not trainer.finished() and stop["stop"] is None:
            try:
                with stop_ends_env_waits():
                    if not trainer.collect():
                        break
            except EnvError as e:
                error = e
                break
            except StopWhileWaiting:  # a stop signal ended a wait on the env: the iteration in progress is dropped
                break
            metrics = trainer.update()
            if trainer.iteration % cfg.log_interval == 0 or trainer.finished():
                now = time.perf_counter()
                recent = trainer.episode_summary()
                sps = (trainer.global_step - last_log_step) / max(now - last_log_time, 1e-9)
                last_log_time, last_log_step = now, trainer.global_step
                record = {"charts/SPS": sps, "time/elapsed_s": now - start_time, **episode_metrics(recent),
                          **_plain(metrics), **trainer.log_extras()}
                record.update(monitor.sample(record, now))
                rows = trainer.member_rows()  # one per member at K > 1; the run row is the member's at K = 1
                member_eval = None
                if cfg.eval_interval and cfg.eval_episodes and trainer.iteration % cfg.eval_interval == 0:
                    # Rank 0 evaluates; every rank judges the same figures, so all roll back together.
                    member_eval = torchrun.broadcast_object(evaluate_members(trainer) if dist_info.is_main else None)
                    record.update(evaluation_figures(member_eval))
                judged_returns = []  # per member: what its guard and stop_at_return judge
                for m, guard in enumerate(guards):
                    member_recent = recent if n_members == 1 else trainer.member_episode_summary(m)
                    row = rows[m] if rows else record
                    if member_eval is not None:
                        row["eval/return_mean"], row["eval/return_std"] = member_eval[m]
                        judged, window_full = member_eval[m][0], True
                    else:
                        judged, window_full = (member_recent.get("episode_return_mean"),
                                               member_recent.get("episode_window_full", False))
                    reason = guard.observe(judged, window_full, row.get("losses/nonfinite_updates", 0.0),
                                           lambda m=m: trainer.weights_state(m), trainer.global_step)
                    if reason is not None:
                        trainer.roll_back(guard.best_state, trainer.members[m].rollback_lr_factor, m)
                        row.update({"events/rollback": guard.rollbacks, "events/rollback_reason": reason,
                                    "events/rollback_to_step": guard.best_step})
                        who = f"member {m} " if n_members > 1 else ""
                        print_line(f"fastrl: {who}rollback {guard.rollbacks}/{trainer.members[m].max_rollbacks} "
                                   f"({reason}) to the weights of step {guard.best_step}")
                    judged_returns.append(-math.inf if judged is None else judged)
                    if cfg.stop_at_return and reached[m] is None and judged_returns[m] >= cfg.stop_at_return:
                        reached[m] = (trainer.global_step // n_members, now - start_time)
                if several_variants:
                    record = {k: v for k, v in record.items() if k.startswith(POPULATION_KEYS)}
                logging_start = time.perf_counter()  # the next row's perf/share_logging
                logger.log(record, trainer.global_step)
                for row in rows:
                    logger.log({**row, "time/elapsed_s": now - start_time}, trainer.global_step)
                logger.progress(trainer.global_step, {"sps": int(sps), **progress_returns(recent, rows)})
                monitor.logging_s += time.perf_counter() - logging_start
                # A population stops once every member is there, a single run once it is.
                if cfg.stop_at_return and min(judged_returns) >= cfg.stop_at_return:
                    threshold = (trainer.global_step, time.perf_counter() - start_time)
                    if dist_info.is_main and not cfg.quiet:
                        who = "every member's" if n_members > 1 else "the"
                        what = "evaluation" if member_eval is not None else "last-100-episode mean"
                        print_line(f"fastrl: stopped at step {trainer.global_step:,}: {who} {what} return "
                                   f"reached {cfg.stop_at_return:g} (stop_at_return)")
                    break
            if dist_info.is_main and cfg.checkpoint_interval and trainer.iteration % cfg.checkpoint_interval == 0:
                save_if_finite(trainer, run_dir, files)
            try:
                go_on = not callbacks or run_callbacks(
                    callbacks, {**_plain(metrics), **episode_metrics(trainer.episode_summary())}, run_context)
            except CallbackError as e:  # raised after the summary, as an env's error is
                error, go_on = e, False
            if not go_on:
                stopped_by_callback = True
                break
        wall_time = time.perf_counter() - start_time
        final_episodes = trainer.episode_summary()
        summary = {"algo": cfg.algo, "env": cfg.env, "seed": cfg.seed,
                   "total_steps": trainer.global_step, "wall_time_s": wall_time,
                   "sps": (trainer.global_step - start_step) / max(wall_time, 1e-9),
                   "episode_return_mean": final_episodes.get("episode_return_mean"),
                   "episodes": final_episodes.get("episodes", 0),
                   "iterations": trainer.iteration,
                   "stopped_by_error": str(error) if error else None,
                   "stopped_by_callback": stopped_by_callback,
                   "resumed_from_step": start_step, "rollbacks": sum(guard.rollbacks for guard in guards),
                   "reached_return": threshold is not None,
                   "steps_to_return": threshold[0] if threshold else None,
                   "time_to_return_s": threshold[1] if threshold else None,
                   "restart_count": restart_count(), "process_time_s": process_seconds(), **monitor.summary()}
        if dist_info.is_main:
            save_if_finite(trainer, run_dir, files)
        normalizers = [trainer.normalizer_state(m) for m in range(n_members)]
        summary.update(trainer.summary_extras())
        trainer.close()  # IMPALA's actors stop here, so the evaluation has the cores to itself
        summary["eval_return_mean"] = summary["eval_return_std"] = None
        member_eval = None
        if dist_info.is_main:
            if cfg.eval_episodes and stop["stop"] is None and not isinstance(error, EnvError):
                member_eval = final_evaluation(trainer, normalizers, lambda: stop["stop"] is not None)
            if member_eval:
                final_eval = evaluation_figures(member_eval)
                summary.update(eval_return_mean=final_eval["eval/return_mean"],
                               eval_return_std=final_eval["eval/return_std"])
                if not several_variants:
                    logger.log(final_eval, trainer.global_step)  # the final evaluation reaches every sink too
                if n_members > 1:
                    for m, (mean, std) in enumerate(member_eval):
                        logger.log({**member_labels(trainer, m), "eval/return_mean": mean, "eval/return_std": std},
                                   trainer.global_step)
            logger.end_sinks()  # the last row: wandb's finish overlaps the videos, summary and plot
            if cfg.capture_video and stop["stop"] is None and not isinstance(error, EnvError):
                v = cfg.video_member
                record_videos(trainer.member_agent(v), trainer.members[v], normalizers[v], run_dir / "videos",
                              trainer.device)
            summary["run_dir"] = str(run_dir)
        summary["stopped_by_signal"] = stop["stop"] is not None  # a signal may have ended the final evaluation
        summary["stop_signal"] = signal.Signals(stop["stop"]).name if stop["stop"] else None
        summary.update(members_summary(trainer, member_eval, reached))
        if "variants" in summary:  # the members' means would mix variants: the figures are per variant
            summary["episode_return_mean"] = summary["eval_return_mean"] = summary["eval_return_std"] = None
        hashes = torchrun.gather_objects(torchrun.parameter_hash(trainer.agent))
        if dist_info.is_main:
            summary["world_size"] = dist_info.world_size
            summary["param_hashes"] = hashes
            (run_dir / "summary.json").write_text(strict_json(summary))
            if cfg.plot:
                logger.write_plot(run_dir)  # never fails the run: a missing matplotlib is one warning line
        if error is not None:
            raise error
        return summary
    finally:
        pending = sys.exc_info()[1]
        restore_handlers(previous_handlers)
        logger.close()
        if files is not None:  # the sinks are done: their files, the summary and the plot join the record
            try:
                files.add(*[name for name in ("summary.json", "learning_curve.png") if (run_dir / name).is_file()],
                          hashed=False)
                files.sync()
            except UserError:
                if pending is None:  # else the error that ended the run (a full disk, most likely) is the one to tell
                    raise
        trainer.close()
