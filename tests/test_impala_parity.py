"""IMPALA/APPO run through the same loop as PPO: the same optimizer step (non-finite skip), flags that work,
episode statistics from the env's EpisodeStats (the real Atari score), stop_at_return, rollback, and a hung
actor detected by its heartbeat and restarted."""
import copy
import json
import os
import signal
import time

import pytest
import torch

from conftest import QUIET, SUMMARY_KEYS, train_main
from fastrl.config import make_config
from fastrl.distributed.actors import copy_new_episodes
from fastrl.envs.batched import BatchedEnv
from fastrl.envs.registry import atari_kwargs
from fastrl.envs.stats import EpisodeStats
from fastrl.run.actor_learner import ActorLearnerTrainer, record_episodes

CPU = torch.device("cpu")
SMALL = dict(algo="impala", env="CartPole-v1", n_actors=2, n_envs=8, n_steps=16, n_slots=4, device="cpu",
             torch_threads=1, eval_episodes=0, progress=False, tensorboard=False, wandb="disabled")


def test_stop_at_return_writes_steps_to_return(tmp_path):
    """The issue's own command, with a threshold every seed reaches quickly: the summary has PPO's schema."""
    run_dir = tmp_path / "run"
    assert train_main(["--config", "configs/impala/cartpole.yaml", "--stop-at-return", "40", "--log-interval", "2",
                  "--eval-episodes", "2", "--eval-seeds", "1", "--run-dir", str(run_dir)] + QUIET) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert SUMMARY_KEYS <= summary.keys()
    assert summary["reached_return"] is True and summary["episode_return_mean"] >= 40
    assert summary["steps_to_return"] == summary["total_steps"] < 400_000
    assert 0 < summary["time_to_return_s"] <= summary["wall_time_s"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["global_step"] == summary["steps_to_return"]
    assert rows[-1]["eval/return_mean"] == summary["eval_return_mean"]  # the final evaluation's row
    assert all("losses/nonfinite_updates" in r for r in rows[:-1])


def test_atari_episode_stats_are_whole_games_through_the_slots():
    """Clipped, per-life training env in lock-step with an unclipped one: what an actor copies into its slot and the
    learner records is one episode per game, with the real score over all lives."""
    cfg = make_config(dict(env="Breakout-v5"))
    kwargs = atari_kwargs(cfg, training=True)
    env = BatchedEnv("Breakout-v5", 1, 3, num_threads=1, env_kwargs=kwargs)
    raw = BatchedEnv("Breakout-v5", 1, 3, num_threads=1, env_kwargs={**kwargs, "reward_clip": False})
    env.reset()
    raw.reset()
    learner_stats = EpisodeStats(1)
    slot_returns, slot_lengths = torch.zeros(100, dtype=torch.float64), torch.zeros(100, dtype=torch.int64)
    gen = torch.Generator().manual_seed(0)
    true_score, life_ends = 0.0, 0
    for _rollout in range(200):
        seen = env.stats.count
        for _t in range(64):
            action = torch.randint(env.action_spec.n, (1,), generator=gen)
            a, b = env.step(action), raw.step(action)
            if bool(b.valid) and learner_stats.count + env.stats.count - seen == 0:
                true_score += float(b.reward)
            life_ends += int(bool(a.done))
        finished = copy_new_episodes(env.stats, seen, slot_returns, slot_lengths)
        record_episodes(learner_stats, slot_returns[:finished], slot_lengths[:finished], finished)
        if learner_stats.count:
            break
    env.close()
    raw.close()
    assert learner_stats.count == 1 and life_ends > 1, "one game, several lives"
    returns, _ = learner_stats.recent()
    assert true_score > 0 and returns[0].item() == pytest.approx(true_score)


def test_record_episodes_counts_all_and_keeps_the_last():
    stats = EpisodeStats(1, window=4)
    record_episodes(stats, torch.tensor([1.0, 2.0]), torch.tensor([1, 2]), 5)  # 5 finished, the last 2 kept
    assert stats.count == 5
    # episodes 4 and 5 (1-based) land in ring slots 3 and 0
    assert (stats.returns[3].item(), stats.returns[0].item()) == (1.0, 2.0)
    assert (stats.lengths[3].item(), stats.lengths[0].item()) == (1, 2)


@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_nonfinite_update_is_skipped_and_counted(algo):
    cfg = make_config({**SMALL, "algo": algo, "n_minibatches": 1})
    trainer = ActorLearnerTrainer(cfg, CPU)
    batch = trainer.batch
    batch["observation"].normal_()
    batch["valid"].fill_(True)
    batch["observation"][0, 0, 0] = float("nan")
    before = {k: v.clone() for k, v in trainer.agent.state_dict().items()}
    metrics = trainer.update()
    assert metrics["losses/nonfinite_updates"].item() >= 1
    for key, value in trainer.agent.state_dict().items():
        assert torch.equal(value, before[key]), f"{key} changed on a non-finite update"
    trainer.close()


def test_flags_reach_the_actor_learner():
    trainer = ActorLearnerTrainer(make_config({**SMALL, "optimizer": "rmsprop", "amp": "bf16"}), CPU)
    assert trainer.spec.optimizer == "rmsprop" and set(trainer.opt_state) == {"square_avg", "step"}
    trainer.batch["observation"].normal_()
    trainer.batch["valid"].fill_(True)
    metrics = trainer.update()  # the learner forward under bf16 autocast, float32 losses
    assert all(bool(torch.isfinite(v)) for v in metrics.values() if torch.is_tensor(v)), metrics
    assert metrics["losses/nonfinite_updates"].item() == 0
    trainer.close()


def _random_batch(trainer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    trainer.batch["observation"].copy_(torch.randn(trainer.batch["observation"].shape, generator=g))
    trainer.batch["action"].copy_(torch.randint(0, 2, trainer.batch["action"].shape, generator=g))
    trainer.batch["sample_log_prob"].copy_(-torch.rand(trainer.batch["sample_log_prob"].shape, generator=g))
    trainer.batch["next", "reward"].fill_(1.0)
    trainer.batch["valid"].fill_(True)


@pytest.mark.parametrize("algo, optimizer", [("impala", "rmsprop"), ("appo", "adam")])
def test_checkpoint_resumes_the_same_learner(algo, optimizer):
    """The learner's checkpoint (optimizer state as torch.optim's state dict) loads into a fresh learner with the same
    weights and optimizer state, whose next update equals the original's; and torch.optim's own state dict of the
    same optimizer (an older checkpoint's) loads into the flat state."""
    cfg = make_config({**SMALL, "algo": algo, "optimizer": optimizer, "n_minibatches": 2,
                       **({"n_epochs": 2} if algo == "appo" else {})})
    first, second = ActorLearnerTrainer(cfg, CPU), ActorLearnerTrainer(cfg, CPU)
    try:
        _random_batch(first, 0)
        first.update()
        state = first.state_dict()
        moments = {"square_avg"} if optimizer == "rmsprop" else {"exp_avg", "exp_avg_sq"}
        assert set(state["optimizer"]["state"][0]) == {"step"} | moments
        second.load_state_dict(state)
        assert torch.equal(second.params, first.params)
        assert all(torch.equal(second.opt_state[k], v) for k, v in first.opt_state.items())
        for trainer in (first, second):
            _random_batch(trainer, 1)
            trainer.update()
        assert torch.equal(second.params, first.params)
        twin = copy.deepcopy(first.agent)
        torch_optimizer = (torch.optim.RMSprop(twin.parameters(), lr=cfg.lr, alpha=cfg.rmsprop_alpha,
                                               eps=cfg.rmsprop_eps) if optimizer == "rmsprop"
                           else torch.optim.Adam(twin.parameters(), lr=cfg.lr, eps=cfg.adam_eps))
        torch_optimizer.load_state_dict(first.state_dict()["optimizer"])
        second.load_state_dict({**first.state_dict(), "optimizer": torch_optimizer.state_dict()})
        assert all(torch.equal(second.opt_state[k], v) for k, v in first.opt_state.items())
    finally:
        first.close()
        second.close()


def test_roll_back_restores_weights_scales_lr_and_publishes():
    trainer = ActorLearnerTrainer(make_config({**SMALL, "anneal_lr": False}), CPU)
    saved = {k: v.clone() for k, v in trainer.agent.state_dict().items()}
    state = trainer.weights_state()
    with torch.no_grad():
        for p in trainer.agent.parameters():
            p.add_(1.0)
    trainer.iteration = 7
    trainer.roll_back(state, 0.5)
    assert all(torch.equal(v, saved[k]) for k, v in trainer.agent.state_dict().items())
    assert trainer.lr_scale == 0.5 and trainer.current_lr() == pytest.approx(0.5 * trainer.cfg.lr)
    assert trainer.board.control_np[2] == 7, "the rolled-back weights reach the actors at once"
    trainer.close()


def test_hung_actor_is_killed_and_restarted_and_the_learner_goes_on():
    cfg = make_config({**SMALL, "actor_timeout_s": 3.0, "total_steps": 10**7})
    trainer = ActorLearnerTrainer(cfg, CPU)
    try:
        deadline = time.monotonic() + 120
        while float(trainer.pool.stats[:, 1].min()) == 0 and time.monotonic() < deadline:
            assert trainer.collect()  # until both actors run (a frozen start-up is judged by a longer grace)
            trainer.update()
        assert float(trainer.pool.stats[:, 1].min()) > 0, "the actors never started"
        frozen = trainer.pool.procs[0].pid
        os.kill(frozen, signal.SIGSTOP)
        iterations_at_freeze = trainer.iteration
        deadline = time.monotonic() + 60
        while trainer.pool.hung_restarts == 0 and time.monotonic() < deadline:
            assert trainer.collect(), "the learner must not stall on a frozen actor"
            trainer.update()
        # at least one: on a loaded machine the live actor may miss a 3 s heartbeat too, and is then restarted as well
        assert trainer.pool.hung_restarts >= 1 and trainer.pool.restarts >= trainer.pool.hung_restarts
        assert trainer.iteration > iterations_at_freeze, "the other actor kept the learner going"
        assert not os.path.exists(f"/proc/{frozen}/status") or "zombie" in open(f"/proc/{frozen}/status").read()
        deadline = time.monotonic() + 60
        while trainer.pool.procs[0].pid == frozen and time.monotonic() < deadline:
            assert trainer.collect()  # the restart waits out its back-off (RESTART_BACKOFF_S) meanwhile
            trainer.update()
        assert trainer.pool.procs[0].pid != frozen
        rollouts = float(trainer.pool.stats[0, 1])
        deadline = time.monotonic() + 60
        while float(trainer.pool.stats[0, 1]) == rollouts and time.monotonic() < deadline:
            assert trainer.collect()  # the restarted actor fills slots again
            trainer.update()
        assert float(trainer.pool.stats[0, 1]) > rollouts and trainer.pool.procs[0].exitcode is None
    finally:
        trainer.close()
