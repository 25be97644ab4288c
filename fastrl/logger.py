"""One ``log(metrics, step)`` over console progress, JSONL, TensorBoard and wandb (offline by default).

Only the main process builds a real logger; other ranks get ``NullLogger``.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from fastrl.config import UserError


def _plain(value):
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else (1e308 if value > 0 else -1e308)
    return value


def _wait_for_a_later_event_file_name(tb_dir: Path) -> None:
    """TensorBoard reads event files in name order, and a name starts with the writer's creation second: a resumed
    writer created in the same second as a crashed one could sort first, and its purge would then come before the
    events it must purge. Waits (under a second, only then) until the names will sort in creation order."""
    stamps = [int(p.name.split(".")[3]) for p in tb_dir.glob("events.out.tfevents.*") if p.name.split(".")[3].isdigit()]
    while stamps and int(time.time()) <= max(stamps):
        time.sleep(0.02)


class NullLogger:
    def log(self, metrics: dict, step: int) -> None:
        pass

    def progress(self, step: int, postfix: dict) -> None:
        pass

    def close(self) -> None:
        pass


class RunLogger(NullLogger):
    """Writes ``metrics.jsonl`` (one object per log step), TensorBoard events and a wandb run in ``run_dir``."""

    def __init__(self, run_dir: Path, config: dict, total_steps: int, start_step: int = 0, tensorboard: bool = True,
                 wandb_mode: str = "offline", wandb_project: str = "fastrl", progress: bool = True, run_name: str = ""):
        self.run_dir = Path(run_dir)
        self._jsonl = open(self.run_dir / "metrics.jsonl", "a", buffering=1)
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            # On resume, TensorBoard drops the events a crashed attempt logged past the checkpoint's step.
            _wait_for_a_later_event_file_name(self.run_dir / "tb")
            self._tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=start_step + 1 if start_step else None)
        self._wandb = None
        if wandb_mode != "disabled":
            self._wandb = self._init_wandb(config, wandb_mode, wandb_project, run_name or self.run_dir.name, start_step)
        self._bar = None
        if progress:
            from tqdm import tqdm
            self._bar = tqdm(total=total_steps, initial=start_step, unit="step", unit_scale=True, dynamic_ncols=True,
                             file=sys.stderr, mininterval=0.5)

    def _init_wandb(self, config: dict, mode: str, project: str, name: str, start_step: int):
        """A fresh run logs one wandb run. A resumed one (``start_step`` > 0) continues the series: online, as a
        fork of the previous segment at ``start_step`` (wandb keeps history append-only, so the crashed tail past
        the checkpoint stays out of the fork); offline, as a new run in the same group named ``<run>@<step>``."""
        import wandb
        os.environ.setdefault("WANDB_SILENT", "true")
        id_file = self.run_dir / "wandb" / "fastrl_run_id"
        kwargs = dict(mode=mode, project=project, dir=str(self.run_dir), config=config, group=self.run_dir.name,
                      name=name, reinit="finish_previous")
        if start_step:
            kwargs["name"] = f"{name}@{start_step}"
            if mode == "online" and id_file.is_file():
                kwargs["fork_from"] = f"{id_file.read_text().strip()}?_step={start_step}"
        run = wandb.init(**kwargs)
        id_file.parent.mkdir(parents=True, exist_ok=True)
        id_file.write_text(run.id)
        return run

    def log(self, metrics: dict, step: int) -> None:
        record = {"global_step": int(step)}
        record.update({k: _plain(v) for k, v in metrics.items()})
        try:
            self._jsonl.write(json.dumps(record) + "\n")
        except OSError as e:
            raise UserError(f"could not write metrics to {self.run_dir / 'metrics.jsonl'}: {e.strerror}; free disk space") from None
        if self._tb is not None:
            for key, value in record.items():
                if key != "global_step" and isinstance(value, (int, float)):
                    self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=int(step))

    def progress(self, step: int, postfix: dict) -> None:
        if self._bar is not None:
            self._bar.n = step
            self._bar.set_postfix({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in postfix.items()},
                                  refresh=False)
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        try:
            self._jsonl.close()
        except OSError:  # e.g. disk full on the final flush: what was written before stays whole
            pass
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
