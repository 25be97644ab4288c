"""Recurrent IMPALA / APPO (``recurrent: lstm | gru``): the actors carry the state and ship each rollout's start state
and episode starts; the learner's unroll of the same weights reproduces the actors' log-probabilities and values
(exact checks); both algorithms train through ``fastrl.train`` and the run's agent predicts with a state; refusals."""
import numpy as np
import pytest
import torch

import fastrl
from conftest import one_line_error
from fastrl.config import make_config
from fastrl.distributed.actors import RolloutCollector
from fastrl.distributed.async_collect import RolloutViews
from fastrl.learn.impala import learner_batch, learner_forward

CPU = torch.device("cpu")
# 1 actor x 4 envs x 32 steps: random CartPole episodes (about 22 steps) end inside every segment.
SMALL = dict(algo="impala", env="CartPole-v1", n_actors=1, n_envs=4, n_steps=32, n_slots=2, learner_batch=2,
             n_minibatches=2, recurrent="lstm", recurrent_size=16, hidden_sizes=[16], device="cpu", torch_threads=1,
             eval_episodes=0, progress=False, tensorboard=False, wandb="disabled", plot=False, quiet=True)


def _gathered(cfg):
    """An ``ActorLearnerTrainer`` whose batch holds two consecutive rollouts of one actor (the actors' collection code,
    run here) that acted with the learner's own weights: columns 0..3 the first (from a zero state), 4..7 the second
    (from the state the first carried over)."""
    from fastrl.run.actor_learner import ActorLearnerTrainer
    trainer = ActorLearnerTrainer(cfg, CPU)
    collector = RolloutCollector(cfg, 0, 0)
    trainer.board.publish(trainer.agent, 0)
    trainer.board.pull(collector.agent)
    ring = trainer.ring
    for slot in (0, 1):
        assert ring.acquire(slot)
        ring.n_episodes[slot], _, _ = collector.collect(RolloutViews.of(ring.rollout[slot]),
                                                        ring.bootstrap_observation[slot], ring.episode_return[slot],
                                                        ring.episode_length[slot], lambda: None)
        ring.commit(slot, 0)
    collector.close()
    assert trainer.gather(ring, lambda: True)
    return trainer, ring


@pytest.mark.parametrize("kind, env", [("lstm", "CartPole-v1"), ("gru", "CartPole-v1"),
                                       ("lstm", "fastrl_space_envs:PixelMatchSmall")])
def test_the_learners_unroll_reproduces_the_actors_log_probs_and_values(kind, env):
    """Same weights on both sides: the learner's unrolled forward over a minibatch of shuffled env columns (from the
    stored start states, with the stored episode starts, bootstrap row included) gives the log-probabilities and
    values the actor computed step by step, across episode boundaries and a carried-over start state; with an MLP
    and a CNN encoder (a Gymnasium env of 8-step episodes)."""
    trainer, ring = _gathered(make_config({**SMALL, "recurrent": kind, "env": env}))
    try:
        assert type(trainer.agent.base).__name__ == ("PixelActorCritic" if "Pixel" in env else "ActorCritic")
        batch = trainer.batch
        starts, valid = batch["episode_start"], batch["valid"]
        assert bool(starts[1:].any()), "no episode starts inside the segment: lengthen n_steps"
        assert bool(starts[0, :4].all()) and torch.equal(starts[0, 4:], ~batch["valid"][-1, :4])
        assert torch.equal(starts[1:], ~valid[:-1])
        assert float(batch["recurrent_state"][0, :4].abs().max()) == 0
        assert float(batch["recurrent_state"][0, 4:].abs().max()) > 0  # carried over from the first rollout
        update = trainer.update_fn
        inputs, _ = update.inputs(trainer.params[0], learner_batch(batch, trainer.bootstrap_observation))
        columns = torch.tensor([[6, 1, 4, 3], [0, 2, 5, 7]])
        minibatch = update.minibatch(inputs, columns, 0)
        policy = trainer.agent.get_action_and_value
        state, episode_start = update.learner_sequence(minibatch)
        with torch.no_grad():
            target_logp, _, value = learner_forward(policy, *minibatch[:3], sequence=(state, episode_start))
            # Without the resets, or from a zero start state, the unroll is another: the checks can fail.
            for wrong in ((state, torch.zeros_like(episode_start)), (torch.zeros_like(state), episode_start)):
                assert float((learner_forward(policy, *minibatch[:3], sequence=wrong)[2] - value).abs().max()) > 1e-3
        behaviour = ring.rollout[1]  # slot 1 holds the columns 4..7, with the actor's values
        torch.testing.assert_close(target_logp, minibatch[3], atol=1e-5, rtol=0)
        torch.testing.assert_close(value[:-1, [0, 2]], behaviour["state_value"][:, [2, 0]], atol=1e-5, rtol=0)
        torch.testing.assert_close(value[-1, [0, 2]], behaviour["next", "state_value"][-1, [2, 0]], atol=1e-5, rtol=0)
    finally:
        trainer.close()


def test_appo_takes_its_vtrace_targets_from_the_unroll():
    """APPO's batch-wide V-trace (weights before the update) sees ratios of 1 on a rollout its own weights made, and
    its PPO steps train on whole-column sequences."""
    cfg = make_config({**SMALL, "algo": "appo", "recurrent": "gru", "n_epochs": 2})
    trainer, _ = _gathered(cfg)
    try:
        inputs, stats = trainer.update_fn.inputs(trainer.params[0],
                                                 learner_batch(trainer.batch, trainer.bootstrap_observation))
        assert len(inputs) == len(trainer.update_fn.spec.loss_keys) == 9
        assert abs(float(stats["vtrace/ratio_mean"]) - 1) < 1e-5 and float(stats["vtrace/rho_clipfrac"]) == 0
        before = trainer.params.clone()
        metrics = trainer.update()
        assert metrics["losses/n_updates"] == 4 and not torch.equal(before, trainer.params)
    finally:
        trainer.close()


@pytest.mark.parametrize("algo, kind", [("impala", "lstm"), ("appo", "gru")])
def test_trains_loads_and_predicts_with_a_state(algo, kind, tmp_path):
    """A few updates with real actor processes through the public API; the loaded agent predicts with a state."""
    run = fastrl.train(**{**SMALL, "algo": algo, "recurrent": kind, "n_slots": 4, "learner_batch": 1,
                          "total_steps": 4 * 32 * 6, "sync_interval": 1}, run_dir=str(tmp_path / "run"))
    assert run.summary["algo"] == algo and run.summary["iterations"] >= 6
    agent = fastrl.load(run.run_dir)
    obs = np.zeros((3, 4), dtype=np.float32)
    action, state = agent.predict(obs)
    assert action.shape == (3,) and len(state) == (2 if kind == "lstm" else 1) and state[0].shape == (3, 16)
    _, carried = agent.predict(obs, state=state, episode_start=np.array([True, False, False]))
    np.testing.assert_allclose(carried[0][0], state[0][0], atol=1e-6)  # row 0 restarted from zeros: its first state
    assert not np.allclose(carried[0][1], state[0][1])


def test_refusals_are_one_line():
    from fastrl.run.actor_learner import ActorLearnerTrainer
    assert "env-mode sync" in one_line_error(ActorLearnerTrainer, make_config({**SMALL, "env_mode": "async"}), CPU)
    assert "whole sequences" in one_line_error(make_config, {**SMALL, "algo": "appo", "n_minibatches": 16})
