"""What a TorchRL user does with fastrl: its env's workers under `import torchrl` (spawn), TorchRL envs passed to
fastrl.train, the Collector, agent.policy inside env.rollout, env outputs of shape [1]."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import LEARNING_SEEDS, median_of_seeds, one_line_error
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.envs import GymEnv, ParallelEnv, SerialEnv

import fastrl
from fastrl.envs.batched import BatchedEnv
from fastrl.envs.registry import vector_env_name
from fastrl.envs.torchrl_adapter import TorchRLVectorEnv

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


def _outputs_of_width(width: int):
    """CartPole whose step returns reward, terminated and truncated as tensors of shape ``[width]`` (width 1: as a
    TorchRL env registered into Gymnasium does)."""
    import gymnasium

    class Wrapped(gymnasium.Wrapper):
        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            return (obs, torch.full((width,), float(reward)), torch.full((width,), terminated),
                    torch.full((width,), truncated), info)

    return Wrapped(gymnasium.make("CartPole-v1"))


def shape_one_outputs():
    return _outputs_of_width(1)


def shape_two_outputs():
    return _outputs_of_width(2)


def _step_some(env_id, n_envs=2, steps=40):
    from fastrl.envs.batched import BatchedEnv
    env = BatchedEnv(env_id, n_envs, seed=0, backend="gymnasium")
    try:
        env.reset()
        return [env.step(torch.zeros(n_envs, dtype=torch.int64)) for _ in range(steps)]
    finally:
        env.close()


def test_env_outputs_of_shape_one_are_squeezed():
    """Always pushing left ends CartPole within 40 steps: rewards come out [N] float32, flags [N] bool, and the
    episode statistics count the episodes (no broadcast error)."""
    from fastrl.envs.registry import env_name
    steps = _step_some(env_name(shape_one_outputs))
    assert all(s.reward.shape == (2,) and s.reward.dtype == torch.float32 for s in steps)
    assert all(s.terminated.shape == (2,) and s.terminated.dtype == torch.bool for s in steps)
    assert torch.stack([s.done for s in steps]).any(0).all()
    assert float(torch.stack([s.reward for s in steps]).sum()) > 0


def test_a_torchrl_env_registered_into_gymnasium_trains(tmp_path):
    """``GymEnv.register_gym`` makes a Gymnasium env whose rewards and flags are tensors of shape [1]."""
    GymEnv.register_gym("FastrlTestTorchRLCartPole-v0", env_name="CartPole-v1")
    run = fastrl.train(env="FastrlTestTorchRLCartPole-v0", n_envs=2, n_steps=32, total_steps=128, eval_episodes=0,
                       run_dir=str(tmp_path / "r"), **QUIET_KW)
    assert run.summary["total_steps"] == 128 and run.summary["episodes"] >= 2


def test_env_outputs_of_another_shape_are_refused_in_one_line():
    from fastrl.envs.registry import env_name
    message = one_line_error(_step_some, env_name(shape_two_outputs))
    assert "shape_two_outputs" in message and "reward of shape (2,)" in message, message


# --------------------------------------------------------------------------- agent.policy and act in TorchRL
@pytest.fixture(scope="module")
def agents(tmp_path_factory):
    """A discrete (CartPole) and a continuous (Pendulum) agent, both trained with observation normalization."""
    root = tmp_path_factory.mktemp("agents")
    made = {}
    for env in ("CartPole-v1", "Pendulum-v1"):
        run = fastrl.train(env=env, total_steps=128, n_envs=2, n_steps=16, normalize_obs=True, eval_episodes=0,
                           init_log_std=2.0, run_dir=str(root / env), **QUIET_KW)
        made[env] = run.agent
    return made


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_policy_forward_is_the_deterministic_action_of_raw_observations(agents, env):
    """``agent.policy(obs)`` equals ``agent.act(obs)`` (normalizer applied, actions clamped) for a batch and for one
    observation, which differs from the network on unnormalized input (so the normalizer is really applied)."""
    agent = agents[env]
    assert isinstance(agent.policy, torch.nn.Module)
    obs = torch.randn(64, *agent.observation_shape, generator=torch.Generator().manual_seed(0)) * 3
    assert torch.equal(agent.policy(obs), agent.act(obs))
    assert torch.equal(agent.policy(obs[0]), agent.act(obs[0])) and agent.policy(obs[0]).shape == agent.act(obs[0]).shape
    raw = agent.policy.act_deterministic(obs)
    assert not torch.equal(raw, agent.act(obs))
    import io
    saved = io.BytesIO()
    torch.save(agent.policy, saved)  # the module still pickles whole
    saved.seek(0)
    assert torch.equal(torch.load(saved, weights_only=False)(obs), agent.act(obs))


def test_policy_drives_a_torchrl_rollout(agents):
    """``env.rollout`` with the policy in a TensorDictModule on a real TorchRL GymEnv: every action is the agent's."""
    agent = agents["CartPole-v1"]
    env = GymEnv("CartPole-v1", categorical_action_encoding=True)
    env.set_seed(0)
    td = env.rollout(10, TensorDictModule(agent.policy, in_keys=["observation"], out_keys=["action"]))
    env.close()
    assert td.batch_size[0] >= 1 and td["action"].dtype == torch.int64
    assert torch.equal(td["action"], agent.act(td["observation"]))
    assert torch.equal(td["action"], agent.act(td))  # act reads a TensorDict's "observation"


def test_act_takes_a_tensordict_or_says_what_it_takes(agents):
    agent = agents["CartPole-v1"]
    obs = torch.randn(5, 4)
    assert torch.equal(agent.act(TensorDict({"observation": obs}, batch_size=[5])), agent.act(obs))
    message = one_line_error(agent.act, TensorDict({"pixels": obs}, batch_size=[5]))
    assert "'observation' entry" in message and "pixels" in message


# --------------------------------------------------------------------------- TorchRL envs into fastrl
def _cartpole():
    return GymEnv("CartPole-v1")


TORCHRL_ENVS = {
    "unbatched": _cartpole,
    "serial": lambda: SerialEnv(3, _cartpole),
    "parallel": lambda: ParallelEnv(2, _cartpole),
}


@pytest.mark.parametrize("kind", list(TORCHRL_ENVS))
def test_torchrl_env_steps_by_fastrls_contract(kind):
    """Always pushing left ends each CartPole episode within ~8-12 steps. On the step after an episode's end (only
    there) valid is False, the reward 0, the flags False, and the observation a new episode's first (CartPole starts
    within +-0.05); every other step earns 1."""
    torchrl_env = TORCHRL_ENVS[kind]()
    env = BatchedEnv(vector_env_name(TorchRLVectorEnv(torchrl_env)), 1, seed=0)
    try:
        n = env.n_envs
        assert n == {"unbatched": 1, "serial": 3, "parallel": 2}[kind]
        assert env.observation_shape == (4,) and env.action_spec.kind == "discrete" and env.action_spec.n == 2
        first = env.reset()
        assert first.shape == (n, 4) and first.abs().max() <= 0.05
        steps = [env.step(torch.zeros(n, dtype=torch.int64)) for _ in range(40)]
    finally:
        env.close()
        torchrl_env.close()
    done = torch.stack([s.done for s in steps])
    valid = torch.stack([s.valid for s in steps])
    reward = torch.stack([s.reward for s in steps])
    assert done.sum(0).min() >= 2  # every env ended episodes, so reset steps were exercised
    expected_valid = torch.cat([torch.ones(1, n, dtype=torch.bool), ~done[:-1]])
    assert torch.equal(valid, expected_valid)
    assert torch.equal(reward, valid.float())
    assert not done[~valid].any()
    reset_obs = torch.stack([s.observation for s in steps])[~valid]
    assert reset_obs.abs().max() <= 0.05
    lengths = env.stats.recent()[1]
    assert lengths.numel() >= 2 * n and 7 <= lengths.min() and lengths.max() <= 13


def test_batch_locked_torchrl_env_that_cannot_step_a_subset_is_refused():
    import gymnasium
    from torchrl.envs import GymWrapper
    vector = gymnasium.vector.SyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * 2,
                                            autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP)
    torchrl_env = GymWrapper(vector)
    message = one_line_error(TorchRLVectorEnv, torchrl_env)
    assert "batch_size [2]" in message and "ParallelEnv" in message, message
    torchrl_env.close()


def test_a_transformed_serial_env_is_taken():
    from torchrl.envs import StepCounter, TransformedEnv
    torchrl_env = TransformedEnv(SerialEnv(2, _cartpole), StepCounter())
    vector = TorchRLVectorEnv(torchrl_env)
    vector.reset(seed=0)
    steps = [vector.step(np.zeros(2, dtype=np.int64)) for _ in range(30)]
    torchrl_env.close()
    done = np.stack([s[2] | s[3] for s in steps])
    assert done.sum(0).min() >= 2 and vector.num_envs == 2


def test_fastrl_train_takes_a_torchrl_env_and_a_factory_of_one(tmp_path):
    """An instance (n_envs from its batch size, left open: it is the caller's) and a factory (closed after)."""
    serial = SerialEnv(2, _cartpole)
    run = fastrl.train(env=serial, total_steps=64, n_steps=16, run_dir=str(tmp_path / "a"), **QUIET_KW)
    assert run.summary["total_steps"] == 64 and not serial.is_closed
    assert run.agent.act(np.zeros(4, dtype=np.float32)).shape == ()
    assert fastrl.load(run.run_dir, env=serial).observation_shape == (4,)  # env= takes it too
    serial.close()
    made = []

    def factory():
        made.append(SerialEnv(2, _cartpole))
        return made[-1]

    run = fastrl.train(env=factory, total_steps=64, n_steps=16, run_dir=str(tmp_path / "b"), **QUIET_KW)
    assert run.summary["total_steps"] == 64 and len(made) == 1 and made[0].is_closed


@pytest.mark.learning
def test_learns_cartpole_from_a_torchrl_env(tmp_path):
    """PPO on TorchRL's GymEnv("CartPole-v1") (one env): median training return over the seeds >= 45 within 12k
    steps (a random policy gets about 22; each run stops at 60; seeds 1-3 reached 100 here in 6k-10.5k steps)."""
    def run(seed):
        env = GymEnv("CartPole-v1")
        result = fastrl.train(env=env, seed=seed, n_steps=128, n_epochs=10, n_minibatches=4, lr=1e-3, gamma=0.98,
                              gae_lambda=0.8, total_steps=12_288, stop_at_return=60, torch_threads=1, device="cpu",
                              run_dir=str(tmp_path / f"seed{seed}"), **QUIET_KW)
        env.close()
        return result.summary["episode_return_mean"]

    median, by_seed = median_of_seeds(run, LEARNING_SEEDS)
    assert median >= 45, f"median training return {median}; per seed {by_seed}"


# --------------------------------------------------------------------------- rollouts out: Collector, callbacks
def test_collector_gives_the_time_major_buffer_and_torchrls_layout():
    from torchrl.objectives.value import GAE
    with fastrl.Collector("CartPole-v1", n_envs=4, n_steps=32, seed=1) as collector:
        buffer = collector.collect()
        assert tuple(buffer.batch_size) == (32, 4) and buffer["observation"].shape == (32, 4, 4)
        assert (~buffer["valid"]).any() or buffer["next", "done"].sum() == 0  # auto-reset steps follow any end
        td = collector.to_torchrl()
        assert tuple(td.batch_size) == (4, 32) and td["next", "observation"].shape == (4, 32, 4)
        assert torch.equal(td["observation"], buffer["observation"].transpose(0, 1))
        assert torch.equal(td["next", "observation"][:, -1], collector.next_obs)
        GAE(gamma=0.99, lmbda=0.95, value_network=None)(td)
        adv, _ = fastrl.kernels.gae(td["next", "reward"], td["state_value"], td["next", "state_value"],
                                    td["next", "done"], td["next", "terminated"], 0.99, 0.95, time_dim=1)
        torch.testing.assert_close(td["advantage"], adv, rtol=1e-5, atol=1e-5)
        first = buffer["observation"].clone()
        collector.collect()
        assert not torch.equal(collector.buffer["observation"], first)  # a new rollout in the same buffer


def test_collector_acts_with_an_agents_weights_and_takes_a_torchrl_env(agents):
    """With ``agent=``, the buffer's behaviour log-probs are those of the agent's network on the buffer's
    (normalized) observations; a TorchRL env gives n_envs from its batch size."""
    agent = agents["CartPole-v1"]
    serial = SerialEnv(2, _cartpole)
    with fastrl.Collector(serial, agent=agent, n_steps=16) as collector:
        buffer = collector.collect()
        assert tuple(buffer.batch_size) == (16, 2)
        obs = buffer["observation"].flatten(0, 1)
        logp = agent.policy.get_action_and_value(obs, buffer["action"].flatten(0, 1))[1]
        torch.testing.assert_close(logp, buffer["sample_log_prob"].flatten(0, 1), rtol=1e-5, atol=1e-5)
    serial.close()
    message = one_line_error(fastrl.Collector, "Pendulum-v1", agent=agent)
    assert "the agent's own env" in message


def test_callbacks_get_the_agent_wrapper_and_the_live_policy(tmp_path):
    seen = []

    def record(metrics, run):
        seen.append((run.agent, run.policy, run.trainer.buffer.batch_size, run.global_step))

    fastrl.train(env="CartPole-v1", total_steps=64, n_envs=2, n_steps=16, eval_episodes=0, callbacks=[record],
                 run_dir=str(tmp_path / "r"), **QUIET_KW)
    assert len(seen) == 2
    agent, policy, batch_size, step = seen[-1]
    assert isinstance(agent, fastrl.Agent) and agent.act(np.zeros(4, dtype=np.float32)).shape == ()
    assert isinstance(policy, torch.nn.Module) and not isinstance(policy, fastrl.Agent)
    assert tuple(batch_size) == (16, 2) and step == 64
    for a, b in zip(agent.policy.parameters(), policy.parameters()):
        assert torch.equal(a, b)
