"""The perf/* figures of every metrics row (fastrl.run.resources): CPU, memory, the shares of the wall time, GPU
through NVML (a fake pynvml on CPU), and their run summary."""
import contextlib
import io
import json
import math
import os
import signal
import statistics
import sys
import time
import types

import pytest
import torch

from conftest import QUIET
from fastrl.cli.train import main
from fastrl.run.resources import GpuSampler, ResourceMonitor

TINY = ["--env", "CartPole-v1", "--n-envs", "4", "--n-steps", "64", "--n-epochs", "1", "--n-minibatches", "2",
        "--torch-threads", "1", "--device", "cpu", "--compile", "off", "--eval-episodes", "0", *QUIET]
SPLIT_SHARES = {"perf/share_rollout", "perf/share_update", "perf/share_env", "perf/share_logging", "perf/share_other"}
ITERATION_SHARES = {"perf/share_iteration", "perf/share_logging", "perf/share_other"}


def _train(run_dir, *flags) -> tuple[list, dict, dict]:
    """A CLI run: its training rows, summary.json and the console's final line."""
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            assert main([*TINY, "--run-dir", str(run_dir), *flags]) == 0
    finally:  # keep pytest's Ctrl-C working whatever train does with the handlers
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    return [r for r in rows if "charts/SPS" in r], summary, json.loads(out.getvalue().strip().splitlines()[-1])


@pytest.fixture(scope="module")
def envpool_run(tmp_path_factory):
    """4,096 CartPole steps on EnvPool: 16 iterations, a row each."""
    return _train(tmp_path_factory.mktemp("resources") / "run", "--total-steps", "4096")


def _check_shares(row: dict, names: set) -> None:
    shares = {k: v for k, v in row.items() if k.startswith("perf/share_")}
    assert set(shares) == names, row
    assert all(0.0 <= v <= 1.0 for v in shares.values()), shares
    assert math.fsum(shares.values()) == pytest.approx(1.0, abs=1e-6), shares


def test_every_row_carries_cpu_memory_and_the_shares_of_its_wall_time(envpool_run):
    rows, _, _ = envpool_run
    assert len(rows) == 16
    for row in rows:
        assert math.isfinite(row["perf/cpu_util"]) and row["perf/cpu_util"] >= 0.0, row
        assert math.isfinite(row["perf/rss_gb"]) and row["perf/rss_gb"] > 0.0, row
        assert not any(k.startswith("perf/gpu") for k in row), row
        _check_shares(row, SPLIT_SHARES)
        # every interval ran a rollout (env steps in it) and an update
        assert row["perf/share_env"] > 0 and row["perf/share_update"] > 0 and row["perf/share_rollout"] > 0, row
    # the rows after the first were written after another row's logging, which the next row's share counts
    assert all(row["perf/share_logging"] > 0 for row in rows[1:])


def test_the_summary_holds_the_rows_mean_cpu_and_peak_memory(envpool_run):
    rows, summary, shown = envpool_run
    assert summary["perf/cpu_util_mean"] == pytest.approx(statistics.fmean(r["perf/cpu_util"] for r in rows),
                                                          rel=1e-9)
    assert summary["perf/rss_gb_max"] == pytest.approx(max(r["perf/rss_gb"] for r in rows), rel=1e-9)
    assert not any(k.startswith("perf/gpu") for k in summary)
    assert shown["perf/cpu_util_mean"] == summary["perf/cpu_util_mean"]  # the console's final line
    assert shown["perf/rss_gb_max"] == summary["perf/rss_gb_max"]


def test_a_torch_env_iteration_is_one_share(tmp_path):
    rows, _, _ = _train(tmp_path / "run", "--env-backend", "torch", "--total-steps", "1024")
    assert len(rows) == 4
    for row in rows:
        _check_shares(row, ITERATION_SHARES)
        assert row["perf/share_iteration"] > 0, row


def test_shares_of_the_trainers_sections():
    """The env step is timed inside the rollout's section; sections that overran the interval fill it."""
    monitor = ResourceMonitor(torch.device("cpu"))
    monitor.logging_s = 0.1
    record = {"time/collect_s": 0.5, "time/env_s": 0.2, "time/policy_s": 0.25, "time/update_s": 0.3}
    shares = monitor.shares(record, wall=2.0)
    assert shares == pytest.approx({"perf/share_rollout": 0.15, "perf/share_update": 0.15, "perf/share_env": 0.1,
                                    "perf/share_logging": 0.05, "perf/share_other": 0.55})
    monitor.logging_s = 0.0
    shares = monitor.shares({"time/iteration_s": 1.2}, wall=1.0)
    assert shares == pytest.approx({"perf/share_iteration": 1.0, "perf/share_logging": 0.0, "perf/share_other": 0.0})


def test_cpu_util_counts_cpu_time_not_wall_time():
    """An interval that burned 0.3 s of CPU shows at least that much CPU time (its share of a core depends on what
    else the machine runs, so the check is on the CPU seconds the figure implies); a sleeping one next to none."""
    monitor = ResourceMonitor(torch.device("cpu"))
    start_cpu, start_wall = time.process_time(), monitor.last_wall
    while time.process_time() - start_cpu < 0.3 and time.perf_counter() - start_wall < 60:  # a hang guard only
        pass
    now = time.perf_counter()
    busy_cpu_s = monitor.sample({}, now)["perf/cpu_util"] / 100 * (now - start_wall)
    time.sleep(0.3)
    idle_start, now = now, time.perf_counter()
    idle_cpu_s = monitor.sample({}, now)["perf/cpu_util"] / 100 * (now - idle_start)
    tick = 1 / os.sysconf("SC_CLK_TCK")  # os.times()' resolution: the reading may fall one tick short, exactly
    assert busy_cpu_s >= 0.3 - tick - 1e-9 and idle_cpu_s < 0.1, (busy_cpu_s, idle_cpu_s)


class FakeNVML(types.ModuleType):
    """pynvml's calls fastrl makes, with fixed figures, recording the devices asked for."""

    def __init__(self, fail_init=False):
        super().__init__("pynvml")
        self.fail_init, self.queried, self.samples = fail_init, [], 0

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByIndex(self, index):
        self.queried.append(index)
        return ("handle", index)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.queried.append(uuid)
        return ("handle", uuid)

    def nvmlDeviceGetUtilizationRates(self, handle):
        self.samples += 1
        return types.SimpleNamespace(gpu=37, memory=12)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(used=3_500_000_000, total=80_000_000_000)


def test_the_gpu_figures_are_the_devices_this_process_uses(monkeypatch):
    fake = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monitor = ResourceMonitor(torch.device("cuda:1"))
    assert fake.queried == [1]
    rows = [monitor.sample({}, time.perf_counter()) for _ in range(2)]
    assert fake.samples == 2  # one NVML reading per row
    for row in rows:
        assert row["perf/gpu_util"] == 37.0 and row["perf/gpu_mem_gb"] == 3.5
    summary = monitor.summary()
    assert summary["perf/gpu_util_mean"] == 37.0 and summary["perf/gpu_mem_gb_max"] == 3.5
    # torch numbers the visible devices only; NVML every device of the machine
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    GpuSampler(torch.device("cuda:1"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb")
    GpuSampler(torch.device("cuda:1"))
    assert fake.queried == [1, 3, "GPU-bbbb"]
    assert GpuSampler(torch.device("cpu")).sample() == {} and fake.queried == [1, 3, "GPU-bbbb"]


@pytest.mark.parametrize("nvml", [None, FakeNVML(fail_init=True)], ids=["missing", "init-fails"])
def test_without_nvml_a_cuda_run_says_so_once_and_omits_the_gpu_figures(nvml, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", nvml)  # None: the import raises ImportError
    monitor = ResourceMonitor(torch.device("cuda:0"))
    rows = [monitor.sample({}, time.perf_counter()) for _ in range(3)]
    assert all(not any(k.startswith("perf/gpu") for k in row) and row["perf/rss_gb"] > 0 for row in rows)
    assert not any(k.startswith("perf/gpu") for k in monitor.summary())
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastrl: note: NVML is unavailable"), lines


def test_nvml_failing_mid_run_is_one_note_and_the_run_goes_on(monkeypatch, capsys):
    fake = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monitor = ResourceMonitor(torch.device("cuda:0"))
    assert "perf/gpu_util" in monitor.sample({}, time.perf_counter())

    def lost(handle):
        raise RuntimeError("GPU is lost")
    fake.nvmlDeviceGetUtilizationRates = lost
    rows = [monitor.sample({}, time.perf_counter()) for _ in range(2)]
    assert all("perf/gpu_util" not in row and "perf/cpu_util" in row for row in rows)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "NVML stopped answering" in lines[0], lines
