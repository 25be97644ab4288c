"""One owner per run directory, proven with real concurrent processes: same-second twins get their own directory,
a live run's lock refuses every second writer (naming its PID) and dies with it (kill -9), and a torchrun restart
only ever reopens its own job's directory."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import QUIET, train_main
from fastrl.run.checkpoint import list_checkpoints

TINY = ["--env", "CartPole-v1", "--n-envs", "4", "--n-steps", "32", "--n-epochs", "2", "--n-minibatches", "2",
        "--torch-threads", "1", "--device", "cpu", "--eval-episodes", "0"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}


def _train(args, cwd, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "fastrl.train", *args], cwd=cwd, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def _steps(run_dir):
    return [json.loads(line)["global_step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def test_same_second_twins_get_their_own_run_dirs(tmp_path):
    """Four processes create the default run directory at the same instant, in the same (frozen) second."""
    script = textwrap.dedent("""
        import sys, time
        time.strftime = lambda fmt, *args: "20260101-000000"
        from fastrl.config import make_config
        from fastrl.run.rundir import default_run_dir
        go = float(sys.argv[1])
        while time.time() < go:
            pass
        print(default_run_dir(make_config({})))
    """)
    go = time.time() + 8
    procs = [subprocess.Popen([sys.executable, "-c", script, str(go)], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                              text=True) for _ in range(4)]
    chosen = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(chosen)) == 4, chosen
    assert all((tmp_path / c).is_dir() for c in chosen)


def test_two_runs_started_together_write_two_run_dirs(tmp_path):
    """The issue's repro: two default runs started at once each get a directory, and each logs each step once."""
    procs = [_train(TINY + QUIET + ["--total-steps", "512"], tmp_path) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    run_dirs = sorted(p for p in (tmp_path / "runs").iterdir() if not p.name.startswith("."))
    assert len(run_dirs) == 2, run_dirs
    for run_dir in run_dirs:
        assert _steps(run_dir) == [128, 256, 384, 512]


def test_a_live_run_refuses_every_second_writer_until_it_dies(tmp_path):
    run_dir = tmp_path / "run"
    # Eager: the endless budget would have auto compile the owner's update before its first checkpoint.
    owner = _train(TINY + QUIET + ["--total-steps", "100000000", "--checkpoint-interval", "2", "--compile", "off",
                                   "--run-dir", str(run_dir)], tmp_path)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and not list_checkpoints(run_dir / "checkpoints"):
            time.sleep(0.1)
        assert list_checkpoints(run_dir / "checkpoints"), "the first run never checkpointed"
        for args in (["--resume", str(run_dir)], ["--run-dir", str(run_dir)],
                     ["--run-dir", str(run_dir), "--overwrite", "true"]):
            second = subprocess.run([sys.executable, "-m", "fastrl.train", *TINY, *QUIET, *args], cwd=tmp_path,
                                    env=ENV, capture_output=True, text=True, timeout=180)
            lines = _error_lines(second.stderr)
            assert second.returncode == 2 and len(lines) == 1, (args, second.stderr[-2000:])
            assert lines[0].startswith("fastrl: error:") and f"PID {owner.pid}" in lines[0], lines
        assert owner.poll() is None, "the owner must keep running"
        assert list_checkpoints(run_dir / "checkpoints"), "--overwrite of a live run deleted its checkpoints"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=60)
    steps = _steps(run_dir)
    assert steps == sorted(set(steps)), "a second writer appended to the live run's metrics"
    # kill -9 released the lock: the run can be resumed now.
    newest = int(list_checkpoints(run_dir / "checkpoints")[-1].stem[5:])
    assert train_main(["--resume", str(run_dir), "--total-steps", str(newest + 256)] + QUIET) == 0
    assert _steps(run_dir)[-2:] == [newest + 128, newest + 256]


WORKER = textwrap.dedent("""
    import sys
    from fastrl.config import make_config
    from fastrl.distributed.torchrun import DistInfo
    from fastrl.run.rundir import agree_run_dir, write_config
    try:
        cfg = make_config({"seed": int(sys.argv[1])})
        path = agree_run_dir(cfg, DistInfo(rank=0, world_size=2))
        write_config(path, cfg)
        print(path)
    except Exception as e:
        print("error:", e)
""")

AGENT = textwrap.dedent("""
    import os, subprocess, sys, time
    seed, go = sys.argv[1], sys.argv[2]
    def attempt(n):
        env = {**os.environ, "TORCHELASTIC_RESTART_COUNT": str(n)}
        out = subprocess.run([sys.executable, "-c", WORKER, seed], env=env, capture_output=True, text=True)
        print(out.stdout.strip(), flush=True)
    attempt(0)
    while not os.path.exists(go):
        time.sleep(0.05)
    attempt(1)
""")


def _agent(seed, go, cwd):
    env = {**ENV, "TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    script = f"WORKER = {WORKER!r}\n{AGENT}"
    return subprocess.Popen([sys.executable, "-c", script, str(seed), str(go)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, text=True)


def test_torchrun_restart_reopens_its_own_jobs_run_dir(tmp_path):
    """Two torchrun jobs without --rdzv-id (TORCHELASTIC_RUN_ID=none, same rendezvous address) in one working
    directory: job A starts, job B starts, A's workers restart. A must reopen A's directory, not B's (each "agent"
    is a real parent process running its worker twice, as torchrun does)."""
    go_a, go_b = tmp_path / "go_a", tmp_path / "go_b"
    agent_a = _agent(1, go_a, tmp_path)
    first_a = agent_a.stdout.readline().strip()
    agent_b = _agent(2, go_b, tmp_path)
    first_b = agent_b.stdout.readline().strip()
    go_a.touch()
    restarted_a = agent_a.stdout.readline().strip()
    go_b.touch()
    restarted_b = agent_b.stdout.readline().strip()
    agent_a.wait(timeout=60), agent_b.wait(timeout=60)
    lines = (first_a, first_b, restarted_a, restarted_b)
    assert all(line and not line.startswith("error") for line in lines), lines  # each worker agreed on a directory
    assert first_a != first_b and (tmp_path / first_a).is_dir() and (tmp_path / first_b).is_dir(), lines
    assert (restarted_a, restarted_b) == (first_a, first_b)


def test_torchrun_restart_refuses_a_run_dir_of_another_job(tmp_path, monkeypatch):
    """A restart pointed (by --run-dir) at a directory whose saved config is another job's is refused in one line."""
    run_dir = tmp_path / "run"
    assert train_main(TINY + QUIET + ["--total-steps", "128", "--run-dir", str(run_dir), "--seed", "1"]) == 0
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    from fastrl.config import UserError, make_config
    from fastrl.distributed.torchrun import DistInfo
    from fastrl.run.rundir import agree_run_dir
    with pytest.raises(UserError, match="another job's run.*seed"):
        agree_run_dir(make_config({"run_dir": str(run_dir), "seed": 2}), DistInfo())


def test_cluster_files_run_in_one_xdist_group(request):
    """Under the README's ``-n 2 --dist loadgroup`` the cluster files' tests carry the ``@cluster`` group in their
    node ids, so xdist sends them all to one worker, one after another (two torchrun jobs or Ray heads at once would
    share ports and restart the Ray fixture between modules); the mark must be in place before xdist reads it."""
    if not request.config.getoption("loadgroup", False):
        pytest.skip("checks the README's -n 2 --dist loadgroup run; this run is not distributed by group")
    assert request.node.nodeid.endswith("@cluster"), request.node.nodeid
