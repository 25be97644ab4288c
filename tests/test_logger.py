"""The logger's background sinks: TensorBoard and wandb start in threads, so a slow start never delays ``log``; rows
reach every sink in order; a sink that fails is one warning line and the others go on. Orderings, not durations."""
import json
import subprocess
import sys
import threading

import pytest

from fastrl.run import logger as logger_module
from fastrl.run.logger import BackgroundSink, RunLogger

START_TIMEOUT_S = 30.0  # a fake start that is never released fails the test instead of hanging it


class FakeWriter:
    def __init__(self):
        self.rows, self.closed = [], False


def _gated_open(gate: threading.Event, writer: FakeWriter):
    """A sink start that lasts until the test sets ``gate``: wandb.init and the TensorBoard import, made slow."""
    def open_sink(*_args):
        assert gate.wait(START_TIMEOUT_S), "the test never released the fake start"
        return writer
    return open_sink


def _record_row(writer: FakeWriter, record: dict, step: int) -> None:
    writer.rows.append((step, dict(record)))


@pytest.fixture
def fake_sinks(monkeypatch):
    """TensorBoard and wandb replaced by fake writers whose starts wait for ``gates[name]``."""
    gates = {"tb": threading.Event(), "wandb": threading.Event()}
    writers = {"tb": FakeWriter(), "wandb": FakeWriter()}
    monkeypatch.setattr(logger_module, "open_tensorboard", _gated_open(gates["tb"], writers["tb"]))
    monkeypatch.setattr(logger_module, "open_wandb", _gated_open(gates["wandb"], writers["wandb"]))
    monkeypatch.setattr(logger_module, "write_tensorboard", _record_row)
    monkeypatch.setattr(logger_module, "write_wandb", _record_row)
    monkeypatch.setattr(FakeWriter, "close", lambda self: setattr(self, "closed", True), raising=False)
    monkeypatch.setattr(FakeWriter, "finish", lambda self: setattr(self, "closed", True), raising=False)
    return gates, writers


def _logger(tmp_path) -> RunLogger:
    return RunLogger(tmp_path, {"seed": 1}, total_steps=100, tensorboard=True, wandb_mode="offline", progress=False)


def test_a_slow_sink_start_does_not_delay_logging_and_rows_arrive_in_order(tmp_path, fake_sinks):
    gates, writers = fake_sinks
    run_logger = _logger(tmp_path)
    run_logger.log({"charts/SPS": 1.0}, 10)  # returns while both sinks are still starting
    assert not any(sink.ready.is_set() for sink in run_logger.sinks), "log() returned before any sink was ready"
    gates["tb"].set()
    run_logger.sinks[0].ready.wait(START_TIMEOUT_S)
    for step in (20, 30):
        run_logger.log({"charts/SPS": float(step)}, step)
    assert not run_logger.sinks[1].ready.is_set(), "wandb still starting: its rows wait in its queue"
    gates["wandb"].set()
    run_logger.close()  # waits for wandb's start, writes its queued rows, closes both
    expected = [(step, {"global_step": step, "charts/SPS": float(step) if step > 10 else 1.0}) for step in (10, 20, 30)]
    assert writers["tb"].rows == expected and writers["wandb"].rows == expected
    assert writers["tb"].closed and writers["wandb"].closed
    jsonl = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert jsonl == [row for _, row in expected]


def test_a_sink_that_fails_to_start_is_one_warning_and_the_run_goes_on(tmp_path, fake_sinks, monkeypatch, capsys):
    gates, writers = fake_sinks

    def broken_wandb(*_args):
        raise RuntimeError("wandb service did not start\nsecond line of detail")
    monkeypatch.setattr(logger_module, "open_wandb", broken_wandb)
    run_logger = _logger(tmp_path)
    run_logger.log({"losses/value_loss": 0.5}, 1)
    gates["tb"].set()
    run_logger.log({"losses/value_loss": 0.25}, 2)
    run_logger.close()
    assert [step for step, _ in writers["tb"].rows] == [1, 2] and writers["tb"].closed
    wandb_sink = run_logger.sinks[1]
    assert wandb_sink.failed and wandb_sink.ready.is_set()
    warnings = [line for line in capsys.readouterr().err.splitlines() if line]
    assert warnings == [("fastrl: warning: wandb could not start (RuntimeError: wandb service did not start); "
                         "the run goes on without it")]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


def test_a_sink_that_fails_while_writing_stops_alone(capsys):
    written = []

    def write(_writer, record, step):
        if step == 2:
            raise OSError("disk full")
        written.append(step)
    sink = BackgroundSink("TensorBoard", open=lambda: object(), write=write, finish=lambda _writer: None)
    for step in (1, 2, 3):
        sink.log({}, step)
    sink.close()
    sink.close()  # idempotent
    assert written == [1] and sink.failed
    assert capsys.readouterr().err.count("fastrl: warning: TensorBoard stopped writing (OSError: disk full)") == 1


def test_close_waits_for_a_start_still_running(fake_sinks):
    """close() right after the logger was built: the starts finish, then close, and nothing is lost."""
    gates, writers = fake_sinks
    sink = BackgroundSink("TensorBoard", open=logger_module.open_tensorboard, write=_record_row,
                          finish=lambda writer: writer.close())
    sink.log({"a": 1}, 5)
    closer = threading.Thread(target=sink.close)
    closer.start()
    assert not sink.ready.is_set()
    gates["tb"].set()
    closer.join(START_TIMEOUT_S)
    assert not closer.is_alive() and writers["tb"].rows == [(5, {"a": 1})] and writers["tb"].closed


@pytest.mark.parametrize("environ, given, expected", [
    ({"WANDB_MODE": "disabled"}, ("offline", "fastrl"), ("disabled", "fastrl")),
    ({"WANDB_MODE": "online", "WANDB_PROJECT": "mine"}, ("offline", "fastrl"), ("online", "mine")),
    ({"WANDB_MODE": "dryrun"}, ("offline", "fastrl"), ("offline", "fastrl")),
    ({"WANDB_DISABLED": "true"}, ("offline", "fastrl"), ("disabled", "fastrl")),
    ({"WANDB_MODE": "disabled", "WANDB_PROJECT": "mine"}, ("online", "theirs"), ("online", "theirs")),
    ({}, ("offline", "fastrl"), ("offline", "fastrl")),
])
def test_wandbs_variables_win_over_the_config_defaults(monkeypatch, environ, given, expected):
    for name in ("WANDB_MODE", "WANDB_DISABLED", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert logger_module.wandb_from_env(*given) == expected


def test_wandb_mode_disabled_writes_no_wandb_run(tmp_path, fake_sinks, monkeypatch):
    """The config's default (offline) with WANDB_MODE=disabled: no wandb sink, no wandb folder in the run."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run_logger = RunLogger(tmp_path, {"seed": 1}, total_steps=100, tensorboard=False, wandb_mode="offline",
                           progress=False)
    run_logger.log({"charts/SPS": 1.0}, 1)
    run_logger.close()
    assert run_logger.sinks == [] and not (tmp_path / "wandb").exists()
    monkeypatch.setenv("WANDB_MODE", "offline")
    fake_sinks[0]["wandb"].set()
    run_logger = RunLogger(tmp_path, {"seed": 1}, total_steps=100, tensorboard=False, wandb_mode="offline",
                           progress=False)
    run_logger.log({"charts/SPS": 1.0}, 1)
    run_logger.close()
    assert [sink.name for sink in run_logger.sinks] == ["wandb"] and fake_sinks[1]["wandb"].rows


def test_sinks_that_are_off_are_never_imported(tmp_path):
    code = ("import sys; from fastrl.run.logger import RunLogger; "
            f"RunLogger({str(tmp_path)!r}, {{}}, 10, tensorboard=False, wandb_mode='disabled', progress=False).close(); "
            "print(sorted(m for m in ('wandb', 'tensorboard', 'torch.utils.tensorboard', 'tqdm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_warning_and_error_lines_reach_stderr_in_one_write_each(monkeypatch):
    """The run's logging process and the run itself share stderr: a line written as its text and then its newline
    (``print``) can have the other process's line land in between (seen on a full disk: the sink's warning and the
    run's error joined into one line). Each goes out as one write, newline included."""
    from fastrl.cli import train as cli_train
    from fastrl.config import UserError

    class Writes:
        def __init__(self):
            self.calls = []

        def write(self, text):
            self.calls.append(text)
            return len(text)

        def flush(self):
            pass

    writes = Writes()
    monkeypatch.setattr(sys, "stderr", writes)
    sink = BackgroundSink("wandb", open=lambda: object(), write=lambda *_: None, finish=lambda _writer: None)
    sink._warn("could not start", OSError(28, "No space left on device"))
    sink.close()

    def full_disk(*_args, **_kwargs):
        raise UserError("no space left on device writing metrics.jsonl")
    monkeypatch.setattr(cli_train, "config_from_cli", full_disk)
    assert cli_train.main([]) == 2
    assert len(writes.calls) == 2, writes.calls
    assert writes.calls[0].startswith("fastrl: warning: wandb could not start") and writes.calls[0].endswith("\n")
    assert writes.calls[1] == "fastrl: error: no space left on device writing metrics.jsonl\n"
