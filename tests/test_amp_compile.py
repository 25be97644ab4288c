"""Mixed precision and torch.compile: same results as eager on a fixed batch, no recompiles after warm-up."""
import functools
import warnings

import pytest
import torch
from torch._dynamo.utils import counters

import fastrl.amp as amp
import fastrl.rollout
from fastrl.amp import CompiledOrEager, autocast_factory, grad_scaler, resolve_compile
from fastrl.config import make_config
from fastrl.envs import ActionSpec
from fastrl.models import PixelActorCritic
from fastrl.ppo import ppo_loss_terms
from fastrl.train import Trainer

QUIET = dict(progress=False, tensorboard=False, wandb="disabled", plot=False)


def _fixed_batch(agent, n=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    obs = torch.randint(0, 11, (n, 3, 7, 7), dtype=torch.uint8, generator=gen)
    with torch.no_grad():
        action, logp, _, value = agent.get_action_and_value(obs)
    advantage = torch.randn(n, generator=gen)
    target = value + torch.randn(n, generator=gen)
    valid = torch.rand(n, generator=gen) > 0.1
    return obs, action, logp + 0.05 * torch.randn(n, generator=gen), advantage, value, target, valid


def _agent():
    torch.manual_seed(0)
    return PixelActorCritic((3, 7, 7), ActionSpec("discrete", n=7), "minigrid_cnn", obs_scale=0.1)


def test_amp_resolution():
    cpu = torch.device("cpu")
    assert autocast_factory(cpu, "off")().__class__.__name__ == "nullcontext"
    assert grad_scaler(cpu, "bf16") is None and grad_scaler(cpu, "fp16") is None
    with pytest.raises(ValueError, match="bf16"):
        autocast_factory(cpu, "fp16")
    assert resolve_compile("auto", cpu) == "off"
    assert resolve_compile("auto", torch.device("cuda")) == "reduce-overhead"  # CUDA graphs


def test_bf16_matches_eager_and_keeps_loss_and_grads_float32():
    agent = _agent()
    cfg = make_config(dict(env="MiniGrid-Empty-5x5-v0", ent_coef=0.01))
    batch = _fixed_batch(agent)
    loss32, stats32 = ppo_loss_terms(agent, cfg, *batch)
    grads32 = torch.autograd.grad(loss32, list(agent.parameters()))
    loss16, stats16 = ppo_loss_terms(agent, cfg, *batch, autocast=autocast_factory(torch.device("cpu"), "bf16"))
    grads16 = torch.autograd.grad(loss16, list(agent.parameters()))
    assert loss16.dtype == torch.float32 and all(g.dtype == torch.float32 for g in grads16)
    torch.testing.assert_close(loss16, loss32, atol=2e-2, rtol=2e-2)
    for key in ("policy_loss", "value_loss", "entropy"):
        torch.testing.assert_close(stats16[key], stats32[key], atol=2e-2, rtol=2e-2)
    cos = torch.nn.functional.cosine_similarity(torch.cat([g.flatten() for g in grads16]),
                                                torch.cat([g.flatten() for g in grads32]), dim=0)
    assert cos > 0.99


def test_compiled_loss_matches_eager():
    """Inductor (the real compiler) on the PPO loss of a fixed batch: same loss and gradients as eager."""
    agent = _agent()
    cfg = make_config(dict(env="MiniGrid-Empty-5x5-v0", ent_coef=0.01))
    batch = _fixed_batch(agent)
    eager_loss, _ = ppo_loss_terms(agent, cfg, *batch)
    eager_grads = torch.autograd.grad(eager_loss, list(agent.parameters()))
    compiled = CompiledOrEager(functools.partial(ppo_loss_terms, agent, cfg), "default", "test loss")
    loss, _ = compiled(*batch)
    assert compiled.compiled, "compilation fell back to eager"
    grads = torch.autograd.grad(loss, list(agent.parameters()))
    torch.testing.assert_close(loss, eager_loss, atol=1e-5, rtol=1e-5)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-4)


def test_compile_failure_falls_back_to_eager_with_one_warning(monkeypatch):
    def broken(fn, mode=None, **options):
        def call(*args):
            raise RuntimeError("inductor exploded")
        return call
    monkeypatch.setattr(amp.torch, "compile", broken)
    wrapped = CompiledOrEager(lambda x: x + 1, "default", "toy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert wrapped(torch.tensor(1)).item() == 2
        assert wrapped(torch.tensor(2)).item() == 3
    assert len([w for w in caught if "torch.compile failed" in str(w.message)]) == 1
    assert not wrapped.compiled


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_nothing_recompiles_across_iterations(monkeypatch, algo):
    """Dynamo's guards are what decide recompiles, so the cheap aot_eager backend stands in for inductor here;
    the learning rate changes every iteration and must not trigger one."""
    real_compile = torch.compile
    monkeypatch.setattr(fastrl.rollout, "SKIP_GUARDS", False)  # guards on: a needed recompile must show
    monkeypatch.setattr(amp.torch, "compile", lambda fn, mode=None, **kw: real_compile(fn, backend="aot_eager", **kw))
    torch._dynamo.reset()
    counters.clear()
    cfg = make_config(dict(algo=algo, env="MiniGrid-Empty-5x5-v0", n_envs=4, n_steps=8, total_steps=4 * 8 * 10,
                           compile="default", **QUIET, **({"n_minibatches": 2} if algo == "ppo" else {})))
    trainer = Trainer(cfg)
    trainer.collect()
    trainer.update()  # warm-up
    # the update runs as one compiled step (forward, loss, gradient, clip, optimizer math); loss_fn is unused then
    assert trainer.rollout_step.compiled and trainer.step_fn.compiled  # the bootstrap forward stays eager on CPU
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 2
    lrs = set()
    for _ in range(3):
        trainer.collect()
        metrics = trainer.update()
        lrs.add(metrics["charts/learning_rate"])
    assert len(lrs) == 3
    assert counters["stats"]["unique_graphs"] == graphs, "something recompiled after warm-up"
    assert not counters["recompiles"], dict(counters["recompiles"])
    trainer.env.close()


def test_bf16_trainer_runs_an_iteration():
    trainer = Trainer(make_config(dict(env="MiniGrid-Empty-5x5-v0", n_envs=4, n_steps=8, n_minibatches=2, amp="bf16", **QUIET)))
    trainer.collect()
    metrics = trainer.update()
    assert torch.isfinite(metrics["losses/policy_loss"])
    assert all(p.dtype == torch.float32 for p in trainer.agent.parameters())
    state = trainer.optimizer.state_dict()["state"]
    assert all(v.dtype == torch.float32 for s in state.values() for k, v in s.items() if k != "step")
    trainer.env.close()
