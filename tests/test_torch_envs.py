"""The torch-native CartPole (env_backend torch): Gymnasium's dynamics step for step, the batched env contract
(auto-reset mask, truncation, statistics) beside EnvPool's, determinism, torch.compile, and the config path. The
rest of the suite: test_torch_classic.py."""
import functools
import math

import gymnasium
import numpy as np
import pytest
import torch
from conftest import one_line_error

from fastrl.config import make_config
from fastrl.envs.batched import BatchedEnv, make_env
from fastrl.envs.registry import resolve_backend
from fastrl.envs.torch_classic import THETA_THRESHOLD, X_THRESHOLD, cartpole_reset
from fastrl.envs.torch_envs import TORCH_ENVS, TorchEnv, env_step

cartpole_step = functools.partial(env_step, TORCH_ENVS["CartPole-v1"])

QUIET = dict(progress=False, tensorboard=False, wandb="disabled", plot=False)
RESET_BOUND = 0.05
BALANCE = torch.tensor([0.0, 0.5, 10.0, 1.0])  # push toward the lean: keeps CartPole-v1 up for all 500 steps


def _no_reset(n):
    """``(elapsed, prev_done, reset_uniform)`` of ``n`` envs mid-episode."""
    return (torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.bool),
            torch.full((n, 4), 0.5, dtype=torch.float64))


def test_one_step_matches_gymnasium():
    """Random states on both sides of the termination bounds, both actions: Gymnasium's CartPole-v1 step from the
    same float64 state gives the same physics (to 1e-12), observation, reward and terminated flag."""
    gen = torch.Generator().manual_seed(0)
    n = 400
    scale = torch.tensor([1.1 * X_THRESHOLD, 2.0, 1.1 * THETA_THRESHOLD, 2.0], dtype=torch.float64)
    physics = (torch.rand(n, 4, dtype=torch.float64, generator=gen) * 2 - 1) * scale
    action = torch.randint(0, 2, (n,), generator=gen)
    new_physics, elapsed, done, obs, reward, terminated, truncated, valid = cartpole_step(
        physics, *_no_reset(n)[:2], action, _no_reset(n)[2], 500)
    assert 0.05 * n < terminated.sum() < 0.95 * n, "the states must fall on both sides of the bounds"
    assert valid.all() and not truncated.any() and torch.equal(done, terminated) and elapsed.eq(1).all()
    env = gymnasium.make("CartPole-v1").unwrapped
    env.reset(seed=0)
    for i in range(n):
        env.state, env.steps_beyond_terminated = physics[i].numpy().copy(), None
        gym_obs, gym_reward, gym_terminated, _, _ = env.step(int(action[i]))
        np.testing.assert_allclose(new_physics[i].numpy(), env.state, rtol=0, atol=1e-12)
        np.testing.assert_allclose(obs[i].numpy(), gym_obs, rtol=1e-6, atol=1e-7)
        assert (bool(terminated[i]), reward[i].item()) == (gym_terminated, gym_reward)
    assert obs.dtype == torch.float32 and reward.dtype == torch.float32 and new_physics.dtype == torch.float64


def test_reset_state_and_time_limit_through_the_pure_step():
    """Resetting envs take the reset draws and ignore their action; the step that reaches max_episode_steps is
    truncated, never terminated, even when the pole falls on it (EnvPool's convention)."""
    torch.testing.assert_close(cartpole_reset(torch.tensor([[0.0, 1.0, 0.5, 0.25]], dtype=torch.float64)),
                               torch.tensor([[-0.05, 0.05, 0.0, -0.025]], dtype=torch.float64), rtol=0, atol=1e-17)
    falling = torch.tensor([0.0, 0.0, THETA_THRESHOLD, 1.0], dtype=torch.float64)  # past the bound after one step
    physics = torch.stack([falling, falling, torch.zeros(4, dtype=torch.float64)])
    elapsed = torch.tensor([3, 4, 4])
    prev_done = torch.tensor([False, False, True])
    uniform = torch.full((3, 4), 0.75, dtype=torch.float64)
    new_physics, elapsed, done, obs, reward, terminated, truncated, valid = cartpole_step(
        physics, elapsed, prev_done, torch.tensor([1, 1, 1]), uniform, 5)
    assert terminated.tolist() == [True, False, False] and truncated.tolist() == [False, True, False]
    assert valid.tolist() == [True, True, False] and reward.tolist() == [1.0, 1.0, 0.0]
    assert done.tolist() == [True, True, False] and elapsed.tolist() == [4, 5, 0]
    assert torch.equal(new_physics[2:], cartpole_reset(uniform[2:]))
    assert torch.equal(obs, new_physics.float())


def _check_contract(env, steps, bounded=True):
    """The step contract over a list of EnvStep: valid is False exactly after a done, reset steps pay 0 and
    return a fresh first observation, valid steps pay 1; returns the lengths of the finished episodes."""
    prev_done = torch.zeros(env.n_envs, dtype=torch.bool)
    length = torch.zeros(env.n_envs, dtype=torch.int64)
    finished = []
    for step in steps:
        assert torch.equal(step.valid, ~prev_done), "valid must be False exactly on the step after a done"
        assert torch.equal(step.done, step.terminated | step.truncated) and not (step.terminated & step.truncated).any()
        assert torch.equal(step.reward, step.valid.float()), "CartPole pays 1 per valid step and 0 on a reset step"
        assert not step.done[~step.valid].any()
        assert (step.observation[~step.valid].abs() <= RESET_BOUND + 1e-6).all()
        length += step.valid
        finished += length[step.done].tolist()
        length[step.done] = 0
        if bounded:
            fallen = (step.observation[:, 0].abs() > X_THRESHOLD) | (step.observation[:, 2].abs() > THETA_THRESHOLD)
            assert torch.equal(step.terminated, fallen & step.valid), "the ending step returns the real final state"
        prev_done = step.done
    return finished


def _balance(obs):
    return (obs.float() @ BALANCE > 0).long()


def _rollout(env, n_steps, policy):
    """Reset ``env``, then step it ``n_steps`` times with ``policy(observation) -> action``; the EnvSteps."""
    obs, steps = env.reset(), []
    for _ in range(n_steps):
        steps.append(env.step(policy(obs)))
        obs = steps[-1].observation
    return steps


def test_600_step_rollout_auto_resets_and_truncates_at_500():
    env = TorchEnv("CartPole-v1", 4, seed=0)
    steps = _rollout(env, 600, _balance)
    assert _check_contract(env, steps) == [500] * 4
    assert steps[499].truncated.all() and not steps[499].terminated.any()
    assert not steps[500].valid.any() and steps[501:] and all(s.valid.all() for s in steps[501:])
    returns, lengths = env.stats.recent()
    assert lengths.tolist() == [500] * 4 and returns.tolist() == [500.0] * 4
    assert env.stats.running_length.tolist() == [99] * 4


@pytest.mark.parametrize("backend", ["torch", "envpool"])
def test_contract_beside_envpool(backend):
    """The same contract checks on both backends: a balanced run truncated at 500, then always pushing left, so
    episodes end by falling (in about 10 steps) and auto-reset alike."""
    env = BatchedEnv("CartPole-v1", 3, seed=5, backend=backend)
    try:
        assert env.backend == backend and env.observation_shape == (4,) and env.observation_dtype == torch.float32
        assert env.action_spec.kind == "discrete" and env.action_spec.n == 2 and env.obs_scale == 1.0
        assert _check_contract(env, _rollout(env, 502, _balance)) == [500] * 3
        lengths = _check_contract(env, _rollout(env, 60, lambda obs: torch.zeros(3, dtype=torch.int64)))
        assert len(lengths) >= 9 and all(8 <= n <= 12 for n in lengths)
    finally:
        env.close()


def test_follows_envpool_from_its_first_state():
    """From EnvPool's first observations (float32, so the states agree to ~1e-9) and one action sequence, the torch
    env tracks EnvPool's trajectory until each env's first episode ends, and ends it on the same step."""
    n = 4
    pool = BatchedEnv("CartPole-v1", n, seed=3, backend="envpool")
    env = TorchEnv("CartPole-v1", n, seed=0)
    try:
        first = pool.reset()
        env.reset()
        env.set_tensor_state((first.double(), torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.bool)))
        gen = torch.Generator().manual_seed(0)
        running = torch.ones(n, dtype=torch.bool)
        for _ in range(200):
            action = torch.randint(0, 2, (n,), generator=gen)
            a, b = pool.step(action), env.step(action)
            torch.testing.assert_close(b.observation[running], a.observation[running], rtol=0, atol=1e-4)
            assert torch.equal(b.done[running], a.done[running]) and torch.equal(b.reward[running], a.reward[running])
            running &= ~a.done
            if not running.any():
                break
        assert not running.any()
    finally:
        pool.close()


def _trajectory(seed, n_steps=60):
    env = TorchEnv("CartPole-v1", 3, seed=seed)
    gen = torch.Generator().manual_seed(0)
    obs = [env.reset()]
    for _ in range(n_steps):
        obs.append(env.step(torch.randint(0, 2, (3,), generator=gen)).observation)
    return torch.stack(obs)


def test_seeding_is_reproducible_and_distinct():
    a, b, c = _trajectory(11), _trajectory(11), _trajectory(12)
    assert torch.equal(a, b), "same seed must give identical trajectories"
    assert not torch.equal(a[0], c[0]), "different seeds must give different first observations"
    assert not torch.equal(a[0, 0], a[0, 1]), "envs of one batch must start differently"


def test_tensor_state_api():
    env = TorchEnv("CartPole-v0", 2, seed=0)
    assert env.max_episode_steps == TORCH_ENVS["CartPole-v0"].max_episode_steps == 200
    env.reset()
    live = env.tensor_state
    saved = tuple(t.clone() for t in live)
    env.step(torch.tensor([0, 1]))
    assert all(a is b for a, b in zip(live, env.tensor_state)), "step() updates the live tensors in place"
    env.set_tensor_state(saved)
    assert all(torch.equal(a, b) for a, b in zip(env.tensor_state, saved))
    assert env.pure_step.keywords == {"max_episode_steps": 200}
    uniform = env.draw_reset_uniform()
    assert uniform.shape == (2, 4) and uniform.dtype == torch.float64 and 0 <= uniform.min() and uniform.max() < 1
    env.close()
    env.close()


def test_compiled_step_matches_eager():
    """torch.compile(fullgraph=True) captures the step whole and replays it bit for bit over 50 steps with resets.
    aot_eager runs the captured graph with eager kernels; inductor's own sin/cos may differ in the last bit."""
    env = TorchEnv("CartPole-v1", 16, seed=0, env_kwargs={"max_episode_steps": 20})
    env.reset()
    torch._dynamo.reset()
    compiled = torch.compile(cartpole_step, fullgraph=True, backend="aot_eager")
    eager_state = compiled_state = env.tensor_state
    gen = torch.Generator().manual_seed(1)
    resets = 0
    for _ in range(50):
        action, uniform = torch.randint(0, 2, (16,), generator=gen), env.draw_reset_uniform()
        eager = cartpole_step(*eager_state, action, uniform, 20)
        comp = compiled(*compiled_state, action, uniform, 20)
        for e, c in zip(eager, comp, strict=True):
            assert e.dtype == c.dtype and torch.equal(c, e)
        eager_state, compiled_state = eager[:3], comp[:3]
        resets += int((~eager[-1]).sum())
    assert resets >= 16, "the run must cover reset steps"


def test_config_builds_the_torch_env_and_trains_one_iteration():
    cfg = make_config(dict(env="CartPole-v1", env_backend="torch", n_envs=4, n_steps=16, compile="off", **QUIET))
    assert resolve_backend("CartPole-v1", "torch") == "torch" and resolve_backend("CartPole-v1") == "envpool"
    env = make_env(cfg)
    assert isinstance(env.env, TorchEnv) and env.reset().shape == (4, 4)
    env.close()
    from fastrl.run.trainer import Trainer
    trainer = Trainer(cfg)
    try:
        before = [p.detach().clone() for p in trainer.agent.parameters()]
        trainer.collect()
        metrics = {key: float(value) for key, value in trainer.update().items()}  # 0-d tensors
        assert trainer.env.env.backend == "torch" and trainer.global_step == 4 * 16
        losses = {"losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl"}
        assert losses <= metrics.keys() and all(math.isfinite(metrics[key]) for key in losses), metrics
        assert metrics["losses/n_updates"] == cfg.n_epochs * cfg.n_minibatches and metrics["losses/nonfinite_updates"] == 0
        assert any(not torch.equal(a, b) for a, b in zip(before, trainer.agent.parameters())), "the update moved nothing"
    finally:
        trainer.env.close()


def test_unsupported_id_or_option_is_one_line_error():
    for build in (functools.partial(BatchedEnv, "LunarLander-v3", 2, 0, "torch"),
                  functools.partial(resolve_backend, "LunarLander-v2", "torch"),
                  functools.partial(make_env, make_config(dict(env="LunarLander-v3", env_backend="torch")))):
        message = one_line_error(build)
        assert all(env_id in message for env_id in TORCH_ENVS) and "env_backend auto" in message
    assert "max_episode_steps" not in one_line_error(TorchEnv, "CartPole-v1", 1, 0, env_kwargs={"x": 1})
    assert "env-mode sync" in one_line_error(make_config, dict(env_backend="torch", env_mode="async"))
