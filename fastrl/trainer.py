"""The PPO / A2C trainer: a synchronous ``[T, N]`` rollout, then the algorithm's gradient steps.

It implements the run loop's trainer interface (see ``fastrl.loop``): ``collect()``, ``update()``,
``episode_summary()``, ``state_dict()`` / ``load_state_dict()``, ``weights_state()`` / ``roll_back()``, ``close()``.

Under torchrun, ``n_envs`` is global and split evenly across ranks (``per_rank`` keeps it per rank), so the
global batch, and with it the learning, is that of one process: each rank averages its minibatch gradient with
the others' once per minibatch, which equals the gradient of the global minibatch.
"""
from __future__ import annotations

import dataclasses
import hashlib
import random
import time
from contextlib import contextmanager

import numpy as np
import torch

from fastrl import distributed
from fastrl.a2c import a2c_loss_terms, a2c_update
from fastrl.async_collect import AsyncCollector, RolloutViews
from fastrl.async_env import make_async_env, resolve_env_mode
from fastrl.amp import annealed_lr, autocast_factory, compile_plan, grad_scaler, make_optimizer, mark_compiled, maybe_compile
from fastrl.buffers import make_rollout_buffer
from fastrl.checkpoint import load_trainer_state, trainer_state
from fastrl.config import Config
from fastrl.envs import make_env
from fastrl.learner import CompiledUpdate
from fastrl.models import make_agent
from fastrl.ppo import compute_advantages, ppo_loss_terms, ppo_update
from fastrl.rollout import CompiledRolloutStep, has_fused_step, skip_guards


def env_seed(run_seed: int, rank: int, n_envs: int) -> int:
    """Base seed of this rank's envs (env i gets base + i): distinct across ranks and runs.

    Contiguous in the run seed (run seed s + 1 starts where s's ``n_envs`` envs end), so one batched env of K * n_envs
    envs seeded ``env_seed(s, 0, n_envs)`` holds the envs of runs s, ..., s + K - 1 (``fastrl.population``)."""
    return ((run_seed + rank * 10_007) * n_envs) % (2**31 - 1)


def _graph_key(*parts) -> str:
    """A short hash of what a compiled graph depends on: a run with the same key reuses the cached compile."""
    return hashlib.sha1(repr(parts).encode()).hexdigest()[:16]


def rank_n_envs(cfg: Config, world_size: int) -> int:
    """Envs on each rank: ``n_envs / world_size``, or ``n_envs`` with ``per_rank``."""
    return cfg.n_envs if cfg.per_rank else cfg.n_envs // world_size


def set_torch_threads(cfg: Config, device: torch.device) -> None:
    threads = cfg.torch_threads
    if threads == 0 and device.type == "cpu":
        # Small MLPs gain nothing from intra-op threads, and spinning OpenMP workers collapse
        # throughput when the cores are shared (with EnvPool's threads, or other jobs). CNNs too: on the
        # shared 2-core box a Nature-CNN forward of 8 frames took 5 ms on 1 thread, 300 ms on 2.
        threads = 1
    if threads:
        torch.set_num_threads(threads)


class Timer:
    """Named wall-clock sections, summed per log interval."""

    def __init__(self):
        self.totals: dict = {}

    @contextmanager
    def section(self, name: str):
        start = time.perf_counter()
        yield
        self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - start

    def pop(self) -> dict:
        out, self.totals = {f"time/{k}_s": v for k, v in self.totals.items()}, {}
        return out


class Trainer:
    """Owns the env, agent, optimizer and the ``[T, N]`` buffer. ``collect()`` then ``update()`` per iteration."""

    def __init__(self, cfg: Config, dist_info: distributed.DistInfo | None = None, device: torch.device | None = None):
        self.cfg = cfg
        self.dist = dist_info or distributed.DistInfo()
        self.device = device or distributed.resolve_device(cfg.device)
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True)
        rank = self.dist.rank
        random.seed(cfg.seed + rank)
        np.random.seed((cfg.seed + rank) % 2**32)
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        self.n_envs = rank_n_envs(cfg, self.dist.world_size)
        self.env_mode = resolve_env_mode(cfg, self.n_envs)  # sync or async (fastrl/async_collect.py)
        self.env = (make_async_env if self.env_mode == "async" else make_env)(
            cfg, n_envs=self.n_envs, seed=env_seed(cfg.seed, rank, self.n_envs))
        set_torch_threads(cfg, self.device)
        self.agent = make_agent(cfg, self.env.observation_shape, self.env.action_spec, self.env.obs_scale,
                                channels_last=self.device.type == "cuda").to(self.device)
        distributed.broadcast_module_(self.agent)
        self.optimizer = make_optimizer(cfg, self.agent.parameters())
        self.params = list(self.agent.parameters())
        self.steps_per_iteration = self.n_envs * cfg.n_steps * self.dist.world_size
        self.n_iterations = max(1, cfg.total_steps // self.steps_per_iteration)
        self.total_steps = self.n_iterations * self.steps_per_iteration
        self._build_step_functions()
        self.buffer = make_rollout_buffer(cfg.n_steps, self.n_envs, self.env.observation_shape,
                                          self.env.observation_dtype, self.env.action_spec, self.device)
        self.sample_generator = torch.Generator(device=self.device)
        self.sample_generator.manual_seed(cfg.seed * 7919 + rank)
        torch.manual_seed(cfg.seed * 31 + rank)  # per-rank action sampling
        self.iteration = 0
        self.global_step = 0
        self.lr_scale = 1.0  # lowered by each rollback
        self.timer = Timer()
        self.next_obs = self.env.reset()
        # Views on the buffer's storage, looked up once for the rollout loop.
        buf = self.buffer
        self._obs, self._action = buf["observation"], buf["action"]
        self._logp, self._value, self._valid = buf["sample_log_prob"], buf["state_value"], buf["valid"]
        nxt = buf["next"]
        self._reward, self._done = nxt["reward"], nxt["done"]
        self._terminated, self._truncated, self._next_value = nxt["terminated"], nxt["truncated"], nxt["state_value"]
        self.async_collector = AsyncCollector(self) if self.env_mode == "async" else None
        # CPU, sync: the rollout step (forward, sampling, buffer writes; with env_backend torch the env step too) as
        # one compiled graph. On CUDA the compiled policy_step (CUDA graphs under reduce-overhead) stays.
        self.rollout_step = None
        if self.compile_mode != "off" and self.device.type == "cpu" and self.env_mode == "sync":
            self.rollout_step = CompiledRolloutStep(self.agent, RolloutViews.of(self.buffer), self.env.action_spec,
                                                    self.autocast, self.compile_mode, env=self.env)

    def _build_step_functions(self) -> None:
        """The rollout forward and the loss, under ``cfg.amp`` autocast and (maybe) ``torch.compile``.

        Shapes are static (``[n_envs]`` in the rollout, fixed minibatch sizes in the update) and the learning rate
        lives in the optimizer, outside the compiled graphs, so nothing recompiles after the first iteration.
        """
        cfg, agent = self.cfg, self.agent
        self.autocast = autocast_factory(self.device, cfg.amp)
        self.scaler = grad_scaler(self.device, cfg.amp)
        gradient_steps = self.n_iterations * (1 if cfg.algo == "a2c" else cfg.n_epochs * cfg.n_minibatches)
        # What the update graph depends on: a run with the same key reuses the cached compile.
        model = (self.env.observation_shape, str(self.env.observation_dtype), repr(self.env.action_spec),
                 cfg.hidden_sizes, cfg.activation, cfg.shared_trunk, cfg.encoder, cfg.amp, self.device.type)
        self.compile_key = _graph_key(cfg.algo, *model, self.n_envs * cfg.n_steps // (
            1 if cfg.algo == "a2c" else cfg.n_minibatches), cfg.clip_vloss, cfg.norm_adv, cfg.max_grad_norm > 0,
            cfg.optimizer, self.dist.enabled)
        # And what the rollout step's graph depends on (fastrl/rollout.py), env included when it is fused in.
        fused = self.env_mode == "sync" and has_fused_step(self.env)
        self.rollout_compile_key = _graph_key("rollout", *model, self.n_envs, cfg.env if fused else None)
        self.compile_mode, self.update_compile_mode = compile_plan(
            cfg.compile, self.device, gradient_steps, self.compile_key, rollout_steps=self.n_iterations * cfg.n_steps,
            rollout_key=self.rollout_compile_key, fused_rollout=fused)
        autocast = self.autocast

        def policy_step(obs):
            with autocast():
                return agent.get_action_and_value(obs)

        def bootstrap_value(obs):
            with autocast():
                return agent.get_value(obs)

        loss_terms = a2c_loss_terms if cfg.algo == "a2c" else ppo_loss_terms
        # anneal_clip: the losses read clip_coef from a copy of cfg whose clip_coef is a 0-d tensor, refilled in
        # place each iteration (update()), so no loss, eager or compiled, recompiles.
        self.loss_cfg = cfg
        if cfg.anneal_clip:
            self.loss_cfg = dataclasses.replace(cfg)
            self.loss_cfg.clip_coef = torch.tensor(float(cfg.clip_coef), device=self.device)
        loss_cfg = self.loss_cfg

        def loss_fn(*tensors):
            return loss_terms(agent, loss_cfg, *tensors, autocast=autocast)

        mode = self.compile_mode
        self.policy_step = maybe_compile(policy_step, mode, "the rollout policy forward")
        # Once per rollout: on CPU the eager forward costs less than compiling it.
        self.bootstrap_value = maybe_compile(bootstrap_value, mode if self.device.type == "cuda" else "off",
                                             "the bootstrap value forward")
        self.loss_fn = maybe_compile(loss_fn, mode, f"the {cfg.algo} loss")
        # Compiled: the whole gradient step (forward, loss, gradient, clip, optimizer math) as one graph.
        self.step_fn = None
        if self.update_compile_mode != "off" and self.scaler is None:  # fp16's GradScaler stays on the eager path
            sync = self._sync_flat_grads if self.dist.enabled else None
            self.step_fn = CompiledUpdate(agent, self.optimizer, loss_cfg, cfg.algo, autocast, self.update_compile_mode,
                                          sync_grads=sync)

    # ------------------------------------------------------------------ hot path
    def finished(self) -> bool:
        return self.iteration >= self.n_iterations

    def collect(self) -> bool:
        """Fill the ``[T, N]`` buffer. Per step: one policy forward, one env step, slice writes; no .item()."""
        with self.timer.section("collect"), torch.no_grad(), skip_guards(self._warm_compiled()):
            self._collect()
        if self.iteration == 0 and self.rollout_step is not None and self.rollout_step.compiled:
            mark_compiled(self.rollout_compile_key)
        return True

    def _warm_compiled(self) -> bool:
        """From the second iteration on, every compiled function has compiled for the inputs it sees: the hot loops
        skip guard evaluation (``fastrl.rollout.skip_guards``)."""
        return self.iteration >= 1 and (self.compile_mode != "off" or self.step_fn is not None)

    def _collect(self) -> None:
        if self.async_collector is not None:
            return self.async_collector.collect()
        rollout_step, env, n_steps = self.rollout_step, self.env, self.cfg.n_steps
        obs = self.next_obs
        if rollout_step is not None and rollout_step.fused:  # the env step is inside the compiled graph
            with self.timer.section("policy_env"):
                for t in range(n_steps):
                    obs = rollout_step(obs, t)
                rollout_step.finish(n_steps)
            return self._finish_rollout(obs)
        # CPU, compiled: CompiledRolloutStep (forward, sampling and writes in one graph); else the eager forward.
        act = rollout_step if rollout_step is not None else self._act_eager
        for t in range(n_steps):
            with self.timer.section("policy"):
                action = act(obs, t)
            with self.timer.section("env"):
                step = env.step(action)
            self._reward[t].copy_(step.reward)
            self._terminated[t].copy_(step.terminated)
            self._truncated[t].copy_(step.truncated)
            self._done[t].copy_(step.done)
            self._valid[t].copy_(step.valid)
            obs = step.observation
        self._finish_rollout(obs)

    def _act_eager(self, obs: torch.Tensor, t: int) -> torch.Tensor:
        """The policy forward (``policy_step``: compiled on CUDA) and row ``t``'s writes; the action on the CPU."""
        action, logp, _, value = self.policy_step(obs.to(self.device, non_blocking=True))
        self._obs[t].copy_(obs)
        self._action[t].copy_(action)
        self._logp[t].copy_(logp)
        self._value[t].copy_(value)
        return action.cpu()

    def _finish_rollout(self, obs: torch.Tensor) -> None:
        with self.timer.section("policy"):
            # next_value[t] = V(obs after step t): the next row's value, and a bootstrap forward for the last row.
            self._next_value[:-1].copy_(self._value[1:])
            self._next_value[-1].copy_(self.bootstrap_value(obs.to(self.device, non_blocking=True)))
        self.next_obs = obs
        self.global_step += self.steps_per_iteration

    def current_lr(self) -> float:
        return annealed_lr(self.cfg, self.iteration / self.n_iterations, self.lr_scale)

    def current_clip_coef(self) -> float:
        """``clip_coef``, annealed linearly to 0 with ``anneal_clip`` (on the learning rate's per-iteration clock)."""
        if not self.cfg.anneal_clip:
            return self.cfg.clip_coef
        return self.cfg.clip_coef * max(1.0 - self.iteration / self.n_iterations, 0.0)

    def update(self) -> dict:
        """GAE on the whole rollout, then the algorithm's gradient steps. Returns 0-d tensor metrics."""
        lr = self.current_lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.cfg.anneal_clip:
            self.loss_cfg.clip_coef.fill_(self.current_clip_coef())
        with self.timer.section("update"), skip_guards(self._warm_compiled()):
            batch = self.buffer.to(self.device, non_blocking=True) if self.device.type != "cpu" else self.buffer
            compute_advantages(batch, self.cfg.gamma, self.cfg.gae_lambda)
            sync = self._sync_grads if self.dist.enabled else None
            if self.cfg.algo == "a2c":
                metrics = a2c_update(self.agent, self.optimizer, batch, self.cfg, sync, self.loss_fn, self.scaler,
                                     step_fn=self.step_fn)
            else:
                metrics = ppo_update(self.agent, self.optimizer, batch, self.cfg, self.sample_generator, sync_grads=sync,
                                     loss_fn=self.loss_fn, scaler=self.scaler, step_fn=self.step_fn)
        if self.step_fn is not None and not self.step_fn.compiled:
            self.step_fn = None  # compiling failed: today's eager step beats the functional code run eagerly
        elif self.step_fn is not None and self.iteration == 0:
            mark_compiled(self.compile_key)
        metrics["charts/learning_rate"] = lr
        if self.cfg.anneal_clip:
            metrics["charts/clip_coef"] = self.current_clip_coef()
        self.iteration += 1
        return metrics

    def _sync_flat_grads(self, flat_grad: torch.Tensor) -> None:
        with self.timer.section("allreduce"):
            distributed.all_reduce_(flat_grad)
            flat_grad.div_(self.dist.world_size)

    def _sync_grads(self) -> None:
        with self.timer.section("allreduce"):
            distributed.all_reduce_grads_(self.params, self.dist.world_size)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return trainer_state(self, self.env.state_dict(), self.env.stats.state_dict(), self.sample_generator)

    def load_state_dict(self, state: dict) -> None:
        load_trainer_state(self, state, self.sample_generator)
        self.env.load_state_dict(state["normalizer"])
        self.env.stats.load_state_dict(state["episode_stats"])

    def weights_state(self) -> dict:
        """What a rollback restores: weights, optimizer moments and observation-normalizer statistics."""
        return {"model": self.agent.state_dict(), "optimizer": self.optimizer.state_dict(),
                "normalizer": self.env.state_dict()}

    def roll_back(self, state: dict, lr_factor: float) -> None:
        """Return to ``state`` (see weights_state), scale the LR and restart the episode-return window."""
        self.agent.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.env.load_state_dict(state["normalizer"])
        self.lr_scale *= lr_factor
        self.env.stats.restart_window()

    def log_extras(self) -> dict:
        """Per-log-interval diagnostics: seconds in each named section since the last log."""
        return self.timer.pop()

    def normalizer_state(self) -> dict:
        """Observation/reward normalizer statistics, for evaluation envs."""
        return self.env.state_dict()

    def summary_extras(self) -> dict:
        return {"n_envs_per_rank": self.n_envs, "env_mode": self.env_mode}

    def close(self) -> None:
        self.env.close()

    def episode_summary(self) -> dict:
        """Recent-episode statistics; all-reduced across ranks so rank 0 reports global figures.

        Under torchrun each rank contributes its last ``window / world_size`` episodes, so the figure covers the
        last ``window`` (100) episodes of the whole job, as in one process, not a window W times as long.
        """
        stats = self.env.stats
        per_rank = max(1, stats.window // self.dist.world_size)
        returns, lengths = stats.recent(per_rank)
        full = float(returns.numel() == per_rank)
        sums = torch.tensor([returns.sum().item(), float(returns.numel()), lengths.double().sum().item(), full,
                             float(self.env.stats.count)], dtype=torch.float64)
        if self.dist.enabled:
            sums = sums.to(self.device) if self.device.type == "cuda" else sums
            distributed.all_reduce_(sums)
            sums = sums.cpu()
        total, count, length_total, full_ranks, episodes = sums.tolist()
        if count == 0:
            return {}
        return {"episode_return_mean": total / count, "episode_length_mean": length_total / count,
                "episode_window_full": full_ranks == self.dist.world_size, "episodes": int(episodes)}


