"""What fastrl wrote in a run directory, so that ``--overwrite`` deletes only that, and no write goes through a link.

``<run>/.fastrl-files.json`` maps each file fastrl wrote (a path relative to the run directory) to its size and
SHA-256, or to null hashes for a file it keeps appending to (``metrics.jsonl``, TensorBoard and wandb files, a
checkpoint being written). It is rewritten atomically whenever the run records a file: config.yaml, every checkpoint
(and the ones pruned), metrics.jsonl, and at the end summary.json, the plot, members.yaml and the files that
appeared under ``tb/``, ``wandb/`` and ``videos/`` since the run started (files a killed run's sinks wrote after its
last checkpoint are not recorded, so ``--overwrite`` leaves them).

``--overwrite`` removes a recorded file if its size and hash still match (or it has none recorded); a file anyone
else put there, or a recorded path whose content someone replaced, stays. A run directory is refused when one of
fastrl's paths in it is a symbolic link (``refuse_links``).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from pathlib import Path

from fastrl.config import UserError

MANIFEST = ".fastrl-files.json"
# fastrl's own paths in a run directory: none of them may be a symbolic link
OWN_PATHS = ("config.yaml", "members.yaml", "metrics.jsonl", "summary.json", "learning_curve.png", "checkpoints", "tb",
             "wandb", "videos", MANIFEST, ".fastrl-lock")
SINK_DIRS = ("tb", "wandb", "videos")  # written by libraries (TensorBoard, wandb, video writers) under names of theirs


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files_under(run_dir: Path, names) -> set[str]:
    """The regular files under ``run_dir/<name>`` for each name, as run-relative paths (links are not followed)."""
    found = set()
    for name in names:
        top = run_dir / name
        if top.is_symlink() or not top.is_dir():
            continue
        for root, _dirs, files in os.walk(top):
            found.update(str((Path(root) / f).relative_to(run_dir)) for f in files)
    return found


def read_manifest(run_dir: Path) -> dict | None:
    """The recorded files (``{path: {"size", "sha256"}}``), or None when the directory has no readable record."""
    try:
        entries = json.loads((Path(run_dir) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return entries if isinstance(entries, dict) else None


def read_record(path: Path) -> dict:
    """A run's JSON or YAML file (``summary.json``, ``config.yaml``) as a mapping; {} when it is missing, unreadable
    or not a mapping."""
    from fastrl import bounded_yaml
    try:
        text = path.read_text()
        value = json.loads(text) if path.suffix == ".json" else bounded_yaml.safe_load(text)
    except (OSError, ValueError, bounded_yaml.yaml.YAMLError):
        return {}
    return value if isinstance(value, dict) else {}


def read_metrics(path: Path, who: str) -> tuple[list[tuple[str, dict]], int]:
    """``metrics.jsonl`` read back (by ``fastrl plot`` and by a resume's rewind) as ``([(line, row), ...], skipped)``:
    one JSON object per line with a numeric ``global_step``, in order. A malformed line (not UTF-8, not JSON, not an
    object, a ``global_step`` that is not a number, a torn last line from a kill) is skipped and counted, never a
    traceback; ``who`` says how many in one stderr line."""
    rows, skipped = [], 0
    for raw in path.read_bytes().splitlines():
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
            row = json.loads(line)
        except (UnicodeDecodeError, ValueError, RecursionError):
            skipped += 1
            continue
        step = row.get("global_step") if isinstance(row, dict) else None
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step):
            skipped += 1
            continue
        rows.append((line, row))
    if skipped:
        print(f"{who}: note: skipped {skipped} malformed row{'s' * (skipped != 1)} of {path} (not UTF-8, not JSON, or "
              "no numeric global_step)", file=sys.stderr)
    return rows, skipped


class RunFiles:
    """The record of one run directory, kept by the process that holds its lock (rank 0)."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.entries = read_manifest(self.run_dir) or {}
        self._before = _files_under(self.run_dir, SINK_DIRS) - set(self.entries)  # someone else's: never recorded

    def add(self, *relative: str, hashed: bool = True) -> None:
        """Record ``relative`` paths as fastrl's, with their size and hash (``hashed``; else null, for a file still
        being appended to or about to be written), then save the record."""
        for rel in relative:
            path = self.run_dir / rel
            if hashed and path.is_file():
                self.entries[rel] = {"size": path.stat().st_size, "sha256": _sha256(path)}
            else:
                self.entries[rel] = {"size": None, "sha256": None}
        self.save()

    def sync(self) -> None:
        """Record the files the sinks wrote since the run started; forget recorded files that are gone (pruned
        checkpoints)."""
        for rel in _files_under(self.run_dir, SINK_DIRS) - self._before:
            self.entries.setdefault(rel, {"size": None, "sha256": None})
        self.entries = {rel: entry for rel, entry in self.entries.items() if (self.run_dir / rel).exists()}
        self.save()

    def save(self) -> None:
        from fastrl.run.storage import atomic_write
        atomic_write(self.run_dir / MANIFEST, json.dumps(self.entries, indent=1, sort_keys=True).encode(),
                     "the record of the run's files")


def clear_run(run_dir: Path) -> list[str]:
    """``--overwrite``: delete the files fastrl recorded (see the module docstring) and the directories they leave
    empty. Returns what was deleted. A run directory with no record (written by a fastrl before it kept one) is
    refused in one line: which of its files are fastrl's cannot be told."""
    run_dir = Path(run_dir)
    entries = read_manifest(run_dir)
    if entries is None:
        raise UserError(f"run_dir {str(run_dir)!r} holds a run with no record of the files fastrl wrote ({MANIFEST}), "
                        "so --overwrite cannot tell them from yours: delete what you do not need yourself, or pick "
                        "another --run-dir")
    removed = []
    for rel, entry in entries.items():
        path = run_dir / rel
        inside = os.path.realpath(path).startswith(os.path.realpath(run_dir) + os.sep)
        if not inside or not path.is_file() or path.is_symlink():
            continue
        hashed = isinstance(entry, dict) and entry.get("sha256") is not None  # else: a file still being appended to
        if not hashed or (path.stat().st_size == entry.get("size") and _sha256(path) == entry["sha256"]):
            path.unlink()
            removed.append(rel)
    for rel in sorted({str(Path(r).parent) for r in removed if Path(r).parent != Path(".")}, key=len, reverse=True):
        for parent in [run_dir / rel, *(run_dir / rel).parents]:
            if parent == run_dir or not parent.is_dir() or any(parent.iterdir()):
                break
            parent.rmdir()
    (run_dir / MANIFEST).unlink(missing_ok=True)
    return removed


def refuse_links(run_dir: Path) -> None:
    """One-line UserError when one of fastrl's paths in ``run_dir`` (``OWN_PATHS``) is a symbolic link, or a
    checkpoint file is: fastrl never writes or deletes through a link."""
    run_dir = Path(run_dir)
    checkpoints = run_dir / "checkpoints"
    found = [run_dir / name for name in OWN_PATHS if (run_dir / name).is_symlink()]
    if not found and checkpoints.is_dir():
        found = [p for p in checkpoints.iterdir() if p.is_symlink()]
    if found:
        raise UserError(f"run_dir {str(run_dir)!r}: {found[0].name} is a symbolic link (to "
                        f"{os.readlink(found[0])!r}); fastrl never writes through links in a run directory: replace it "
                        "by a real file or directory, or pick another --run-dir")
