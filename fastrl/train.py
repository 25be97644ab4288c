"""``python -m fastrl.train``: parse the config, check it, build the algorithm's trainer, run the one loop.

One file serves a single process and ``torchrun`` alike: ``distributed.setup`` reads RANK/WORLD_SIZE, rank 0
alone writes the run directory, and gradients are averaged across ranks once per minibatch.

The Python API's ``fastrl.train(env=..., **config_keys)`` is ``fastrl.api.train``, which runs ``run`` below; the
package keeps that function under the name ``fastrl.train`` when this module is imported (see ``fastrl/__init__.py``).
"""
from __future__ import annotations

import os
import signal
import sys


def _interrupted_while_importing(signum, _frame):
    """``python -m fastrl.train``: a Ctrl-C (SIGTERM, SIGHUP) among the imports, before ``main`` takes over, has
    nothing to save."""
    name = "interrupted (Ctrl-C)" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
    sys.stderr.write(f"fastrl: {name} during start-up; nothing was saved\n")
    sys.stderr.flush()
    os._exit(128 + signum)


if __name__ == "__main__":
    for _signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(_signum, _interrupted_while_importing)

import json  # noqa: E402
import threading  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

from fastrl.config import Config, UserError  # noqa: E402
from fastrl.run_config import config_from_cli  # noqa: E402

if TYPE_CHECKING:
    from fastrl import distributed

ACTOR_LEARNER_ALGOS = ("impala", "appo")

def __getattr__(name: str):
    """The public names of a trainer and its env seeds, ``Trainer`` and ``env_seed``, load torch on first use:
    the rest of this module imports it only inside functions, so ``--help`` answers without it."""
    if name == "Trainer":
        from fastrl import trainer
        return trainer.Trainer
    if name == "env_seed":
        from fastrl import seeding
        return seeding.env_seed
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _finished_summary(run_dir) -> bool:
    """Whether ``run_dir``'s summary.json describes a segment that ran its whole budget."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    stops = ("running", "stopped_by_signal", "stopped_by_error", "stopped_by_callback", "reached_return")
    return isinstance(summary, dict) and not any(summary.get(key) for key in stops)


def _load_resume_state(trainer, state: dict, run_dir) -> None:
    """Load a checkpoint into a freshly built trainer, or raise a one-line UserError when it cannot continue."""
    from fastrl.checkpoint import misfit
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


def make_trainer(cfg: Config, dist_info: distributed.DistInfo, device, members: list | None = None):
    if cfg.algo in ACTOR_LEARNER_ALGOS:
        from fastrl.actor_learner import ActorLearnerTrainer
        return ActorLearnerTrainer(cfg, device)
    from fastrl.trainer import Trainer
    return Trainer(cfg, dist_info, device, members=members)


def run(cfg: Config, resume_state: dict | None = None, callbacks=(), members: list | None = None) -> dict:
    """Train ``cfg`` to its end (or a stop signal, ``stop_at_return`` or a callback's False) and return the summary.
    ``members``: a population's member configs when they are not ``cfg``'s grid (``fastrl.tune``)."""
    from fastrl import distributed
    from fastrl.checkpoint import list_checkpoints, load_checkpoint
    from fastrl.console import adjustments, say
    from fastrl.loop import run_loop
    from fastrl.preflight import check_run
    from fastrl.rundir import agree_run_dir, mark_running, release_run_dir, remove_leftovers, restart_count, rewind_logs
    check_run(cfg)  # every combination of flags, env and device, before any work starts
    dist_info, device = distributed.setup(cfg.device)
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
        from fastrl._startup import end_collector_pause
        end_collector_pause()
        summary = run_loop(trainer, run_dir, dist_info, callbacks)
        finished = True
        return summary
    finally:
        if run_dir is not None:
            release_run_dir(run_dir, discard_unused=not finished)
        distributed.cleanup(finished)


# --------------------------------------------------------------------------- the command line's process
def run_as_process(main_function, *args) -> int:
    """``main_function(*args)`` as the whole process's work: returns its exit status (the collector paused for the
    start-up and settled for the exit: ``fastrl._startup``)."""
    from fastrl._startup import pause_collector, settle_collector_for_exit
    pause_collector()
    try:
        status = main_function(*args)
    finally:
        settle_collector_for_exit()
    if status in (130, 128 + signal.SIGTERM, 128 + signal.SIGHUP) and _STARTUP_INTERRUPT.get("cut_imports"):
        # A Ctrl-C that cut the start-up short can leave an extension half imported, whose teardown at interpreter
        # exit prints pages (nanobind's leak report for triton): the one line is out, and nothing was saved yet.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


# --------------------------------------------------------------------------- Ctrl-C on the command line
_STARTUP_INTERRUPT = {"signal": None}


def _where_an_interrupt_must_wait(frame) -> bool:
    """Whether a KeyboardInterrupt raised at ``frame`` would do harm, so the start-up handler defers it:
    - inside a gc callback (a library's, e.g. one JAX registers) or a ``__del__``, Python only prints it ("Exception
      ignored in ...") and drops it;
    - inside an import, the module's body may be running under an extension's C++ initializer that cannot pass an
      exception on: ``torch.distributed`` calls ``torch._C._c10d_init()``, and an interrupt raised there ends the
      process in ``std::terminate`` (SIGABRT, a page of C++ and Python frames) instead of exit 130."""
    import gc
    callbacks = {getattr(callback, "__code__", None) for callback in gc.callbacks}
    while frame is not None:
        code = frame.f_code
        if code in callbacks or code.co_name == "__del__" or code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


class Terminated(BaseException):
    """SIGTERM or SIGHUP during start-up: nothing to save yet; the command line exits ``128 + signum``."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _startup_interrupt(signum, frame):
    _STARTUP_INTERRUPT["signal"] = signum
    if _where_an_interrupt_must_wait(frame):
        # Deliver the signal again in 50 ms, and so on until out of there; then it raises.
        timer = threading.Timer(0.05, os.kill, (os.getpid(), signum))
        timer.daemon = True
        timer.start()
        return
    raise_if_interrupted()


def install_startup_interrupt() -> dict:
    """Until the run loop installs its own stop handlers (and again after it restores these), SIGINT raises
    KeyboardInterrupt as Python's default handler does (SIGTERM and SIGHUP: ``Terminated``), and also leaves a mark:
    an interrupt that some library swallows (e.g. raised inside a gc callback, where Python only prints it) still
    ends the run before training. Returns the previous handlers (none outside the main thread, where handlers
    cannot be set)."""
    _STARTUP_INTERRUPT["signal"] = None
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, _startup_interrupt) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}


def raise_if_interrupted() -> None:
    signum = _STARTUP_INTERRUPT["signal"]
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    if signum is not None:
        raise Terminated(signum)


def main(argv: list[str] | None = None, prog: str = "python -m fastrl.train") -> int:
    """The command line: 0 when the run ends (its budget, stop_at_return, SIGTERM), 2 with one line for a user
    error, 130 with one line for Ctrl-C at any moment (mid-run after the clean stop that saves the run)."""
    previous = {}
    try:
        previous = install_startup_interrupt()
        try:
            cfg, resume_state = config_from_cli(argv, prog=prog)
            summary = run(cfg, resume_state)
        except UserError as e:  # an env's failure (fastrl.envs.EnvError) carries the env's own traceback first
            print(getattr(e, "trace", "") + f"fastrl: error: {e}", file=sys.stderr)
            return 2
        where = f": {summary['run_dir']} is saved; continue it with --resume" if summary.get("run_dir") else ""
        if summary.get("stop_signal") == "SIGINT" or _STARTUP_INTERRUPT["signal"] == signal.SIGINT:
            print(f"fastrl: interrupted (Ctrl-C) at step {summary.get('total_steps', 0)}{where}", file=sys.stderr)
            return 130
        if summary.get("stop_signal"):
            print(f"fastrl: stopped by {summary['stop_signal']} at step {summary.get('total_steps', 0)}{where}",
                  file=sys.stderr)
    except Terminated as e:
        print(f"fastrl: stopped by {signal.Signals(e.signum).name} during start-up; nothing was saved",
              file=sys.stderr)
        _STARTUP_INTERRUPT["cut_imports"] = True
        return 128 + e.signum
    except KeyboardInterrupt:
        print("fastrl: interrupted (Ctrl-C)", file=sys.stderr)
        _STARTUP_INTERRUPT["cut_imports"] = True
        return 130
    except Exception:
        # A Ctrl-C that cut an import short (numpy's, inside a library that caught it) surfaces as another error.
        signum = _STARTUP_INTERRUPT["signal"]
        if signum is None:
            raise
        name = "interrupted (Ctrl-C)" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
        print(f"fastrl: {name} during start-up; nothing was saved", file=sys.stderr)
        _STARTUP_INTERRUPT["cut_imports"] = True
        return 128 + signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if summary.get("run_dir"):
        shown = {k: summary[k] for k in ("total_steps", "wall_time_s", "sps", "episode_return_mean", "eval_return_mean",
                                         "run_dir")}
        if "variants" in summary:  # per variant, over its seeds: never a mean across variants
            del shown["episode_return_mean"], shown["eval_return_mean"]
            shown["variants"] = {v["variant"]: {key: {s: v[key][s] for s in ("mean", "median", "iqm")}
                                                for key in ("episode_return_mean", "eval_return_mean") if key in v}
                                 for v in summary["variants"]}
        from fastrl.console import print_result
        from fastrl.storage import strict_json
        if not print_result(strict_json(shown, indent=None)):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_as_process(main))
