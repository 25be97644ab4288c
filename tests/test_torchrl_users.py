"""What a TorchRL user does with fastrl: its env's workers under `import torchrl` (spawn), TorchRL envs passed to
fastrl.train, the Collector, agent.policy inside env.rollout, env outputs of shape [1]."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
QUIET_KW = dict(progress=False, tensorboard=False, wandb="disabled", plot=False, quiet=True)


def run_script(tmp_path, source: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``source`` as a script of its own (no ``__main__`` guard unless it has one), importing this checkout."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_env_workers_start_under_torchrl_spawn_without_main_guard(tmp_path):
    """`import torchrl` sets the start method to spawn; fastrl's Gymnasium env workers still start (fastrl picks its
    own context), in a script with no `if __name__ == "__main__":` guard."""
    result = run_script(tmp_path, f"""
        import torchrl
        import multiprocessing
        import fastrl
        assert multiprocessing.get_start_method() == "spawn", multiprocessing.get_start_method()
        run = fastrl.train(env="CartPole-v1", env_backend="gymnasium", n_envs=2, n_steps=16, total_steps=64,
                           eval_episodes=0, run_dir="run", **{QUIET_KW!r})
        print("STEPS", run.summary["total_steps"])
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "STEPS 64" in result.stdout
