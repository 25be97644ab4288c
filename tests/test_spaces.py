"""The spaces an SB3 user brings, each trained briefly on a tiny env built for it (tests/fastrl_space_envs.py):
channels-last images (transposed, an encoder chosen by size), MultiDiscrete and MultiBinary actions, Dict
observations, separate policy/value widths and a custom nn.Module policy (a user's VectorEnv: tests/test_vector_env.py)."""
import numpy as np
import pytest
import torch

import fastrl
from conftest import one_line_error
from fastrl.config import make_config
from fastrl.envs import make_env
from fastrl.models import DictActorCritic, PixelActorCritic, SmallCNN, resolve_encoder
from fastrl_space_envs import BitsMatch, DictMatch, MultiMatch, PixelMatch, PixelMatchSmall, TinyPolicy

QUIET = dict(progress=False, wandb="disabled", tensorboard=False, plot=False, quiet=True)
# 8 iterations of 4 envs x 32 steps; evaluation: 4 episodes of 8 steps.
BRIEF = dict(total_steps=1024, n_envs=4, n_steps=32, n_epochs=4, n_minibatches=2, eval_episodes=4, eval_seeds=1)


def _train(env, tmp_path, **overrides):
    return fastrl.train(env=env, run_dir=tmp_path / "run", **{**BRIEF, **QUIET, **overrides})


@pytest.mark.parametrize("env, encoder", [(PixelMatch, "small_cnn"), (PixelMatchSmall, "small_cnn")])
def test_channels_last_images_are_transposed_and_get_an_encoder_that_fits(env, encoder, tmp_path):
    size = env.size
    batched = make_env(make_config({"env": fastrl.envs.env_name(env), "n_envs": 2}))
    obs = batched.reset()
    batched.close()
    assert batched.observation_shape == (3, size, size) and obs.shape == (2, 3, size, size) and obs.dtype == torch.uint8
    assert resolve_encoder("auto", (3, size, size)) == encoder
    run = _train(env, tmp_path, lr=1e-3)
    agent = run.agent
    assert isinstance(agent.policy, PixelActorCritic) and isinstance(agent.policy.encoder, SmallCNN)
    frame = np.zeros((size, size, 3), np.uint8)
    assert agent.act(frame).shape == () and agent.act(np.stack([frame] * 5)).shape == (5,)  # channels last, as given
    assert run.summary["eval_return_mean"] is not None


def test_encoder_choice_by_image_size():
    assert [resolve_encoder("auto", (3, s, s)) for s in (4, 7, 15, 16, 32, 35, 36, 84)] == [
        "small_cnn", "minigrid_cnn", "minigrid_cnn", "small_cnn", "small_cnn", "small_cnn", "nature_cnn", "nature_cnn"]


@pytest.mark.parametrize("env, shape, random_return", [(MultiMatch, (2,), 2.0), (BitsMatch, (3,), 4.0)])
def test_multidiscrete_and_multibinary_actions_train(env, shape, random_return, tmp_path):
    """Each component is its own categorical; 2048 steps take the return well above a random policy's."""
    run = _train(env, tmp_path, total_steps=3072, lr=3e-3, ent_coef=0.0)
    agent = run.agent
    assert agent.action_spec.nvec and agent.action_spec.shape == shape
    one = agent.act(np.zeros(env.observation_space.shape, np.float32))
    assert one.shape == shape and one.dtype == np.int64
    assert agent.act(np.zeros((5, *env.observation_space.shape), np.float32)).shape == (5, *shape)
    action, _, _, _ = agent.policy.get_action_and_value(torch.zeros(64, *env.observation_space.shape))
    assert action.shape == (64, *shape) and set(action.unique().tolist()) <= set(range(4))
    assert run.summary["eval_return_mean"] >= random_return + 2.0, run.summary


def test_dict_observations_train_with_an_mlp_and_a_cnn(tmp_path):
    run = _train(DictMatch, tmp_path, total_steps=3072, lr=3e-3)
    agent = run.agent
    assert isinstance(agent.policy, DictActorCritic) and list(agent.policy.images) == ["frame"]
    assert agent.observation_shape == (4 + 36,)
    obs = DictMatch.observation_space.sample()
    assert agent.act(obs).shape == ()
    batch = {key: np.stack([value] * 3) for key, value in obs.items()}
    assert agent.act(batch).shape == (3,)
    assert run.summary["eval_return_mean"] >= 5.0, run.summary  # random: 2 of 8


def test_separate_policy_and_value_widths(tmp_path):
    run = _train(MultiMatch, tmp_path, total_steps=256, eval_episodes=0, pi_sizes=[32], vf_sizes=[16, 16])
    policy = run.agent.policy
    assert [m.out_features for m in policy.actor_trunk if hasattr(m, "out_features")] == [32]
    assert [m.out_features for m in policy.critic_trunk if hasattr(m, "out_features")] == [16, 16]
    assert "shared_trunk" in one_line_error(make_config, {"pi_sizes": [8], "shared_trunk": True})


def test_a_custom_policy_module_trains_and_reloads(tmp_path):
    from fastrl_match_env import MatchTarget
    run = _train(MatchTarget, tmp_path, policy=TinyPolicy, total_steps=2048, lr=1e-2)
    assert run.summary["eval_return_mean"] >= 6.0, run.summary  # random: 2 of 8
    # a saved module:Name env or policy is rebuilt only when passed
    assert "--policy fastrl_space_envs:TinyPolicy" in one_line_error(fastrl.load, run.run_dir, env=MatchTarget)
    agent = fastrl.load(run.run_dir, env=MatchTarget, policy=TinyPolicy)
    assert isinstance(agent.policy, TinyPolicy) and agent.config.policy == "fastrl_space_envs:TinyPolicy"
    local = type("Local", (TinyPolicy,), {})
    local.__qualname__ = "f.<locals>.Local"
    assert "module-level" in one_line_error(fastrl.train, env=MatchTarget, policy=local, **QUIET)
