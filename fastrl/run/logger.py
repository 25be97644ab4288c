"""One ``log(metrics, step)`` over console progress, JSONL, TensorBoard and wandb (offline by default).

Only the main process builds a real logger; other ranks get ``NullLogger``.

TensorBoard and wandb start in background threads (importing TensorBoard's writer costs about a second, ``wandb.init``
several): ``log`` only queues a row for them and returns, so neither delays the first iteration. Each sink's thread
writes its rows in the order they were logged, those logged before it was ready included; ``close`` waits for
both to start, write everything and close. A sink that fails to start is one warning line, and the run goes on
with the others. Neither package is imported unless its sink is on. The run loop starts them in a child process
instead (``SinkProcess``), so their work never competes with training for this process's GIL.
"""
from __future__ import annotations

import json
import math
import os
import queue
import sys
import threading
import time
from pathlib import Path

from fastrl.errors import first_line, print_line


def _plain(value):
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else (1e308 if value > 0 else -1e308)
    return value


def _wait_for_a_later_event_file_name(tb_dir: Path) -> None:
    """TensorBoard reads event files in name order, and a name starts with the writer's creation second: a resumed
    writer created in the same second as a crashed one could sort first, and its purge would then come before the
    events it must purge. Waits (under a second, only then) until the names will sort in creation order."""
    stamps = [int(p.name.split(".")[3]) for p in tb_dir.glob("events.out.tfevents.*") if p.name.split(".")[3].isdigit()]
    while stamps and int(time.time()) <= max(stamps):
        time.sleep(0.02)


class BackgroundSink:
    """A metrics sink started and written by its own thread.

    ``open()`` builds the writer (in the thread); ``write(writer, record, step)`` writes one row; ``finish(writer)``
    closes it. ``log`` queues and returns at once. A failure to open (or a later write) prints one warning line
    naming the sink; its remaining rows are dropped and the run goes on. ``ready`` is set once ``open`` returned
    (or failed); ``failed`` says which.
    """

    _CLOSE = object()

    def __init__(self, name: str, open, write, finish):
        self.name, self._open, self._write, self._finish = name, open, write, finish
        self.ready, self.failed, self._ended = threading.Event(), False, False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        # Daemonic: a process that dies without close() is not held up by a sink still starting.
        self._thread = threading.Thread(target=self._run, name=f"fastrl-{name}", daemon=True)
        self._thread.start()

    def _warn(self, what: str, error: BaseException) -> None:
        self.failed = True
        print_line(f"fastrl: warning: {self.name} {what} ({type(error).__name__}: {first_line(error, '?')}); the run "
                   "goes on without it")

    def _run(self) -> None:
        writer = None
        try:
            writer = self._open()
        except Exception as e:  # noqa: BLE001  (whatever stops a sink, the run goes on without it)
            self._warn("could not start", e)
        finally:
            self.ready.set()
        while (item := self._queue.get()) is not self._CLOSE:
            if writer is None:
                continue
            try:
                self._write(writer, *item)
            except Exception as e:  # noqa: BLE001
                self._warn("stopped writing", e)
                writer = None
        if writer is not None:
            try:
                self._finish(writer)
            except Exception as e:  # noqa: BLE001
                self._warn("could not close", e)

    def log(self, record: dict, step: int) -> None:
        self._queue.put((record, step))

    def end(self) -> None:
        """No more rows: the sink writes what it has and closes, while the caller goes on. Idempotent."""
        if not self._ended:
            self._ended = True
            self._queue.put(self._CLOSE)

    def close(self) -> None:
        """Wait for the sink to start, write every queued row and close. Idempotent."""
        self.end()
        self._thread.join()


def _quiet_tensorboard_writer_thread() -> None:
    """TensorBoard's writer thread re-raises a failed write (a full disk) out of the thread, which prints a
    traceback; the same error reaches the sink at its next write, as one warning. Only that thread's OSErrors are
    silenced; every other thread exception goes to the previous hook."""
    previous = threading.excepthook
    if getattr(previous, "fastrl_tensorboard", False):
        return

    def hook(args):
        if type(args.thread).__name__ == "_AsyncWriterThread" and issubclass(args.exc_type, OSError):
            return
        previous(args)

    hook.fastrl_tensorboard = True
    threading.excepthook = hook


def open_tensorboard(tb_dir: Path, start_step: int):
    from torch.utils.tensorboard import SummaryWriter
    _quiet_tensorboard_writer_thread()
    # On resume, TensorBoard drops the events a crashed attempt logged past the checkpoint's step.
    _wait_for_a_later_event_file_name(tb_dir)
    return SummaryWriter(str(tb_dir), purge_step=start_step + 1 if start_step else None)


def write_tensorboard(writer, record: dict, step: int) -> None:
    for key, value in record.items():
        if key != "global_step" and isinstance(value, (int, float)):
            writer.add_scalar(key, value, step)


# At K > 1 the run's own row is the members' means (of one variant's seeds; with several variants the run loop keeps
# only these keys in it): TensorBoard keeps only what is the whole population's, and each member's figures go to its
# own run.
POPULATION_KEYS = ("charts/SPS", "time/", "perf/")


class TensorBoardRuns:
    """A run's TensorBoard event writers: ``tb/`` for the run's rows and, for a population (``n_members`` > 1), one
    run per member, ``tb/<variant>-seed<k>/`` (``fastrl.run.population.run_name``), so TensorBoard overlays the members;
    each is plotted against its member's own env steps (``member_step``), and ``tb/`` keeps the population's SPS and
    timings, at the per-member step too. A writer opens at its member's first row."""

    def __init__(self, tb_dir: Path, start_step: int, n_members: int = 1):
        self.tb_dir, self.start_step, self.n_members = Path(tb_dir), start_step, n_members
        self.root = open_tensorboard(self.tb_dir, start_step)
        self.members: dict = {}

    def write(self, record: dict, step: int) -> None:
        if self.n_members == 1:
            return write_tensorboard(self.root, record, step)
        member_step = record.get("member_step", step // self.n_members)
        if "member" not in record:
            return write_tensorboard(self.root, {k: v for k, v in record.items() if k.startswith(POPULATION_KEYS)},
                                     member_step)
        from fastrl.run.population import run_name
        name = run_name(record.get("variant", ""), record["seed"])
        if name not in self.members:
            (self.tb_dir / name).mkdir(parents=True, exist_ok=True)
            self.members[name] = open_tensorboard(self.tb_dir / name, self.start_step // self.n_members)
        write_tensorboard(self.members[name], {k: v for k, v in record.items() if k not in _MEMBER_LABELS}, member_step)

    def close(self) -> None:
        for writer in (self.root, *self.members.values()):
            writer.close()


# wandb's own spellings of its modes (WANDB_MODE), as the config's wandb key spells them.
_WANDB_MODES = {"online": "online", "run": "online", "offline": "offline", "dryrun": "offline", "disabled": "disabled"}


def wandb_from_env(mode: str, project: str) -> tuple[str, str]:
    """The wandb mode and project a run uses: the standard environment variables (``WANDB_MODE``, ``WANDB_DISABLED``,
    ``WANDB_PROJECT``) win over the config's defaults (offline, fastrl); a value set in the config wins over them."""
    from fastrl.config import FIELDS
    if mode == FIELDS["wandb"].default:
        if os.environ.get("WANDB_DISABLED", "").lower() in ("true", "1", "yes"):
            mode = "disabled"
        mode = _WANDB_MODES.get(os.environ.get("WANDB_MODE", "").strip().lower(), mode)
    if project == FIELDS["wandb_project"].default:
        project = os.environ.get("WANDB_PROJECT") or project
    return mode, project


def open_wandb(run_dir: Path, config: dict, mode: str, project: str, name: str, start_step: int):
    """A fresh run logs one wandb run. A resumed one (``start_step`` > 0) continues the series: online, as a
    fork of the previous segment at ``start_step`` (wandb keeps history append-only, so the crashed tail past
    the checkpoint stays out of the fork); offline, as a new run in the same group named ``<run>@<step>``."""
    import wandb
    os.environ.setdefault("WANDB_SILENT", "true")
    id_file = run_dir / "wandb" / "fastrl_run_id"
    # WANDB_DIR, WANDB_NAME and WANDB_RUN_GROUP, when set, win over the run's own folder, name and group
    kwargs = dict(mode=mode, project=project, dir=os.environ.get("WANDB_DIR") or str(run_dir), config=config,
                  group=os.environ.get("WANDB_RUN_GROUP") or run_dir.name, name=os.environ.get("WANDB_NAME") or name,
                  reinit="finish_previous")
    if start_step:
        kwargs["name"] = f"{kwargs['name']}@{start_step}"
        if mode == "online" and id_file.is_file():
            kwargs["fork_from"] = f"{id_file.read_text().strip()}?_step={start_step}"
    run = wandb.init(**kwargs)
    id_file.parent.mkdir(parents=True, exist_ok=True)
    id_file.write_text(run.id)
    return run


def write_wandb(run, record: dict, step: int) -> None:
    run.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=int(step))


class NullLogger:
    def log(self, metrics: dict, step: int) -> None:
        pass

    def end_sinks(self) -> None:
        pass

    def write_plot(self, run_dir: Path) -> None:
        from fastrl.run.plot import write_run_plot
        write_run_plot(run_dir)  # never fails the run: a missing matplotlib is one warning line

    def progress(self, step: int, postfix: dict) -> None:
        pass

    def close(self) -> None:
        pass


_MEMBER_LABELS = ("global_step", "member", "seed", "member_step", "variant")


def member_series(record: dict) -> dict:
    """wandb keeps one series per name: a population member's row (``member`` m, see ``fastrl.run.population``) goes to
    ``member<m>/<name>``; metrics.jsonl keeps the row as it is (TensorBoard: ``TensorBoardRuns``)."""
    if "member" not in record:
        return record
    prefix = f"member{record['member']}/"
    return {"global_step": record["global_step"],
            **{prefix + key: value for key, value in record.items() if key not in _MEMBER_LABELS}}


class ProgressLines:
    """Progress as plain stderr lines, ``fastrl: step 12,288/250,000 (4.9%) sps 30512 return 25.3 (3 s)``: one per
    log interval, at most one every ``every_s`` seconds (the last step's always)."""

    def __init__(self, total_steps: int, every_s: float = 2.0):
        self.total_steps, self.every_s = total_steps, every_s
        self._start = time.perf_counter()
        self._last = -math.inf

    def line(self, step: int, postfix: dict) -> str:
        shown = " ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in postfix.items())
        return (f"fastrl: step {step:,}/{self.total_steps:,} ({100 * step / max(self.total_steps, 1):.1f}%) {shown} "
                f"({time.perf_counter() - self._start:.0f} s)")

    def show(self, step: int, postfix: dict) -> None:
        now = time.perf_counter()
        if now - self._last >= self.every_s or step >= self.total_steps:
            self._last = now
            print(self.line(step, postfix), file=sys.stderr, flush=True)


def make_sinks(run_dir: str, config: dict, start_step: int, tensorboard: bool, wandb_mode: str, wandb_project: str,
               run_name: str, n_members: int) -> list[BackgroundSink]:
    """The run's TensorBoard and wandb sinks (those that are on), each starting in its own thread."""
    run_dir, sinks = Path(run_dir), []
    if tensorboard:
        sinks.append(BackgroundSink("TensorBoard", lambda: TensorBoardRuns(run_dir / "tb", start_step, n_members),
                                    lambda runs, record, step: runs.write(record, step), lambda runs: runs.close()))
    if wandb_mode != "disabled":
        sinks.append(BackgroundSink(
            "wandb", lambda: open_wandb(run_dir, config, wandb_mode, wandb_project, run_name or run_dir.name,
                                        start_step),
            write_wandb, lambda run: run.finish()))
    return sinks


def log_to_sinks(sinks: list, record: dict, step: int) -> None:
    """One row to every sink: TensorBoard takes it whole (``TensorBoardRuns`` splits members), wandb per series."""
    for sink in sinks:
        sink.log(record if sink.name in ("TensorBoard", SinkProcess.name) else member_series(record), step)


def hold_run_dir_sinks(run_dir: Path, patience_s: float = 60.0) -> int | None:
    """A descriptor holding an exclusive ``flock`` on the directory ``run_dir`` itself (not the run's lock file), for
    the run's sink process to inherit and keep until it exits. A run killed with its sink process still writing the
    rows it received leaves that process holding it: a resume waits here (up to ``patience_s``) so that its
    TensorBoard writer opens after the crashed attempt's, its purge of the rows past the checkpoint then coming
    after them in TensorBoard's (name) order. None, with one warning line, if the wait runs out."""
    import fcntl
    fd = os.open(run_dir, os.O_RDONLY)
    deadline = time.monotonic() + patience_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                print_line(f"fastrl: warning: the logging process of this run's previous attempt is still writing "
                           f"after {patience_s:.0f} s; TensorBoard may show that attempt's last rows after this one's")
                return None
            time.sleep(0.02)


class SinkProcess:
    """The run's sinks (``make_sinks``, or ``factory``'s) started and written in a child process of the run, so
    their Python work (wandb's and TensorBoard's imports, ``wandb.log``, protobuf events) never holds the training
    process's GIL; rows go to it through a pipe, pickled, in the order they were logged.

    The child is part of the run that owns ``run_dir``: it writes only the sinks' own files, holds no descriptor of
    the run's lock (it is exec'd, not forked), has a process group of its own (a Ctrl-C or a signal to the run's group
    reaches the run alone, whose stop then sends the last rows) and ends at the end of its pipe: when ``end`` or
    ``close`` closes it, or when the run died: either way each sink writes every row it received and closes (holding
    a lock on ``run_dir`` meanwhile, so that a resume's sinks wait for it: ``hold_run_dir_sinks``). Sink warnings
    are the child's, printed on the run's stderr as in-process sinks print them. ``factory``: ``"module:function"``
    called in the child with ``sink_args``, returning the sinks (tests put fakes there)."""

    name = "sinks"

    def __init__(self, sink_args: dict, factory: str = "fastrl.run.logger:make_sinks", plots: bool = False,
                 run_dir: Path | None = None):
        """``plots``: the run will ask for its learning-curve plot (``plot``); the child imports matplotlib while the
        run trains, so the plot costs the run's end only its drawing. ``run_dir``: the child holds
        ``hold_run_dir_sinks``'s lock on it until it exits."""
        import subprocess
        package_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH"))
                                                         if p)}
        held = hold_run_dir_sinks(run_dir) if run_dir is not None else None
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-c", "from fastrl.run.logger import serve_sinks; serve_sinks()"],
                stdin=subprocess.PIPE, stdout=2, env=env,  # its stdout: the run's stderr
                start_new_session=True,  # its own process group (Python 3.10 too)
                pass_fds=() if held is None else (held,))
        finally:
            if held is not None:
                os.close(held)  # the child's copy keeps the lock
        self._ended = False
        self._send((factory, sink_args, plots))

    def _send(self, item) -> None:
        if self._child.stdin is None:
            return
        import pickle
        try:
            self._child.stdin.write(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))
            self._child.stdin.flush()
        except OSError as e:  # the child died (killed by hand): the run goes on without its sinks
            print_line(f"fastrl: warning: the logging process ended ({type(e).__name__}: {first_line(e, '?')}); the "
                       "run goes on without TensorBoard and wandb")
            self._close_pipe()

    def _close_pipe(self) -> None:
        try:
            self._child.stdin.close()
        except OSError:
            pass
        self._child.stdin = None

    def log(self, record: dict, step: int) -> None:
        self._send(("row", record, step))

    def end(self) -> None:
        """No more rows: the child writes what it has and closes its sinks, while the run goes on. Idempotent."""
        if not self._ended:
            self._ended = True
            self._send(("end",))

    def plot(self, run_dir) -> None:
        """The child writes ``run_dir/learning_curve.png`` (``fastrl.run.plot.write_run_plot``) from the run's files as
        they are now; ``close`` waits for it."""
        self._send(("plot", str(run_dir)))

    def close(self) -> None:
        """Wait for the child to write every row sent (and the plot asked for) and close its sinks. Idempotent."""
        self.end()
        if self._child.stdin is not None:
            self._close_pipe()  # the end of the pipe is the child's signal to exit
        self._child.wait()


def _import_plotting() -> None:
    try:
        import fastrl.run.plot  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
        from matplotlib.figure import Figure  # noqa: F401
    except ImportError:  # said, as one line, if the plot is asked for
        pass


def serve_sinks() -> None:
    """The child of ``SinkProcess``: reads ``(factory, sink_args, plots)``, then messages from stdin until its end:
    ``("row", record, step)`` to the sinks, ``("end",)`` lets them finish, ``("plot", run_dir)`` writes the run's
    plot. At the end of stdin (the run closed it, or died) it waits for each sink to write its rows and close."""
    import importlib
    import logging
    import pickle
    # On a full disk wandb's own log files fail: logging would print a traceback per record, and asyncio a line per
    # write to wandb's lost service process. The sink's one warning line says it (see SinkWriter).
    logging.raiseExceptions = False
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    pipe = sys.stdin.buffer
    try:
        factory, sink_args, plots = pickle.load(pipe)
    except EOFError:
        return
    if plots:  # matplotlib's import (about 0.4 s) while the run trains, not at its end
        threading.Thread(target=_import_plotting, daemon=True).start()
    module, function = factory.split(":")
    sinks = getattr(importlib.import_module(module), function)(**sink_args)
    try:
        while True:
            try:
                message = pickle.load(pipe)
            except EOFError:
                break
            if message[0] == "row":
                log_to_sinks(sinks, message[1], message[2])
            elif message[0] == "end":  # each sink finishes in its own thread (wandb's takes a while) meanwhile
                for sink in sinks:
                    sink.end()
            elif message[0] == "plot":
                from fastrl.run.plot import write_run_plot
                write_run_plot(message[1])
    finally:
        for sink in sinks:
            sink.close()


class RunLogger(NullLogger):
    """Writes ``metrics.jsonl`` (one object per log step), TensorBoard events and a wandb run in ``run_dir``.
    ``sink_process``: TensorBoard and wandb run in a child process (``SinkProcess``), not in this one's threads."""

    def __init__(self, run_dir: Path, config: dict, total_steps: int, start_step: int = 0, tensorboard: bool = True,
                 wandb_mode: str = "offline", wandb_project: str = "fastrl", progress: bool = True, run_name: str = "",
                 n_members: int = 1, sink_process: bool = False, plot: bool = False):
        """``plot``: the run ends with ``write_plot``, drawn by the sink process when there is one."""
        self.run_dir = Path(run_dir)
        wandb_mode, wandb_project = wandb_from_env(wandb_mode, wandb_project)
        # Unbuffered bytes: each row is one write, and a row a full disk cut short is cut off again (see log).
        self._jsonl = open(self.run_dir / "metrics.jsonl", "ab", buffering=0)
        sink_args = dict(run_dir=str(self.run_dir), config=config, start_step=start_step, tensorboard=tensorboard,
                         wandb_mode=wandb_mode, wandb_project=wandb_project, run_name=run_name, n_members=n_members)
        if sink_process and (tensorboard or wandb_mode != "disabled"):
            self.sinks = [SinkProcess(sink_args, plots=plot, run_dir=self.run_dir)]
        else:
            self.sinks = make_sinks(**sink_args)
        self._bar = self._lines = None
        if progress and sys.stderr.isatty():
            from tqdm import tqdm
            self._bar = tqdm(total=total_steps, initial=start_step, unit="step", unit_scale=True, dynamic_ncols=True,
                             file=sys.stderr, mininterval=0.5)
        elif not config.get("quiet", False):  # a file or a pipe reads plain lines better than \r updates
            self._lines = ProgressLines(total_steps)

    def log(self, metrics: dict, step: int) -> None:
        record = {"global_step": int(step)}
        record.update({k: _plain(v) for k, v in metrics.items()})
        self._write_row((json.dumps(record) + "\n").encode())
        log_to_sinks(self.sinks, record, step)

    def _write_row(self, data: bytes) -> None:
        """Append one row; on a failure (a full disk) cut the file back to its last whole row and raise a one-line
        UserError naming the file and the space the row needs."""
        start = os.lseek(self._jsonl.fileno(), 0, os.SEEK_END)
        try:
            written = 0
            while written < len(data):
                written += self._jsonl.write(data[written:])
        except OSError as e:
            try:
                os.ftruncate(self._jsonl.fileno(), start)
            except OSError:
                pass
            from fastrl.run.storage import write_error
            raise write_error("metrics", self.run_dir / "metrics.jsonl", e, len(data),
                              " (the rows written so far are whole)") from None

    def progress(self, step: int, postfix: dict) -> None:
        if self._lines is not None:
            self._lines.show(step, postfix)
        if self._bar is not None:
            self._bar.n = step
            self._bar.set_postfix({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in postfix.items()},
                                  refresh=False)
            self._bar.refresh()

    def end_sinks(self) -> None:
        """The last row was logged: TensorBoard and wandb finish (wandb's takes a while) while the run writes its last
        files; ``close`` waits for them. Rows logged after this reach metrics.jsonl only."""
        for sink in self.sinks:
            sink.end()

    def write_plot(self, run_dir: Path) -> None:
        """``run_dir/learning_curve.png`` from the run's files as they are now: drawn by the sink process (which
        imported matplotlib while the run trained) when there is one, and ``close`` waits for it; else here."""
        if self.sinks and isinstance(self.sinks[0], SinkProcess):  # then the only sink
            self.sinks[0].plot(run_dir)
        else:
            super().write_plot(run_dir)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        try:
            self._jsonl.close()
        except OSError:  # e.g. disk full on the final flush: what was written before stays whole
            pass
        for sink in self.sinks:
            sink.close()
