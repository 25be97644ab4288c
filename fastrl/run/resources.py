"""This process's resource use and where its wall time went, sampled once per log interval, in the run's row (never
per step; the members' rows and the final evaluation's row carry none):

- ``perf/cpu_util``: CPU time of the training process (every thread: torch's, EnvPool's) over the wall time since the
  last row, in percent of one core summed over the cores (200 = two cores busy); env subprocesses and the sink
  process are not in it;
- ``perf/rss_gb``: resident memory now (GB = 1e9 bytes; macOS, which has no /proc: the peak so far);
- on CUDA, through NVML: ``perf/gpu_util`` (% of the time a kernel ran, averaged by the driver over its own sample
  period) and ``perf/gpu_mem_gb`` (the device's used memory, every process's) of the device this process uses;
- ``perf/share_*``: the shares of the wall time since the last row, which sum to 1. ``rollout`` is the rollout's
  time outside the env step (the policy forward, the buffer writes), ``env`` the env step (EnvPool's send/recv, a
  Gymnasium step), ``update`` the update; a torch env's whole iteration is one function where they cannot be told
  apart: ``iteration`` stands in for the three. IMPALA/APPO step their envs in the actor processes, so the learner
  has ``rollout`` and ``env`` at 0 (its waits for rollouts are in ``other``; see ``queue/learner_wait_s``).
  ``logging`` is writing the previous rows (metrics.jsonl, the sink pipe, progress), ``other`` the rest (evaluation,
  checkpoints, callbacks, the loop).

The sections are the trainer's own ``time/*_s`` figures (``log_extras``), read from the row. CPU time comes from
``os.times()``, resident memory from ``/proc/self/statm``: the standard library, read in microseconds, where psutil
would be a new dependency (wandb no longer needs it) and a 60-90 ms import. macOS has no stdlib reading of the current
resident memory; ``getrusage``'s peak stands in there, which leaves the run's peak (``perf/rss_gb_max``) exact.
"""
from __future__ import annotations

import math
import os
import statistics
import time

from fastrl.errors import print_line

GB = 1e9
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def cpu_seconds() -> float:
    """User + system CPU seconds of this process, all its threads."""
    times = os.times()
    return times.user + times.system


def rss_bytes() -> int:
    """This process's resident memory now, in bytes (macOS: its peak so far)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES
    except OSError:  # no /proc: macOS, whose ru_maxrss is in bytes
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _nvml_handle(nvml, index: int):
    """NVML's handle of torch's ``cuda:index``: NVML numbers every GPU of the machine, torch only those
    ``CUDA_VISIBLE_DEVICES`` shows (listed by index or by UUID)."""
    visible = [name.strip() for name in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if name.strip()]
    if index < len(visible):
        if not visible[index].isdigit():
            return nvml.nvmlDeviceGetHandleByUUID(visible[index])
        index = int(visible[index])
    return nvml.nvmlDeviceGetHandleByIndex(index)


def _note(message: str, quiet: bool) -> None:
    if not quiet:
        print_line(f"fastrl: note: {message}; the metrics carry no perf/gpu_* figures")


class GpuSampler:
    """``perf/gpu_util`` and ``perf/gpu_mem_gb`` of a CUDA device through NVML (``pip install fastrl[gpu]``).

    ``sample()``: the figures, or ``{}`` off CUDA, without NVML or once NVML failed (said in one note line, once)."""

    def __init__(self, device, quiet: bool = False):
        self.quiet, self.nvml, self.handle = quiet, None, None
        if device.type != "cuda":
            return
        try:
            import pynvml
            pynvml.nvmlInit()
            self.handle, self.nvml = _nvml_handle(pynvml, device.index or 0), pynvml  # a run's is cuda:LOCAL_RANK
        except Exception as e:  # noqa: BLE001  (an ImportError, or any NVMLError: the run goes on without them)
            _note(f"NVML is unavailable ({type(e).__name__}: {e})", quiet)

    def sample(self) -> dict:
        if self.nvml is None:
            return {}
        try:
            utilization = self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu
            used = self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used
        except Exception as e:  # noqa: BLE001  (a GPU lost mid-run: the run goes on)
            self.nvml = None
            _note(f"NVML stopped answering ({type(e).__name__}: {e})", self.quiet)
            return {}
        return {"perf/gpu_util": float(utilization), "perf/gpu_mem_gb": used / GB}


# The row's figures of the summary, each reduced over the run's rows: a mean, or, for memory, the peak (a run fits in
# memory if its peak does).
SUMMARY = {"perf/cpu_util": "mean", "perf/rss_gb": "max", "perf/gpu_util": "mean", "perf/gpu_mem_gb": "max"}


class ResourceMonitor:
    """The ``perf/*`` figures of each metrics row (see the module docstring) and their run summary."""

    def __init__(self, device, quiet: bool = False):
        self.gpu = GpuSampler(device, quiet)
        self.last_wall, self.last_cpu = time.perf_counter(), cpu_seconds()
        self.logging_s = 0.0
        self.rows: dict = {}  # key -> the rows' values

    def sample(self, record: dict, now: float) -> dict:
        """The ``perf/*`` figures of the interval that ends at ``now`` (``time.perf_counter()``), its sections read
        from ``record``'s ``time/*_s``."""
        wall, cpu = max(now - self.last_wall, 1e-9), cpu_seconds()
        out = {"perf/cpu_util": 100.0 * (cpu - self.last_cpu) / wall, "perf/rss_gb": rss_bytes() / GB,
               **self.gpu.sample(), **self.shares(record, wall)}
        self.last_wall, self.last_cpu, self.logging_s = now, cpu, 0.0
        for key in SUMMARY.keys() & out.keys():
            self.rows.setdefault(key, []).append(out[key])
        return out

    def shares(self, record: dict, wall: float) -> dict:
        def seconds(name):
            value = record.get(f"time/{name}_s", 0.0)
            return float(value) if math.isfinite(value) else 0.0
        if "time/iteration_s" in record:
            parts = {"iteration": seconds("iteration")}
        else:  # the env step is timed inside the rollout's section
            parts = {"rollout": max(seconds("collect") - seconds("env"), 0.0), "update": seconds("update"),
                     "env": seconds("env")}
        parts["logging"] = self.logging_s
        total = sum(parts.values())
        scale = 1.0 / max(total, wall)  # sections that overran the interval (timer jitter) fill it, never more
        out = {f"perf/share_{name}": value * scale for name, value in parts.items()}
        out["perf/share_other"] = max(1.0 - sum(out.values()), 0.0)
        return out

    def summary(self) -> dict:
        """``perf/cpu_util_mean``, ``perf/rss_gb_max`` and, on CUDA, ``perf/gpu_util_mean``, ``perf/gpu_mem_gb_max``
        over the rows sampled (none before the first row)."""
        return {f"{key}_{how}": (statistics.fmean if how == "mean" else max)(self.rows[key])
                for key, how in SUMMARY.items() if key in self.rows}
