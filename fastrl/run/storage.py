"""Writing run files when the disk may be full: one-line errors naming the path and the space needed, and atomic
whole-file writes that never leave a partial file behind."""
from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path

from fastrl.errors import UserError, first_line

# What a full (or quota-limited) file system raises, as errno values; torch.save raises RuntimeError instead.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def byte_size(n: float) -> str:
    """``n`` bytes for a message: ``512 B``, ``4.0 KiB``, ``12.5 MiB``, ``16.0 GiB``."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} GiB"


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on the file system of ``path`` (its nearest existing parent)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def write_error(what: str, path: Path, error: BaseException, needed: int, hint: str = "") -> UserError:
    """The one line for a failed write of ``what`` at ``path`` (``needed``: the bytes it takes): a full file system
    (by the error, or by the space left) says so."""
    free = free_bytes(path)
    if getattr(error, "errno", None) in DISK_FULL or (free is not None and free < needed):
        left = f", {byte_size(free)} free" if free is not None else ""
        return UserError(f"no space left on device for {what} {path} (it needs about {byte_size(needed)}{left}): free "
                         f"disk space{hint}")
    reason = getattr(error, "strerror", None) or first_line(error)
    return UserError(f"could not write {what} {path}: {reason}{hint}")


def atomic_write(path: Path, data: bytes, what: str, hint: str = "") -> None:
    """Write ``data`` to ``path`` via a temporary file and a rename (then the directory synced): ``path`` is either
    its old self or whole. On a failure the temporary file is removed and a one-line UserError raised."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise write_error(what, path, e, len(data), hint) from None
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def strict_json(value, indent: int | None = 2) -> str:
    """``value`` as JSON (``indent``: as json.dumps takes it) that strict parsers accept: NaN and infinities (a run
    whose rewards were NaN) become null, never the bare ``NaN`` Python's json writes."""
    def finite(item):
        if isinstance(item, float) and not math.isfinite(item):
            return None
        if isinstance(item, dict):
            return {key: finite(v) for key, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [finite(v) for v in item]
        return item
    return json.dumps(finite(value), indent=indent, allow_nan=False)
