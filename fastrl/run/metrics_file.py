"""``metrics.jsonl`` read back (by ``fastrl plot`` and by a resume's rewind): one JSON object per line with a numeric
``global_step``. A malformed line (not UTF-8, not JSON, not an object, a ``global_step`` that is not a number, a torn
last line from a kill) is skipped and counted, never a traceback."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def parse_rows(data: bytes) -> tuple[list[tuple[str, dict]], int]:
    """``([(line, row), ...], skipped)`` for the lines of ``data``, in order."""
    rows, skipped = [], 0
    for raw in data.splitlines():
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
    return rows, skipped


def report_skipped(path: Path, skipped: int, who: str) -> None:
    """One stderr line saying how many malformed rows ``who`` skipped in ``path`` (none: nothing)."""
    if skipped:
        print(f"{who}: note: skipped {skipped} malformed row{'s' * (skipped != 1)} of {path} (not UTF-8, not JSON, or "
              "no numeric global_step)", file=sys.stderr)
