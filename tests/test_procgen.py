"""Procgen (EnvPool ``*Easy-v0`` ids): the one-line error when the system Qt 5 runtime is missing (simulated, so it
runs on every machine), the IMPALA-ResNet encoder under ``encoder: auto``, and a few PPO iterations of CoinRun with
the shipped config at tiny sizes (skipped, with the reason, where Qt is missing)."""
import math

import pytest
import torch

from conftest import QUIET, train_main
from fastrl.config import UserError, load_yaml, make_config
from fastrl.envs import batched, registry
from fastrl.learn.models import ImpalaResNet, resolve_encoder

GAME = "CoinrunEasy-v0"
needs_procgen_ids = pytest.mark.skipif(GAME not in registry.envpool_ids(), reason="this EnvPool build has no Procgen")


def _qt_missing(*_args):
    # What EnvPool raises on a Linux machine without libQt5Gui.so.5.
    raise ImportError("EnvPool Procgen requires the system Qt 5 runtime on Linux. Install the Qt5 Core/Gui shared "
                      "libraries, for example via `apt install qtbase5-dev` or `dnf install qt5-qtbase`.")


@pytest.fixture
def no_qt(monkeypatch):
    monkeypatch.setattr(registry, "_load_procgen", _qt_missing)
    batched._probe.cache_clear()  # a probe of the same id from an earlier test must not answer for this machine
    yield
    batched._probe.cache_clear()


@needs_procgen_ids
def test_procgen_ids_are_recognised_without_loading_procgen(no_qt):
    assert registry.is_procgen(GAME) and registry.is_procgen("StarpilotHard-v0")
    assert not registry.is_procgen("Pong-v5") and not registry.is_procgen("CartPole-v1") and not registry.is_procgen("nope")
    assert not registry.is_atari(GAME)  # answered without building a Procgen spec (which needs Qt)


@needs_procgen_ids
def test_missing_qt_is_one_line_naming_the_package(no_qt, tmp_path, capsys):
    with pytest.raises(UserError) as info:
        batched.BatchedEnv(GAME, 2, seed=0)
    message = str(info.value)
    assert "\n" not in message and "libqt5gui5" in message and "apt-get install" in message
    rc = train_main(["--env", GAME, "--run-dir", str(tmp_path / "run"), *QUIET])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip() == f"fastrl: error: {message}"
    assert "Traceback" not in err


def test_another_import_failure_is_not_reported_as_qt(monkeypatch):
    def broken():
        raise ImportError("something else entirely")
    monkeypatch.setattr(registry, "_load_procgen", broken)
    with pytest.raises(ImportError, match="something else"):
        registry.require_procgen_runtime(GAME)


@needs_procgen_ids
def test_auto_encoder_is_impala_resnet_for_procgen_only():
    assert resolve_encoder("auto", (3, 64, 64), GAME) == "impala_resnet"
    assert resolve_encoder("auto", (3, 64, 64)) == "nature_cnn"
    assert resolve_encoder("auto", (4, 84, 84), "Breakout-v5") == "nature_cnn"
    assert resolve_encoder("nature_cnn", (3, 64, 64), GAME) == "nature_cnn"  # an explicit choice stands


def test_procgen_config_holds_cobbe_et_al_settings():
    cfg = make_config(yaml_path="configs/ppo/procgen.yaml")
    assert (cfg.env, cfg.n_envs, cfg.n_steps, cfg.n_epochs, cfg.n_minibatches) == (GAME, 64, 256, 3, 8)
    assert (cfg.lr, cfg.gamma, cfg.gae_lambda, cfg.ent_coef) == (5e-4, 0.999, 0.95, 0.01)
    assert (cfg.clip_coef, cfg.vf_coef, cfg.max_grad_norm, cfg.total_steps) == (0.2, 0.5, 0.5, 25_000_000)


@needs_procgen_ids
def test_procgen_ppo_trains_a_few_iterations():
    """The shipped config at tiny sizes: IMPALA-ResNet on uint8 [3, 64, 64] frames, finite losses, weights move."""
    try:
        registry.require_procgen_runtime(GAME)
    except UserError as e:
        pytest.skip(f"Qt 5 runtime missing here ({e})")
    from fastrl.run.trainer import Trainer
    values = {**load_yaml("configs/ppo/procgen.yaml"), "n_envs": 2, "n_steps": 8, "n_minibatches": 2,
              "n_epochs": 1, "total_steps": 48, "env_threads": 1, "progress": False, "tensorboard": False,
              "wandb": "disabled", "plot": False}
    cfg = make_config({**values, "encoder": "auto"})
    trainer = Trainer(cfg)
    try:
        assert isinstance(trainer.agent.encoder, ImpalaResNet)
        initial = torch.nn.utils.parameters_to_vector(trainer.agent.parameters()).detach().clone()
        while not trainer.finished():
            trainer.collect()
            metrics = trainer.update()
        assert trainer.iteration == 3 and trainer.global_step == 48
        obs = trainer.buffer["observation"]
        assert obs.dtype == torch.uint8 and obs.shape == (8, 2, 3, 64, 64)
        assert all(math.isfinite(float(metrics[k])) for k in ("losses/policy_loss", "losses/value_loss"))
        final = torch.nn.utils.parameters_to_vector(trainer.agent.parameters()).detach()
        assert not torch.equal(initial, final)
    finally:
        trainer.close()
