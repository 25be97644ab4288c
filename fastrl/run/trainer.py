"""The PPO / A2C trainer for one agent or a population of K members: a ``[T, K * n_envs]`` rollout, then one update.

It implements the run loop's trainer interface (see ``fastrl.run.loop``). A population (``--n-seeds``, ``--vary``) is
not another trainer: every tensor of the run state carries a leading member axis K, and a single run is K = 1.

- **Members** (``fastrl.run.population.member_configs``): member m runs with seed ``seed + m`` and its variant's
  values, and equals the single run of that config (``tests/test_population.py``).
- **Parameters** ``params [K, P]`` and **optimizer state** (``fastrl.learn.optim``) ``[K, P]`` / ``[K]``: one flat tensor
  each (``fastrl.learn.stacked``). At K = 1 the agent module's parameters are views of ``params[0]``.
- **Hyperparameters that vary or follow a schedule** (lr, clip_coef, ent_coef, vf_coef, max_grad_norm) are ``[K]``
  tensors, refilled in place each iteration, so nothing recompiles; gamma and gae_lambda enter each member's GAE.
- **Envs**: one batched env of ``K * n_envs`` envs; member m owns envs ``[m * n_envs, (m + 1) * n_envs)``, seeded as
  its single run's, with its own observation/reward normalizer and episode statistics.
- **Randomness**: each member's action noise and minibatch shuffles come from its own generators
  (``fastrl.distributed.seeding``), drawn outside the compiled graphs.
- **The update** is ``fastrl.learn.update.Update``, one pure function, called directly at K = 1 and through
  ``torch.func.vmap`` at K > 1, eagerly or compiled (``fastrl.run.compile.compile_plan``: a function of the config and
  the shapes only), ``steps_per_call`` minibatch steps per call.

Under torchrun (K = 1 only), ``n_envs`` is global and split evenly across ranks (``per_rank`` keeps it per rank).
The update is the same calls as one process's; only its ``Update`` carries ``fastrl.distributed.torchrun.rank_mean``: each
minibatch step averages its gradient over the ranks (one all-reduce, inside the compiled call when the update is
compiled), which equals the gradient of the global minibatch.
"""
from __future__ import annotations

import dataclasses
import statistics

import torch

from fastrl.config import Config, UserError
from fastrl.distributed import torchrun
from fastrl.distributed.async_collect import GroupedRollout, RolloutViews, Timer
from fastrl.distributed.seeding import env_seed, member_generator, seed_process
from fastrl.envs.async_env import make_async_env, resolve_env_mode
from fastrl.envs.batched import make_env
from fastrl.envs.buffers import make_rollout_buffer
from fastrl.learn.models import make_agent
from fastrl.learn.optim import annealed_clip_coef, annealed_lr
from fastrl.learn.ppo import compute_advantages, explained_variance
from fastrl.learn.precision import autocast_factory
from fastrl.learn.stacked import FlatLayout, MemberPolicy
from fastrl.learn.update import (HPARAM_KEYS, Update, UpdateSpec, copy_weights, epoch_end_mask, finish_metrics,
                                 hand_gradient_applies, initial_opt_state, members_call, minibatch_index)
from fastrl.run.allocator import keep_freed_memory
from fastrl.run.compile import CompiledOrEager, compile_plan, skip_guards
from fastrl.run.iteration import STATE_KEYS, Iteration, record_finished
from fastrl.run.members import MemberState
from fastrl.run.population import member_configs, varied_keys
from fastrl.run.recurrent import RecurrentCarry
from fastrl.run.rollout import CompiledRolloutStep, has_pure_step, sampling_noise
from fastrl.run.threads import rank_n_envs, torch_thread_counts, torch_threads


class Trainer(MemberState):
    """Owns the env, the members' parameters and optimizer state and the ``[T, K * n_envs]`` buffer.
    ``collect()`` then ``update()`` per iteration."""

    def __init__(self, cfg: Config, dist_info: torchrun.DistInfo | None = None, device: torch.device | None = None,
                 members: list[Config] | None = None):
        """``members``: the members' configs when they are not ``cfg``'s grid (``fastrl.cli.tune``'s trials); each differs
        from ``cfg`` in ``VARY_KEYS`` and its seed only."""
        self.cfg = cfg
        self.dist = dist_info or torchrun.DistInfo()
        self.device = device or torchrun.resolve_device(cfg.device)
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True)
        self.members = list(members) if members else member_configs(cfg)
        self.varied_keys = varied_keys(cfg, self.members)
        self.n_members = k = len(self.members)
        if k > 1 and self.dist.world_size > 1:
            raise UserError("--n-seeds/--vary run in one process; torchrun is not supported with them: drop torchrun, "
                            "or train one seed per torchrun job")
        rank = self.dist.rank
        seed_process(cfg.seed, rank)
        if self.device.type == "cpu":  # an eager CPU step's temporaries reused, not mapped afresh (fastrl.run.allocator)
            keep_freed_memory()
        self.n_envs = n = rank_n_envs(cfg, self.dist.world_size)  # per member, on this rank
        self.env_mode = resolve_env_mode(cfg, n)
        self.env = (make_async_env if self.env_mode == "async" else make_env)(
            cfg, n_envs=k * n, seed=env_seed(cfg.seed, rank, n), members=self.members)
        agents = []
        for member in self.members:  # each member's initial weights are its single run's (the same on every rank)
            torch.manual_seed(member.seed)
            agents.append(make_agent(member, self.env.observation_shape, self.env.action_spec, self.env.obs_scale))
        self.agent = agents[0].to(self.device)  # member 0's weights, live (at K = 1 the module that acts)
        widest = max((layer.out_features for layer in self.agent.modules() if isinstance(layer, torch.nn.Linear)),
                     default=0)
        self.collect_threads, self.update_threads = torch_thread_counts(
            cfg, self.device, k, len(self.env.observation_shape) == 1, widest, self.dist.world_size)
        if self.collect_threads:
            torch.set_num_threads(self.collect_threads)
        torchrun.broadcast_module_(self.agent)
        self.layout = FlatLayout(self.agent)
        self.params = torch.stack([self.layout.flatten(a) for a in [self.agent, *agents[1:]]]).to(self.device)
        self.layout.bind(self.agent, self.params[0])
        self.autocast = autocast_factory(self.device, cfg.amp)
        self.spec = UpdateSpec.of(cfg)
        if self.spec.algo == "ppo" and any(m.target_kl for m in self.members):  # per member, in hparams
            self.spec = dataclasses.replace(self.spec, target_kl=max(float(m.target_kl) for m in self.members))
        self.opt_state = initial_opt_state(self.spec, self.params)
        self.hparams = {key: torch.zeros(k, dtype=torch.float64 if key == "lr" else torch.float32, device=self.device)
                        for key in (*HPARAM_KEYS, "target_kl", "gamma", "gae_lambda")}
        self.lr_scales = [1.0] * k
        world = self.dist.world_size
        self.steps_per_iteration = k * n * cfg.n_steps * world  # env steps, all members and ranks
        self.n_iterations = max(1, cfg.total_steps // (n * cfg.n_steps * world))  # total_steps: per member
        self.total_steps = self.n_iterations * self.steps_per_iteration
        self.buffer = make_rollout_buffer(cfg.n_steps, k * n, self.env.observation_shape, self.env.observation_dtype,
                                          self.env.action_spec, self.device, getattr(self.agent, "state_size", 0))
        self.carry = RecurrentCarry(cfg, n, self.env_mode, self.buffer, self.device)
        self.action_generators = [member_generator(m.seed, "action", rank) for m in self.members]
        self.minibatch_generators = [member_generator(m.seed, "minibatch", rank, self.device) for m in self.members]
        width, self._draw = sampling_noise(self.env.action_spec)
        self.use_sde = bool(getattr(self.agent, "use_sde", False))
        if self.use_sde:  # gSDE: each env's exploration weights [L * A], held for sde_sample_freq steps
            width = self.agent.noise_width
        self.noise = torch.zeros(k * n, width)
        self._steps_since_rollout_start = 0
        self.policy = MemberPolicy(self.agent, self.layout, self.params, self.autocast)
        self.iteration = 0
        self._updates_here = 0  # iterations this object ran (see _warm_compiled)
        self.global_step = 0
        self.timer = Timer()
        self._member_metrics: dict = {}
        self._views = RolloutViews.of(self.buffer)
        self._plan_compiles()
        self.next_obs = self.env.reset()
        self.async_rollout = GroupedRollout(self.env.env, self.device) if self.env_mode == "async" else None

    # ------------------------------------------------------------------ compiling
    def _plan_compiles(self) -> None:
        """Decide, from the config and the shapes alone, what runs compiled (``self.plan``), and build the rollout
        forward, the rollout step and the update calls accordingly."""
        cfg, k = self.cfg, self.n_members
        # One pure function is the whole iteration where the env steps as one (env_backend torch): fastrl.run.iteration.
        whole = (self.env_mode == "sync" and has_pure_step(self.env) and cfg.algo in ("ppo", "a2c")
                 and not self.use_sde)
        gradient_steps = self.n_iterations * self.spec.n_steps
        self.plan = compile_plan(cfg.compile, self.device, gradient_steps, self.n_iterations * cfg.n_steps,
                                 self.n_iterations if whole else 0, self.spec.n_epochs, self.spec.n_minibatches,
                                 members=k,
                                 hand_gradient=k > 1 and hand_gradient_applies(self.spec, self.layout, self.autocast))
        self.iteration_call = None
        # A population's eager rollout forward stacks its members' layers as batched matmuls (fastrl/learn/stacked.py), so it
        # compiles under the same rule as one agent's: 3 CartPole members (zoo settings, 100k steps each) spent 13 s
        # compiling it to save 2 s of forwards (2026-12-04).
        rollout_mode = self.rollout_mode = self.plan.rollout
        policy = self.policy
        # Once per rollout: on CPU the eager forward costs less than compiling it (but not a vmapped one).
        forward_mode = rollout_mode if self.device.type == "cuda" or k > 1 else "off"
        self.policy_step = CompiledOrEager(policy.get_action_and_value, forward_mode, "the rollout policy forward")
        self.bootstrap_value = CompiledOrEager(policy.get_value, forward_mode, "the bootstrap value forward")
        update_mode, per_call = self.plan.update, self.plan.steps_per_call
        self.update_fn = Update.for_run(self.spec, self.layout, self.autocast, k, update_mode != "off", self.agent,
                                        torchrun.rank_mean() if self.dist.enabled else None, pure=whole)
        self.rollout_step = None
        if whole:
            return self._plan_iteration()
        if rollout_mode != "off" and self.device.type == "cpu" and self.env_mode == "sync" and not self.carry.recurrent:
            self.rollout_step = CompiledRolloutStep(policy, self._views, rollout_mode, self.draw_noise)
        self.steps_per_call = per_call
        spec = self.spec
        self._epoch_ends = {first: epoch_end_mask(first, min(per_call, spec.n_steps - first), spec.n_minibatches,
                                                  self.device) for first in range(0, spec.n_steps, per_call)}
        self.update_call = CompiledOrEager(self._update_chunk, update_mode, f"the {cfg.algo} update", fullgraph=True)
        self._mark_static(update_mode)

    def _mark_static(self, mode: str) -> None:
        """CUDA graphs (reduce-overhead) replay fixed addresses: the state the update writes in place is marked static."""
        if mode == "reduce-overhead" and self.device.type == "cuda":
            for tensor in (self.params, *self.opt_state.values(), *self.hparams.values()):
                torch._dynamo.mark_static_address(tensor)

    def _plan_iteration(self) -> None:
        """The run's ``fastrl.run.iteration.Iteration``, compiled whole (``self.plan``'s mode) or eager."""
        mode = self.rollout_mode = self.plan.update
        self.steps_per_call = self.spec.n_steps
        def iteration(scan: bool) -> Iteration:
            return Iteration(self.layout, getattr(self.env, "env", self.env).pure_step, self.update_fn,
                             self.cfg.n_steps, self.spec.n_minibatches, self.autocast, scan=scan)
        loops = iteration(scan=False)
        self.iteration_call = CompiledOrEager(iteration(scan=True) if mode != "off" else loops, mode,
                                              "the training iteration", fullgraph=True, eager=loops)
        self.update_call = self.iteration_call  # what tests and summaries ask about: compiled or not
        self._mark_static(mode)

    def _iterate(self) -> None:
        """One whole iteration (``fastrl.run.iteration``): draw its random numbers, call it, and write its new state
        back into the run's tensors, its rollout into ``buffer`` and its finished episodes into the env's stats."""
        self._set_hyperparameters()
        k, n, t = self.n_members, self.n_envs, self.cfg.n_steps
        env = getattr(self.env, "env", self.env)
        live = dict(zip(STATE_KEYS, (self.next_obs, *env.tensor_state, env.stats.running_return,
                                     env.stats.running_length)), **self.carry.tensors())
        device = self.device
        state = {"params": self.params, "opt_state": self.opt_state,
                 **{key: value.to(device).view(k, n, *value.shape[1:]) for key, value in live.items()}}
        width = self.noise.shape[1]
        draws = {"action_noise": torch.stack([self._draw(t, n, width, generator=g) for g in self.action_generators]),
                 "reset_uniform": torch.stack([torch.rand(t, n, env.spec.reset_draws, dtype=torch.float64, generator=g)
                                               for g in env.member_generators])}
        if self.cfg.algo != "a2c":
            draws["minibatch_index"] = self._minibatch_indices(t * n)
        draws = {key: value.to(device, non_blocking=True) for key, value in draws.items()}
        new_state, metrics = self.iteration_call(state, self.hparams, draws)
        copy_weights(self.params, self.opt_state, new_state["params"], new_state["opt_state"])
        for key, value in live.items():
            value.copy_(new_state[key].reshape(value.shape))
        rollout = {key: value.transpose(0, 1).reshape(t, k * n, *value.shape[3:]).cpu()
                   for key, value in metrics.pop("rollout").items()}
        record_finished(env.stats, rollout["done"], rollout["finished_return"], rollout["finished_length"])
        buffer = self.buffer
        for key in self.spec.loss_keys:
            buffer[key].copy_(rollout[key])
        for key in ("reward", "done", "terminated", "truncated"):
            buffer["next", key].copy_(rollout[key])
        buffer["next", "state_value"].copy_(rollout["next_value"])
        self._iteration_metrics = metrics
        self.global_step += self.steps_per_iteration

    def _warm_compiled(self) -> bool:
        """From this trainer's own second iteration on, every compiled function has compiled for the inputs it sees:
        the hot loops skip guard evaluation (``fastrl.run.compile.skip_guards``). Counted here, not from ``iteration``,
        which a resume restores: a trainer built on a saved state (``fastrl tune``'s next, smaller segment in the
        same process) must first compile for its own shapes, which under skipped guards would fail to eager."""
        return self._updates_here >= 1 and (self.rollout_mode != "off" or self.plan.update != "off")

    # ------------------------------------------------------------------ hot path
    def finished(self) -> bool:
        return self.iteration >= self.n_iterations

    def draw_noise(self, rows: int | None = None) -> torch.Tensor:
        """Sampling noise for ``rows`` rows of each member (default ``n_envs``): ``[K * rows, width]``, member m's rows
        from member m's generator (at K = 1: one draw). gSDE (``use_sde``): the rollout's exploration weights, drawn
        afresh on its first step and then every ``sde_sample_freq`` steps (-1: never), the same tensor otherwise."""
        rows = self.n_envs if rows is None else rows
        if self.use_sde:
            age, freq = self._steps_since_rollout_start, self.cfg.sde_sample_freq
            self._steps_since_rollout_start += 1
            if age > 0 and not (freq > 0 and age % freq == 0):
                return self.noise
        noise = self.noise[:rows * self.n_members] if rows != self.n_envs else self.noise
        for m, generator in enumerate(self.action_generators):
            self._draw(rows, noise.shape[1], generator=generator, out=noise[m * rows:(m + 1) * rows])
        return noise

    def act(self, obs: torch.Tensor, t: int | None = None) -> tuple:
        """The rollout forward on ``obs [K * rows, ...]`` (member-major): ``(action, logp, entropy, value)``; a
        recurrent policy's at row ``t``, which carries its state on."""
        noise = self.draw_noise(obs.shape[0] // self.n_members)
        return self.carry.act(self.policy_step, obs, noise, t)

    def collect(self) -> bool:
        """Fill the ``[T, K * n]`` buffer. Per step: one policy forward, one env step, slice writes; no .item().
        Where the iteration is one function (``iteration_call``), the whole iteration, update included."""
        if self.iteration_call is not None:
            # The rollout's thread count: PureJaxRL's config compiled, 1 member ran 24 ms an iteration on 1 thread
            # and 38 on 2; 4 members 42 and 34, 16 members 135 and 80 (2-core AMD EPYC, 2026-12-06).
            with self.timer.section("iteration"), skip_guards(self._warm_compiled()), \
                    torch_threads(self.collect_threads):
                self._iterate()
            return True
        with self.timer.section("collect"), torch.no_grad(), skip_guards(self._warm_compiled()):
            self._collect()
        return True

    def _collect(self) -> None:
        self._steps_since_rollout_start = 0  # gSDE draws new exploration weights on each rollout's first step
        rollout_step, env, n_steps, v = self.rollout_step, self.env, self.cfg.n_steps, self._views
        obs = self.next_obs
        if self.async_rollout is not None:  # the env's groups in turn (fastrl.distributed.async_collect)
            self.next_obs = self.async_rollout.run(v, obs, self.act, self.bootstrap_value, self.timer)
            self.global_step += self.steps_per_iteration
            return
        # CPU, compiled: CompiledRolloutStep (forward, sampling and writes in one graph); else the eager forward.
        act = rollout_step if rollout_step is not None else self._act_eager
        for t in range(n_steps):
            with self.timer.section("policy"):
                action = act(obs, t)
            with self.timer.section("env"):
                step = env.step(action)
            v.write_env(t, step)
            obs = step.observation
        self._finish_rollout(obs)

    def _act_eager(self, obs: torch.Tensor, t: int) -> torch.Tensor:
        """The policy forward (compiled on CUDA and for K > 1) and row ``t``'s writes; the action on the CPU."""
        action, logp, _, value = self.act(obs, t)
        self._views.write_policy(t, obs, action, logp, value)
        return action.cpu()

    def _finish_rollout(self, obs: torch.Tensor) -> None:
        v = self._views
        with self.timer.section("policy"):
            # next_value[t] = V(obs after step t): the next row's value, and a bootstrap forward for the last row.
            v.next_value[:-1].copy_(v.state_value[1:])
            v.next_value[-1].copy_(self.carry.bootstrap(self.bootstrap_value, obs))
        self.next_obs = obs
        self.global_step += self.steps_per_iteration

    # ------------------------------------------------------------------ the update
    def _member_major(self, tensor: torch.Tensor) -> torch.Tensor:
        """``[T, K * n, ...]`` -> ``[K, T * n, ...]``: member m's rollout, flattened time-major as its single run's."""
        t, k, n = tensor.shape[0], self.n_members, self.n_envs
        rest = tensor.shape[2:]
        return tensor.reshape(t, k, n, *rest).transpose(0, 1).reshape(k, t * n, *rest)

    def _set_hyperparameters(self) -> None:
        progress = self.iteration / self.n_iterations
        values = {"lr": [annealed_lr(m, progress, s) for m, s in zip(self.members, self.lr_scales)],
                  "clip_coef": [annealed_clip_coef(m, progress) for m in self.members],
                  "ent_coef": [m.ent_coef for m in self.members], "vf_coef": [m.vf_coef for m in self.members],
                  "max_grad_norm": [m.max_grad_norm for m in self.members],
                  "target_kl": [m.target_kl if self.spec.target_kl else 0.0 for m in self.members],
                  "gamma": [m.gamma for m in self.members], "gae_lambda": [m.gae_lambda for m in self.members]}
        for key, tensor in self.hparams.items():
            tensor.copy_(torch.tensor(values[key], dtype=tensor.dtype))

    def _update_chunk(self, params, opt_state, batch, index, hparams, active, epoch_ends):
        """Some minibatch steps of every member (``index [K, count, mb]``; None for A2C), written back in place:
        ``(sums, active)``, each ``[K]``. ``epoch_ends [count]``: see ``Update.steps``."""
        update = self.update_fn

        def one_member(p, s, b, i, h, a):
            return update.steps(p, s, b, i, h, a, epoch_ends)
        if update.path in ("module", "functional"):  # one member's steps, vmapped over the K members (K = 1: none)
            one_member = members_call(self.n_members, one_member, (0, 0, 0, None if index is None else 0, 0, 0))
        new_params, new_state, sums, active = one_member(params, opt_state, batch, index, hparams, active)
        copy_weights(params, opt_state, new_params, new_state)
        return sums, active

    def update(self) -> dict:
        """Each member's GAE, then every member's minibatch steps at once. Returns 0-d metrics (means over members;
        ``member_rows`` has each member's)."""
        if self.iteration_call is not None:  # collect() ran the whole iteration
            return self._finish_update({f"losses/{key}": value for key, value in self._iteration_metrics.items()})
        self._set_hyperparameters()
        with self.timer.section("update"), skip_guards(self._warm_compiled()), torch_threads(self.update_threads):
            batch = self.buffer.to(self.device, non_blocking=True) if self.device.type != "cpu" else self.buffer
            self._advantages(batch)
            inputs = tuple(self._member_major(batch[key]) for key in self.spec.loss_keys)
            index = self._minibatch_indices(inputs[0].shape[1]) if self.cfg.algo != "a2c" else None
            sums = self.minibatch_steps(inputs, index)
            per_member = {f"losses/{key}": value for key, value in finish_metrics(sums).items()}
            valid = self._member_major(batch["valid"]).float()
            per_member["losses/explained_variance"] = explained_variance(
                self._member_major(batch["state_value"]), self._member_major(batch["value_target"]), valid, dim=-1)
        return self._finish_update(per_member)

    def _minibatch_indices(self, size: int) -> torch.Tensor:
        """Each member's minibatch rows of a ``size``-row batch, ``[K, n_epochs * n_minibatches, mb]``."""
        return torch.stack([minibatch_index(size, self.spec.n_epochs, self.spec.n_minibatches, g, self.device,
                                            self.spec.sequence_length) for g in self.minibatch_generators])

    def _finish_update(self, per_member: dict) -> dict:
        per_member["charts/learning_rate"] = self.hparams["lr"].float()
        if any(m.anneal_clip for m in self.members):
            per_member["charts/clip_coef"] = self.hparams["clip_coef"].clone()
        self._member_metrics = per_member
        self.iteration += 1
        self._updates_here += 1
        metrics = {key: value.float().mean() for key, value in per_member.items()}
        metrics["losses/nonfinite_updates"] = per_member["losses/nonfinite_updates"].sum()
        return metrics

    def minibatch_steps(self, inputs: tuple, index) -> dict:
        """Every minibatch step of one update, ``steps_per_call`` per ``update_call``, on the members' loss inputs
        (``LOSS_KEYS``, each ``[K, B, ...]``) and their rows ``index [K, n_epochs * n_minibatches, mb]`` (None: A2C's
        one step on the whole batch); ``params`` and ``opt_state`` are updated in place. Returns the summed step
        statistics (``Update.steps``), each ``[K]``."""
        spec = self.spec
        active = torch.ones(self.n_members, dtype=torch.bool, device=self.device)
        parts = []
        for first in range(0, spec.n_steps, self.steps_per_call):
            count = min(self.steps_per_call, spec.n_steps - first)
            chunk = None if index is None else index[:, first:first + count]
            part, active = self.update_call(self.params, self.opt_state, inputs, chunk, self.hparams, active,
                                            self._epoch_ends[first])
            parts.append(part)
        # The calls' statistics summed once (an eager update makes a call per step)
        return parts[0] if len(parts) == 1 else {key: torch.stack([part[key] for part in parts]).sum(0)
                                                 for key in parts[0]}

    def _advantages(self, batch) -> None:
        """GAE per member (one call when every member shares gamma and gae_lambda)."""
        if len({(m.gamma, m.gae_lambda) for m in self.members}) == 1:
            compute_advantages(batch, self.members[0].gamma, self.members[0].gae_lambda)
            return
        n = self.n_envs
        for m, member in enumerate(self.members):
            compute_advantages(batch[:, m * n:(m + 1) * n], member.gamma, member.gae_lambda)

    def member_stats(self, m: int):
        return self.env.stats.members[m]

    def episode_summary(self) -> dict:
        """Recent-episode statistics: for K > 1 the means over members, with ``episode_return_min`` (the loop's
        ``stop_at_return`` waits for every member); under torchrun all-reduced so rank 0 reports global figures.

        Under torchrun each rank contributes its last ``window / world_size`` episodes, so the figure covers the
        last ``window`` (100) episodes of the whole job, as in one process, not a window W times as long.
        """
        if self.n_members > 1:
            per = [self.member_episode_summary(m) for m in range(self.n_members)]
            means = [s["episode_return_mean"] for s in per if "episode_return_mean" in s]
            out = {"episodes": sum(s["episodes"] for s in per),
                   "episode_window_full": all(s["episode_window_full"] for s in per)}
            if len(means) == self.n_members:
                out["episode_return_mean"] = statistics.fmean(means)
                out["episode_return_min"] = min(means)
                out["episode_length_mean"] = statistics.fmean(s["episode_length_mean"] for s in per)
            return out
        stats = self.env.stats
        per_rank = max(1, stats.window // self.dist.world_size)
        returns, lengths = stats.recent(per_rank)
        full = float(returns.numel() == per_rank)
        sums = torch.tensor([returns.sum().item(), float(returns.numel()), lengths.double().sum().item(), full,
                             float(stats.count)], dtype=torch.float64)
        if self.dist.enabled:
            sums = sums.to(self.device) if self.device.type == "cuda" else sums
            torchrun.all_reduce_(sums)
            sums = sums.cpu()
        total, count, length_total, full_ranks, episodes = sums.tolist()
        if count == 0:
            return {}
        # The last episode's own return is this rank's (rank 0 logs it), not a reduction over ranks.
        last = stats.recent(1)[0]
        return {"episode_return_mean": total / count, "episode_length_mean": length_total / count,
                "episode_window_full": full_ranks == self.dist.world_size, "episodes": int(episodes),
                **({"episode_return_last": last.item()} if last.numel() else {})}

    def log_extras(self) -> dict:
        """Per-log-interval diagnostics: seconds in each named section since the last log."""
        return self.timer.pop()

    def normalizer_state(self, m: int = 0) -> dict:
        """Member m's observation/reward normalizer statistics (for its evaluation envs)."""
        return self.env.state_dict(m)

    def load_normalizer(self, state: dict, m: int = 0) -> None:
        self.env.load_state_dict(state, m)

    def summary_extras(self) -> dict:
        out = {"n_envs_per_rank": self.n_envs, "env_mode": self.env_mode,
               "compiled": {**self.plan.to_dict(), "rollout": self.rollout_mode, "step_path": self.update_fn.path}}
        if self.n_members > 1:
            out.update(n_envs_per_member=self.n_envs, n_members=self.n_members)
        return out

    def close(self) -> None:
        self.env.close()
