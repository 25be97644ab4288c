"""Rollout buffer, masked minibatches, GAE over the buffer (bootstrap and reset-step leaks; the hand-computed case
and TorchRL agreement live in tests/test_kernels.py), masked PPO loss, explained variance,
and the trainer's collect() filling next_value = V(obs after step t)."""
import pytest
import torch

from fastrl import kernels
from fastrl.envs.buffers import make_rollout_buffer
from fastrl.envs.spaces import ActionSpec
from fastrl.learn.ppo import compute_advantages, explained_variance

GAMMA, LAM = 0.9, 0.8  # gamma * lam = 0.72


def _buffer(T=5, N=2):
    return make_rollout_buffer(T, N, (3,), torch.float32, ActionSpec("discrete", n=2))


def _hand_case():
    """T=5, N=2.
    env 0: terminated at t=1, reset step at t=2 (valid False), then t=3, t=4 valid.
    env 1: truncated at t=2, reset step at t=3, then t=4 valid.
    next_value[t] = value[t+1] (V of the obs after step t); the last row is the bootstrap value."""
    buf = _buffer()
    value = torch.tensor([[0.5, 1.0], [0.4, 1.0], [0.3, 1.0], [0.6, 2.0], [0.7, 0.5]])
    next_value = torch.tensor([[0.4, 1.0], [0.3, 1.0], [0.6, 2.0], [0.7, 0.5], [0.8, 1.5]])
    reward = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    terminated = torch.zeros(5, 2, dtype=torch.bool)
    truncated = torch.zeros(5, 2, dtype=torch.bool)
    terminated[1, 0] = True
    truncated[2, 1] = True
    valid = torch.ones(5, 2, dtype=torch.bool)
    valid[2, 0] = valid[3, 1] = False
    buf["state_value"].copy_(value)
    buf["next", "state_value"].copy_(next_value)
    buf["next", "reward"].copy_(reward)
    buf["next", "terminated"].copy_(terminated)
    buf["next", "truncated"].copy_(truncated)
    buf["next", "done"].copy_(terminated | truncated)
    buf["valid"].copy_(valid)
    return buf


def test_gae_bootstrap_and_reset_leak():
    base = _hand_case()
    compute_advantages(base, GAMMA, LAM)
    # Terminated step (env 0, t=1) must not bootstrap: its next_value is irrelevant.
    buf = _hand_case()
    buf["next", "state_value"][1, 0] = 100.0
    compute_advantages(buf, GAMMA, LAM)
    torch.testing.assert_close(buf["advantage"], base["advantage"])
    # Truncated step (env 1, t=2) bootstraps from next_value: +1 there moves A2 by gamma, A1 by gamma*g*l, ...
    buf = _hand_case()
    buf["next", "state_value"][2, 1] += 1.0
    compute_advantages(buf, GAMMA, LAM)
    shift = buf["advantage"][:, 1] - base["advantage"][:, 1]
    torch.testing.assert_close(shift, torch.tensor([0.9 * 0.72**2, 0.9 * 0.72, 0.9, 0.0, 0.0]), rtol=0, atol=1e-5)
    torch.testing.assert_close(buf["advantage"][:, 0], base["advantage"][:, 0])
    # Garbage on reset steps (reward, value, next value) changes nothing before them.
    buf = _hand_case()
    buf["next", "reward"][2, 0] = 50.0
    buf["state_value"][3, 1] = -30.0
    buf["next", "state_value"][3, 1] = 70.0
    compute_advantages(buf, GAMMA, LAM)
    torch.testing.assert_close(buf["advantage"][:2, 0], base["advantage"][:2, 0])
    torch.testing.assert_close(buf["advantage"][:3, 1], base["advantage"][:3, 1])
    torch.testing.assert_close(buf["advantage"][3:, 0], base["advantage"][3:, 0])
    torch.testing.assert_close(buf["advantage"][4, 1], base["advantage"][4, 1])


def test_rollout_buffer_layout():
    buf = make_rollout_buffer(4, 3, (84, 84), torch.uint8, ActionSpec("continuous", shape=(2,), low=(-1, -1), high=(1, 1)))
    assert buf.batch_size == torch.Size([4, 3])
    assert buf["observation"].shape == (4, 3, 84, 84) and buf["observation"].dtype == torch.uint8
    assert buf["action"].shape == (4, 3, 2) and buf["action"].dtype == torch.float32
    assert buf["valid"].dtype == torch.bool
    for key in ("reward", "done", "terminated", "truncated", "state_value"):
        assert buf["next", key].shape == (4, 3)
    disc = make_rollout_buffer(2, 2, (4,), torch.float32, ActionSpec("discrete", n=3))
    assert disc["action"].dtype == torch.int64 and disc["action"].shape == (2, 2)


def _loss_inputs(B=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda: torch.randn(B, generator=gen)  # noqa: E731
    valid = torch.rand(B, generator=gen) < 0.7
    valid[0], valid[1] = True, False
    return dict(new_logp=r() * 0.1 - 1, old_logp=r() * 0.1 - 1, advantage=r(), new_value=r(), old_value=r(),
                value_target=r(), entropy=r().abs(), valid=valid)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("clip_vloss", [True, False])
def test_ppo_loss_masks_invalid_samples(normalize, clip_vloss):
    inputs = _loss_inputs()
    invalid = ~inputs["valid"]

    def run(x):
        x = {k: (v.clone().requires_grad_() if k in ("new_logp", "new_value", "entropy") else v) for k, v in x.items()}
        loss, stats = kernels.ppo_loss(**x, clip_coef=0.2, vf_coef=0.5, ent_coef=0.01, clip_vloss=clip_vloss,
                                       normalize_advantage=normalize)
        loss.backward()
        return loss.detach(), stats, {k: x[k].grad for k in ("new_logp", "new_value", "entropy")}

    loss, stats, grads = run(inputs)
    corrupted = {k: v.clone() for k, v in inputs.items()}
    corrupted["advantage"][invalid] = 1e6
    corrupted["new_logp"][invalid] = 20.0  # ratio e^21
    corrupted["old_logp"][invalid] = -1.0
    corrupted["new_value"][invalid] = -1e5
    corrupted["old_value"][invalid] = 1e5
    corrupted["value_target"][invalid] = 3e5
    corrupted["entropy"][invalid] = 1e4
    loss2, stats2, grads2 = run(corrupted)
    torch.testing.assert_close(loss2, loss)
    for key in stats:
        torch.testing.assert_close(stats2[key], stats[key], msg=key)
    for key in grads:
        torch.testing.assert_close(grads2[key][~invalid], grads[key][~invalid])
        assert (grads2[key][invalid] == 0).all()
    # and the same loss as computing on the valid samples alone
    only_valid = {k: v[~invalid] for k, v in inputs.items()}
    only_valid["valid"] = None
    loss3, stats3 = kernels.ppo_loss(**only_valid, clip_coef=0.2, vf_coef=0.5, ent_coef=0.01, clip_vloss=clip_vloss,
                                     normalize_advantage=normalize)
    torch.testing.assert_close(loss3, loss)


def test_explained_variance():
    T, F = True, False
    target = torch.tensor([1.0, 2.0, 3.0, 100.0])
    valid = torch.tensor([T, T, T, F]).float()
    ev = lambda value: explained_variance(torch.tensor(value), target, valid).item()  # noqa: E731
    assert ev([1.0, 2.0, 3.0, -7.0]) == pytest.approx(1.0)    # perfect on valid samples; invalid one ignored
    assert ev([2.0, 3.0, 4.0, 0.0]) == pytest.approx(1.0)     # constant offset: residual variance 0
    assert ev([0.0, 2.0, 4.0, 0.0]) == pytest.approx(0.0)     # resid [1,0,-1]: var 2/3 = var(target)
    assert ev([3.0, 2.0, 1.0, 0.0]) == pytest.approx(-3.0)    # resid [-2,0,2]: 1 - (8/3)/(2/3)
    assert ev([2.0, 2.0, 2.0, 0.0]) == pytest.approx(0.0)     # constant prediction
    flat = explained_variance(torch.tensor([0.0, 1.0]), torch.tensor([5.0, 5.0]), torch.ones(2))
    assert flat.item() == 0.0 and torch.isfinite(flat)       # zero-variance target: 0, not NaN


def test_explained_variance_along_a_member_axis_is_each_rows_own():
    """``dim=-1``: K members' ``[K, B]`` at once, each row as the 0-d form gives it (a population's statistic)."""
    generator = torch.Generator().manual_seed(0)
    value, target = torch.randn(3, 20, generator=generator), torch.randn(3, 20, generator=generator)
    valid = (torch.rand(3, 20, generator=generator) > 0.3).float()
    target[2] = 4.0  # a zero-variance row: 0
    rows = explained_variance(value, target, valid, dim=-1)
    assert rows.shape == (3,) and rows[2].item() == 0.0
    torch.testing.assert_close(rows, torch.stack([explained_variance(value[m], target[m], valid[m]) for m in range(3)]))


def test_collect_fills_next_value_and_valid():
    from fastrl.config import make_config
    from fastrl.run.trainer import Trainer
    cfg = make_config({"env": "CartPole-v1", "n_envs": 4, "n_steps": 48, "total_steps": 192, "n_minibatches": 2,
                       "wandb": "disabled", "tensorboard": False, "progress": False, "device": "cpu"})
    trainer = Trainer(cfg)
    try:
        trainer.collect()
        buf = trainer.buffer
        nxt = buf["next"]
        torch.testing.assert_close(nxt["state_value"][:-1], buf["state_value"][1:])
        with torch.no_grad():
            bootstrap = trainer.agent.get_value(trainer.next_obs.float())
        torch.testing.assert_close(nxt["state_value"][-1], bootstrap, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(nxt["done"], nxt["terminated"] | nxt["truncated"])
        assert nxt["done"].any(), "random CartPole play ends episodes within 48 steps"
        assert torch.equal(buf["valid"][1:], ~nxt["done"][:-1]), "valid is False exactly after a done"
        assert (nxt["reward"][~buf["valid"]] == 0).all()
        assert trainer.global_step == 4 * 48
    finally:
        trainer.env.close()
