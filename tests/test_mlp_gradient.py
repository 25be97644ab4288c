"""``fastrl.learn.mlp_gradient``: the hand-derived loss and gradient of K MLP actor-critics against its twin, autograd through
the batched forward (``fastrl.learn.stacked.members_actor_critic``) and ``kernels.ppo_loss`` / ``pg_loss``."""
from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from fastrl.envs.spaces import ActionSpec
from fastrl.learn.models import ActorCritic
from fastrl.learn.stacked import FlatLayout
from fastrl.learn.update import Update, UpdateSpec, hand_gradient_applies

K, B, OBS = 3, 48, 5
DISCRETE = ActionSpec(kind="discrete", n=3, shape=())
CONTINUOUS = ActionSpec(kind="continuous", shape=(2,), low=(-1.0, -1.0), high=(1.0, 1.0))


def _spec(algo: str, clip_vloss: bool, norm_adv: bool) -> UpdateSpec:
    return UpdateSpec(algo=algo, optimizer="adam", constants=(("betas", (0.9, 0.999)), ("eps", 1e-5)),
                      clip_vloss=clip_vloss, norm_adv=norm_adv, target_kl=0.0, n_epochs=1, n_minibatches=1,
                      loss_scaling=False)


def _members(action_spec, activation="tanh", shared=False, seed=0, sde=False):
    """K members' flat weights ``[K, P]`` (each its own initialization, log-std moved off 0) and their layout."""
    agents = []
    for m in range(K):
        torch.manual_seed(seed + m)
        agent = ActorCritic((OBS,), action_spec, hidden_sizes=(16, 12), activation=activation, shared_trunk=shared,
                            init_log_std=-0.3 + 0.2 * m, use_sde=sde)
        if sde:  # gSDE's [L, A] log-std, not all equal
            with torch.no_grad():
                agent.log_std.add_(0.5 * torch.randn_like(agent.log_std))
        with torch.no_grad():  # heads off their small initial gains, so every term of the gradient counts
            agent.policy_head.weight.mul_(30.0)
        agents.append(agent)
    layout = FlatLayout(agents[0])
    return layout, torch.stack([layout.flatten(a) for a in agents])


def _minibatch(layout, params, action_spec, seed=1):
    """A minibatch as a rollout would leave it: actions and their log-probs from the members' own policies, values
    off by noise, some rows invalid (auto-reset steps)."""
    generator = torch.Generator().manual_seed(seed)
    obs = torch.randn(K, B, OBS, generator=generator)
    width = layout.agent.noise_width if action_spec.kind != "discrete" else 3
    draw = torch.rand if action_spec.kind == "discrete" else torch.randn
    with torch.no_grad():
        action, logp, _, value = layout.call_members("get_action_and_value", params, obs, None,
                                                     draw(K, B, width, generator=generator))
    old_logp = logp + 0.3 * torch.randn(K, B, generator=generator)  # ratios on both sides of the clip range
    advantage = torch.randn(K, B, generator=generator) * 2 + 0.5
    old_value = value + 0.4 * torch.randn(K, B, generator=generator)
    target = value + torch.randn(K, B, generator=generator)
    valid = torch.rand(K, B, generator=generator) > 0.15
    valid[:, 0] = False
    return (obs, action, old_logp, advantage, old_value, target, valid)


def _hparams():
    return {"lr": torch.full((K,), 1e-3, dtype=torch.float64), "clip_coef": torch.tensor([0.2, 0.1, 0.3]),
            "ent_coef": torch.tensor([0.0, 0.01, 0.05]), "vf_coef": torch.tensor([0.5, 1.0, 0.25]),
            "max_grad_norm": torch.full((K,), 0.5)}


def _both(spec, layout, params, minibatch):
    fast = Update(spec, layout, path="members_hand").gradient(params, {}, minibatch, _hparams())
    # the twin: autograd through the batched forward
    twin = Update(spec, layout, path="members_autograd").gradient(params, {}, minibatch, _hparams())
    return fast, twin


CASES = [
    # (algo, action spec, activation, shared trunk, clip_vloss, norm_adv, gSDE)
    ("ppo", DISCRETE, "tanh", False, False, True, False),
    ("ppo", DISCRETE, "tanh", False, True, True, False),
    ("ppo", CONTINUOUS, "tanh", False, False, True, False),
    ("ppo", CONTINUOUS, "relu", False, True, False, False),
    ("ppo", DISCRETE, "relu", True, True, True, False),
    ("ppo", CONTINUOUS, "tanh", True, False, True, False),
    ("ppo", CONTINUOUS, "tanh", False, False, True, True),
    ("ppo", CONTINUOUS, "relu", True, True, False, True),
    ("a2c", DISCRETE, "tanh", False, False, False, False),
    ("a2c", CONTINUOUS, "tanh", False, False, True, False),
    ("a2c", DISCRETE, "tanh", True, False, False, False),
    ("a2c", CONTINUOUS, "tanh", False, False, False, True),
]


@pytest.mark.parametrize("algo, action_spec, activation, shared, clip_vloss, norm_adv, sde", CASES)
def test_the_hand_derived_gradient_equals_autograd(algo, action_spec, activation, shared, clip_vloss, norm_adv, sde):
    layout, params = _members(action_spec, activation, shared, sde=sde)
    minibatch = _minibatch(layout, params, action_spec)
    (grad, loss, stats), (twin_grad, twin_loss, twin_stats) = _both(_spec(algo, clip_vloss, norm_adv), layout,
                                                                    params, minibatch)
    assert grad.shape == twin_grad.shape == params.shape
    torch.testing.assert_close(loss, twin_loss, rtol=1e-5, atol=1e-6)
    assert set(stats) == set(twin_stats)
    for key in stats:
        torch.testing.assert_close(stats[key], twin_stats[key], rtol=1e-5, atol=1e-6, msg=lambda t: f"{key}: {t}")
    torch.testing.assert_close(grad, twin_grad, rtol=1e-4, atol=1e-6)
    assert grad.abs().sum() > 0
    if algo == "ppo":  # the case exercises both sides of the ratio clip
        assert 0 < stats["clipfrac"].min() and stats["clipfrac"].max() < 1


def test_masked_rows_do_not_reach_the_gradient_even_when_they_hold_nan():
    layout, params = _members(DISCRETE)
    minibatch = list(_minibatch(layout, params, DISCRETE))
    valid = minibatch[-1]
    grad, loss, _ = Update(_spec("ppo", True, True), layout, path="members_hand").gradient(params, {}, tuple(minibatch), _hparams())
    for i in (2, 3, 4, 5):  # old log-prob, advantage, old value, value target of the masked-out rows
        minibatch[i] = torch.where(valid, minibatch[i], torch.full_like(minibatch[i], float("nan")))
    poisoned, poisoned_loss, _ = Update(_spec("ppo", True, True), layout, path="members_hand").gradient(
        params, {}, tuple(minibatch), _hparams())
    assert torch.isfinite(poisoned).all() and torch.isfinite(poisoned_loss).all()
    torch.testing.assert_close(poisoned, grad, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["elu", "multidiscrete"])
def test_other_agents_take_the_autograd_path(kind):
    if kind == "elu":
        agent = ActorCritic((OBS,), DISCRETE, hidden_sizes=(8,), activation="elu")
    else:
        agent = ActorCritic((OBS,), ActionSpec(kind="discrete", n=5, shape=(2,), nvec=(2, 3)), hidden_sizes=(8,))
    layout = FlatLayout(agent)
    assert not hand_gradient_applies(_spec("ppo", False, True), layout, nullcontext)
    assert Update.for_run(_spec("ppo", False, True), layout, nullcontext, 3, False, agent).path == "members_autograd"


def test_steps_on_one_minibatch_of_every_row_match_autograd_on_the_shuffled_rows():
    """``Update.steps`` of K members, one minibatch per epoch (the RL Zoo's CartPole): the hand-derived path skips the
    shuffle (a full batch's sums do not depend on the rows' order), the autograd twin gathers the shuffled rows; after
    four Adam steps both hold the same weights and moments, within rounding."""
    layout, params = _members(DISCRETE)
    batch = _minibatch(layout, params, DISCRETE)
    generator = torch.Generator().manual_seed(3)
    index = torch.stack([torch.stack([torch.randperm(B, generator=generator) for _ in range(4)]) for _ in range(K)])
    spec = _spec("ppo", False, True)
    results = []
    for hand in (True, False):
        update = Update(spec, layout, path="members_hand" if hand else "members_autograd")
        opt_state = update.init_opt_state(params)
        out = update.steps(params.clone(), opt_state, batch, index, _hparams(), torch.ones(K, dtype=torch.bool),
                           torch.ones(4, dtype=torch.bool))
        results.append(out)
    (p_hand, s_hand, sums_hand, _), (p_twin, s_twin, sums_twin, _) = results
    assert not torch.equal(p_hand, params)
    torch.testing.assert_close(p_hand, p_twin, rtol=1e-5, atol=1e-6)
    for key in s_hand:
        torch.testing.assert_close(s_hand[key], s_twin[key], rtol=1e-4, atol=1e-7)
    for key in sums_hand:
        torch.testing.assert_close(sums_hand[key], sums_twin[key], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("algo, action_spec, activation, shared, clip_vloss, norm_adv, sde",
                         [CASES[1], CASES[3], CASES[6], CASES[8]])
def test_one_member_hand_gradient_equals_the_module_path(algo, action_spec, activation, shared, clip_vloss, norm_adv,
                                                         sde):
    """K = 1, a single eager MLP run's step: the hand-derived gradient on ``[1, P]`` gives the loss, statistics and
    gradient of autograd through the agent module bound to the same weights (the ``module`` path, which single runs
    of other models take)."""
    layout, params = _members(action_spec, activation, shared, sde=sde)
    minibatch = _minibatch(layout, params, action_spec)
    one, rows = params[1:2].clone(), tuple(t[1:2] for t in minibatch)  # member 1: clip 0.1, ent 0.01, vf 1.0
    hparams = {key: value[1:2] for key, value in _hparams().items()}
    spec = _spec(algo, clip_vloss, norm_adv)
    grad, loss, stats = Update(spec, layout, path="members_hand").gradient(one, {}, rows, hparams)
    flat = torch.empty_like(one[0])
    layout.bind(layout.agent, flat)  # the module's parameters are now views of flat (holding its own weights) ...
    flat.copy_(one[0])  # ... which become member 1's
    twin = Update(spec, layout, path="module", agent=layout.agent)
    twin_grad, twin_loss, twin_stats = twin.gradient(flat, {}, tuple(t[0] for t in rows),
                                                     {key: value[0] for key, value in hparams.items()})
    assert grad.shape == (1, flat.numel()) and grad.abs().sum() > 0
    torch.testing.assert_close(loss[0], twin_loss, rtol=1e-5, atol=1e-6)
    assert set(stats) == set(twin_stats)
    for key in stats:
        torch.testing.assert_close(stats[key][0], twin_stats[key], rtol=1e-5, atol=1e-6, msg=lambda t: f"{key}: {t}")
    torch.testing.assert_close(grad[0], twin_grad, rtol=1e-4, atol=1e-6)
