"""Stop signals during a run: SIGINT, SIGTERM and SIGHUP all ask the run to stop, and none has to wait for a hung env.

- ``install_stop_handlers(flag)``: each of the three sets ``flag["stop"]``; the run loop ends after the current
  iteration, checkpoints it and writes summary.json.
- While the main thread waits on a Python env inside ``stop_ends_env_waits()`` (the run loop's rollout and final
  evaluation), a stop signal also ends that wait at once: the handler raises ``StopWhileWaiting``, the iteration in
  progress is dropped and the run ends at the last completed one. A hung ``step()`` in this process or in a worker
  therefore never outlasts a stop signal.
- ``stop_requested()``: whether a stop signal came during this run (a compile that fails then was interrupted, not
  broken).
- Before the run loop takes over (the command line's start-up), ``install_startup_interrupt`` makes the three raise at
  once (``KeyboardInterrupt``, ``Terminated``), deferred out of the places where an exception would do harm.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# waiting: the main thread is inside an env call (env_call); interruptible: a stop may end that wait
# (stop_ends_env_waits); signal: the stop signal this run received (None: none yet).
_STATE = {"waiting": False, "interruptible": False, "signal": None}


class SignalStop(BaseException):
    """A stop signal, raised (a BaseException, so no env wrapper's or library's ``except Exception`` keeps it)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopWhileWaiting(SignalStop):
    """A stop signal ended a wait on an env."""


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


def _stop_handler(flag: dict):
    def handler(signum, _frame):
        flag["stop"] = _STATE["signal"] = signum
        if _STATE["waiting"] and _STATE["interruptible"]:
            raise StopWhileWaiting(signum)
    return handler


# The stop handler's code object (one for every closure ``_stop_handler`` makes): ``fastrl.run.compile.skip_guards``
# tells dynamo never to compile it. A signal that lands inside a compiled call runs the handler's frame there, and
# under skipped guards dynamo takes a frame it has never seen for a recompile and raises ("Recompilation triggered
# with skip_guard_eval_unsafe stance"), ending the run instead of stopping it.
STOP_HANDLER_CODE = _stop_handler({}).__code__


def install_stop_handlers(flag: dict) -> dict:
    """SIGINT/SIGTERM/SIGHUP set ``flag["stop"]`` (and end an env wait, see the module docstring). Returns the
    previous handlers, for ``restore_handlers``."""
    _STATE["signal"] = None
    return _install(_stop_handler(flag))


def _install(handler) -> dict:
    """``handler`` for the three stop signals; returns the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return {}  # Python sets handlers only in the main thread (e.g. fastrl.train called from a worker thread)
    return {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}


def restore_handlers(previous: dict) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    _STATE["signal"] = None


# signal: the stop signal that came during start-up (None: none); cut_imports: it cut the imports short.
STARTUP_INTERRUPT = {"signal": None}


def run_as_process(main_function, *args) -> int:
    """``main_function(*args)`` as the whole process's work: returns its exit status (the collector paused for the
    start-up and settled for the exit: ``fastrl._startup``)."""
    from fastrl._startup import pause_collector, settle_collector_for_exit
    pause_collector()
    try:
        status = main_function(*args)
    finally:
        settle_collector_for_exit()
    if status in (130, 128 + signal.SIGTERM, 128 + signal.SIGHUP) and STARTUP_INTERRUPT.get("cut_imports"):
        # A Ctrl-C that cut the start-up short can leave an extension half imported, whose teardown at interpreter
        # exit prints pages (nanobind's leak report for triton): the one line is out, and nothing was saved yet.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def _where_an_interrupt_must_wait(frame) -> bool:
    """Whether a KeyboardInterrupt raised at ``frame`` would do harm, so the start-up handler defers it:
    - inside a gc callback (a library's, e.g. one JAX registers) or a ``__del__``, Python only prints it ("Exception
      ignored in ...") and drops it;
    - inside an import, the module's body may be running under an extension's C++ initializer that cannot pass an
      exception on: ``torch.distributed`` calls ``torch._C._c10d_init()``, and an interrupt raised there ends the
      process in ``std::terminate`` (SIGABRT, a page of C++ and Python frames) instead of exit 130;
    - inside EnvPool's Python layer, a thin wrapper over its C++ core: an interrupt raised there (seen in the env
      probe reading ``observation_space``) aborted the process (SIGABRT, no message)."""
    import gc
    callbacks = {getattr(callback, "__code__", None) for callback in gc.callbacks}
    envpool = getattr(sys.modules.get("envpool"), "__file__", None)
    native = (os.path.dirname(envpool),) if envpool else ()
    while frame is not None:
        code = frame.f_code
        if (code in callbacks or code.co_name == "__del__" or code.co_filename.startswith("<frozen importlib")
                or code.co_filename.startswith(native)):
            return True
        frame = frame.f_back
    return False


def stopped_during_startup(signum: int) -> str:
    """The one line for a stop signal before the run loop took over."""
    name = "interrupted (Ctrl-C)" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
    return f"{name} during start-up; nothing was saved"


class Terminated(SignalStop):
    """SIGTERM or SIGHUP during start-up: nothing to save yet; the command line exits ``128 + signum``."""


def _startup_interrupt(signum, frame):
    STARTUP_INTERRUPT["signal"] = signum
    if _where_an_interrupt_must_wait(frame):
        # Deliver the signal again in 50 ms, and so on until out of there; then it raises.
        timer = threading.Timer(0.05, os.kill, (os.getpid(), signum))
        timer.daemon = True
        timer.start()
        return
    raise_if_interrupted()


def install_startup_interrupt() -> dict:
    """Until the run loop installs its own stop handlers (and again after it restores these), SIGINT raises
    KeyboardInterrupt as Python's default handler does (SIGTERM and SIGHUP: ``Terminated``), and also leaves a mark:
    an interrupt that some library swallows (e.g. raised inside a gc callback, where Python only prints it) still
    ends the run before training. Returns the previous handlers (none outside the main thread, where handlers
    cannot be set)."""
    STARTUP_INTERRUPT["signal"] = None
    return _install(_startup_interrupt)


def raise_if_interrupted() -> None:
    signum = STARTUP_INTERRUPT["signal"]
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    if signum is not None:
        raise Terminated(signum)
