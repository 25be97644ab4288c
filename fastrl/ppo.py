"""PPO: advantages for a rollout, the clipped-surrogate loss for a minibatch, and the update.

No env or file code here. Every mean is over ``valid`` samples: auto-reset steps never reach a
loss, an advantage normalization or a statistic.
"""
from __future__ import annotations

import functools
from contextlib import nullcontext

import torch
from tensordict import TensorDict

from fastrl import kernels
from fastrl.amp import backward_step
from fastrl.buffers import iterate_minibatches

# The minibatch fields a loss reads, in the order loss functions take them as plain tensors (compile-friendly).
LOSS_KEYS = ("observation", "action", "sample_log_prob", "advantage", "state_value", "value_target", "valid")


def loss_inputs(minibatch: TensorDict) -> tuple:
    return tuple(minibatch[k] for k in LOSS_KEYS)


def masked_mean(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return (x * valid).sum() / valid.sum().clamp(min=1)


def compute_advantages(batch: TensorDict, gamma: float, lam: float) -> None:
    """Fill ``advantage`` and ``value_target`` ``[T, N]`` in place with GAE.

    ``next_value`` is V(observation that followed the step): truncated episodes bootstrap from their
    final observation, terminated ones get no bootstrap, and ``done`` cuts the trace.
    """
    nxt = batch["next"]
    advantage, value_target = kernels.gae(nxt["reward"], batch["state_value"], nxt["state_value"], nxt["done"],
                                          nxt["terminated"], gamma, lam)
    batch["advantage"].copy_(advantage)
    batch["value_target"].copy_(value_target)


def explained_variance(value: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """1 - Var[target - value] / Var[target] over valid samples (NaN-free: 0-variance targets give 0)."""
    var_target = masked_mean((target - masked_mean(target, valid)).square(), valid)
    resid = target - value
    var_resid = masked_mean((resid - masked_mean(resid, valid)).square(), valid)
    return torch.where(var_target > 0, 1 - var_resid / var_target.clamp(min=1e-12), torch.zeros_like(var_target))


def ppo_loss_terms(agent, cfg, observation, action, old_logp, advantage, old_value, value_target, valid,
                   autocast=nullcontext) -> tuple[torch.Tensor, dict]:
    """``ppo_loss`` over plain tensors ``[B, ...]``; only the model forward runs under ``autocast``."""
    with autocast():
        _, new_logp, entropy, new_value = agent.get_action_and_value(observation, action)
    return kernels.ppo_loss(new_logp.float(), old_logp, advantage, new_value.float(), old_value, value_target,
                            entropy.float(), valid, clip_coef=cfg.clip_coef, vf_coef=cfg.vf_coef,
                            ent_coef=cfg.ent_coef, clip_vloss=cfg.clip_vloss, normalize_advantage=cfg.norm_adv)


def ppo_loss(agent, minibatch: TensorDict, cfg, autocast=nullcontext) -> tuple[torch.Tensor, dict]:
    """Clipped surrogate + (optionally clipped) value loss - entropy bonus on one minibatch ``[B]``."""
    return ppo_loss_terms(agent, cfg, *loss_inputs(minibatch), autocast=autocast)


def ppo_update(agent, optimizer: torch.optim.Optimizer, batch: TensorDict, cfg,
               generator: torch.Generator | None = None, sync_grads=None, loss_fn=None, scaler=None,
               step_fn=None) -> dict:
    """``n_epochs`` x ``n_minibatches`` gradient steps on one rollout; returns 0-d tensor diagnostics.

    Per minibatch: one forward/backward, ``sync_grads()`` (the cross-rank gradient average, when
    distributed), a global grad-norm clip and an optimizer step; no host sync.
    With ``target_kl`` > 0 the epoch loop stops early once approx_kl exceeds it (one sync per epoch).
    ``loss_fn(*loss_inputs(minibatch))`` (default: eager ``ppo_loss_terms``) may be a compiled, autocast
    version; ``scaler`` is the fp16 GradScaler or None.
    ``step_fn(*loss_inputs(minibatch)) -> (stats, nonfinite)`` (a ``fastrl.learner.CompiledUpdate``), when given,
    is the whole gradient step instead of ``loss_fn`` + ``backward_step``; it does its own gradient sync.
    """
    if loss_fn is None:
        loss_fn = functools.partial(ppo_loss_terms, agent, cfg)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    totals: dict = {}
    n_updates = 0
    nonfinite_updates = torch.zeros((), dtype=torch.int64, device=batch.device)
    for _epoch in range(cfg.n_epochs):
        for minibatch in iterate_minibatches(batch, cfg.n_minibatches, generator):
            if step_fn is not None:
                stats, nonfinite = step_fn(*loss_inputs(minibatch))
            else:
                loss, stats = loss_fn(*loss_inputs(minibatch))
                stats = dict(stats)
                stats["grad_norm"], nonfinite = backward_step(loss, optimizer, params, cfg.max_grad_norm, sync_grads,
                                                              scaler)
            nonfinite_updates = nonfinite_updates + nonfinite
            for key, value in stats.items():
                totals[key] = totals.get(key, 0.0) + value.detach()
            n_updates += 1
        if cfg.target_kl > 0 and bool(stats["approx_kl"] > cfg.target_kl):
            break
    metrics = {f"losses/{k}": v / n_updates for k, v in totals.items()}
    metrics["losses/explained_variance"] = explained_variance(batch["state_value"], batch["value_target"],
                                                              batch["valid"].float())
    metrics["losses/n_updates"] = torch.tensor(float(n_updates))
    metrics["losses/nonfinite_updates"] = nonfinite_updates.float()  # skipped for a NaN/Inf loss or gradient
    return metrics
