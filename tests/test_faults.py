"""Faults: stop signals and Ctrl-C at any moment, kill -9 during checkpoint writes, a real full disk (checkpoints,
metrics, sinks, a resume's rewind), the user's env raising or returning the wrong shape, leftovers of killed runs."""
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import fastrl.run.checkpoint
import fastrl.run.logger
import fastrl.run.storage
from fastrl.cli.train import main
from fastrl.run.checkpoint import list_checkpoints, load_checkpoint
from conftest import descendant_pids

QUIET = ["--wandb", "disabled", "--tensorboard", "false", "--progress", "false", "--plot", "false", "--quiet", "true"]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _start(args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "fastrl.train", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(predicate, timeout=180.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


# SIGINT's run compiles its update (the default for this budget), so inductor's compile workers are among the
# children that must end; SIGTERM's run is eager (one stop handler serves all three signals), skipping the compile.
@pytest.mark.parametrize("signum, compile_mode", [(signal.SIGTERM, "off"), (signal.SIGINT, "auto")])
def test_stop_signal_saves_flushes_and_exits_cleanly(tmp_path, signum, compile_mode):
    run_dir = tmp_path / "run"
    # wandb offline and TensorBoard on: their writers and wandb's service process must be closed too.
    proc = _start(["--total-steps", "100000000", "--run-dir", str(run_dir), "--wandb", "offline",
                   "--progress", "false", "--compile", compile_mode], tmp_path)
    metrics = run_dir / "metrics.jsonl"
    assert _wait_for(lambda: metrics.is_file() and len(metrics.read_text().splitlines()) >= 3), proc.stderr.read()
    children = descendant_pids(proc.pid)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)  # a hang guard: the signal must end the run, however busy the machine
    assert proc.returncode == (130 if signum == signal.SIGINT else 0), err[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by_signal"] is True
    state = load_checkpoint(run_dir)
    assert state["global_step"] == summary["total_steps"]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]  # every line is whole JSON
    assert rows[-1]["global_step"] <= summary["total_steps"]
    assert list((run_dir / "tb").iterdir()), "TensorBoard events were not flushed"
    assert _wait_for(lambda: not any(_alive(c) for c in children), timeout=10), "child processes were left behind"


def test_kill_9_during_checkpoint_writes_leaves_loadable_checkpoints(tmp_path):
    run_dir = tmp_path / "run"
    # A large network makes each checkpoint write long enough that kills land inside writes too. Eager: the budget
    # would have auto compile the update in each of the four processes, which checkpoints do not depend on.
    args = ["--total-steps", "100000000", "--n-envs", "8", "--n-steps", "8", "--n-epochs", "1", "--n-minibatches", "1",
            "--hidden-sizes", "1024", "1024", "--checkpoint-interval", "1", "--keep-checkpoints", "3",
            "--eval-episodes", "0", "--compile", "off", "--run-dir", str(run_dir), *QUIET]
    ckpts = run_dir / "checkpoints"
    for delay in (0.0, 0.13, 0.29):
        proc = _start(args if delay == 0.0 else [*args, "--resume", str(run_dir)], tmp_path)
        before = list_checkpoints(ckpts)
        progressed = _wait_for(lambda: len(set(list_checkpoints(ckpts)) - set(before)) >= 2)
        if not progressed:
            proc.kill()
            pytest.fail(f"no new checkpoints: {proc.communicate()[1][-2000:]}")
        time.sleep(delay)
        proc.kill()
        proc.wait(timeout=30)
        for path in list_checkpoints(ckpts):
            assert load_checkpoint(path)["global_step"] > 0
    # --resume continues from the newest checkpoint and finishes.
    newest = load_checkpoint(run_dir)["global_step"]
    target = newest + 2 * 8 * 8
    done = subprocess.run([sys.executable, "-m", "fastrl.train", *args, "--resume", str(run_dir), "--total-steps",
                           str(target)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((run_dir / "summary.json").read_text())["total_steps"] == target
    assert json.loads((run_dir / "summary.json").read_text())["resumed_from_step"] == newest


def test_disk_full_during_checkpoint_write(tmp_path, monkeypatch, capsys):
    real_open = open
    calls = {"n": 0}

    def failing_open(path, *args, **kwargs):  # the third checkpoint's write finds the disk full
        f = real_open(path, *args, **kwargs)
        if ".ckpt_" in str(path):
            calls["n"] += 1
            if calls["n"] >= 3:
                f.write(b"partial")
                f.close()
                raise OSError(errno.ENOSPC, "No space left on device")
        return f

    monkeypatch.setattr(fastrl.run.storage, "open", failing_open, raising=False)
    run_dir = tmp_path / "run"
    code = main(["--total-steps", "4096", "--n-envs", "8", "--n-steps", "32", "--checkpoint-interval", "2",
                 "--eval-episodes", "0", "--run-dir", str(run_dir), *QUIET])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "no space left on device" in err[0] and "free disk space" in err[0], err
    kept = list_checkpoints(run_dir / "checkpoints")
    assert len(kept) == 2 and all(load_checkpoint(p)["global_step"] > 0 for p in kept)
    assert not [p for p in (run_dir / "checkpoints").iterdir() if ".tmp" in p.name], "a partial file was left behind"
    assert not (run_dir / "summary.json").exists()


def test_disk_full_while_writing_metrics(tmp_path, monkeypatch, capsys):
    real_open = open

    class FullDisk:
        def __init__(self, f):
            self.f, self.lines = f, 0

        def write(self, text):
            self.lines += 1
            if self.lines > 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(text)

        def fileno(self):
            return self.f.fileno()

        def close(self):
            self.f.close()

    def patched_open(path, *a, **kw):
        f = real_open(path, *a, **kw)
        return FullDisk(f) if str(path).endswith("metrics.jsonl") else f

    monkeypatch.setattr(fastrl.run.logger, "open", patched_open, raising=False)
    run_dir = tmp_path / "run"
    code = main(["--total-steps", "4096", "--n-envs", "8", "--n-steps", "32", "--eval-episodes", "0",
                 "--run-dir", str(run_dir), *QUIET])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "metrics.jsonl" in err[0] and "free disk space" in err[0], err
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2  # what was written stays whole
    assert (run_dir / "config.yaml").is_file()


# --------------------------------------------------------------------------- the user's env fails
TESTS_DIR = Path(__file__).parent
FAULT_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
             "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])}
SMALL = ["--n-steps", "32", "--n-epochs", "2", "--torch-threads", "1", "--device", "cpu", "--eval-episodes", "2"]


def _fastrl_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("fastrl:")]


@pytest.mark.parametrize("n_envs", [1, 2])  # 1: the env steps in this process; 2: in Gymnasium's worker processes
def test_env_exception_keeps_the_run(tmp_path, n_envs):
    """An env whose step() raises stops the run as SIGTERM would: checkpoint of the last weights, summary.json with
    stopped_by_error; the console shows the env's own traceback, then one fastrl: error line naming the env."""
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "fastrl.train", "--env", "fastrl_fault_envs:FailingEnv", "--n-envs",
                           str(n_envs), "--total-steps", "100000", "--run-dir", str(run_dir), *SMALL, *QUIET],
                          cwd=tmp_path, env={**FAULT_ENV, "FASTRL_FAIL_AT_STEP": "150"}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = _fastrl_lines(done.stderr)
    assert len(lines) == 1 and lines[0].startswith("fastrl: error: env 'fastrl_fault_envs:FailingEnv' raised "
                                                   "RuntimeError in step(): the simulator lost its connection"), lines
    assert 'fastrl_fault_envs.py", line' in done.stderr and "fastrl/run/loop.py" not in done.stderr, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "the simulator lost its connection" in summary["stopped_by_error"]
    assert summary["total_steps"] > 0 and summary["eval_return_mean"] is None
    assert load_checkpoint(run_dir)["global_step"] == summary["total_steps"]


def test_wrong_observation_shape_names_env_and_shapes(tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "fastrl.train", "--env", "fastrl_fault_envs:WrongShapeEnv",
                           "--n-envs", "2", "--total-steps", "100000", "--run-dir", str(run_dir), *SMALL, *QUIET],
                          cwd=tmp_path, env=FAULT_ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = _fastrl_lines(done.stderr)
    assert len(lines) == 1 and "'fastrl_fault_envs:WrongShapeEnv'" in lines[0], lines
    assert "shape (3,)" in lines[0] and "shape (4,)" in lines[0] and "broadcast" not in done.stderr, lines
    assert "Traceback" not in done.stderr
    assert "shape (3,)" in json.loads((run_dir / "summary.json").read_text())["stopped_by_error"]


@pytest.mark.parametrize("factory, kind", [("make_none", "NoneType"), ("make_int", "int")])
def test_factory_returning_no_env_is_one_line(tmp_path, monkeypatch, capsys, factory, kind):
    monkeypatch.syspath_prepend(str(TESTS_DIR))
    code = main(["--env", f"fastrl_fault_envs:{factory}", "--total-steps", "128", "--run-dir", str(tmp_path / "r"),
                 *SMALL, *QUIET])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"its factory returned {kind}" in err[0], err


# --------------------------------------------------------------------------- a real full disk
@pytest.fixture
def small_disk(tmp_path):
    """A mounted tmpfs (needs root, as in CI's container); a helper fills it to the last ``keep`` bytes."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({made.stderr.strip() or 'mount failed'}); needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(mount: Path, keep: int) -> None:
    """Fill ``mount`` until ``keep`` bytes or fewer are free."""
    with open(mount / "filler", "ab") as f:
        while True:
            free = os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize
            if free <= keep:
                return
            try:
                f.write(b"\0" * min(free - keep, 1 << 16))
                f.flush()
            except OSError:
                return


def test_real_disk_full_during_checkpoint(small_disk, capsys):
    """torch.save on a full tmpfs raises RuntimeError: still one line naming the file and the space it needs, no
    partial file, every earlier checkpoint loads."""
    run_dir = small_disk / "run"
    code = main(["--total-steps", "100000", "--n-envs", "4", "--checkpoint-interval", "1", "--keep-checkpoints", "100",
                 "--run-dir", str(run_dir), *SMALL, *QUIET])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("fastrl: error: no space left on device for checkpoint ") and "needs about" in err[0], err
    kept = list_checkpoints(run_dir / "checkpoints")
    assert len(kept) >= 2 and all(load_checkpoint(p)["global_step"] > 0 for p in kept)
    assert not [p for p in (run_dir / "checkpoints").iterdir() if ".tmp" in p.name]


def test_real_disk_full_while_writing_metrics(small_disk, capsys):
    run_dir = small_disk / "run"
    run_dir.mkdir()
    # tmpfs pages of 4 KB: the lock file, config.yaml, the record of the run's files (and its rewrite's copy), a few rows
    _fill(small_disk, 24 * 1024)
    code = main(["--total-steps", "100000", "--n-envs", "4", "--run-dir", str(run_dir), *SMALL, *QUIET])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "metrics.jsonl" in err[0] and "needs about" in err[0], err
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]  # all whole
    assert rows and (run_dir / "metrics.jsonl").read_bytes().endswith(b"}\n")


def test_real_disk_full_with_wandb_and_tensorboard_is_one_error_line(small_disk):
    """On a full disk, wandb's own log files fail too (in the sink process): no logging tracebacks, no asyncio
    "socket.send() raised exception." flood; one error line and at most one warning per sink."""
    run_dir = small_disk / "run"
    run_dir.mkdir()
    _fill(small_disk, 16 * 1024)
    done = subprocess.run([sys.executable, "-m", "fastrl.train", "--total-steps", "100000", "--n-envs", "4", "--run-dir",
                           str(run_dir), *SMALL, *QUIET[:2], *QUIET[4:], "--wandb", "offline", "--tensorboard", "true"],
                          cwd=small_disk.parent, capture_output=True, text=True, timeout=300,
                          env={**FAULT_ENV, "PYTHONPATH": str(TESTS_DIR.parent)})
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("fastrl: error: no space left on device")]
    assert len(errors) == 1 and len(lines) <= 3, done.stderr[-3000:]
    assert all(line.startswith("fastrl: warning:") for line in lines if line not in errors), lines


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # a writer thread's traceback
def test_full_disk_switches_each_sink_off_with_one_warning(small_disk, tmp_path, capfd):
    """TensorBoard and wandb on a disk that fills up after they started: one warning per sink at most, no flood of
    logging errors, and metrics.jsonl (here on another file system) keeps every row."""
    from fastrl.run.logger import RunLogger
    run_dir = small_disk / "run"
    run_dir.mkdir()
    (tmp_path / "metrics.jsonl").touch()
    (run_dir / "metrics.jsonl").symlink_to(tmp_path / "metrics.jsonl")
    logger = RunLogger(run_dir, {"env": "x"}, 10_000, tensorboard=True, wandb_mode="offline", progress=False)
    for sink in logger.sinks:
        assert sink.ready.wait(120) and not sink.failed, sink.name
    _fill(small_disk, 0)
    for step in range(1, 2001):
        logger.log({"charts/episodic_return": float(step), "losses/value_loss": 1.0 / step}, step)
    logger.close()
    err = capfd.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("fastrl: warning:")]
    assert len(warnings) == len({w.split()[2] for w in warnings}) <= 2, warnings
    assert "Logging error" not in err and "Traceback" not in err, err[-3000:]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2000


def test_real_disk_full_during_resume_rewind(small_disk, capsys):
    run_dir = small_disk / "run"
    assert main(["--total-steps", "256", "--n-envs", "4", "--run-dir", str(run_dir), *SMALL, *QUIET]) == 0
    (run_dir / "summary.json").unlink()  # as if killed before the end, with rows past the checkpoint
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.writelines(json.dumps({"global_step": 256 + 128 * i, "x": 1.0}) + "\n" for i in range(1, 40))
    before = (run_dir / "metrics.jsonl").read_bytes()
    _fill(small_disk, 0)
    capsys.readouterr()
    assert main(["--resume", str(run_dir), "--total-steps", "512", *QUIET]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "metrics" in err[0] and "needs about" in err[0], err
    assert (run_dir / "metrics.jsonl").read_bytes() == before
    assert not [p for p in run_dir.iterdir() if ".tmp" in p.name]


# --------------------------------------------------------------------------- leftovers and resumed segments
def test_leftover_temp_files_are_removed_on_start_and_by_pruning(tmp_path):
    from fastrl.run.checkpoint import save_checkpoint
    run_dir = tmp_path / "run"
    assert main(["--total-steps", "256", "--n-envs", "4", "--checkpoint-interval", "1", "--run-dir", str(run_dir),
                 *SMALL, *QUIET]) == 0
    ckpts = run_dir / "checkpoints"
    stale = [ckpts / ".ckpt_000000000384.pt.tmp.999999", run_dir / "metrics.jsonl.tmp"]
    for path in stale:
        path.write_bytes(b"partial")
    assert main(["--resume", str(run_dir), "--total-steps", "384", *QUIET]) == 0
    assert not any(p.exists() for p in stale)
    stale[0].write_bytes(b"partial")
    save_checkpoint({"x": torch.zeros(1)}, ckpts / "ckpt_000000000512.pt", keep=2)
    assert not stale[0].exists() and len(list_checkpoints(ckpts)) == 2


def test_final_eval_is_logged_once_when_a_resume_finishes_the_run(tmp_path):
    """Killed between the final evaluation's row and summary.json: the resume finishes the run (no training left)
    and metrics.jsonl holds that evaluation once."""
    run_dir = tmp_path / "run"
    assert main(["--total-steps", "256", "--n-envs", "4", "--run-dir", str(run_dir), *SMALL, *QUIET]) == 0
    (run_dir / "summary.json").unlink()
    assert main(["--resume", str(run_dir), *QUIET]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in rows if "eval/return_mean" in r] == [256]
    assert json.loads((run_dir / "summary.json").read_text())["eval_return_mean"] is not None


def test_a_resumed_segment_marks_the_summary_running_until_it_ends(tmp_path):
    run_dir = tmp_path / "run"
    assert main(["--total-steps", "256", "--n-envs", "4", "--run-dir", str(run_dir), *SMALL, *QUIET]) == 0
    proc = _start(["--resume", str(run_dir), "--total-steps", "100000000", "--compile", "off", *QUIET], tmp_path)
    metrics = run_dir / "metrics.jsonl"
    assert _wait_for(lambda: json.loads(metrics.read_text().splitlines()[-1])["global_step"] > 512), proc.stderr.read()
    proc.kill()
    proc.wait(timeout=30)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["running"] is True and summary["resumed_from_step"] == 256
    assert summary["previous"]["total_steps"] == 256


# --------------------------------------------------------------------------- Ctrl-C at any moment
@pytest.mark.parametrize("delay", [0.3, 0.9, 1.6, 2.5, 4.0, 6.0])
def test_ctrl_c_at_any_moment_exits_130_with_one_line(tmp_path, delay):
    """SIGINT at several moments of `python -m fastrl.train` (imports, config, env probe, trainer build, training):
    exit 130, one line, never a traceback, never swallowed (the budget would take far longer than the timeout)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen([sys.executable, "-m", "fastrl.train", "--total-steps", "100000000", "--run-dir",
                             str(tmp_path / "run"), *QUIET], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    lines = [line for line in err.splitlines() if line.strip()]
    # 130, or ended by the SIGINT itself (-2 to Popen), which a shell reports as 130 too.
    assert proc.returncode in (130, -signal.SIGINT), err[-3000:]
    assert len(lines) == 1 and lines[0].startswith("fastrl: interrupted (Ctrl-C)"), err[-3000:]


def test_ctrl_c_inside_envpool_waits_for_envpool_to_return():
    """SIGINT while EnvPool's Python layer runs (over its C++ core; the env probe reading ``observation_space``
    aborted the process there): the start-up handler lets the call return, then raises."""
    script = textwrap.dedent("""
        import os, signal, sys, time
        from fastrl._startup import import_envpool
        from fastrl.signals import install_startup_interrupt
        envpool = import_envpool()
        env = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=1)
        inside = os.path.dirname(envpool.__file__)

        def trace(frame, event, arg):  # the signal comes as a frame of EnvPool's starts
            if event == "call" and frame.f_code.co_filename.startswith(inside):
                sys.settrace(None)
                os.kill(os.getpid(), signal.SIGINT)
            return None
        install_startup_interrupt()
        try:
            sys.settrace(trace)
            space = env.observation_space
            sys.settrace(None)
            print("returned", space.shape)
            time.sleep(5)
            print("swallowed")
        except KeyboardInterrupt:
            print("interrupted")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.split("\n")[:2] == ["returned (4,)", "interrupted"] and done.returncode == 0, (
        done.returncode, done.stdout, done.stderr[-2000:])


def test_ctrl_c_inside_an_import_waits_for_the_import_to_finish(tmp_path):
    """SIGINT while a module's body runs: the start-up handler lets the import finish (a C++ initializer under it,
    torch.distributed's ``_c10d_init``, would abort the process on the exception) and raises once it is out."""
    (tmp_path / "slow_module.py").write_text(textwrap.dedent("""
        import os, signal, time
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(20):  # the handler runs here, inside the import
            time.sleep(0.01)
        finished = True
    """))
    script = textwrap.dedent("""
        import sys, time
        from fastrl.signals import install_startup_interrupt
        install_startup_interrupt()
        try:
            import slow_module
            print("imported", slow_module.finished)
            time.sleep(5)
            print("swallowed")
        except KeyboardInterrupt:
            print("interrupted", "slow_module" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.stdout.split("\n")[:2] == ["imported True", "interrupted True"] and done.stderr == "", (
        done.stdout, done.stderr)


def test_ctrl_c_inside_a_gc_callback_is_not_swallowed():
    """The moment the issue found: SIGINT handled inside a library's gc callback, where a raised KeyboardInterrupt is
    printed as "Exception ignored" and dropped. The start-up handler defers it until out of the callback."""
    script = textwrap.dedent("""
        import gc, os, signal, time
        from fastrl.signals import install_startup_interrupt
        install_startup_interrupt()
        def callback(phase, info):
            if phase == "start":
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(10000):  # the handler runs here, inside the callback
                    pass
        gc.callbacks.append(callback)
        try:
            gc.collect()
            gc.callbacks.remove(callback)
            time.sleep(5)
            print("swallowed")
        except KeyboardInterrupt:
            print("interrupted")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "interrupted" and done.stderr == "", (done.stdout, done.stderr)
