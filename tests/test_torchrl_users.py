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


class ShapeOneOutputs:
    """CartPole whose step returns reward, terminated and truncated as tensors of shape ``[width]`` (width 1: as a
    TorchRL env registered into Gymnasium does)."""
    width = 1

    def __new__(cls):
        import gymnasium

        class Wrapped(gymnasium.Wrapper):
            def step(self, action):
                obs, reward, terminated, truncated, info = self.env.step(action)
                return (obs, torch.full((cls.width,), float(reward)), torch.full((cls.width,), terminated),
                        torch.full((cls.width,), truncated), info)

        return Wrapped(gymnasium.make("CartPole-v1"))


class ShapeTwoOutputs(ShapeOneOutputs):
    width = 2


def _step_some(env_id, n_envs=2, steps=40):
    from fastrl.envs import BatchedEnv
    env = BatchedEnv(env_id, n_envs, seed=0, backend="gymnasium")
    try:
        env.reset()
        return [env.step(torch.zeros(n_envs, dtype=torch.int64)) for _ in range(steps)]
    finally:
        env.close()


def test_env_outputs_of_shape_one_are_squeezed():
    """Always pushing left ends CartPole within 40 steps: rewards come out [N] float32, flags [N] bool, and the
    episode statistics count the episodes (no broadcast error)."""
    from fastrl.envs import env_name
    steps = _step_some(env_name(ShapeOneOutputs))
    assert all(s.reward.shape == (2,) and s.reward.dtype == torch.float32 for s in steps)
    assert all(s.terminated.shape == (2,) and s.terminated.dtype == torch.bool for s in steps)
    assert torch.stack([s.done for s in steps]).any(0).all()
    assert float(torch.stack([s.reward for s in steps]).sum()) > 0


def test_env_outputs_of_another_shape_are_refused_in_one_line():
    from fastrl.envs import env_name
    from tests.conftest import one_line_error
    message = one_line_error(_step_some, env_name(ShapeTwoOutputs))
    assert "ShapeTwoOutputs" in message and "reward of shape (2,)" in message, message
