"""The sink process: the run's TensorBoard and wandb written by a child process of the run (``SinkProcess``). Rows
arrive whole and in order, at a normal close and when the run dies; a Ctrl-C to the process group leaves the child
to the run's own stop; a failing sink is one warning line; the child holds no descriptor of the run's lock; a resumed
run's sink process starts only once the killed attempt's has written its rows."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastrl.run.logger import RunLogger, SinkProcess, hold_run_dir_sinks
from fastrl.run.rundir import LOCK_FILE, RunLock

TESTS = str(Path(__file__).parent)
FAKES = "fastrl_sink_fakes:file_sinks"


@pytest.fixture(autouse=True)
def tests_on_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p))


def _lines(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rows_reach_the_child_in_order_and_close_waits_for_all_of_them(tmp_path):
    out = tmp_path / "rows.jsonl"
    sinks = SinkProcess({"path": str(out)}, factory=FAKES)
    for step in range(1, 301):
        sinks.log({"charts/SPS": float(step), "member": 0}, step)
    sinks.close()
    sinks.close()  # idempotent
    assert _lines(out) == [[step, {"charts/SPS": float(step), "member": 0}] for step in range(1, 301)] + ["closed"]


def test_a_ctrl_c_to_the_run_leaves_the_child_and_the_run_killed_ends_it_with_every_row_written(tmp_path):
    """A Ctrl-C reaches the run's process group, not the child's (the run's stop sends the last rows). The run
    killed with -9: the child writes every row it was sent, closes its sinks and exits."""
    out = tmp_path / "rows.jsonl"
    run = ("import os, signal\n"
           "from fastrl.run.logger import SinkProcess\n"
           "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
           f"sinks = SinkProcess({{'path': {str(out)!r}}}, factory={FAKES!r})\n"
           "sinks.log({'a': 1}, 1)\n"
           "os.killpg(0, signal.SIGINT)\n"
           "sinks.log({'a': 2}, 2)\n"
           "print(sinks._child.pid, flush=True)\n"
           "os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, timeout=60,
                          start_new_session=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    child = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{child}"), "the sink process outlived its run"
    assert _lines(out) == [[1, {"a": 1}], [2, {"a": 2}], "closed"]


def test_a_resumed_run_s_sinks_start_after_the_killed_attempt_s_have_written_their_rows(tmp_path):
    """The run killed while its sink process is still starting (a slow TensorBoard import): that orphan writes the
    rows it received later. A resume's sink process must start after it (TensorBoard reads event files in creation
    order, and the resume's purge must come after the rows it purges): ``SinkProcess`` returns once the orphan is
    done."""
    run_dir, first, second = tmp_path / "run", tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    run_dir.mkdir()
    run = ("import os, signal\n"
           "from fastrl.run.logger import SinkProcess\n"
           f"sinks = SinkProcess({{'path': {str(first)!r}, 'open_delay_s': 2.0}}, factory={FAKES!r}, "
           f"run_dir={str(run_dir)!r})\n"
           "sinks.log({'a': 1}, 1)\n"
           "os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", run], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          timeout=60)  # not captured: the orphan holds the run's stderr until it exits
    assert proc.returncode == -signal.SIGKILL
    assert not first.exists(), "the orphan must still be starting for this test to mean anything"
    resumed = SinkProcess({"path": str(second)}, factory=FAKES, run_dir=run_dir)
    try:
        assert _lines(first) == [[1, {"a": 1}], "closed"], "the resume's sinks started before the orphan's ended"
        resumed.log({"a": 2}, 2)
    finally:
        resumed.close()
    assert _lines(second) == [[2, {"a": 2}], "closed"]


def test_a_resume_waits_for_the_previous_sinks_only_so_long(tmp_path, capfd):
    held = hold_run_dir_sinks(tmp_path)
    try:
        assert hold_run_dir_sinks(tmp_path, patience_s=0.2) is None
        err = capfd.readouterr().err
        assert err.count("fastrl: warning: the logging process of this run's previous attempt is still writing "
                         "after 0 s") == 1, err
    finally:
        os.close(held)
    again = hold_run_dir_sinks(tmp_path, patience_s=0.2)
    assert again is not None
    os.close(again)


def test_a_sink_that_fails_to_start_in_the_child_is_one_warning_line(tmp_path, capfd):
    sinks = SinkProcess({"path": str(tmp_path / "rows.jsonl"), "fail_open": True}, factory=FAKES)
    sinks.log({"a": 1}, 1)
    sinks.close()
    err = capfd.readouterr().err
    assert err.count("fastrl: warning: TensorBoard could not start (RuntimeError: no writer here); the run goes on "
                     "without it") == 1, err
    assert "Traceback" not in err


def test_the_child_holds_no_descriptor_of_the_run_lock(tmp_path):
    lock = RunLock(tmp_path).acquire()
    try:
        sinks = SinkProcess({"path": str(tmp_path / "rows.jsonl")}, factory=FAKES)
        try:
            fds = Path(f"/proc/{sinks._child.pid}/fd")
            targets = [os.readlink(fd) for fd in fds.iterdir() if fd.exists()]
            assert targets and not any(target.endswith(LOCK_FILE) for target in targets)
        finally:
            sinks.close()
    finally:
        lock.release()


def test_run_logger_with_a_sink_process_writes_every_row_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    logger = RunLogger(tmp_path, {}, 100, tensorboard=True, wandb_mode="disabled", progress=False, sink_process=True)
    assert [type(sink) for sink in logger.sinks] == [SinkProcess]
    for step in range(1, 51):
        logger.log({"losses/value_loss": 1.0 / step, "charts/episodes": step}, step)
    logger.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(s.step, s.value) for s in events.Scalars("charts/episodes")] == [(step, step) for step in range(1, 51)]
    assert len(events.Scalars("losses/value_loss")) == 50
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 50


def _wait_for(predicate, timeout=30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def test_end_lets_the_sinks_finish_while_the_run_goes_on(tmp_path):
    """``end``: the sinks write their rows and close without ``close`` being called (the run writes its last files
    meanwhile); ``close`` then only waits. In the child and in a thread alike."""
    from fastrl_sink_fakes import file_sinks
    for where, make in (("child", lambda path: SinkProcess({"path": str(path)}, factory=FAKES)),
                        ("thread", lambda path: file_sinks(str(path))[0])):
        out = tmp_path / f"{where}.jsonl"
        sinks = make(out)
        sinks.log({"a": 1}, 1)
        sinks.end()
        sinks.end()  # idempotent
        assert _wait_for(lambda: out.is_file() and out.read_text().endswith('"closed"\n')), where
        sinks.close()
        assert _lines(out) == [[1, {"a": 1}], "closed"], where


def test_the_run_plot_is_drawn_by_the_sink_process_and_close_waits_for_it(tmp_path, monkeypatch):
    """With a sink process the run's learning-curve plot is the child's work (it imported matplotlib while the run
    trained); the run asks for it after its last files and ``close`` returns once the PNG is written. The run's own
    process never imports matplotlib for it."""
    import fastrl.run.logger as logger_module
    drawn_here = []
    monkeypatch.setattr(logger_module.NullLogger, "write_plot", lambda self, run_dir: drawn_here.append(run_dir))
    logger = RunLogger(tmp_path, {"quiet": True}, total_steps=300, tensorboard=True, wandb_mode="disabled",
                       progress=False, sink_process=True, plot=True)
    for step in (100, 200, 300):
        logger.log({"charts/episodic_return": step / 10.0, "time/elapsed_s": step / 100.0}, step)
    logger.log({"eval/return_mean": 30.0, "eval/return_std": 1.0}, 300)
    logger.end_sinks()
    logger.write_plot(tmp_path)
    logger.close()
    assert (tmp_path / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert drawn_here == []
    assert list((tmp_path / "tb").rglob("events.out.tfevents.*"))  # the rows still reached TensorBoard

    # No sink process (TensorBoard and wandb off): the plot is drawn in the run's process.
    bare = tmp_path / "bare"
    bare.mkdir()
    logger = RunLogger(bare, {"quiet": True}, total_steps=300, tensorboard=False, wandb_mode="disabled",
                       progress=False, sink_process=True, plot=True)
    logger.write_plot(bare)
    logger.close()
    assert drawn_here == [bare]
