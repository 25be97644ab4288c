"""Callbacks as a newcomer writes them: a wrong signature is one line after a written summary, ``EvalCallback`` with
Stable-Baselines3's argument names, and the per-episode return CleanRL users look for in the logged rows."""
import importlib
import json

import gymnasium
import numpy as np
import pytest

import fastrl
from conftest import one_line_error
from fastrl.run.callbacks import SIGNATURE, EvalCallback

QUIET = dict(progress=False, wandb="disabled", tensorboard=False, plot=False, quiet=True)
TINY = dict(env="CartPole-v1", n_envs=2, n_steps=16, n_minibatches=1, n_epochs=1, eval_episodes=0, **QUIET)


class CountingEpisodes(gymnasium.Env):
    """Episodes of 3 steps; the k-th episode this env finishes pays k at its last step, so its return is k."""
    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self):
        self.finished = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        done = self.t == 3
        self.finished += done
        return np.zeros(1, np.float32), float(self.finished if done else 0), done, False, {}


def test_a_callback_of_the_wrong_signature_is_one_line_after_the_summary(tmp_path):
    run_dir = tmp_path / "run"
    message = one_line_error(fastrl.train, callbacks=[lambda metrics: None], run_dir=run_dir, total_steps=96, **TINY)
    assert SIGNATURE in message and "<lambda>" in message, message
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by_callback"] is True and summary["total_steps"] == 32, summary
    assert SIGNATURE in summary["stopped_by_error"]
    assert fastrl.load(run_dir).global_step == 32, "the final checkpoint was written"


def test_a_type_error_inside_a_callback_stays_its_own(tmp_path):
    def broken(metrics, run):
        raise TypeError("the callback's own bug")
    with pytest.raises(TypeError, match="the callback's own bug"):
        fastrl.train(callbacks=[broken], run_dir=tmp_path / "run", total_steps=64, **TINY)


def test_eval_callback_takes_sb3s_names(tmp_path, monkeypatch):
    """``eval_freq`` counts vectorized steps as SB3 does: 32 x 2 envs = every 64 env steps (at 64 of 32, 64, 96)."""
    evaluation = importlib.import_module("fastrl.run.evaluate")
    asked, evaluate = [], evaluation.evaluate
    monkeypatch.setattr(evaluation, "evaluate", lambda *args, **kwargs: asked.append(kwargs["deterministic"])
                        or evaluate(*args, **kwargs))
    callback = EvalCallback(eval_freq=32, n_eval_episodes=2, best_model_save_path=tmp_path / "best",
                            deterministic=False)
    fastrl.train(callbacks=[callback], run_dir=tmp_path / "run", total_steps=96, **TINY)
    assert [step for step, _, _ in callback.results] == [64] and asked == [False]
    assert (tmp_path / "best" / "best.pt").is_file()
    assert not (tmp_path / "run" / "checkpoints" / "best.pt").exists()
    assert fastrl.load(tmp_path / "best", best=True).global_step == 64


@pytest.mark.parametrize("args, kwargs, expected", [
    ((object(),), {"eval_freq": 100}, "there is no eval_env"),
    ((), {"eval_freq": 100, "log_path": "logs"}, "takes no log_path; it takes every_steps"),
    ((), {"every_steps": 100, "eval_freq": 10}, "not both"),
    ((), {"n_eval_episodes": 0}, "episodes and seeds must be > 0"),
])
def test_eval_callback_refuses_in_one_line(args, kwargs, expected):
    assert expected in one_line_error(EvalCallback, *args, **kwargs)


def test_each_row_logs_the_last_episodes_own_return(tmp_path):
    """``charts/episodic_return_last`` is one episode's return, CleanRL's ``charts/episodic_return``; fastrl's
    ``charts/episodic_return`` is the last-100 mean. One env whose k-th episode returns k: the last is the count."""
    run = fastrl.train(env=CountingEpisodes, env_backend="gymnasium", n_envs=1, n_steps=16, n_minibatches=1,
                       n_epochs=1, total_steps=64, eval_episodes=0, run_dir=tmp_path / "run", **QUIET)
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in rows if "charts/episodic_return_last" in row]
    assert len(rows) >= 3, rows
    for row in rows:
        count = row["charts/episodes"]
        assert row["charts/episodic_return_last"] == count, row
        assert row["charts/episodic_return"] == pytest.approx((count + 1) / 2), row  # the mean of 1..count
