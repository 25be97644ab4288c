"""Action masking (fastrl.learn.masking, fastrl.envs.masks) on the penalised env of benchmarks/masking.py: each step
a random subset of 6 actions is valid, +1 for a valid action, -1 for an invalid one, 50 steps an episode.

Exact checks first (no invalid action sampled, chosen or given probability; entropy of the renormalized distribution;
finite losses; both conventions alike; each member its own masks), then one learning check."""
from contextlib import nullcontext

import gymnasium
import numpy as np
import pytest
import torch
from conftest import median_of_seeds, one_line_error

import fastrl
from benchmarks.masking import (EPISODE_STEPS, N_ACTIONS, DictMaskedChoice, MaskedChoice, UnmaskedChoice,
                                invalid_predictions)
from fastrl.config import make_config
from fastrl.envs.registry import env_name
from fastrl.envs.spaces import ActionSpec, dict_layout
from fastrl.learn.masking import masked_logits
from fastrl.learn.models import ActorCritic, DictActorCritic, action_logp_entropy, action_mode
from fastrl.learn.stacked import FlatLayout
from fastrl.learn.update import UpdateSpec, hand_gradient_applies
from fastrl.run.trainer import Trainer

QUIET = dict(progress=False, wandb="disabled", tensorboard=False, plot=False, quiet=True)
PREDICT_STEPS = 2000


def _trainer(env, **overrides) -> Trainer:
    cfg = {"env": env_name(env), "n_envs": 4, "n_steps": 16, "total_steps": 256, "compile": "off", **overrides}
    return Trainer(make_config({**cfg, **QUIET}))


def _invalid_in_buffer(trainer: Trainer) -> tuple[int, int]:
    """``(invalid, samples)``: actions of the rollout (valid rows) that its observation's mask rules out."""
    buffer = trainer.buffer
    mask = buffer["observation"][..., -N_ACTIONS:] > 0.5
    chosen = mask.gather(-1, buffer["action"].unsqueeze(-1)).squeeze(-1)
    rows = buffer["valid"]
    return int((~chosen & rows).sum()), int(rows.sum())


@pytest.fixture(scope="module")
def agents(tmp_path_factory):
    """Briefly trained agents (close to uniform over the actions), one per convention."""
    root = tmp_path_factory.mktemp("masking")
    return {env: fastrl.train(env=env, total_steps=256, n_envs=4, n_steps=32, eval_episodes=0,
                              run_dir=root / env.__name__, **QUIET).agent for env in (MaskedChoice, DictMaskedChoice)}


# ---------------------------------------------------------------------------------------------- the distribution
def test_masked_log_probabilities_and_entropy_match_the_renormalized_distribution():
    torch.manual_seed(0)
    logits = torch.randn(64, N_ACTIONS) * 3
    mask = torch.rand(64, N_ACTIONS) < 0.5
    mask[torch.arange(64), torch.randint(N_ACTIONS, (64,))] = True
    spec = ActionSpec("discrete", n=N_ACTIONS)
    log_probs = torch.stack([action_logp_entropy(logits, spec, None, torch.full((64,), a), None, mask=mask)[1]
                             for a in range(N_ACTIONS)], dim=-1)
    assert bool((log_probs[~mask] < -1e30).all())  # invalid actions: probability zero, not a NaN
    assert torch.allclose(log_probs.exp().sum(-1), torch.ones(64))
    # the hand computation: softmax over the valid logits alone
    for row in range(64):
        valid = logits[row][mask[row]]
        probs = torch.softmax(valid, -1)
        assert torch.allclose(log_probs[row][mask[row]], torch.log(probs), atol=1e-5)
        _, _, entropy = action_logp_entropy(logits[row:row + 1], spec, None, torch.zeros(1, dtype=torch.long)
                                            + int(mask[row].nonzero()[0]), None, mask=mask[row:row + 1])
        assert torch.isfinite(entropy).all()
        assert entropy.item() == pytest.approx(-(probs * probs.log()).sum().item(), abs=1e-5)


def test_sampling_and_the_mode_never_choose_an_invalid_action_multidiscrete_too():
    torch.manual_seed(1)
    nvec = (3, 4)
    spec = ActionSpec("discrete", n=7, shape=(2,), nvec=nvec)
    logits = torch.randn(4000, 7)
    logits[:, 0] = logits[:, 3] = 50.0  # the unmasked mode of each component: 0, and invalid below
    mask = torch.ones(4000, 7, dtype=torch.bool)
    mask[:, 0] = mask[:, 3] = False
    mask[:, 1] = torch.rand(4000) < 0.5
    action, logp, entropy = action_logp_entropy(logits, spec, None, None, None, mask=mask)
    component_masks = torch.split(mask, list(nvec), dim=-1)
    for i, component in enumerate(component_masks):
        assert bool(component.gather(-1, action[:, i:i + 1]).all()), i
    assert torch.isfinite(logp).all() and torch.isfinite(entropy).all()
    mode = action_mode(logits, spec, mask)
    assert (action_mode(logits, spec) == 0).all()  # unmasked, the invalid actions would be chosen
    for i, component in enumerate(component_masks):
        assert bool(component.gather(-1, mode[:, i:i + 1]).all()), i


def test_the_loss_gradient_is_finite_and_zero_for_invalid_logits():
    logits = torch.randn(32, N_ACTIONS, requires_grad=True)
    mask = torch.rand(32, N_ACTIONS) < 0.5
    mask[:, 2] = True
    _, logp, entropy = action_logp_entropy(logits, ActionSpec("discrete", n=N_ACTIONS), None,
                                           torch.full((32,), 2), None, mask=mask)
    (-(logp + 0.01 * entropy).sum()).backward()
    assert torch.isfinite(logits.grad).all() and bool((logits.grad[~mask] == 0).all())
    assert torch.equal(masked_logits(logits, None), logits.float())


def test_the_mask_is_not_a_network_input_and_masks_a_dict_model_with_an_image():
    """A Dict of an image, a vector and the mask takes the Dict model; the mask changes no feature and no value,
    only which actions the policy can take."""
    space = gymnasium.spaces.Dict({"action_mask": gymnasium.spaces.MultiBinary(4),
                                   "frame": gymnasium.spaces.Box(0, 255, (8, 8, 1), np.uint8),
                                   "cue": gymnasium.spaces.Box(-1, 1, (3,), np.float32)})
    layout = dict_layout(space)
    assert [part.key for part in layout] == ["cue", "frame", "action_mask"] and layout[-1].mask
    torch.manual_seed(0)
    model = DictActorCritic(layout, ActionSpec("discrete", n=4))
    obs = torch.cat([torch.rand(512, 3 + 64) * 255, torch.rand(512, 4) < 0.5], dim=1)
    obs[:, -1] = 1.0
    action, _, _, value = model.get_action_and_value(obs)
    assert bool(obs[torch.arange(512), -4 + action].bool().all())
    other = obs.clone()
    other[:, -4:-1] = 1.0 - other[:, -4:-1]
    assert torch.equal(model._features(obs), model._features(other))
    assert torch.equal(model.get_value(obs), value)
    flat = ActorCritic((2 * N_ACTIONS,), ActionSpec("discrete", n=N_ACTIONS), mask_width=N_ACTIONS)
    x = torch.rand(8, 2 * N_ACTIONS)
    y = torch.cat([x[:, :N_ACTIONS], 1 - x[:, N_ACTIONS:]], dim=1)
    assert torch.equal(flat.get_value(x), flat.get_value(y)) and flat.actor_trunk[0].in_features == N_ACTIONS


# ---------------------------------------------------------------------------------------------- predict / act
@pytest.mark.parametrize("env", [MaskedChoice, DictMaskedChoice])
def test_stochastic_predict_never_picks_an_invalid_action(agents, env):
    agent = agents[env]
    assert invalid_predictions(agent, MaskedChoice, PREDICT_STEPS) == 0
    # the same agent with every action allowed does pick invalid ones: the masks, not the policy, keep it valid
    unmasked = _AllAllowed(agent)
    assert invalid_predictions(unmasked, MaskedChoice, 200) > 20


class _AllAllowed:
    def __init__(self, agent):
        self.agent = agent

    def predict(self, obs, deterministic, action_masks):
        return self.agent.predict(obs, deterministic=deterministic, action_masks=np.ones(N_ACTIONS, bool))


def test_deterministic_predict_avoids_an_invalid_argmax(agents):
    agent = agents[DictMaskedChoice]
    with torch.no_grad():
        agent.policy.policy_head.bias[0] = 100.0  # action 0 is the unmasked argmax everywhere
    obs = {"observation": np.ones(N_ACTIONS, np.float32), "action_mask": np.ones(N_ACTIONS, np.int8)}
    assert int(agent.predict(obs)[0]) == 0
    env = DictMaskedChoice()
    for seed in range(50):
        obs, _ = env.reset(seed=seed)
        obs["action_mask"][0] = 0
        action = int(agent.predict(obs)[0])
        assert action != 0 and obs["action_mask"][action]
    batch = {"observation": np.ones((3, N_ACTIONS), np.float32), "action_mask": np.eye(N_ACTIONS, dtype=np.int8)[3:]}
    assert agent.predict(batch)[0].tolist() == [3, 4, 5]


# ---------------------------------------------------------------------------------------------- the rollout
def test_rollout_samples_are_always_valid_and_both_conventions_roll_out_alike():
    buffers, threads = {}, torch.get_num_threads()
    for env in (MaskedChoice, DictMaskedChoice):
        torch.set_num_threads(threads)  # a trainer sets its own count after initializing (orthogonal init rounds by it)
        trainer = _trainer(env, n_steps=PREDICT_STEPS // 4)
        trainer.collect()
        invalid, samples = _invalid_in_buffer(trainer)
        assert samples > PREDICT_STEPS - 2 * PREDICT_STEPS // EPISODE_STEPS and invalid == 0  # reset rows aside
        buffers[env] = trainer.buffer.clone()
        trainer.close()
    sb3, dict_ = buffers.values()
    for key in ("observation", "action", "sample_log_prob", "state_value"):
        assert torch.equal(sb3[key], dict_[key]), key
    assert torch.equal(sb3["next", "reward"], dict_["next", "reward"])
    assert float(sb3["next", "reward"][sb3["valid"]].min()) == 1.0  # every step paid +1


def test_a_population_acts_on_each_members_own_masks_and_updates_finitely():
    trainer = _trainer(MaskedChoice, n_seeds=2, n_steps=64)
    assert trainer.update_fn.path == "members_autograd"  # the hand-derived gradient does not apply to masks
    trainer.collect()
    invalid, samples = _invalid_in_buffer(trainer)
    assert samples > 400 and invalid == 0
    masks = trainer.buffer["observation"][..., -N_ACTIONS:].view(64, 2, 4, N_ACTIONS)
    assert not torch.equal(masks[:, 0], masks[:, 1])  # each member's envs have their own masks
    metrics = trainer.update()
    assert metrics["losses/nonfinite_updates"] == 0 and trainer.weights_finite()
    assert all(torch.isfinite(value).all() for value in metrics.values())
    trainer.close()


def test_the_hand_derived_gradient_does_not_apply_to_masked_agents():
    spec = UpdateSpec.of(make_config({"algo": "ppo"}))
    discrete = ActionSpec("discrete", n=N_ACTIONS)
    unmasked = ActorCritic((N_ACTIONS,), discrete)
    masked = ActorCritic((2 * N_ACTIONS,), discrete, mask_width=N_ACTIONS)
    assert hand_gradient_applies(spec, FlatLayout(unmasked), nullcontext)
    assert not hand_gradient_applies(spec, FlatLayout(masked), nullcontext)


def test_the_update_is_finite_with_masks_for_ppo_and_a2c():
    for algo in ("ppo", "a2c"):
        trainer = _trainer(MaskedChoice, algo=algo)
        trainer.collect()
        metrics = trainer.update()
        assert metrics["losses/nonfinite_updates"] == 0 and trainer.weights_finite(), algo
        assert torch.isfinite(metrics["losses/entropy"]) and 0 < float(metrics["losses/entropy"]) < np.log(N_ACTIONS)
        trainer.close()


# ---------------------------------------------------------------------------------------------- torch-native
def test_a_torch_native_masked_env_steps_its_masks_rewards_and_episode_ends():
    """``MASKED_CHOICE`` (a ``TorchEnvSpec`` with ``action_mask``): the mask is the observation's last 6 columns and
    its subset; a valid action pays +1, an invalid one -1; every 50th step terminates (never truncates)."""
    from fastrl.envs.torch_envs import TorchEnv
    env = TorchEnv("benchmarks.masking:MASKED_CHOICE", 16, seed=3)
    assert env.observation_shape == (2 * N_ACTIONS,) and env.mask_width == N_ACTIONS
    assert isinstance(env.observation_space, gymnasium.spaces.Dict)
    obs, generator, paid = env.reset(), torch.Generator().manual_seed(0), {1.0: 0, -1.0: 0}
    for t in range(1, 2 * EPISODE_STEPS + 3):
        mask = obs[:, N_ACTIONS:] > 0.5
        assert torch.equal(mask, obs[:, :N_ACTIONS] > 0.5) and mask.any(-1).all()
        action = torch.randint(N_ACTIONS, (16,), generator=generator)
        step = env.step(action)
        chosen_valid = mask.gather(1, action.unsqueeze(1)).squeeze(1)
        expected = torch.where(chosen_valid, 1.0, -1.0) if t % (EPISODE_STEPS + 1) else torch.zeros(16)  # reset steps
        assert torch.equal(step.reward, expected), t
        assert bool(step.terminated.all()) == (t % (EPISODE_STEPS + 1) == EPISODE_STEPS) and not step.truncated.any()
        for value in (1.0, -1.0):
            paid[value] += int((step.reward == value).sum())
        obs = step.observation
    assert min(paid.values()) > 100  # both rewards were exercised


def test_a_torch_native_masked_population_only_ever_takes_valid_actions(tmp_path):
    """Two members on the torch backend (the compiled iteration): masked, every training episode earns the full 50 and
    stochastic ``predict`` never picks an invalid action; the same env unmasked does not (the check can fail)."""
    def train(name):
        return fastrl.train(env=f"benchmarks.masking:{name}", env_backend="torch", n_seeds=2, total_steps=1024,
                            n_envs=8, n_steps=32, eval_episodes=0, run_dir=tmp_path / name, **QUIET)
    masked, unmasked = train("MASKED_CHOICE"), train("UNMASKED_CHOICE")
    assert [m["episode_return_mean"] for m in masked.summary["members"]] == [50.0, 50.0]
    assert max(m["episode_return_mean"] for m in unmasked.summary["members"]) < 45.0
    valid = torch.rand(PREDICT_STEPS, N_ACTIONS, generator=torch.Generator().manual_seed(1)) < 0.3
    valid[torch.arange(PREDICT_STEPS), torch.arange(PREDICT_STEPS) % N_ACTIONS] = True
    observation = {"observation": valid.float().numpy(), "action_mask": valid.numpy().astype(np.int8)}
    actions, _ = fastrl.load(tmp_path / "MASKED_CHOICE", member=1).predict(observation, deterministic=False)
    chosen_valid = valid[torch.arange(PREDICT_STEPS), torch.as_tensor(actions)]
    assert actions.shape == (PREDICT_STEPS,) and bool(chosen_valid.all())


def test_a_torch_native_env_has_no_video_and_says_so_in_one_line():
    from fastrl.run.evaluate import _render_env
    env, why = _render_env("benchmarks.masking:MASKED_CHOICE")
    assert env is None and why == ("benchmarks.masking:MASKED_CHOICE is a torch-native env (a TorchEnvSpec), which has "
                                   "no renderer")


# ---------------------------------------------------------------------------------------------- errors
class _WrongWidth(UnmaskedChoice):
    observation_space = gymnasium.spaces.Dict({"observation": UnmaskedChoice.observation_space,
                                               "action_mask": gymnasium.spaces.MultiBinary(N_ACTIONS - 1)})


def test_mask_mistakes_are_one_line_errors(agents):
    assert "action_mask has 5 entries" in one_line_error(_trainer, _WrongWidth)
    assert "normalize_obs" in one_line_error(_trainer, MaskedChoice, normalize_obs=True)
    assert "use env_backend torch" in one_line_error(_trainer, "benchmarks.masking:MASKED_CHOICE")
    assert "not a TorchEnvSpec" in one_line_error(_trainer, "benchmarks.masking:MaskedChoice", env_backend="torch")
    unmasked = fastrl.train(env=UnmaskedChoice, total_steps=64, n_envs=2, n_steps=32, eval_episodes=0,
                            run_dir=None, **QUIET).agent
    assert "without action masks" in one_line_error(unmasked.predict, np.zeros(N_ACTIONS, np.float32),
                                                     action_masks=np.ones(N_ACTIONS, bool))


# ---------------------------------------------------------------------------------------------- learning
@pytest.mark.learning
def test_masked_training_beats_unmasked_training():
    """Same steps and hyperparameters, training return (the last episodes' mean): masked PPO takes valid actions only
    (50 an episode) from its first step; unmasked PPO, which sees the valid subset in its observation, is far from that
    after 1,024 steps (about 10)."""
    def returns(seed):
        return {name: fastrl.train(env=env, seed=seed, total_steps=1024, n_envs=8, n_steps=32, lr=3e-3, eval_episodes=0,
                                   run_dir=None, **QUIET).summary["episode_return_mean"]
                for name, env in (("masked", MaskedChoice), ("unmasked", UnmaskedChoice))}
    median, per_seed = median_of_seeds(returns)
    assert median["masked"] >= 45 and median["masked"] >= median["unmasked"] + 20, per_seed


def test_the_benchmark_runs_tiny_and_writes_its_json(tmp_path):
    import json

    from benchmarks import masking
    out = tmp_path / "masking.json"
    assert masking.main(["--steps", "128", "--seeds", "1", "--predict-steps", "200", "--out", str(out)]) == 0
    arms = json.loads(out.read_text())["arms"]
    assert set(arms) == {"masked", "unmasked"} and arms["masked"]["median_invalid_predictions"] == 0
    assert arms["unmasked"]["median_invalid_predictions"] > 0  # a barely trained unmasked policy errs
