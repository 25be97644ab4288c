"""Faults: stop signals, kill -9 during checkpoint writes, disk full while writing metrics or checkpoints."""
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import fastrl.checkpoint
import fastrl.logger
from fastrl.checkpoint import list_checkpoints, load_checkpoint
from fastrl.train import main

QUIET = ["--wandb", "disabled", "--tensorboard", "false", "--progress", "false", "--plot", "false", "--quiet", "true"]


def _children(pid: int) -> set[int]:
    """All descendants of ``pid`` (from /proc)."""
    found, stack = set(), [pid]
    while stack:
        current = stack.pop()
        try:
            kids = [int(c) for c in Path(f"/proc/{current}/task/{current}/children").read_text().split()]
        except FileNotFoundError:
            kids = []
        found.update(kids)
        stack.extend(kids)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _start(args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "fastrl.train", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(predicate, timeout=180.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_saves_flushes_and_exits_cleanly(tmp_path, signum):
    run_dir = tmp_path / "run"
    # wandb offline and TensorBoard on: their writers and wandb's service process must be closed too.
    proc = _start(["--total-steps", "100000000", "--run-dir", str(run_dir), "--wandb", "offline",
                   "--progress", "false"], tmp_path)
    metrics = run_dir / "metrics.jsonl"
    assert _wait_for(lambda: metrics.is_file() and len(metrics.read_text().splitlines()) >= 3), proc.stderr.read()
    children = _children(proc.pid)
    sent = time.time()
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    elapsed = time.time() - sent
    assert proc.returncode == 0, err[-2000:]
    assert elapsed < 20, f"took {elapsed:.1f}s to stop"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by_signal"] is True
    state = load_checkpoint(run_dir)
    assert state["global_step"] == summary["total_steps"]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]  # every line is whole JSON
    assert rows[-1]["global_step"] <= summary["total_steps"]
    assert list((run_dir / "tb").iterdir()), "TensorBoard events were not flushed"
    assert _wait_for(lambda: not any(_alive(c) for c in children), timeout=10), "child processes were left behind"


def test_kill_9_during_checkpoint_writes_leaves_loadable_checkpoints(tmp_path):
    run_dir = tmp_path / "run"
    # A large network makes each checkpoint write long enough that kills land inside writes too.
    args = ["--total-steps", "100000000", "--n-envs", "8", "--n-steps", "8", "--n-epochs", "1", "--n-minibatches", "1",
            "--hidden-sizes", "1024", "1024", "--checkpoint-interval", "1", "--keep-checkpoints", "3",
            "--eval-episodes", "0", "--run-dir", str(run_dir), *QUIET]
    ckpts = run_dir / "checkpoints"
    for delay in (0.0, 0.13, 0.29):
        proc = _start(args if delay == 0.0 else [*args, "--resume", str(run_dir)], tmp_path)
        before = list_checkpoints(ckpts)
        progressed = _wait_for(lambda: len(set(list_checkpoints(ckpts)) - set(before)) >= 2)
        if not progressed:
            proc.kill()
            pytest.fail(f"no new checkpoints: {proc.communicate()[1][-2000:]}")
        time.sleep(delay)
        proc.kill()
        proc.wait(timeout=30)
        for path in list_checkpoints(ckpts):
            assert load_checkpoint(path)["global_step"] > 0
    # --resume continues from the newest checkpoint and finishes.
    newest = load_checkpoint(run_dir)["global_step"]
    target = newest + 2 * 8 * 8
    done = subprocess.run([sys.executable, "-m", "fastrl.train", *args, "--resume", str(run_dir), "--total-steps",
                           str(target)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((run_dir / "summary.json").read_text())["total_steps"] == target
    assert json.loads((run_dir / "summary.json").read_text())["resumed_from_step"] == newest


def test_disk_full_during_checkpoint_write(tmp_path, monkeypatch, capsys):
    real_save = torch.save
    calls = {"n": 0}

    def failing_save(obj, f, *a, **kw):
        calls["n"] += 1
        if calls["n"] >= 3:
            f.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *a, **kw)

    monkeypatch.setattr(fastrl.checkpoint.torch, "save", failing_save)
    run_dir = tmp_path / "run"
    code = main(["--total-steps", "4096", "--n-envs", "8", "--n-steps", "32", "--checkpoint-interval", "2",
                 "--eval-episodes", "0", "--run-dir", str(run_dir), *QUIET])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "No space left on device" in err[0] and "free disk space" in err[0], err
    kept = list_checkpoints(run_dir / "checkpoints")
    assert len(kept) == 2 and all(load_checkpoint(p)["global_step"] > 0 for p in kept)
    assert not [p for p in (run_dir / "checkpoints").iterdir() if ".tmp" in p.name], "a partial file was left behind"
    assert not (run_dir / "summary.json").exists()


def test_disk_full_while_writing_metrics(tmp_path, monkeypatch, capsys):
    real_open = open

    class FullDisk:
        def __init__(self, f):
            self.f, self.lines = f, 0

        def write(self, text):
            self.lines += 1
            if self.lines > 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(text)

        def close(self):
            self.f.close()

    def patched_open(path, *a, **kw):
        f = real_open(path, *a, **kw)
        return FullDisk(f) if str(path).endswith("metrics.jsonl") else f

    monkeypatch.setattr(fastrl.logger, "open", patched_open, raising=False)
    run_dir = tmp_path / "run"
    code = main(["--total-steps", "4096", "--n-envs", "8", "--n-steps", "32", "--eval-episodes", "0",
                 "--run-dir", str(run_dir), *QUIET])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "metrics.jsonl" in err[0] and "free disk space" in err[0], err
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2  # what was written stays whole
    assert (run_dir / "config.yaml").is_file()
