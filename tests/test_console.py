"""What a run prints: the run directory at the start and in the final JSON, one note per adjustment, plain progress
lines when stderr is not a terminal (also with --no-progress, not with --quiet), and no third-party warnings."""
import json
import os
import subprocess
import sys
import warnings

import pytest

from conftest import ManualClock
from fastrl.config import make_config
from fastrl.run.console import adjustments
from fastrl.run.logger import ProgressLines, RunLogger


class FakeTrainer:
    def __init__(self, total_steps, steps_per_iteration):
        self.total_steps, self.steps_per_iteration = total_steps, steps_per_iteration


def test_adjustments_name_the_rounded_budget_and_ignored_atari_settings():
    cfg = make_config({"total_steps": 200_000, "frame_stack": 2, "noop_max": 0})
    notes = adjustments(cfg, FakeTrainer(199_680, 1024))
    assert notes == ["total_steps=200,000 runs as 199,680: whole iterations of 1,024 steps (n_envs x n_steps)",
                     "--frame-stack, --noop-max apply to Atari envs only; CartPole-v1 ignores them"]
    assert adjustments(make_config({"total_steps": 2048}), FakeTrainer(2048, 1024)) == []
    atari = make_config({"env": "Breakout-v5", "frame_stack": 2, "total_steps": 1024, "n_envs": 8, "n_steps": 128})
    assert adjustments(atari, FakeTrainer(1024, 1024)) == [], "Atari reads frame_stack"


@pytest.mark.parametrize("progress, quiet, lines", [(True, False, True), (False, False, True), (False, True, False),
                                                    (True, True, False)])
def test_progress_is_plain_lines_when_stderr_is_not_a_terminal(tmp_path, capsys, monkeypatch, progress, quiet, lines):
    import fastrl.run.logger
    clock = ManualClock()
    monkeypatch.setattr(fastrl.run.logger, "time", clock)  # the 2 s throttle reads this clock, not the machine's speed
    logger = RunLogger(tmp_path, {"quiet": quiet}, 4096, tensorboard=False, wandb_mode="disabled", progress=progress)
    clock.now += 1.0
    logger.progress(1024, {"sps": 100, "return": 9.5})
    clock.now += 1.9
    logger.progress(2048, {"sps": 100, "return": 10.0})  # within 2 s of the last line: not shown
    clock.now += 0.2
    logger.progress(3072, {"sps": 100, "return": 10.5})  # 2.1 s after it: shown
    logger.progress(4096, {"sps": 100, "return": 11.25})  # the last step: always shown
    logger.close()
    err = capsys.readouterr().err
    assert "\r" not in err
    if lines:
        assert err.splitlines() == ["fastrl: step 1,024/4,096 (25.0%) sps 100 return 9.5 (1 s)",
                                    "fastrl: step 3,072/4,096 (75.0%) sps 100 return 10.5 (3 s)",
                                    "fastrl: step 4,096/4,096 (100.0%) sps 100 return 11.25 (3 s)"], err
    else:
        assert err == ""


def test_progress_lines_format():
    assert ProgressLines(100).line(50, {"sps": 7, "return": 1.0}).startswith("fastrl: step 50/100 (50.0%) sps 7 return 1 (")


def test_envpool_spaces_are_built_without_warnings():
    """EnvPool builds its Gymnasium spaces lazily; the float64-bounds warning is filtered where they are built."""
    from fastrl.envs.batched import make_env
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = make_env(make_config({"n_envs": 2}))
        env.reset()
        env.close()
    assert not [str(w.message) for w in caught if "precision lowered" in str(w.message)]


def _train(tmp_path, *flags):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}  # third-party warnings must show if any
    env["WANDB_MODE"] = "disabled"
    return subprocess.run([sys.executable, "-m", "fastrl.train", "--total-steps", "3000", "--frame-stack", "2",
                           "--eval-episodes", "2", "--eval-seeds", "1", "--wandb", "disabled", "--tensorboard", "false",
                           "--plot", "false", "--run-dir", str(tmp_path / "run"), *flags],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)


def test_a_piped_run_says_where_it_writes_and_what_it_adjusted(tmp_path):
    proc = _train(tmp_path, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == ("fastrl: ppo on CartPole-v1 with the tuned config ppo/cartpole (the embedded default); flags "
                        "override it")
    lines = lines[1:]
    assert lines[0] == f"fastrl: run directory {tmp_path / 'run'}"
    assert lines[1] == "fastrl: note: total_steps=3,000 runs as 2,048: whole iterations of 1,024 steps (n_envs x n_steps)"
    assert lines[2] == "fastrl: note: --frame-stack applies to Atari envs only; CartPole-v1 ignores it"
    assert lines[3] == ("fastrl: note: stops early once the last-100-episode mean return reaches 475 "
                        "(--stop-at-return 0 trains the whole budget)")  # the tuned CartPole config's stop rule
    assert lines[4].startswith("fastrl: step 1,024/2,048") and lines[-2].startswith("fastrl: step 2,048/2,048")
    assert lines[-1].startswith("fastrl: final evaluation: 2 episodes")
    assert "\r" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["run_dir"] == str(tmp_path / "run")


def test_quiet_prints_only_the_final_json(tmp_path):
    proc = _train(tmp_path, "--quiet")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["total_steps"] == 2048


def test_a_stop_rule_is_announced_and_its_stop_said(tmp_path):
    """15 is under what a random CartPole policy averages (~22), so the first log stops the run: bookkeeping only."""
    proc = _train(tmp_path, "--no-progress", "--stop-at-return", "15")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert ("fastrl: note: stops early once the last-100-episode mean return reaches 15 (--stop-at-return 0 trains "
            "the whole budget)") in lines
    assert "fastrl: stopped at step 1,024: the last-100-episode mean return reached 15 (stop_at_return)" in lines
    assert json.loads(proc.stdout.splitlines()[-1])["total_steps"] == 1024
    (tmp_path / "quiet").mkdir()
    quiet = _train(tmp_path / "quiet", "--quiet", "--stop-at-return", "0")
    assert quiet.returncode == 0 and quiet.stderr == "" and "stops early" not in quiet.stdout
