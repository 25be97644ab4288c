"""Stop signals during a run: SIGINT, SIGTERM and SIGHUP all ask the run to stop, and none has to wait for a hung env.

- ``install_stop_handlers(flag)``: each of the three sets ``flag["stop"]``; the run loop ends after the current
  iteration, checkpoints it and writes summary.json.
- While the main thread waits on a Python env inside ``stop_ends_env_waits()`` (the run loop's rollout and final
  evaluation), a stop signal also ends that wait at once: the handler raises ``StopWhileWaiting``, the iteration in
  progress is dropped and the run ends at the last completed one. A hung ``step()`` in this process or in a worker
  therefore never outlasts a stop signal.
- ``stop_requested()``: whether a stop signal came during this run (a compile that fails then was interrupted, not
  broken).
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# waiting: the main thread is inside an env call (env_call); interruptible: a stop may end that wait
# (stop_ends_env_waits); signal: the stop signal this run received (None: none yet).
_STATE = {"waiting": False, "interruptible": False, "signal": None}


class StopWhileWaiting(BaseException):
    """A stop signal ended a wait on an env (a BaseException, so no env wrapper's ``except Exception`` keeps it)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_requested() -> bool:
    return _STATE["signal"] is not None


def set_waiting(waiting: bool) -> None:
    """Mark (or unmark) the main thread as waiting on an env; see ``waiting_on_env``."""
    _STATE["waiting"] = waiting


@contextmanager
def waiting_on_env():
    """Marks the main thread as waiting on an env for the ``with`` body (no-op in other threads)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _STATE["waiting"] = True
    try:
        yield
    finally:
        _STATE["waiting"] = False


@contextmanager
def stop_ends_env_waits():
    """Within the body, a stop signal that arrives while the main thread waits on an env raises StopWhileWaiting."""
    _STATE["interruptible"] = True
    try:
        yield
    finally:
        _STATE["interruptible"] = False


def install_stop_handlers(flag: dict) -> dict:
    """SIGINT/SIGTERM/SIGHUP set ``flag["stop"]`` (and end an env wait, see the module docstring). Returns the
    previous handlers, for ``restore_handlers``."""
    _STATE["signal"] = None

    def handler(signum, _frame):
        flag["stop"] = _STATE["signal"] = signum
        if _STATE["waiting"] and _STATE["interruptible"]:
            raise StopWhileWaiting(signum)
    if threading.current_thread() is not threading.main_thread():
        return {}  # Python sets handlers only in the main thread (e.g. fastrl.train called from a worker thread)
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in previous:
        signal.signal(sig, handler)
    return previous


def restore_handlers(previous: dict) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    _STATE["signal"] = None
