"""A user's ``gymnasium.vector.VectorEnv`` through ``fastrl.train(env=...)``: stepped as it is, NEXT_STEP autoreset
(the step after an episode's end is a reset step, ``valid`` False, masked out), episode figures from its episodes."""
import gymnasium
import numpy as np
import pytest
import torch

import fastrl
from conftest import QUIET
from fastrl.config import UserError
from fastrl.envs.batched import BatchedEnv
from fastrl.envs.registry import vector_env_name

QUIET_KW = {"wandb": "disabled", "tensorboard": False, "progress": False, "plot": False, "quiet": True}


class FixedLength(gymnasium.Env):
    """Episodes of exactly ``length`` steps, reward 1 per step; the observation counts the episode's steps, so the
    final observation is ``length``. Ends by termination or, with ``truncate``, by truncation."""
    observation_space = gymnasium.spaces.Box(0.0, 100.0, (1,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, length: int, truncate: bool = False):
        self.length, self.truncate, self.t = length, truncate, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        end = self.t >= self.length
        return np.array([float(self.t)], np.float32), 1.0, end and not self.truncate, end and self.truncate, {}


def fixed_length_pair(**kwargs):
    """Env 0: terminates after 3 steps; env 1: truncated after 4."""
    return gymnasium.vector.SyncVectorEnv([lambda: FixedLength(3), lambda: FixedLength(4, truncate=True)], **kwargs)


def test_reset_steps_are_invalid_and_the_done_step_returns_the_real_final_observation():
    env = BatchedEnv(vector_env_name(fixed_length_pair()), 2, seed=0)
    env.reset()
    steps = [env.step(torch.zeros(2, dtype=torch.long)) for _ in range(10)]
    done = torch.stack([s.done for s in steps])
    valid = torch.stack([s.valid for s in steps])
    # By hand: env 0 plays 3 steps then one reset step (a cycle of 4), env 1 plays 4 then a reset step (5).
    assert done[:, 0].nonzero().flatten().tolist() == [2, 6] and done[:, 1].nonzero().flatten().tolist() == [3, 8]
    assert valid[:, 0].logical_not().nonzero().flatten().tolist() == [3, 7]
    assert valid[:, 1].logical_not().nonzero().flatten().tolist() == [4, 9]
    assert steps[2].terminated[0] and not steps[2].truncated[0] and steps[2].observation[0].item() == 3.0
    assert steps[3].truncated[1] and not steps[3].terminated[1] and steps[3].observation[1].item() == 4.0
    assert steps[3].reward[0].item() == 0.0 and steps[3].observation[0].item() == 0.0  # the reset step
    returns, lengths = env.stats.recent()
    assert sorted(returns.tolist()) == [3.0, 3.0, 4.0, 4.0] and sorted(lengths.tolist()) == [3, 3, 4, 4]


def test_a_sync_vector_env_trains_through_the_api_with_its_episodes_counted_and_reset_steps_masked(tmp_path):
    seen = []

    def record(metrics, run):
        buffer = run.trainer.buffer
        seen.append((buffer["valid"].clone(), buffer["next", "done"].clone()))
        return True

    vector_env = fixed_length_pair()
    run = fastrl.train(env=vector_env, total_steps=32, n_steps=8, run_dir=str(tmp_path / "run"), callbacks=[record],
                       **QUIET_KW)
    # 2 iterations of 8 steps x 2 envs. By hand: env 0 ends episodes at its steps 3, 7, 11, 15 (4 of return 3),
    # env 1 at 4, 9, 14 (3 of return 4).
    assert run.summary["total_steps"] == 32 and run.summary["n_envs_per_rank"] == 2
    assert run.summary["episodes"] == 7 and run.summary["episode_return_mean"] == pytest.approx(24 / 7)
    assert run.summary["eval_return_mean"] is None
    valid = torch.cat([v for v, _ in seen])  # [16, 2], time-major over both rollouts
    done = torch.cat([d for _, d in seen])
    assert torch.equal(valid[1:], ~done[:-1]) and valid[0].all(), "valid is False exactly on the steps after a done"
    # By hand: env 0's reset steps are its steps 4, 8, 12, 16 and env 1's 5, 10, 15.
    assert valid[:, 0].logical_not().nonzero().flatten().tolist() == [3, 7, 11, 15]
    assert valid[:, 1].logical_not().nonzero().flatten().tolist() == [4, 9, 14]
    assert not vector_env.closed, "a vector env object is the caller's to close"
    vector_env.close()
    assert run.agent.observation_shape == (1,)  # its checkpoint loads in this process


def test_a_callable_making_a_vector_env_is_called_once_and_its_env_closed(tmp_path):
    made = []

    def make_cartpoles():
        made.append(gymnasium.vector.SyncVectorEnv([lambda: gymnasium.make("CartPole-v1") for _ in range(4)]))
        return made[-1]

    run = fastrl.train(env=make_cartpoles, total_steps=512, n_steps=32, run_dir=str(tmp_path / "run"), **QUIET_KW)
    assert len(made) == 1 and made[0].closed
    assert run.summary["total_steps"] == 512 and run.summary["n_envs_per_rank"] == 4 and run.summary["episodes"] > 0


@pytest.mark.parametrize("make, overrides, message", [
    (lambda: fixed_length_pair(autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP), {},
     "autoresets in mode SAME_STEP; .*autoreset_mode=gymnasium.vector.AutoresetMode.NEXT_STEP"),
    (lambda: fixed_length_pair(autoreset_mode=gymnasium.vector.AutoresetMode.DISABLED), {}, "mode DISABLED"),
    (fixed_length_pair, {"n_envs": 8}, "n_envs=8 but the vector env holds 2 envs"),
    (fixed_length_pair, {"eval_episodes": 3}, "no separate envs to evaluate on"),
    (lambda: object(), {}, "not a class or function; name a gymnasium.Env subclass or a zero-argument factory"),
])
def test_what_cannot_run_is_one_line(tmp_path, make, overrides, message):
    env = make()
    with pytest.raises(UserError, match=message) as raised:
        fastrl.train(env=env, total_steps=32, n_steps=8, run_dir=str(tmp_path / "run"), **QUIET_KW, **overrides)
    assert "\n" not in str(raised.value)


def test_a_vector_env_name_from_another_process_is_one_line(tmp_path, capsys):
    from fastrl.cli import main
    code = main(["train", "--env", "vector:SyncVectorEnv#7", "--total-steps", "32", "--run-dir", str(tmp_path / "r"),
                 *QUIET])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, lines
    assert "env 'vector:SyncVectorEnv#7' was a vector env object of another process" in lines[0], lines
    assert "pass the vector env itself" in lines[0] and not (tmp_path / "r").exists()


def test_impala_with_a_vector_env_is_one_line(tmp_path):
    vector_env = fixed_length_pair()
    with pytest.raises(UserError, match="cannot rebuild env 'vector:SyncVectorEnv.*', a vector env object"):
        fastrl.train(env=vector_env, algo="impala", total_steps=32, run_dir=str(tmp_path / "run"), **QUIET_KW)
