"""Python (Gymnasium) envs that misbehave without taking the run down: what they raised, a deadline on every call, and
worker processes that never outlive the run.

- ``WatchedAsyncVectorEnv``: Gymnasium's AsyncVectorEnv (one worker process per env) whose ``step``/``reset`` wait at
  most ``timeout_s`` (``env_timeout_s``). A worker that does not answer in time, or that died (``os._exit``, an
  uncaught ``SystemExit``, a signal), ends the call with an ``EnvFault`` naming it, and every worker is then killed
  and reaped. Workers ignore SIGINT, SIGTERM and SIGHUP (a signal to the process group reaches the run, which stops
  them) and are killed by the kernel when the run's process dies (``PR_SET_PDEATHSIG``, Linux).
- ``WatchedSyncVectorEnv``: the in-process twin (one env, IMPALA actors): the same deadline, by SIGALRM; a
  ``SystemExit`` from the env's code is an env error like any other.
Both mark their waits (``fastrl.signals.waiting_on_env``), so a stop signal ends a hung call at once.
"""
from __future__ import annotations

import ctypes
import functools
import gc
import json
import multiprocessing
import os
import signal
import threading
import time
import traceback

import gymnasium
import torch
from gymnasium.vector.async_vector_env import AsyncState, _async_worker

from fastrl.config import UserError
from fastrl.errors import first_line
from fastrl.signals import set_waiting, waiting_on_env

_MAIN_THREAD = threading.main_thread().ident


class ObservationError(ValueError):
    """An env returned an observation fastrl cannot take: of another shape than its observation space's, or NaN or
    infinite (message: env, what was wrong, where)."""


def check_finite_observation(obs, env_id: str, step: int) -> None:
    """Raise EnvError when ``obs [N, ...]`` (a batch's observations, ``step`` steps after the envs were built) holds
    a NaN or an infinity, naming the env, the first such env index and the step."""
    finite = torch.isfinite(obs).reshape(obs.shape[0], -1).all(1)
    if bool(finite.all()):
        return
    index = int((~finite).nonzero()[0, 0])
    bad = obs[index][~torch.isfinite(obs[index])].reshape(-1)[0].item()
    raise EnvError(env_id, ObservationError(
        f"env {env_id!r} returned a non-finite observation ({bad}) from env {index} of {obs.shape[0]} at its step "
        f"{step}; observation normalization (normalize_obs) cannot take it: fix the env (or drop normalize_obs), "
        "then continue the run with --resume"), "step" if step else "reset")


class EnvFault(RuntimeError):
    """An env call that did not return: its worker hung or died (message: which, in which call)."""


class EnvCodeError(RuntimeError):
    """What a Python env raised, carried out of a vector env's worker process: ``kind`` (the exception's type name),
    ``message`` (its first line) and ``trace`` (its traceback through the env's own code, formatted where it was
    raised). Gymnasium's AsyncVectorEnv re-raises a worker's exception as ``type(e)(e)``, so building one from
    another copies it."""

    def __init__(self, message="", kind: str = "", trace: str = ""):
        if isinstance(message, EnvCodeError):
            message, kind, trace = message.message, message.kind, message.trace
        super().__init__(message)
        self.message, self.kind, self.trace = str(message), kind, trace

    @classmethod
    def from_exception(cls, error: BaseException) -> EnvCodeError:
        skipped = (os.path.dirname(gymnasium.__file__), os.path.dirname(os.path.dirname(__file__)))
        frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith(skipped)]
        trace = "".join(traceback.format_list(frames)) + "".join(traceback.format_exception_only(type(error), error))
        return cls(first_line(error, "?"), type(error).__name__, "Traceback (most recent call last, the env's code):\n" + trace)


class EnvError(UserError):
    """The user's env raised ``error`` inside ``call`` (``reset`` or ``step``), hung or lost its worker. The run loop
    stops the run as a stop signal would (final checkpoint, summary.json's ``stopped_by_error``); the command line
    then shows the env's own traceback (``trace``, if it raised) and this one line."""

    def __init__(self, env_id: str, error: BaseException, call: str):
        self.env_id, self.error, self.call = env_id, error, call
        self.trace = getattr(error, "trace", "")
        if isinstance(error, ObservationError):
            message = str(error)
        elif isinstance(error, EnvFault):
            message = f"env {env_id!r}: {error}, then continue the run with --resume"
        else:
            kind = getattr(error, "kind", "") or type(error).__name__
            message = (f"env {env_id!r} raised {kind} in {call}(): {first_line(error, '?')}; fix the env (its traceback is above), "
                       "then continue the run with --resume")
        super().__init__(message)


ERROR_BYTES = 4096


def write_env_error(buffer, error: EnvError) -> None:
    """``error`` as JSON bytes in ``buffer`` (a shared uint8 tensor ``[ERROR_BYTES]``, zero-padded; the trace cut to
    fit): how an IMPALA/APPO actor hands its env's error to the learner."""
    record = {"env": error.env_id, "call": error.call, "kind": getattr(error.error, "kind", "") or
              type(error.error).__name__, "message": getattr(error.error, "message", str(error.error)),
              "fault": isinstance(error.error, EnvFault), "trace": error.trace}
    data = json.dumps(record).encode()
    if len(data) > ERROR_BYTES:
        record["trace"] = record["trace"][-(ERROR_BYTES // 2):]
        data = json.dumps(record).encode()[:ERROR_BYTES]
    buffer.zero_()
    buffer[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)


def read_env_error(buffer) -> EnvError | None:
    """The EnvError an actor wrote with ``write_env_error`` (None if none, or unreadable)."""
    try:
        record = json.loads(bytes(buffer.numpy()).rstrip(b"\0").decode())
        error = EnvFault(record["message"]) if record["fault"] else EnvCodeError(record["message"], record["kind"],
                                                                                   record["trace"])
        return EnvError(record["env"], error, record["call"])
    except (ValueError, KeyError, TypeError):
        return None


def watched_vector_env(env_fns: list, in_process: bool, timeout_s: float, **kwargs):
    """The vector env over ``env_fns``: in this process (``WatchedSyncVectorEnv``) or one worker process per env
    (``WatchedAsyncVectorEnv``), every call under the ``timeout_s`` deadline."""
    vector_env = WatchedSyncVectorEnv if in_process else WatchedAsyncVectorEnv
    return vector_env(env_fns, timeout_s, **kwargs)


# --------------------------------------------------------------------------- in this process
class _Expired(BaseException):
    """SIGALRM at the deadline (a BaseException: it passes the env wrappers' ``except Exception``)."""


def _expire(_signum, _frame):
    raise _Expired


class _InProcessCall:
    """The body of an env call in this process: marked as a wait on the env (``fastrl.signals``) and under a deadline
    (SIGALRM raises ``_Expired`` after ``timeout_s``). Only in the main thread, and not where the program uses SIGALRM
    itself. The handler stays installed once set: setting it per call cost as much as a CartPole step."""

    def __init__(self, timeout_s: float):
        self.timeout_s, self.armed = timeout_s, False

    def __enter__(self):
        if threading.get_ident() != _MAIN_THREAD:
            return
        set_waiting(True)
        handler = signal.getsignal(signal.SIGALRM)
        self.armed = bool(self.timeout_s) and handler in (_expire, signal.SIG_DFL)
        if self.armed:
            if handler is signal.SIG_DFL:
                signal.signal(signal.SIGALRM, _expire)
            signal.setitimer(signal.ITIMER_REAL, self.timeout_s)

    def __exit__(self, *_exc):
        if threading.get_ident() == _MAIN_THREAD:
            if self.armed:
                signal.setitimer(signal.ITIMER_REAL, 0)
            set_waiting(False)


class WatchedSyncVectorEnv(gymnasium.vector.SyncVectorEnv):
    """SyncVectorEnv whose ``reset``/``step`` end with an EnvFault past ``timeout_s`` seconds."""

    def __init__(self, env_fns, timeout_s: float, **kwargs):
        self.timeout_s, self._watch = timeout_s, _InProcessCall(timeout_s)
        super().__init__(env_fns, **kwargs)

    def _call(self, name: str, fn, *args, **kwargs):
        try:
            with self._watch:
                return fn(*args, **kwargs)
        except _Expired:
            raise EnvFault(f"{name}() did not return within {self.timeout_s:g} s (env_timeout_s): fix the env (or "
                           "raise env_timeout_s if it is only slow)") from None
        except SystemExit as e:  # the env's code called sys.exit: its error, not the run's end
            raise EnvCodeError.from_exception(e) from None

    def reset(self, *, seed=None, options=None):
        return self._call("reset", super().reset, seed=seed, options=options)

    def step(self, actions):
        return self._call("step", super().step, actions)


# --------------------------------------------------------------------------- worker processes
def _worker(*args, parent_pid: int):
    """Gymnasium's worker loop, with stop signals left to the run, and killed (SIGKILL) by the kernel when the run's
    process dies (Linux), or gone at once if it already has."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the run still kills its workers on every way out it controls
        pass
    if os.getppid() != parent_pid:
        os._exit(0)
    _async_worker(*args)


def _how_it_ended(process) -> str:
    process.join(1.0)
    code = process.exitcode
    if code is None:
        return "is alive"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


class WatchedAsyncVectorEnv(gymnasium.vector.AsyncVectorEnv):
    """AsyncVectorEnv whose ``reset``/``step`` end with an EnvFault past ``timeout_s`` seconds or when a worker
    dies, and whose ``close`` kills (SIGKILL) and reaps workers that cannot close cleanly."""

    def __init__(self, env_fns, timeout_s: float, **kwargs):
        self.timeout_s = timeout_s
        # Forked workers inherit every object of a process that may have run other threads (compile workers,
        # loggers): frozen, those are never traversed by a worker's garbage collector (the gc docs' advice for
        # fork without exec; a worker once crashed collecting them in a long test process).
        gc.freeze()
        try:
            super().__init__(env_fns, worker=functools.partial(_worker, parent_pid=os.getpid()), **kwargs)
        finally:
            gc.unfreeze()

    def reset(self, *, seed=None, options=None):
        self.reset_async(seed=seed, options=options)
        return self._wait("reset", self.reset_wait)

    def step(self, actions):
        self.step_async(actions)
        return self._wait("step", self.step_wait)

    def _wait(self, name: str, wait):
        n = len(self.processes)
        try:
            with waiting_on_env():
                return wait(timeout=self.timeout_s)
        except multiprocessing.TimeoutError:
            silent = [i for i, pipe in enumerate(self.parent_pipes) if pipe is not None and not pipe.poll(0)]
            who = ", ".join(f"{i} (PID {self.processes[i].pid})" for i in silent) or "?"
            self.close(terminate=True)
            raise EnvFault(f"worker{'s' if len(silent) > 1 else ''} {who} of {n} did not answer {name}() within "
                           f"{self.timeout_s:g} s (env_timeout_s); the workers were stopped: fix the env (or raise "
                           "env_timeout_s if it is only slow)") from None
        except (EOFError, BrokenPipeError, ConnectionResetError):
            deadline = time.monotonic() + 2.0  # its pipe closes a moment before the process is reaped
            while all(p.is_alive() for p in self.processes) and time.monotonic() < deadline:
                time.sleep(0.01)
            dead = [(i, p) for i, p in enumerate(self.processes) if not p.is_alive()]
            who = "; ".join(f"worker {i} of {n} (PID {p.pid}) {_how_it_ended(p)}" for i, p in dead)
            self.close(terminate=True)
            raise EnvFault(f"during {name}(), {who or 'a worker died'}: fix the env") from None
        except BaseException:  # a stop signal (fastrl.signals.StopWhileWaiting): the call is abandoned
            self.close(terminate=True)
            raise

    def close_extras(self, timeout=None, terminate: bool = False) -> None:
        if not terminate and self._state == AsyncState.DEFAULT and all(p.is_alive() for p in self.processes):
            try:
                return super().close_extras(timeout=timeout)
            except (EOFError, OSError, multiprocessing.TimeoutError):
                pass  # a worker died while closing: kill the rest below
        for process in self.processes:
            if process.is_alive():
                process.kill()  # SIGKILL: the workers ignore SIGTERM
        for pipe in self.parent_pipes:
            if pipe is not None:
                pipe.close()
        for process in self.processes:
            process.join()

