"""Envs built wrong end in one line naming the env and what to fix, exit 2, no traceback, and no run dir left."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


@pytest.mark.parametrize("env, expected", [
    ("InitFailsEnv", "could not be built: RuntimeError: licence file not found"),
    ("HugeSpaceEnv", "could not be built: ValueError"),
    ("NoActionEnv", "leaves no action to take"),
    ("NotASpaceEnv", "its observation_space is (4,), not a gymnasium space"),
])
def test_an_env_built_wrong_is_one_line(env, expected, tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "fastrl.train", "--env", f"fastrl_fault_envs:{env}", "--n-envs", "2",
         "--total-steps", "256", "--run-dir", str(run_dir), "--wandb", "disabled", "--progress", "false",
         "--tensorboard", "false", "--plot", "false"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)])})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and f"fastrl_fault_envs:{env}" in lines[0] and expected in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and not run_dir.exists()
