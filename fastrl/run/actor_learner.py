"""The IMPALA / APPO learner: the run loop's trainer over the actors' slot ring (``fastrl.distributed.actors``)."""
from __future__ import annotations

import time

import numpy as np
import torch

from fastrl.config import Config, UserError
from fastrl.distributed.actors import A_ENV, A_POLICY, A_STEPS, A_WAIT, POLL_S, ActorPool, SlotRing, WeightBoard
from fastrl.distributed.seeding import member_generator, seed_process
from fastrl.envs.async_env import resolve_env_mode
from fastrl.envs.batched import make_env
from fastrl.envs.buffers import make_rollout_buffer
from fastrl.envs.stats import EpisodeStats, MemberRunningMeanStd
from fastrl.learn.impala import learner_batch
from fastrl.learn.models import make_agent
from fastrl.learn.optim import annealed_lr
from fastrl.learn.precision import autocast_factory
from fastrl.learn.stacked import FlatLayout
from fastrl.learn.update import Update, UpdateSpec, learner_minibatch_index, member_hparams
from fastrl.run.members import MemberState

AUTO_SYNC_STEPS = 10_000


def record_episodes(stats: EpisodeStats, returns: torch.Tensor, lengths: torch.Tensor, finished: int) -> None:
    """Count ``finished`` episodes into ``stats`` and put the last of them (``returns`` / ``lengths``) in its ring."""
    stats.count += finished - returns.numel()  # the episodes not kept still count
    stats.record(returns.double().numpy(), lengths.long().numpy())


class ActorLearnerTrainer(MemberState):
    """IMPALA / APPO behind the run loop's trainer interface (see ``fastrl.run.loop``).

    ``collect()`` takes ``learner_batch`` full slots from the actors' ring (starting the actors on first use);
    ``update()`` runs the pure update (``fastrl.learn.update.Update``: V-trace, the IMPALA or APPO loss, clip, non-finite
    guard, Adam/RMSprop math) on them, and publishes the weights every ``sync_interval`` updates. As the PPO trainer
    at K = 1 it holds flat weights ``params [1, P]`` (the agent module's parameters are views of ``params[0]``), the
    optimizer state (``fastrl.learn.optim``) and ``[1]`` hyperparameter tensors (lr, with its schedule, refilled in place
    each update), and the ``[T, learner_batch * N]`` batch, the actor pool and the staleness / queue statistics.
    Eager only (``compile`` is refused for impala/appo): the gradient runs through the module bound to the weights.
    """

    def __init__(self, cfg: Config, device: torch.device):
        self.cfg, self.device = cfg, device
        self.members, self.n_members, self.varied_keys = [cfg], 1, []
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True)
        seed_process(cfg.seed)
        torch.manual_seed(cfg.seed)
        probe = make_env(cfg, n_envs=1)
        obs_shape, obs_dtype, action_spec = probe.observation_shape, probe.observation_dtype, probe.action_spec
        obs_scale = getattr(probe, "obs_scale", None)
        probe.close()
        threads = cfg.torch_threads or (1 if device.type == "cpu" and len(obs_shape) == 1 else 0)
        if threads:
            torch.set_num_threads(threads)
        self.agent = make_agent(cfg, obs_shape, action_spec, obs_scale).to(device)
        self.layout = FlatLayout(self.agent)
        self.params = self.layout.flatten(self.agent)[None].to(device)
        self.layout.bind(self.agent, self.params[0])
        self.autocast = autocast_factory(device, cfg.amp)
        self.spec = UpdateSpec.of(cfg)
        self.update_fn = Update.for_run(self.spec, self.layout, self.autocast, 1, False, self.agent)
        self.opt_state = self.update_fn.init_opt_state(self.params)
        self.hparams = {key: value[None] for key, value in member_hparams(cfg, device).items()}
        self.obs_shape = obs_shape
        B, T, N = cfg.learner_batch, cfg.n_steps, cfg.n_envs_per_actor
        state_size = getattr(self.agent, "state_size", 0)  # a recurrent policy's: its rollouts carry the state
        if state_size and resolve_env_mode(cfg, N) != "sync":
            raise UserError("a recurrent policy's actors step every env together: use --env-mode sync")
        self.batch = make_rollout_buffer(T, B * N, obs_shape, obs_dtype, action_spec, device, state_size).exclude(
            "advantage", "value_target", "state_value", ("next", "state_value"))
        self.bootstrap_observation = torch.zeros(B * N, *obs_shape, dtype=obs_dtype)
        self.steps_per_update = B * T * N
        auto = max(1, round(AUTO_SYNC_STEPS / self.steps_per_update))
        if cfg.max_policy_lag:  # weights must reach the actors before their rollouts all go stale
            auto = min(auto, max(1, cfg.max_policy_lag // 2))
        self.sync_interval = cfg.sync_interval or auto
        self.minibatch_generators = [member_generator(cfg.seed, "minibatch", 0, device)]
        self.action_generators = []  # the actors draw the actions
        self.episodes = EpisodeStats(1)
        self.keys = list(self.batch.keys(include_nested=True, leaves_only=True))
        self.lag_totals = {"sum": 0.0, "count": 0, "max": 0, "dropped": 0}
        self.iteration = 0  # learner updates so far == the learner's policy version
        self.global_step = 0  # env steps consumed (trained on or dropped)
        self.total_steps = cfg.total_steps
        self.lr_scales = [1.0]  # lowered by each rollback
        self.should_stop = lambda: False
        self.ring = SlotRing(cfg.n_slots, cfg.n_actors, cfg.n_steps, N, obs_shape, obs_dtype, action_spec,
                             self.episodes.window, shared=cfg.actors == "local", state_size=state_size)
        if cfg.actors == "ray":  # Ray actors on any node; their rollouts land in this (learner-side) ring
            from fastrl.distributed.ray_actors import RayActorPool
            self.pool = self.board = RayActorPool(cfg, self.ring)
        else:
            self.board = WeightBoard(self.agent)
            self.pool = ActorPool(cfg, self.ring, self.board)
        self.published_version = -1
        self.start_time = time.perf_counter()
        self._last_actor_stats = self.pool.stats.clone()
        self._last_log_time = self.start_time
        self.reset_interval_stats()

    def reset_interval_stats(self) -> None:
        self.lags: list = []
        self.dropped = 0
        self.wait_s = 0.0
        self.waits = 0
        self.wakeup_latency: list = []
        self.slot_age: list = []
        self.full_at_pickup: list = []
        self.update_s = 0.0

    def publish(self) -> None:
        self.board.publish(self.agent, self.iteration)
        self.published_version = self.iteration

    def finished(self) -> bool:
        return self.global_step >= self.total_steps

    def current_lr(self) -> float:
        return annealed_lr(self.cfg, self.global_step / self.total_steps, self.lr_scale)

    def _keep_going(self) -> bool:
        self.pool.check()
        return not self.should_stop()

    def collect(self) -> bool:
        """Fill the batch from ``learner_batch`` full slots; False if a stop came while waiting."""
        if not self.pool.started:
            self.publish()
            self.start_time = time.perf_counter()
            self.pool.start()
        self.pool.check()  # Ray: hand the slots the last gather freed back to their actors before waiting
        return self.gather(self.ring, self._keep_going)

    def gather(self, ring: SlotRing, keep_going) -> bool:
        """Fill the batch from ``learner_batch`` full slots (oldest first), freeing each right after the copy.

        Waits (polling) only while no slot is full; ``keep_going()`` is called while waiting (actor
        health checks, stop signals) and returning False abandons the gather. Stale slots
        (lag > ``max_policy_lag``) are dropped: their env steps and episodes still count.
        """
        cfg, N = self.cfg, self.cfg.n_envs_per_actor
        filled = 0
        while filled < cfg.learner_batch:
            full = ring.full_slots()
            if full.size == 0:
                start = time.monotonic()
                self.waits += 1
                while full.size == 0:
                    if not keep_going():
                        self.wait_s += time.monotonic() - start
                        return False
                    time.sleep(POLL_S)
                    full = ring.full_slots()
                now = time.monotonic()
                self.wait_s += now - start
                # how long data sat in a full slot while the learner was waiting: its idle-with-data time
                self.wakeup_latency.append(now - max(start, float(ring.time_np[full[0]])))
            self.full_at_pickup.append(full.size)
            for slot in full[: cfg.learner_batch - filled]:
                slot = int(slot)
                self.slot_age.append(time.monotonic() - float(ring.time_np[slot]))
                lag = self.iteration - int(ring.version_np[slot])
                finished = int(ring.n_episodes[slot])
                record_episodes(self.episodes, ring.episode_return[slot, :finished],
                                ring.episode_length[slot, :finished], finished)  # the slot keeps the last of them
                self.global_step += cfg.n_steps * N
                if cfg.max_policy_lag and lag > cfg.max_policy_lag:
                    self.dropped += 1
                    self.lag_totals["dropped"] += 1
                    ring.release(slot)
                    if self.iteration - self.published_version > cfg.max_policy_lag:
                        self.publish()  # the actors' weights are themselves too old: no rollout could pass
                    continue
                self.lags.append(lag)
                totals = self.lag_totals
                totals["sum"], totals["count"], totals["max"] = totals["sum"] + lag, totals["count"] + 1, max(totals["max"], lag)
                cols = slice(filled * N, (filled + 1) * N)
                src = ring.rollout[slot]
                for key in self.keys:
                    self.batch.get(key)[:, cols].copy_(src.get(key))
                self.bootstrap_observation[cols].copy_(ring.bootstrap_observation[slot])
                ring.release(slot)
                filled += 1
        return True

    def update(self) -> dict:
        """One update of the pure ``Update`` on the gathered batch, written into ``params`` / ``opt_state``."""
        lr = self.current_lr()
        self.hparams["lr"].fill_(lr)
        start = time.perf_counter()
        on_device = self.device.type != "cpu"
        batch = self.batch.to(self.device, non_blocking=True) if on_device else self.batch
        boot = self.bootstrap_observation.to(self.device, non_blocking=True) if on_device else self.bootstrap_observation
        inputs = learner_batch(batch, boot)
        index = learner_minibatch_index(self.spec, *batch.batch_size, self.minibatch_generators[0], self.device)
        if index is not None:
            inputs["minibatch_index"] = index
        sums = self.update_fn(self.params[0], {key: value[0] for key, value in self.opt_state.items()}, inputs,
                              {key: value[0] for key, value in self.hparams.items()}, in_place=True)[2]
        metrics = {key if "/" in key else f"losses/{key}": value for key, value in sums.items()}
        metrics["charts/learning_rate"] = lr
        self.iteration += 1
        if self.iteration % self.sync_interval == 0:
            self.publish()
        self.update_s += time.perf_counter() - start
        return metrics

    def log_extras(self) -> dict:
        """Queue, staleness and actor figures since the last log."""
        def mean(xs):
            return float(np.mean(xs)) if xs else 0.0
        now = time.perf_counter()
        dt = max(now - self._last_log_time, 1e-9)
        actor_now = self.pool.stats.clone()
        delta = actor_now - self._last_actor_stats
        self._last_log_time, self._last_actor_stats = now, actor_now
        out = {"charts/actor_sps": float(delta[:, A_STEPS].sum()) / dt,
               "actors/restarts": self.pool.restarts, "actors/hung_restarts": self.pool.hung_restarts,
               "actors/lost_rollouts": self.pool.lost_rollouts, **self.pool.log_extras(dt),
               "queue/actor_wait_s": float(delta[:, A_WAIT].sum()),
               "time/actor_env_s": float(delta[:, A_ENV].sum()), "time/actor_policy_s": float(delta[:, A_POLICY].sum()),
               "staleness/policy_lag_mean": mean(self.lags), "staleness/policy_lag_max": max(self.lags, default=0),
               "staleness/dropped_rollouts": self.dropped, "queue/learner_wait_s": self.wait_s,
               "queue/learner_waits": self.waits, "queue/full_slots_at_pickup_mean": mean(self.full_at_pickup),
               "queue/slot_age_ms_mean": 1e3 * mean(self.slot_age),
               "queue/idle_with_full_slot_ms_mean": 1e3 * mean(self.wakeup_latency),
               "queue/idle_with_full_slot_ms_max": 1e3 * max(self.wakeup_latency, default=0.0),
               "time/update_s": self.update_s}
        self.reset_interval_stats()
        return out

    def episode_summary(self) -> dict:
        """Last-100-episode figures of the episodes the actors' envs finished (the real game score on Atari)."""
        summary = self.episodes.summary()
        return summary if "episode_return_mean" in summary else {}

    def member_stats(self, m: int = 0) -> EpisodeStats:
        return self.episodes

    def normalizer_state(self, m: int = 0) -> dict:
        """Identity statistics, in the PPO trainer's format (so ``fastrl eval`` and ``--resume`` work): observation and
        reward normalization are refused for impala/appo (config.validate)."""
        return {"obs_rms": MemberRunningMeanStd(1, self.obs_shape).member(0),
                "return_rms": MemberRunningMeanStd(1).member(0)}

    def load_normalizer(self, state: dict, m: int = 0) -> None:
        pass

    def summary_extras(self) -> dict:
        actor_total = self.pool.stats.clone()
        wall = max(time.perf_counter() - self.start_time, 1e-9)
        lags = self.lag_totals
        return {"actor_steps": float(actor_total[:, A_STEPS].sum()),
                "actor_sps": float(actor_total[:, A_STEPS].sum()) / wall,
                "actor_restarts": self.pool.restarts, "hung_actor_restarts": self.pool.hung_restarts,
                "policy_lag_mean": lags["sum"] / max(lags["count"], 1), "policy_lag_max": lags["max"],
                "dropped_rollouts": lags["dropped"], "lost_rollouts": self.pool.lost_rollouts,
                "env_mode": resolve_env_mode(self.cfg, self.cfg.n_envs_per_actor), "actors": self.cfg.actors,
                **self.pool.summary_extras()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.pool.started:
            self.publish()

    def roll_back(self, state: dict, lr_factor: float, m: int = 0) -> None:
        """``MemberState.roll_back``, then the weights go to the actors."""
        super().roll_back(state, lr_factor, m)
        self.publish()

    def close(self) -> None:
        """Stop the actors (idempotent)."""
        if self.pool.started:
            self.pool.stop()
