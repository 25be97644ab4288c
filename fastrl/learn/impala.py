"""IMPALA and APPO: the learner's forward over a batch of actor rollouts and its V-trace targets.

No env, process or file code here, and no optimizer: the losses and their steps are kinds of the one pure update,
``fastrl.learn.update.Update`` (``impala``: the paper's loss per minibatch of env columns; ``appo``: V-trace once per batch,
then PPO's clipped steps, as in Sample Factory).

A learner batch is a ``[T, N]`` TensorDict with the rollout keys (``observation``, ``action``, ``sample_log_prob`` =
the behaviour policy's log-prob, ``valid``, ``("next", "reward" | "done" | "terminated")``), passed with
``bootstrap_observation [N, *obs]``, the observation after the last step: together the T+1 observations obs[0..T].
The learner evaluates all of them in one forward, so ``value[t] = V(obs[t])`` and ``next_value[t] = value[t + 1]``
come from the LEARNER's critic. Because the env returns an episode's real final observation on the step that ends it
(and only auto-resets on the following, invalid step), ``value[t + 1]`` is the right bootstrap for a truncated
episode, and V-trace's ``terminated`` / ``done`` cut the rest.

A recurrent policy's batch adds ``episode_start [T, N]`` and ``recurrent_state [T, N, S]`` (each column's state at
the segment's start, the actor's, in every row; ``fastrl.run.recurrent``'s convention): the learner unrolls its
current weights over each column's T+1 observations from that state, zeroing it where an episode starts, the
bootstrap observation's row included (``episode_start[T] = ~valid[T - 1]``).

Every mean is over ``valid``: auto-reset steps never reach a loss or a statistic. IMPALA's loss:
``-rho_t * (r_t + gamma * vs_{t+1} - V(s_t)) * log pi(a_t|s_t) + vf_coef * 0.5 * (vs_t - V(s_t))^2 - ent_coef * H``.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
from tensordict import TensorDict

from fastrl import kernels
from fastrl.learn.ppo import masked_mean


def learner_batch(batch: TensorDict, bootstrap_observation: torch.Tensor) -> dict:
    """The update's inputs (``fastrl.learn.update.VTRACE_KEYS``) from a ``[T, N]`` rollout batch and its obs[T]."""
    nxt = batch["next"]
    return {"observation": batch["observation"], "bootstrap_observation": bootstrap_observation,
            "action": batch["action"], "sample_log_prob": batch["sample_log_prob"], "valid": batch["valid"],
            "reward": nxt["reward"], "done": nxt["done"], "terminated": nxt["terminated"],
            **{key: batch[key] for key in ("episode_start", "recurrent_state") if key in batch.keys()}}


def learner_sequence(valid: torch.Tensor, episode_start: torch.Tensor, recurrent_state: torch.Tensor) -> tuple:
    """A recurrent policy's ``learner_forward`` inputs from ``[T, N]`` columns: their start state ``[N, S]`` and the
    episode starts of the T+1 observations ``[T + 1, N]`` (the bootstrap observation's: ``~valid[T - 1]``)."""
    return recurrent_state[0], torch.cat([episode_start, ~valid[-1:]])


def learner_forward(get_action_and_value, observation: torch.Tensor, bootstrap_observation: torch.Tensor,
                    action: torch.Tensor, autocast=nullcontext, sequence: tuple = ()):
    """One forward over the T+1 observations ``obs[0..T]`` (the model under ``autocast``; outputs float32).

    ``get_action_and_value``: the agent's method (or the same with given weights). ``observation [T, N, *obs]``,
    ``bootstrap_observation [N, *obs]``, ``action [T, N, ...]`` -> ``target_logp [T, N]``, ``entropy [T, N]``,
    ``value [T + 1, N]`` (differentiable). ``sequence``: a recurrent policy's ``learner_sequence``, unrolled over the
    T+1 steps time-major.
    """
    T, N = observation.shape[:2]
    obs = torch.cat([observation, bootstrap_observation.unsqueeze(0)])
    # The last row's action is a placeholder (a copy of the previous row's): its log-prob is discarded.
    act = torch.cat([action, action[-1:]])
    with autocast():
        recurrent = (None, sequence[0], sequence[1].flatten()) if sequence else ()
        _, logp, entropy, value = get_action_and_value(obs.flatten(0, 1), act.flatten(0, 1), *recurrent)[:4]
    logp, entropy, value = logp.float(), entropy.float(), value.float()
    return logp.view(T + 1, N)[:T], entropy.view(T + 1, N)[:T], value.view(T + 1, N)


def vtrace_targets(behavior_logp, target_logp, value, reward, done, terminated, valid, gamma: float,
                   rho_bar: float = 1.0, c_bar: float = 1.0, lam: float = 1.0):
    """V-trace ``vs`` and ``pg_advantage`` ``[T, N]`` (``kernels.vtrace``) plus 0-d importance-weight statistics.

    ``value [T + 1, N]`` is the learner's critic on obs[0..T], every other tensor ``[T, N]``; gradients never flow
    through the targets.
    """
    target_logp, value = target_logp.detach(), value.detach()
    vs, pg_advantage = kernels.vtrace(behavior_logp, target_logp, reward, value[:-1], value[1:], done, terminated,
                                      gamma, rho_bar=rho_bar, c_bar=c_bar, lam=lam)
    valid = valid.float()
    ratio = torch.exp(target_logp - behavior_logp)
    stats = {"vtrace/rho_mean": masked_mean(ratio.clamp(max=rho_bar), valid),
             "vtrace/ratio_mean": masked_mean(ratio, valid),
             "vtrace/rho_clipfrac": masked_mean((ratio > rho_bar).float(), valid)}
    return vs, pg_advantage, stats
