"""One PPO / A2C training iteration as one pure function, for envs whose step is a pure tensor function
(``env_backend: torch``, ``fastrl.envs.torch_envs``):

    Iteration(...)(state, hparams, draws) -> (state, metrics)

T rollout steps (policy, env step, auto-reset, per-env episode bookkeeping), the bootstrap value, GAE, then every
minibatch step of every epoch (``fastrl.learn.update.Update``). Nothing is written in place and nothing reads the host,
so the same function runs eagerly, under ``torch.compile(fullgraph=True)`` (one graph for the whole iteration),
over a population's members (vmapped when compiled, eagerly as batched matmuls: ``Iteration``), and in CUDA graphs.

Every tensor carries a leading member axis K (K = 1 is a single run):

- ``state``: ``params [K, P]``, ``opt_state`` (``fastrl.learn.optim``, ``[K, ...]``), ``observation [K, N, *obs]`` (the
  observation the next step acts on), the env state ``physics [K, N, S]`` float64, ``elapsed [K, N]`` int64,
  ``prev_done [K, N]`` bool, and ``running_return [K, N]`` float64 / ``running_length [K, N]`` int64 (the episodes
  in progress, as ``fastrl.envs.stats.EpisodeStats`` keeps them); a recurrent policy's ``recurrent_state [K, N, S]``
  and ``episode_start [K, N]`` (``fastrl.run.recurrent``), which its rollout rows and loss inputs gain too.
- ``hparams [K]``: ``HPARAM_KEYS``, ``target_kl``, ``gamma`` and ``gae_lambda``.
- ``draws``: ``action_noise [K, T, N, width]`` (``fastrl.run.rollout.sampling_noise``), ``reset_uniform [K, T, N, R]``
  (``TorchEnv.draw_reset_uniform``'s) and, for PPO, ``minibatch_index [K, n_epochs * n_minibatches, mb]``. Torch
  has no functional random keys as JAX has, so randomness is an input: each member's generators draw one
  iteration's numbers outside the function, in one call each.
- ``metrics``: the update's means ``[K]`` (``fastrl.learn.update.finish_metrics``) and ``explained_variance``, and the
  rollout ``[K, T, N, ...]`` (``ROLLOUT_KEYS``, with ``advantage``, ``value_target`` and ``next_value``) with each
  step's ``finished_return`` / ``finished_length`` (read where ``done``).

Compiled, the rollout and the minibatch steps are ``torch._higher_order_ops.scan`` loops, so the graph holds one
rollout step and one minibatch step whatever T and the step count (unrolled, a 128-step rollout took 146 s to
compile on a 2-core EPYC, as a scan 14 s). Eagerly they are Python loops: the twins the tests compare them with.
"""
from __future__ import annotations

from contextlib import nullcontext
from functools import partial

import torch

from fastrl.kernels.gae import gae_reference
from fastrl.learn.ppo import explained_variance
from fastrl.learn.update import Update, epoch_end_mask, finish_metrics, members_call

STATE_KEYS = ("observation", "physics", "elapsed", "prev_done", "running_return", "running_length")
ROLLOUT_KEYS = ("observation", "action", "sample_log_prob", "state_value", "reward", "done", "terminated",
                "truncated", "valid", "finished_return", "finished_length")


def gae_scan(reward, value, next_value, done, terminated, gamma, lam):
    """GAE over ``[T, N]`` as a reverse scan (``kernels.gae``'s recursion; its twin is ``kernels.gae.gae_reference``):
    ``(advantage, value_target)`` float32."""
    from torch._higher_order_ops.scan import scan
    not_done, not_terminated = 1.0 - done.float(), 1.0 - terminated.float()

    def body(last, row):
        r, v, nv, nd, nt = row
        last = (r + gamma * nt * nv - v + gamma * lam * nd * last).contiguous()
        return last, last.clone()
    # contiguous: under vmap a row of the rollout can have another layout than the carry the body returns.
    init = torch.zeros_like(reward[0], memory_format=torch.contiguous_format)
    _, advantage = scan(body, init, (reward, value, next_value, not_done, not_terminated), reverse=True)
    return advantage, advantage + value


class Iteration:
    """The iteration of one run (see the module docstring).

    ``layout``: the agent's ``fastrl.learn.stacked.FlatLayout``; ``env_step``: ``fastrl.envs.torch_envs.env_step`` bound to
    its env (``TorchEnv.pure_step``); ``update``: the run's ``Update``, on the ``functional`` path (compiled) or,
    eagerly, a members path (``fastrl.learn.update.step_path``, ``pure``); ``scan``: the rollout, GAE and the
    minibatch steps as scans (compiled) or Python loops (eager). Each step handles every member at once. On the functional path, one
    member's rollout and minibatch steps under ``vmap`` (a vmapped scan's batching rule gave layouts that ran about 50x
    slower). On a members path, eagerly, without vmap: the policy through ``FlatLayout.call_members`` (batched matmuls
    for an MLP, or an LSTM over one), the env on all members' envs as one batch, the update's steps on the ``[K, ...]``
    rows themselves. (Compiled, ``call_members`` would guard on the agent's parameters' ids: each new trainer in a
    process would compile again.)"""

    def __init__(self, layout, env_step, update: Update, n_steps: int, n_minibatches: int, autocast=nullcontext,
                 scan: bool = False):
        self.layout, self.env_step, self.update, self.autocast = layout, env_step, update, autocast
        self.n_steps, self.n_minibatches, self.scan = n_steps, n_minibatches, scan
        self.members_native = update.path != "functional"
        # A recurrent policy's state and next episode_start ride in the carry (fastrl.run.recurrent), the episode
        # starts in the rows.
        recurrent = bool(update.spec.sequence_length)
        self.state_keys = STATE_KEYS + (("recurrent_state", "episode_start") if recurrent else ())
        self.rollout_keys = ROLLOUT_KEYS + (("episode_start",) if recurrent else ())

    def __call__(self, state: dict, hparams: dict, draws: dict):
        """K members: ``(state, metrics)``, every tensor ``[K, ...]`` (see the module docstring)."""
        params = state["params"]
        k = params.shape[0]
        carry, rows = self.rollout(params, tuple(state[key] for key in self.state_keys), draws["action_noise"],
                                   draws["reset_uniform"])  # rows [T, K, N, ...]
        with self.autocast():
            value_of = (partial(self.layout.call_members, "get_value") if self.members_native else
                        members_call(k, partial(self.layout.call, "get_value")))
            bootstrap = value_of(params, carry[0], *carry[len(STATE_KEYS):]).float()
        if len(carry) > len(STATE_KEYS):  # each column's state at the rollout's start, in every row
            start = state["recurrent_state"]  # a copy: the caller writes the new state into the tensor it gave
            rows["recurrent_state"] = start[None].expand(self.n_steps, *start.shape).clone()
        rows["next_value"] = torch.cat([rows["state_value"][1:], bootstrap[None]])
        gae = gae_scan if self.scan else gae_reference
        rows["advantage"], rows["value_target"] = gae(
            rows["reward"], rows["state_value"], rows["next_value"], rows["done"], rows["terminated"],
            hparams["gamma"][:, None], hparams["gae_lambda"][:, None])
        rollout = {key: value.transpose(0, 1) for key, value in rows.items()}  # [K, T, N, ...]
        inputs = tuple(rollout[key].flatten(1, 2) for key in self.update.spec.loss_keys)  # [K, T * N, ...] time-major
        active = torch.ones_like(params[:, 0], dtype=torch.bool)
        index, update = draws.get("minibatch_index"), self.update
        epoch_ends = None if index is None else epoch_end_mask(0, index.shape[1], self.n_minibatches, params.device)
        if update.path != "functional":  # a members path: every member's steps on their [K, ...] rows at once
            params, opt_state, sums, _ = update.steps(params, state["opt_state"], inputs, index, hparams, active,
                                                      epoch_ends)
        elif index is None:  # A2C: one step on the whole rollout
            steps = members_call(k, update.steps, (0, 0, 0, None, 0, 0))
            params, opt_state, sums, _ = steps(params, state["opt_state"], inputs, None, hparams, active)
        else:
            params, opt_state, sums, _ = update.scan_steps(params, state["opt_state"], inputs, index, hparams, active,
                                                           epoch_ends, loop=not self.scan)
        metrics = {**finish_metrics(sums), "rollout": rollout,
                   "explained_variance": explained_variance(inputs[4], inputs[5], inputs[6].float(), dim=-1)}
        return {"params": params, "opt_state": opt_state, **dict(zip(self.state_keys, carry))}, metrics

    def rollout(self, params, carry: tuple, action_noise, reset_uniform):
        """T steps of every member from ``carry`` (``STATE_KEYS``' tensors, ``[K, N, ...]``): ``(carry, rows)``,
        ``rows`` ``ROLLOUT_KEYS`` each ``[T, K, N, ...]``."""
        step = self.rollout_step if self.members_native else members_call(params.shape[0], self.rollout_step)

        def body(carry, noise_and_reset):
            return step(params, carry, *noise_and_reset)
        # contiguous [T, K, N, ...]: a scan's traced step takes its slices' strides as given (the members' batched
        # step flattens K and N)
        xs = (action_noise.transpose(0, 1).contiguous(), reset_uniform.transpose(0, 1).contiguous())
        if self.scan:
            from torch._higher_order_ops.scan import scan
            carry, rows = scan(body, carry, xs)
        else:
            per_step = []
            for t in range(self.n_steps):
                carry, row = body(carry, (xs[0][t], xs[1][t]))
                per_step.append(row)
            rows = tuple(torch.stack(column) for column in zip(*per_step))
        return carry, dict(zip(self.rollout_keys, rows))

    def rollout_step(self, params, carry: tuple, noise, reset_uniform):
        """One step of every member (``[K, N, ...]``; one member's ``[N, ...]`` under vmap on the functional path):
        the policy acts on the carried observation, the env steps
        (auto-resetting envs whose previous step ended an episode), and the running episode totals follow
        ``EpisodeStats.update``'s bookkeeping."""
        obs, physics, elapsed, prev_done, running_return, running_length = carry[:len(STATE_KEYS)]
        recurrent = carry[len(STATE_KEYS):]  # (state, episode_start) of a recurrent policy
        with self.autocast():
            policy = self.layout.call_members if self.members_native else self.layout.call
            action, logp, _, value, *state = policy("get_action_and_value", params, obs, None, noise, *recurrent)
        env_args = (physics, elapsed, prev_done, action, reset_uniform)
        if self.members_native:  # [K, N, ...]: every member's envs as one batch
            k, n = obs.shape[:2]
            stepped = [x.reshape(k, n, *x.shape[1:]) for x in self.env_step(*(x.flatten(0, 1) for x in env_args))]
        else:  # one member's [N, ...], under vmap
            stepped = self.env_step(*env_args)
        physics, elapsed, done, next_obs, reward, terminated, truncated, valid = stepped
        episode_return = running_return + reward.double() * valid
        episode_length = running_length + valid
        # contiguous: under vmap a step's outputs may come out in another memory layout than the carry went in,
        # which a scan refuses.
        carry = tuple(x.contiguous() for x in (next_obs, physics, elapsed, done,
                      torch.where(done, torch.zeros_like(episode_return), episode_return),
                      torch.where(done, torch.zeros_like(episode_length), episode_length),
                      *((state[0], ~valid) if recurrent else ())))
        # Outputs are fresh tensors: a scan's outputs may alias neither its inputs nor each other.
        row = (obs.clone(), action, logp.float(), value.float(), reward, done.clone(), terminated, truncated, valid,
               episode_return, episode_length, *((recurrent[1].clone(),) if recurrent else ()))
        return carry, row


def record_finished(stats, done: torch.Tensor, finished_return: torch.Tensor, finished_length: torch.Tensor) -> None:
    """Hand a rollout's finished episodes (``[T, K * N]``, read where ``done``) to the env's ``EpisodeStats`` in the
    order the step-by-step bookkeeping records them: time-major, then env order."""
    returns, lengths = finished_return[done].numpy(), finished_length[done].numpy()
    stats.record(returns, lengths, done.nonzero()[:, 1].numpy())  # a population's: to its members' rings too
