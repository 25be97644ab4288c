"""Async collection (``env_mode: async``) against the sync loop: from the same seeds and a policy that is a function
of each observation alone, every env's transition stream (observation, action, log-prob, value, reward,
terminated, truncated, done, valid, next value) and its finished episodes are identical, bit for bit, since each
env's trajectory depends only on its own actions. Checked for terminations (CartPole), time-limit truncations
(Pendulum, continuous actions) and Atari's episodic life, also with recv batches that mix groups in any order.
Plus the env-mode choice and its one-line refusals."""
import numpy as np
import pytest
import torch

from conftest import one_line_error
from fastrl.config import make_config
from fastrl.envs.async_env import AsyncBatchedEnv, AsyncStep, async_unsupported, resolve_env_mode
from fastrl.run.preflight import check_env_mode
from fastrl.run.trainer import Trainer

QUIET = dict(progress=False, tensorboard=False, wandb="disabled", plot=False, eval_episodes=0)
KEYS = ["observation", "action", "sample_log_prob", "state_value", "valid", ("next", "reward"), ("next", "done"),
        ("next", "terminated"), ("next", "truncated"), ("next", "state_value")]


def _deterministic_policy(action_spec):
    """A policy whose action, log-prob and value for an env depend on that env's observation only (so neither the
    batch it arrives in nor torch's global RNG matters); its actions look random enough to end episodes often."""
    def features(obs):
        x = obs.flatten(1).float()
        return (torch.sin(x * 12.9898 + torch.arange(x.shape[1]) * 0.7) * 43758.5453).frac().sum(-1)

    def policy_step(obs, action=None, noise=None):
        h = features(obs)
        if action_spec.kind == "discrete":
            action = (h.abs() * 1000).long() % action_spec.n
        else:
            action = torch.sin(h * 3.0)[:, None].expand(-1, *action_spec.shape) * 2.0
        return action, h * 0.5, torch.zeros_like(h), h

    return policy_step, features


class _MixedRecv:
    """An AsyncBatchedEnv whose ``recv`` returns any ``group_size`` of the results that are ready, in any order
    (a seeded shuffle across every group in flight): all EnvPool may do, and more."""

    def __init__(self, env: AsyncBatchedEnv, seed: int):
        self.env, self.rng = env, np.random.default_rng(seed)
        self.in_flight, self.ready = 0, []

    def __getattr__(self, name):
        return getattr(self.env, name)

    def send(self, action, env_ids):
        self.env.send(action, env_ids)
        self.in_flight += len(env_ids)

    def recv(self):
        while self.in_flight:  # whole groups are in flight, so these waits always end
            step = self.env.recv()
            self.in_flight -= len(step.env_ids)
            fields = (step.observation, step.reward, step.terminated, step.truncated, step.valid, step.done)
            self.ready += [(int(i), *(f[k].clone() for f in fields)) for k, i in enumerate(step.env_ids)]
        order = self.rng.permutation(len(self.ready))
        picked = [self.ready[k] for k in order[:self.env.group_size]]
        self.ready = [self.ready[k] for k in order[self.env.group_size:]]
        ids = np.array([p[0] for p in picked], dtype=np.int64)
        stacked = [torch.stack([p[j] for p in picked]) for j in range(1, 7)]
        return AsyncStep(*stacked, env_ids=ids)


def _streams(env_id, n_envs, n_steps, iterations, mode, extra=None, mix_seed=None):
    # compile off: the sync loop then runs the policy_step swapped in below (a compiled rollout step, which compile
    # auto may choose once its graph is in the cache, calls the agent itself).
    cfg = make_config(dict(env=env_id, n_envs=n_envs, n_steps=n_steps, n_minibatches=1, env_mode=mode, seed=3,
                           env_threads=2, compile="off", **QUIET, **(extra or {})))
    trainer = Trainer(cfg)
    try:
        assert trainer.env_mode == mode
        trainer.policy_step, features = _deterministic_policy(trainer.env.action_spec)
        trainer.bootstrap_value = features
        if mix_seed is not None:
            trainer.async_rollout.env = _MixedRecv(trainer.async_rollout.env, mix_seed)
        rollouts = []
        for _ in range(iterations):
            trainer.collect()
            rollouts.append({key: trainer.buffer[key].clone() for key in KEYS})
        stats = trainer.env.stats
        returns, lengths = stats.recent()
        episodes = sorted(zip(returns.tolist(), lengths.tolist()))
        running = (stats.running_return.clone(), stats.running_length.clone())
        return rollouts, episodes, running, trainer.global_step, trainer.next_obs.clone()
    finally:
        trainer.close()


def _assert_identical(sync, other, episodes_end=True):
    rollouts_s, episodes_s, running_s, step_s, next_s = sync
    rollouts_o, episodes_o, running_o, step_o, next_o = other
    for it, (a, b) in enumerate(zip(rollouts_s, rollouts_o)):
        for key in KEYS:
            assert torch.equal(a[key], b[key]), f"iteration {it}: {key} differs between sync and async"
    assert episodes_s == episodes_o and (len(episodes_s) > 0 or not episodes_end)
    assert torch.equal(running_s[0], running_o[0]) and torch.equal(running_s[1], running_o[1])
    assert step_s == step_o and torch.equal(next_s, next_o)


@pytest.mark.parametrize("mix_seed", [None, 0])
def test_async_streams_equal_sync_with_terminations(mix_seed):
    sync = _streams("CartPole-v1", 8, 32, 3, "sync")
    rollouts = sync[0]
    assert sum(int((~r["valid"]).sum()) for r in rollouts) > 8, "too few episode ends to test reset masking"
    _assert_identical(sync, _streams("CartPole-v1", 8, 32, 3, "async", mix_seed=mix_seed))


def test_async_streams_equal_sync_with_truncations_and_continuous_actions():
    """Pendulum-v1 truncates every episode at step 200 and never terminates: 3 x 96 steps cross it, so the
    truncated step's next value must be V(real final observation) in both modes."""
    sync = _streams("Pendulum-v1", 4, 96, 3, "sync")
    truncated = torch.cat([r[("next", "truncated")] for r in sync[0]])
    assert truncated.sum() == 4 and not any(r[("next", "terminated")].any() for r in sync[0])
    _assert_identical(sync, _streams("Pendulum-v1", 4, 96, 3, "async", mix_seed=1))


def test_async_streams_equal_sync_on_atari_with_episodic_life():
    """A lost life is a terminated step for training; no game ends this soon (statistics count whole games)."""
    sync = _streams("Breakout-v5", 4, 64, 2, "sync")
    assert any(r[("next", "terminated")].any() for r in sync[0])
    _assert_identical(sync, _streams("Breakout-v5", 4, 64, 2, "async", mix_seed=2), episodes_end=False)


def test_async_trainer_updates_and_logs_its_mode():
    cfg = make_config(dict(env="CartPole-v1", n_envs=4, n_steps=16, n_epochs=1, env_mode="async", **QUIET))
    trainer = Trainer(cfg)
    try:
        trainer.collect()
        metrics = trainer.update()
        assert torch.isfinite(metrics["losses/policy_loss"])
        assert trainer.summary_extras()["env_mode"] == "async"
        assert trainer.global_step == 64
    finally:
        trainer.close()


def test_env_mode_choices_and_refusals():
    assert resolve_env_mode(make_config(dict(env_mode="auto")), 8) == "sync"  # flat observations: sync measured faster
    assert resolve_env_mode(make_config(dict(env_mode="auto", env="Breakout-v5")), 8) == "async"  # frames: async
    # a recurrent policy steps every env together (async is refused for it): auto picks sync, frames or not
    assert resolve_env_mode(make_config(dict(env_mode="auto", env="Breakout-v5", recurrent="lstm")), 8) == "sync"
    assert resolve_env_mode(make_config(dict(env_mode="auto", env_backend="gymnasium")), 8) == "sync"
    assert resolve_env_mode(make_config(dict(env_mode="auto")), 7) == "sync"
    assert resolve_env_mode(make_config(dict(env_mode="async")), 8) == "async"
    assert async_unsupported("CartPole-v1", "auto", 8) is None
    assert "multiple of 2" in async_unsupported("CartPole-v1", "auto", 7)
    assert "EnvPool" in async_unsupported("CartPole-v1", "gymnasium", 8)
    message = one_line_error(make_config, dict(env_mode="async", normalize_obs=True))
    assert "env_mode=async" in message and "--env-mode sync" in message
    message = one_line_error(check_env_mode, make_config(dict(env_mode="async", n_envs=7)))
    assert "multiple of 2" in message and "--env-mode sync" in message
    message = one_line_error(check_env_mode, make_config(dict(env_mode="async", env_backend="gymnasium")))
    assert "EnvPool" in message
    check_env_mode(make_config(dict(env_mode="async", n_envs=8)))
    check_env_mode(make_config(dict(algo="impala", env_mode="async", n_envs=8)))
    message = one_line_error(check_env_mode, make_config(dict(algo="appo", env_mode="async", n_envs=10)))
    assert "each actor's 5 envs" in message and "multiple of 4" in message  # the fix for the run's own n_envs
    check_env_mode(make_config(dict(algo="appo", env_mode="async", n_envs=12)))
    message = one_line_error(check_env_mode, make_config(dict(env_mode="async", n_envs=6)), 2)  # 2 ranks: 3 each
    assert "each rank's 3 envs" in message and "multiple of 4" in message
    check_env_mode(make_config(dict(env_mode="async", n_envs=8)), 2)
    check_env_mode(make_config(dict(env_mode="async", n_envs=6, per_rank=True)), 2)  # 6 on each rank


@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_actor_learner_actors_collect_async(tmp_path, algo):
    """IMPALA/APPO actors fill their slots with the async loop: a short run's step arithmetic and episode figures."""
    import json

    from conftest import QUIET as FLAGS, train_main
    assert train_main(["--algo", algo, "--env-mode", "async", "--n-envs", "8", "--n-steps", "16", "--n-actors", "2",
                       "--n-slots", "4", "--total-steps", "2048", "--eval-episodes", "0", "--run-dir",
                       str(tmp_path), *FLAGS]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["env_mode"] == "async"
    assert summary["total_steps"] >= 2048 and summary["total_steps"] % 64 == 0
    assert summary["episodes"] > 0 and 8 <= summary["episode_return_mean"] <= 500
