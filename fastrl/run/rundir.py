"""Run directories: where a run writes, who may write there, and rewinding its logs on resume.

A run directory holds ``config.yaml``, ``metrics.jsonl``, ``tb/`` (TensorBoard), ``wandb/``, ``checkpoints/``,
``summary.json``, ``learning_curve.png`` and ``videos/``. One run owns it:
- a new run never writes into a directory that already holds a run, unless ``resume`` (continue it) or
  ``overwrite`` (delete its logs and checkpoints first) is given; a torchrun restart of the same job continues it;
- a default directory is created with an exclusive ``mkdir`` (a twin started in the same second takes a suffix);
- the training process holds an OS lock (``flock`` on ``.fastrl-lock``) on it for the whole run, so a second writer
  (``--resume`` of a live run, the same ``--run-dir``, a torchrun restart pointed at it) is refused naming the live
  PID; the kernel drops the lock when the process dies, kill -9 included;
- a resumed run rewinds its logs to the checkpoint's step, so the series read as one run.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import socket
import time
from pathlib import Path

from fastrl.config import Config, UserError
from fastrl.defaults import YAML_IGNORED
from fastrl.distributed import torchrun
from fastrl.run.runfiles import OWN_PATHS, clear_run, read_metrics, read_record, refuse_links
from fastrl.run.storage import atomic_write

LOCK_FILE = ".fastrl-lock"


def default_run_dir(cfg: Config) -> Path:
    """Create and return ``runs/<env>__<algo>__<seed>__<time>``, with a numeric suffix if that name is taken.

    The ``mkdir`` is exclusive, so two runs started in the same second never share a directory."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    env = re.sub(r"[^\w.-]", "_", cfg.env)  # ALE/Pong-v5, module:Id, module:make.<locals>.<lambda>: one safe name
    base = Path("runs") / f"{env}__{cfg.algo}__{cfg.seed}__{stamp}"
    make_dirs(base.parent)
    path, k = base, 1
    while True:
        try:
            path.mkdir()
            return path
        except FileExistsError:
            path, k = Path(f"{base}-{k}"), k + 1
        except OSError as e:
            raise _cannot_create(path, e) from None


def _cannot_create(path: Path, error: OSError) -> UserError:
    return UserError(f"run_dir {str(path)!r} cannot be created ({error.strerror or error}); pick another --run-dir")


def make_dirs(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _cannot_create(path, e) from None


class RunLock:
    """An exclusive ``flock`` on ``run_dir/.fastrl-lock``, held from ``acquire`` to ``release`` (or the process's
    end: the kernel releases it on any exit, kill -9 included). The file holds the owner's PID, for the message a
    refused second writer prints."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock and write this process's PID into the file, or raise a one-line UserError naming the
        process that holds it."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:  # never truncate (and write a PID into) whatever a link points at
                refuse_links(self.path.parent)
            raise _cannot_create(self.path.parent, e) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            owner = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise UserError(f"run_dir {str(self.path.parent)!r} is in use by the live process PID {owner}: wait for "
                            "it to finish (or stop it), or pick another --run-dir") from None
        self._fd = fd
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return self

    def release(self) -> None:
        """Idempotent."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor of the lock's open file releases the flock


def holds_run(path: Path) -> bool:
    """Whether ``path`` holds one of fastrl's files or folders but the lock (what --overwrite deletes is what fastrl
    recorded: ``fastrl.run.runfiles``)."""
    return path.is_dir() and any((path / name).exists() for name in OWN_PATHS if name != LOCK_FILE)


def resume_run_dir(target: str) -> Path:
    """The run directory of a ``--resume`` target (a run directory or a checkpoint file in it)."""
    path = Path(target)
    if path.is_file():
        return path.parent.parent if path.parent.name == "checkpoints" else path.parent
    return path


def restart_count() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def torchrun_job_key() -> str:
    """A name for this torchrun job, the same across its restarts and different for any other job.

    ``TORCHELASTIC_RUN_ID`` is the ``--rdzv-id`` (a fresh UUID with ``--standalone``), but ``none`` for every
    job started without one: then the rendezvous address plus the torchrun agent's host, PID and start time."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    if run_id not in ("", "none"):
        return re.sub(r"[^\w.-]", "_", run_id)
    agent = os.getppid()  # a torchrun worker is a child of its agent, which outlives the restarts
    try:
        agent_start = open(f"/proc/{agent}/stat").read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        agent_start = "0"
    parts = ("none", os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", ""), socket.gethostname(),
             str(agent), agent_start)
    return re.sub(r"[^\w.-]", "_", "-".join(parts))


def check_restart_owner(path: Path, cfg: Config) -> None:
    """A torchrun restart continues ``path`` only if that run is this job's: its saved config (seed included)
    must be ``cfg``."""
    if not (path / "config.yaml").is_file():
        return  # the first attempt died before writing anything: nothing to mix up
    saved = read_record(path / "config.yaml")
    differing = [k for k, v in cfg.to_dict().items() if k not in YAML_IGNORED and saved.get(k) != v]
    if differing:
        raise UserError(f"torchrun restart: run_dir {str(path)!r} holds another job's run (its config differs in "
                        f"{', '.join(differing)}); give each job its own --run-dir or --rdzv-id")


def _choose(cfg: Config, dist_info: torchrun.DistInfo) -> tuple[Path, RunLock]:
    """Rank 0's choice, created and locked (raises UserError for a run directory this run may not write into)."""
    if cfg.resume:
        own = resume_run_dir(cfg.resume)
        path = Path(cfg.run_dir) if cfg.run_dir else own
        if path.exists() and os.path.realpath(path) != os.path.realpath(own) and any(path.iterdir()):
            raise UserError(f"--resume {cfg.resume} --run-dir {path}: {str(path)!r} is neither that checkpoint's run "
                            "directory nor empty; drop --run-dir to continue in the run's own directory, or give an "
                            "empty one")
        make_dirs(path)
        return path, _locked(path)
    if cfg.run_dir:
        path = Path(cfg.run_dir)
        make_dirs(path)
        return path, _locked(path, lambda: _claim(path, cfg))
    if not dist_info.enabled:
        path = default_run_dir(cfg)
        return path, _locked(path)
    # Under torchrun a restarted job finds its first attempt's directory through a pointer file named after the job.
    pointer = Path("runs") / ".torchrun" / torchrun_job_key()
    if restart_count() > 0 and pointer.is_file():
        path = Path(pointer.read_text().strip())
        return path, _locked(path, lambda: check_restart_owner(path, cfg))
    path = default_run_dir(cfg)
    lock = _locked(path)
    make_dirs(pointer.parent)
    pointer.write_text(str(path))
    return path, lock


def _claim(path: Path, cfg: Config) -> None:
    """A given ``run_dir`` (locked): this job's after a torchrun restart; else refused if it holds a run, unless
    ``overwrite`` clears it."""
    if restart_count() > 0:
        check_restart_owner(path, cfg)
    elif holds_run(path) and not cfg.overwrite:
        raise UserError(f"run_dir {str(path)!r} already holds a run; continue it with --resume {path}, start "
                        f"afresh there with --overwrite, or pick another --run-dir")
    elif cfg.overwrite and holds_run(path):
        clear_run(path)


def _locked(path: Path, check=lambda: None) -> RunLock:
    """``path``'s lock, held once ``check()`` (run under it) and ``refuse_links`` pass; released if either raises."""
    lock = RunLock(path).acquire()
    try:
        check()
        refuse_links(path)
    except BaseException:
        lock.release()
        raise
    return lock


# Rank 0's locks on the run directories this process trains in, until release_run_dir.
_HELD: dict[str, RunLock] = {}


def agree_run_dir(cfg: Config, dist_info: torchrun.DistInfo) -> Path:
    """The run directory, identical on every rank and across torchrun restarts of the same job. On rank 0 it is
    created and locked for this process until ``release_run_dir``.

    Rank 0 decides; a refusal reaches every rank as the same one-line UserError.
    """
    choice: str | tuple = ""
    if dist_info.is_main:
        try:
            path, lock = _choose(cfg, dist_info)
            _HELD[str(path)] = lock
            choice = str(path)
        except UserError as e:
            choice = ("error", str(e))
    if dist_info.enabled:
        choice = torchrun.broadcast_object(choice)
    if isinstance(choice, (tuple, list)):
        raise UserError(choice[1])
    return Path(choice)


def release_run_dir(path: Path, discard_unused: bool = False) -> None:
    """Give up this process's lock on ``path`` (no-op if it holds none). ``discard_unused``: a start that failed
    before writing any of a run's files leaves nothing behind: the lock file goes, and the directory if then empty."""
    lock = _HELD.pop(str(path), None)
    if lock is None:
        return
    unused = discard_unused and not holds_run(path)
    if unused:
        lock.path.unlink(missing_ok=True)  # while still held: no other process can have taken it meanwhile
    lock.release()
    if unused:
        try:
            path.rmdir()
        except OSError:  # the user's own files are in it: it stays
            pass


# The keys of the final evaluation's own rows (loop.py logs them at the last step, after the final checkpoint).
_FINAL_EVAL_KEYS = {"global_step", "member", "seed", "variant", "member_step", "eval/return_mean", "eval/return_std",
                    "eval/return_min"}


def rewind_logs(run_dir: Path, step: int, drop_final_eval: bool = False) -> int:
    """Drop the ``metrics.jsonl`` rows logged after ``step`` (a crash's lost tail). Returns how many were dropped.

    ``drop_final_eval``: also drop final-evaluation rows at ``step`` itself; a resume whose checkpoint already holds
    the whole budget logs that evaluation again (a kill between the final evaluation and summary.json left it).
    The file is rewritten atomically (tmp + rename): a crash or a full disk during the rewind leaves the old file
    whole. TensorBoard is rewound by the logger (``purge_step``); wandb starts a new run that forks at ``step``.
    """
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    rows, dropped = read_metrics(path, "fastrl")  # malformed rows (a torn last line from a kill -9) go
    kept = [line for line, row in rows if row["global_step"] < step or row["global_step"] == step and not (
        drop_final_eval and row.keys() <= _FINAL_EVAL_KEYS)]
    dropped += len(rows) - len(kept)
    if dropped:
        atomic_write(path, "".join(line + "\n" for line in kept).encode(), "the rewound metrics",
                     " (the run's files are as they were)")
    return dropped


def remove_leftovers(run_dir: Path) -> list[Path]:
    """Delete temporary files a killed process left (``checkpoints/.ckpt_*.pt.tmp.<pid>``, a rewind's tmp file).
    Only the lock holder calls this, so no live writer owns them. Returns what was removed."""
    found = [*run_dir.glob(".*.tmp.*"), *run_dir.glob("metrics.jsonl.tmp"), *(run_dir / "checkpoints").glob(".*.tmp.*")]
    for path in found:
        path.unlink(missing_ok=True)
    return found


def mark_running(run_dir: Path, step: int) -> None:
    """Replace summary.json by a marker saying a resumed segment is running (from ``step``), so a crash of this
    segment never leaves the previous segment's summary describing a finished run. The run loop writes the real
    summary at the end; the previous one is kept under ``previous``."""
    marker = {"running": True, "pid": os.getpid(), "resumed_from_step": step,
              "previous": read_record(run_dir / "summary.json") or None}
    atomic_write(run_dir / "summary.json", json.dumps(marker, indent=2).encode(), "the run summary")


def write_config(run_dir: Path, cfg: Config) -> None:
    """``config.yaml``: the experiment, reusable with ``--config`` (which never reads the run_dir/resume keys)."""
    import yaml
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
