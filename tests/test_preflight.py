"""Preflight: every combination of config x env x device x launch either runs or stops before any work with one
line saying what is wrong and how to fix it (with a hypothesis fuzz of the combinations)."""
import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from conftest import one_line_error
from fastrl.config import UserError, make_config
from fastrl.defaults import ACTOR_LEARNER_ALGOS, ALGOS
from fastrl.learn.models import make_agent
from fastrl.run import preflight
from fastrl.run.preflight import check_device, check_launch, check_model, check_precision, check_run

ROOT = Path(__file__).resolve().parent.parent
QUIET = ["--eval-episodes", "0", "--progress", "false", "--tensorboard", "false", "--wandb", "disabled"]
TINY = ["--total-steps", "64", "--n-envs", "2", "--n-steps", "8", *QUIET]
ERROR_LINE = re.compile(r"^fastrl: error: \S.*$")
VECTOR_ENVS = ("CartPole-v1", "Pendulum-v1")  # discrete and continuous actions, float observations
IMAGE_ENVS = ("Pong-v5", "MiniGrid-Empty-5x5-v0")  # uint8 [4, 84, 84] frames and [3, 7, 7] grids
CONV_ENCODERS = ("nature_cnn", "impala_resnet", "minigrid_cnn")


@pytest.fixture
def no_cuda(monkeypatch):
    """Any machine behaves as one without CUDA."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def two_gpus(monkeypatch):
    """Any machine behaves as one with two CUDA devices (nothing is allocated on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


# --------------------------------------------------------------------------- launch (torchrun)
@pytest.mark.parametrize("algo", ACTOR_LEARNER_ALGOS)
def test_actor_learner_refuses_torchrun(algo):
    message = one_line_error(check_launch, make_config({"algo": algo}), 2)
    assert algo in message and "torchrun" in message and "python" in message
    check_launch(make_config({"algo": algo}), 1)


def test_n_envs_must_split_across_ranks():
    message = one_line_error(check_launch, make_config({"n_envs": 6}), 4)
    assert "n_envs=6" in message and "4" in message and "--per-rank" in message
    check_launch(make_config({"n_envs": 8}), 4)
    check_launch(make_config({"n_envs": 6, "per_rank": True}), 4)  # 6 per rank


@pytest.mark.parametrize("overrides, world_size, rank_batch", [
    ({"n_envs": 4, "n_steps": 3, "n_minibatches": 4}, 2, 6),     # 12 in all, 6 per rank: 4 does not divide it
    ({"n_envs": 8, "n_steps": 6, "n_minibatches": 16}, 4, 12),
    ({"n_envs": 8, "n_steps": 8, "n_minibatches": 8}, 2, None),  # 32 per rank
    ({"n_envs": 4, "n_steps": 6, "n_minibatches": 8, "per_rank": True}, 4, None),  # 24 per rank
])
def test_per_rank_batch_must_divide_into_minibatches(overrides, world_size, rank_batch):
    cfg = make_config(overrides)
    if rank_batch is None:
        check_launch(cfg, world_size)
        return
    message = one_line_error(check_launch, cfg, world_size)
    assert f"n_minibatches={cfg.n_minibatches}" in message and f"= {rank_batch} samples" in message


def test_world_size_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert "torchrun" in one_line_error(check_run, make_config({"algo": "impala", "device": "cpu"}))
    monkeypatch.setenv("WORLD_SIZE", "1")
    check_run(make_config({"algo": "impala", "device": "cpu"}))


# --------------------------------------------------------------------------- device and precision
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1"])
def test_cuda_without_cuda(no_cuda, device):
    message = one_line_error(check_device, make_config({"device": device}))
    assert f"device={device}" in message and "--device cpu" in message


def test_auto_without_cuda_is_cpu(no_cuda):
    assert check_device(make_config({"device": "auto"})).type == "cpu"


def test_missing_gpu_index(two_gpus):
    assert check_device(make_config({"device": "cuda:1"})) == torch.device("cuda:1")
    message = one_line_error(check_device, make_config({"device": "cuda:2"}))
    assert "cuda:2" in message and "cuda:0 to cuda:1" in message


def test_torchrun_ranks_need_a_gpu_each(two_gpus):
    assert check_device(make_config({"device": "cuda"}), 2, 1) == torch.device("cuda:1")
    message = one_line_error(check_device, make_config({"device": "cuda"}), 4, 3)
    assert "LOCAL_RANK=3" in message and "--nproc_per_node" in message
    message = one_line_error(check_device, make_config({"device": "cuda:0"}), 2, 0)
    assert "every torchrun rank" in message and "--device cuda" in message


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_fp16_needs_cuda(no_cuda, device):
    cfg = make_config({"amp": "fp16", "device": device})
    message = one_line_error(check_precision, cfg, check_device(cfg))
    assert "amp=fp16" in message and "--amp bf16" in message


def test_bf16_on_cpu_and_fp16_on_cuda_pass():
    check_precision(make_config({"amp": "bf16", "device": "cpu"}), torch.device("cpu"))
    check_precision(make_config({"amp": "fp16"}), torch.device("cuda:0"))


def test_bf16_on_a_gpu_without_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Tesla V100")
    message = one_line_error(check_precision, make_config({"amp": "bf16"}), torch.device("cuda:0"))
    assert "Tesla V100" in message and "--amp fp16" in message


def test_deterministic_cuda_needs_cublas_workspace(monkeypatch):
    cfg = make_config({"deterministic": True})
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert "CUBLAS_WORKSPACE_CONFIG=:4096:8" in one_line_error(check_precision, cfg, torch.device("cuda:0"))
    check_precision(cfg, torch.device("cpu"))
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    check_precision(cfg, torch.device("cuda:0"))


# --------------------------------------------------------------------------- env x model
@pytest.mark.parametrize("encoder", CONV_ENCODERS)
def test_conv_encoders_need_images(encoder):
    message = one_line_error(check_model, make_config({"encoder": encoder}), (4,), torch.float32)
    assert f"encoder={encoder}" in message and "(4,)" in message and "--encoder mlp" in message


def test_encoder_that_does_not_fit_suggests_those_that_do():
    message = one_line_error(check_model, make_config({"encoder": "nature_cnn"}), (3, 7, 7), torch.uint8)
    assert "(3, 7, 7)" in message and "impala_resnet or minigrid_cnn or mlp" in message
    check_model(make_config({"encoder": "impala_resnet"}), (3, 7, 7), torch.uint8)
    check_model(make_config({"encoder": "minigrid_cnn"}), (3, 7, 7), torch.uint8)


@pytest.mark.parametrize("encoder", ("auto",) + CONV_ENCODERS)
def test_channels_last_frames_are_refused(encoder):
    """A [H, W, C] image (96x96 RGB) read as [C, H, W] would be a 3-pixel-wide grid of 96 channels."""
    message = one_line_error(check_model, make_config({"encoder": encoder}), (96, 96, 3), torch.uint8)
    assert "channels-last" in message and "--encoder mlp" in message
    assert f"encoder={encoder}" in message and (encoder != "auto" or "(here small_cnn)" in message)
    check_model(make_config({"encoder": "mlp"}), (96, 96, 3), torch.uint8)


def test_gymnasium_env_missing_its_package(monkeypatch):
    from fastrl.envs import batched as envs

    def missing(*args, **kwargs):
        raise ImportError("Box2D is not installed, run `pip install \"gymnasium[box2d]\"`\nmore detail")

    monkeypatch.setattr(envs, "BatchedEnv", missing)
    envs._probe.cache_clear()
    try:
        message = one_line_error(check_run, make_config({"env": "CarRacing-v3", "device": "cpu"}), 1)
    finally:
        envs._probe.cache_clear()
    assert "CarRacing-v3" in message and "gymnasium[box2d]" in message


def test_normalize_obs_needs_float_observations():
    message = one_line_error(check_model, make_config({"normalize_obs": True}), (4, 84, 84), torch.uint8)
    assert "normalize_obs" in message and "uint8" in message
    check_model(make_config({"normalize_obs": True}), (4,), torch.float32)


@pytest.mark.parametrize("given, needle", [({"env": "Blackjack-v1", "env_backend": "gymnasium"}, "Tuple"),
                                           ({"env": "NoSuchEnv-v0"}, "NoSuchEnv-v0")])
def test_env_probe_errors(given, needle):
    assert needle in one_line_error(check_run, make_config(given), 1)


# --------------------------------------------------------------------------- fuzz of the combinations
def _must_fail(cfg, world_size: int) -> str | None:
    """What the message must name when the combination is impossible on this machine (the first problem, in the
    order check_run looks); None when it must run."""
    if world_size > 1:
        if cfg.algo in ACTOR_LEARNER_ALGOS:
            return "torchrun"
        if cfg.n_envs % world_size and not cfg.per_rank:
            return f"n_envs={cfg.n_envs}"
        rank_envs = cfg.n_envs if cfg.per_rank else cfg.n_envs // world_size
        if (rank_envs * cfg.n_steps) % cfg.n_minibatches:
            return f"n_minibatches={cfg.n_minibatches}"
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        return "device"
    cuda = cfg.device.startswith("cuda") or (cfg.device == "auto" and torch.cuda.is_available())
    if cfg.amp == "fp16" and not cuda:
        return "amp=fp16"
    if cfg.normalize_obs and cfg.env in IMAGE_ENVS:
        return "normalize_obs"
    if cfg.encoder in CONV_ENCODERS and cfg.env in VECTOR_ENVS:
        return f"encoder={cfg.encoder}"
    if cfg.encoder == "nature_cnn" and cfg.env.startswith("MiniGrid"):
        return "encoder=nature_cnn"
    return None


EXTRAS = [{"n_epochs": 2}, {"gae_lambda": 0.95}, {"clip_coef": 0.1}, {"n_actors": 1, "n_slots": 4},
          {"vtrace_lambda": 0.9}, {"compile": "off"}, {"compile": "default"}, {"per_rank": True}]
combination = st.fixed_dictionaries({
    "algo": st.sampled_from(ALGOS),
    "env": st.sampled_from(VECTOR_ENVS + IMAGE_ENVS),
    "encoder": st.sampled_from(("auto", "mlp") + CONV_ENCODERS),
    "amp": st.sampled_from(("off", "off", "bf16", "fp16")),
    "device": st.sampled_from(("cpu", "auto", "cuda")),
    "n_envs": st.sampled_from((1, 2, 3, 4, 8)),
    "n_steps": st.sampled_from((1, 4, 5, 8)),
    "n_minibatches": st.sampled_from((1, 1, 2, 4)),
    "normalize_obs": st.sampled_from((False, False, True)),
}).flatmap(lambda base: st.sampled_from([{}, {}, {}] + EXTRAS).map(lambda extra: {**base, **extra}))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(overrides=combination, world_size=st.sampled_from((1, 1, 2)))
def test_fuzz_combinations_run_or_fail_in_one_line(overrides, world_size):
    """Config x env x encoder x amp x device x launch: a one-line UserError before any work, or a combination whose
    model builds and runs a forward on the env's observations."""
    try:
        cfg = make_config(overrides)
    except UserError as e:
        assert "\n" not in str(e)
        event("refused by make_config")
        return
    needle = _must_fail(cfg, world_size)
    try:
        check_run(cfg, world_size)
    except UserError as e:
        assert "\n" not in str(e) and str(e)
        assert needle is not None and needle in str(e), (needle, str(e))
        event(f"refused by check_run ({needle})")
        return
    event("runs")
    assert needle is None, f"expected a refusal naming {needle!r}"
    shape, dtype, spec = preflight.probe_env(cfg)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        agent = make_agent(cfg, shape, spec)
        action, logp, entropy, value = agent.get_action_and_value(torch.zeros(2, *shape, dtype=dtype))
    assert logp.shape == entropy.shape == value.shape == (2,)


# --------------------------------------------------------------------------- the command line
@pytest.mark.parametrize("argv, needle", [
    (["--amp", "fp16", "--device", "cpu"], "amp=fp16"),
    (["--encoder", "nature_cnn"], "encoder=nature_cnn"),
    (["--env", "MiniGrid-Empty-5x5-v0", "--encoder", "nature_cnn"], "(3, 7, 7)"),
    (["--env", "Pong-v5", "--normalize-obs", "true"], "normalize_obs"),
    (["--algo", "impala", "--n-epochs", "4"], "n_epochs=4 does not apply to impala"),
    (["--algo", "ppo", "--n-actors", "4"], "n_actors"),
    (["--algo", "impala", "--compile", "default"], "compile"),
    (["--device", "cuda:x"], "device"),
])
def test_cli_combination_errors_in_process(capsys, tmp_path, monkeypatch, argv, needle):
    from fastrl.cli.train import main
    monkeypatch.chdir(tmp_path)
    assert main(argv + TINY) == 2
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and ERROR_LINE.match(lines[0]) and needle in lines[0], err
    assert "Traceback" not in out + err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("argv, needle", [
    (["--amp", "fp16", "--device", "cpu"], "amp=fp16"),
    (["--env", "CartPole-v1", "--encoder", "nature_cnn"], "encoder=nature_cnn"),
])
def test_cli_combination_errors_subprocess(tmp_path, argv, needle):
    """The real command: exit 2, exactly one ``fastrl: error:`` line on stderr, nothing created."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "fastrl.train", *argv, *TINY, "--run-dir", str(run_dir)],
                          cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and ERROR_LINE.match(lines[0]), (proc.returncode, proc.stderr)
    assert needle in lines[0] and "Traceback" not in proc.stdout
    assert not run_dir.exists() and not (tmp_path / "runs").exists()
