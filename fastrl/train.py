"""``python -m fastrl.train``: parse the config, check it, build the algorithm's trainer, run the one loop.

One file serves a single process and ``torchrun`` alike: ``distributed.setup`` reads RANK/WORLD_SIZE, rank 0
alone writes the run directory, and gradients are averaged across ranks once per minibatch.
"""
from __future__ import annotations

import json
import sys

from fastrl import distributed
from fastrl.checkpoint import list_checkpoints, load_checkpoint
from fastrl.config import YAML_IGNORED, Config, UserError, load_yaml, make_config, parse_cli_overrides
from fastrl.loop import run_loop
from fastrl.rundir import agree_run_dir, restart_count, rewind_logs
from fastrl.trainer import Trainer, env_seed  # noqa: F401  (the public names of a trainer and its env seeds)

ACTOR_LEARNER_ALGOS = ("impala", "appo")


def config_from_cli(argv: list[str] | None = None, prog: str = "fastrl train") -> tuple[Config, dict | None]:
    """Parse flags. With ``--resume`` the checkpoint's config is the base and only explicit flags override it."""
    overrides, yaml_path = parse_cli_overrides(argv, prog)
    if not overrides.get("resume"):
        return make_config(overrides, yaml_path, where="command-line flags"), None
    state = load_checkpoint(overrides["resume"])
    base = make_config(state["config"], where=f"checkpoint {overrides['resume']}").to_dict()
    base["run_dir"] = ""  # a moved or copied run continues where it now lies (see rundir.resume_run_dir)
    if yaml_path:
        base.update({key.replace("-", "_"): value for key, value in load_yaml(yaml_path).items()
                     if key.replace("-", "_") not in YAML_IGNORED})
    return make_config({**base, **overrides}, where="command-line flags"), state


def make_trainer(cfg: Config, dist_info: distributed.DistInfo, device):
    if cfg.algo in ACTOR_LEARNER_ALGOS:
        from fastrl.actor_learner import ActorLearnerTrainer
        return ActorLearnerTrainer(cfg, device)
    return Trainer(cfg, dist_info, device)


def run(cfg: Config, resume_state: dict | None = None) -> dict:
    """Train ``cfg`` to its end (or a stop signal, or ``stop_at_return``) and return the summary."""
    from fastrl.preflight import check_run
    check_run(cfg)  # every combination of flags, env and device, before any work starts
    dist_info, device = distributed.setup(cfg.device)
    try:
        run_dir = agree_run_dir(cfg, dist_info)
        if resume_state is None and restart_count() > 0 and list_checkpoints(run_dir / "checkpoints"):
            resume_state = load_checkpoint(run_dir)  # a torchrun restart reloads the run's newest checkpoint
        trainer = make_trainer(cfg, dist_info, device)
        if resume_state is not None:
            trainer.load_state_dict(resume_state)
            if dist_info.is_main:
                rewind_logs(run_dir, trainer.global_step)
        return run_loop(trainer, run_dir, dist_info)
    finally:
        distributed.cleanup()


def main(argv: list[str] | None = None, prog: str = "python -m fastrl.train") -> int:
    try:
        cfg, resume_state = config_from_cli(argv, prog=prog)
        summary = run(cfg, resume_state)
    except UserError as e:
        print(f"fastrl: error: {e}", file=sys.stderr)
        return 2
    if summary.get("run_dir"):
        shown = {k: summary[k] for k in ("total_steps", "wall_time_s", "sps", "episode_return_mean", "eval_return_mean")}
        print(json.dumps(shown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
