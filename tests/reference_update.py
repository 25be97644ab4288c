"""The plainly-right twin of ``fastrl.learn.update``: one agent module, torch.optim, autograd, a Python loop over minibatches.

This is the PPO / A2C update as CleanRL writes it (and as fastrl ran it before the pure update): per minibatch
``zero_grad``, the loss of ``kernels.ppo_loss_reference`` / ``pg_loss_reference`` on the module's forward,
``backward``, ``clip_grad_norm_``, ``optimizer.step()``; a NaN/Inf loss or gradient skips the step; with
``target_kl`` the epoch loop breaks once an epoch ends with approx_kl above it. ``reference_learner_update`` is the
IMPALA / APPO learner's update as fastrl ran it with torch.optim: the T+1 forward, ``kernels.vtrace_reference`` on
its detached outputs, then IMPALA's ``pg_loss_reference`` per env-column minibatch or APPO's PPO steps. Tests compare
``fastrl.learn.update`` (and the trainers) against them step for step.
"""
import torch

from fastrl import kernels
from fastrl.learn.optim import optimizer_hparams, optimizer_name
from fastrl.learn.update import LOSS_KEYS, VTRACE_KEYS


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
        reference_step(loss, optimizer, params, cfg.max_grad_norm, counts)
        epoch_ends = (j + 1) % n_minibatches == 0
        if cfg.algo == "ppo" and cfg.target_kl > 0 and epoch_ends and float(stats["approx_kl"]) > cfg.target_kl:
            break
    return counts


def reference_step(loss, optimizer: torch.optim.Optimizer, params: list, max_grad_norm: float, counts: dict) -> None:
    """zero_grad, backward, global-norm clip, step; a NaN/Inf loss or gradient skips the step (counted)."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if max_grad_norm > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    else:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if torch.isfinite(loss) and torch.isfinite(grad_norm):
        optimizer.step()
        counts["n_updates"] += 1
    else:
        counts["nonfinite_updates"] += 1


def reference_learner_update(agent, optimizer: torch.optim.Optimizer, cfg, batch: dict, index, lr: float) -> dict:
    """One IMPALA / APPO learner update on ``agent`` with ``optimizer`` (in place). ``batch``: ``VTRACE_KEYS``
    (time-major ``[T, N]``, ``bootstrap_observation [N, ...]``); ``index``: IMPALA's env columns per minibatch
    (None: one minibatch of all columns) or APPO's ``minibatch_index`` rows. Returns the step counts."""
    observation, bootstrap_observation, action, behavior_logp, valid, reward, done, terminated = (
        batch[key] for key in VTRACE_KEYS)
    T, N = valid.shape

    def forward(columns):
        obs = torch.cat([observation[:, columns], bootstrap_observation[columns][None]])
        act = torch.cat([action[:, columns], action[-1:, columns]])
        _, logp, entropy, value = agent.get_action_and_value(obs.flatten(0, 1), act.flatten(0, 1))
        n = len(columns)
        return logp.view(T + 1, n)[:T], entropy.view(T + 1, n)[:T], value.view(T + 1, n)

    def targets(columns, logp, value):
        return kernels.vtrace_reference(behavior_logp[:, columns], logp.detach(), reward[:, columns],
                                        value[:-1].detach(), value[1:].detach(), done[:, columns],
                                        terminated[:, columns], cfg.gamma, cfg.rho_bar, cfg.c_bar, cfg.vtrace_lambda)

    everything = torch.arange(N)
    if cfg.algo == "appo":
        with torch.no_grad():
            logp, _, value = forward(everything)
        vs, advantage = targets(everything, logp, value)
        rows = {"observation": observation, "action": action, "sample_log_prob": behavior_logp,
                "advantage": advantage, "state_value": value[:-1], "value_target": vs, "valid": valid}
        rows = {key: value.flatten(0, 1) for key, value in rows.items()}
        return reference_update(agent, optimizer, cfg, {**rows, "minibatch_index": index}, lr)
    for group in optimizer.param_groups:
        group["lr"] = lr
    counts = {"n_updates": 0, "nonfinite_updates": 0}
    for columns in ([everything] if index is None else list(index)):
        logp, entropy, value = forward(columns)
        vs, advantage = targets(columns, logp, value)
        loss, _ = kernels.pg_loss_reference(logp, advantage, value[:-1], vs, entropy, valid[:, columns], cfg.vf_coef,
                                            cfg.ent_coef, cfg.norm_adv)
        reference_step(loss, optimizer, list(agent.parameters()), cfg.max_grad_norm, counts)
    return counts


def reference_optimizer(agent, cfg) -> torch.optim.Optimizer:
    """torch.optim's Adam (not fused: the for-loop implementation) or RMSprop, as ``cfg`` names it."""
    constants = optimizer_hparams(cfg)
    if optimizer_name(cfg) == "rmsprop":
        return torch.optim.RMSprop(agent.parameters(), lr=cfg.lr, **constants)
    return torch.optim.Adam(agent.parameters(), lr=cfg.lr, eps=constants["eps"], foreach=False)
