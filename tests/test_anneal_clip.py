"""anneal_clip: PPO's clip coefficient annealed linearly to 0 per iteration (SB3's lin_0.2), without recompiling."""
import pytest
import torch

import fastrl.run.compile
from fastrl.config import UserError, make_config
from fastrl.learn.update import Update
from fastrl.run.trainer import Trainer

TINY = dict(n_envs=2, n_steps=8, total_steps=64, n_epochs=2, n_minibatches=2, device="cpu", progress=False,
            tensorboard=False, wandb="disabled", eval_episodes=0, compile="off", clip_coef=0.2)  # 4 iterations


def _trainer(**overrides) -> Trainer:
    return Trainer(make_config({**TINY, **overrides}))


def test_clip_anneals_linearly_to_zero_on_the_lr_clock():
    trainer = _trainer(anneal_clip=True)
    try:
        assert trainer.n_iterations == 4
        for k in range(4):
            trainer.collect()
            metrics = trainer.update()
            assert metrics["charts/clip_coef"] == pytest.approx(0.2 * (1 - k / 4))
            assert trainer.hparams["clip_coef"].tolist() == pytest.approx([0.2 * (1 - k / 4)])
        assert trainer.cfg.clip_coef == 0.2  # the run's config (checkpoints, logs) keeps the initial value
    finally:
        trainer.close()
    fixed = _trainer()
    try:
        fixed.collect()
        assert "charts/clip_coef" not in fixed.update()
        assert fixed.hparams["clip_coef"].tolist() == pytest.approx([0.2])
    finally:
        fixed.close()


@pytest.mark.parametrize("path", ["eager", "functional"])
def test_annealed_update_equals_a_fixed_clip_of_that_value(path):
    """``eager``: the update's eager path (the agent module and autograd); ``functional``: the code the compiled call
    runs (torch.func on the flat weights, clip_coef a 0-d tensor input), run eagerly."""
    """Iteration 2 of 4 with anneal_clip trains exactly as a run whose clip_coef is 0.1."""
    trainers = []
    try:
        for overrides in (dict(anneal_clip=True), dict(clip_coef=0.1)):  # each seeds torch's sampling RNG, then rolls out
            trainer = _trainer(**overrides)
            trainers.append(trainer)
            trainer.iteration = 2
            if path == "functional":
                trainer.update_fn = Update(trainer.spec, trainer.layout, trainer.autocast, "functional")
            trainer.collect()
        annealed, fixed = trainers
        for key in ("observation", "action", "sample_log_prob"):
            assert torch.equal(annealed.buffer[key], fixed.buffer[key])
        stats = annealed.update(), fixed.update()
        assert stats[0]["losses/clipfrac"] == stats[1]["losses/clipfrac"]
        for p, q in zip(annealed.agent.parameters(), fixed.agent.parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=0)
    finally:
        for trainer in trainers:
            trainer.close()


def test_compiled_step_follows_the_schedule_without_recompiling(monkeypatch):
    real_compile = torch.compile  # dynamo's guards and graph capture, with the cheap aot_eager backend
    monkeypatch.setattr(fastrl.run.compile.torch, "compile", lambda fn, mode=None, fullgraph=False, dynamic=None: real_compile(
        fn, backend="aot_eager", fullgraph=fullgraph, dynamic=dynamic))
    trainer = _trainer(anneal_clip=True, compile="default")
    try:
        trainer.collect()
        trainer.update()  # compiles
        assert trainer.update_call.compiled
        with torch._dynamo.config.patch(error_on_recompile=True):
            for k in (1, 2, 3):
                trainer.collect()
                assert trainer.update()["charts/clip_coef"] == pytest.approx(0.2 * (1 - k / 4))
                assert trainer.hparams["clip_coef"].tolist() == pytest.approx([0.2 * (1 - k / 4)])
    finally:
        trainer.close()


def test_anneal_clip_is_ppo_only():
    with pytest.raises(UserError, match="anneal_clip"):
        make_config({"algo": "a2c", "anneal_clip": True})
    assert make_config({"algo": "a2c", "anneal_clip": False}).anneal_clip is False
