"""A2C: synchronous advantage actor-critic, one gradient step per rollout.

Advantages are GAE (``kernels.gae``); with the A2C default ``gae_lambda=1`` that is the n-step return
``R_t = r_t + gamma * R_{t+1}`` bootstrapped from V of the rollout's last next-observation, cut at ``done`` and
bootstrapped from the real final observation on truncation, exactly as in PPO. The loss is
``kernels.pg_loss`` (policy gradient + ``vf_coef`` * value MSE - ``ent_coef`` * entropy), a mean over
``valid`` samples. No env or file code here.
"""
from __future__ import annotations

import functools
from contextlib import nullcontext

import torch
from tensordict import TensorDict

from fastrl import kernels
from fastrl.amp import backward_step
from fastrl.ppo import explained_variance, loss_inputs


def a2c_loss_terms(agent, cfg, observation, action, old_logp, advantage, old_value, value_target, valid,
                   autocast=nullcontext) -> tuple[torch.Tensor, dict]:
    """The A2C loss over plain flat tensors ``[B, ...]`` (``old_logp``/``old_value`` unused: on-policy)."""
    with autocast():
        _, logp, entropy, value = agent.get_action_and_value(observation, action)
    return kernels.pg_loss(logp.float(), advantage, value.float(), value_target, entropy.float(), valid,
                           vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef, normalize_advantage=cfg.norm_adv)


def a2c_loss(agent, batch: TensorDict, cfg, autocast=nullcontext) -> tuple[torch.Tensor, dict]:
    return a2c_loss_terms(agent, cfg, *loss_inputs(batch.reshape(-1)), autocast=autocast)


def a2c_update(agent, optimizer: torch.optim.Optimizer, batch: TensorDict, cfg, sync_grads=None, loss_fn=None,
               scaler=None, step_fn=None) -> dict:
    """One gradient step on the whole ``[T, N]`` rollout (advantages already filled). Returns 0-d tensor metrics.

    ``step_fn(*loss_inputs(...)) -> (stats, nonfinite)`` (a ``fastrl.learner.CompiledUpdate``), when given, is
    the whole gradient step instead of ``loss_fn`` + ``backward_step``; it does its own gradient sync.
    """
    if loss_fn is None:
        loss_fn = functools.partial(a2c_loss_terms, agent, cfg)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if step_fn is not None:
        stats, nonfinite = step_fn(*loss_inputs(batch.reshape(-1)))
    else:
        loss, stats = loss_fn(*loss_inputs(batch.reshape(-1)))
        stats = dict(stats)
        stats["grad_norm"], nonfinite = backward_step(loss, optimizer, params, cfg.max_grad_norm, sync_grads, scaler)
    stats["nonfinite_updates"] = nonfinite.float()  # skipped for a NaN/Inf loss or gradient
    metrics = {f"losses/{k}": v.detach() for k, v in stats.items()}
    metrics["losses/explained_variance"] = explained_variance(batch["state_value"], batch["value_target"],
                                                              batch["valid"].float())
    metrics["losses/n_updates"] = torch.tensor(1.0)
    return metrics
