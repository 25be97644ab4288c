"""A2C: defaults, n-step returns with truncation bootstrapping, the one-step update, a deterministic run's
step arithmetic, and learning CartPole (the median of 3 seeds)."""
import json

import pytest
import torch

from conftest import LEARNING_POPULATION, median_of_members
from fastrl.config import UserError, load_yaml, make_config
from fastrl.learn.ppo import compute_advantages
from fastrl.run.checkpoint import load_checkpoint
from fastrl.run.session import run
from fastrl.run.trainer import Trainer

QUIET = dict(progress=False, tensorboard=False, wandb="disabled", plot=False)


def test_a2c_defaults_apply_under_yaml_and_flags():
    cfg = make_config(dict(algo="a2c"))
    assert (cfg.n_steps, cfg.lr, cfg.lr_floor, cfg.gamma, cfg.gae_lambda) == (5, 7e-4, 1e-5, 0.99, 1.0)
    assert (cfg.ent_coef, cfg.vf_coef, cfg.max_grad_norm, cfg.n_epochs, cfg.n_minibatches) == (0.01, 0.5, 0.5, 1, 1)
    assert make_config(dict(algo="a2c", n_steps=20)).n_steps == 20
    from fastrl.config import Config
    assert make_config(dict(algo="ppo")).n_steps == Config.n_steps  # PPO keeps the embedded defaults
    with pytest.raises(UserError, match="one update per rollout"):
        make_config(dict(algo="a2c", n_minibatches=4))


def test_a2c_trainer_uses_rmsprop_or_adam():
    trainer = Trainer(make_config(dict(algo="a2c", n_envs=2, compile="off", **QUIET)))
    assert trainer.spec.optimizer == "rmsprop" and set(trainer.opt_state) == {"square_avg", "step"}
    assert dict(trainer.spec.constants) == {"alpha": 0.99, "eps": 1e-5}
    group = trainer.state_dict()["optimizer"]["param_groups"][0]  # checkpoints keep torch.optim's format
    assert (group["alpha"], group["eps"], group["momentum"], group["centered"]) == (0.99, 1e-5, 0.0, False)
    trainer.close()
    trainer = Trainer(make_config(dict(algo="a2c", n_envs=2, optimizer="adam", compile="off", **QUIET)))
    assert trainer.spec.optimizer == "adam" and set(trainer.opt_state) == {"exp_avg", "exp_avg_sq", "step"}
    trainer.close()


def _nstep_reference(reward, value, next_value, done, terminated, gamma):
    """Plain loop: R_t = r_t + gamma * (terminated ? 0 : (done ? V(s'_t) : R_{t+1}))."""
    T, N = reward.shape
    ret = torch.zeros(T, N, dtype=torch.float64)
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            if terminated[t, n]:
                nxt = 0.0
            elif done[t, n] or t == T - 1:
                nxt = float(next_value[t, n])
            else:
                nxt = running
            running = float(reward[t, n]) + gamma * nxt
            ret[t, n] = running
    return ret


def test_a2c_returns_are_nstep_with_truncation_bootstrap():
    trainer = Trainer(make_config(dict(algo="a2c", n_envs=4, n_steps=7, compile="off", **QUIET)))
    trainer.collect()
    batch = trainer.buffer
    nxt = batch["next"]
    nxt["reward"].copy_(torch.rand(7, 4))
    nxt["terminated"].zero_()
    nxt["truncated"].zero_()
    nxt["terminated"][2, 0] = True
    nxt["truncated"][4, 1] = True
    nxt["truncated"][0, 2] = True
    nxt["terminated"][6, 3] = True
    nxt["done"].copy_(nxt["terminated"] | nxt["truncated"])
    compute_advantages(batch, 0.99, 1.0)
    expected = _nstep_reference(nxt["reward"], batch["state_value"], nxt["state_value"], nxt["done"],
                                nxt["terminated"], 0.99)
    torch.testing.assert_close(batch["value_target"].double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batch["advantage"], batch["value_target"] - batch["state_value"], atol=1e-5, rtol=1e-5)
    # one update (its own GAE pass gives the same targets): one optimizer step on the whole rollout
    before = trainer.params.clone()
    metrics = trainer.update()
    torch.testing.assert_close(batch["value_target"].double(), expected, atol=1e-5, rtol=1e-5)
    assert metrics["losses/n_updates"].item() == 1.0 and metrics["losses/nonfinite_updates"].item() == 0.0
    assert torch.isfinite(metrics["losses/policy_loss"]) and torch.isfinite(metrics["losses/value_loss"])
    assert trainer.opt_state["step"].tolist() == [1.0]
    assert not torch.equal(before, trainer.params)
    trainer.close()


def _a2c_cartpole(run_dir, seed, **overrides):
    values = {**load_yaml("configs/a2c/cartpole.yaml"), **QUIET, "seed": seed, "eval_episodes": 0,
              "run_dir": str(run_dir), **overrides}
    return run(make_config(values))


def test_a2c_run_is_deterministic_and_counts_steps(tmp_path):
    """50 iterations of 8 envs x 5 steps, twice with one seed: one RMSprop step per rollout, a log row every
    10 iterations, and the same losses and weights bit for bit."""
    summaries = [_a2c_cartpole(tmp_path / name, 7, total_steps=2000, log_interval=10) for name in "ab"]
    assert summaries[0]["total_steps"] == 2000 and summaries[0]["iterations"] == 2000 // (8 * 5)
    rows = [[json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
            for name in "ab"]
    assert [r["global_step"] for r in rows[0]] == [400, 800, 1200, 1600, 2000]
    for key in ("losses/policy_loss", "losses/value_loss", "losses/entropy"):
        assert [r[key] for r in rows[0]] == [r[key] for r in rows[1]], key
    a, b = load_checkpoint(tmp_path / "a"), load_checkpoint(tmp_path / "b")
    assert {int(s["step"]) for s in a["optimizer"]["state"].values()} == {50}, "one optimizer step per rollout"
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), f"{key} differs between two runs with the same seed"


@pytest.mark.learning
def test_a2c_learns_cartpole_v0(tmp_path):
    """A2C with 8 envs learns CartPole-v0 within 60k steps: LEARNING_SEEDS as one population, the median member's
    last-100-episode mean return >= 100 (a random policy gets about 22; the run stops once every member reaches 150;
    the classic result is 195)."""
    summary = _a2c_cartpole(tmp_path / "learn", LEARNING_POPULATION["seed"], n_seeds=LEARNING_POPULATION["n_seeds"],
                            env="CartPole-v0", total_steps=60_000, stop_at_return=150, log_interval=25, torch_threads=1)
    median, by_seed = median_of_members(summary, ("episode_return_mean",))
    assert median >= 100, f"median return {median}; per seed {by_seed}"
