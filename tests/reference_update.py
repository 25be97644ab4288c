"""The plainly-right twin of ``fastrl.update``: one agent module, torch.optim, autograd, a Python loop over minibatches.

This is the PPO / A2C update as CleanRL writes it (and as fastrl ran it before the pure update): per minibatch
``zero_grad``, the loss of ``kernels.ppo_loss_reference`` / ``pg_loss_reference`` on the module's forward,
``backward``, ``clip_grad_norm_``, ``optimizer.step()``; a NaN/Inf loss or gradient skips the step; with
``target_kl`` the epoch loop breaks once an epoch ends with approx_kl above it. Tests compare ``fastrl.update`` (and
the trainer) against it step for step.
"""
import torch

from fastrl import kernels
from fastrl.optim import make_optimizer
from fastrl.update import LOSS_KEYS


def reference_loss(agent, cfg, minibatch: tuple, clip_coef: float | None = None):
    observation, action, old_logp, advantage, old_value, value_target, valid = minibatch
    _, logp, entropy, value = agent.get_action_and_value(observation, action)
    if cfg.algo == "a2c":
        return kernels.pg_loss_reference(logp.float(), advantage, value.float(), value_target, entropy.float(), valid,
                                         vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef,
                                         normalize_advantage=cfg.norm_adv)
    return kernels.ppo_loss_reference(logp.float(), old_logp, advantage, value.float(), old_value, value_target,
                                      entropy.float(), valid, clip_coef=cfg.clip_coef if clip_coef is None else clip_coef,
                                      vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef, clip_vloss=cfg.clip_vloss,
                                      normalize_advantage=cfg.norm_adv)


def reference_update(agent, optimizer: torch.optim.Optimizer, cfg, batch: dict, lr: float,
                     clip_coef: float | None = None) -> dict:
    """Every minibatch step of one update on ``agent`` with ``optimizer`` (in place). ``batch``: ``LOSS_KEYS`` as flat
    ``[B, ...]`` tensors, plus ``minibatch_index [n_epochs * n_minibatches, mb]`` (PPO). Returns ``{"n_updates",
    "nonfinite_updates"}``."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    params = list(agent.parameters())
    inputs = tuple(batch[key] for key in LOSS_KEYS)
    index = batch.get("minibatch_index")
    n_minibatches = 1 if cfg.algo == "a2c" else cfg.n_minibatches
    rows = [None] if index is None else list(index)
    counts = {"n_updates": 0, "nonfinite_updates": 0}
    for j, idx in enumerate(rows):
        minibatch = inputs if idx is None else tuple(x[idx] for x in inputs)
        loss, stats = reference_loss(agent, cfg, minibatch, clip_coef)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.max_grad_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if torch.isfinite(loss) and torch.isfinite(grad_norm):
            optimizer.step()
            counts["n_updates"] += 1
        else:
            counts["nonfinite_updates"] += 1
        epoch_ends = (j + 1) % n_minibatches == 0
        if cfg.algo == "ppo" and cfg.target_kl > 0 and epoch_ends and float(stats["approx_kl"]) > cfg.target_kl:
            break
    return counts


def reference_optimizer(agent, cfg) -> torch.optim.Optimizer:
    """torch.optim's Adam (not fused: the for-loop implementation) or RMSprop, as ``cfg`` names it."""
    optimizer = make_optimizer(cfg, agent.parameters())
    if isinstance(optimizer, torch.optim.Adam):
        optimizer = torch.optim.Adam(agent.parameters(), lr=cfg.lr, eps=cfg.adam_eps, foreach=False)
    return optimizer
