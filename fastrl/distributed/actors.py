"""IMPALA / APPO actors: actor processes and a shared-memory ring of rollout slots (the learner that reads them:
``fastrl.run.actor_learner``).

Roles
- Actors (``n_actors`` processes, started with ``spawn``) each own an env batch of ``N = n_envs / n_actors`` (the
  run's ``n_envs`` counts the envs of all actors together) and a CPU copy of the policy (1 torch thread). They fill
  ``[n_steps, N]`` rollouts straight into shared-memory slots (no pickling per step) and record the policy version
  that acted.
- The learner (this process) takes full slots oldest-first, copies them into its ``[T, learner_batch * N]``
  batch, frees them at once (so actors refill while it learns), and updates its flat weights through the pure
  update (``fastrl.learn.update.Update``: V-trace, the IMPALA or APPO loss, the optimizer math). Every ``sync_interval``
  updates it publishes the weights; actors pull them before their next rollout.

Why ``spawn``: the learner has already started torch's OpenMP pool (and, for evaluation, EnvPool thread
pools) when actors are (re)started; ``fork`` would copy those half-locked pools into the child and can
deadlock. ``forkserver`` would work too but leaves one more long-lived process to clean up on SIGTERM.
Spawned children start from a fresh interpreter (~2 s to import torch), which only matters on restart.

Why no multiprocessing queues or locks: a SIGKILLed actor can die holding a queue's or lock's internal
semaphore and wedge everyone else. Every shared word here has a single writer instead:
- slot ``state`` (FREE -> FILLING -> FULL by the slot's owning actor, FULL -> FREE by the learner); each
  actor owns ``n_slots / n_actors`` slots, so actors never contend. A dead actor's FILLING slots are
  reclaimed by the learner, its FULL ones are still trained on.
- weights: a flat float32 tensor behind a seqlock written only by the learner; an actor copies it and
  retries if the sequence number moved. A dying reader can wedge nothing.
Waiting is polling with sub-millisecond sleeps: cheap at these rates and immune to lost wake-ups.
(Plain stores ordered by program order suffice on x86 and with CPython's calls as compiler barriers.)

The slot interface (``SlotRing.acquire / commit`` for an actor, ``full_slots / release`` for the learner)
is all an actor needs: with ``--actors ray`` (``fastrl.distributed.ray_actors``) actors on other hosts run the same
``RolloutCollector`` and the learner commits their rollouts into its own ring, which ``gather`` reads as it reads
the local actors' slots.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import time
import warnings

import numpy as np
import torch
import torch.multiprocessing as tmp

from fastrl.config import Config, UserError
from fastrl.distributed.async_collect import GroupedRollout, RolloutViews, Timer
from fastrl.distributed.seeding import actor_env_seed, derived_seed
from fastrl.envs.async_env import make_async_env, resolve_env_mode
from fastrl.envs.batched import make_env
from fastrl.envs.buffers import make_rollout_buffer
from fastrl.envs.env_workers import ERROR_BYTES, EnvError, EnvFault, read_env_error, write_env_error
from fastrl.envs.stats import EpisodeStats
from fastrl.learn.models import make_agent

START_METHOD = "spawn"
# The exit status of a spawned child that reached fastrl.train() while importing the parent's script (a script
# without a main guard); see fastrl.api.refuse_in_spawned_child.
NO_MAIN_GUARD_EXIT = 86
FREE, FILLING, FULL = 0, 1, 2
# control words (int64, learner-written): stop flag, weights seqlock counter, published policy version
STOP, SEQ, VERSION = 0, 1, 2
# per-actor statistics (float64, actor-written): env steps, rollouts, seconds waiting for a free slot,
# seconds in env.step, seconds in the policy forward, a heartbeat (monotonic time of the last sign of life: every
# env step and every poll while waiting; the pool sets it when it starts the actor)
A_STEPS, A_ROLLOUTS, A_WAIT, A_ENV, A_POLICY, A_BEAT = range(6)
POLL_S = 0.0005
STARTUP_GRACE_S = 120.0  # an actor that has not yet sent its first heartbeat gets this long to start
# A failed actor restarts after RESTART_BACKOFF_S, doubling with each failure in a row of the same kind (at most
# MAX_RESTART_BACKOFF_S); SAME_FAILURES_TO_STOP such failures in a row end the run as an env error.
RESTART_BACKOFF_S, MAX_RESTART_BACKOFF_S, SAME_FAILURES_TO_STOP = 0.5, 30.0, 3
ENV_ERROR_EXIT = 87  # an actor whose env failed exits with this, its error in ActorPool.errors


# ---------------------------------------------------------------------------------------------- slots
class _NumpyViews:
    """Keeps ``*_np`` numpy views of its shared tensors (``_np()`` makes them): pickled without them, a spawned actor
    makes its own."""

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if not k.endswith("_np")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._np()


class SlotRing(_NumpyViews):
    """``n_slots`` preallocated ``[T, N]`` rollouts in shared memory and their per-slot bookkeeping.

    ``rollout`` is a TensorDict ``[K, T, N]`` with the TorchRL keys of ``make_rollout_buffer`` (``state_size``: a
    recurrent policy's, with its ``episode_start`` and ``recurrent_state``);
    ``bootstrap_observation [K, N, *obs]`` is obs[T], the observation after the last step.
    ``episode_return`` / ``episode_length [K, E]`` and ``n_episodes [K]``: the episodes the actor's env finished
    during the slot's rollout, as its ``EpisodeStats`` counts them (Atari: the real game score over all lives);
    the last ``min(n, E)`` are kept, ``E`` = the statistics window.
    ``version [K]``: the policy version that produced the slot. ``full_time [K]``: monotonic time it was committed.
    """

    def __init__(self, n_slots: int, n_actors: int, n_steps: int, n_envs: int, obs_shape: tuple,
                 obs_dtype: torch.dtype, action_spec, episode_capacity: int = 100, shared: bool = True,
                 state_size: int = 0):
        def place(t: torch.Tensor):  # shared memory for actor processes; the learner's own memory for Ray's results
            return t.share_memory_() if shared else t
        one = make_rollout_buffer(n_steps, n_envs, obs_shape, obs_dtype, action_spec,
                                  state_size=state_size).exclude("advantage", "value_target")
        self.rollout = place(one.expand(n_slots, n_steps, n_envs).clone())
        self.bootstrap_observation = place(torch.zeros(n_slots, n_envs, *obs_shape, dtype=obs_dtype))
        self.episode_return = place(torch.zeros(n_slots, episode_capacity, dtype=torch.float64))
        self.episode_length = place(torch.zeros(n_slots, episode_capacity, dtype=torch.int64))
        self.n_episodes = place(torch.zeros(n_slots, dtype=torch.int64))
        self.state = place(torch.zeros(n_slots, dtype=torch.int64))
        self.version = place(torch.zeros(n_slots, dtype=torch.int64))
        self.full_time = place(torch.zeros(n_slots, dtype=torch.float64))
        self.n_slots, self.n_actors = n_slots, n_actors
        self.per_actor = n_slots // n_actors
        self._np()

    def _np(self):
        self.state_np, self.version_np, self.time_np = self.state.numpy(), self.version.numpy(), self.full_time.numpy()

    def owned(self, actor_id: int) -> range:
        return range(actor_id * self.per_actor, (actor_id + 1) * self.per_actor)

    # actor side
    def acquire(self, slot: int) -> bool:
        """Claim ``slot`` (one of the caller's own) if the learner has freed it."""
        if self.state_np[slot] != FREE:
            return False
        self.state_np[slot] = FILLING
        return True

    def commit(self, slot: int, version: int) -> None:
        self.version_np[slot] = version
        self.time_np[slot] = time.monotonic()
        self.state_np[slot] = FULL  # last: the learner reads the data only after seeing FULL

    # learner side
    def full_slots(self) -> np.ndarray:
        """Indices of the full slots, oldest first."""
        full = np.flatnonzero(self.state_np == FULL)
        return full[np.argsort(self.time_np[full], kind="stable")] if full.size > 1 else full

    def release(self, slot: int) -> None:
        self.state_np[slot] = FREE

    def reclaim(self, actor_id: int) -> int:
        """Free a dead actor's half-written slots (its full ones are still good data). Returns how many."""
        owned = self.state_np[actor_id * self.per_actor:(actor_id + 1) * self.per_actor]  # a view
        filling = owned == FILLING
        owned[filling] = FREE
        return int(filling.sum())


def _flat_tensors(agent) -> list:
    return list(agent.parameters()) + [b for b in agent.buffers() if b.is_floating_point()]


class WeightBoard(_NumpyViews):
    """The learner's latest weights as one flat float32 shared tensor behind a single-writer seqlock."""

    def __init__(self, agent):
        n = sum(t.numel() for t in _flat_tensors(agent))
        self.flat = torch.zeros(n, dtype=torch.float32).share_memory_()
        self.control = torch.zeros(3, dtype=torch.int64).share_memory_()
        self._np()

    def _np(self):
        self.control_np = self.control.numpy()

    def publish(self, agent, version: int) -> None:
        c = self.control_np
        c[SEQ] += 1  # odd: write in progress
        self.flat.copy_(flat_weights(agent))
        c[VERSION] = version
        c[SEQ] += 1

    def seq(self) -> int:
        return int(self.control_np[SEQ])

    def pull(self, agent) -> tuple[int, int]:
        """Copy the published weights into ``agent``; returns ``(version, seq)`` of a consistent read."""
        c = self.control_np
        while True:
            seq = int(c[SEQ])
            if seq % 2:
                time.sleep(POLL_S)
                continue
            load_flat_weights(agent, self.flat)
            version = int(c[VERSION])
            if int(c[SEQ]) == seq:
                return version, seq

    @property
    def stop_requested(self) -> bool:
        return bool(self.control_np[STOP])


# ---------------------------------------------------------------------------------------------- actor
def copy_new_episodes(stats: EpisodeStats, seen: int, returns: torch.Tensor, lengths: torch.Tensor) -> int:
    """Copy the episodes ``stats`` finished after its first ``seen`` into ``returns`` / ``lengths [E]``.

    Keeps the last ``min(new, E, window)`` (oldest first) and returns ``new``, the number finished.
    """
    new = stats.count - seen
    recent_returns, recent_lengths = stats.recent(min(new, returns.numel()))
    returns[:len(recent_returns)].copy_(recent_returns)
    lengths[:len(recent_lengths)].copy_(recent_lengths)
    return new


def load_flat_weights(agent, flat: torch.Tensor) -> None:
    """Copy a flat float32 vector (``WeightBoard``'s layout: parameters, then float buffers) into ``agent``."""
    tensors = _flat_tensors(agent)
    with torch.no_grad():
        for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
            t.copy_(part.view_as(t))


def flat_weights(agent) -> torch.Tensor:
    """``agent``'s weights as one new flat float32 CPU vector (the layout ``load_flat_weights`` reads)."""
    return torch.cat([t.detach().reshape(-1).float().cpu() for t in _flat_tensors(agent)])


class RolloutCollector:
    """One actor's envs and CPU policy copy, filling ``[T, N]`` rollouts: the collection code of every actor, a local
    process (``actor_main``) or a Ray actor (``fastrl.distributed.ray_actors``).

    Builds the env batch of ``n_envs / n_actors`` (seeded by ``actor_env_seed``) and the policy (1 torch thread, no
    grad).
    ``collect`` runs one rollout into ``RolloutViews``; with ``env_mode`` async the views are filled by
    ``GroupedRollout`` (two env groups, one stepping while the policy acts on the other), per env the transitions the
    sync loop would write. Per env step: one policy forward, one env step, slice writes and a ``heartbeat()``; no
    .item(), no per-env Python loop, no allocation of buffers. Episode statistics are the env's own (``env.stats``).

    A recurrent policy (sync env mode) carries ``sequence = (state [N, S], episode_start [N])`` across steps and
    rollouts, zeroing a row's state where its episode starts (``fastrl.run.recurrent``'s rule: after a reset step),
    and writes each rollout's start state and episode starts into the views, for the learner's unroll.
    """

    def __init__(self, cfg: Config, actor_id: int, restart: int):
        torch.set_num_threads(1)
        warnings.filterwarnings("ignore", message=".*precision lowered by casting.*")  # EnvPool's Box spaces, once
        torch.manual_seed(derived_seed(cfg.seed, "actor", 0, actor_id + restart * cfg.n_actors))
        env_cfg = dataclasses.replace(cfg, env_threads=cfg.env_threads or 1)
        n_envs = cfg.n_envs_per_actor
        seed = actor_env_seed(cfg.seed, actor_id, restart, cfg.n_actors, n_envs)
        self.grouped, self.timer = None, Timer()
        if resolve_env_mode(cfg, n_envs) == "async":
            self.env = make_async_env(env_cfg, n_envs=n_envs, seed=seed)
            self.grouped = GroupedRollout(self.env.env)
        else:
            self.env = make_env(env_cfg, n_envs=n_envs, seed=seed)
        env = self.env
        self.agent = make_agent(cfg, env.observation_shape, env.action_spec, getattr(env, "obs_scale", None))
        self.agent.requires_grad_(False)
        self.obs = env.reset()
        recurrent = hasattr(self.agent, "state_size")  # freshly reset envs: a zero state, every episode starting
        self.sequence = (self.agent.initial_state(n_envs), torch.ones(n_envs, dtype=torch.bool)) if recurrent else ()

    def collect(self, views: RolloutViews, bootstrap_observation: torch.Tensor, episode_return: torch.Tensor,
                episode_length: torch.Tensor, heartbeat) -> tuple[int, float, float]:
        """Fill ``views`` ``[T, N]`` and ``bootstrap_observation [N, *obs]`` (obs[T]) with the next rollout, and
        ``episode_return`` / ``episode_length [E]`` with the episodes it finished (the last ``min(n, E)``).
        Returns ``(episodes finished, seconds in the policy, seconds in env.step)``."""
        env, agent, obs = self.env, self.agent, self.obs
        seen_episodes = env.stats.count
        with torch.no_grad():
            if self.grouped is not None:  # the same [T, N] rollout, filled group by group (fastrl/distributed/async_collect.py)
                obs = self.grouped.run(views, obs, agent.get_action_and_value, agent.get_value, self.timer, heartbeat)
            else:
                sequence = self.sequence
                if sequence:
                    views.recurrent_state.copy_(sequence[0].expand_as(views.recurrent_state))
                for t in range(views.observation.shape[0]):
                    with self.timer.section("policy"):
                        if sequence:
                            views.episode_start[t].copy_(sequence[1])
                        action, logp, _, value, *state = agent.get_action_and_value(obs, None, None, *sequence)
                        views.write_policy(t, obs, action, logp, value)
                    with self.timer.section("env"):
                        step = env.step(action)
                    views.write_env(t, step)
                    obs = step.observation
                    sequence = (state[0], ~step.valid) if sequence else ()
                    heartbeat()
                views.next_value[:-1].copy_(views.state_value[1:])  # behaviour values; the learner recomputes its own
                views.next_value[-1].copy_(agent.get_value(obs, *sequence))
                self.sequence = sequence
        seconds = self.timer.pop()
        policy_s, env_s = seconds.get("time/policy_s", 0.0), seconds.get("time/env_s", 0.0)
        bootstrap_observation.copy_(obs)
        self.obs = obs
        return copy_new_episodes(env.stats, seen_episodes, episode_return, episode_length), policy_s, env_s

    def close(self) -> None:
        self.env.close()


def actor_main(actor_id: int, restart: int, cfg: Config, ring: SlotRing, board: WeightBoard,
               stats: torch.Tensor, parent_pid: int, errors: torch.Tensor) -> None:
    """Actor process body: fill own slots with ``[T, N]`` rollouts (``RolloutCollector``) until told to stop or
    orphaned. Before each rollout it pulls the newest published weights, if any came since the last. An error of the
    user's env is handed to the learner (``errors[actor_id]``, see ``write_env_error``) and the actor exits with
    ``ENV_ERROR_EXIT``, printing nothing: the learner decides what the console shows."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C hits the whole group; the learner decides
    try:
        _act(actor_id, restart, cfg, ring, board, stats, parent_pid)
    except EnvError as e:
        write_env_error(errors[actor_id], e)
        raise SystemExit(ENV_ERROR_EXIT) from None


def _act(actor_id: int, restart: int, cfg: Config, ring: SlotRing, board: WeightBoard, stats: torch.Tensor,
         parent_pid: int) -> None:
    stopping = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.__setitem__("now", True))
    collector = RolloutCollector(cfg, actor_id, restart)
    version, seen_seq = board.pull(collector.agent)
    my_stats = stats[actor_id].numpy()
    my_stats[A_BEAT] = time.monotonic()
    slots = list(ring.owned(actor_id))
    views = [RolloutViews.of(ring.rollout[slot]) for slot in slots]  # looked up once

    def heartbeat() -> None:
        my_stats[A_BEAT] = time.monotonic()

    def should_stop() -> bool:
        return stopping["now"] or board.stop_requested or os.getppid() != parent_pid

    turn = 0
    try:
        while not should_stop():
            slot = slots[turn % len(slots)]
            wait_start = time.perf_counter()
            while not ring.acquire(slot):
                if should_stop():
                    return
                heartbeat()
                time.sleep(POLL_S)
            my_stats[A_WAIT] += time.perf_counter() - wait_start
            if board.seq() != seen_seq:
                version, seen_seq = board.pull(collector.agent)
            ring.n_episodes[slot], policy_s, env_s = collector.collect(
                views[turn % len(slots)], ring.bootstrap_observation[slot], ring.episode_return[slot],
                ring.episode_length[slot], heartbeat)
            ring.commit(slot, version)
            my_stats[A_STEPS] += cfg.n_steps * cfg.n_envs_per_actor
            my_stats[A_ROLLOUTS] += 1
            my_stats[A_ENV] += env_s
            my_stats[A_POLICY] += policy_s
            turn += 1
    finally:
        collector.close()


# ---------------------------------------------------------------------------------------------- pool
class ActorPool:
    """Starts the actors, restarts any that die or hang, and stops them all (no orphans).

    A hung actor (alive but silent: its heartbeat older than ``cfg.actor_timeout_s``; e.g. stopped, or stuck in
    an env) is killed and restarted like a dead one; its half-written slots are reclaimed.
    """

    def __init__(self, cfg: Config, ring: SlotRing, board: WeightBoard, max_restarts: int | None = None):
        self.cfg, self.ring, self.board = cfg, ring, board
        self.ctx = tmp.get_context(START_METHOD)
        self.stats = torch.zeros(cfg.n_actors, 6, dtype=torch.float64).share_memory_()
        self.errors = torch.zeros(cfg.n_actors, ERROR_BYTES, dtype=torch.uint8).share_memory_()
        self.failures: list[str] = []  # how each actor that died or hung ended, oldest first
        self.restart_at: list[float | None] = [None] * cfg.n_actors  # a failed actor's restart time (backing off)
        self.procs: list = [None] * cfg.n_actors
        self.incarnation = [0] * cfg.n_actors
        self.restarts = 0
        self.hung_restarts = 0
        self.lost_rollouts = 0  # half-written slots of dead or hung actors
        self.started_at = [0.0] * cfg.n_actors
        self.max_restarts = 10 * cfg.n_actors if max_restarts is None else max_restarts
        self._last_check = 0.0

    def _start(self, actor_id: int) -> None:
        proc = self.ctx.Process(target=actor_main, name=f"fastrl-actor-{actor_id}", daemon=True,
                                args=(actor_id, self.incarnation[actor_id], self.cfg, self.ring, self.board,
                                      self.stats, os.getpid(), self.errors))
        self.stats[actor_id, A_BEAT] = 0.0  # no sign of life yet: start-up is judged by STARTUP_GRACE_S
        self.started_at[actor_id] = time.monotonic()
        # Children inherit an ignored SIGINT from birth, so a Ctrl-C during their start-up cannot kill them.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            proc.start()
        finally:
            signal.signal(signal.SIGINT, previous)
        self.procs[actor_id] = proc

    def start(self) -> None:
        for actor_id in range(self.cfg.n_actors):
            self._start(actor_id)

    @property
    def started(self) -> bool:
        return self.procs[0] is not None

    def check(self, every_s: float = 0.2) -> int:
        """Restart dead and hung actors (at most every ``every_s``). Returns how many were restarted now."""
        now = time.monotonic()
        if now - self._last_check < every_s:
            return 0
        self._last_check = now
        restarted = 0
        beats = self.stats[:, A_BEAT].numpy()
        for actor_id, proc in enumerate(self.procs):
            if self.restart_at[actor_id] is not None:  # failed: restarted once its back-off has passed
                if now >= self.restart_at[actor_id]:
                    self.restart_at[actor_id] = None
                    self._start(actor_id)
                    restarted += 1
                continue
            if beats[actor_id] > 0:
                hung = now - beats[actor_id] > self.cfg.actor_timeout_s
            else:  # still starting: a fresh interpreter imports torch and builds its env (seconds, more under load)
                hung = now - self.started_at[actor_id] > max(self.cfg.actor_timeout_s, STARTUP_GRACE_S)
            if proc.exitcode is None and not hung:
                continue
            hung = proc.exitcode is None
            if hung:
                proc.kill()  # SIGKILL ends a stopped (SIGSTOP) process too
                self.hung_restarts += 1
            proc.join()
            if proc.exitcode == NO_MAIN_GUARD_EXIT:
                raise UserError("IMPALA/APPO actors are spawned processes that re-import the calling script, and it "
                                "called fastrl.train() again at import: put the call under "
                                "if __name__ == \"__main__\":")
            env_error = read_env_error(self.errors[actor_id]) if proc.exitcode == ENV_ERROR_EXIT else None
            self.errors[actor_id].zero_()
            how = str(env_error) if env_error else (
                f"hung (no heartbeat for {self.cfg.actor_timeout_s:g} s, actor_timeout_s)" if hung
                else f"exited with code {proc.exitcode}")
            self.failures.append(how)
            streak = len(self.failures) - next((i + 1 for i in range(len(self.failures) - 1, -1, -1)
                                                if self.failures[i] != how), 0)
            if streak >= SAME_FAILURES_TO_STOP or self.restarts >= self.max_restarts:
                why = (f"failed the same way {streak} times in a row" if streak >= SAME_FAILURES_TO_STOP
                       else f"spent the restart budget ({self.max_restarts})")
                if env_error is not None:
                    env_error.args = (f"the IMPALA/APPO actors {why}: {env_error}",)
                    raise env_error
                raise EnvError(self.cfg.env, EnvFault(f"actor {actor_id} {how}; the actors {why}: see the actor's "
                                                      "output above"), "step")
            self.lost_rollouts += self.ring.reclaim(actor_id)
            self.incarnation[actor_id] += 1
            self.restarts += 1
            self.restart_at[actor_id] = now + min(RESTART_BACKOFF_S * 2 ** (streak - 1), MAX_RESTART_BACKOFF_S)
        return restarted

    def log_extras(self, _interval_s: float) -> dict:
        return {}

    def summary_extras(self) -> dict:
        return {}

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask every actor to stop, wait up to ``timeout_s``, then terminate and finally kill stragglers."""
        self.board.control_np[STOP] = 1
        deadline = time.monotonic() + timeout_s
        procs = [proc for proc in self.procs if proc is not None]
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in procs:
            for end in (proc.terminate, proc.kill):
                if proc.exitcode is None:
                    end()
                    proc.join(1.0)
