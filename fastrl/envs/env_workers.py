"""Python (Gymnasium) envs that misbehave without taking the run down: what they raised, a deadline on every call, and
worker processes that never outlive the run.

- ``WorkerGroupsVectorEnv``: the envs in worker processes, one per core (``worker_count``), each stepping its group
  of envs; ``step``/``reset`` wait at most ``timeout_s`` (``env_timeout_s``). A worker that does not answer in time,
  or that died (``os._exit``, an uncaught ``SystemExit``, a signal), ends the call with an ``EnvFault`` naming it,
  and every worker is then killed and reaped. Workers ignore SIGINT, SIGTERM and SIGHUP (a signal to the process
  group reaches the run, which stops them) and are killed by the kernel when the run's process dies
  (``PR_SET_PDEATHSIG``, Linux).
- ``WatchedSyncVectorEnv``: the in-process twin (one env, IMPALA actors): the same deadline, by SIGALRM; a
  ``SystemExit`` from the env's code is an env error like any other.
Both mark their waits (``fastrl.signals.waiting_on_env``), so a stop signal ends a hung call at once.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import multiprocessing
import os
import signal
import threading
import time
import traceback

import gymnasium
import numpy as np
import torch

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
    raised)."""

    def __init__(self, message="", kind: str = "", trace: str = ""):
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
def worker_count(n_envs: int) -> int:
    """How many worker processes step ``n_envs`` Python envs: one per core, at most one per env. Each steps its group
    of envs one after another (a SyncVectorEnv) and answers once per call for all of them: a population's K x n_envs
    cheap envs cost one pipe round trip per core and step, not one per env. Figure (``python -m benchmarks.population
    --ks 1 4 --envs benchmarks.masking:MaskedChoice``, 8 envs a member, 16k steps a member; 2-core AMD EPYC,
    2026-12-07): process 13.9 s (K = 1) and 40.0 s (K = 4) with one worker per env (Gymnasium's AsyncVectorEnv), 10.5
    and 17.4 s in worker groups. Every env in the run's process would be faster still for so cheap an env (training
    4.7 s and 8.8 s against 6.9 s and 12.9 s: each step's results cross a pipe, pickled), but slower for costly ones,
    and an env that dies would take the run with it."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(n_envs, cores))


def _worker(env_fns: list, pipe, parent_pipe, parent_pid: int):
    """One worker's loop over its group of envs: ``(command, data)`` in, ``("ok", result)`` or ``("error",
    (exception class, message, kind, trace))`` out. Stop signals are left to the run; the kernel kills it (SIGKILL)
    when the run's process dies (Linux), and it is gone at once if that already happened. An env's ``SystemExit``
    ends the worker with its exit code, as Gymnasium's workers end."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    # Not Linux (no prctl): the run still kills its workers on every way out it controls.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        os._exit(0)
    parent_pipe.close()
    envs = None
    while True:
        command, data = ("build", None) if envs is None else pipe.recv()
        try:
            if command == "build":
                envs = gymnasium.vector.SyncVectorEnv(env_fns, autoreset_mode=gymnasium.vector.AutoresetMode.NEXT_STEP)
                result = (envs.single_observation_space, envs.single_action_space, envs.metadata)
            elif command == "close":
                envs.close()
                pipe.send(("ok", None))
                return
            else:
                result = getattr(envs, command)(*data[0], **data[1])
        except Exception as e:  # noqa: BLE001 -- the env's error, for the run to report
            if not isinstance(e, (EnvCodeError, ObservationError, UserError)):
                e = EnvCodeError.from_exception(e)  # the user's own exception class may not unpickle in the run
            pipe.send(("error", (type(e), str(e), getattr(e, "kind", ""), getattr(e, "trace", ""))))
            return
        pipe.send(("ok", result))


def _how_it_ended(process) -> str:
    process.join(1.0)
    code = process.exitcode
    if code is None:
        return "is alive"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _concatenate(parts: list, sizes: list):
    """The groups' batched results as one batch: arrays joined on axis 0, dicts (Dict observations, infos) key by
    key, tuples item by item; an info key a group lacks is zeros there (False in its ``_key`` mask)."""
    first = next(p for p in parts if p is not None)
    if isinstance(first, dict):
        keys = list(dict.fromkeys(k for p in parts if p is not None for k in p))
        return {k: _concatenate([p.get(k) if p is not None else None for p in parts], sizes) for k in keys}
    if isinstance(first, tuple):
        return tuple(_concatenate([p[i] for p in parts], sizes) for i in range(len(first)))
    first = np.asarray(first)
    return np.concatenate([np.asarray(p) if p is not None else np.zeros((n, *first.shape[1:]), first.dtype)
                           for p, n in zip(parts, sizes)])


class WorkerGroupsVectorEnv(gymnasium.vector.VectorEnv):
    """``env_fns``' envs in ``worker_count`` worker processes, each stepping its consecutive group of them (Gymnasium's
    next-step autoreset); ``reset``/``step`` end with an EnvFault past ``timeout_s`` seconds or when a worker dies,
    and ``close`` kills (SIGKILL) and reaps workers that cannot close cleanly."""

    def __init__(self, env_fns, timeout_s: float, context: str | None = None, **_gymnasium_kwargs):
        self.timeout_s, self.num_envs = timeout_s, len(env_fns)
        bounds = np.linspace(0, self.num_envs, worker_count(self.num_envs) + 1).round().astype(int).tolist()
        self.groups = list(zip(bounds[:-1], bounds[1:]))  # each worker's envs: [start, end)
        self.sizes = [b - a for a, b in self.groups]
        ctx = multiprocessing.get_context(context)
        self.pipes, self.processes, self.closed = [], [], False
        # Forked workers inherit every object of a process that may have run other threads (compile workers,
        # loggers): frozen, those are never traversed by a worker's garbage collector (the gc docs' advice for
        # fork without exec; a worker once crashed collecting them in a long test process).
        gc.freeze()
        try:
            for a, b in self.groups:
                parent_pipe, child_pipe = ctx.Pipe()
                process = ctx.Process(target=_worker, args=(env_fns[a:b], child_pipe, parent_pipe, os.getpid()),
                                      daemon=True)
                process.start()
                child_pipe.close()
                self.pipes.append(parent_pipe)
                self.processes.append(process)
        finally:
            gc.unfreeze()
        self.single_observation_space, self.single_action_space, self.metadata = self._receive("make")[0]
        self.observation_space = gymnasium.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gymnasium.vector.utils.batch_space(self.single_action_space, self.num_envs)

    def reset(self, *, seed=None, options=None):
        seeds = seed if isinstance(seed, list) else [None if seed is None else seed + i for i in range(self.num_envs)]
        groups = self._split(seeds)
        return self._call_all("reset", [((), {"seed": list(g), "options": options}) for g in groups])

    def step(self, actions):
        return self._call_all("step", [((a,), {}) for a in self._split(actions)])

    def get_attr(self, name: str) -> tuple:
        return sum(self._call_all_raw("get_attr", [((name,), {})] * len(self.pipes)), ())

    def _split(self, items) -> list:
        return [items[a:b] for a, b in self.groups]

    def _call_all(self, name: str, args: list):
        return _concatenate(self._call_all_raw(name, args), self.sizes)

    def _call_all_raw(self, name: str, args: list) -> list:
        for pipe, arg in zip(self.pipes, args):
            pipe.send((name, arg))
        return self._receive(name)

    def _receive(self, name: str) -> list:
        """Every worker's answer to the call ``name``, within one ``timeout_s`` deadline for all of them."""
        n, results, error = len(self.pipes), [], None
        deadline = time.monotonic() + self.timeout_s
        try:
            with waiting_on_env():
                for pipe in self.pipes:
                    if not pipe.poll(max(0.0, deadline - time.monotonic())):
                        raise multiprocessing.TimeoutError
                    status, result = pipe.recv()
                    if status == "error" and error is None:
                        cls, message, kind, trace = result
                        error = EnvCodeError(message, kind, trace) if cls is EnvCodeError else cls(message)
                    results.append(result)
        except multiprocessing.TimeoutError:
            silent = [i for i, pipe in enumerate(self.pipes) if not pipe.poll(0)]
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
        if error is not None:
            self.close(terminate=True)
            raise error
        return results

    def close(self, terminate: bool = False, **_kwargs) -> None:
        if self.closed:
            return
        self.closed = True
        if not terminate:
            with contextlib.suppress(EOFError, OSError):  # a worker died while closing: kill the rest below
                for pipe in self.pipes:
                    pipe.send(("close", None))
                for pipe in self.pipes:
                    if pipe.poll(self.timeout_s or None):
                        pipe.recv()
        for process in self.processes:
            process.join(0 if terminate else 1.0)
            if process.is_alive():
                process.kill()  # SIGKILL: the workers ignore SIGTERM
        for pipe in self.pipes:
            pipe.close()
        for process in self.processes:
            process.join()
