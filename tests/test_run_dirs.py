"""Run directories are never overwritten: a saved config starts a new run, an occupied --run-dir is refused unless
--resume or --overwrite, and a resume after a crash rewinds the logs so they read as one run."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import QUIET, train_main
from fastrl.run.checkpoint import list_checkpoints
from fastrl.run.rundir import rewind_logs

TINY = ["--env", "CartPole-v1", "--n-envs", "4", "--n-steps", "32", "--n-epochs", "2", "--n-minibatches", "2",
        "--torch-threads", "1", "--device", "cpu", "--eval-episodes", "0"]


def _steps(run_dir):
    return [json.loads(line)["global_step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _snapshot(run_dir):
    """Every file of the run but its lock file (which names the last process that held the lock)."""
    return {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != ".fastrl-lock"}


def test_saved_config_starts_a_new_run_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = tmp_path / "runs" / "first"
    assert train_main(TINY + QUIET + ["--total-steps", "128", "--run-dir", str(first)]) == 0
    before = _snapshot(first)
    assert train_main(["--config", str(first / "config.yaml"), "--total-steps", "256"]) == 0
    assert _snapshot(first) == before, "the saved run must not be touched"
    others = [p for p in (tmp_path / "runs").iterdir() if p != first and not p.name.startswith(".")]
    assert len(others) == 1 and _steps(others[0]) == [128, 256]


def test_occupied_run_dir_is_refused_with_one_line(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert train_main(TINY + QUIET + ["--total-steps", "128", "--run-dir", str(run_dir)]) == 0
    before = _snapshot(run_dir)
    capsys.readouterr()
    assert train_main(TINY + QUIET + ["--total-steps", "128", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fastrl: error: run_dir") and "--resume" in err[0], err
    assert _snapshot(run_dir) == before


def test_overwrite_starts_afresh_and_keeps_foreign_files(tmp_path):
    run_dir = tmp_path / "run"
    assert train_main(TINY + QUIET + ["--total-steps", "256", "--run-dir", str(run_dir)]) == 0
    (run_dir / "notes.txt").write_text("mine")
    assert train_main(TINY + QUIET + ["--total-steps", "128", "--run-dir", str(run_dir), "--overwrite", "true"]) == 0
    assert _steps(run_dir) == [128]
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["ckpt_000000000128.pt"]
    assert (run_dir / "notes.txt").read_text() == "mine"


def test_rewind_logs_drops_rows_past_the_step_and_a_torn_line(tmp_path):
    rows = [{"global_step": s, "x": s} for s in (128, 256, 384, 512)]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"global_step": 64')
    assert rewind_logs(tmp_path, 256) == 3
    assert _steps(tmp_path) == [128, 256]
    assert rewind_logs(tmp_path, 256) == 0


def test_resume_after_kill_reads_as_one_run(tmp_path):
    """kill -9 mid-run, resume from the newest checkpoint: metrics.jsonl and TensorBoard hold each step once."""
    run_dir = tmp_path / "run"
    flags = TINY + ["--total-steps", str(128 * 400), "--checkpoint-interval", "4", "--keep-checkpoints", "2",
                    "--wandb", "disabled", "--progress", "false", "--tensorboard", "true", "--run-dir", str(run_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "fastrl.train", *flags], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        ckpts = list_checkpoints(run_dir / "checkpoints")
        if ckpts and (run_dir / "metrics.jsonl").is_file() and max(_steps(run_dir)) >= int(ckpts[-1].stem[5:]) + 256:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ckpt_step = int(list_checkpoints(run_dir / "checkpoints")[-1].stem[5:])
    crashed = _steps(run_dir)
    assert max(crashed) > ckpt_step, "the crash must leave rows past the checkpoint for this test to mean anything"
    total = ckpt_step + 128 * 4
    assert train_main(["--resume", str(run_dir), "--total-steps", str(total), "--progress", "false"]) == 0
    steps = _steps(run_dir)
    assert steps == list(range(128, total + 1, 128)), "each step logged once, in order"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from_step"] == ckpt_step and summary["total_steps"] == total
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(run_dir / "tb")).Reload()
    tb_steps = [e.step for e in events.Scalars("losses/policy_loss")]
    files = sorted(p.name for p in (run_dir / "tb").iterdir())
    assert tb_steps == steps, f"TensorBoard purges the crashed attempt's events past the checkpoint {files} {ckpt_step} {crashed}"


@pytest.mark.parametrize("flag", ["--run-dir", "--config"])
def test_yaml_never_names_the_run_dir(tmp_path, monkeypatch, flag):
    monkeypatch.chdir(tmp_path)
    victim = tmp_path / "victim"
    assert train_main(TINY + QUIET + ["--total-steps", "128", "--run-dir", str(victim)]) == 0
    before = _snapshot(victim)
    yaml_path = tmp_path / "c.yaml"
    yaml_path.write_text(f"run_dir: {victim}\nresume: {victim}\ntotal_steps: 128\nn_envs: 4\n")
    args = ["--config", str(yaml_path)] + QUIET + ["--eval-episodes", "0"]
    if flag == "--run-dir":  # a YAML's run_dir is ignored, the flag decides
        args += ["--run-dir", str(tmp_path / "mine")]
    assert train_main(args) == 0
    assert _snapshot(victim) == before


def test_a_run_dir_it_cannot_create_or_write_is_one_line(tmp_path, monkeypatch):
    """A file where the run directory (or one of its parents) would go, and a directory it may not write, are each
    one line naming --run-dir; a directory it can create is created and locked."""
    from conftest import one_line_error
    from fastrl.config import make_config
    from fastrl.distributed.torchrun import DistInfo
    from fastrl.run import rundir
    (tmp_path / "file").write_text("x")
    for path in (tmp_path / "file", tmp_path / "file" / "run"):
        message = one_line_error(rundir.agree_run_dir, make_config({"run_dir": str(path)}), DistInfo())
        assert f"run_dir {str(path)!r} cannot be created" in message and "--run-dir" in message, message
    fresh = tmp_path / "new" / "run"
    assert rundir.agree_run_dir(make_config({"run_dir": str(fresh)}), DistInfo()) == fresh
    assert (fresh / ".fastrl-lock").read_text().strip() == str(os.getpid())
    rundir.release_run_dir(fresh, discard_unused=True)
    assert not fresh.exists()

    def refuse(path, flags, mode=0o777):
        raise PermissionError(13, "Permission denied")
    with monkeypatch.context() as patched:  # a directory it may not write into (root may write anywhere)
        patched.setattr(rundir.os, "open", refuse)
        message = one_line_error(rundir.agree_run_dir, make_config({"run_dir": str(tmp_path)}), DistInfo())
    assert f"run_dir {str(tmp_path)!r} cannot be created (Permission denied)" in message, message
