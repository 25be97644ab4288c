"""IMPALA and APPO: V-trace targets for a batch of actor rollouts, the two losses and the updates.

No env, process or file code here. A learner batch is a ``[T, N]`` TensorDict with the rollout keys
(``observation``, ``action``, ``sample_log_prob`` = the behaviour policy's log-prob, ``valid``,
``("next", "reward" | "done" | "terminated")``), passed with ``bootstrap_observation [N, *obs]``, the
observation after the last step: together the T+1 observations obs[0..T]. The learner evaluates all of them in one
forward, so ``value[t] = V(obs[t])`` and ``next_value[t] = value[t + 1]`` come from the LEARNER's critic.
Because the env returns an episode's real final observation on the step that ends it (and only
auto-resets on the following, invalid step), ``value[t + 1]`` is the right bootstrap for a truncated
episode, and V-trace's ``terminated`` / ``done`` cut the rest.

Every mean is over ``valid``: auto-reset steps never reach a loss or a statistic.

- ``impala_update``: the IMPALA paper's loss (one gradient step per batch with n_minibatches = 1):
  ``-rho_t * (r_t + gamma * vs_{t+1} - V(s_t)) * log pi(a_t|s_t) + vf_coef * 0.5 * (vs_t - V(s_t))^2 - ent_coef * H``.
- ``appo_update``: V-trace once per batch with the learner's current policy, then PPO's clipped
  objective (ratio = pi / behaviour) over the V-trace advantages for ``n_epochs x n_minibatches`` steps,
  as in Sample Factory.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
from tensordict import TensorDict

from fastrl import kernels
from fastrl.optim import backward_step
from fastrl.buffers import iterate_minibatches
from fastrl.ppo import explained_variance, masked_mean


def learner_forward(agent, observation: torch.Tensor, bootstrap_observation: torch.Tensor, action: torch.Tensor,
                    autocast=nullcontext):
    """One forward over the T+1 observations ``obs[0..T]`` (the model under ``autocast``; outputs float32).

    ``observation [T, N, *obs]``, ``bootstrap_observation [N, *obs]``, ``action [T, N, ...]`` ->
    ``target_logp [T, N]``, ``entropy [T, N]``, ``value [T + 1, N]`` (differentiable).
    """
    T, N = observation.shape[:2]
    obs = torch.cat([observation, bootstrap_observation.unsqueeze(0)])
    # The last row's action is a placeholder (a copy of the previous row's): its log-prob is discarded.
    act = torch.cat([action, action[-1:]])
    with autocast():
        _, logp, entropy, value = agent.get_action_and_value(obs.flatten(0, 1), act.flatten(0, 1))
    logp, entropy, value = logp.float(), entropy.float(), value.float()
    return logp.view(T + 1, N)[:T], entropy.view(T + 1, N)[:T], value.view(T + 1, N)


def vtrace_targets(batch: TensorDict, target_logp: torch.Tensor, value: torch.Tensor, cfg):
    """V-trace ``vs`` and ``pg_advantage`` ``[T, N]`` plus 0-d importance-weight statistics.

    ``value [T + 1, N]`` is the learner's critic on obs[0..T]; gradients never flow through the targets.
    """
    nxt = batch["next"]
    behavior_logp = batch["sample_log_prob"]
    target_logp, value = target_logp.detach(), value.detach()
    vs, pg_advantage = kernels.vtrace(behavior_logp, target_logp, nxt["reward"], value[:-1], value[1:], nxt["done"],
                                      nxt["terminated"], cfg.gamma, rho_bar=cfg.rho_bar, c_bar=cfg.c_bar,
                                      lam=cfg.vtrace_lambda)
    valid = batch["valid"].float()
    ratio = torch.exp(target_logp - behavior_logp)
    stats = {"vtrace/rho_mean": masked_mean(ratio.clamp(max=cfg.rho_bar), valid),
             "vtrace/ratio_mean": masked_mean(ratio, valid),
             "vtrace/rho_clipfrac": masked_mean((ratio > cfg.rho_bar).float(), valid)}
    return vs, pg_advantage, stats


def impala_update(agent, optimizer: torch.optim.Optimizer, batch: TensorDict, bootstrap_observation: torch.Tensor,
                  cfg, generator: torch.Generator | None = None, autocast=nullcontext, scaler=None) -> dict:
    """IMPALA gradient steps on a ``[T, N]`` batch; returns 0-d tensor diagnostics averaged over the steps.

    One step per minibatch of ``n_minibatches`` shuffled groups of env columns (``[T, N / M]``, so every
    minibatch keeps its time structure), with V-trace recomputed per minibatch from the current weights.
    Every sample is used once: ``n_epochs`` is PPO/APPO's knob and is ignored here, because reusing a batch
    without APPO's clipped ratio collapsed the policy (CartPole, LunarLander). ``n_minibatches = 1`` is the
    paper's learner: one step per batch.
    Per step: one forward over (T+1) x N/M observations, one V-trace kernel, and ``fastrl.optim.backward_step`` (backward,
    grad-norm clip, optimizer step; a NaN/Inf loss or gradient skips the step); no host sync with fused Adam.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    n_envs = batch.batch_size[1]
    totals: dict = {}
    n_steps = 0
    nonfinite_updates = torch.zeros((), dtype=torch.int64, device=bootstrap_observation.device)
    order = torch.randperm(n_envs, device=bootstrap_observation.device, generator=generator)
    for cols in order.view(cfg.n_minibatches, n_envs // cfg.n_minibatches):
        minibatch, boot = (batch, bootstrap_observation) if cfg.n_minibatches == 1 else (batch[:, cols], bootstrap_observation[cols])
        valid = minibatch["valid"]
        target_logp, entropy, value = learner_forward(agent, minibatch["observation"], boot, minibatch["action"],
                                                      autocast)
        vs, pg_advantage, stats = vtrace_targets(minibatch, target_logp, value, cfg)
        loss, step_stats = kernels.pg_loss(target_logp, pg_advantage, value[:-1], vs, entropy, valid, cfg.vf_coef,
                                           cfg.ent_coef, normalize_advantage=cfg.norm_adv)
        grad_norm, nonfinite = backward_step(loss, optimizer, params, cfg.max_grad_norm, None, scaler)
        nonfinite_updates = nonfinite_updates + nonfinite
        step_stats = {f"losses/{k}": v for k, v in step_stats.items()}
        step_stats["losses/grad_norm"] = grad_norm
        step_stats["losses/explained_variance"] = explained_variance(value[:-1].detach(), vs, valid.float())
        step_stats.update(stats)
        for key, v in step_stats.items():
            totals[key] = totals.get(key, 0.0) + v.detach()
        n_steps += 1
    metrics = {k: v / n_steps for k, v in totals.items()}
    metrics["losses/n_updates"] = torch.tensor(float(n_steps))
    metrics["losses/nonfinite_updates"] = nonfinite_updates.float()  # skipped for a NaN/Inf loss or gradient
    return metrics


def appo_update(agent, optimizer: torch.optim.Optimizer, batch: TensorDict, bootstrap_observation: torch.Tensor, cfg,
                generator: torch.Generator | None = None, autocast=nullcontext, scaler=None) -> dict:
    """APPO on a ``[T, N]`` batch: V-trace with the current learner policy, then PPO-clip minibatch steps.

    The ratio is pi / behaviour policy (``sample_log_prob``); value clipping (``clip_vloss``) is around
    the learner's value before this update. Returns 0-d tensor diagnostics averaged over the steps.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    with torch.no_grad():
        target_logp, _, value = learner_forward(agent, batch["observation"], bootstrap_observation, batch["action"],
                                                autocast)
    vs, pg_advantage, stats = vtrace_targets(batch, target_logp, value, cfg)
    flat = TensorDict({"observation": batch["observation"], "action": batch["action"],
                       "sample_log_prob": batch["sample_log_prob"], "valid": batch["valid"],
                       "advantage": pg_advantage, "value_target": vs, "state_value": value[:-1]},
                      batch_size=batch.batch_size)
    totals: dict = {}
    n_steps = 0
    nonfinite_updates = torch.zeros((), dtype=torch.int64, device=bootstrap_observation.device)
    for _epoch in range(cfg.n_epochs):
        for minibatch in iterate_minibatches(flat, cfg.n_minibatches, generator):
            with autocast():
                _, new_logp, entropy, new_value = agent.get_action_and_value(minibatch["observation"],
                                                                             minibatch["action"])
            loss, step_stats = kernels.ppo_loss(new_logp.float(), minibatch["sample_log_prob"], minibatch["advantage"],
                                                new_value.float(), minibatch["state_value"], minibatch["value_target"],
                                                entropy.float(), minibatch["valid"], clip_coef=cfg.clip_coef,
                                                vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef,
                                                clip_vloss=cfg.clip_vloss, normalize_advantage=cfg.norm_adv)
            step_stats = dict(step_stats)
            step_stats["grad_norm"], nonfinite = backward_step(loss, optimizer, params, cfg.max_grad_norm, None, scaler)
            nonfinite_updates = nonfinite_updates + nonfinite
            for key, v in step_stats.items():
                totals[key] = totals.get(key, 0.0) + v.detach()
            n_steps += 1
    metrics = {f"losses/{k}": v / n_steps for k, v in totals.items()}
    metrics["losses/explained_variance"] = explained_variance(value[:-1], vs, batch["valid"].float())
    metrics["losses/n_updates"] = torch.tensor(float(n_steps))
    metrics["losses/nonfinite_updates"] = nonfinite_updates.float()  # skipped for a NaN/Inf loss or gradient
    metrics.update(stats)
    return metrics


def update(agent, optimizer: torch.optim.Optimizer, batch: TensorDict, bootstrap_observation: torch.Tensor, cfg,
           generator: torch.Generator | None = None, autocast=nullcontext, scaler=None) -> dict:
    """Dispatch on ``cfg.algo`` ("impala" or "appo")."""
    step = appo_update if cfg.algo == "appo" else impala_update
    return step(agent, optimizer, batch, bootstrap_observation, cfg, generator, autocast, scaler)
