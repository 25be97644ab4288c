"""Population training: K PPO / A2C agents (seeds, or hyperparameter variants) trained as one vmapped program.

``--n-seeds K`` and ``--vary KEY=v1,v2`` (``Config.n_seeds``, ``Config.vary``) make ``member_configs(cfg)``: the grid
of every ``vary`` combination, each repeated ``n_seeds`` times. Member ``m`` runs with seed ``cfg.seed + m`` and its
variant's values, and equals the single run of that config (``tests/test_population.py`` checks the parameters
after one iteration against a single ``Trainer``'s). How:

- **Parameters and optimizer state** are stacked along a leading member dimension ``[K, ...]``.
- **One env**: a batched env of ``K * n_envs`` envs; member ``m`` owns envs ``[m * n_envs, (m + 1) * n_envs)``,
  seeded as its single run's envs are (``fastrl.trainer.env_seed`` is contiguous in the run seed for this).
- **The rollout forward** is ``torch.func.vmap`` of the agent's ``get_action_and_value`` over members. Sampling
  noise comes from each member's own generator (seeded as the single run seeds torch), drawn outside the vmap.
- **The update**: ``vmap`` of ``fastrl.learner.CompiledUpdate``'s loss, gradient, clip and optimizer math, written
  back in place, compiled as one graph (``compile``: see ``fastrl.amp.compile_plan``). Per-member hyperparameters
  (lr and its schedule, clip_coef, ent_coef, vf_coef, max_grad_norm) are ``[K]`` tensors; gamma and gae_lambda go
  into each member's GAE. Each member shuffles its minibatches with its own generator.
- **Per member**: episode statistics (``MemberEpisodeStats``), metrics rows (``member_rows``), evaluation, a
  rollback guard, and a non-finite step skipped on its own (the ``torch.where`` guard runs per member inside vmap).
- **Checkpoints** hold every member in the single-run format (``members[m]``), so ``--resume`` restores them all
  and ``fastrl.load(path, member=m)`` loads one.

Not supported (refused with one line by ``Config.validate`` / ``check_population``): IMPALA/APPO, torchrun, target_kl,
observation/reward normalization, fp16, capture_video.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import random
import statistics
import time

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from fastrl import distributed
from fastrl.amp import CompiledOrEager, annealed_lr, autocast_factory, compile_plan, make_optimizer, mark_compiled
from fastrl.buffers import make_rollout_buffer
from fastrl.checkpoint import rng_state
from fastrl.config import VARY_KEYS, Config, UserError
from fastrl.envs import EpisodeStats, make_env
from fastrl.evaluate import evaluate
from fastrl.guards import RollbackGuard
from fastrl.learner import CompiledUpdate, _parameter_slots
from fastrl.models import make_agent
from fastrl.ppo import LOSS_KEYS, compute_advantages, explained_variance
from fastrl.rollout import sampling_noise
from fastrl.trainer import Timer, env_seed, set_torch_threads

__all__ = ["VARY_KEYS", "PopulationTrainer", "member_configs", "aggregate", "interquartile_mean"]


# From how many (vmapped) gradient steps compiling pays on CPU under compile: auto. Eagerly, vmap's batching rules
# make a step of 2-4 CartPole members cost about 17 ms; compiled about 4 ms, with the rollout forward 0.5 ms a step
# instead of 1.9 ms (2 cores). The three graphs compile in about 55 s cold and 15 s warm.
POPULATION_COMPILE_MIN_GRADIENT_STEPS = {"cold": 4_000, "warm": 1_000}


def member_configs(cfg: Config) -> list[Config]:
    """The members: every combination of ``cfg.vary`` (in key order), each for ``n_seeds`` seeds; member ``m`` has
    seed ``cfg.seed + m``. Each is a validated single-run config (``n_seeds`` 1, no ``vary``)."""
    keys = list(cfg.vary)
    members = []
    for combo in itertools.product(*(cfg.vary[k] for k in keys)):
        for _ in range(cfg.n_seeds):
            values = dict(zip(keys, combo), seed=cfg.seed + len(members), n_seeds=1, vary={})
            try:
                members.append(dataclasses.replace(cfg, **values).validate())
            except UserError as e:
                raise UserError(f"member {len(members)} ({', '.join(f'{k}={v}' for k, v in zip(keys, combo))}): "
                                f"{e}") from None
    return members


def member_hyperparameters(member: Config, cfg: Config) -> dict:
    """What ``--vary`` set for this member (empty for plain seeds)."""
    return {key: getattr(member, key) for key in cfg.vary}


def variant_name(hyperparameters: dict) -> str:
    """``lr=0.001,gamma=0.99``: the label of a member's variant (empty for plain seeds)."""
    return ",".join(f"{key}={value:g}" for key, value in hyperparameters.items())


def check_population(cfg: Config, world_size: int = 1) -> None:
    """One line for what a population run cannot do (``Config.validate`` checks the rest)."""
    if world_size > 1:
        raise UserError("--n-seeds/--vary run in one process; torchrun is not supported with them: drop torchrun, "
                        "or train one seed per torchrun job")


class MemberEpisodeStats(EpisodeStats):
    """``EpisodeStats`` over ``n_members * n_envs`` envs that also keeps a last-``window`` ring per member
    (member ``m`` owns envs ``[m * n_envs, (m + 1) * n_envs)``). ``members[m]`` is member m's own
    ``EpisodeStats``: its ``recent()``, ``summary()`` and state equal those of member m's single run."""

    def __init__(self, n_members: int, n_envs: int, window: int = 100):
        super().__init__(n_members * n_envs, window)
        self.n_envs = n_envs
        self.members = [EpisodeStats(n_envs, window) for _ in range(n_members)]
        for m, member in enumerate(self.members):  # running sums are views of the whole env's
            member.running_return = self.running_return[m * n_envs:(m + 1) * n_envs]
            member.running_length = self.running_length[m * n_envs:(m + 1) * n_envs]

    def update(self, reward, done, valid, env_ids=None) -> None:
        if env_ids is not None:
            raise ValueError("MemberEpisodeStats takes whole [n_members * n_envs] steps (a population steps in sync)")
        reward, done, valid = np.asarray(reward), np.asarray(done), np.asarray(valid)
        finished = np.flatnonzero(done)
        for m in np.unique(finished // self.n_envs):  # before the whole env's update clears the finished sums
            local = finished[finished // self.n_envs == m]
            self.members[m].record(self.running_return.numpy()[local] + reward[local] * valid[local],
                                   self.running_length.numpy()[local] + valid[local])
        super().update(reward, done, valid)


class _Act(nn.Module):
    """``forward(obs, noise)`` is ``agent.get_action_and_value(obs, None, noise)`` (for ``functional_call``)."""

    def __init__(self, agent: nn.Module):
        super().__init__()
        self.agent = agent

    def forward(self, observation, noise):
        action, logp, _, value = self.agent.get_action_and_value(observation, None, noise)
        return action, logp, value


class _Value(nn.Module):
    def __init__(self, agent: nn.Module):
        super().__init__()
        self.agent = agent

    def forward(self, observation):
        return self.agent.get_value(observation)


class StackedParameters(nn.Module):
    """The population's weights as one module: parameter ``i`` is ``[K, *shape_i]``. The run loop checks these for
    NaN/Inf before a checkpoint and hashes them per rank."""

    def __init__(self, stacked: list):
        super().__init__()
        self.stacked = nn.ParameterList([nn.Parameter(t, requires_grad=False) for t in stacked])


class PopulationTrainer:
    """K members in one process; the run loop's trainer interface (see ``fastrl.loop``), plus ``member_rows``,
    ``evaluate_members`` and ``population_summary``."""

    member_guards = True  # the loop leaves rollbacks to the per-member guards here

    def __init__(self, cfg: Config, dist_info: distributed.DistInfo | None = None, device: torch.device | None = None):
        self.dist = dist_info or distributed.DistInfo()
        check_population(cfg, self.dist.world_size)
        self.cfg = cfg
        self.device = device or distributed.resolve_device(cfg.device)
        self.members = member_configs(cfg)
        self.n_members = k = len(self.members)
        self.n_envs = n = cfg.n_envs
        random.seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)
        self.env = make_env(cfg, n_envs=k * n, seed=env_seed(cfg.seed, 0, n))
        self.stats = MemberEpisodeStats(k, n)
        self.env.env.stats = self.stats
        set_torch_threads(cfg, self.device)
        agents = []
        for member in self.members:  # each member's initial weights are its single run's
            torch.manual_seed(member.seed)
            agents.append(make_agent(member, self.env.observation_shape, self.env.action_spec,
                                     self.env.obs_scale).to(self.device))
        self.agent_template = agents[0]
        self.scratch_agent = copy.deepcopy(agents[0])  # holds one member's weights for evaluation and checkpoints
        template_optimizer = make_optimizer(cfg, self.agent_template.parameters())
        self.agent = StackedParameters([torch.stack([p.detach() for p in ps])
                                        for ps in zip(*(list(a.parameters()) for a in agents))])
        self.params = [p.data for p in self.agent.stacked]  # the same storage, as plain tensors for the step
        self.steps_per_iteration = k * n * cfg.n_steps
        self.n_iterations = max(1, cfg.total_steps // (n * cfg.n_steps))
        self.total_steps = self.n_iterations * self.steps_per_iteration
        gradient_steps = self.n_iterations * (1 if cfg.algo == "a2c" else cfg.n_epochs * cfg.n_minibatches)
        self.compile_key = f"population-{cfg.algo}-{k}-{cfg.n_envs}-{cfg.n_steps}-{cfg.n_minibatches}-" \
                           f"{'-'.join(map(str, cfg.hidden_sizes))}-{cfg.env}"
        _, self.update_compile_mode = compile_plan(cfg.compile, self.device, gradient_steps, self.compile_key,
                                                   POPULATION_COMPILE_MIN_GRADIENT_STEPS)
        # Eagerly, vmap costs a batching rule per op: the rollout forward compiles whenever the update does.
        self.compile_mode = self.update_compile_mode if cfg.compile == "auto" else cfg.compile
        self.autocast = autocast_factory(self.device, cfg.amp)
        # The single run's gradient step, used for its loss and optimizer math (never called itself).
        self.update_fns = CompiledUpdate(self.agent_template, template_optimizer, cfg, cfg.algo, self.autocast, "off")
        self.kind = self.update_fns.kind
        moments = 2 if self.kind == "adam" else 1
        self.state = tuple([torch.zeros_like(p) for p in self.params] for _ in range(moments)) + (
            [torch.zeros(k, dtype=torch.float32, device=self.device) for _ in self.params],)
        act_module, value_module = _Act(self.agent_template), _Value(self.agent_template)
        act_slots = _parameter_slots(act_module, self.update_fns.params)
        value_slots = _parameter_slots(value_module, self.update_fns.params)
        autocast = self.autocast

        def member_act(params, obs, noise):
            with autocast():
                return functional_call(act_module, {s: params[i] for s, i in act_slots}, (obs, noise),
                                       tie_weights=False)

        def member_value(params, obs):
            with autocast():
                return functional_call(value_module, {s: params[i] for s, i in value_slots}, (obs,), tie_weights=False)

        def population_act(params, obs, noise):  # own functions: torch.compile caches by code object, and every
            return vmap(member_act)(params, obs, noise)  # vmap(...) wrapper shares one

        def population_value(params, obs):
            return vmap(member_value)(params, obs)

        self.policy_step = CompiledOrEager(population_act, self.compile_mode, "the population rollout forward")
        self.bootstrap_value = population_value  # once per rollout: eager costs less than compiling it
        self.step_fn = CompiledOrEager(self._population_step, self.update_compile_mode,
                                       f"the population {cfg.algo} gradient step", fullgraph=True)
        # Per-member hyperparameters as [K] tensors: graph inputs, so schedules and rollbacks never recompile.
        self.lr = torch.zeros(k, dtype=torch.float64, device=self.device)
        self.clip_coef = self._member_tensor("clip_coef")
        self.ent_coef = self._member_tensor("ent_coef")
        self.vf_coef = self._member_tensor("vf_coef")
        self.max_grad_norm = self._member_tensor("max_grad_norm")
        self.lr_scales = [1.0] * k
        self.buffer = make_rollout_buffer(cfg.n_steps, k * n, self.env.observation_shape, self.env.observation_dtype,
                                          self.env.action_spec, self.device)
        spec = self.env.action_spec
        width, self._draw = sampling_noise(spec)
        self.noise = torch.empty(k, n, width)
        # As the single run: sample_generator seeded seed*7919 (rank 0), action sampling from torch seeded seed*31.
        self.sample_generators = [torch.Generator(device=self.device) for _ in self.members]
        self.action_generators = [torch.Generator() for _ in self.members]
        for member, sample_gen, action_gen in zip(self.members, self.sample_generators, self.action_generators):
            sample_gen.manual_seed(member.seed * 7919)
            action_gen.manual_seed(member.seed * 31)
        self.guards = [RollbackGuard(m.rollback, m.rollback_drop, m.rollback_lr_factor, m.max_rollbacks,
                                     m.rollback_patience, m.max_nonfinite_iterations) for m in self.members]
        self.reached = [None] * k  # (steps, seconds) when member m's last-100 mean first reached stop_at_return
        self.member_eval = [None] * k  # the latest evaluation (mean, std) per member
        self.iteration = 0
        self.global_step = 0
        self.lr_scale = 1.0
        self.timer = Timer()
        self._member_metrics: dict = {}
        self.next_obs = self.env.reset()

    def _member_tensor(self, name: str) -> torch.Tensor:
        return torch.tensor([float(getattr(m, name)) for m in self.members], dtype=torch.float32, device=self.device)

    # ------------------------------------------------------------------ the vmapped, compiled update
    def _member_step(self, params, state, lr, clip_coef, ent_coef, vf_coef, max_grad_norm, *loss_inputs):
        fns = self.update_fns
        grads, (loss, stats) = grad_and_value(fns._loss, has_aux=True)(params, clip_coef, ent_coef, *loss_inputs,
                                                                       vf_coef=vf_coef)
        new, grad_norm, nonfinite = fns._new_values(params, state, lr, grads, loss, max_grad_norm)
        return new, {**stats, "grad_norm": grad_norm}, nonfinite

    def _population_step(self, params, state, lr, clip_coef, ent_coef, vf_coef, max_grad_norm, *loss_inputs):
        """One gradient step of every member on its own minibatch ``[K, B, ...]``; writes the new parameters and
        optimizer state in place. Returns ``(stats, nonfinite)``, each ``[K]``."""
        new, stats, nonfinite = vmap(self._member_step)(params, state, lr, clip_coef, ent_coef, vf_coef,
                                                        max_grad_norm, *loss_inputs)
        for old_list, new_list in zip((params, *state), new):
            for old, value in zip(old_list, new_list):
                old.copy_(value)
        return stats, nonfinite

    # ------------------------------------------------------------------ hot path
    def finished(self) -> bool:
        return self.iteration >= self.n_iterations

    def collect(self) -> bool:
        """Fill the ``[T, K * n_envs]`` buffer: per step one vmapped forward of all members and one env step."""
        k, n, buf, device = self.n_members, self.n_envs, self.buffer, self.device
        obs_shape = self.env.observation_shape
        nxt = buf["next"]
        with self.timer.section("collect"), torch.no_grad():
            obs = self.next_obs
            for t in range(self.cfg.n_steps):
                with self.timer.section("policy"):
                    for m, generator in enumerate(self.action_generators):
                        self._draw(self.noise.shape[1:], generator=generator, out=self.noise[m])
                    action, logp, value = self.policy_step(self.params, obs.to(device).view(k, n, *obs_shape),
                                                           self.noise.to(device))
                    buf["observation"][t].copy_(obs)
                    buf["action"][t].copy_(action.reshape(k * n, *action.shape[2:]))
                    buf["sample_log_prob"][t].copy_(logp.reshape(-1))
                    buf["state_value"][t].copy_(value.reshape(-1))
                    action_cpu = buf["action"][t].cpu()
                with self.timer.section("env"):
                    step = self.env.step(action_cpu)
                nxt["reward"][t].copy_(step.reward)
                nxt["terminated"][t].copy_(step.terminated)
                nxt["truncated"][t].copy_(step.truncated)
                nxt["done"][t].copy_(step.done)
                buf["valid"][t].copy_(step.valid)
                obs = step.observation
            with self.timer.section("policy"):
                nxt["state_value"][:-1].copy_(buf["state_value"][1:])
                last = self.bootstrap_value(self.params, obs.to(device).view(k, n, *obs_shape))
                nxt["state_value"][-1].copy_(last.reshape(-1))
            self.next_obs = obs
        self.global_step += self.steps_per_iteration
        return True

    def _member_major(self, tensor: torch.Tensor) -> torch.Tensor:
        """``[T, K * n, ...]`` -> ``[K, T * n, ...]``: member m's rollout, flattened time-major as its single run's."""
        t, k, n = tensor.shape[0], self.n_members, self.n_envs
        rest = tensor.shape[2:]
        return tensor.reshape(t, k, n, *rest).transpose(0, 1).reshape(k, t * n, *rest)

    def update(self) -> dict:
        """Per-member GAE, then the gradient steps of all members at once. Returns 0-d metrics, means over members
        (``member_rows`` has each member's)."""
        cfg, k = self.cfg, self.n_members
        fraction = self.iteration / self.n_iterations
        self.lr.copy_(torch.tensor([annealed_lr(m, fraction, s) for m, s in zip(self.members, self.lr_scales)],
                                   dtype=torch.float64))
        if getattr(cfg, "anneal_clip", False):  # as Trainer.current_clip_coef
            self.clip_coef.copy_(torch.tensor([m.clip_coef * max(1.0 - fraction, 0.0) for m in self.members]))
        with self.timer.section("update"):
            batch = self.buffer
            if len({(m.gamma, m.gae_lambda) for m in self.members}) == 1:
                compute_advantages(batch, cfg.gamma, cfg.gae_lambda)
            else:
                n = self.n_envs
                for m, member in enumerate(self.members):
                    compute_advantages(batch[:, m * n:(m + 1) * n], member.gamma, member.gae_lambda)
            flat = [self._member_major(batch[key]) for key in LOSS_KEYS]
            hyper = (self.lr, self.clip_coef, self.ent_coef, self.vf_coef, self.max_grad_norm)
            totals: dict = {}
            nonfinite_updates = torch.zeros(k, device=self.device)
            n_updates = 0
            size = flat[0].shape[1]
            if cfg.algo == "a2c":
                passes = [[flat]]
            else:
                passes = (self._shuffled_minibatches(flat, size) for _ in range(cfg.n_epochs))
            for minibatches in passes:
                for minibatch in minibatches:
                    stats, nonfinite = self.step_fn(self.params, self.state, *hyper, *minibatch)
                    nonfinite_updates = nonfinite_updates + nonfinite
                    for key, value in stats.items():
                        totals[key] = totals.get(key, 0.0) + value.detach()
                    n_updates += 1
            per_member = {f"losses/{key}": value / n_updates for key, value in totals.items()}
            valid = self._member_major(batch["valid"]).float()
            per_member["losses/explained_variance"] = vmap(explained_variance)(
                self._member_major(batch["state_value"]), self._member_major(batch["value_target"]), valid)
            per_member["losses/nonfinite_updates"] = nonfinite_updates
            per_member["charts/learning_rate"] = self.lr.float()
        if self.iteration == 0 and self.step_fn.compiled:
            mark_compiled(self.compile_key)
        self._member_metrics = per_member
        self.iteration += 1
        metrics = {key: value.float().mean() for key, value in per_member.items()}
        metrics["losses/nonfinite_updates"] = nonfinite_updates.sum()
        metrics["losses/n_updates"] = torch.tensor(float(n_updates))
        return metrics

    def _shuffled_minibatches(self, flat: list, size: int):
        """Each member's own permutation (its generator, as ``iterate_minibatches`` draws it), ``n_minibatches``
        slices ``[K, size / n_minibatches, ...]`` of every loss input."""
        perms = torch.stack([torch.randperm(size, device=self.device, generator=g) for g in self.sample_generators])
        rows = torch.arange(self.n_members, device=self.device).unsqueeze(1)
        gathered = [tensor[rows, perms] for tensor in flat]
        step = size // self.cfg.n_minibatches
        return [[tensor[:, j * step:(j + 1) * step] for tensor in gathered] for j in range(self.cfg.n_minibatches)]

    # ------------------------------------------------------------------ per member
    def member_agent(self, m: int) -> nn.Module:
        """An ``nn.Module`` holding member m's current weights (one shared scratch module: use it before the next
        call)."""
        with torch.no_grad():
            for p, stacked in zip(self.scratch_agent.parameters(), self.params):
                p.copy_(stacked[m])
        return self.scratch_agent

    def member_summary(self, m: int) -> dict:
        returns, lengths = self.stats.members[m].recent()
        out = {"episodes": self.stats.members[m].count, "episode_window_full": returns.numel() == self.stats.window}
        if returns.numel():
            out.update(episode_return_mean=returns.mean().item(), episode_length_mean=lengths.double().mean().item())
        return out

    def episode_summary(self) -> dict:
        """Means over members of their last-100-episode figures, and ``episode_return_min`` (the loop's
        ``stop_at_return`` waits for every member)."""
        per = [self.member_summary(m) for m in range(self.n_members)]
        means = [s["episode_return_mean"] for s in per if "episode_return_mean" in s]
        out = {"episodes": sum(s["episodes"] for s in per),
               "episode_window_full": all(s["episode_window_full"] for s in per)}
        if len(means) == self.n_members:
            out["episode_return_mean"] = statistics.fmean(means)
            out["episode_return_min"] = min(means)
            out["episode_length_mean"] = statistics.fmean(s["episode_length_mean"] for s in per)
        return out

    def member_rows(self, elapsed_s: float) -> list[dict]:
        """One metrics row per member (with ``member``, ``seed`` and what ``--vary`` set), after running each member's
        rollback guard and noting when its last-100 mean first reached ``stop_at_return``."""
        from fastrl.loop import episode_metrics  # the loop's names; imported here, as the loop imports trainers' users
        rows = []
        for m, member in enumerate(self.members):
            recent = self.member_summary(m)
            hyper = member_hyperparameters(member, self.cfg)
            row = {"member": m, "seed": member.seed, "member_step": self.global_step // self.n_members,
                   "time/elapsed_s": elapsed_s,
                   "variant": variant_name(hyper), **hyper}
            row.update(episode_metrics(recent))
            row.update({key: value[m].item() for key, value in self._member_metrics.items()})
            if self.member_eval[m] is not None and self._eval_fresh:
                row["eval/return_mean"], row["eval/return_std"] = self.member_eval[m]
            judged = row.get("eval/return_mean") if self._eval_fresh else recent.get("episode_return_mean")
            window_full = True if self._eval_fresh else recent["episode_window_full"]
            reason = self.guards[m].observe(judged, window_full, row.get("losses/nonfinite_updates", 0.0),
                                            lambda m=m: self.member_weights(m), self.global_step)
            if reason is not None:
                self.roll_back_member(m, self.guards[m].best_state, member.rollback_lr_factor)
                row.update({"events/rollback": self.guards[m].rollbacks, "events/rollback_reason": reason})
            threshold = self.cfg.stop_at_return
            if threshold and self.reached[m] is None and recent.get("episode_return_mean", -math.inf) >= threshold:
                self.reached[m] = (self.global_step // self.n_members, elapsed_s)
            rows.append(row)
        self._eval_fresh = False
        return rows

    _eval_fresh = False

    def evaluate_members(self, normalizer_state=None, **evaluate_kwargs) -> list[tuple[float, float]]:
        """Each member's deterministic evaluation (``eval_seeds`` x ``eval_episodes`` episodes, the seeds of its
        single run): ``[(mean, std)]``. Also kept for the next ``member_rows``."""
        results = []
        for m, member in enumerate(self.members):
            returns = evaluate(self.member_agent(m), member, normalizer_state, member.eval_episodes, member.eval_seeds,
                               self.device, **evaluate_kwargs)
            results.append((returns.mean().item(), returns.std(unbiased=False).item()))
        self.member_eval, self._eval_fresh = results, True
        return results

    def member_weights(self, m: int) -> dict:
        """What member m's rollback restores: its parameter and optimizer-state slices."""
        return {"params": [p[m].clone() for p in self.params], "state": [[s[m].clone() for s in lst] for lst in self.state]}

    def roll_back_member(self, m: int, saved: dict, lr_factor: float) -> None:
        for p, value in zip(self.params, saved["params"]):
            p[m].copy_(value)
        for lst, values in zip(self.state, saved["state"]):
            for s, value in zip(lst, values):
                s[m].copy_(value)
        self.lr_scales[m] *= lr_factor
        self.stats.members[m].restart_window()
        print(f"fastrl: member {m} rolled back ({self.guards[m].rollbacks}/{self.members[m].max_rollbacks}) to the "
              f"weights of step {self.guards[m].best_step}; its lr scale is now {self.lr_scales[m]:g}")

    def population_summary(self) -> dict:
        """summary.json's ``members`` and the aggregates of the members' final figures (mean, std, IQM with a
        bootstrap 95% interval): for the last-100 training return and the final evaluation."""
        members = []
        for m, member in enumerate(self.members):
            recent = self.member_summary(m)
            reached = self.reached[m]
            members.append({"member": m, "seed": member.seed,
                            "hyperparameters": member_hyperparameters(member, self.cfg),
                            "episode_return_mean": recent.get("episode_return_mean"),
                            "eval_return_mean": self.member_eval[m][0] if self.member_eval[m] else None,
                            "steps_to_return": reached[0] if reached else None,
                            "time_to_return_s": reached[1] if reached else None})
        out = {"n_members": self.n_members, "members": members}
        for key in ("episode_return_mean", "eval_return_mean"):
            values = [row[key] for row in members if row[key] is not None]
            if values:
                out[f"members_{key}"] = aggregate(values, seed=self.cfg.seed)
        return out

    # ------------------------------------------------------------------ state
    def member_state(self, m: int) -> dict:
        """Member m in the single-run checkpoint format (``fastrl.checkpoint.trainer_state``)."""
        member = self.members[m]
        agent = self.member_agent(m)
        optimizer = make_optimizer(member, agent.parameters())
        keys = ("exp_avg", "exp_avg_sq") if self.kind == "adam" else ("square_avg",)
        for i, p in enumerate(agent.parameters()):
            optimizer.state[p] = {"step": self.state[-1][i][m].clone(),
                                  **{key: self.state[j][i][m].clone() for j, key in enumerate(keys)}}
        optimizer.param_groups[0]["lr"] = self.lr[m].item()
        rng = rng_state(self.sample_generators[m])
        rng["torch"] = self.action_generators[m].get_state()
        return {"model": copy.deepcopy(agent.state_dict()), "optimizer": optimizer.state_dict(),
                "global_step": self.global_step // self.n_members, "iteration": self.iteration,
                "lr_scale": self.lr_scales[m], "config": member.to_dict(), "normalizer": self.env.state_dict(),
                "episode_stats": self.stats.members[m].state_dict(), "rng": rng,
                "rollback_guard": {"rollbacks": self.guards[m].rollbacks}, "reached": self.reached[m]}

    def state_dict(self) -> dict:
        return {"population": True, "config": self.cfg.to_dict(), "global_step": self.global_step,
                "iteration": self.iteration, "members": [self.member_state(m) for m in range(self.n_members)]}

    def load_state_dict(self, state: dict) -> None:
        if not state.get("population") or len(state["members"]) != self.n_members:
            raise UserError(f"the checkpoint holds {len(state.get('members', [None]))} member(s), this run "
                            f"{self.n_members}: resume with the checkpoint's own --n-seeds/--vary")
        keys = ("exp_avg", "exp_avg_sq") if self.kind == "adam" else ("square_avg",)
        for m, saved in enumerate(state["members"]):
            agent = self.member_agent(m)
            agent.load_state_dict(saved["model"])
            for p, stacked in zip(agent.parameters(), self.params):
                stacked[m].copy_(p.detach())
            for i, entry in enumerate(saved["optimizer"]["state"].values()):
                self.state[-1][i][m].copy_(entry["step"])
                for j, key in enumerate(keys):
                    self.state[j][i][m].copy_(entry[key])
            self.lr_scales[m] = float(saved["lr_scale"])
            self.stats.members[m].load_state_dict(saved["episode_stats"])
            self.sample_generators[m].set_state(saved["rng"]["sample"])
            self.action_generators[m].set_state(saved["rng"]["torch"])
            self.guards[m].rollbacks = int(saved.get("rollback_guard", {}).get("rollbacks", 0))
            reached = saved.get("reached")
            self.reached[m] = tuple(reached) if reached else None
        self.global_step, self.iteration = int(state["global_step"]), int(state["iteration"])

    def weights_state(self) -> dict:
        return {m: self.member_weights(m) for m in range(self.n_members)}

    def roll_back(self, state: dict, lr_factor: float) -> None:
        for m, saved in state.items():
            self.roll_back_member(m, saved, lr_factor)

    def log_extras(self) -> dict:
        return self.timer.pop()

    def normalizer_state(self) -> dict:
        return self.env.state_dict()

    def summary_extras(self) -> dict:
        return {"n_envs_per_member": self.n_envs, "n_members": self.n_members}

    def close(self) -> None:
        self.env.close()


def interquartile_mean(values) -> float:
    """The mean of the middle 50% (rliable's IQM): sorted values, the lowest and highest quarter trimmed, with
    fractional weights where a quarter splits an element."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = x.size
    lo, hi = 0.25 * n, 0.75 * n
    weights = np.clip(np.minimum(np.arange(1, n + 1), hi) - np.maximum(np.arange(n), lo), 0.0, 1.0)
    return float((x * weights).sum() / weights.sum())


def aggregate(values, seed: int = 0, n_bootstrap: int = 2000) -> dict:
    """``mean``, ``std``, ``iqm`` and the IQM's percentile-bootstrap 95% interval (members resampled with
    replacement), as rliable reports a score over runs."""
    x = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    samples = x[rng.integers(0, x.size, size=(n_bootstrap, x.size))]
    iqms = np.array([interquartile_mean(row) for row in samples])
    return {"n": int(x.size), "mean": float(x.mean()), "std": float(x.std()), "iqm": interquartile_mean(x),
            "iqm_ci95": [float(np.percentile(iqms, 2.5)), float(np.percentile(iqms, 97.5))]}
