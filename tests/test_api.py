"""The Python API (``fastrl.train``, ``fastrl.load``, ``Agent``), custom environments and callbacks.

The custom env is ``tests/fastrl_match_env.py`` (MatchTarget: name the one-hot target shown; 8 steps; a random
policy scores 2, a learned one 8). Subprocesses find it through PYTHONPATH.
"""
import json
import math
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import fastrl
from conftest import median_of_seeds, one_line_error
from fastrl.config import UserError
from fastrl.run.callbacks import EvalCallback, StopOnReturn, best_checkpoint_path
from fastrl.run.checkpoint import list_checkpoints
from fastrl_match_env import N_TARGETS, MatchTarget, make_match_target

TESTS_DIR = Path(__file__).resolve().parent
REPO = TESTS_DIR.parent
QUIET = dict(progress=False, wandb="disabled", tensorboard=False, plot=False)
# MatchTarget in about 2 s: 8 iterations of 4 envs x 64 steps; every seed tried reaches the maximum, 8.
MATCH_BUDGET = dict(total_steps=2048, n_envs=4, n_steps=64, n_epochs=10, n_minibatches=1, lr=1e-3, clip_vloss=True,
                    eval_episodes=10, eval_seeds=1)


def subprocess_env(**extra) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", **extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH", "")) if p)
    return env


def run_python(code: str, cwd, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=subprocess_env(),
                          capture_output=True, text=True, timeout=timeout)


def random_policy_return(episodes: int = 200) -> float:
    env, rng, total = MatchTarget(), np.random.default_rng(0), 0.0
    for k in range(episodes):
        env.reset(seed=k)
        done = False
        while not done:
            _, reward, done, _, _ = env.step(int(rng.integers(N_TARGETS)))
            total += reward
    return total / episodes


# --------------------------------------------------------------------------- the name fastrl.train
def test_import_is_light_and_fastrl_train_is_the_function_before_and_after_its_module(tmp_path):
    """``fastrl.train`` is the API's function before and after ``import fastrl.train`` (the command's module of that
    name), as ``fastrl.evaluate`` is after ``import fastrl.run.evaluate``; ``from fastrl.train import main`` still
    reaches the command."""
    check = """
        import sys
        import fastrl
        assert "torch" not in sys.modules, "import fastrl must not import torch"
        from fastrl.config import UserError

        def refusal(train):
            try:
                train(env="NoSuchEnv-v0", run_dir="r")
            except UserError as e:
                return str(e)
            raise AssertionError("no UserError")

        {body}
        import fastrl.api, fastrl.run.evaluate
        assert fastrl.train is fastrl.api.train and fastrl.evaluate is fastrl.api.evaluate, (fastrl.train, fastrl.evaluate)
        assert sys.modules["fastrl.train"].main is main and callable(main)
        assert len(set(messages)) == 1 and "NoSuchEnv-v0" in messages[0] and "\\n" not in messages[0], messages
        print("ok")
    """
    function_first = """
        messages = [refusal(fastrl.train)]
        import fastrl.train
        from fastrl.train import main
        messages += [refusal(fastrl.train)]
    """
    module_first = """
        import fastrl.train
        from fastrl.train import main
        from fastrl import train
        messages = [refusal(fastrl.train), refusal(train)]
    """
    for body in (function_first, module_first):
        code = textwrap.dedent(check).replace("{body}", textwrap.dedent(body).strip())
        out = run_python(code, tmp_path)
        assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


# --------------------------------------------------------------------------- the under-10-lines script
def test_train_load_predict_evaluate_in_under_ten_lines(tmp_path):
    """What a user types, run from a directory outside the repository."""
    assert REPO not in tmp_path.parents
    script = """\
import fastrl, json, numpy as np
run = fastrl.train(env="CartPole-v1", total_steps=2048, eval_episodes=2, eval_seeds=1, progress=False, wandb="disabled")
agent = fastrl.load(run.run_dir)
action = agent.act(np.zeros(4))
returns = agent.evaluate(episodes=2)
print(json.dumps({"run_dir": str(run.run_dir), "steps": run.summary["total_steps"], "action": action.tolist(),
                  "action_type": type(action).__name__, "dtype": str(action.dtype), "returns": returns.tolist()}))
"""
    assert len(script.splitlines()) < 10
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=subprocess_env(), capture_output=True,
                         text=True, timeout=170)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    run_dir = tmp_path / result["run_dir"]
    assert run_dir.parent == tmp_path / "runs" and run_dir.name.startswith("CartPole-v1__ppo__1__")
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "tb"):
        assert (run_dir / name).exists(), name
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["ckpt_000000002048.pt"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert result["steps"] == 2048 and summary["total_steps"] == 2048
    assert result["action_type"] == "ndarray" and result["dtype"] == "int64" and result["action"] in (0, 1)
    # the loaded agent replays the run's final evaluation (2 episodes, 1 seed): the same whole-episode returns
    returns = result["returns"]
    assert len(returns) == 2 and all(r == int(r) for r in returns), returns
    assert sum(returns) / 2 == pytest.approx(summary["eval_return_mean"]), (returns, summary["eval_return_mean"])


# --------------------------------------------------------------------------- custom environments
def _learned_return(env, seed: int, tmp_path: Path) -> float:
    run = fastrl.train(env=env, seed=seed, run_dir=str(tmp_path / f"seed{seed}"), **MATCH_BUDGET, **QUIET)
    return run.summary["eval_return_mean"]


@pytest.mark.learning
@pytest.mark.parametrize("kind", ["class", "factory"])
def test_learns_a_custom_env_given_as_a_class_or_a_factory(kind, tmp_path):
    """A gymnasium.Env subclass (importable: named module:QualName) and a lambda (named in this process only)."""
    env = MatchTarget if kind == "class" else (lambda: MatchTarget())
    random_return = random_policy_return()
    assert random_return < 2.5  # 8 steps x 1/4
    median, values = median_of_seeds(lambda seed: _learned_return(env, seed, tmp_path))
    assert median >= 7.0, f"MatchTarget eval return by seed {values}; a random policy scores {random_return:.2f}"
    summary = json.loads((tmp_path / "seed1" / "summary.json").read_text())
    if kind == "class":
        assert summary["env"] == "fastrl_match_env:MatchTarget"
    else:
        assert summary["env"].startswith("test_api:") and "<lambda>" in summary["env"]
    agent = fastrl.load(tmp_path / "seed1", env=env)  # a saved module:Name env is rebuilt only when passed
    assert agent.act(np.eye(N_TARGETS)).shape == (N_TARGETS,)
    # the loaded agent replays the run's final evaluation (10 episodes, 1 seed) exactly
    assert agent.evaluate(episodes=10).mean() == pytest.approx(summary["eval_return_mean"]), summary


def test_cli_trains_a_module_id_env(tmp_path):
    """``--env module:Id`` imports the module (which registers the id with Gymnasium) before looking the id up."""
    run_dir = tmp_path / "cli"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in {**MATCH_BUDGET, **QUIET}.items()]
    out = subprocess.run([sys.executable, "-m", "fastrl.train", "--env", "fastrl_match_env:MatchTarget-v0",
                          "--run-dir", str(run_dir), *flags], cwd=tmp_path, env=subprocess_env(), capture_output=True,
                         text=True, timeout=170)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env"] == "fastrl_match_env:MatchTarget-v0" and summary["total_steps"] == 2048
    agent = fastrl.load(run_dir, env="fastrl_match_env:MatchTarget-v0")
    assert agent.observation_shape == (N_TARGETS,) and agent.action_spec.n == N_TARGETS
    # learning is judged on the median of seeds above; here the loaded agent replays the run's final evaluation
    returns = agent.evaluate(episodes=10)
    assert returns.shape == (10,) and returns.mean() == pytest.approx(summary["eval_return_mean"]), summary


def test_impala_actors_rebuild_a_custom_env_by_name(tmp_path):
    """IMPALA's actors are fresh (spawned, daemonic) processes: they import the env class by its module:QualName name
    and step a Gymnasium env in-process (a daemonic process may not start env workers)."""
    run = fastrl.train(env=MatchTarget, algo="impala", total_steps=512, n_envs=8, n_steps=16, eval_episodes=2,
                       eval_seeds=1, run_dir=str(tmp_path / "impala"), **QUIET)
    assert run.summary["env"] == "fastrl_match_env:MatchTarget" and run.summary["total_steps"] >= 512
    returns = run.agent.evaluate(episodes=2)  # the run's final evaluation, replayed by the agent it returned
    assert returns.mean() == pytest.approx(run.summary["eval_return_mean"]) and all(r == int(r) for r in returns)


def test_impala_from_a_script_without_a_main_guard_is_one_line(tmp_path):
    """A real script that calls fastrl.train(algo="impala") at import: each spawned actor re-imports it and would start
    a run of its own; instead the actor exits at once and the run raises one line saying to add the guard. With the
    guard, the same script trains."""
    body = """
        import fastrl
        {indent}run = fastrl.train(env="CartPole-v1", algo="impala", total_steps=512, n_actors=1, n_slots=2, n_envs=4,
        {indent}                   n_steps=16, eval_episodes=0, run_dir="run", progress=False, wandb="disabled",
        {indent}                   tensorboard=False, plot=False)
        {indent}print("trained", run.summary["total_steps"])
    """
    script = tmp_path / "no_guard.py"
    script.write_text(textwrap.dedent(body.format(indent="")))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=subprocess_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "trained" not in proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("fastrl.config.UserError: ") and 'put the call under if __name__ == "__main__":' in last
    guarded = textwrap.dedent(body.format(indent="    ")).replace("import fastrl\n", "import fastrl\nif __name__ == \"__main__\":\n", 1)
    (tmp_path / "guarded").mkdir()
    (tmp_path / "guarded" / "guarded.py").write_text(guarded)
    proc = subprocess.run([sys.executable, "guarded.py"], cwd=tmp_path / "guarded", env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "trained" in proc.stdout, proc.stderr[-2000:]


def test_env_names_and_the_factory_registry():
    from fastrl.envs import registry as envs
    assert envs.env_name("CartPole-v1") == "CartPole-v1"
    assert envs.env_name(MatchTarget) == "fastrl_match_env:MatchTarget"
    assert envs.env_name(make_match_target) == "fastrl_match_env:make_match_target"
    assert not envs.is_process_local("fastrl_match_env:MatchTarget")
    first, second = (lambda: MatchTarget()), (lambda: MatchTarget())
    name1, name2 = envs.env_name(first), envs.env_name(second)
    assert name1 != name2 and envs.env_name(first) == name1 and envs.is_process_local(name1)
    assert envs.resolve_env(name2) == (name2, second)
    assert envs.resolve_env("fastrl_match_env:MatchTarget-v0") == ("MatchTarget-v0", None)
    assert envs.resolve_env("fastrl_match_env:make_match_target")[1] is make_match_target
    assert envs.resolve_backend("fastrl_match_env:MatchTarget") == "gymnasium"


def test_an_id_registered_after_the_first_lookup_is_found():
    import gymnasium

    from fastrl.config import make_config
    from fastrl.envs import registry as envs
    from fastrl.run import preflight
    assert envs.resolve_backend("CartPole-v1") == "envpool"  # a first lookup
    with pytest.raises(UserError):
        envs.resolve_backend("FastrlLate-v0")
    gymnasium.register("FastrlLate-v0", entry_point=MatchTarget)
    try:
        assert envs.resolve_backend("FastrlLate-v0") == "gymnasium"
        shape, _, spec = preflight.probe_env(make_config({"env": "FastrlLate-v0"}))
        assert shape == (N_TARGETS,) and spec.n == N_TARGETS
    finally:
        del gymnasium.registry["FastrlLate-v0"]


def test_env_probe_follows_a_redefined_factory():
    """The preflight probe is cached per env name; a name given to another object is probed afresh."""
    import gymnasium

    from fastrl.config import make_config
    from fastrl.envs import registry as envs
    from fastrl.run import preflight

    class Wider(MatchTarget):
        observation_space = gymnasium.spaces.Box(0.0, 1.0, (N_TARGETS + 3,), np.float32)

        def _observation(self):
            return np.zeros(N_TARGETS + 3, np.float32)

    cfg = make_config({"env": "fastrl-test-redefined"})
    envs.register_env_factory("fastrl-test-redefined", MatchTarget)
    assert preflight.probe_env(cfg)[0] == (N_TARGETS,)
    envs.register_env_factory("fastrl-test-redefined", Wider)
    assert preflight.probe_env(cfg)[0] == (N_TARGETS + 3,)


@pytest.mark.parametrize("env, overrides, needle", [
    (MatchTarget(), {}, "instance"),
    (42, {}, "zero-argument factory"),
    ("fastrl_no_such_module:Env-v0", {}, "fastrl_no_such_module"),
    ("fastrl_match_env:NoSuchThing", {}, "NoSuchThing"),
    (lambda: MatchTarget(), {"algo": "impala"}, "top level of a module"),
    (MatchTarget, {"env_backend": "envpool"}, "EnvPool cannot run"),
])
def test_bad_envs_are_one_line_errors(env, overrides, needle, tmp_path):
    message = one_line_error(fastrl.train, env=env, run_dir=str(tmp_path / "r"), **overrides, **QUIET)
    assert needle in message
    assert not (tmp_path / "r").exists()  # refused before any work


# --------------------------------------------------------------------------- load and predict
@pytest.fixture(scope="module")
def cartpole_agent(tmp_path_factory):
    """CartPole with observation normalization: 4 iterations of 2 envs x 16 steps."""
    run_dir = tmp_path_factory.mktemp("api") / "cartpole"
    run = fastrl.train(env="CartPole-v1", total_steps=128, n_envs=2, n_steps=16, normalize_obs=True, eval_episodes=0,
                       run_dir=str(run_dir), **QUIET)
    return run.agent


def test_predict_one_observation_or_a_batch_numpy_or_torch(cartpole_agent):
    agent = cartpole_agent
    assert agent.observation_shape == (4,)
    one = agent.act(np.array([0.01, -0.02, 0.03, 0.04]))  # float64 in
    assert isinstance(one, np.ndarray) and one.shape == () and one.dtype == np.int64 and int(one) in (0, 1)
    batch = agent.act(np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32))
    assert isinstance(batch, np.ndarray) and batch.shape == (5,) and set(batch.tolist()) <= {0, 1}
    assert agent.act([0.0, 0.0, 0.0, 0.0]).shape == ()  # a list
    assert agent.act(np.zeros((3, 4), dtype=np.int32)).shape == (3,)  # any numeric dtype
    tensor_one = agent.act(torch.zeros(4, dtype=torch.float64))
    assert torch.is_tensor(tensor_one) and tensor_one.shape == () and tensor_one.dtype == torch.int64
    tensor_batch = agent.act(torch.zeros(6, 4, dtype=torch.float16))
    assert torch.is_tensor(tensor_batch) and tensor_batch.shape == (6,)
    sampled = agent.act(np.zeros((64, 4)), deterministic=False)
    assert sampled.shape == (64,) and set(sampled.tolist()) <= {0, 1}


def test_predict_applies_the_saved_observation_normalizer(cartpole_agent):
    agent = cartpole_agent
    from fastrl.run.checkpoint import load_checkpoint
    obs_rms = load_checkpoint(agent.path)["normalizer"]["obs_rms"]
    assert obs_rms["count"] > 1 and obs_rms["mean"].abs().sum() > 0  # statistics were gathered in training
    obs = torch.tensor(np.random.default_rng(1).normal(size=(256, 4)) * [1.0, 2.0, 0.2, 2.0], dtype=torch.float32)
    normalized = ((obs.double() - obs_rms["mean"]) / torch.sqrt(obs_rms["var"] + 1e-8)).clamp(-10, 10).float()
    expected = agent.policy.act_deterministic(normalized)
    assert torch.equal(agent.act(obs), expected)


@pytest.mark.parametrize("bad_shape", [(3,), (2, 3), (2, 2, 4), ()])
def test_predict_refuses_a_wrong_observation_shape(cartpole_agent, bad_shape):
    message = one_line_error(cartpole_agent.predict, np.zeros(bad_shape))
    assert str(bad_shape) in message and "(4,)" in message


def test_predict_continuous_actions_stay_in_bounds(tmp_path):
    run = fastrl.train(env="Pendulum-v1", total_steps=64, n_envs=2, n_steps=16, eval_episodes=0, init_log_std=2.0,
                       run_dir=str(tmp_path / "pendulum"), **QUIET)
    agent = run.agent
    one = agent.act(np.array([1.0, 0.0, 0.5]))
    assert one.shape == (1,) and one.dtype == np.float32
    wild = agent.act(np.full((8, 3), 1e3), deterministic=False)
    assert wild.shape == (8, 1) and np.all(np.abs(wild) <= 2.0)
    returns = agent.evaluate(episodes=2)
    assert returns.shape == (2,) and returns.dtype == np.float64
    assert np.array_equal(agent.evaluate(episodes=2), returns), "seeded evaluation envs: the same returns again"


def test_config_dict_and_resume_from_python(tmp_path):
    """``config`` as a dict under keyword overrides; ``resume=`` continues a run as ``--resume`` does."""
    run_dir = tmp_path / "resumed"
    first = fastrl.train(config={"env": "CartPole-v1", "n_envs": 2, "n_steps": 16, "total_steps": 999}, total_steps=64,
                         eval_episodes=0, run_dir=str(run_dir), **QUIET)
    assert first.summary["total_steps"] == 64 and first.summary["env"] == "CartPole-v1"
    second = fastrl.train(resume=run_dir, total_steps=128, **QUIET)  # a Path, as Run.run_dir is
    assert second.run_dir == run_dir and second.summary["resumed_from_step"] == 64
    assert second.summary["total_steps"] == 128 and second.agent.path.name == "ckpt_000000000128.pt"
    assert "did you mean" in one_line_error(fastrl.train, env="CartPole-v1", total_step=10)
    assert one_line_error(fastrl.train, learning_rate=1e-3).endswith("did you mean lr?")
    assert one_line_error(fastrl.train, n_timesteps=10).endswith("did you mean total_steps?")


def test_predict_returns_what_stable_baselines3_returns(cartpole_agent):
    """``action, _ = agent.predict(obs)`` unpacks the same for one observation and a batch of two (a bare array of
    two actions would silently unpack into action[0], action[1])."""
    agent = cartpole_agent
    batch = np.random.default_rng(2).normal(size=(2, 4)).astype(np.float32)
    action, state = agent.predict(batch)
    assert state is None and np.array_equal(action, agent.act(batch)) and action.shape == (2,)
    action, state = agent.predict(batch[0], state=None, episode_start=np.ones(1, dtype=bool), deterministic=True)
    assert state is None and action.shape == () and action == agent.act(batch[0])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_act_refuses_non_finite_observations_unless_asked(cartpole_agent, bad):
    obs = np.zeros((3, 4), dtype=np.float32)
    obs[1, 2] = bad
    assert "NaN or Inf" in one_line_error(cartpole_agent.act, obs)
    assert "check_finite=False" in one_line_error(cartpole_agent.predict, torch.from_numpy(obs))
    assert cartpole_agent.act(obs, check_finite=False).shape == (3,)


def test_save_to_one_file_load_it_and_train_it_further(tmp_path, cartpole_agent):
    """``Agent.save`` writes one self-contained file that ``fastrl.load`` reads anywhere (no run directory beside it);
    ``learn(steps)`` continues it, step count and optimizer included, in a new run directory."""
    agent = cartpole_agent
    saved = agent.save(tmp_path / "elsewhere" / "agent.pt")
    assert [p.name for p in saved.parent.iterdir()] == ["agent.pt"]
    loaded = fastrl.load(str(saved))
    obs = np.random.default_rng(3).normal(size=(16, 4))
    assert np.array_equal(loaded.act(obs), agent.act(obs)) and loaded.global_step == agent.global_step == 128
    for a, b in zip(loaded.policy.parameters(), agent.policy.parameters()):
        assert torch.equal(a, b)
    before = [p.detach().clone() for p in loaded.policy.parameters()]
    run = loaded.learn(64, run_dir=tmp_path / "more", **QUIET, eval_episodes=0)
    assert run.run_dir == tmp_path / "more" and run.summary["resumed_from_step"] == 128
    assert run.summary["total_steps"] == 192 and loaded.global_step == 192
    assert any(not torch.equal(a, b) for a, b in zip(before, loaded.policy.parameters())), "it trained"
    trained = fastrl.load(run.run_dir)  # act runs the new weights and the new observation statistics
    assert torch.equal(loaded.raw_policy.mean, trained.raw_policy.mean) and np.array_equal(loaded.act(obs), trained.act(obs))
    assert loaded.path == run.run_dir / "checkpoints" / "ckpt_000000000192.pt"
    assert "already holds a run" in one_line_error(loaded.learn, 64, run_dir=tmp_path / "more")
    assert "positive int" in one_line_error(loaded.learn, 0)


def test_load_errors_are_one_line(tmp_path, cartpole_agent):
    assert "not found" in one_line_error(fastrl.load, tmp_path / "missing")
    assert "best checkpoint" in one_line_error(fastrl.load, cartpole_agent.path.parent.parent, best=True)
    assert "positive" in one_line_error(cartpole_agent.evaluate, episodes=0)
    assert "same spaces" in one_line_error(cartpole_agent.evaluate, env=MatchTarget, episodes=1)


# --------------------------------------------------------------------------- callbacks
def test_callbacks_see_every_iteration_and_stop_the_run_cleanly(tmp_path):
    """EvalCallback keeps best.pt beside keep-last-1 checkpoints; a False stops the run like the end of its budget."""
    seen = []

    def record(metrics, run):
        seen.append((run.iteration, run.global_step, run.run_dir, dict(metrics)))

    evaluation = EvalCallback(every_iterations=2, episodes=2, seeds=1)

    def stop_at_6(metrics, run):
        return run.iteration < 6

    run = fastrl.train(env="CartPole-v1", total_steps=640, n_envs=2, n_steps=16, eval_episodes=2, eval_seeds=1,
                       checkpoint_interval=1, keep_checkpoints=1, run_dir=str(tmp_path / "cb"),
                       callbacks=[evaluation, stop_at_6, record], **QUIET)
    assert run.summary["stopped_by_callback"] is True and run.summary["stopped_by_signal"] is False
    assert run.summary["iterations"] == 6 and run.summary["total_steps"] == 6 * 32
    assert run.summary["eval_return_mean"] is not None  # the final evaluation still ran
    assert json.loads((run.run_dir / "summary.json").read_text())["stopped_by_callback"] is True
    assert [(i, step) for i, step, _, _ in seen] == [(i, 32 * i) for i in range(1, 7)]
    assert all(run_dir == run.run_dir for _, _, run_dir, _ in seen)
    for _, _, _, metrics in seen:
        assert any(k.startswith("losses/") for k in metrics), metrics
        assert all(isinstance(v, (int, float, bool)) for v in metrics.values()), metrics
    assert [i for i, _, _, m in seen if "eval/return_mean" in m] == [2, 4, 6]  # added by the earlier callback
    assert [step for step, _, _ in evaluation.results] == [64, 128, 192]
    checkpoints = run.run_dir / "checkpoints"
    assert [p.name for p in list_checkpoints(checkpoints)] == ["ckpt_000000000192.pt"]  # keep 1: best.pt survives
    assert best_checkpoint_path(run.run_dir).is_file()
    assert fastrl.load(run.run_dir).path.name == "ckpt_000000000192.pt"
    best = fastrl.load(run.run_dir, best=True)
    assert best.path.name == "best.pt" and best.evaluate(episodes=1).shape == (1,)
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = [(r["global_step"], r["eval/best_return_mean"]) for r in rows if "eval/best_return_mean" in r]
    assert [step for step, _ in logged] == [64, 128, 192]
    assert max(best for _, best in logged) == evaluation.best_return


def test_eval_callback_schedule_in_env_steps():
    evaluation = EvalCallback(every_steps=100, episodes=1)
    fake = types.SimpleNamespace(start_step=0, global_step=0, iteration=0)
    due = []
    for step in range(32, 400, 32):
        fake.global_step = step
        if evaluation._due(fake):
            due.append(step)
    assert due == [128, 224, 320]
    resumed = EvalCallback(every_steps=100, episodes=1)
    fake = types.SimpleNamespace(start_step=250, global_step=282, iteration=0)
    assert not resumed._due(fake)
    fake.global_step = 314
    assert resumed._due(fake)


def test_stop_on_return_and_bad_callbacks(tmp_path):
    stop = StopOnReturn(100.0)
    assert stop({}, None) and stop({"charts/episodic_return": 99.0}, None)
    assert stop({"charts/episodic_return": 100.0}, None) is False
    assert "not callable" in one_line_error(fastrl.train, env="CartPole-v1", callbacks=[1], run_dir=str(tmp_path))
    assert "every_steps" in one_line_error(EvalCallback, every_steps=0)
    assert math.isinf(EvalCallback().best_return)


def test_a_time_feature_agent_acts_on_observations_with_the_feature_and_names_it_when_missing(tmp_path):
    run = fastrl.train(env="Pendulum-v1", time_feature=True, total_steps=64, n_envs=2, n_steps=16, eval_episodes=1,
                       run_dir=str(tmp_path / "pendulum"), **QUIET)
    agent = fastrl.load(run.agent.path)
    assert agent.config.time_feature is True and agent.observation_shape == (4,)
    assert agent.act(np.array([1.0, 0.0, 0.0, 0.5])).shape == (1,)
    with pytest.raises(UserError, match=r"lacks the time feature .*append 1 - t / max_episode_steps"):
        agent.act(np.array([1.0, 0.0, 0.0]))
    assert np.isfinite(agent.evaluate(episodes=1)).all()  # its evaluation envs carry the feature too
