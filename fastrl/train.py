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

from fastrl.config import (CODE_KEYS, YAML_IGNORED, Config, UserError, brief, load_yaml, make_config,  # noqa: E402
                           parse_cli_overrides)

if TYPE_CHECKING:
    from fastrl import distributed

ACTOR_LEARNER_ALGOS = ("impala", "appo")

# What a resume keeps: the model and its inputs (architecture, env, observation/action spaces, normalizers, the
# optimizer's state) and the batch shape that the budget's iteration count is measured in.
RESUME_FIXED = ("algo", "env", "n_seeds", "vary", "hidden_sizes", "activation", "shared_trunk", "use_sde",
                "encoder", "normalize_obs", "normalize_reward", "frame_skip", "frame_stack", "optimizer", "n_envs",
                "n_steps", "per_rank")


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


def config_from_cli(argv: list[str] | None = None, prog: str = "fastrl train") -> tuple[Config, dict | None]:
    """Parse flags. With ``--resume`` the checkpoint's config is the base and only explicit flags override it."""
    overrides, yaml_path = parse_cli_overrides(argv, prog)
    return resolve_config(overrides, yaml_path, where="command-line flags")


def resolve_config(overrides: dict, yaml_path: str | None = None,
                   where: str = "command-line flags") -> tuple[Config, dict | None]:
    """Defaults < YAML < ``overrides``; with ``resume`` the checkpoint's config is the base instead of the defaults.
    Returns ``(config, checkpoint state or None)``.

    A resume is a continuation or a refusal: overrides that change what ``RESUME_FIXED`` lists, or a budget the
    checkpoint has already passed, are one-line UserErrors; the checkpoint's env is used only if it imports no code
    (else the user must name it: see ``checkpoint.checkpoint_config``)."""
    if not overrides.get("resume"):
        yaml_path, under, origin = base_layer(overrides, yaml_path, where)
        cfg = make_config({**under, **overrides}, yaml_path, where=where)
        cfg.origin = origin
        return cfg, None
    from fastrl.checkpoint import checkpoint_config, load_checkpoint
    from fastrl.config import _coerce as coerce_value
    target = overrides["resume"]
    state = load_checkpoint(target)
    given = dict(overrides)
    if yaml_path:
        given = {**{key: value for key, value in load_yaml(yaml_path).items()
                    if key.replace("-", "_") not in YAML_IGNORED}, **overrides}
    given = {key.replace("-", "_"): value for key, value in given.items()}
    # The checkpoint's code names (env, policy) are used only if the user names them too; what the user passed is an
    # override, judged below against the checkpoint's own.
    saved = checkpoint_config(state, f"checkpoint {target}", given).to_dict()
    saved.update({key: state["config"][key] for key in CODE_KEYS if key in state["config"]})
    changed = [key for key in RESUME_FIXED if key in given and coerce_value(key, given[key]) != saved[key]]
    if changed:
        diffs = ", ".join(f"{k} {brief(saved[k])} -> {brief(coerce_value(k, given[k]))}" for k in changed)
        raise UserError(f"--resume {target} would change {diffs}; a resume continues the same model, env and batch "
                        f"shape: drop those flags, or start a new run with them (--config <run>/config.yaml)")
    base = {**saved, "run_dir": ""}  # a moved or copied run continues where it now lies (see rundir.resume_run_dir)
    cfg = make_config({**base, **given}, where=where)
    done = int(state.get("global_step", 0))
    if "members" in state:  # a population's checkpoint counts the steps of all members; the budget is per member
        done //= max(len(state["members"]), 1)
    if cfg.total_steps < done:
        raise UserError(f"--resume {target}: its checkpoint is at step {done}, past total_steps={cfg.total_steps}; "
                        f"pass --total-steps above {done} to train on")
    return cfg, state


def base_layer(overrides: dict, yaml_path: str | None, where: str) -> tuple[str | None, dict, str]:
    """What lies under the user's flags, as ``(yaml_path, values, origin)``: a ``--config`` file as given; else the
    tuned config of the env (``TUNED_CONFIGS``) when one ships; else, for PPO on an env other than the embedded
    default's, the general default of its action kind (``GENERAL_DEFAULTS``; no observation normalization where the
    observations are not floats); else the algorithm's defaults. ``origin`` says which, for the run's first line."""
    from fastrl.config import FIELDS, GENERAL_DEFAULTS, TUNED_CONFIGS
    if yaml_path:
        return yaml_path, {}, f"config {yaml_path}"
    given = {key.replace("-", "_"): value for key, value in overrides.items()}
    if set(FIELDS) <= set(given):  # a whole config (fastrl.train(config=Config(...))): nothing lies under it
        return None, {}, "the given config"
    algo, env = str(given.get("algo", Config.algo)), str(given.get("env", Config.env))
    tuned = TUNED_CONFIGS.get("impala" if algo == "appo" else algo, {})
    name = tuned.get(env) or tuned.get(_env_kind(env, given))
    if name:
        origin = f"the tuned config {name}" + (" (the embedded default)" if name == "ppo/cartpole" else "")
        # The embedded default's n_minibatches stays a count, as Config() has always had it
        keep_size = algo == "ppo" and name != "ppo/cartpole"
        return name, _same_minibatch(load_yaml(name), given) if keep_size else {}, origin
    if algo != "ppo":
        return None, {}, f"the {algo} defaults (no tuned {algo} config for {env})"
    from fastrl.envs import probe_env
    # Only what the env is built from: the flags' other values are checked once, against the default they choose.
    env_keys = ("env", "env_backend", "frame_skip", "frame_stack", "noop_max", "episodic_life", "clip_atari_reward")
    _, dtype, action_spec = probe_env(make_config({k: v for k, v in given.items() if k in env_keys}, where=where))
    kind = action_spec.kind  # discrete (MultiDiscrete and MultiBinary included) or continuous
    under = {**GENERAL_DEFAULTS[kind], **_same_minibatch(GENERAL_DEFAULTS[kind], given)}
    if not dtype.is_floating_point:  # uint8 frames, Discrete observations: scaled or one-hot encoded in the model
        under["normalize_obs"] = False
    return None, under, f"the general PPO default for {kind} actions (CleanRL's settings; no tuned config ships for {env})"


def _same_minibatch(base: dict, given: dict) -> dict:
    """``n_minibatches`` that keeps ``base``'s minibatch size when the flags change its rollout shape (n_envs, n_steps)
    but not n_minibatches: the most minibatches of at least that size that divide the new batch (at least 1)."""
    if "n_minibatches" in given or not {"n_envs", "n_steps"} & set(given) or "n_minibatches" not in base:
        return {}
    from fastrl.config import _coerce as coerce_value
    shape = {key: coerce_value(key, given.get(key, base.get(key, getattr(Config, key)))) for key in ("n_envs", "n_steps")}
    minibatch = base.get("n_envs", Config.n_envs) * base.get("n_steps", Config.n_steps) // base["n_minibatches"]
    batch = shape["n_envs"] * shape["n_steps"]
    return {"n_minibatches": max(d for d in range(1, max(batch // max(minibatch, 1), 1) + 1) if batch % d == 0)}


def _env_kind(env: str, given: dict) -> str | None:
    """``atari`` or ``procgen`` for an EnvPool id of that kind (the env backend permitting), else None."""
    if ":" in env or given.get("env_backend") in ("gymnasium", "torch"):
        return None
    from fastrl.envs import is_atari, is_procgen
    return "atari" if is_atari(env) else "procgen" if is_procgen(env) else None


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
        end_startup_gc_pause()
        summary = run_loop(trainer, run_dir, dist_info, callbacks)
        finished = True
        return summary
    finally:
        if run_dir is not None:
            release_run_dir(run_dir, discard_unused=not finished)
        distributed.cleanup(finished)


# --------------------------------------------------------------------------- the command line's process
# Start-up (importing torch and EnvPool, building the trainer) makes about a million objects that live as long as the
# process, and no garbage: Python's full collections among them cost about 0.2 s there and free nothing, and the
# interpreter's last collection at exit walks them all again (about 0.3 s). So when this module's main is the process
# (``python -m fastrl.train``, ``fastrl train``), the collector pauses until the run loop starts, what exists then is
# frozen (``gc.freeze``: later full collections skip it), and everything is frozen again before the exit (where Triton's
# nanobind bindings are loaded, everything is unfrozen instead: ``settle_collection_for_exit``). Called from Python
# (tests, the API), main changes nothing about the caller's collector.
_STARTUP_GC = {"paused": False}


def _nanobind_loaded() -> bool:
    """Whether a nanobind extension is loaded (Triton's, which torchrl and parts of torch import). nanobind reports
    every object of its own still alive at exit as a leak, a screen of stderr, and frozen objects are never collected;
    its objects can also end up held by containers frozen before it loaded."""
    return "triton" in sys.modules


def settle_collection_for_exit() -> None:
    """Right before the process exits: freeze everything, so the interpreter's last collection skips it; where nanobind
    is loaded, unfreeze everything instead, so that collection frees its objects as it would have."""
    import gc
    if _nanobind_loaded():
        gc.unfreeze()
    else:
        gc.freeze()


def run_as_process(main_function, *args) -> int:
    """``main_function(*args)`` as the whole process's work: returns its exit status, the collector as above."""
    import gc
    if gc.isenabled():
        gc.disable()
        _STARTUP_GC["paused"] = True
    try:
        status = main_function(*args)
    finally:
        settle_collection_for_exit()
    if status in (130, 128 + signal.SIGTERM, 128 + signal.SIGHUP) and _STARTUP_INTERRUPT.get("cut_imports"):
        # A Ctrl-C that cut the start-up short can leave an extension half imported, whose teardown at interpreter
        # exit prints pages (nanobind's leak report for triton): the one line is out, and nothing was saved yet.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def end_startup_gc_pause() -> None:
    """The run loop starts: the collector runs again (if ``run_as_process`` paused it), over new objects only."""
    if _STARTUP_GC["paused"]:
        import gc
        _STARTUP_GC["paused"] = False
        gc.freeze()
        gc.enable()


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
