"""fastrl export / Agent.export: the ONNX file (run by onnxruntime) and the TorchScript file (torch.jit.load) give, on
1,000 raw observations, the actions ``agent.predict(obs, deterministic=True)`` gives: identical discrete actions
(CartPole, MultiDiscrete, a CNN on channels-last uint8 frames, two Dict observations) and continuous ones within
1e-5 (Pendulum, with observation normalization and actions past the bounds, clamped); an LSTM policy carries its
state through the file; a masked policy's
``action_mask`` is one more input. The command end to end, its one-line errors, and its --help without torch."""
import subprocess
import sys

import numpy as np
import pytest
import torch

import fastrl
from fastrl_space_envs import DictCodeMatch, DictMatch, MultiMatch, PixelMatch

# One iteration of 2 envs x 32 steps: the weights only need to be a trained run's (normalizer statistics included).
BRIEF = dict(total_steps=64, n_envs=2, n_steps=32, n_epochs=1, n_minibatches=1, compile="off", eval_episodes=0,
             progress=False, tensorboard=False, wandb="disabled", plot=False, quiet=True)
CASES = {"CartPole-v1": ("CartPole-v1", {}), "Pendulum-v1": ("Pendulum-v1", {"normalize_obs": True}),
         "PixelMatch": (PixelMatch, {}), "MultiMatch": (MultiMatch, {}), "DictMatch": (DictMatch, {}),
         "DictCodeMatch": (DictCodeMatch, {}), "FrozenLake-v1": ("FrozenLake-v1", {}),
         "MiniGrid-Empty-5x5-v0": ("MiniGrid-Empty-5x5-v0", {})}
# Both formats share the inputs' adaptation (EnvInputs): a Discrete observation ([B]) and MiniGrid's image entry
# are checked through the quicker TorchScript export alone.
FILES = [(case, fmt) for case in CASES for fmt in ("onnx", "torchscript")
         if fmt == "torchscript" or case not in ("FrozenLake-v1", "MiniGrid-Empty-5x5-v0")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``trained(case) -> run_dir``, each case trained once for the module."""
    root, done = tmp_path_factory.mktemp("export_runs"), {}

    def run_dir(case: str):
        if case not in done:
            env, overrides = CASES[case]
            done[case] = fastrl.train(env=env, run_dir=root / case, **BRIEF, **overrides).run_dir
        return done[case]
    return run_dir


def _agent(run_dir):
    """The run's agent, its policy head's weights redrawn from N(0, 1) (seeded): large enough that discrete actions
    vary with the observation (rather than following the head's bias) and some continuous ones pass the bounds."""
    agent = fastrl.load(run_dir)
    policy = getattr(agent.policy, "base", agent.policy)  # a recurrent policy's heads sit on its base
    weight = policy.policy_head.weight
    with torch.no_grad():
        weight.copy_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)))
    return agent


def _observations(agent, n: int = 1000):
    """``n`` observations drawn from the observation space, stacked as the env batches them (a dict per key)."""
    space = agent.observation_space
    space.seed(0)
    drawn = [space.sample() for _ in range(n)]
    if isinstance(drawn[0], dict):
        return {key: np.stack([obs[key] for obs in drawn]) for key in drawn[0]}
    return np.stack(drawn)


def _run_file(path, fmt: str, inputs: dict) -> np.ndarray:
    if fmt == "onnx":
        ort = pytest.importorskip("onnxruntime")
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == list(inputs)
        assert [o.name for o in session.get_outputs()] == ["action"]
        return session.run(["action"], inputs)[0]
    module = torch.jit.load(str(path))
    return module(*(torch.from_numpy(value) for value in inputs.values())).numpy()


def _assert_same_actions(got: np.ndarray, expected: np.ndarray, continuous: bool):
    assert got.shape == expected.shape and got.dtype == expected.dtype, (got.shape, got.dtype, expected.dtype)
    if continuous:
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("case, fmt", FILES)
def test_exported_file_acts_as_predict_on_raw_observations(trained, tmp_path, case, fmt):
    agent = _agent(trained(case))
    obs = _observations(agent)
    if case == "Pendulum-v1":
        obs[:100] *= 1000  # far outside the normalizer's statistics: clipped to obs_clip
    if case.startswith("MiniGrid"):
        obs = {"image": obs["image"]}  # the entry fastrl's MiniGrid policy reads
    inputs = obs if isinstance(obs, dict) else {"obs": obs}
    expected, _ = agent.predict(obs, deterministic=True)
    continuous = agent.action_spec.kind == "continuous"
    assert continuous or len(np.unique(expected, axis=0)) > 1, "the policy must act differently across observations"
    path = agent.export(tmp_path / f"policy.{fmt}", format=fmt)
    assert path == tmp_path / f"policy.{fmt}" and path.is_file()
    _assert_same_actions(_run_file(path, fmt, inputs), expected, continuous)
    one = {key: value[:1] for key, value in inputs.items()}  # another batch size than the one exported with
    _assert_same_actions(_run_file(path, fmt, one), expected[:1], continuous)


def test_the_continuous_case_exercises_normalization_and_clipping(trained):
    """What the Pendulum case compares goes through every step the file must hold: the normalizer changes the
    action, and the clamping to [-2, 2] takes some actions, not all."""
    agent = _agent(trained("Pendulum-v1"))
    obs = _observations(agent)
    assert agent.raw_policy.normalized and not torch.equal(agent.raw_policy.mean, torch.zeros(3, dtype=torch.float64))
    action, _ = agent.predict(obs, deterministic=True)
    unnormalized = agent.policy.act_deterministic(torch.from_numpy(obs)).numpy()
    assert not np.allclose(np.clip(unnormalized, -2, 2), action)
    at_bound = np.isclose(np.abs(action), 2.0)
    assert at_bound.any() and not at_bound.all() and np.abs(action).max() <= 2.0


def test_export_command_writes_an_onnx_file_that_acts_as_predict(one_iteration_run, tmp_path):
    out = tmp_path / "f.onnx"
    proc = subprocess.run([sys.executable, "-m", "fastrl", "export", str(one_iteration_run), "--format", "onnx",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"wrote {out} (onnx)"
    agent = fastrl.load(one_iteration_run)
    obs = _observations(agent)
    expected, _ = agent.predict(obs, deterministic=True)
    _assert_same_actions(_run_file(out, "onnx", {"obs": obs}), expected, continuous=False)


@pytest.mark.parametrize("args, needle", [
    (["export", "no/such/run", "--out", "f.onnx"], "no/such/run"),
    (["export", "RUN", "--format", "tflite", "--out", "f.onnx"], "unknown export format 'tflite'"),
    (["export", "RUN", "--out", "missing/f.onnx"], "does not exist"),
    (["export", "RUN"], "--out"),
])
def test_export_command_errors_are_one_line(one_iteration_run, capsys, tmp_path, monkeypatch, args, needle):
    from fastrl.cli import main
    monkeypatch.chdir(tmp_path)
    assert main([str(one_iteration_run) if a == "RUN" else a for a in args]) == 2
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fastrl export: error: ") and needle in lines[0], err
    assert "Traceback" not in out + err and list(tmp_path.iterdir()) == []


def test_onnx_export_without_its_packages_names_the_extra(one_iteration_run, capsys, tmp_path, monkeypatch):
    import importlib.util
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnxscript" else find_spec(name, *a))
    from fastrl.cli import main
    assert main(["export", str(one_iteration_run), "--out", str(tmp_path / "f.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "fastrl export: error: ONNX export needs onnxscript: pip install 'fastrl[export]'", err
    assert not (tmp_path / "f.onnx").exists()


def test_export_help_imports_no_torch():
    code = ("import sys; from fastrl.cli import main\n"
            "try:\n    main(['export', '--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--format" in proc.stdout and "--out" in proc.stdout


def test_a_masked_policy_takes_its_mask_as_one_more_input(tmp_path):
    """Action masking (``fastrl.envs.masks``, merged from its own branch): the Dict's ``action_mask`` is an input
    like any entry, and the files pick predict's actions, every one of them valid."""
    pytest.importorskip("fastrl.envs.masks")
    from benchmarks.masking import DictMaskedChoice
    agent = _agent(fastrl.train(env=DictMaskedChoice, run_dir=tmp_path / "run", **BRIEF).run_dir)
    obs = _observations(agent)
    obs["action_mask"][:, 0] = 1  # some action is always valid
    expected, _ = agent.predict(obs, deterministic=True)
    assert len(np.unique(expected)) > 1 and obs["action_mask"][np.arange(len(expected)), expected].all()
    for fmt in ("onnx", "torchscript"):
        path = agent.export(tmp_path / f"policy.{fmt}", format=fmt)
        inputs = {"observation": obs["observation"], "action_mask": obs["action_mask"]}  # the mask packed last
        _assert_same_actions(_run_file(path, fmt, inputs), expected, continuous=False)


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_a_recurrent_policy_carries_its_state_through_the_file(tmp_path, fmt):
    """An LSTM policy on position-only CartPole: 8 envs x 125 steps (1,000 observations) through the file, its
    ``state`` output fed back as the next input with episode starts scattered in, give ``predict``'s actions
    (identical) and states (within 1e-5) step by step."""
    run_dir = fastrl.train(env="CartPoleNoVel-v1", recurrent="lstm", recurrent_size=16, run_dir=tmp_path / "run",
                           **BRIEF).run_dir
    agent = _agent(run_dir)
    path = agent.export(tmp_path / f"policy.{fmt}", format=fmt)
    rng = np.random.default_rng(0)
    session = module = None
    if fmt == "onnx":
        ort = pytest.importorskip("onnxruntime")
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == ["obs", "state", "episode_start"]
        assert [o.name for o in session.get_outputs()] == ["action", "next_state"]
    else:
        module = torch.jit.load(str(path))
    file_state = np.zeros((8, agent.policy.state_size), dtype=np.float32)
    predict_state, differed = None, 0
    for t in range(125):
        obs = rng.uniform(-2, 2, size=(8, 2)).astype(np.float32)
        starts = rng.random(8) < 0.1 if t else np.ones(8, dtype=bool)
        expected, predict_state = agent.predict(obs, state=predict_state, episode_start=starts)
        if session is not None:
            got, file_state = session.run(["action", "next_state"], {"obs": obs, "state": file_state,
                                                                "episode_start": starts})
        else:
            got, file_state = (x.numpy() for x in module(torch.from_numpy(obs), torch.from_numpy(file_state),
                                                         torch.from_numpy(starts)))
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_allclose(file_state, np.concatenate(predict_state, axis=1), rtol=0, atol=1e-5)
        differed += int(len(set(expected.tolist())) > 1)
    assert differed > 10  # the actions depend on the observations and the state, not on the head's bias alone
