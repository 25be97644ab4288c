"""Env faults keep the run: a hung step or reset, a worker that dies, and SIGINT/SIGTERM/SIGHUP while an env hangs all
end with the last completed iteration checkpointed, summary.json saying what happened, one line on stderr, the
README's exit code, and no worker process left. Real processes and signals, a short env_timeout_s."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastrl.envs.env_workers import worker_count
from fastrl.run.checkpoint import list_checkpoints, load_checkpoint
from conftest import descendant_pids

TESTS_DIR = Path(__file__).parent
QUIET = ["--wandb", "disabled", "--tensorboard", "false", "--progress", "false", "--plot", "false", "--quiet", "true"]
SMALL = ["--n-steps", "32", "--n-epochs", "1", "--torch-threads", "1", "--device", "cpu", "--eval-episodes", "2",
         "--total-steps", "100000", "--checkpoint-interval", "1", *QUIET]


def _env(**extra) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "FASTRL_FAIL_AT_STEP": "100",
            "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), str(TESTS_DIR.parent), os.environ.get("PYTHONPATH", "")]),
            **extra}


def _start(env_name: str, n_envs: int, run_dir: Path, *args, **extra):
    return subprocess.Popen([sys.executable, "-m", "fastrl.train", "--env", f"fastrl_fault_envs:{env_name}",
                             "--n-envs", str(n_envs), "--run-dir", str(run_dir), *SMALL, *args], cwd=run_dir.parent,
                            env=_env(**extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group, as a shell gives a command


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_for(predicate, timeout: float = 120.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _fastrl_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("fastrl:")]


def _assert_saved(run_dir: Path) -> dict:
    """The run's summary; its last completed iteration is checkpointed."""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["total_steps"] > 0
    assert load_checkpoint(run_dir)["global_step"] == summary["total_steps"]
    return summary


def _wait_for_workers(proc, n_envs: int) -> set[int]:
    """The run's worker processes (none with one env: it steps in the run's process), once started."""
    if n_envs > 1:
        workers = worker_count(n_envs)
        assert _wait_for(lambda: len(descendant_pids(proc.pid)) >= workers), proc.communicate(timeout=30)[1][-3000:]
    return descendant_pids(proc.pid)


@pytest.mark.parametrize("n_envs", [1, 2])
def test_hung_step_is_an_env_error_after_env_timeout_s(tmp_path, n_envs):
    run_dir = tmp_path / "run"
    proc = _start("HangingEnv", n_envs, run_dir, "--env-timeout-s", "1")
    workers = _wait_for_workers(proc, n_envs)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-3000:]
    lines = _fastrl_lines(err)
    assert len(lines) == 1 and "within 1 s (env_timeout_s)" in lines[0], err[-3000:]
    assert ("0 (PID" if n_envs > 1 else "step() did not return") in lines[0], lines
    assert "Traceback" not in err
    assert "within 1 s" in _assert_saved(run_dir)["stopped_by_error"]
    assert not any(_alive(pid) for pid in workers)


def test_hung_reset_is_one_line_and_leaves_no_worker(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start("HangingResetEnv", 2, run_dir, "--env-timeout-s", "1")
    workers = _wait_for_workers(proc, 2)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-3000:]
    lines = _fastrl_lines(err)
    assert len(lines) == 1 and "did not answer reset() within 1 s" in lines[0] and "Traceback" not in err, err
    assert not any(_alive(pid) for pid in workers)


@pytest.mark.parametrize("how", ["os._exit", "SystemExit"])
def test_a_worker_that_dies_is_an_env_error(tmp_path, how):
    run_dir = tmp_path / "run"
    proc = _start("ExitingEnv", 2, run_dir, FASTRL_EXIT_HOW=how)
    workers = _wait_for_workers(proc, 2)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-3000:]
    lines = _fastrl_lines(err)
    assert len(lines) == 1 and "during step(), worker " in lines[0], err
    assert f"of {worker_count(2)} (PID" in lines[0] and "exited with code 3" in lines[0], err
    assert "EOFError" not in err and "Traceback" not in err, err
    assert "exited with code 3" in _assert_saved(run_dir)["stopped_by_error"]
    assert not any(_alive(pid) for pid in workers)


def test_system_exit_in_an_in_process_env_is_an_env_error(tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "fastrl.train", "--env", "fastrl_fault_envs:ExitingEnv", "--n-envs",
                           "1", "--run-dir", str(run_dir), *SMALL], cwd=tmp_path, capture_output=True, text=True,
                          env=_env(FASTRL_EXIT_HOW="SystemExit"), timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = _fastrl_lines(done.stderr)
    assert len(lines) == 1 and "raised SystemExit in step(): 3" in lines[0], done.stderr
    assert "SystemExit" in _assert_saved(run_dir)["stopped_by_error"]


# n_envs 1: the hung step runs in the run's own process; "group": the signal goes to the whole process group (Ctrl-C
# in a terminal, a closed terminal's SIGHUP), the workers included.
@pytest.mark.parametrize("n_envs, signum, to_group", [(1, signal.SIGTERM, False), (1, signal.SIGINT, False),
                                                      (2, signal.SIGTERM, False), (2, signal.SIGINT, True),
                                                      (2, signal.SIGHUP, True), (2, signal.SIGTERM, True)])
def test_a_stop_signal_ends_a_hung_step(tmp_path, n_envs, signum, to_group):
    run_dir = tmp_path / "run"
    proc = _start("HangingEnv", n_envs, run_dir, "--env-timeout-s", "600")
    workers = _wait_for_workers(proc, n_envs)
    # Iterations 1-3 complete (checkpointed each), the fourth hangs at env step 100.
    assert _wait_for(lambda: len(list_checkpoints(run_dir / "checkpoints")) >= 3), proc.communicate(timeout=30)[1]
    time.sleep(0.5)
    (os.killpg if to_group else os.kill)(proc.pid, signum)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == (130 if signum == signal.SIGINT else 0), err[-3000:]
    lines = _fastrl_lines(err)
    assert len(lines) == 1 and "is saved; continue it with --resume" in lines[0], err
    summary = _assert_saved(run_dir)
    assert summary["stop_signal"] == signal.Signals(signum).name and summary["stopped_by_signal"] is True
    assert summary["iterations"] == 3 and summary["eval_return_mean"] is None
    assert _wait_for(lambda: not any(_alive(pid) for pid in workers), timeout=5)


def test_sigterm_during_start_up_exits_143_with_one_line(tmp_path):
    """The envs' first reset hangs (start-up): SIGTERM ends it at once, and the workers with it."""
    run_dir = tmp_path / "run"
    proc = _start("HangingResetEnv", 2, run_dir, "--env-timeout-s", "600")
    workers = _wait_for_workers(proc, 2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err[-3000:]
    assert _fastrl_lines(err) == ["fastrl: stopped by SIGTERM during start-up; nothing was saved"], err
    assert "Traceback" not in err
    assert _wait_for(lambda: not any(_alive(pid) for pid in workers), timeout=5)


def test_workers_die_with_a_killed_run(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start("HangingEnv", 2, run_dir, "--env-timeout-s", "600")
    workers = _wait_for_workers(proc, 2)
    proc.kill()
    proc.communicate(timeout=30)
    assert _wait_for(lambda: not any(_alive(pid) for pid in workers), timeout=5)


def test_impala_actors_that_fail_the_same_way_end_the_run_like_an_env_error(tmp_path):
    """The actor's env raises on each incarnation: two restarts (backing off), then the third identical failure ends
    the run with the env's traceback once, one line, a checkpoint and summary.json."""
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "fastrl.train", "--algo", "impala", "--env",
                           "fastrl_fault_envs:FailingEnv", "--n-actors", "1", "--n-slots", "2", "--n-envs", "4",
                           "--n-steps", "16", "--learner-batch", "1", "--total-steps", "100000", "--eval-episodes", "0",
                           "--run-dir", str(run_dir), *QUIET], cwd=tmp_path, env=_env(FASTRL_FAIL_AT_STEP="40"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = _fastrl_lines(done.stderr)
    assert len(lines) == 1 and "actors failed the same way 3 times in a row" in lines[0], done.stderr[-3000:]
    assert "the simulator lost its connection" in lines[0] and done.stderr.count("Traceback") == 1, done.stderr
    summary = _assert_saved(run_dir)
    assert summary["actor_restarts"] == 2 and "the simulator lost its connection" in summary["stopped_by_error"]


def test_a_nan_observation_never_enters_the_normalizer(tmp_path):
    import torch
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "fastrl.train", "--env", "fastrl_fault_envs:NaNObservationEnv",
                           "--normalize-obs", "true", "--n-envs", "2", "--run-dir", str(run_dir), *SMALL],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = _fastrl_lines(done.stderr)
    assert len(lines) == 1 and "returned a non-finite observation (nan) from env " in lines[0], done.stderr
    assert "'fastrl_fault_envs:NaNObservationEnv'" in lines[0] and " at its step " in lines[0], lines
    assert "non-finite observation" in _assert_saved(run_dir)["stopped_by_error"]
    statistics = load_checkpoint(run_dir)["normalizer"]["obs_rms"]
    assert all(bool(torch.isfinite(statistics[key]).all()) for key in ("mean", "var", "count"))


def test_sigint_during_the_final_evaluation_exits_130(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "fastrl.train", "--env", "CartPole-v1", "--n-envs", "4", "--n-steps",
                             "32", "--total-steps", "128", "--eval-episodes", "20000", "--eval-seeds", "1", "--run-dir",
                             str(run_dir), "--torch-threads", "1", "--device", "cpu", *QUIET[:-2]], cwd=tmp_path,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # not quiet: the final evaluation announces itself
        if line.startswith("fastrl: final evaluation"):
            break
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert "fastrl: interrupted (Ctrl-C) at step 128" in err, err
    summary = _assert_saved(run_dir)
    assert summary["stop_signal"] == "SIGINT" and summary["eval_return_mean"] is None


def test_a_compile_cut_by_a_stop_signal_is_no_compile_failure(recwarn):
    """Ctrl-C to the process group stops inductor's compile workers too; the compile then fails, and that is an
    interruption: no "torch.compile failed" warning. Without a stop signal the same failure warns."""
    from fastrl.run.compile import CompiledOrEager
    from fastrl.signals import install_stop_handlers, restore_handlers

    def failing_compiled(x):
        raise RuntimeError("compile worker died")

    def cut(stop_first: bool) -> list:
        call = CompiledOrEager(lambda x: x + 1, "off", "the test function")
        call.fn, call.compiled, call._checked = failing_compiled, True, False  # as if torch.compile had wrapped it
        flag = {"stop": None}
        previous = install_stop_handlers(flag)
        try:
            if stop_first:
                os.kill(os.getpid(), signal.SIGINT)
                assert _wait_for(lambda: flag["stop"] == signal.SIGINT, timeout=5)
            recwarn.clear()
            assert call(1) == 2  # the eager function ran instead
        finally:
            restore_handlers(previous)
        return [str(w.message) for w in recwarn if "torch.compile failed" in str(w.message)]

    assert cut(stop_first=False), "a real compile failure must warn"
    assert cut(stop_first=True) == []


def test_an_endless_budget_plans_the_compile_of_a_long_run_not_of_an_endless_one():
    """total_steps: 1e30 ("until I stop it") must not unroll the whole update into one graph (about 45 s of compiling
    before the first step, and as long before a SIGTERM is heard): it plans as a 200k-gradient-step run does."""
    import torch
    from fastrl.run.compile import PLANNING_HORIZON_GRADIENT_STEPS, compile_plan
    from fastrl.config import make_config
    cfg = make_config({"total_steps": 1e30})
    iterations = cfg.total_steps // (cfg.n_envs * cfg.n_steps)
    endless = compile_plan("auto", torch.device("cpu"), iterations * cfg.n_epochs * cfg.n_minibatches,
                           iterations * cfg.n_steps, n_epochs=cfg.n_epochs, n_minibatches=cfg.n_minibatches)
    long = compile_plan("auto", torch.device("cpu"), PLANNING_HORIZON_GRADIENT_STEPS, 10**9, n_epochs=cfg.n_epochs,
                        n_minibatches=cfg.n_minibatches)
    assert endless == long and endless.steps_per_call < cfg.n_epochs * cfg.n_minibatches, endless


def test_an_actors_env_error_round_trips_through_shared_memory():
    import torch
    from fastrl.envs.env_workers import (ERROR_BYTES, EnvCodeError, EnvError, EnvFault, read_env_error,
                                    write_env_error)
    buffer = torch.zeros(ERROR_BYTES, dtype=torch.uint8)
    assert read_env_error(buffer) is None
    raised = EnvError("m:Env", EnvCodeError("boom", "RuntimeError", "Traceback ...\n" + "x" * 10 * ERROR_BYTES), "step")
    write_env_error(buffer, raised)
    back = read_env_error(buffer)
    assert str(back) == str(raised) and back.trace.endswith("x" * 100) and len(back.trace) < ERROR_BYTES
    hung = EnvError("m:Env", EnvFault("step() did not return within 1 s (env_timeout_s)"), "step")
    write_env_error(buffer, hung)
    assert str(read_env_error(buffer)) == str(hung)


class _CountingDictEnv:
    """A Dict-observation env whose episodes end at seeded random lengths and whose info has a key on odd steps only
    (so the groups' infos must be joined key by key, with masks)."""

    def __new__(cls):
        import gymnasium
        import numpy as np

        class CountingDictEnv(gymnasium.Env):
            observation_space = gymnasium.spaces.Dict({"pos": gymnasium.spaces.Box(-9, 9, (2,), np.float32),
                                                       "count": gymnasium.spaces.Discrete(50)})
            action_space = gymnasium.spaces.Discrete(3)

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                self.t, self.length = 0, int(self.np_random.integers(3, 12))
                return self._obs(), {"started": True}

            def _obs(self):
                return {"pos": self.np_random.normal(size=2).astype(np.float32), "count": self.t}

            def step(self, action):
                self.t += 1
                info = {"odd": self.t * 10 + int(action)} if self.t % 2 else {}
                return self._obs(), float(action) - 1.0, self.t >= self.length, self.t == 7, info
        return CountingDictEnv()


def test_worker_groups_step_exactly_as_one_in_process_vector_env():
    """Five envs in worker groups (uneven on two cores and more) against Gymnasium's SyncVectorEnv, 200 seeded steps
    through auto-resets: the same observations (Dict keys), rewards, flags and infos (masks included)."""
    import gymnasium
    import numpy as np
    from fastrl.envs.env_workers import WorkerGroupsVectorEnv

    fns = [_CountingDictEnv] * 5
    grouped = WorkerGroupsVectorEnv(fns, 30.0, context="fork")
    single = gymnasium.vector.SyncVectorEnv(fns, autoreset_mode=gymnasium.vector.AutoresetMode.NEXT_STEP)
    try:
        assert len(grouped.processes) == worker_count(5) and sum(grouped.sizes) == 5
        assert grouped.single_observation_space == single.single_observation_space
        (obs_a, info_a), (obs_b, info_b) = grouped.reset(seed=list(range(5))), single.reset(seed=list(range(5)))
        assert grouped.get_attr("length") == single.get_attr("length")
        actions = np.random.default_rng(0).integers(0, 3, (200, 5))
        seen_odd = ends = 0
        for t in range(201):
            if t:
                *out_a, info_a = grouped.step(actions[t - 1])
                *out_b, info_b = single.step(actions[t - 1])
                for a, b in zip(out_a[1:], out_b[1:]):  # rewards, terminated, truncated
                    assert np.array_equal(a, b), t
                obs_a, obs_b = out_a[0], out_b[0]
                ends += int(out_b[2].sum())
            for key in ("pos", "count"):
                assert np.array_equal(obs_a[key], obs_b[key]), (t, key)
            assert info_a.keys() == info_b.keys(), t
            for key in info_b:
                assert np.array_equal(info_a[key], info_b[key]), (t, key)
            seen_odd += int("odd" in info_b and 0 < info_b["_odd"].sum() < 5)
        assert ends > 50 and seen_odd > 10, (ends, seen_odd)  # episodes ended, and groups disagreed on info keys
    finally:
        grouped.close()
        single.close()
    assert all(p.exitcode == 0 for p in grouped.processes)
