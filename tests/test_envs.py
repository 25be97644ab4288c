"""The batched env contract (EnvPool and the Gymnasium fallback): step outputs, auto-reset mask,
episode statistics, time-limit truncation, seeding, unknown ids and the normalizing wrapper."""
import pytest
import torch

from fastrl.config import UserError, make_config
from fastrl.distributed.seeding import env_seed
from fastrl.envs.batched import BatchedEnv, NormalizedEnv, make_env
from fastrl.envs.registry import OBSERVATION_SUBSETS, envpool_ids, gymnasium_ids, resolve_backend
from fastrl.envs.stats import EpisodeStats

BACKENDS = ["envpool", "gymnasium"]
CARTPOLE_RESET_BOUND = 0.05  # CartPole's first observation is uniform in [-0.05, 0.05]^4
CARTPOLE_THETA_LIMIT = 12 * 2 * 3.141592653589793 / 360
CARTPOLE_X_LIMIT = 2.4


def _rollout(env, actions):
    """Step ``env`` with each row of ``actions``; return the list of EnvStep."""
    return [env.step(a) for a in actions]


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def test_step_types_and_shapes(backend):
    env = BatchedEnv("CartPole-v1", 3, seed=0, backend=backend)
    try:
        assert env.backend == backend
        obs = env.reset()
        assert obs.shape == (3, 4) and obs.dtype == torch.float32
        assert env.observation_shape == (4,) and env.observation_dtype == torch.float32
        assert env.action_spec.kind == "discrete" and env.action_spec.n == 2
        step = env.step(torch.zeros(3, dtype=torch.int64))
        assert step.observation.shape == (3, 4) and step.observation.dtype == torch.float32
        assert step.reward.shape == (3,) and step.reward.dtype == torch.float32
        for flag in (step.terminated, step.truncated, step.valid, step.done):
            assert flag.shape == (3,) and flag.dtype == torch.bool
        assert step.valid.all()
        torch.testing.assert_close(step.done, step.terminated | step.truncated)
    finally:
        env.close()


def test_constant_action_auto_reset_and_episode_stats(backend):
    """Always pushing left ends CartPole episodes in ~8-12 steps. Check, step by step, that:
    valid is False exactly on the step after an episode ends, that step pays 0 and returns a fresh first
    observation, the ending step returns the real final observation, and EpisodeStats' lengths/returns
    equal a manual count of valid steps per env (reset steps excluded)."""
    n_envs, n_steps = 4, 60
    env = BatchedEnv("CartPole-v1", n_envs, seed=3, backend=backend)
    try:
        env.reset()
        prev_done = torch.zeros(n_envs, dtype=torch.bool)
        manual_len = [0] * n_envs
        manual_ret = [0.0] * n_envs
        finished_len = [[] for _ in range(n_envs)]
        finished_ret = [[] for _ in range(n_envs)]
        order = []  # (env, length, return) in the order EpisodeStats should record them
        for _ in range(n_steps):
            step = env.step(torch.zeros(n_envs, dtype=torch.int64))
            assert torch.equal(step.valid, ~prev_done), "valid must be False exactly on the step after a done"
            for i in range(n_envs):
                if not step.valid[i]:
                    assert step.reward[i].item() == 0.0
                    assert not step.done[i]
                    assert step.observation[i].abs().max().item() <= CARTPOLE_RESET_BOUND + 1e-6, \
                        "the reset step must return the new episode's first observation"
                    continue
                manual_len[i] += 1
                manual_ret[i] += step.reward[i].item()
                if step.done[i]:
                    x, theta = step.observation[i, 0].item(), step.observation[i, 2].item()
                    assert step.terminated[i] and not step.truncated[i]
                    assert abs(theta) > CARTPOLE_THETA_LIMIT or abs(x) > CARTPOLE_X_LIMIT, \
                        "the ending step must return the real final observation"
                    finished_len[i].append(manual_len[i])
                    finished_ret[i].append(manual_ret[i])
                    order.append((i, manual_len[i], manual_ret[i]))
                    manual_len[i], manual_ret[i] = 0, 0.0
            prev_done = step.done.clone()
        assert all(len(x) >= 3 for x in finished_len), "each env should finish several episodes in 60 steps"
        assert all(8 <= n <= 12 for lens in finished_len for n in lens)
        returns, lengths = env.stats.recent()
        assert env.stats.count == len(order)
        # order within one step is by env index, and steps are chronological
        assert lengths.tolist() == [n for _, n, _ in order]
        assert returns.tolist() == pytest.approx([r for _, _, r in order])
        assert returns.tolist() == pytest.approx(lengths.double().tolist())  # CartPole pays 1 per step
        torch.testing.assert_close(env.stats.running_length, torch.tensor(manual_len))
        summary = env.stats.summary()
        assert summary["episodes"] == len(order)
        assert summary["episode_length_mean"] == pytest.approx(sum(n for _, n, _ in order) / len(order))
    finally:
        env.close()


def test_time_limit_truncation(backend):
    """A time limit of 5 with alternating actions (so the pole never falls): truncated at step 5,
    length 5 recorded, the next step is a reset step, then a second episode of 5."""
    env = BatchedEnv("CartPole-v1", 2, seed=0, backend=backend, env_kwargs={"max_episode_steps": 5})
    try:
        env.reset()
        steps = _rollout(env, [torch.full((2,), t % 2, dtype=torch.int64) for t in range(12)])
        for t in range(4):
            assert not steps[t].done.any() and steps[t].valid.all()
        assert steps[4].truncated.all() and not steps[4].terminated.any() and steps[4].valid.all()
        assert steps[4].reward.tolist() == [1.0, 1.0]
        assert not steps[5].valid.any() and steps[5].reward.tolist() == [0.0, 0.0]
        assert steps[5].observation.abs().max().item() <= CARTPOLE_RESET_BOUND + 1e-6
        assert all(steps[t].valid.all() and not steps[t].done.any() for t in range(6, 10))
        assert steps[10].truncated.all() and not steps[11].valid.any()
        returns, lengths = env.stats.recent()
        assert lengths.tolist() == [5, 5, 5, 5]
        assert returns.tolist() == [5.0, 5.0, 5.0, 5.0]
    finally:
        env.close()


def _trajectory(seed, backend="envpool", n_envs=3, n_steps=40):
    env = BatchedEnv("CartPole-v1", n_envs, seed=seed, backend=backend)
    gen = torch.Generator().manual_seed(0)
    try:
        obs = [env.reset()]
        for _ in range(n_steps):
            obs.append(env.step(torch.randint(0, 2, (n_envs,), generator=gen)).observation)
        return torch.stack(obs)
    finally:
        env.close()


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_seeding_is_reproducible_and_distinct(backend_name):
    a, b, c = (_trajectory(s, backend_name) for s in (11, 11, 12))
    assert torch.equal(a, b), "same seed must give identical observation trajectories"
    assert not torch.equal(a[0], c[0]), "different seeds must give different first observations"
    assert not torch.equal(a[0, 0], a[0, 1]), "envs of one batch must be seeded differently"


def test_run_seed_derives_env_seeds():
    cfgs = [make_config({"seed": s, "n_envs": 2}) for s in (1, 1, 2)]
    seeds = [env_seed(c.seed, 0, c.n_envs) for c in cfgs]
    assert seeds[0] == seeds[1] != seeds[2]
    assert env_seed(1, 0, 8) != env_seed(1, 1, 8), "ranks get distinct env seeds"
    first = []
    for cfg, s in zip(cfgs, seeds):
        env = make_env(cfg, seed=s)
        first.append(env.reset())
        env.close()
    assert torch.equal(first[0], first[1]) and not torch.equal(first[0], first[2])


@pytest.mark.parametrize("backend_name", ["auto", "envpool", "gymnasium"])
def test_unknown_env_id_suggests_closest(backend_name):
    with pytest.raises(UserError) as info:
        BatchedEnv("CartPole-v9", 1, seed=0, backend=backend_name)
    message = str(info.value)
    assert "\n" not in message
    assert "CartPole-v9" in message and "CartPole-v1" in message


def test_resolve_backend():
    assert resolve_backend("CartPole-v1") == "envpool"  # both know it: EnvPool first
    assert resolve_backend("CartPole-v1", "gymnasium") == "gymnasium"
    assert resolve_backend("CartPoleNoVel-v1") == "envpool"  # EnvPool's CartPole-v1, two of its entries
    gymnasium_only = sorted(gymnasium_ids() - envpool_ids() - set(OBSERVATION_SUBSETS))
    assert gymnasium_only, "no Gymnasium-only id to test the fallback with"
    for env_id in gymnasium_only:
        assert resolve_backend(env_id) == "gymnasium", f"{env_id} must fall back to Gymnasium under auto"
    with pytest.raises(UserError, match="envpool"):
        resolve_backend(gymnasium_only[0], "envpool")
    with pytest.raises(UserError):
        resolve_backend("NoSuchEnv-v0")


def test_episode_stats_excludes_reset_steps_and_keeps_a_window():
    stats = EpisodeStats(2, window=3)
    T, F = True, False
    # env0: 2 valid steps, done; reset step; 1 valid step, done.  env1: 3 valid steps, done.
    rows = [  # reward, done, valid
        ([1.0, 2.0], [F, F], [T, T]),
        ([1.0, 2.0], [T, F], [T, T]),
        ([5.0, 2.0], [F, T], [F, T]),  # env0's reset step pays 5 here to prove it is ignored
        ([1.0, 7.0], [T, F], [T, F]),
    ]
    for reward, done, valid in rows:
        stats.update(torch.tensor(reward), torch.tensor(done), torch.tensor(valid))
    returns, lengths = stats.recent()
    assert returns.tolist() == [2.0, 6.0, 1.0] and lengths.tolist() == [2, 3, 1]
    assert stats.running_length.tolist() == [0, 0] and stats.running_return.tolist() == [0.0, 0.0]
    stats.update(torch.tensor([1.0, 1.0]), torch.tensor([T, T]), torch.tensor([F, T]))  # window wraps
    returns, lengths = stats.recent()
    assert stats.count == 5 and sorted(lengths.tolist()) == [0, 1, 1]
    restored = EpisodeStats(2, window=3)
    restored.load_state_dict(stats.state_dict())
    assert restored.count == 5 and torch.equal(restored.recent()[0], stats.recent()[0])


def test_normalized_env_obs_and_reward():
    raw = BatchedEnv("CartPole-v1", 8, seed=0)
    env = NormalizedEnv(raw, normalize_obs=True, normalize_reward=True, gamma=0.99, obs_clip=5.0, reward_clip=10.0)
    gen = torch.Generator().manual_seed(0)
    try:
        env.reset()
        rewards, observations = [], []
        for _ in range(200):
            step = env.step(torch.randint(0, 2, (8,), generator=gen))
            rewards.append(step.reward)
            observations.append(step.observation)
        obs = torch.stack(observations)
        assert obs.abs().max() <= 5.0
        assert obs.reshape(-1, 4).mean(0).abs().max() < 0.5  # roughly standardized
        rewards = torch.stack(rewards)
        assert rewards.abs().max() <= 10.0  # reward_clip
        # after warm-up the return std is well above 1, so a raw reward of 1 is scaled down, uniformly
        late = rewards[100:][rewards[100:] != 0]
        assert (late < 1.0).all()
        expected = 1.0 / torch.sqrt(env.return_stats.var[0] + 1e-8)
        torch.testing.assert_close(rewards[-1][rewards[-1] != 0], expected.float().expand(int((rewards[-1] != 0).sum())),
                                   rtol=0.05, atol=0.0)
        # raw episode statistics are those of the unnormalized env
        returns, lengths = env.stats.recent()
        assert returns.tolist() == pytest.approx(lengths.double().tolist())
        state = env.state_dict()
        frozen = NormalizedEnv(BatchedEnv("CartPole-v1", 8, seed=0), True, True, 0.99, training=False)
        frozen.load_state_dict(state)
        before = frozen.state_dict()
        frozen.reset()
        out = frozen.step(torch.zeros(8, dtype=torch.int64))
        assert out.reward.tolist() == [1.0] * 8, "training=False leaves rewards unscaled"
        for key in ("mean", "var", "count"):
            torch.testing.assert_close(frozen.state_dict()["obs_rms"][key], before["obs_rms"][key])
            torch.testing.assert_close(before["obs_rms"][key], state["obs_rms"][key])
        frozen.close()
    finally:
        env.close()


def test_continuous_action_spec_and_clipping():
    """An action out of bounds is clipped to them, not an error: the same seed stepped with +-100 and with the bounds
    +-2 gives the same rewards (Pendulum's cost has a 0.001 u^2 term) and observations."""
    env, bounded = BatchedEnv("Pendulum-v1", 2, seed=0), BatchedEnv("Pendulum-v1", 2, seed=0)
    try:
        assert env.action_spec.kind == "continuous" and env.action_spec.shape == (1,)
        assert env.action_spec.low == (-2.0,) and env.action_spec.high == (2.0,)
        assert torch.equal(env.reset(), bounded.reset())
        for _ in range(3):
            step = env.step(torch.tensor([[100.0], [-100.0]]))
            want = bounded.step(torch.tensor([[2.0], [-2.0]]))
            assert step.reward.shape == (2,) and torch.equal(step.reward, want.reward), (step.reward, want.reward)
            assert torch.equal(step.observation, want.observation)
    finally:
        env.close()
        bounded.close()


def test_reward_scaling_survives_all_envs_resetting_together():
    """All envs truncating on the same step leaves no valid reward on the next step: the statistics must
    skip it instead of turning NaN (which would poison every later reward)."""
    import torch
    from fastrl.envs.batched import BatchedEnv, NormalizedEnv
    env = NormalizedEnv(BatchedEnv("CartPole-v1", 3, seed=0, env_kwargs={"max_episode_steps": 4}),
                        normalize_obs=True, normalize_reward=True, gamma=0.99)
    env.reset()
    rewards = []
    for t in range(12):
        step = env.step(torch.tensor([t % 2] * 3))
        rewards.append(step.reward)
        assert torch.isfinite(step.observation).all()
    assert torch.isfinite(torch.stack(rewards)).all()
    assert torch.isfinite(env.return_stats.var).all() and torch.isfinite(env.return_stats.mean).all()
    env.close()


def test_unsupported_spaces_are_user_errors():
    import gymnasium
    import pytest
    from fastrl.config import UserError
    from fastrl.envs.batched import BatchedEnv
    from fastrl.envs.spaces import action_spec_of
    with pytest.raises(UserError, match="action space .* is not supported"):
        action_spec_of(gymnasium.spaces.MultiDiscrete([[2, 3], [2, 2]]))  # 2-D: flatten it first
    with pytest.raises(UserError, match="action space .* is not supported"):
        action_spec_of(gymnasium.spaces.MultiDiscrete([2, 3], start=[1, 0]))
    with pytest.raises(UserError, match="action space .* is not supported"):
        action_spec_of(gymnasium.spaces.Text(5))
    assert action_spec_of(gymnasium.spaces.MultiDiscrete([2, 3])).nvec == (2, 3)
    assert action_spec_of(gymnasium.spaces.MultiBinary(4)).nvec == (2, 2, 2, 2)
    # Gymnasium's Blackjack observes a Tuple: refused with a one-line error, not a crash.
    with pytest.raises(UserError, match="observation space Tuple"):
        BatchedEnv("Blackjack-v1", 2, seed=0, backend="gymnasium")


def test_envpool_loads_without_importing_jax():
    """EnvPool imports JAX for an XLA interface fastrl never uses (about 1.5 s where JAX is installed); fastrl loads
    it with JAX kept out, and JAX still imports normally afterwards."""
    import importlib.util
    import subprocess
    import sys
    code = ("import sys; from fastrl.envs.registry import envpool_ids; assert 'CartPole-v1' in envpool_ids(); "
            "print('jax' in sys.modules); import importlib.util; "
            "print(importlib.util.find_spec('jax') is None or __import__('jax') is not None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True"], out.stdout
    assert importlib.util.find_spec("envpool") is not None


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("n_envs", [1, 3])
def test_time_feature_counts_down_the_time_limit_and_restarts_after_every_episode_end(backend_name, n_envs):
    """The last observation entry is 1 - t / max_episode_steps, t the steps taken in the episode: 1.0 on a first
    observation, 0.0 where the limit (20 here, the override, not CartPole's 500) truncates, 1.0 again on the reset
    step; an episode that terminates early restarts the count too. The env's own entries are untouched."""
    plain = BatchedEnv("CartPole-v1", n_envs, seed=3, backend=backend_name, env_kwargs={"max_episode_steps": 20})
    timed = BatchedEnv("CartPole-v1", n_envs, seed=3, backend=backend_name, env_kwargs={"max_episode_steps": 20},
                       time_feature=True)
    try:
        assert timed.observation_shape == (5,) and plain.observation_shape == (4,)
        first = timed.reset()
        assert first.shape == (n_envs, 5) and first.dtype == torch.float32
        torch.testing.assert_close(first[:, :4], plain.reset())
        assert first[:, 4].tolist() == [1.0] * n_envs
        steps_taken = torch.zeros(n_envs, dtype=torch.int64)
        # Alternating actions keep the pole up (truncation at 20); a run of pushes one way ends episodes early.
        actions = [t % 2 for t in range(42)] + [0] * 30
        seen_truncation = seen_termination = False
        for action in actions:
            batch = torch.full((n_envs,), action, dtype=torch.int64)
            step, reference = timed.step(batch), plain.step(batch)
            torch.testing.assert_close(step.observation[:, :4], reference.observation)
            assert torch.equal(step.valid, reference.valid) and torch.equal(step.done, reference.done)
            steps_taken = torch.where(step.valid, steps_taken + 1, torch.zeros_like(steps_taken))
            torch.testing.assert_close(step.observation[:, 4], 1.0 - steps_taken.float() / 20)
            seen_truncation |= bool(step.truncated.any())
            seen_termination |= bool(step.terminated.any())
            assert (step.observation[step.truncated, 4] == 0.0).all()
            assert (step.observation[~step.valid, 4] == 1.0).all()
        assert seen_truncation and seen_termination
        assert timed.step(torch.zeros(n_envs, dtype=torch.int64)).observation.shape == (n_envs, 5)
    finally:
        timed.close()
        plain.close()


def test_time_feature_reads_each_backends_own_time_limit():
    """Pendulum's 200-step limit, from EnvPool's spec and from Gymnasium's registration."""
    for backend_name in BACKENDS:
        env = BatchedEnv("Pendulum-v1", 2, seed=0, backend=backend_name, time_feature=True)
        try:
            assert env.observation_shape == (4,)
            env.reset()
            step = env.step(torch.zeros(2, 1))
            torch.testing.assert_close(step.observation[:, 3], torch.full((2,), 1.0 - 1 / 200))
        finally:
            env.close()


def test_time_feature_refusals_are_one_line_user_errors():
    from fastrl.envs.batched import probe_env
    with pytest.raises(UserError, match="time_feature does not apply with env_mode=async.*--env-mode sync"):
        make_config(dict(time_feature=True, env_mode="async"))
    with pytest.raises(UserError, match="time_feature does not apply with env_backend torch"):
        make_config(dict(time_feature=True, env_backend="torch"))
    with pytest.raises(UserError, match="time_feature does not apply to 'Pong-v5': its observations are images"):
        probe_env(make_config(dict(env="Pong-v5", time_feature=True)))
    assert probe_env(make_config(dict(env="Pendulum-v1", time_feature=True)))[0] == (4,)
    assert probe_env(make_config(dict(env="Pendulum-v1")))[0] == (3,)


def _running_mean_std_update(rms: dict, x: torch.Tensor) -> None:
    """One run's running mean and variance over the batch dimension (Chan et al. parallel update), float64."""
    if x.shape[0] == 0:  # e.g. every env on its reset step: nothing to learn, and no NaN from an empty mean
        return
    x = x.double()
    batch_mean, batch_var, n = x.mean(0), x.var(0, unbiased=False), x.shape[0]
    delta = batch_mean - rms["mean"]
    total = rms["count"] + n
    rms["mean"] = rms["mean"] + delta * n / total
    rms["var"] = (rms["var"] * rms["count"] + batch_var * n + delta.square() * rms["count"] * n / total) / total
    rms["count"] = total


def test_member_statistics_match_one_running_mean_std_per_member():
    """The normalizer's vectorized statistics (every member at once, reset rows masked) against its loop twin: one
    running mean and variance per member, updated with that member's kept rows; a member with no kept row stays as it
    was."""
    from fastrl.envs.stats import MemberRunningMeanStd
    gen = torch.Generator().manual_seed(0)
    k, n = 3, 5
    for shape, masked in (((4,), False), ((), True)):
        stats = MemberRunningMeanStd(k, shape)
        twins = [MemberRunningMeanStd(1, shape).member(0) for _ in range(k)]  # zero mean, unit variance, count 1e-4
        for step in range(6):
            x = torch.randn((k, n, *shape), generator=gen, dtype=torch.float32) * (step + 1) + step
            mask = torch.rand(k, n, generator=gen) > 0.4 if masked else None
            if masked and step == 2:
                mask[1] = False  # member 1 only on reset steps: nothing to learn
            stats.update(x, mask)
            for m, twin in enumerate(twins):
                _running_mean_std_update(twin, x[m] if mask is None else x[m][mask[m]])
        for m, twin in enumerate(twins):
            member = stats.member(m)
            for key in ("mean", "var", "count"):
                assert torch.allclose(member[key], twin[key], rtol=1e-12, atol=1e-12), (m, key)
