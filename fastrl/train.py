"""``python -m fastrl.train``: build from config, loop collect()/update(), log, checkpoint, evaluate.

One file serves a single process and ``torchrun`` alike: it reads RANK/WORLD_SIZE, gates all I/O
on rank 0 and averages gradients across ranks once per minibatch.
"""
from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from fastrl import distributed
from fastrl.a2c import a2c_loss_terms, a2c_update
from fastrl.amp import autocast_factory, grad_scaler, maybe_compile, resolve_compile
from fastrl.buffers import make_rollout_buffer
from fastrl.checkpoint import (checkpoint_path, list_checkpoints, load_checkpoint, load_rng_state, rng_state,
                               save_checkpoint)
from fastrl.config import Config, UserError, load_yaml, make_config, parse_cli_overrides
from fastrl.envs import make_env
from fastrl.evaluate import evaluate
from fastrl.guards import RollbackGuard, all_finite
from fastrl.logger import NullLogger, RunLogger
from fastrl.models import make_agent
from fastrl.ppo import compute_advantages, ppo_loss_terms, ppo_update


def env_seed(run_seed: int, rank: int, n_envs: int) -> int:
    """Base seed of this rank's envs (env i gets base + i): distinct across ranks and runs."""
    return (run_seed * 100_003 + rank * n_envs) % (2**31 - 1)


def default_run_dir(cfg: Config) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{cfg.env.replace('/', '_')}__{cfg.algo}__{cfg.seed}__{stamp}"


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
        self.env = make_env(cfg, seed=env_seed(cfg.seed, rank, cfg.n_envs))
        threads = cfg.torch_threads
        if threads == 0 and self.device.type == "cpu":
            # Small MLPs gain nothing from intra-op threads, and spinning OpenMP workers collapse
            # throughput when the cores are shared (with EnvPool's threads, or other jobs). CNNs too: on the
            # shared 2-core box a Nature-CNN forward of 8 frames took 5 ms on 1 thread, 300 ms on 2.
            threads = 1
        if threads:
            torch.set_num_threads(threads)
        self.agent = make_agent(cfg, self.env.observation_shape, self.env.action_spec, self.env.obs_scale,
                                channels_last=self.device.type == "cuda").to(self.device)
        distributed.broadcast_module_(self.agent)
        self.optimizer = self._make_optimizer()
        self.params = list(self.agent.parameters())
        self._build_step_functions()
        self.buffer = make_rollout_buffer(cfg.n_steps, cfg.n_envs, self.env.observation_shape,
                                          self.env.observation_dtype, self.env.action_spec, self.device)
        self.sample_generator = torch.Generator(device=self.device)
        self.sample_generator.manual_seed(cfg.seed * 7919 + rank)
        torch.manual_seed(cfg.seed * 31 + rank)  # per-rank action sampling
        self.steps_per_iteration = cfg.n_envs * cfg.n_steps * self.dist.world_size
        self.n_iterations = max(1, cfg.total_steps // self.steps_per_iteration)
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

    def _make_optimizer(self) -> torch.optim.Optimizer:
        cfg = self.cfg
        name = cfg.optimizer if cfg.optimizer != "auto" else ("rmsprop" if cfg.algo == "a2c" else "adam")
        if name == "rmsprop":  # the original A2C's optimizer
            return torch.optim.RMSprop(self.agent.parameters(), lr=cfg.lr, alpha=cfg.rmsprop_alpha, eps=cfg.rmsprop_eps)
        # fused Adam: one kernel for all parameters (about 4x faster than the per-tensor loop on CPU).
        return torch.optim.Adam(self.agent.parameters(), lr=cfg.lr, eps=cfg.adam_eps, fused=True)

    def _build_step_functions(self) -> None:
        """The rollout forward and the loss, under ``cfg.amp`` autocast and (maybe) ``torch.compile``.

        Shapes are static (``[n_envs]`` in the rollout, fixed minibatch sizes in the update) and the learning rate
        lives in the optimizer, outside the compiled graphs, so nothing recompiles after the first iteration.
        """
        cfg, agent = self.cfg, self.agent
        self.autocast = autocast_factory(self.device, cfg.amp)
        self.scaler = grad_scaler(self.device, cfg.amp)
        self.compile_mode = resolve_compile(cfg.compile, self.device)
        autocast = self.autocast

        def policy_step(obs):
            with autocast():
                return agent.get_action_and_value(obs)

        def bootstrap_value(obs):
            with autocast():
                return agent.get_value(obs)

        loss_terms = a2c_loss_terms if cfg.algo == "a2c" else ppo_loss_terms

        def loss_fn(*tensors):
            return loss_terms(agent, cfg, *tensors, autocast=autocast)

        mode = self.compile_mode
        self.policy_step = maybe_compile(policy_step, mode, "the rollout policy forward")
        self.bootstrap_value = maybe_compile(bootstrap_value, mode, "the bootstrap value forward")
        self.loss_fn = maybe_compile(loss_fn, mode, f"the {cfg.algo} loss")

    # ------------------------------------------------------------------ hot path
    @torch.no_grad()
    def collect(self) -> None:
        """Fill the ``[T, N]`` buffer. Per step: one policy forward, one env step, slice writes; no .item()."""
        policy_step, env, device = self.policy_step, self.env, self.device
        obs = self.next_obs
        for t in range(self.cfg.n_steps):
            with self.timer.section("policy"):
                action, logp, _, value = policy_step(obs.to(device, non_blocking=True))
                self._obs[t].copy_(obs)
                self._action[t].copy_(action)
                self._logp[t].copy_(logp)
                self._value[t].copy_(value)
                action_cpu = action.cpu()
            with self.timer.section("env"):
                step = env.step(action_cpu)
            self._reward[t].copy_(step.reward)
            self._terminated[t].copy_(step.terminated)
            self._truncated[t].copy_(step.truncated)
            self._done[t].copy_(step.done)
            self._valid[t].copy_(step.valid)
            obs = step.observation
        with self.timer.section("policy"):
            # next_value[t] = V(obs after step t): the next row's value, and a bootstrap forward for the last row.
            self._next_value[:-1].copy_(self._value[1:])
            self._next_value[-1].copy_(self.bootstrap_value(obs.to(device, non_blocking=True)))
        self.next_obs = obs
        self.global_step += self.steps_per_iteration

    def current_lr(self) -> float:
        cfg = self.cfg
        if not cfg.anneal_lr:
            return cfg.lr * self.lr_scale
        frac = 1.0 - self.iteration / self.n_iterations
        return (cfg.lr_floor + max(frac, 0.0) * (cfg.lr - cfg.lr_floor)) * self.lr_scale

    def update(self) -> dict:
        """GAE on the whole rollout, then the algorithm's gradient steps. Returns 0-d tensor metrics."""
        lr = self.current_lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with self.timer.section("update"):
            batch = self.buffer.to(self.device, non_blocking=True) if self.device.type != "cpu" else self.buffer
            compute_advantages(batch, self.cfg.gamma, self.cfg.gae_lambda)
            sync = self._sync_grads if self.dist.enabled else None
            if self.cfg.algo == "a2c":
                metrics = a2c_update(self.agent, self.optimizer, batch, self.cfg, sync, self.loss_fn, self.scaler)
            else:
                metrics = ppo_update(self.agent, self.optimizer, batch, self.cfg, self.sample_generator, sync_grads=sync,
                                     loss_fn=self.loss_fn, scaler=self.scaler)
        metrics["charts/learning_rate"] = lr
        self.iteration += 1
        return metrics

    def _sync_grads(self) -> None:
        with self.timer.section("allreduce"):
            distributed.all_reduce_grads_(self.params, self.dist.world_size)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {
            "model": self.agent.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "global_step": self.global_step,
            "iteration": self.iteration,
            "lr_scale": self.lr_scale,
            "config": self.cfg.to_dict(),
            "normalizer": self.env.state_dict(),
            "episode_stats": self.env.stats.state_dict(),
            "rng": rng_state(self.sample_generator),
        }

    def load_state_dict(self, state: dict) -> None:
        self.agent.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.global_step, self.iteration = int(state["global_step"]), int(state["iteration"])
        self.lr_scale = float(state.get("lr_scale", 1.0))
        self.env.load_state_dict(state["normalizer"])
        self.env.stats.load_state_dict(state["episode_stats"])
        load_rng_state(state["rng"], self.sample_generator)

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

    def episode_summary(self) -> dict:
        """Recent-episode statistics; all-reduced across ranks so rank 0 reports global figures."""
        returns, lengths = self.env.stats.recent()
        full = float(returns.numel() == self.env.stats.window)
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


def _install_stop_handlers(flag: dict) -> dict:
    """SIGINT/SIGTERM end the run after the current iteration. Returns the previous handlers."""
    def handler(signum, _frame):
        flag["stop"] = signum
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in previous:
        signal.signal(sig, handler)
    return previous


def config_from_cli(argv: list[str] | None = None, prog: str = "fastrl train") -> tuple[Config, dict | None]:
    """Parse flags. With ``--resume`` the checkpoint's config is the base and only explicit flags override it."""
    overrides, yaml_path = parse_cli_overrides(argv, prog)
    if not overrides.get("resume"):
        return make_config(overrides, yaml_path, where="command-line flags"), None
    state = load_checkpoint(overrides["resume"])
    base = make_config(state["config"], where=f"checkpoint {overrides['resume']}").to_dict()
    base["run_dir"] = ""  # a moved or copied run continues where it now lies (see _resume_run_dir)
    if yaml_path:
        base.update({key.replace("-", "_"): value for key, value in load_yaml(yaml_path).items()})
    return make_config({**base, **overrides}, where="command-line flags"), state


def run(cfg: Config, resume_state: dict | None = None) -> dict:
    """Train ``cfg`` to its end (or a stop signal) and return the summary."""
    if cfg.algo in ("impala", "appo"):
        from fastrl.actor_learner import run_actor_learner
        return run_actor_learner(cfg, resume_state)
    dist_info, device = distributed.setup(cfg.device)
    try:
        return _run(cfg, resume_state, dist_info, device)
    finally:
        distributed.cleanup()


def _run(cfg: Config, resume_state: dict | None, dist_info: distributed.DistInfo, device: torch.device) -> dict:
    run_dir = _agree_run_dir(cfg, dist_info)
    if resume_state is None:
        resume_state = _elastic_resume_state(run_dir)
    trainer = Trainer(cfg, dist_info, device)
    if resume_state is not None:
        trainer.load_state_dict(resume_state)
    logger = NullLogger()
    if dist_info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(_yaml(cfg.to_dict()))
        logger = RunLogger(run_dir, cfg.to_dict(), trainer.n_iterations * trainer.steps_per_iteration, trainer.global_step,
                           cfg.tensorboard, cfg.wandb, cfg.wandb_project, cfg.progress)
    guard = RollbackGuard(cfg.rollback, cfg.rollback_drop, cfg.rollback_lr_factor, cfg.max_rollbacks,
                          cfg.rollback_patience, cfg.max_nonfinite_iterations)
    threshold = None  # (steps, seconds) when stop_at_return was reached
    stop = {"stop": None}
    previous_handlers = _install_stop_handlers(stop)
    start_time = time.perf_counter()
    start_step = trainer.global_step
    last_log_time, last_log_step = start_time, trainer.global_step
    recent = {}
    try:
        while trainer.iteration < trainer.n_iterations and stop["stop"] is None:
            with trainer.timer.section("collect"):
                trainer.collect()
            metrics = trainer.update()
            if trainer.iteration % cfg.log_interval == 0 or trainer.iteration == trainer.n_iterations:
                now = time.perf_counter()
                recent = trainer.episode_summary()
                sps = (trainer.global_step - last_log_step) / max(now - last_log_time, 1e-9)
                last_log_time, last_log_step = now, trainer.global_step
                record = {"sps": sps, "charts/SPS": sps, **recent,
                          **{k: (v.item() if torch.is_tensor(v) else v) for k, v in metrics.items()},
                          **trainer.timer.pop()}
                if "episode_return_mean" in recent:
                    record["charts/episodic_return"] = recent["episode_return_mean"]
                if cfg.eval_interval and cfg.eval_episodes and trainer.iteration % cfg.eval_interval == 0:
                    # Rank 0 evaluates; every rank judges the same figure, so all roll back together.
                    record.update(distributed.broadcast_object(_periodic_eval(trainer, cfg, dist_info, device)))
                    judged, window_full = record["eval/return_mean"], True
                else:
                    judged, window_full = recent.get("episode_return_mean"), recent.get("episode_window_full", False)
                reason = guard.observe(judged, window_full,
                                       record.get("losses/nonfinite_updates", 0.0), trainer.weights_state,
                                       trainer.global_step)
                if reason is not None:
                    trainer.roll_back(guard.best_state, cfg.rollback_lr_factor)
                    record.update({"events/rollback": guard.rollbacks, "events/rollback_reason": reason,
                                   "events/rollback_to_step": guard.best_step, "charts/lr_scale": trainer.lr_scale})
                    print(f"fastrl: rollback {guard.rollbacks}/{cfg.max_rollbacks} ({reason}) to the weights of step "
                          f"{guard.best_step}; lr scale now {trainer.lr_scale:g}", file=sys.stderr)
                logger.log(record, trainer.global_step)
                logger.progress(trainer.global_step, {"sps": int(sps), "return": recent.get("episode_return_mean", float("nan"))})
                if cfg.stop_at_return and recent.get("episode_return_mean", -math.inf) >= cfg.stop_at_return:
                    threshold = (trainer.global_step, time.perf_counter() - start_time)
                    break
            if dist_info.is_main and cfg.checkpoint_interval and trainer.iteration % cfg.checkpoint_interval == 0:
                _save_if_finite(trainer, run_dir)
        wall_time = time.perf_counter() - start_time
        summary = {"total_steps": trainer.global_step, "wall_time_s": wall_time,
                   "sps": (trainer.global_step - start_step) / max(wall_time, 1e-9),
                   "episode_return_mean": trainer.episode_summary().get("episode_return_mean"),
                   "iterations": trainer.iteration, "stopped_by_signal": stop["stop"] is not None,
                   "resumed_from_step": start_step, "rollbacks": guard.rollbacks,
                   "reached_return": threshold is not None,
                   "steps_to_return": threshold[0] if threshold else None,
                   "time_to_return_s": threshold[1] if threshold else None,
                   "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}
        if dist_info.is_main:
            _save_if_finite(trainer, run_dir)
            if cfg.eval_episodes and stop["stop"] is None:
                eval_returns = evaluate(trainer.agent, cfg, trainer.env.state_dict(), cfg.eval_episodes, cfg.eval_seeds, device)
                summary["eval_return_mean"] = eval_returns.mean().item()
                summary["eval_return_std"] = eval_returns.std(unbiased=False).item()
            else:
                summary["eval_return_mean"] = None
            summary["run_dir"] = str(run_dir)
        hashes = distributed.gather_objects(distributed.parameter_hash(trainer.agent))
        if dist_info.is_main:
            summary["world_size"] = dist_info.world_size
            summary["param_hashes"] = hashes
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        logger.close()
        trainer.env.close()


def _save_if_finite(trainer: Trainer, run_dir: Path) -> None:
    """Write a checkpoint, unless the weights hold a NaN/Inf: a poisoned checkpoint is never written."""
    if not all_finite(trainer.agent):
        print(f"fastrl: skipped the checkpoint at step {trainer.global_step}: the weights are not finite",
              file=sys.stderr)
        return
    save_checkpoint(trainer.state_dict(), checkpoint_path(run_dir, trainer.global_step), trainer.cfg.keep_checkpoints)


def _periodic_eval(trainer: Trainer, cfg: Config, dist_info: distributed.DistInfo, device: torch.device) -> dict:
    """Deterministic evaluation on separate envs (rank 0), ``eval_seeds`` x ``eval_episodes`` episodes."""
    if not dist_info.is_main or not cfg.eval_episodes:
        return {}
    returns = evaluate(trainer.agent, cfg, trainer.env.state_dict(), cfg.eval_episodes, cfg.eval_seeds, device)
    return {"eval/return_mean": returns.mean().item(), "eval/return_std": returns.std(unbiased=False).item()}


def _agree_run_dir(cfg: Config, dist_info: distributed.DistInfo) -> Path:
    """The run directory, identical on every rank and across torchrun restarts of the same job."""
    if cfg.run_dir:
        return Path(cfg.run_dir)
    if cfg.resume:
        return _resume_run_dir(cfg.resume)
    if not dist_info.enabled:
        return default_run_dir(cfg)
    # Under torchrun a restarted job finds its first attempt's directory through a pointer file.
    pointer = Path("runs") / ".torchrun" / os.environ.get("TORCHELASTIC_RUN_ID", "none")
    chosen = None
    if dist_info.is_main:
        restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
        chosen = pointer.read_text().strip() if restarted and pointer.is_file() else str(default_run_dir(cfg))
        pointer.parent.mkdir(parents=True, exist_ok=True)
        pointer.write_text(chosen)
    return Path(distributed.broadcast_object(chosen))


def _elastic_resume_state(run_dir: Path) -> dict | None:
    """After a torchrun restart every rank reloads the run's newest checkpoint (if any)."""
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0:
        return None
    if not list_checkpoints(run_dir / "checkpoints"):
        return None
    return load_checkpoint(run_dir)


def _resume_run_dir(target: str) -> Path:
    path = Path(target)
    if path.is_file():
        return path.parent.parent if path.parent.name == "checkpoints" else path.parent
    return path


def _yaml(data: dict) -> str:
    import yaml
    return yaml.safe_dump(data, sort_keys=False)


def main(argv: list[str] | None = None, prog: str = "python -m fastrl.train") -> int:
    try:
        cfg, resume_state = config_from_cli(argv, prog=prog)
        summary = run(cfg, resume_state)
    except UserError as e:
        print(f"fastrl: error: {e}", file=sys.stderr)
        return 2
    if summary.get("run_dir"):
        shown = {k: summary[k] for k in ("total_steps", "wall_time_s", "sps", "episode_return_mean", "eval_return_mean")}
        print(json.dumps(shown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
