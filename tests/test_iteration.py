"""The whole iteration as one pure function (fastrl/run/iteration.py): compiled equals eager, K members equal their
single runs, the scans equal their loop twins, and which runs take it."""
import pytest
import torch

from fastrl.config import make_config
from fastrl.kernels.gae import gae_reference
from fastrl.run.iteration import gae_scan
from fastrl.run.trainer import Trainer

QUIET = dict(progress=False, tensorboard=False, wandb="disabled", plot=False)


def _run(iterations: int = 2, **overrides):
    """A torch-env trainer after ``iterations`` whole iterations: ``(trainer, buffers, params)``."""
    settings = dict(env="CartPole-v1", env_backend="torch", n_envs=4, n_steps=16, n_epochs=2, n_minibatches=2,
                    total_steps=4 * 16 * 8, seed=3, **QUIET)
    settings.update(overrides)
    trainer = Trainer(make_config(settings))
    buffers = []
    for _ in range(iterations):
        trainer.collect()
        trainer.update()
        buffers.append(trainer.buffer.clone())
    trainer.close()
    return trainer, buffers, trainer.params.clone()


def _assert_same_rollouts(a_buffers, b_buffers, exact_observations=False):
    """Same actions, flags and rewards; observations, log-probs, values and advantages to float rounding
    (inductor's float64 sin/cos and fused sums differ from eager's in the last bits)."""
    assert len(a_buffers) == len(b_buffers) > 0
    for a, b in zip(a_buffers, b_buffers):
        for key in ("valid", ("next", "done"), ("next", "terminated"), ("next", "truncated")):
            assert torch.equal(a[key], b[key]), key
        if a["action"].is_floating_point():  # a Gaussian's sample: mean + std * noise, rounded alike or not
            torch.testing.assert_close(a["action"], b["action"], rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(a["action"], b["action"])
        close = ["observation", ("next", "reward"), "sample_log_prob", "state_value", ("next", "state_value"),
                 "advantage", "value_target"]
        for key in close:
            torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_compiled_iteration_equals_the_eager_one(env_id):
    """Same seed: the compiled iteration (one graph: scans over the rollout, GAE and the minibatch steps) and its
    eager twin (Python loops) take the same actions, see the same flags, and end with the same weights (1e-5), over
    iterations long enough that episodes end and reset."""
    overrides = dict(env=env_id, use_sde=False, normalize_obs=False, normalize_reward=False)
    eager_trainer, eager, eager_params = _run(compile="off", **overrides)
    trainer, compiled, compiled_params = _run(compile="default", **overrides)
    assert trainer.iteration_call is not None and trainer.iteration_call.compiled
    assert not eager_trainer.iteration_call.compiled
    assert bool(eager[-1]["valid"].logical_not().any()) or env_id == "Pendulum-v1"  # CartPole resets happened
    _assert_same_rollouts(eager, compiled)
    assert not torch.equal(eager_params, _run(iterations=0, compile="off", **overrides)[2])  # the weights moved
    torch.testing.assert_close(compiled_params, eager_params, rtol=1e-5, atol=1e-5)
    assert eager_trainer.env.stats.count == trainer.env.stats.count


def test_members_equal_their_single_runs():
    """K = 3 members with different learning rates (vmapped, eagerly) each equal the single run of their config:
    the same rollouts and weights to float rounding (a vmapped matmul sums in another order)."""
    lrs = [1e-3, 3e-3, 1e-2]
    population, pop_buffers, pop_params = _run(compile="off", vary={"lr": lrs})
    assert population.n_members == 3
    n = population.n_envs
    for m, lr in enumerate(lrs):
        single, buffers, params = _run(compile="off", lr=lr, seed=3 + m)
        columns = [{key: b[key][:, m * n:(m + 1) * n] for key in
                    ("action", "valid", "observation", "sample_log_prob", "state_value", "advantage", "value_target",
                     ("next", "done"), ("next", "terminated"), ("next", "truncated"), ("next", "reward"),
                     ("next", "state_value"))} for b in pop_buffers]
        _assert_same_rollouts(buffers, columns)
        torch.testing.assert_close(pop_params[m], params[0], rtol=1e-5, atol=1e-5)


def _random_rollout(t=24, n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    reward, value, next_value = (torch.randn(t, n, generator=g) for _ in range(3))
    done = torch.rand(t, n, generator=g) < 0.15
    terminated = done & (torch.rand(t, n, generator=g) < 0.5)
    return reward, value, next_value, done, terminated


def test_gae_scan_equals_the_reference():
    """The iteration's compiled GAE (a reverse scan) equals the kernels' reference, its eager form, with
    terminations (no bootstrap) and truncations (bootstrap, trace cut) in the rollout; per-member gamma broadcast."""
    rollout = _random_rollout()
    expected = gae_reference(*rollout, 0.99, 0.95)
    got = torch.compile(gae_scan, fullgraph=True, dynamic=False)(*rollout, torch.tensor(0.99), torch.tensor(0.95))
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], expected[1], rtol=1e-5, atol=1e-5)
    members = torch.stack([rollout[0], rollout[0]], 1), *(torch.stack([x, x], 1) for x in rollout[1:])
    gammas = torch.tensor([[0.9], [0.99]])
    advantage, _ = gae_reference(*members, gammas, 0.95)
    torch.testing.assert_close(advantage[:, 1], expected[0], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(advantage[:, 0], expected[0])


def test_the_whole_iteration_is_taken_where_the_env_step_is_pure():
    """Which runs take the iteration function: env_backend torch without normalization wrappers or gSDE, PPO and
    A2C; compile auto compiles it from CPU_ITERATION_COMPILE_MIN_ITERATIONS iterations (CUDA: CUDA graphs), with
    every minibatch step in its one call."""
    from fastrl.run.compile import CPU_ITERATION_COMPILE_MIN_ITERATIONS, CompilePlan, compile_plan
    cpu = torch.device("cpu")
    many = CPU_ITERATION_COMPILE_MIN_ITERATIONS
    assert compile_plan("auto", cpu, 0, iterations=many - 1, n_epochs=4, n_minibatches=4) == CompilePlan("off", "off", 16)
    assert compile_plan("auto", cpu, 0, iterations=many, n_epochs=4, n_minibatches=4) == CompilePlan(
        "default", "default", 16)
    assert compile_plan("auto", torch.device("cuda"), 0, iterations=1).update == "reduce-overhead"
    assert compile_plan("off", cpu, 0, iterations=10**6).update == "off"
    cases = [(dict(), True), (dict(algo="a2c"), True), (dict(normalize_obs=True), False),
             (dict(env="Pendulum-v1", use_sde=True), False), (dict(env_backend="envpool"), False)]
    for overrides, takes_it in cases:
        settings = {**dict(env="CartPole-v1", env_backend="torch", n_envs=4, n_steps=8, total_steps=64,
                           compile="off", **QUIET), **overrides}
        trainer = Trainer(make_config(settings))
        assert (trainer.iteration_call is not None) == takes_it, overrides
        trainer.close()
