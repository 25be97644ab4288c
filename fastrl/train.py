"""``python -m fastrl.train``: parse the config, check it, build the algorithm's trainer, run the one loop.

One file serves a single process and ``torchrun`` alike: ``distributed.setup`` reads RANK/WORLD_SIZE, rank 0
alone writes the run directory, and gradients are averaged across ranks once per minibatch.

Called, this module is the Python API: ``fastrl.train(env=..., **overrides)`` is ``fastrl.api.train`` (the name
``fastrl.train`` is both this module and that function; see ``_CallableModule``).
"""
from __future__ import annotations

import json
import sys
import types
from typing import TYPE_CHECKING

from fastrl.config import YAML_IGNORED, Config, UserError, load_yaml, make_config, parse_cli_overrides

if TYPE_CHECKING:
    from fastrl import distributed

ACTOR_LEARNER_ALGOS = ("impala", "appo")


def __getattr__(name: str):
    """The public names of a trainer and its env seeds, ``Trainer`` and ``env_seed``, load torch on first use:
    the rest of this module imports it only inside functions, so ``--help`` answers without it."""
    if name in ("Trainer", "env_seed"):
        from fastrl import trainer
        return getattr(trainer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def config_from_cli(argv: list[str] | None = None, prog: str = "fastrl train") -> tuple[Config, dict | None]:
    """Parse flags. With ``--resume`` the checkpoint's config is the base and only explicit flags override it."""
    overrides, yaml_path = parse_cli_overrides(argv, prog)
    return resolve_config(overrides, yaml_path, where="command-line flags")


def resolve_config(overrides: dict, yaml_path: str | None = None,
                   where: str = "command-line flags") -> tuple[Config, dict | None]:
    """Defaults < YAML < ``overrides``; with ``resume`` the checkpoint's config is the base instead of the defaults.
    Returns ``(config, checkpoint state or None)``."""
    if not overrides.get("resume"):
        return make_config(overrides, yaml_path, where=where), None
    from fastrl.checkpoint import load_checkpoint
    state = load_checkpoint(overrides["resume"])
    base = make_config(state["config"], where=f"checkpoint {overrides['resume']}").to_dict()
    base["run_dir"] = ""  # a moved or copied run continues where it now lies (see rundir.resume_run_dir)
    if yaml_path:
        base.update({key.replace("-", "_"): value for key, value in load_yaml(yaml_path).items()
                     if key.replace("-", "_") not in YAML_IGNORED})
    return make_config({**base, **overrides}, where=where), state


def make_trainer(cfg: Config, dist_info: distributed.DistInfo, device):
    if cfg.algo in ACTOR_LEARNER_ALGOS:
        from fastrl.actor_learner import ActorLearnerTrainer
        return ActorLearnerTrainer(cfg, device)
    if cfg.population_size > 1:
        from fastrl.population import PopulationTrainer
        return PopulationTrainer(cfg, dist_info, device)
    from fastrl.trainer import Trainer
    return Trainer(cfg, dist_info, device)


def run(cfg: Config, resume_state: dict | None = None, callbacks=()) -> dict:
    """Train ``cfg`` to its end (or a stop signal, ``stop_at_return`` or a callback's False) and return the summary."""
    from fastrl import distributed
    from fastrl.checkpoint import list_checkpoints, load_checkpoint
    from fastrl.console import adjustments, say
    from fastrl.loop import run_loop
    from fastrl.preflight import check_run
    from fastrl.rundir import agree_run_dir, restart_count, rewind_logs
    check_run(cfg)  # every combination of flags, env and device, before any work starts
    dist_info, device = distributed.setup(cfg.device)
    finished = False
    try:
        run_dir = agree_run_dir(cfg, dist_info)
        if resume_state is None and restart_count() > 0 and list_checkpoints(run_dir / "checkpoints"):
            resume_state = load_checkpoint(run_dir)  # a torchrun restart reloads the run's newest checkpoint
        if dist_info.is_main:
            say(cfg, f"run directory {run_dir}")
        trainer = make_trainer(cfg, dist_info, device)
        if dist_info.is_main:
            for note in adjustments(cfg, trainer):
                say(cfg, f"note: {note}")
        if resume_state is not None:
            trainer.load_state_dict(resume_state)
            if dist_info.is_main:
                rewind_logs(run_dir, trainer.global_step)
        summary = run_loop(trainer, run_dir, dist_info, callbacks)
        finished = True
        return summary
    finally:
        distributed.cleanup(finished)


def main(argv: list[str] | None = None, prog: str = "python -m fastrl.train") -> int:
    try:
        cfg, resume_state = config_from_cli(argv, prog=prog)
        summary = run(cfg, resume_state)
    except UserError as e:
        print(f"fastrl: error: {e}", file=sys.stderr)
        return 2
    if summary.get("run_dir"):
        shown = {k: summary[k] for k in ("total_steps", "wall_time_s", "sps", "episode_return_mean", "eval_return_mean",
                                         "run_dir")}
        print(json.dumps(shown))
    return 0


class _CallableModule(types.ModuleType):
    """``import fastrl.train`` sets the package attribute ``fastrl.train`` to this module, replacing whatever was
    there; so the module itself is callable, and ``fastrl.train(...)`` is the Python API before and after it."""

    def __call__(self, *args, **kwargs):
        from fastrl.api import train
        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
