"""A2C: defaults, n-step returns with truncation bootstrapping, the one-step update, and learning CartPole."""
import pytest
import torch

from fastrl.a2c import a2c_loss, a2c_update
from fastrl.config import UserError, load_yaml, make_config
from fastrl.ppo import compute_advantages
from fastrl.train import Trainer, run

QUIET = dict(progress=False, tensorboard=False, wandb="disabled")


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
    trainer = Trainer(make_config(dict(algo="a2c", n_envs=2, **QUIET)))
    assert isinstance(trainer.optimizer, torch.optim.RMSprop)
    assert trainer.optimizer.defaults["alpha"] == 0.99 and trainer.optimizer.defaults["eps"] == 1e-5
    trainer.env.close()
    trainer = Trainer(make_config(dict(algo="a2c", n_envs=2, optimizer="adam", **QUIET)))
    assert isinstance(trainer.optimizer, torch.optim.Adam)
    trainer.env.close()


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
    trainer = Trainer(make_config(dict(algo="a2c", n_envs=4, n_steps=7, **QUIET)))
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
    # one update: one optimizer step, the loss masks reset steps
    loss, _ = a2c_loss(trainer.agent, batch, trainer.cfg)
    assert torch.isfinite(loss)
    before = [p.detach().clone() for p in trainer.agent.parameters()]
    metrics = a2c_update(trainer.agent, trainer.optimizer, batch, trainer.cfg)
    assert metrics["losses/n_updates"].item() == 1.0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.agent.parameters()))
    trainer.env.close()


def test_a2c_learns_cartpole_v0(tmp_path):
    """The classic A2C result with 8 envs: CartPole-v0 reaches a mean return of 195 (last 100 episodes)."""
    values = {**load_yaml("configs/a2c/cartpole.yaml"), **QUIET, "env": "CartPole-v0", "total_steps": 60_000,
              "stop_at_return": 195, "log_interval": 25, "eval_episodes": 0, "run_dir": str(tmp_path / "run")}
    summary = run(make_config(values))
    assert summary["episode_return_mean"] >= 195, summary
