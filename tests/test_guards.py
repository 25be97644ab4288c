"""Training guards: rollback on collapse, skipped non-finite updates, no poisoned checkpoints, stop-at-return."""
import json

import pytest
import torch

import fastrl
from fastrl.config import make_config
from fastrl.run.guards import RollbackGuard
from fastrl.run.loop import save_if_finite
from fastrl.run.runfiles import RunFiles
from fastrl.run.session import run
from fastrl.run.trainer import Trainer

QUIET = dict(wandb="disabled", tensorboard=False, progress=False, plot=False)


def _guard(**kw):
    args = dict(enabled=True, drop=0.1, lr_factor=0.5, max_rollbacks=2, patience=2, max_nonfinite=3)
    args.update(kw)
    return RollbackGuard(**args)


def test_collapse_rolls_back_to_best_after_patience():
    guard = _guard()
    state = {"w": torch.tensor(0.0)}
    for step, ret in enumerate([10.0, 50.0, 100.0], 1):
        state = {"w": torch.tensor(ret)}
        assert guard.observe(ret, True, 0.0, lambda: state, step) is None
    assert guard.best_return == 100.0 and guard.best_step == 3
    assert guard.observe(95.0, True, 0.0, lambda: state, 4) is None          # within 10%: fine
    assert guard.observe(80.0, True, 0.0, lambda: state, 5) is None          # below, patience 1/2
    assert guard.observe(70.0, True, 0.0, lambda: state, 6) == "collapse"    # below twice in a row
    assert guard.best_state["w"].item() == 100.0 and guard.rollbacks == 1


def test_collapse_needs_a_full_window_and_respects_max_rollbacks():
    guard = _guard(max_rollbacks=1, patience=1)
    guard.observe(100.0, True, 0.0, lambda: {}, 1)
    assert guard.observe(10.0, False, 0.0, lambda: {}, 2) is None            # window not full yet
    assert guard.observe(10.0, True, 0.0, lambda: {}, 3) == "collapse"
    assert guard.observe(10.0, True, 0.0, lambda: {}, 4) is None             # max_rollbacks reached


def test_disabled_guard_never_rolls_back_but_tracks_best():
    guard = _guard(enabled=False, patience=1)
    guard.observe(100.0, True, 0.0, lambda: {"x": 1}, 1)
    assert guard.observe(1.0, True, 0.0, lambda: {}, 2) is None
    assert guard.best_return == 100.0


def test_negative_returns_use_the_magnitude_of_the_best():
    guard = _guard(patience=1)
    guard.observe(-200.0, True, 0.0, lambda: {}, 1)
    guard.observe(-100.0, True, 0.0, lambda: {}, 2)                          # new best -100
    assert guard.observe(-105.0, True, 0.0, lambda: {}, 3) is None           # within 10% of |-100|
    assert guard.observe(-115.0, True, 0.0, lambda: {}, 4) == "collapse"


def test_nonfinite_streak_triggers_rollback():
    guard = _guard(max_nonfinite=3)
    guard.observe(50.0, True, 0.0, lambda: {"ok": 1}, 1)
    assert guard.observe(50.0, True, 2.0, lambda: {}, 2) is None
    assert guard.observe(50.0, True, 0.0, lambda: {}, 3) is None             # streak broken
    assert guard.observe(50.0, True, 1.0, lambda: {}, 4) is None
    assert guard.observe(50.0, True, 1.0, lambda: {}, 5) is None
    assert guard.observe(50.0, True, 4.0, lambda: {}, 6) == "nonfinite"


def test_nan_loss_skips_the_update_and_is_counted():
    cfg = make_config(dict(n_envs=4, n_steps=8, n_epochs=2, n_minibatches=2, compile="off", **QUIET))
    trainer = Trainer(cfg)
    trainer.collect()
    before = trainer.params.clone()
    trainer.buffer["sample_log_prob"][0, 0] = float("nan")  # one sample's ratio, so its minibatch's loss, is NaN
    metrics = trainer.update()
    # The NaN sample lands in one minibatch per epoch: those two updates are skipped, the others run.
    assert metrics["losses/nonfinite_updates"].item() == 2 and metrics["losses/n_updates"].item() == 2
    assert trainer.opt_state["step"].tolist() == [2.0], "a skipped update is no optimizer step"
    assert trainer.weights_finite()
    assert not torch.equal(trainer.params, before)
    trainer.buffer["sample_log_prob"].fill_(float("nan"))
    trainer.params.copy_(before)
    state = {key: value.clone() for key, value in trainer.opt_state.items()}
    metrics = trainer.update()
    assert metrics["losses/nonfinite_updates"].item() == 4 and metrics["losses/n_updates"].item() == 0
    assert torch.equal(trainer.params, before), "the weights changed by a skipped update"
    for key, value in trainer.opt_state.items():
        assert torch.equal(value, state[key]), f"{key} changed by a skipped update"
    trainer.close()


def test_poisoned_weights_are_never_checkpointed(tmp_path):
    cfg = make_config(dict(n_envs=2, n_steps=4, **QUIET))
    trainer = Trainer(cfg)
    assert save_if_finite(trainer, tmp_path, RunFiles(tmp_path)) is True
    assert len(list((tmp_path / "checkpoints").glob("ckpt_*.pt"))) == 1
    with torch.no_grad():
        next(trainer.agent.parameters()).view(-1)[0] = float("inf")
    trainer.global_step = 99
    assert save_if_finite(trainer, tmp_path, RunFiles(tmp_path)) is False
    assert len(list((tmp_path / "checkpoints").glob("ckpt_*.pt"))) == 1


def test_roll_back_restores_weights_and_scales_lr():
    cfg = make_config(dict(n_envs=2, n_steps=4, compile="off", **QUIET))
    trainer = Trainer(cfg)
    saved = trainer.weights_state()
    model = {k: v.clone() for k, v in trainer.agent.state_dict().items()}
    with torch.no_grad():
        trainer.params.add_(1.0)
        trainer.opt_state["step"].fill_(3.0)
    trainer.roll_back(saved, 0.5)
    for key, value in trainer.agent.state_dict().items():  # the module acts with the restored weights
        assert torch.equal(value, model[key])
    assert trainer.opt_state["step"].tolist() == [0.0]
    assert trainer.lr_scale == 0.5
    assert trainer.env.stats.recent()[0].numel() == 0
    trainer.collect()
    assert trainer.update()["charts/learning_rate"].item() == pytest.approx(0.5 * cfg.lr)
    trainer.close()


def test_roll_back_of_one_member_leaves_the_others():
    trainer = Trainer(make_config(dict(n_envs=2, n_steps=4, n_seeds=3, compile="off", **QUIET)))
    saved = trainer.weights_state(1)
    before = trainer.params.clone()
    with torch.no_grad():
        trainer.params.add_(1.0)
    trainer.roll_back(saved, 0.5, 1)
    assert torch.equal(trainer.params[1], before[1])
    assert torch.equal(trainer.params[0], before[0] + 1) and torch.equal(trainer.params[2], before[2] + 1)
    assert trainer.lr_scales == [1.0, 0.5, 1.0]
    trainer.collect()
    trainer.update()
    lr = trainer.cfg.lr  # the first iteration's, before any annealing
    assert trainer.hparams["lr"].tolist() == pytest.approx([lr, 0.5 * lr, lr])
    trainer.close()


def test_stop_at_return_records_steps_and_time(tmp_path):
    """The run stops at the first log whose last-100-episode mean reaches the threshold, and records when.

    The threshold, 40 on CartPole-v1, is under twice a random policy's ~22: the embedded PPO defaults reach it
    early on every seed, far inside the budget, so every assertion below is bookkeeping, not luck."""
    cfg = make_config(dict(total_steps=200_000, stop_at_return=40, eval_episodes=0, run_dir=str(tmp_path), **QUIET))
    summary = run(cfg)
    assert summary["reached_return"] is True, summary
    assert summary["episode_return_mean"] >= 40
    assert summary["steps_to_return"] == summary["total_steps"] < 200_000
    assert summary["total_steps"] % (cfg.n_envs * cfg.n_steps) == 0
    assert summary["iterations"] == summary["total_steps"] // (cfg.n_envs * cfg.n_steps)
    assert 0 < summary["time_to_return_s"] <= summary["wall_time_s"]
    assert json.loads((tmp_path / "summary.json").read_text())["steps_to_return"] == summary["steps_to_return"]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["global_step"] == summary["steps_to_return"]
    assert rows[-1]["charts/episodic_return"] == summary["episode_return_mean"]
    earlier = [r.get("charts/episodic_return", 0.0) for r in rows[:-1]]
    assert all(ret < 40 for ret in earlier), "the run went on past a log that had reached the threshold"


def test_unreached_return_records_none(tmp_path):
    """A threshold above CartPole-v1's maximum of 500: the budget ends the run and nothing is recorded as reached."""
    cfg = make_config(dict(total_steps=512, n_envs=4, n_steps=32, stop_at_return=1000, eval_episodes=0,
                           run_dir=str(tmp_path), **QUIET))
    summary = run(cfg)
    assert summary["total_steps"] == 512 and summary["iterations"] == 4
    assert summary["reached_return"] is False
    assert summary["steps_to_return"] is None and summary["time_to_return_s"] is None


def test_periodic_eval_is_logged(tmp_path):
    cfg = make_config(dict(total_steps=2048, n_envs=8, n_steps=32, eval_interval=4, eval_episodes=2, eval_seeds=2,
                           run_dir=str(tmp_path), **QUIET))
    run(cfg)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/return_mean" in r]
    assert [r["global_step"] for r in evals] == [1024, 2048, 2048]  # iterations 4 and 8, then the final evaluation
    for r in evals:  # 4 CartPole-v1 episodes: returns are whole episode lengths
        assert (4 * r["eval/return_mean"]) == pytest.approx(round(4 * r["eval/return_mean"])), "whole episodes"
    scores = [(r["eval/return_mean"], r["eval/return_std"]) for r in evals]
    assert scores[1] == scores[2], "the evaluation at iteration 8 and the final one score the same weights, same seeds"
    # the saved agent replays the final evaluation (2 episodes on each of 2 seeds)
    replay = fastrl.load(tmp_path).evaluate(episodes=2, seeds=2)
    assert (replay.mean(), replay.std()) == pytest.approx((evals[-1]["eval/return_mean"], evals[-1]["eval/return_std"]))


def test_episode_window_restart_keeps_counting():
    from fastrl.envs.stats import EpisodeStats
    stats = EpisodeStats(1, window=4)

    def finish(ret):
        stats.update(torch.tensor([ret]), torch.tensor([True]), torch.tensor([True]))

    for ret in (1.0, 2.0, 3.0):
        finish(ret)
    stats.restart_window()
    assert stats.recent()[0].numel() == 0
    finish(10.0)
    finish(20.0)
    assert sorted(stats.recent()[0].tolist()) == [10.0, 20.0] and stats.count == 5
    for ret in (30.0, 40.0, 50.0):
        finish(ret)
    assert sorted(stats.recent()[0].tolist()) == [20.0, 30.0, 40.0, 50.0]


def test_stop_at_return_judges_the_periodic_evaluation_of_every_member(tmp_path, monkeypatch):
    """With eval_interval > 0 the stop rule reads each member's periodic evaluation (as the rollback guard does) and
    waits for every member. The evaluation is faked: 1,000 is out of CartPole's reach (max 500), so only an evaluation
    can stop the run, and member 1 gets there one evaluation after member 0."""
    import fastrl.run.loop as loop
    scores = iter([[(1000.0, 0.0), (10.0, 0.0)], [(1000.0, 0.0), (1000.0, 0.0)]])
    calls = []
    monkeypatch.setattr(loop, "evaluate_members", lambda trainer, *a, **kw: calls.append(trainer.iteration)
                        or next(scores, [(1000.0, 0.0)] * 2))
    cfg = make_config(dict(total_steps=64 * 20, n_envs=4, n_steps=16, n_seeds=2, eval_interval=2, log_interval=1,
                           eval_episodes=1, stop_at_return=999, run_dir=str(tmp_path), **QUIET))
    summary = run(cfg)
    assert calls[:2] == [2, 4], calls  # evaluations at iterations 2 and 4, then the final one
    assert summary["iterations"] == 4 and summary["reached_return"] is True, summary
    assert summary["steps_to_return"] == 4 * 64 * 2  # every member's steps together, as total_steps counts them
    assert [m["steps_to_return"] for m in summary["members"]] == [2 * 64, 4 * 64]
