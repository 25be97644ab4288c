"""Run directories: where a run writes, who may write there, and rewinding its logs on resume.

A run directory holds ``config.yaml``, ``metrics.jsonl``, ``tb/`` (TensorBoard), ``wandb/``, ``checkpoints/``,
``summary.json``, ``learning_curve.png`` and ``videos/``. One run owns it:
- a new run never writes into a directory that already holds a run, unless ``resume`` (continue it) or
  ``overwrite`` (delete its logs and checkpoints first) is given; a torchrun restart of the same job continues it;
- a resumed run rewinds its logs to the checkpoint's step, so the series read as one run.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

from fastrl import distributed
from fastrl.config import Config, UserError

# What makes a directory "hold a run"; also what --overwrite deletes (nothing else in the directory is touched).
RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json", "learning_curve.png")
RUN_DIRS = ("checkpoints", "tb", "wandb", "videos")


def default_run_dir(cfg: Config) -> Path:
    """``runs/<env>__<algo>__<seed>__<time>``, with a numeric suffix if that name is taken."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    env = re.sub(r"[^\w.-]", "_", cfg.env)  # ALE/Pong-v5, module:Id, module:make.<locals>.<lambda>: one safe name
    base = Path("runs") / f"{env}__{cfg.algo}__{cfg.seed}__{stamp}"
    path, k = base, 1
    while path.exists():
        path, k = Path(f"{base}-{k}"), k + 1
    return path


def holds_run(path: Path) -> bool:
    return path.is_dir() and (any((path / f).exists() for f in RUN_FILES) or any((path / d).exists() for d in RUN_DIRS))


def resume_run_dir(target: str) -> Path:
    """The run directory of a ``--resume`` target (a run directory or a checkpoint file in it)."""
    path = Path(target)
    if path.is_file():
        return path.parent.parent if path.parent.name == "checkpoints" else path.parent
    return path


def restart_count() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _choose(cfg: Config, dist_info: distributed.DistInfo) -> Path:
    """Rank 0's choice (raises UserError for a run directory this run may not write into)."""
    if cfg.resume:
        return Path(cfg.run_dir) if cfg.run_dir else resume_run_dir(cfg.resume)
    if cfg.run_dir:
        path = Path(cfg.run_dir)
        if holds_run(path) and not cfg.overwrite and restart_count() == 0:
            raise UserError(f"run_dir {str(path)!r} already holds a run; continue it with --resume {path}, start afresh "
                            f"there with --overwrite, or pick another --run-dir")
        if cfg.overwrite and restart_count() == 0:
            clear_run(path)
        return path
    if not dist_info.enabled:
        return default_run_dir(cfg)
    # Under torchrun a restarted job finds its first attempt's directory through a pointer file.
    pointer = Path("runs") / ".torchrun" / os.environ.get("TORCHELASTIC_RUN_ID", "none")
    chosen = pointer.read_text().strip() if restart_count() > 0 and pointer.is_file() else str(default_run_dir(cfg))
    pointer.parent.mkdir(parents=True, exist_ok=True)
    pointer.write_text(chosen)
    return Path(chosen)


def agree_run_dir(cfg: Config, dist_info: distributed.DistInfo) -> Path:
    """The run directory, identical on every rank and across torchrun restarts of the same job.

    Rank 0 decides; a refusal reaches every rank as the same one-line UserError.
    """
    choice: str | tuple = ""
    if dist_info.is_main:
        try:
            choice = str(_choose(cfg, dist_info))
        except UserError as e:
            choice = ("error", str(e))
    if dist_info.enabled:
        choice = distributed.broadcast_object(choice)
    if isinstance(choice, (tuple, list)):
        raise UserError(choice[1])
    return Path(choice)


def clear_run(path: Path) -> None:
    """Delete a run's own files (``--overwrite``); anything else in the directory stays."""
    for name in RUN_FILES:
        (path / name).unlink(missing_ok=True)
    for name in RUN_DIRS:
        shutil.rmtree(path / name, ignore_errors=True)


def rewind_logs(run_dir: Path, step: int) -> int:
    """Drop the ``metrics.jsonl`` rows logged after ``step`` (a crash's lost tail). Returns how many were dropped.

    The file is rewritten atomically (tmp + rename): a crash during the rewind leaves the old file whole.
    TensorBoard is rewound by the logger (``purge_step``); wandb starts a new run that forks at ``step``.
    """
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            row_step = json.loads(line).get("global_step", 0)
        except json.JSONDecodeError:  # a torn last line from a kill -9
            dropped += 1
            continue
        if row_step > step:
            dropped += 1
        else:
            kept.append(line)
    if dropped:
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, path)
    return dropped


def write_config(run_dir: Path, cfg: Config) -> None:
    """``config.yaml``: the experiment, reusable with ``--config`` (which never reads the run_dir/resume keys)."""
    import yaml
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
