"""Pixel tasks through EnvPool: Atari true-score bookkeeping, MiniGrid observations, CNN encoders, a deterministic
MiniGrid update, and PPO learning MiniGrid (the median of 3 seeds)."""
import math

import pytest
import torch

from conftest import LEARNING_POPULATION, median_of_members
from fastrl.config import load_yaml, make_config
from fastrl.envs.batched import BatchedEnv, make_env
from fastrl.envs.registry import atari_kwargs, is_atari
from fastrl.learn.models import ImpalaResNet, NatureCNN, PixelActorCritic, make_agent, resolve_encoder
from fastrl.run.session import run
from fastrl.run.trainer import Trainer

QUIET = dict(progress=False, tensorboard=False, wandb="disabled", plot=False)


def _atari(env_id, seed, clip):
    cfg = make_config(dict(env=env_id))
    kwargs = atari_kwargs(cfg, training=True)
    kwargs["reward_clip"] = clip
    return BatchedEnv(env_id, 1, seed, num_threads=1, env_kwargs=kwargs)


@pytest.mark.parametrize("env_id", ["Breakout-v5", "SpaceInvaders-v5"])
def test_atari_stats_report_the_real_game_score_over_all_lives(env_id):
    """Random play to game over, twice in lock-step (same seed, same actions): with reward clipping and
    episodic life for training, and without clipping. The clipped env trains on sign(r) and sees one
    `terminated` per lost life, yet records one episode whose return is the unclipped sum over all lives."""
    assert is_atari(env_id)
    clipped, raw = _atari(env_id, 3, clip=True), _atari(env_id, 3, clip=False)
    obs = clipped.reset()
    raw.reset()
    assert obs.dtype == torch.uint8 and obs.shape == (1, 4, 84, 84)
    assert clipped.observation_shape == (4, 84, 84) and clipped.obs_scale == pytest.approx(1 / 255)
    gen = torch.Generator().manual_seed(0)
    true_score, length, life_losses = 0.0, 0, 0
    for _ in range(20_000):
        action = torch.randint(clipped.action_spec.n, (1,), generator=gen)
        a, b = clipped.step(action), raw.step(action)
        assert torch.equal(a.observation, b.observation)
        if bool(b.valid):
            true_score += float(b.reward)
            length += 1
            assert float(a.reward) == (float(b.reward) > 0) - (float(b.reward) < 0)
        if bool(a.done) and clipped.stats.count == 0:
            life_losses += 1  # a life lost, the game goes on: no episode recorded
        if clipped.stats.count:
            break
    assert clipped.stats.count == 1, "the game never ended"
    assert life_losses >= 1, "episodic life should end training episodes at each lost life"
    returns, lengths = clipped.stats.recent()
    assert returns[0].item() == pytest.approx(true_score)
    assert lengths[0].item() == length
    assert true_score > 0, "pick a seed whose random game scores, so the test means something"
    clipped.close()
    raw.close()


def test_make_env_applies_atari_options_and_eval_plays_whole_games(monkeypatch):
    """The config's Atari options reach EnvPool; the evaluation env (training=False) plays whole, unclipped games."""
    import fastrl.envs.batched
    built = []

    def recording(*args, env_kwargs=None, **kwargs):
        built.append(env_kwargs)
        return BatchedEnv(*args, env_kwargs=env_kwargs, **kwargs)
    monkeypatch.setattr(fastrl.envs.batched, "BatchedEnv", recording)
    cfg = make_config(dict(env="Pong-v5", n_envs=2, frame_stack=2, frame_skip=3, noop_max=7, env_threads=1))
    for training in (True, False):
        env = make_env(cfg, training=training)
        assert env.observation_shape == (2, 84, 84) and env.observation_dtype == torch.uint8
        assert env.reset().shape == (2, 2, 84, 84)
        env.close()
    options = dict(frame_skip=3, stack_num=2, noop_max=7)
    assert built == [{**options, "episodic_life": True, "reward_clip": True},
                     {**options, "episodic_life": False, "reward_clip": False}], built
    assert atari_kwargs(cfg, training=False) == built[1]


def test_minigrid_observations_are_uint8_channels_first():
    env = BatchedEnv("MiniGrid-Empty-5x5-v0", 3, seed=0, num_threads=1)
    obs = env.reset()
    assert env.observation_shape == (3, 7, 7) and env.observation_dtype == torch.uint8
    assert obs.shape == (3, 3, 7, 7) and obs.dtype == torch.uint8
    assert env.action_spec.n == 7
    assert resolve_encoder("auto", env.observation_shape) == "minigrid_cnn"
    step = env.step(torch.zeros(3, dtype=torch.int64))
    assert step.observation.shape == (3, 3, 7, 7)
    env.close()


@pytest.mark.parametrize("encoder, cls, features", [("nature_cnn", NatureCNN, 512), ("impala_resnet", ImpalaResNet, 256)])
def test_cnn_encoders_take_uint8_frames(encoder, cls, features):
    from fastrl.envs.spaces import ActionSpec
    agent = PixelActorCritic((4, 84, 84), ActionSpec("discrete", n=6), encoder)
    assert isinstance(agent.encoder, cls) and agent.encoder.out_dim == features
    frames = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    action, logp, entropy, value = agent.get_action_and_value(frames)
    assert action.shape == logp.shape == entropy.shape == value.shape == (5,)
    assert torch.allclose(entropy, torch.full((5,), math.log(6)), atol=1e-3)  # near-uniform initial policy
    assert torch.allclose(agent.get_value(frames), value)
    cl = PixelActorCritic((4, 84, 84), ActionSpec("discrete", n=6), encoder, channels_last=True)
    cl.load_state_dict(agent.state_dict())
    assert torch.allclose(cl.get_value(frames), value, atol=1e-4)


def test_atari_trainer_keeps_frames_uint8_in_the_buffer():
    cfg = make_config(dict(env="Breakout-v5", n_envs=2, n_steps=4, n_minibatches=2, env_threads=1, compile="off",
                           **QUIET))  # eager: the Atari budget would compile the update, which the dtype does not need
    trainer = Trainer(cfg)
    assert resolve_encoder(cfg.encoder, trainer.env.observation_shape) == "nature_cnn"
    trainer.collect()
    assert trainer.buffer["observation"].dtype == torch.uint8
    assert trainer.buffer["observation"].shape == (4, 2, 4, 84, 84)
    metrics = trainer.update()
    assert torch.isfinite(metrics["losses/policy_loss"])
    trainer.env.close()


def test_checkpointed_model_carries_its_observation_scale():
    cfg = make_config(dict(env="MiniGrid-Empty-5x5-v0"))
    env = make_env(cfg, n_envs=1)
    agent = make_agent(cfg, env.observation_shape, env.action_spec, env.obs_scale)
    fresh = make_agent(cfg, env.observation_shape, env.action_spec)  # as fastrl.load builds it
    fresh.load_state_dict(agent.state_dict())
    assert fresh.obs_scale.item() == pytest.approx(0.1)
    env.close()


def test_minigrid_ppo_iteration_is_deterministic_per_seed():
    """One collect + update of the MiniGrid CNN agent, twice with one seed and once with another: the same seed
    gives the same rollout, losses and weights bit for bit; the update moves the weights; another seed differs."""
    def one_iteration(seed):
        cfg = make_config({**load_yaml("configs/ppo/minigrid.yaml"), **QUIET, "n_envs": 4, "n_steps": 16,
                           "n_minibatches": 2, "n_epochs": 2, "seed": seed})
        trainer = Trainer(cfg)
        initial = torch.nn.utils.parameters_to_vector(trainer.agent.parameters()).detach().clone()
        trainer.collect()
        rollout = (trainer.buffer["observation"].clone(), trainer.buffer["action"].clone())
        metrics = {k: float(v) for k, v in trainer.update().items() if k.startswith("losses/")}
        final = torch.nn.utils.parameters_to_vector(trainer.agent.parameters()).detach().clone()
        trainer.close()
        return initial, rollout, metrics, final

    (init_a, rollout_a, metrics_a, final_a), (_, rollout_b, metrics_b, final_b) = one_iteration(5), one_iteration(5)
    assert torch.equal(rollout_a[0], rollout_b[0]) and torch.equal(rollout_a[1], rollout_b[1])
    assert metrics_a == metrics_b
    assert torch.equal(final_a, final_b)
    assert not torch.equal(init_a, final_a), "the update did not change the weights"
    _, rollout_c, _, final_c = one_iteration(6)
    assert not torch.equal(rollout_a[0], rollout_c[0]) and not torch.equal(final_a, final_c)


@pytest.mark.learning
def test_ppo_learns_minigrid_empty(tmp_path):
    """PPO learns MiniGrid-Empty-5x5-v0 within 40k steps: LEARNING_SEEDS as one population, the median member's
    training return >= 0.8 and deterministic evaluation >= 0.7. The optimum is about 0.96 and the run stops once
    every member reaches 0.9; a random policy averages about 0.2 (more than half its episodes run out of steps,
    return 0)."""
    values = {**load_yaml("configs/ppo/minigrid.yaml"), **QUIET, **LEARNING_POPULATION, "total_steps": 40_960,
              "stop_at_return": 0.9, "eval_episodes": 16, "run_dir": str(tmp_path / "learn")}
    median, by_seed = median_of_members(run(make_config(values)), ("episode_return_mean", "eval_return_mean"))
    assert median["episode_return_mean"] >= 0.8 and median["eval_return_mean"] >= 0.7, by_seed
