"""to_torchrl: fastrl's [T, N] rollout in TorchRL 0.14's layout. TorchRL's own GAE and ClipPPOLoss, run on the
adapter's output with TorchRL modules around the same fastrl weights, must give fastrl's advantages, value
targets, losses and gradients on valid steps: on rollouts with terminations, truncations and auto-reset steps,
synthetic (any shape, continuous actions) and from Trainer.collect on CartPole."""
import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.modules import IndependentNormal, ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

from fastrl import kernels
from fastrl.envs.buffers import make_rollout_buffer
from fastrl.envs.spaces import ActionSpec
from fastrl.envs.torchrl_adapter import default_log_prob_key, to_torchrl
from fastrl.learn.models import ActorCritic
from fastrl.learn.ppo import compute_advantages

GAMMA, LAM = 0.97, 0.9
CLIP, VF_COEF, ENT_COEF = 0.2, 0.5, 0.01
DISCRETE = ActionSpec("discrete", n=3)
CONTINUOUS = ActionSpec("continuous", shape=(2,), low=(-1.0, -1.0), high=(1.0, 1.0))
OBS_DIM = 4


# ---------------------------------------------------------------------------------------------- rollouts
def synthetic_rollout(agent, T, N, seed):
    """A rollout with fastrl's env conventions, filled the way Trainer.collect fills it.

    Each step after a done is an auto-reset step (valid False, reward 0, not done). Env 0 terminates at t=1
    and env 1 (when N > 1) is truncated at t=min(3, T-1); other ends are random. Returns (buffer, next_obs).
    """
    gen = torch.Generator().manual_seed(seed)
    spec = agent.action_spec
    buf = make_rollout_buffer(T, N, (OBS_DIM,), torch.float32, spec)
    obs = torch.randn(T + 1, N, OBS_DIM, generator=gen)
    prev_done = torch.zeros(N, dtype=torch.bool)
    for t in range(T):
        valid = ~prev_done
        terminated = (torch.rand(N, generator=gen) < 0.12) & valid
        truncated = (torch.rand(N, generator=gen) < 0.12) & valid & ~terminated
        if t == 1:
            terminated[0], truncated[0] = bool(valid[0]), False
        if N > 1 and t == min(3, T - 1):
            truncated[1], terminated[1] = bool(valid[1]), False
        reward = torch.randn(N, generator=gen) * valid
        with torch.no_grad():
            action, logp, _, value = agent.get_action_and_value(obs[t])
        buf["observation"][t] = obs[t]
        buf["action"][t] = action
        buf["sample_log_prob"][t] = logp
        buf["state_value"][t] = value
        buf["valid"][t] = valid
        buf["next", "reward"][t] = reward
        buf["next", "terminated"][t] = terminated
        buf["next", "truncated"][t] = truncated
        buf["next", "done"][t] = terminated | truncated
        prev_done = terminated | truncated
    with torch.no_grad():
        buf["next", "state_value"][:-1] = buf["state_value"][1:]
        buf["next", "state_value"][-1] = agent.get_value(obs[T])
    return buf, obs[T].clone()


@pytest.fixture(scope="module")
def cartpole():
    """A real rollout: Trainer.collect on CartPole-v1, 4 envs x 48 steps, then the trainer (for its agent)."""
    from fastrl.config import make_config
    from fastrl.run.trainer import Trainer

    cfg = make_config(dict(n_envs=4, n_steps=48, seed=3, progress=False, tensorboard=False, wandb="disabled"))
    trainer = Trainer(cfg)
    trainer.collect()
    yield trainer
    trainer.close()


def agent_for(spec, seed=0):
    torch.manual_seed(seed)
    return ActorCritic((OBS_DIM,), spec, hidden_sizes=(16, 16))


# ---------------------------------------------------------------------------------------------- TorchRL modules
class _GaussianHead(nn.Module):
    """fastrl's Gaussian policy as ``(loc, scale)``: the same modules and log_std, so the same weights."""

    def __init__(self, agent):
        super().__init__()
        self.trunk, self.head, self.agent = agent.actor_trunk, agent.policy_head, [agent]

    def forward(self, observation):
        loc = self.head(self.trunk(observation))
        return loc, self.agent[0].log_std.exp().expand_as(loc)


def torchrl_modules(agent):
    """A ProbabilisticActor and a ValueOperator around ``agent``'s own layers (no copies)."""
    critic = ValueOperator(nn.Sequential(agent.critic_trunk, agent.value_head), in_keys=["observation"])
    if agent.discrete:
        net = TensorDictModule(nn.Sequential(agent.actor_trunk, agent.policy_head), in_keys=["observation"],
                               out_keys=["logits"])
        actor = ProbabilisticActor(net, in_keys=["logits"], distribution_class=torch.distributions.Categorical,
                                   return_log_prob=True)
    else:
        net = TensorDictModule(_GaussianHead(agent), in_keys=["observation"], out_keys=["loc", "scale"])
        actor = ProbabilisticActor(net, in_keys=["loc", "scale"], distribution_class=IndependentNormal,
                                   return_log_prob=True)
    return actor, critic


def fastrl_gae(buf):
    nxt = buf["next"]
    return kernels.gae(nxt["reward"], buf["state_value"], nxt["state_value"], nxt["done"], nxt["terminated"],
                       GAMMA, LAM)


def time_major(x):
    """TorchRL's [N, T, 1] (or [N, T]) back to fastrl's [T, N]."""
    if x.dim() == 3:
        x = x.squeeze(-1)
    return x.transpose(0, 1)


# ---------------------------------------------------------------------------------------------- layout
@pytest.mark.parametrize("T, N", [(6, 3), (1, 4), (5, 1)])
def test_layout_keys_shapes_and_copies(T, N):
    agent = agent_for(CONTINUOUS)
    buf, next_obs = synthetic_rollout(agent, T, N, seed=1)
    compute_advantages(buf, GAMMA, LAM)
    td = to_torchrl(buf, next_observation=next_obs, with_advantage=True)
    assert td.batch_size == (N, T)
    lp = default_log_prob_key()
    assert lp == ClipPPOLoss.default_keys().sample_log_prob
    assert "sample_log_prob" not in td.keys() or lp == "sample_log_prob"
    assert td["observation"].shape == (N, T, OBS_DIM) and td["action"].shape == (N, T, 2)
    assert td[lp].shape == (N, T) and td["valid"].shape == (N, T) and td["valid"].dtype == torch.bool
    assert td["collector", "mask"] is td["valid"]
    for key in ("state_value", "advantage", "value_target"):
        assert td[key].shape == (N, T, 1)
        torch.testing.assert_close(time_major(td[key]), buf[key], rtol=0, atol=0)
    for key in ("reward", "done", "terminated", "truncated", "state_value"):
        assert td["next", key].shape == (N, T, 1) and td["next", key].dtype == buf["next", key].dtype
        assert torch.equal(time_major(td["next", key]), buf["next", key])
    # next observation: the following row, and the env's last returned observation for the last step
    assert torch.equal(td["next", "observation"][:, :-1], td["observation"][:, 1:])
    assert torch.equal(td["next", "observation"][:, -1], next_obs)
    assert torch.equal(time_major(td["observation"]), buf["observation"])
    assert torch.equal(time_major(td[lp]), buf["sample_log_prob"])
    # copies: writing into the output (even where the transpose is contiguous) leaves the buffer alone
    before = buf.clone()
    for key in ("observation", "action", lp, "state_value", ("next", "reward")):
        td[key].add_(1)
    for key in ("valid", ("next", "done")):
        td[key].logical_not_()
    assert (buf == before).all()


def test_layout_without_next_observation_or_advantage():
    buf, _ = synthetic_rollout(agent_for(DISCRETE), 4, 2, seed=2)
    td = to_torchrl(buf, log_prob_key="sample_log_prob")
    assert ("next", "observation") not in td.keys(include_nested=True)
    assert "advantage" not in td.keys() and "value_target" not in td.keys()
    assert td["action"].shape == (2, 4) and td["action"].dtype == torch.int64
    assert td["sample_log_prob"].shape == (2, 4)


def test_bad_inputs_are_one_line_errors():
    buf, next_obs = synthetic_rollout(agent_for(DISCRETE), 4, 2, seed=3)
    cases = [
        (buf.reshape(-1), None, "time-major"),
        (buf, next_obs[:1], "shape"),
        (buf, next_obs.double(), "dtype"),
        (buf.exclude("valid"), None, "lacks"),
        (dict(buf.items()), None, "TensorDict"),
    ]
    for batch, nxt, match in cases:
        with pytest.raises(ValueError, match=match) as info:
            to_torchrl(batch, next_observation=nxt)
        assert "\n" not in str(info.value)


def test_cartpole_rollout_next_observation_is_the_final_one(cartpole):
    """On a done step the next observation is the episode's real final one: the observation stored on the
    following (auto-reset, valid False) row, not the new episode's first."""
    buf = cartpole.buffer
    td = to_torchrl(buf, next_observation=cartpole.next_obs)
    done = time_major(td["next", "done"])
    assert done.any() and (~buf["valid"]).any(), "the rollout should hold episode ends and reset steps"
    t, n = torch.nonzero(done[:-1], as_tuple=True)
    assert not buf["valid"][t + 1, n].any(), "the step after a done is the auto-reset step"
    assert torch.equal(td["next", "observation"][n, t], buf["observation"][t + 1, n])
    assert torch.equal(td["next", "observation"][:, -1], cartpole.next_obs)
    # CartPole terminates when the pole or cart leaves its range: the stored final observation shows it
    final = td["next", "observation"][n, t]
    out_of_range = (final[:, 0].abs() > 2.4) | (final[:, 2].abs() > 0.2095)
    assert out_of_range.all()


# ---------------------------------------------------------------------------------------------- GAE
def check_gae(agent, buf, next_obs):
    advantage, value_target = fastrl_gae(buf)
    td = to_torchrl(buf, next_observation=next_obs)
    GAE(gamma=GAMMA, lmbda=LAM, value_network=None)(td)
    torch.testing.assert_close(time_major(td["advantage"]), advantage, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(time_major(td["value_target"]), value_target, rtol=1e-5, atol=1e-5)
    # With a value network TorchRL evaluates V itself, on observation and ("next", "observation"): the same
    # numbers, so the next observations (final ones on done steps, next_obs at the end) are the right ones.
    _, critic = torchrl_modules(agent)
    td = to_torchrl(buf, next_observation=next_obs).exclude("state_value", ("next", "state_value"))
    with torch.no_grad():
        GAE(gamma=GAMMA, lmbda=LAM, value_network=critic)(td)
    torch.testing.assert_close(time_major(td["advantage"]), advantage, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(time_major(td["value_target"]), value_target, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("T, N, spec", [(12, 4, DISCRETE), (7, 3, CONTINUOUS), (1, 3, DISCRETE), (9, 1, DISCRETE)])
def test_torchrl_gae_matches_kernels_gae(T, N, spec):
    agent = agent_for(spec, seed=T)
    buf, next_obs = synthetic_rollout(agent, T, N, seed=10 + T)
    if T > 3 and N > 1:
        assert buf["next", "terminated"].any() and buf["next", "truncated"].any() and (~buf["valid"]).any()
    check_gae(agent, buf, next_obs)


def test_torchrl_gae_matches_on_a_cartpole_rollout(cartpole):
    check_gae(cartpole.agent, cartpole.buffer, cartpole.next_obs)


# ---------------------------------------------------------------------------------------------- ClipPPOLoss
def perturb_(agent, seed):
    """Move the weights away from the behaviour policy, so ratios leave 1 and clipping engages."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))


def fastrl_loss(agent, buf, clip_vloss):
    T, N = buf.batch_size
    flat = buf.reshape(T * N)
    _, new_logp, entropy, new_value = agent.get_action_and_value(flat["observation"], flat["action"])
    return kernels.ppo_loss(new_logp, flat["sample_log_prob"], flat["advantage"], new_value, flat["state_value"],
                            flat["value_target"], entropy, flat["valid"], CLIP, VF_COEF, ENT_COEF,
                            clip_vloss=clip_vloss, normalize_advantage=False, backend="reference")


def torchrl_loss(agent, clip_vloss):
    actor, critic = torchrl_modules(agent)
    # fastrl's value loss is 0.5 (V - R)^2 and TorchRL's l2 is (V - R)^2: critic_coeff = 0.5 vf_coef
    return ClipPPOLoss(actor, critic, clip_epsilon=CLIP, entropy_coeff=ENT_COEF, critic_coeff=0.5 * VF_COEF,
                       loss_critic_type="l2", normalize_advantage=False, clip_value=CLIP if clip_vloss else None)


def grads(agent, loss):
    agent.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in agent.parameters()]


def check_ppo_loss(agent, buf, next_obs, clip_vloss, seed):
    compute_advantages(buf, GAMMA, LAM)
    perturb_(agent, seed)
    loss, stats = fastrl_loss(agent, buf, clip_vloss)
    assert stats["clipfrac"] > 0, "the perturbed policy should clip some ratios"
    fastrl_grads = grads(agent, loss)

    td = to_torchrl(buf, next_observation=next_obs)
    GAE(gamma=GAMMA, lmbda=LAM, value_network=None)(td)  # TorchRL's own advantages, = fastrl's (tested above)
    module = torchrl_loss(agent, clip_vloss)
    out = module(td)
    tol = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["loss_objective"], stats["policy_loss"], **tol)
    torch.testing.assert_close(out["loss_critic"], VF_COEF * stats["value_loss"], **tol)
    torch.testing.assert_close(-out["loss_entropy"] / ENT_COEF, stats["entropy"], **tol)
    total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
    torch.testing.assert_close(total, loss, **tol)
    for ours, theirs in zip(fastrl_grads, grads(agent, total)):
        torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-6)

    # Without the mask TorchRL would average reset steps in: the mask is what makes the numbers agree.
    module.loss_mask_key = None
    unmasked = module(td)
    assert not torch.allclose(unmasked["loss_objective"], stats["policy_loss"], rtol=1e-5, atol=1e-5)
    # loss_mask_key = "valid" reads the same mask under fastrl's name.
    module.loss_mask_key = "valid"
    torch.testing.assert_close(module(td)["loss_objective"], stats["policy_loss"], **tol)

    # The flat copy of the valid steps: the losses agree, and so do TorchRL's (unmasked) logged statistics.
    module.loss_mask_key = "auto"
    flat = td[td["valid"]]
    out = module(flat)
    torch.testing.assert_close(out["loss_objective"], stats["policy_loss"], **tol)
    torch.testing.assert_close(out["entropy"], stats["entropy"], **tol)
    torch.testing.assert_close(out["clip_fraction"], stats["clipfrac"], **tol)


@pytest.mark.parametrize("spec, clip_vloss", [(DISCRETE, True), (DISCRETE, False), (CONTINUOUS, True)])
def test_clip_ppo_loss_matches_kernels_ppo_loss(spec, clip_vloss):
    agent = agent_for(spec, seed=5)
    buf, next_obs = synthetic_rollout(agent, 16, 4, seed=20)
    check_ppo_loss(agent, buf, next_obs, clip_vloss, seed=6)


def test_clip_ppo_loss_matches_on_a_cartpole_rollout(cartpole):
    agent = cartpole.agent
    saved = {k: v.clone() for k, v in agent.state_dict().items()}
    try:
        check_ppo_loss(agent, cartpole.buffer.clone(), cartpole.next_obs, clip_vloss=True, seed=7)
    finally:
        agent.load_state_dict(saved)


def test_fastrl_to_torchrl_is_exported():
    import fastrl

    assert fastrl.to_torchrl is to_torchrl
