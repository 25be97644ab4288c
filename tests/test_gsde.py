"""gSDE (``use_sde``): the distribution against a loop twin (and SB3's, where it is installed), what trains through it,
when the exploration weights are drawn, and one-line refusals. Members against their single runs and the compiled
rollout against the eager one: tests/test_population.py."""
import math

import pytest
import torch
from conftest import one_line_error

from fastrl.config import make_config
from fastrl.envs.spaces import ActionSpec
from fastrl.learn.models import GSDE_EPSILON, ActorCritic, action_logp_entropy, gsde_distribution
from fastrl.run.trainer import Trainer

SMALL_PENDULUM = {"env": "Pendulum-v1", "use_sde": True, "total_steps": 512, "n_envs": 4, "n_steps": 8,
                  "n_minibatches": 2, "n_epochs": 1, "compile": "off", "progress": False}


def _loop_twin(latent, log_std, eps, mean, action):
    """Row by row, dim by dim: the variance ``sum_l latent_l^2 std_la^2``, the exploration ``sum_l latent_l std_la
    eps_la`` and the log-probability of ``action`` under ``Normal(mean, sqrt(variance + epsilon))``."""
    rows, dims = mean.shape
    exploration = torch.zeros(rows, dims, dtype=torch.float64)
    logp = torch.zeros(rows, dtype=torch.float64)
    for b in range(rows):
        for a in range(dims):
            variance = sum(float(latent[b, j]) ** 2 * math.exp(2 * float(log_std[j, a]))
                           for j in range(latent.shape[1]))
            exploration[b, a] = sum(float(latent[b, j]) * math.exp(float(log_std[j, a])) * float(eps[b, j, a])
                                    for j in range(latent.shape[1]))
            std = math.sqrt(variance + GSDE_EPSILON)
            logp[b] += -0.5 * ((float(action[b, a]) - float(mean[b, a])) / std) ** 2 - math.log(std) \
                - 0.5 * math.log(2 * math.pi)
    return exploration, logp


def test_gsde_distribution_matches_its_loop_twin():
    torch.manual_seed(0)
    rows, hidden, dims = 5, 7, 3
    latent, log_std = torch.randn(rows, hidden).tanh(), 0.3 * torch.randn(hidden, dims)
    eps, mean = torch.randn(rows, hidden, dims), torch.randn(rows, dims)
    row_log_std, exploration = gsde_distribution(latent, log_std, eps.reshape(rows, -1))
    spec = ActionSpec("continuous", shape=(dims,), low=(-2.0,) * dims, high=(2.0,) * dims)
    action, logp, entropy = action_logp_entropy(mean, spec, row_log_std, None, None, exploration)
    twin_exploration, twin_logp = _loop_twin(latent, log_std, eps, mean, action)
    torch.testing.assert_close(exploration.double(), twin_exploration, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(action, mean + exploration)
    torch.testing.assert_close(logp.double(), twin_logp, atol=1e-4, rtol=1e-5)
    # A given action is scored by the same distribution (what the update does with the rollout's actions).
    _, logp_given, _ = action_logp_entropy(mean, spec, row_log_std, action, None)
    torch.testing.assert_close(logp_given, logp)
    twin_entropy = torch.distributions.Normal(mean, row_log_std.exp()).entropy().sum(-1)
    torch.testing.assert_close(entropy, twin_entropy)


def test_members_gsde_equals_each_members_own():
    """The member axis in front (a population's batched forward) against one call per member."""
    torch.manual_seed(1)
    members, rows, hidden, dims = 3, 4, 6, 2
    latent, log_std = torch.randn(members, rows, hidden), torch.randn(members, hidden, dims)
    noise = torch.randn(members, rows, hidden * dims)
    together = gsde_distribution(latent, log_std, noise)
    for m in range(members):
        alone = gsde_distribution(latent[m], log_std[m], noise[m])
        torch.testing.assert_close(together[0][m], alone[0])
        torch.testing.assert_close(together[1][m], alone[1])


def test_gsde_matches_sb3s_state_dependent_noise_distribution():
    distributions = pytest.importorskip("stable_baselines3.common.distributions")
    torch.manual_seed(2)
    rows, hidden, dims = 6, 8, 2
    sb3 = distributions.StateDependentNoiseDistribution(dims, full_std=True, use_expln=False, squash_output=False)
    latent, mean = torch.randn(rows, hidden), torch.randn(rows, dims)
    log_std = 0.5 * torch.randn(hidden, dims)
    sb3.sample_weights(log_std, batch_size=rows)
    sb3.proba_distribution(mean, log_std, latent)
    sb3_action = sb3.sample()
    # SB3's exploration matrices are std * eps: the same eps gives the same action and log-probability.
    eps = sb3.exploration_matrices / log_std.exp()
    row_log_std, exploration = gsde_distribution(latent, log_std, eps.reshape(rows, -1))
    spec = ActionSpec("continuous", shape=(dims,), low=(-1.0,) * dims, high=(1.0,) * dims)
    action, logp, entropy = action_logp_entropy(mean, spec, row_log_std, None, None, exploration)
    torch.testing.assert_close(action, sb3_action, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logp, sb3.log_prob(sb3_action), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, sb3.entropy(), atol=1e-5, rtol=1e-5)


def test_gsde_trains_its_log_std_and_the_mean_but_not_the_trunk_through_the_noise():
    """The variance reads the latent detached (SB3's learn_features=False): the trunk learns through the mean only."""
    spec = ActionSpec("continuous", shape=(1,), low=(-2.0,), high=(2.0,))
    agent = ActorCritic((3,), spec, hidden_sizes=(16, 16), use_sde=True, init_log_std=-0.5)
    assert agent.log_std.shape == (16, 1) and agent.noise_width == 16
    assert torch.equal(agent.log_std, torch.full((16, 1), -0.5))
    obs, action = torch.randn(32, 3), torch.randn(32, 1)
    with torch.no_grad():
        agent.policy_head.weight.zero_()
        agent.policy_head.bias.zero_()  # the mean is 0 whatever the trunk: only the variance could reach the trunk
    _, logp, _, _ = agent.get_action_and_value(obs, action)
    logp.sum().backward()
    assert agent.log_std.grad is not None and agent.log_std.grad.abs().sum() > 0
    assert agent.policy_head.weight.grad.abs().sum() > 0
    for layer in agent.actor_trunk:
        if isinstance(layer, torch.nn.Linear):
            assert layer.weight.grad is None or not layer.weight.grad.any()


@pytest.mark.parametrize("sample_freq, redrawn_at", [(4, [0, 4]), (3, [0, 3, 6]), (-1, [0])])
def test_exploration_weights_are_drawn_at_each_rollout_start_and_every_sde_sample_freq_steps(sample_freq,
                                                                                           redrawn_at):
    trainer = Trainer(make_config({**SMALL_PENDULUM, "sde_sample_freq": sample_freq}))
    assert trainer.noise.shape == (4, 64)  # 4 envs x (64 hidden units x 1 action dim)
    drawn = []
    draw = trainer.draw_noise
    trainer.draw_noise = lambda rows=None: drawn.append(draw(rows).clone()) or drawn[-1]
    for rollout in range(2):  # two rollouts: each starts with new weights
        before = len(drawn)
        trainer.collect()
        steps = drawn[before:]
        assert len(steps) == 8
        changed = [t for t in range(1, 8) if not torch.equal(steps[t], steps[t - 1])]
        assert [0, *changed] == redrawn_at
        if rollout:
            assert not torch.equal(steps[0], drawn[before - 1])
    trainer.close()


@pytest.mark.parametrize("overrides, expected", [
    ({"env": "CartPole-v1"}, "continuous actions"),
    ({"algo": "impala"}, "not with algo impala"),
    ({"env_mode": "async"}, "env_mode=async"),
    ({"sde_sample_freq": 0}, "sde_sample_freq must be -1"),
    ({"policy": "torch.nn:Linear"}, "custom policy"),
])
def test_bad_gsde_settings_are_one_line(overrides, expected):
    base = {"env": "Pendulum-v1", "use_sde": True} if overrides.get("algo") == "impala" else SMALL_PENDULUM
    def build():
        trainer = Trainer(make_config({**base, **overrides}))
        trainer.close()
    assert expected in one_line_error(build)
