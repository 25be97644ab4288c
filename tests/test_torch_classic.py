"""The torch-native classic-control suite (env_backend torch) against Gymnasium: one step from 1,000 random and edge
states beside Gymnasium's own env, whole-episode statistics under a random policy, reset distributions, seeding,
the compiled step, and the fused compiled rollout and training on a continuous-action env."""
import math
import warnings

import gymnasium
import numpy as np
import pytest
import torch
from conftest import QUIET, median_of_seeds, train_main

from fastrl.config import make_config
from fastrl.envs.batched import BatchedEnv
from fastrl.envs.registry import resolve_backend
from fastrl.envs.torch_classic import ACROBOT_MAX_VEL_1, ACROBOT_MAX_VEL_2, THETA_THRESHOLD, X_THRESHOLD
from fastrl.envs.torch_envs import TORCH_ENVS, TorchEnv, env_step

ENV_IDS = ["CartPole-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Pendulum-v1"]
N_STATES = 1000


def _uniform(gen, n, low, high):
    return low + (high - low) * torch.rand(n, dtype=torch.float64, generator=gen)


def _pick(gen, n, fraction):
    """A random boolean mask ``[n]`` with about ``fraction`` of it True."""
    return torch.rand(n, generator=gen) < fraction


def _random_states(env_id, n, gen, elapsed):
    """``[n, S]`` float64 states over the whole observation range, with edge cases mixed in: past or near the
    termination bounds and the goal, at the position / velocity bounds, angles beyond one turn. Envs with ``elapsed``
    0 hold what a reset leaves (MountainCarContinuous's float64 reset state, float32 states after that)."""
    if env_id == "CartPole-v1":
        scale = torch.tensor([1.1 * X_THRESHOLD, 2.0, 1.1 * THETA_THRESHOLD, 2.0], dtype=torch.float64)
        return (torch.rand(n, 4, dtype=torch.float64, generator=gen) * 2 - 1) * scale
    if env_id == "Acrobot-v1":
        theta1, theta2 = _uniform(gen, n, -math.pi, math.pi), _uniform(gen, n, -math.pi, math.pi)
        up = _pick(gen, n, 0.3)  # near the goal line -cos(theta1) - cos(theta1 + theta2) = 1
        theta1 = torch.where(up, _uniform(gen, n, 2.0, 2.4) * torch.sign(theta1), theta1)
        theta2 = torch.where(up, _uniform(gen, n, -0.3, 0.3), theta2)
        dtheta1, dtheta2 = _uniform(gen, n, -ACROBOT_MAX_VEL_1, ACROBOT_MAX_VEL_1), _uniform(gen, n, -ACROBOT_MAX_VEL_2,
                                                                                             ACROBOT_MAX_VEL_2)
        slow = _pick(gen, n, 0.4)
        dtheta1, dtheta2 = torch.where(slow, dtheta1 / 10, dtheta1), torch.where(slow, dtheta2 / 10, dtheta2)
        at_bound = _pick(gen, n, 0.1)
        dtheta1 = torch.where(at_bound, ACROBOT_MAX_VEL_1 * torch.sign(dtheta1), dtheta1)
        return torch.stack((theta1, theta2, dtheta1, dtheta2), dim=-1)
    if env_id in ("MountainCar-v0", "MountainCarContinuous-v0"):
        goal = 0.5 if env_id == "MountainCar-v0" else 0.45
        position, velocity = _uniform(gen, n, -1.2, 0.6), _uniform(gen, n, -0.07, 0.07)
        near_goal = _pick(gen, n, 0.3)
        position = torch.where(near_goal, _uniform(gen, n, goal - 0.06, goal + 0.02), position)
        velocity = torch.where(near_goal, _uniform(gen, n, -0.01, 0.07), velocity)
        at_wall = _pick(gen, n, 0.1)
        position = torch.where(at_wall, _uniform(gen, n, -1.2, -1.15), position)
        velocity = torch.where(at_wall, -velocity.abs(), velocity)
        at_bound = _pick(gen, n, 0.05)
        velocity = torch.where(at_bound, 0.07 * torch.sign(velocity), velocity)
        state = torch.stack((position, velocity), dim=-1)
        if env_id == "MountainCarContinuous-v0":
            fresh = torch.stack((_uniform(gen, n, -0.6, -0.4), torch.zeros(n, dtype=torch.float64)), dim=-1)
            state = torch.where((elapsed == 0).unsqueeze(-1), fresh, state.float().double())
        return state
    theta, theta_dot = _uniform(gen, n, -3 * math.pi, 3 * math.pi), _uniform(gen, n, -8.0, 8.0)
    at_bound = _pick(gen, n, 0.1)
    return torch.stack((theta, torch.where(at_bound, 8.0 * torch.sign(theta_dot), theta_dot)), dim=-1)


def _random_actions(spec, n, gen, wide=1.0):
    """``[n]`` int64, or ``[n, 1]`` float32 uniform over ``wide`` times the Box (beyond it: clipped by the step)."""
    if spec.action_spec.kind == "discrete":
        return torch.randint(0, spec.action_spec.n, (n,), generator=gen)
    low, high = spec.action_spec.low[0] * wide, spec.action_spec.high[0] * wide
    return _uniform(gen, n, low, high).float().unsqueeze(-1)


def _time_limit(env):
    while not isinstance(env, gymnasium.wrappers.TimeLimit):
        env = env.env
    return env


def _gym_action(spec, action):
    """The action as ``fastrl.envs.batched.BatchedEnv`` hands it to Gymnasium (a Box action clipped to its bounds)."""
    if spec.action_spec.kind == "discrete":
        return int(action)
    return np.clip(action.numpy(), spec.action_spec.low, spec.action_spec.high).astype(np.float32)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_one_step_matches_gymnasium(env_id):
    """1,000 random states and actions, edge states among them, a fifth of them one step from the time limit:
    Gymnasium's env put in the same state (``gymnasium.make(id).unwrapped.state`` and the TimeLimit's count) takes
    one step beside the torch env. Next observations within 1e-5, rewards float32-equal, the same terminated and
    truncated flags (at the limit: truncated only, EnvPool's convention, where Gymnasium may set both)."""
    spec, n, gen = TORCH_ENVS[env_id], N_STATES, torch.Generator().manual_seed(0)
    limit = spec.max_episode_steps
    elapsed = torch.randint(0, limit - 1, (n,), generator=gen)
    elapsed = torch.where(_pick(gen, n, 0.2), limit - 1, elapsed)
    elapsed = torch.where(_pick(gen, n, 0.1), 0, elapsed)
    physics = _random_states(env_id, n, gen, elapsed)
    action = _random_actions(spec, n, gen, wide=1.5)
    new_physics, new_elapsed, done, obs, reward, terminated, truncated, valid = env_step(
        spec, physics, elapsed, torch.zeros(n, dtype=torch.bool), action, torch.rand(n, spec.reset_draws,
                                                                                     dtype=torch.float64), limit)
    assert valid.all() and torch.equal(new_elapsed, elapsed + 1) and torch.equal(done, terminated | truncated)
    assert obs.dtype == torch.float32 and reward.dtype == torch.float32
    env = gymnasium.make(env_id)
    env.reset(seed=0)
    time_limit, unwrapped = _time_limit(env), env.unwrapped
    gym_terminated, gym_truncated = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the env checker's bounds warnings on edge states
        for i in range(n):
            state = physics[i].numpy().copy()
            if env_id == "MountainCarContinuous-v0" and elapsed[i] > 0:
                state = state.astype(np.float32)  # Gymnasium's state after its first step
            unwrapped.state = state
            if env_id == "CartPole-v1":
                unwrapped.steps_beyond_terminated = None
            time_limit._elapsed_steps = int(elapsed[i])
            gym_obs, gym_reward, term, trunc, _ = env.step(_gym_action(spec, action[i]))
            np.testing.assert_allclose(obs[i].numpy(), gym_obs, rtol=0, atol=1e-5, err_msg=f"state {i}")
            # Stronger than the contract asks: the physics agrees to float64 rounding (here it matches to the bit,
            # Acrobot's RK4 to ~1e-14, where NumPy's and torch's sin/cos differ in the last bit).
            np.testing.assert_allclose(new_physics[i].numpy(), np.asarray(unwrapped.state, dtype=np.float64),
                                       rtol=0, atol=1e-10, err_msg=f"state {i}")
            assert reward[i].item() == np.float32(gym_reward), f"state {i}: {reward[i].item()} != {gym_reward}"
            gym_terminated.append(term and not trunc)
            gym_truncated.append(trunc)
    assert terminated.tolist() == gym_terminated and truncated.tolist() == gym_truncated
    assert truncated.any() and not truncated.all()
    if env_id != "Pendulum-v1":  # it never terminates
        assert 0.02 * n < terminated.sum() < 0.9 * n, "the states must fall on both sides of the termination rule"


def _torch_episodes(env_id, n_episodes, seed):
    """Each of ``n_episodes`` envs plays its first episode under uniform random actions: ``(lengths, returns)``."""
    env = TorchEnv(env_id, n_episodes, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    env.reset()
    running = torch.ones(n_episodes, dtype=torch.bool)
    lengths = torch.zeros(n_episodes)
    returns = torch.zeros(n_episodes, dtype=torch.float64)
    for _ in range(env.max_episode_steps):
        step = env.step(_random_actions(env.spec, n_episodes, gen))
        lengths += running
        returns += step.reward.double() * running
        running &= ~step.done
    assert not running.any()
    return lengths.numpy(), returns.numpy()


def _gym_episodes(env_id, n_episodes, seed):
    env = gymnasium.make(env_id)
    env.action_space.seed(seed)
    lengths, returns = [], []
    for episode in range(n_episodes):
        env.reset(seed=seed + episode)
        length, total, done = 0, 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            length, total, done = length + 1, total + float(np.float32(reward)), terminated or truncated
        lengths.append(length)
        returns.append(total)
    return np.array(lengths, dtype=np.float64), np.array(returns)


def _same_mean(a, b, sigmas=5.0):
    """Two-sample z-test: the means of ``a`` and ``b`` agree within ``sigmas`` standard errors (exactly, where
    both samples are constant)."""
    se = math.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)
    return abs(a.mean() - b.mean()) <= sigmas * se + 1e-9 * max(1.0, abs(b.mean()))


# Gymnasium's side plays fewer episodes where its Python step is slow (Acrobot's RK4) or its episodes long.
GYM_EPISODES = {"CartPole-v1": 1000, "Acrobot-v1": 60, "MountainCar-v0": 300, "MountainCarContinuous-v0": 40,
                "Pendulum-v1": 300}


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_random_policy_episode_statistics_match_gymnasium(env_id):
    """1,000 torch episodes under a uniform random policy against Gymnasium's (as many where its step is fast, fewer
    where it is slow): mean episode length and mean return agree within 5 standard errors."""
    lengths, returns = _torch_episodes(env_id, 1000, seed=1)
    gym_lengths, gym_returns = _gym_episodes(env_id, GYM_EPISODES[env_id], seed=2)
    message = (f"torch length {lengths.mean():.2f} return {returns.mean():.2f}, gymnasium length "
               f"{gym_lengths.mean():.2f} return {gym_returns.mean():.2f}")
    assert _same_mean(lengths, gym_lengths) and _same_mean(returns, gym_returns), message
    assert lengths.max() <= TORCH_ENVS[env_id].max_episode_steps


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_reset_distribution_matches_gymnasium(env_id):
    """First observations of 2,000 torch envs against 2,000 Gymnasium resets: per entry the same range (min and max
    within 2% of the width) and mean (5 standard errors)."""
    n = 2000
    first = TorchEnv(env_id, n, seed=0).reset().double().numpy()
    env = gymnasium.make(env_id)
    gym_first = np.stack([env.reset(seed=i)[0] for i in range(n)]).astype(np.float64)
    assert first.shape == gym_first.shape
    for column, gym_column in zip(first.T, gym_first.T, strict=True):
        slack = 0.02 * (gym_column.max() - gym_column.min()) + 1e-7
        assert abs(column.min() - gym_column.min()) <= slack and abs(column.max() - gym_column.max()) <= slack
        assert _same_mean(column, gym_column)


def _trajectory(env_id, seed, n_steps=40):
    env = TorchEnv(env_id, 3, seed=seed, env_kwargs={"max_episode_steps": 15})
    gen = torch.Generator().manual_seed(0)
    obs = [env.reset()]
    for _ in range(n_steps):
        obs.append(env.step(_random_actions(env.spec, 3, gen)).observation)
    return torch.stack(obs)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_seeding_is_reproducible_and_distinct(env_id):
    a, b, c = _trajectory(env_id, 11), _trajectory(env_id, 11), _trajectory(env_id, 12)
    assert torch.equal(a, b), "same seed must give identical trajectories, resets included"
    assert not torch.equal(a[0], c[0]), "different seeds must give different first observations"
    assert not torch.equal(a[0, 0], a[0, 1]), "envs of one batch must start differently"


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_compiled_step_matches_eager(env_id):
    """torch.compile(fullgraph=True) captures the step whole (continuous actions' clipping included) and replays it
    bit for bit over 30 steps with resets (aot_eager: the captured graph with eager kernels)."""
    env = TorchEnv(env_id, 16, seed=0, env_kwargs={"max_episode_steps": 10})
    env.reset()
    torch._dynamo.reset()
    compiled = torch.compile(env.pure_step, fullgraph=True, backend="aot_eager")
    eager_state = compiled_state = env.tensor_state
    gen = torch.Generator().manual_seed(1)
    resets = 0
    for _ in range(30):
        action, uniform = _random_actions(env.spec, 16, gen, wide=1.5), env.draw_reset_uniform()
        eager = env.pure_step(*eager_state, action, uniform)
        comp = compiled(*compiled_state, action, uniform)
        for e, c in zip(eager, comp, strict=True):
            assert e.dtype == c.dtype and torch.equal(c, e)
        eager_state, compiled_state = eager[:3], comp[:3]
        resets += int((~eager[-1]).sum())
    assert resets >= 32, "the run must cover reset steps"


@pytest.mark.parametrize("env_id", ["Acrobot-v1", "Pendulum-v1"])
def test_member_blocks_replay_their_single_runs(env_id):
    """A population's env (K = 2 blocks of n): member m's block steps as the single run seeded ``seed + m * n``,
    resets included."""
    n, gen = 3, torch.Generator().manual_seed(0)
    population = TorchEnv(env_id, 2 * n, seed=5, n_members=2, env_kwargs={"max_episode_steps": 8})
    singles = [TorchEnv(env_id, n, seed=5 + m * n, env_kwargs={"max_episode_steps": 8}) for m in range(2)]
    assert torch.equal(population.reset(), torch.cat([single.reset() for single in singles]))
    for _ in range(20):
        action = _random_actions(population.spec, 2 * n, gen)
        step = population.step(action)
        single_steps = [single.step(part) for single, part in zip(singles, action.chunk(2), strict=True)]
        for field in ("observation", "reward", "terminated", "truncated", "valid"):
            assert torch.equal(getattr(step, field), torch.cat([getattr(s, field) for s in single_steps])), field
    assert population.stats.count == 2 * 2 * n, "every env must have finished two episodes (and reset in between)"


def test_backend_selection_and_spaces():
    """``env_backend torch`` takes every id of the suite, ``auto`` keeps EnvPool for them; each torch env describes
    its observations and actions (Box bounds included) as the Gymnasium backend describes Gymnasium's env."""
    for env_id in ENV_IDS + ["CartPole-v0"]:
        assert resolve_backend(env_id, "torch") == "torch" and resolve_backend(env_id) == "envpool"
        torch_env, gym_env = BatchedEnv(env_id, 1, 0, "torch"), BatchedEnv(env_id, 1, 0, "gymnasium")
        assert isinstance(torch_env, TorchEnv) and torch_env.action_spec == gym_env.action_spec
        assert tuple(torch_env.observation_shape) == tuple(gym_env.observation_shape)
        assert torch_env.observation_dtype == gym_env.observation_dtype == torch.float32
        gym_env.close()
    assert set(TORCH_ENVS) == set(ENV_IDS) | {"CartPole-v0", "CartPoleNoVel-v1"}  # the last: tests/test_recurrent.py


def test_train_command_on_a_continuous_torch_env(tmp_path):
    """``fastrl train --env Pendulum-v1 --env-backend torch``: a tiny run (gSDE, the tuned config) finishes and
    records finite returns."""
    import json
    run_dir = tmp_path / "run"
    code = train_main(["--env", "Pendulum-v1", "--env-backend", "torch", "--total-steps", "4096", "--n-epochs", "1",
                       "--eval-seeds", "2", "--run-dir", str(run_dir), *QUIET])
    assert code == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["episodes"] > 0 and -2000 < summary["episode_return_mean"] < 0
    assert -2000 < summary["eval_return_mean"] < 0


def _gymnasium_returns(agent, env_id, episodes, seed):
    """Returns of ``agent``'s deterministic policy on Gymnasium's own env (``gymnasium.make``), episode by episode."""
    env = gymnasium.make(env_id)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(agent.act(obs))
            total, done = total + reward, terminated or truncated
        returns.append(total)
    return np.array(returns)


@pytest.mark.learning
def test_policy_trained_on_the_torch_env_scores_alike_on_gymnasium(tmp_path):
    """The default CartPole-v1 run on env_backend torch, then its policy on the torch env and on Gymnasium's: the
    median of seeds scores >= 400 on both (a random policy: ~22), within 100 of each other."""
    import fastrl

    def run(seed):
        agent = fastrl.train("CartPole-v1", env_backend="torch", seed=seed, run_dir=str(tmp_path / str(seed)),
                             eval_seeds=1, progress=False, tensorboard=False, wandb="disabled", plot=False,
                             quiet=True).agent
        on_torch = agent.evaluate(episodes=5).mean()
        on_gymnasium = _gymnasium_returns(agent, "CartPole-v1", 5, seed=100 * seed).mean()
        return {"torch": on_torch, "gymnasium": on_gymnasium, "gap": abs(on_torch - on_gymnasium)}

    median, values = median_of_seeds(run)
    assert median["torch"] >= 400 and median["gymnasium"] >= 400 and median["gap"] <= 100, values
