"""The spaces an SB3 user brings, each trained briefly on a tiny env built for it (tests/fastrl_space_envs.py):
channels-last images (transposed, an encoder chosen by size), MultiDiscrete and MultiBinary actions, Dict
observations, Discrete and MultiDiscrete observations (one-hot encoded; Gymnasium's and EnvPool's toy-text tasks),
spaces as plain data, the defaults for image envs, separate policy/value widths and a custom nn.Module policy (a
user's VectorEnv: tests/test_vector_env.py)."""
import json

import gymnasium
import numpy as np
import pytest
import torch

import fastrl
from conftest import median_of_seeds, one_line_error
from fastrl.config import make_config
from fastrl.envs.batched import make_env
from fastrl.envs.spaces import space_from_data, space_to_data, spaces_to_data
from fastrl.learn.models import (ActorCritic, DictActorCritic, NatureCNN, OneHot, PixelActorCritic, SmallCNN,
                                 resolve_encoder)
from fastrl_space_envs import (BitsMatch, CodeMatch, DictCodeMatch, DictMatch, MultiMatch, PixelMatch, PixelMatchSmall,
                               PixelSteer, TinyPolicy)

QUIET = dict(progress=False, wandb="disabled", tensorboard=False, plot=False, quiet=True)
# 8 iterations of 4 envs x 32 steps; evaluation: 4 episodes of 8 steps.
BRIEF = dict(total_steps=1024, n_envs=4, n_steps=32, n_epochs=4, n_minibatches=2, eval_episodes=4, eval_seeds=1)


def _train(env, tmp_path, **overrides):
    return fastrl.train(env=env, run_dir=tmp_path / "run", **{**BRIEF, **QUIET, **overrides})


@pytest.mark.parametrize("env, encoder", [(PixelMatch, "small_cnn"), (PixelMatchSmall, "small_cnn")])
def test_channels_last_images_are_transposed_and_get_an_encoder_that_fits(env, encoder, tmp_path):
    size = env.size
    batched = make_env(make_config({"env": fastrl.envs.registry.env_name(env), "n_envs": 2}))
    obs = batched.reset()
    batched.close()
    assert batched.observation_shape == (3, size, size) and obs.shape == (2, 3, size, size) and obs.dtype == torch.uint8
    assert resolve_encoder("auto", (3, size, size)) == encoder
    run = _train(env, tmp_path, lr=1e-3, total_steps=256)
    agent = run.agent
    assert isinstance(agent.policy, PixelActorCritic) and isinstance(agent.policy.encoder, SmallCNN)
    frame = np.zeros((size, size, 3), np.uint8)
    assert agent.act(frame).shape == () and agent.act(np.stack([frame] * 5)).shape == (5,)  # channels last, as given
    # the agent, acting on the env's channels-last frames, replays the run's final evaluation (4 episodes, 1 seed)
    assert agent.evaluate(episodes=4).mean() == pytest.approx(run.summary["eval_return_mean"]), run.summary


def test_encoder_choice_by_image_size():
    assert [resolve_encoder("auto", (3, s, s)) for s in (4, 7, 15, 16, 32, 35, 36, 84)] == [
        "small_cnn", "minigrid_cnn", "minigrid_cnn", "small_cnn", "small_cnn", "small_cnn", "nature_cnn", "nature_cnn"]


DICT_STEPS = 768  # DictMatch steps slowly on CPU; seeds 1-3 each reach the maximum, 8, in 768 steps


def _learned_return(env, tmp_path, seed: int, **overrides) -> float:
    return _train(env, tmp_path / f"seed{seed}", seed=seed, **overrides).summary["eval_return_mean"]


@pytest.mark.parametrize("env, shape", [(MultiMatch, (2,)), (BitsMatch, (3,))])
def test_multidiscrete_and_multibinary_actions_have_the_spaces_shape(env, shape, tmp_path):
    """Each component is its own categorical: one action or a batch of them, the action space's shape, int64."""
    agent = _train(env, tmp_path, total_steps=256, eval_episodes=0).agent
    assert agent.action_spec.nvec and agent.action_spec.shape == shape
    one = agent.act(np.zeros(env.observation_space.shape, np.float32))
    assert one.shape == shape and one.dtype == np.int64
    assert agent.act(np.zeros((5, *env.observation_space.shape), np.float32)).shape == (5, *shape)
    action, _, _, _ = agent.policy.get_action_and_value(torch.zeros(64, *env.observation_space.shape))
    assert action.shape == (64, *shape) and set(action.unique().tolist()) <= set(range(4))


@pytest.mark.learning
@pytest.mark.parametrize("env, random_return", [(MultiMatch, 2.0), (BitsMatch, 4.0)])
def test_multidiscrete_and_multibinary_actions_learn(env, random_return, tmp_path):
    """3072 steps take the median seed's return well above a random policy's."""
    median, returns = median_of_seeds(lambda seed: _learned_return(env, tmp_path, seed, total_steps=3072, lr=3e-3,
                                                                   ent_coef=0.0))
    assert median >= random_return + 2.0, returns


def test_dict_observations_get_an_mlp_and_a_cnn(tmp_path):
    agent = _train(DictMatch, tmp_path, total_steps=256, eval_episodes=0).agent
    assert isinstance(agent.policy, DictActorCritic) and list(agent.policy.images) == ["frame"]
    assert agent.observation_shape == (4 + 36,)
    obs = DictMatch.observation_space.sample()
    assert agent.act(obs).shape == ()
    batch = {key: np.stack([value] * 3) for key, value in obs.items()}
    assert agent.act(batch).shape == (3,)


@pytest.mark.learning
def test_dict_observations_learn(tmp_path):
    median, returns = median_of_seeds(lambda seed: _learned_return(DictMatch, tmp_path, seed, total_steps=DICT_STEPS,
                                                                   lr=3e-3))
    assert median >= 5.0, returns  # random: 2 of 8


def test_a_custom_policy_on_dict_observations_predicts_from_a_dict(tmp_path):
    """The Dict observation is packed from the saved observation space, not from the policy: a custom policy (which
    has no ``layout``) predicts from the env's own dict, one or a batch, as it acted in training."""
    run = _train(DictMatch, tmp_path, policy=TinyPolicy, total_steps=256, eval_episodes=0)
    agent = fastrl.load(run.run_dir, env=DictMatch, policy=TinyPolicy)
    assert isinstance(agent.policy, TinyPolicy) and not hasattr(agent.policy, "layout")
    obs = DictMatch.observation_space.sample()
    packed = torch.cat([torch.as_tensor(obs["cue"]), torch.as_tensor(obs["frame"]).movedim(-1, 0).flatten().float()])
    action, _ = agent.predict(obs, deterministic=True)
    assert int(action) == int(agent.policy.act_deterministic(packed[None])[0])
    batch = {key: np.stack([value] * 3) for key, value in obs.items()}
    assert agent.predict(batch, deterministic=True)[0].tolist() == [int(action)] * 3


def test_separate_policy_and_value_widths(tmp_path):
    run = _train(MultiMatch, tmp_path, total_steps=256, eval_episodes=0, pi_sizes=[32], vf_sizes=[16, 16])
    policy = run.agent.policy
    assert [m.out_features for m in policy.actor_trunk if hasattr(m, "out_features")] == [32]
    assert [m.out_features for m in policy.critic_trunk if hasattr(m, "out_features")] == [16, 16]
    assert "shared_trunk" in one_line_error(make_config, {"pi_sizes": [8], "shared_trunk": True})


@pytest.mark.learning
def test_a_custom_policy_module_learns(tmp_path):
    from fastrl_match_env import MatchTarget
    median, returns = median_of_seeds(lambda seed: _learned_return(MatchTarget, tmp_path, seed, policy=TinyPolicy,
                                                                   total_steps=2048, lr=1e-2))
    assert median >= 6.0, returns  # random: 2 of 8


def test_a_custom_policy_module_trains_and_reloads(tmp_path):
    from fastrl_match_env import MatchTarget
    run = _train(MatchTarget, tmp_path, policy=TinyPolicy, total_steps=256, eval_episodes=0)
    # a saved module:Name env or policy is rebuilt only when passed
    assert "--policy fastrl_space_envs:TinyPolicy" in one_line_error(fastrl.load, run.run_dir, env=MatchTarget)
    agent = fastrl.load(run.run_dir, env=MatchTarget, policy=TinyPolicy)
    assert isinstance(agent.policy, TinyPolicy) and agent.config.policy == "fastrl_space_envs:TinyPolicy"
    local = type("Local", (TinyPolicy,), {})
    local.__qualname__ = "f.<locals>.Local"
    assert "module-level" in one_line_error(fastrl.train, env=MatchTarget, policy=local, **QUIET)


S = gymnasium.spaces
ROUND_TRIP = [S.Box(-1.0, 1.0, (3,), np.float32), S.Box(np.array([0.0, -np.inf]), np.array([1.0, np.inf]), dtype=np.float64),
              S.Box(0, 255, (6, 5, 3), np.uint8), S.Box(np.arange(4).reshape(2, 2), 9, (2, 2), np.int32),
              S.Discrete(5, start=-2), S.MultiDiscrete([[2, 3], [4, 5]], start=[[0, 1], [2, 3]]), S.MultiBinary([2, 3]),
              S.Text(8, min_length=2, charset="abc"),
              S.Dict({"image": S.Box(0, 255, (7, 7, 3), np.uint8), "mission": S.Text(10), "direction": S.Discrete(4)}),
              S.Tuple([S.Discrete(32), S.Discrete(11), S.MultiBinary(1)])]


@pytest.mark.parametrize("space", ROUND_TRIP, ids=lambda space: type(space).__name__)
def test_spaces_round_trip_as_plain_data(space):
    data = space_to_data(space)
    assert json.loads(json.dumps(data)) == data  # plain data: dicts, lists, strings and numbers
    assert space_from_data(data) == space and space_from_data(data).dtype == space.dtype
    assert spaces_to_data(S.Sequence(S.Discrete(2)), space) is None  # a space with no such form: no spaces saved


def test_one_hot_encodes_each_component_from_its_start():
    one_hot = OneHot((3, 2), (1, 0))
    x = torch.tensor([[1, 0], [3, 1], [4, 1], [0, 0]])  # 4 and 0 lie outside the first component's 1..3
    expected = torch.tensor([[1, 0, 0, 1, 0], [0, 0, 1, 0, 1], [0, 0, 0, 0, 1], [0, 0, 0, 1, 0]], dtype=torch.float32)
    assert one_hot.width == 5 and torch.equal(one_hot(x), expected)
    assert torch.equal(torch.func.vmap(one_hot)(x.view(2, 2, 2)), expected.view(2, 2, 5))  # as K members call it
    assert list(one_hot.state_dict()) == []  # nothing new in a checkpoint


@pytest.mark.parametrize("backend", ["gymnasium", "envpool"])
def test_discrete_observations_are_stored_as_integers(backend):
    env = make_env(make_config({"env": "FrozenLake-v1", "env_backend": backend, "n_envs": 2}))
    obs = env.reset()
    step = env.step(torch.zeros(2, dtype=torch.int64))
    env.close()
    assert env.observation_shape == (1,) and env.observation_dtype == torch.int64
    assert obs.shape == step.observation.shape == (2, 1) and not obs.dtype.is_floating_point and obs.eq(0).all()


# Gymnasium 1.x retired Taxi-v3 and CliffWalking-v0 for v4 and v1; EnvPool still has them (and FrozenLake-v1).
@pytest.mark.parametrize("env, backend, states, actions", [
    ("FrozenLake-v1", "gymnasium", 16, 4), ("FrozenLake-v1", "envpool", 16, 4), ("Taxi-v3", "envpool", 500, 6),
    ("CliffWalking-v0", "envpool", 48, 4), ("Taxi-v4", "gymnasium", 500, 6), ("CliffWalking-v1", "gymnasium", 48, 4)])
def test_toy_text_tasks_train_and_act(env, backend, states, actions, tmp_path):
    run = _train(env, tmp_path, env_backend=backend, total_steps=256, eval_episodes=0)
    agent = run.agent
    assert isinstance(agent.policy, ActorCritic) and agent.policy.one_hot.width == states
    assert agent.observation_space == gymnasium.spaces.Discrete(states)
    chosen = agent.predict(np.arange(states))[0]
    assert chosen.shape == (states,) and chosen.min() >= 0 and chosen.max() < actions
    assert agent.predict(states - 1)[0] == chosen[-1]


def test_discrete_entries_and_multidiscrete_observations_act_as_the_env_gives_them(tmp_path):
    agent = _train(CodeMatch, tmp_path / "code", total_steps=256, eval_episodes=0).agent
    assert isinstance(agent.policy, ActorCritic) and agent.policy.one_hot.width == 4 + 3
    assert agent.predict(np.array([1, 2]))[0].shape == () and agent.predict(np.array([[1, 2], [4, 0]]))[0].shape == (2,)
    agent = _train(DictCodeMatch, tmp_path / "dict", total_steps=256, eval_episodes=0).agent
    assert isinstance(agent.policy, DictActorCritic) and list(agent.policy.one_hots) == ["cue"]
    assert agent.policy.vector_trunk[0].in_features == 4 + 2
    obs = DictCodeMatch.observation_space.sample()
    assert agent.predict(obs)[0].shape == () and agent.predict({k: np.stack([v] * 3) for k, v in obs.items()})[0].shape == (3,)


@pytest.mark.learning
@pytest.mark.parametrize("env", [CodeMatch, DictCodeMatch])
def test_discrete_observations_learn(env, tmp_path):
    """The target is only in the Discrete (entry's) value: one-hot encoded, 3072 steps learn it (random: 2 of 8)."""
    median, returns = median_of_seeds(lambda seed: _train(env, tmp_path / str(seed), seed=seed, total_steps=3072,
                                                          lr=3e-3).summary["eval_return_mean"])
    assert median >= 6.0, returns


def test_an_image_env_without_a_tuned_config_gets_a_cnn_and_raw_frames(tmp_path):
    """Continuous actions bring the general default's observation normalization, which uint8 frames cannot take:
    they are stored as they are and scaled inside the CNN."""
    run = fastrl.train(env=PixelSteer, run_dir=tmp_path / "run", total_steps=256, n_envs=2, n_steps=64,
                       eval_episodes=0, **QUIET)
    cfg = run.agent.config
    assert not cfg.normalize_obs and cfg.normalize_reward and cfg.n_epochs == 10  # the continuous default otherwise
    assert isinstance(run.agent.policy, PixelActorCritic) and isinstance(run.agent.policy.encoder, NatureCNN)
    assert run.agent.observation_dtype == torch.uint8


def test_frozenlake_trains_with_the_general_discrete_default_over_300k_steps():
    from fastrl.defaults import GENERAL_DEFAULTS
    from fastrl.run.run_config import build_config
    cfg, _ = build_config({"env": "FrozenLake-v1"})
    assert "ppo/frozenlake" in cfg.origin and cfg.total_steps == 300_000 and not cfg.normalize_obs
    assert {key: getattr(cfg, key) for key in GENERAL_DEFAULTS["discrete"] if key != "total_steps"} == {
        key: value for key, value in GENERAL_DEFAULTS["discrete"].items() if key != "total_steps"}
