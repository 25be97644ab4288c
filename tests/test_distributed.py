"""Data-parallel training under torchrun on CPU (gloo): learning, identical parameters, global step,
rank-0-only outputs and recovery of a killed rank through --max-restarts."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

FAST = ["--wandb", "disabled", "--tensorboard", "false", "--progress", "false"]


def torchrun(args, cwd, max_restarts=0, **kwargs):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           f"--max-restarts={max_restarts}", "-m", "fastrl.train", *args, *FAST]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(c) for c in text.split()]


def worker_pids(root: int) -> list[int]:
    """The fastrl.train worker processes below the torchrun agent."""
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        for child in children(pid):
            stack.append(child)
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            except FileNotFoundError:
                continue
            if b"fastrl.train" in cmdline and b"torch.distributed.run" not in cmdline:
                found.append(child)
    return found


def test_two_ranks_learn_with_identical_parameters(tmp_path):
    n_envs, n_steps = 16, 32
    proc = torchrun(["--total-steps", "100000", "--n-envs", str(n_envs), "--n-steps", str(n_steps), "--n-epochs", "10",
                     "--n-minibatches", "2", "--lr", "1e-3", "--gamma", "0.98", "--gae-lambda", "0.8",
                     "--eval-episodes", "10"], cwd=tmp_path)
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out[-3000:]
    run_dirs = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    assert len(run_dirs) == 1, f"only rank 0 writes a run directory, found {run_dirs}"
    summary = json.loads((run_dirs[0] / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert len(set(summary["param_hashes"])) == 1, summary["param_hashes"]
    # The global step counts every rank's env steps.
    assert summary["total_steps"] == summary["iterations"] * 2 * n_envs * n_steps
    steps = [json.loads(line)["global_step"] for line in (run_dirs[0] / "metrics.jsonl").read_text().splitlines()]
    assert steps[:2] == [2 * n_envs * n_steps, 4 * n_envs * n_steps]
    assert summary["episode_return_mean"] >= 195, summary


def test_killed_rank_recovers_from_last_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    total = 100 * 2 * 8 * 32
    proc = torchrun(["--total-steps", str(total), "--n-envs", "8", "--n-steps", "32", "--n-minibatches", "2",
                     "--checkpoint-interval", "2", "--keep-checkpoints", "2", "--eval-episodes", "0",
                     "--run-dir", str(run_dir)], cwd=tmp_path, max_restarts=1)
    deadline = time.time() + 120
    killed = None
    while time.time() < deadline and killed is None:
        if list((run_dir / "checkpoints").glob("ckpt_*.pt")) if (run_dir / "checkpoints").is_dir() else []:
            pids = worker_pids(proc.pid)
            if len(pids) == 2:
                killed = pids[-1]
                os.kill(killed, signal.SIGKILL)
                break
        time.sleep(0.05)
    assert killed is not None, "never saw a checkpoint and two workers"
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["total_steps"] == total
    assert len(set(summary["param_hashes"])) == 1
    assert summary["restart_count"] == 1, "torchrun did not restart the job"
    assert 0 < summary["resumed_from_step"] < total, "the restarted job did not resume from a checkpoint"
    steps = [json.loads(line)["global_step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted(set(steps))[-1] == total


def test_bad_flag_under_torchrun_fails_cleanly(tmp_path):
    proc = torchrun(["--n-envs", "zero"], cwd=tmp_path)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "error: n_envs: expected int, got 'zero'" in out
