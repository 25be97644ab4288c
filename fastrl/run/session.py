"""One run, whatever the door (``fastrl train``, ``fastrl.train()``, ``fastrl tune``): check the config, build the
algorithm's trainer, resume it, run the one loop (``fastrl.run.loop``).

One process serves a single run and ``torchrun`` alike: ``torchrun.setup`` reads RANK/WORLD_SIZE, rank 0 alone
writes the run directory, and gradients are averaged across ranks once per minibatch. Torch is imported inside
``run`` only, so the command line's ``--help`` answers without it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from fastrl.config import Config, UserError
from fastrl.defaults import ACTOR_LEARNER_ALGOS
from fastrl._startup import end_collector_pause
from fastrl.signals import raise_if_interrupted

if TYPE_CHECKING:
    from fastrl.distributed import torchrun


def _finished_summary(run_dir) -> bool:
    """Whether ``run_dir``'s summary.json describes a segment that ran its whole budget."""
    from fastrl.run.runfiles import read_record
    summary = read_record(run_dir / "summary.json")
    stops = ("running", "stopped_by_signal", "stopped_by_error", "stopped_by_callback", "reached_return")
    return bool(summary) and not any(summary.get(key) for key in stops)


def _load_resume_state(trainer, state: dict, run_dir) -> None:
    """Load a checkpoint into a freshly built trainer, or raise a one-line UserError when it cannot continue."""
    from fastrl.run.checkpoint import misfit
    try:
        trainer.load_state_dict(state)
    except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as e:
        raise UserError(f"the checkpoint of {run_dir} does not fit this run's model ({misfit(e).rstrip('.')}): the "
                        "architecture or the env's spaces differ; start a new run instead of resuming") from None
    if trainer.finished():
        if trainer.global_step < trainer.total_steps:
            raise UserError(f"the checkpoint of {run_dir} (step {trainer.global_step}) was taken with another batch "
                            "shape, so this resume would train nothing; start a new run instead")
        if _finished_summary(run_dir):
            # budgets round to iterations, and are per member
            at_least = (trainer.global_step + getattr(trainer, "steps_per_iteration", 1)) // trainer.n_members
            raise UserError(f"{run_dir} already trained its budget of {trainer.global_step} steps; pass --total-steps "
                            f"{at_least} or more to train on")


def make_trainer(cfg: Config, dist_info: torchrun.DistInfo, device, members: list | None = None):
    if cfg.algo in ACTOR_LEARNER_ALGOS:
        from fastrl.run.actor_learner import ActorLearnerTrainer
        return ActorLearnerTrainer(cfg, device)
    from fastrl.run.trainer import Trainer
    return Trainer(cfg, dist_info, device, members=members)


def run(cfg: Config, resume_state: dict | None = None, callbacks=(), members: list | None = None,
        agent_type=None) -> dict:
    """Train ``cfg`` to its end (or a stop signal, ``stop_at_return`` or a callback's False) and return the summary.
    ``members``: a population's member configs when they are not ``cfg``'s grid (``fastrl tune``); ``agent_type``:
    what ``callbacks`` see as ``run.agent`` (``fastrl.api.Agent``, passed in by the API on top)."""
    from fastrl.distributed import torchrun
    from fastrl.run.checkpoint import list_checkpoints, load_checkpoint
    from fastrl.run.console import adjustments, say
    from fastrl.run.loop import run_loop
    from fastrl.run.preflight import check_run
    from fastrl.run.rundir import (agree_run_dir, mark_running, release_run_dir, remove_leftovers, restart_count,
                                   rewind_logs)
    check_run(cfg)  # every combination of flags, env and device, before any work starts
    dist_info, device = torchrun.setup(cfg.device)
    finished, run_dir = False, None
    try:
        run_dir = agree_run_dir(cfg, dist_info)  # rank 0 holds the run directory's lock from here to the end
        if dist_info.is_main:
            remove_leftovers(run_dir)
        if resume_state is None and restart_count() > 0 and list_checkpoints(run_dir / "checkpoints"):
            resume_state = load_checkpoint(run_dir)  # a torchrun restart reloads the run's newest checkpoint
        if dist_info.is_main:
            if cfg.origin:
                say(cfg, f"{cfg.algo} on {cfg.env} with {cfg.origin}; flags override it")
            say(cfg, f"run directory {run_dir}")
        trainer = make_trainer(cfg, dist_info, device, members)
        if dist_info.is_main:
            for note in adjustments(cfg, trainer):
                say(cfg, f"note: {note}")
        if resume_state is not None:
            _load_resume_state(trainer, resume_state, run_dir)
            if dist_info.is_main:
                rewind_logs(run_dir, trainer.global_step, drop_final_eval=trainer.finished())
                mark_running(run_dir, trainer.global_step)
        raise_if_interrupted()  # a Ctrl-C that a library swallowed during start-up still ends the run here
        end_collector_pause()
        summary = run_loop(trainer, run_dir, dist_info, callbacks, agent_type)
        finished = True
        return summary
    finally:
        if run_dir is not None:
            release_run_dir(run_dir, discard_unused=not finished)
        torchrun.cleanup(finished)
