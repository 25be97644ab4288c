"""IMPALA / APPO actors as Ray actors (``--actors ray``): one learner, the Ray driver, and actors on any node.

Roles
- ``RolloutWorker`` (a Ray actor, placed by ``--actor-resources``, CPU=1 unless given) owns ``n_envs / n_actors`` envs
  and a CPU policy copy and runs the local actors' collection code (``actor_learner.RolloutCollector``: sync or async
  env mode, the env's own episode statistics) into its own ``[T, N]`` rollout, returned as one object per rollout.
- ``RayActorPool`` (in the learner) is ``ActorPool``'s twin behind the same trainer: it keeps ``n_slots / n_actors``
  rollout calls in flight per actor (a slot is a call in flight or a result not yet trained on), collects results
  as they arrive (``ray.wait``) into the learner-side ``SlotRing`` with the weight version that produced them, and
  ``ActorLearnerTrainer.gather`` takes them from there exactly as from the local actors' shared memory: same
  policy-lag bound, drops, statistics and V-trace update.

Weights: each publish is one ``ray.put`` of the flat float32 vector; every actor is told the new reference (a small
message, no copy of the weights per actor) and pulls it from the object store before its next rollout. Each
rollout call also carries the reference newest when it was sent, which a restarted actor (that missed the
messages) starts from. Every rollout records the version it acted with.

Rollouts travel as one object per ``[T, N]`` rollout of an actor's whole env batch: observations in their env dtype
(uint8 frames stay uint8; no float conversion on the actor), numpy arrays that Ray moves out of band (zero-copy
reads from the object store on the learner's node), then one copy into the ring slot. ``object_store_bytes`` in
summary.json counts what arrived; ``benchmarks/ray_actors.py`` measures it.

Faults, each counted in summary.json: a failed call (actor killed, its node stopped) is a lost rollout
(``lost_rollouts``); Ray restarts the actor (``max_restarts=-1``) where its resources are free, or, once a node
with them joins, and the learner resubmits with a back-off meanwhile, going on with the actors it has. An actor
Ray reports dead for good is re-created by the learner. An actor without a result for ``actor_timeout_s`` (while
it had a call in flight; ``STARTUP_GRACE_S`` before its first) is killed and restarted (``hung_actor_restarts``).
``actor_restarts`` counts new actor incarnations that delivered a rollout. A learner crash ends its actors with
it (Ray ties them to their driver); ``--resume`` creates new ones.
"""
from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
import uuid
import warnings

import numpy as np
import torch

from fastrl.config import Config, UserError, parse_resources
from fastrl.errors import first_line
from fastrl.distributed.actors import (A_BEAT, A_ENV, A_POLICY, A_ROLLOUTS, A_STEPS, A_WAIT, STARTUP_GRACE_S,
                                       RolloutCollector, SlotRing, flat_weights, load_flat_weights)
from fastrl.distributed.async_collect import RolloutViews

INSTALL_HINT = 'pip install "fastrl[ray]"'
HEALTH_EVERY_S = 0.2
RETRY_MIN_S, RETRY_MAX_S = 0.5, 5.0  # back-off between calls to an actor that is failing (restarting, no node)
LOOPBACK = ("127.0.0.1", "localhost")
CONNECT_TIMEOUT_S = 5.0


def check_ray(cfg: Config) -> None:
    """``--actors ray`` needs the ``ray`` package (one line saying how to install it) and, given as ``HOST:PORT``, a
    cluster head that answers there (Ray itself would retry for minutes)."""
    if cfg.actors != "ray":
        return
    try:
        import ray  # noqa: F401
    except ImportError:
        raise UserError(f"--actors ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    if cfg.ray_address == "auto":
        return
    host, _, port = cfg.ray_address.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"ray_address={cfg.ray_address!r} is not HOST:PORT (or auto)")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise UserError(f"no Ray cluster answers at {cfg.ray_address} ({e.strerror or e}): start its head there with "
                        "ray start --head, or pass --ray-address auto") from None


class RolloutWorker:
    """The body of one Ray actor (``ray.remote`` is applied by the pool, so this module imports without Ray).

    ``rollout(version, [weights_ref])`` returns one rollout: ``{"data": {key: array [T, N, ...]},
    "bootstrap_observation": [N, *obs], "episode_return" / "episode_length": [k], "n_episodes", "version",
    "incarnation", "node_id", "pid", "policy_s", "env_s", "idle_s"}``.
    """

    def __init__(self, cfg: Config, actor_id: int, restart: int):
        reconstructed, node_id = _actor_context()
        # A Ray restart re-runs this with the same arguments: its envs get seeds of their own all the same.
        restart = restart + (1 + os.getpid() % 10_000) * 1_000 if reconstructed else restart
        self.collector = RolloutCollector(cfg, actor_id, restart)
        env, recurrent = self.collector.env, self.collector.sequence
        # One slot of the learner's ring in this process's memory (a recurrent policy's with its start state and
        # episode starts); its arrays go out as the result.
        self.slot = SlotRing(1, 1, cfg.n_steps, cfg.n_envs_per_actor, env.observation_shape, env.observation_dtype,
                             env.action_spec, shared=False, state_size=recurrent[0].shape[-1] if recurrent else 0)
        self.views = RolloutViews.of(self.slot.rollout[0])
        self.data = {key: tensor.numpy() for key, tensor in self.slot.rollout[0].items(True, True)}
        self.newest = (-1, None)  # (version, ObjectRef) of the newest weights announced
        self.loaded = -1
        self.identity = {"incarnation": uuid.uuid4().hex, "node_id": node_id, "pid": os.getpid(), "actor_id": actor_id}
        self.last_return = None

    def set_weights(self, version: int, refs: list) -> None:
        """Announce weights ``version`` (``refs[0]``, wrapped so that Ray passes the reference, not the array)."""
        if version > self.newest[0]:
            self.newest = (version, refs[0])

    def rollout(self, version: int, refs: list) -> dict:
        start = time.perf_counter()
        self.set_weights(version, refs)
        newest, ref = self.newest
        if newest != self.loaded:
            with warnings.catch_warnings():  # the object store's array is read-only; it is only read from
                warnings.simplefilter("ignore")
                load_flat_weights(self.collector.agent, torch.from_numpy(_fetch(ref)))
            self.loaded = newest
        slot = self.slot
        finished, policy_s, env_s = self.collector.collect(self.views, slot.bootstrap_observation[0],
                                                          slot.episode_return[0], slot.episode_length[0], lambda: None)
        kept = min(finished, slot.episode_return.shape[1])
        idle_s = 0.0 if self.last_return is None else max(0.0, start - self.last_return)
        self.last_return = time.perf_counter()
        return {"data": self.data, "bootstrap_observation": slot.bootstrap_observation[0].numpy(),
                "episode_return": slot.episode_return[0, :kept].numpy(),
                "episode_length": slot.episode_length[0, :kept].numpy(), "n_episodes": finished, "version": self.loaded, "policy_s": policy_s, "env_s": env_s, "idle_s": idle_s,
                **self.identity}


def _actor_context() -> tuple[bool, str]:
    """(whether Ray restarted this actor, the id of the node it runs on)."""
    import ray
    context = ray.get_runtime_context()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated in favour of nothing that says the same
        return context.was_current_actor_reconstructed, context.get_node_id()


def _fetch(ref) -> np.ndarray:
    import ray
    return ray.get(ref)


def connect(cfg: Config) -> bool:
    """Join the Ray cluster at ``cfg.ray_address``; with ``auto`` and none running, start a local one on 127.0.0.1
    that offers ``actor_resources`` to every actor. Returns True if this call connected (so ``stop`` disconnects)."""
    import ray
    if ray.is_initialized():
        return False
    quiet = {"logging_level": "ERROR", "log_to_driver": True, "configure_logging": True}
    address = cfg.ray_address
    if address == "auto":
        with contextlib.suppress(ConnectionError):
            ray.init(address="auto", **quiet)
            return True
        resources = {k: v * cfg.n_actors for k, v in parse_resources(cfg.actor_resources).items()}
        cpus = max(resources.pop("CPU", float(cfg.n_actors)), float(os.cpu_count() or 1))
        resources.pop("GPU", None)
        ray.init(num_cpus=int(np.ceil(cpus)), resources=resources, include_dashboard=False,
                 _node_ip_address="127.0.0.1", **quiet)
        return True
    host = address.rsplit(":", 1)[0]
    try:
        ray.init(address=address, _node_ip_address="127.0.0.1" if host in LOOPBACK else None, **quiet)
    except (ConnectionError, ValueError, RuntimeError) as e:
        raise UserError(f"cannot join the Ray cluster at {address} ({first_line(e, type(e).__name__)}): start it with ray start --head on the "
                        "learner node, or pass --ray-address auto") from None
    return True


def actor_options(cfg: Config) -> dict:
    """``ray.remote`` options of every actor: its resources, restarted by Ray without limit, and a concurrency group
    for rollouts, so that weights announced (the default group) reach the actor while a rollout runs."""
    resources = parse_resources(cfg.actor_resources)
    return {"num_cpus": resources.pop("CPU", 1.0), "num_gpus": resources.pop("GPU", 0.0), "resources": resources,
            "max_restarts": -1, "max_task_retries": 0, "concurrency_groups": {"collect": 1}}


class RayActorPool:
    """``ActorPool``'s twin for Ray actors (see the module docstring); also the trainer's weight board (``publish``).

    The per-actor ``stats`` columns are ``ActorPool``'s (env steps, rollouts, idle seconds, env and policy seconds, a
    heartbeat: the learner's monotonic time of the actor's last result)."""

    def __init__(self, cfg: Config, ring: SlotRing):
        self.cfg, self.ring = cfg, ring
        n = cfg.n_actors
        self.stats = torch.zeros(n, 6, dtype=torch.float64)
        self.handles: list = [None] * n
        self.in_flight: dict = {}  # ObjectRef -> actor id
        self.calls = [0] * n  # calls in flight per actor
        self.created = [0] * n  # actors the learner created per id (seeds their envs)
        self.incarnation = [None] * n
        self.produced = [False] * n  # this incarnation delivered a rollout
        self.last_progress = [0.0] * n
        self.retry_at = [0.0] * n
        self.backoff = [RETRY_MIN_S] * n
        self.failing = [False] * n
        self.nodes: dict = {i: [] for i in range(n)}  # node ids each actor ran on, in order
        self.pids: list = [None] * n  # the process of each actor's newest incarnation (on its node)
        self.restarts = self.hung_restarts = self.lost_rollouts = self.failures = 0
        self.rollouts_received = 0
        self.bytes_received = self.weight_bytes = self.publishes = 0
        self._bytes_logged = 0
        self.weights = None  # (version, ObjectRef) last published
        self.connected = False
        self.started = False
        self._remote = None
        self._last_health = 0.0

    # ------------------------------------------------------------------ weights
    def publish(self, agent, version: int) -> None:
        """One ``ray.put`` of the weights, announced to every actor."""
        import ray
        self._connect()
        flat = flat_weights(agent).numpy()
        self.weights = (version, ray.put(flat))
        self.weight_bytes += flat.nbytes
        self.publishes += 1
        for handle in self.handles:
            if handle is not None:
                handle.set_weights.remote(version, [self.weights[1]])

    # ------------------------------------------------------------------ life cycle
    def _connect(self) -> None:
        if self._remote is not None:
            return
        import ray
        self.connected = connect(self.cfg)
        total = ray.cluster_resources()
        missing = [k for k in parse_resources(self.cfg.actor_resources) if k not in ("CPU", "GPU") and k not in total]
        if missing:
            self.stop()
            raise UserError(f"no node of the Ray cluster at {self.cfg.ray_address} offers the resource {missing[0]!r} "
                            f"that --actor-resources asks for: start actor nodes with ray start --address=... "
                            f"--resources='{{\"{missing[0]}\": N}}', or change --actor-resources")
        self._remote = ray.remote(**actor_options(self.cfg))(RolloutWorker)

    def _create(self, actor_id: int) -> None:
        self.handles[actor_id] = self._remote.remote(self.cfg, actor_id, self.created[actor_id])
        self.created[actor_id] += 1
        self.produced[actor_id] = False
        self.last_progress[actor_id] = time.monotonic()  # its first rollout call carries the newest weights

    def start(self) -> None:
        self._connect()
        for actor_id in range(self.cfg.n_actors):
            self._create(actor_id)
        self.started = True
        self._submit()

    def stop(self) -> None:
        """Kill the actors (idempotent) and disconnect if this pool connected."""
        import ray
        if self.started or self._remote is not None:
            for handle in self.handles:
                if handle is not None:
                    with contextlib.suppress(Exception):  # already gone (its node stopped): nothing left to kill
                        ray.kill(handle, no_restart=True)
            self.handles = [None] * self.cfg.n_actors
            self.in_flight.clear()
            self.calls = [0] * self.cfg.n_actors
            self.started = False
        if self.connected:
            ray.shutdown()
            self.connected = False
        self._remote = None

    # ------------------------------------------------------------------ the learner's poll
    def check(self, every_s: float = HEALTH_EVERY_S, wait_s: float = 0.0) -> int:
        """Take finished rollouts into the ring, resubmit, and (every ``every_s``) restart hung actors. Waits up to
        ``wait_s`` for a result when none is ready (the learner's gather polls). Returns the actors restarted now."""
        if not self.started:
            return 0
        import ray
        if self.in_flight:
            ready, _ = ray.wait(list(self.in_flight), num_returns=len(self.in_flight), timeout=wait_s,
                                fetch_local=True)
            for ref in ready:
                actor_id = self.in_flight.pop(ref, None)
                if actor_id is not None:  # else a call of an actor replaced meanwhile, already counted lost
                    self.calls[actor_id] -= 1
                    self._receive(ref, actor_id)
        restarted = 0
        now = time.monotonic()
        if now - self._last_health >= every_s:
            self._last_health = now
            restarted = self._restart_hung(now)
        self._submit()
        return restarted

    def _submit(self) -> None:
        now = time.monotonic()
        version, ref = self.weights
        for actor_id in range(self.cfg.n_actors):
            calls = self.calls[actor_id]
            if self.failing[actor_id]:  # one probe at a time until it answers again, each after its back-off
                if calls == 0 and now >= self.retry_at[actor_id]:
                    self._call(actor_id, version, ref)
                    self.retry_at[actor_id] = now + self.backoff[actor_id]
                continue
            in_ring = np.count_nonzero(self.ring.state_np[self.ring.owned(actor_id)])  # results not yet trained on
            for _ in range(self.ring.per_actor - calls - in_ring):
                self._call(actor_id, version, ref)

    def _call(self, actor_id: int, version: int, ref) -> None:
        call = self.handles[actor_id].rollout.options(concurrency_group="collect").remote(version, [ref])
        self.in_flight[call] = actor_id
        self.calls[actor_id] += 1

    def _receive(self, ref, actor_id: int) -> None:
        import ray
        try:  # a RayTaskError (a bug in the actor's code) propagates: its traceback, not a fault to ride out
            result = ray.get(ref)
        # ObjectLostError: finished, but its node went before the learner fetched it
        except (ray.exceptions.ObjectLostError, ray.exceptions.RayActorError) as e:
            if getattr(e, "actor_init_failed", False):  # its env or model cannot be built there: not a fault to ride out
                raise RuntimeError(f"ray actor {actor_id} failed to start: {e}") from None
            self._failed(actor_id, e)
            return
        now = time.monotonic()
        self.failing[actor_id], self.backoff[actor_id] = False, RETRY_MIN_S
        if result["incarnation"] != self.incarnation[actor_id]:
            if self.incarnation[actor_id] is not None:
                self.restarts += 1
            self.incarnation[actor_id] = result["incarnation"]
            self.nodes[actor_id].append(result["node_id"])
            self.pids[actor_id] = result["pid"]
            print(f"fastrl: ray actor {actor_id} runs on node {result['node_id'][:12]} (pid {result['pid']})",
                  file=sys.stderr)
        self.produced[actor_id] = True
        self.last_progress[actor_id] = now
        self._deliver(actor_id, result)

    def _deliver(self, actor_id: int, result: dict) -> None:
        """Copy one rollout into a free slot of ``actor_id``'s and commit it with its weight version."""
        ring = self.ring
        slot = next(s for s in ring.owned(actor_id) if ring.acquire(s))
        nbytes = 0
        rollout = ring.rollout[slot]
        for key, array in result["data"].items():
            np.copyto(rollout.get(key).numpy(), array)
            nbytes += array.nbytes
        np.copyto(ring.bootstrap_observation[slot].numpy(), result["bootstrap_observation"])
        kept = len(result["episode_return"])
        ring.episode_return[slot, :kept] = torch.from_numpy(np.array(result["episode_return"]))
        ring.episode_length[slot, :kept] = torch.from_numpy(np.array(result["episode_length"]))
        ring.n_episodes[slot] = result["n_episodes"]
        ring.commit(slot, result["version"])
        self.rollouts_received += 1
        self.bytes_received += nbytes + result["bootstrap_observation"].nbytes
        row = self.stats[actor_id]
        row[A_STEPS] += self.cfg.n_steps * self.cfg.n_envs_per_actor
        row[A_ROLLOUTS] += 1
        row[A_WAIT] += result["idle_s"]
        row[A_ENV] += result["env_s"]
        row[A_POLICY] += result["policy_s"]
        row[A_BEAT] = time.monotonic()

    def _failed(self, actor_id: int, error: Exception) -> None:
        """A call that will never return a rollout: count it; let Ray restart the actor, or re-create one Ray reports
        dead for good; back off before the next call."""
        import ray
        self.lost_rollouts += 1
        now = time.monotonic()
        if not self.failing[actor_id]:
            self.failures += 1
            if self.failures > 10 * self.cfg.n_actors:
                raise RuntimeError(f"ray actors failed {self.failures} times (the budget is 10 per actor); the last: "
                                   f"{first_line(error, type(error).__name__)}")
            self.failing[actor_id] = True
            self.backoff[actor_id] = RETRY_MIN_S
            self.produced[actor_id] = False  # the next incarnation gets the start-up grace
            self.last_progress[actor_id] = now
        else:
            self.backoff[actor_id] = min(2 * self.backoff[actor_id], RETRY_MAX_S)
        self.retry_at[actor_id] = now + self.backoff[actor_id]
        if isinstance(error, ray.exceptions.ActorDiedError):  # dead for good (unavailable: Ray is restarting it)
            self._replace(actor_id)

    def _replace(self, actor_id: int) -> None:
        import ray
        with contextlib.suppress(Exception):
            ray.kill(self.handles[actor_id], no_restart=True)
        for ref in [r for r, a in self.in_flight.items() if a == actor_id]:
            del self.in_flight[ref]
            self.lost_rollouts += 1
        self.calls[actor_id] = 0
        self._create(actor_id)

    def _restart_hung(self, now: float) -> int:
        """Kill (Ray restarts them) the actors with a call in flight and no result for too long."""
        import ray
        restarted = 0
        for actor_id in (a for a, calls in enumerate(self.calls) if calls):
            limit = self.cfg.actor_timeout_s if self.produced[actor_id] else max(self.cfg.actor_timeout_s,
                                                                                  STARTUP_GRACE_S)
            if now - self.last_progress[actor_id] <= limit:
                continue
            print(f"fastrl: ray actor {actor_id} made no progress for {now - self.last_progress[actor_id]:.0f} s; "
                  "restarting it", file=sys.stderr)
            self.hung_restarts += 1
            self.last_progress[actor_id] = now
            self.produced[actor_id] = False
            try:
                ray.kill(self.handles[actor_id], no_restart=False)
            except Exception:
                self._replace(actor_id)
            restarted += 1
        return restarted

    # ------------------------------------------------------------------ figures
    def log_extras(self, interval_s: float) -> dict:
        delta, self._bytes_logged = self.bytes_received - self._bytes_logged, self.bytes_received
        return {"charts/object_store_MBps": delta / 1e6 / max(interval_s, 1e-9), "actors/failures": self.failures}

    def summary_extras(self) -> dict:
        return {"actor_failures": self.failures, "rollouts_received": self.rollouts_received,
                "object_store_bytes": self.bytes_received, "weight_publishes": self.publishes,
                "weight_bytes": self.weight_bytes, "actor_nodes": {str(i): nodes for i, nodes in self.nodes.items()}}
