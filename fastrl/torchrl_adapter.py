"""fastrl's rollout buffer in the layout TorchRL's losses and value estimators read (checked with TorchRL 0.14).

    from fastrl import to_torchrl
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    trainer.collect()
    td = to_torchrl(trainer.buffer, next_observation=trainer.next_obs)       # [N, T]
    GAE(gamma=0.99, lmbda=0.95, value_network=None)(td)                      # or value_network=critic
    losses = ClipPPOLoss(actor, critic, loss_critic_type="l2")(td)           # reset steps are masked out

fastrl's buffer (``fastrl.buffers``) is time-major ``[T, N]``, has no trailing ``[..., 1]`` dims, no
``("next", "observation")``, names the behaviour log-prob ``sample_log_prob`` and carries a ``valid`` mask.
On it, ``ClipPPOLoss`` fails on shapes and ``GAE`` runs its recursion over envs instead of time (TorchRL's time
dimension is the tensordict's last one unless ``time_dim`` says otherwise). ``to_torchrl`` returns a new
TensorDict (every tensor a copy, so nothing written into it reaches the buffer), batch-first ``[N, T]``::

    observation                     [N, T, *obs]     native dtype (uint8 frames stay uint8)
    action                          [N, T] int64 (discrete) or [N, T, *action_shape] float32
    <log-prob key>                  [N, T]           the behaviour log-prob, see ``log_prob_key``
    state_value                     [N, T, 1]
    valid, ("collector", "mask")    [N, T] bool      one tensor under two keys, False on auto-reset steps
    next: reward, state_value       [N, T, 1] float32
          done, terminated, truncated  [N, T, 1] bool
          observation               [N, T, *obs]     only when ``next_observation`` is given
    advantage, value_target         [N, T, 1]        only with ``with_advantage=True``

Conventions carried over:

- ``("next", "observation")[:, t]`` is the observation the env returned on step t: ``observation[:, t + 1]``,
  and ``next_observation`` (the trainer's ``next_obs``) for the last step. On a step that ends an episode
  fastrl's envs return the episode's *real final* observation (the first observation of the next episode
  comes one step later, on the auto-reset step), so a value network evaluated on ``("next", "observation")``
  bootstraps truncated episodes correctly. Keep TorchRL's ``GAE(auto_reset_env=False)`` (its default).
- ``("next", "state_value")`` is fastrl's V(next observation), so ``GAE(value_network=None)`` uses exactly
  fastrl's bootstrap: it bootstraps unless ``terminated`` and cuts the trace at ``done``, as ``kernels.gae``.
- Auto-reset steps stay in place as ordinary-looking steps (observation: the old episode's final one;
  reward 0; done False; next observation: the new episode's first) with ``valid`` False. The preceding step
  has ``done`` True, so no advantage of a valid step reaches through them.
- ``valid`` is honoured through TorchRL's loss mask: ``LossModule.loss_mask_key`` defaults to ``"auto"``,
  which reads ``("collector", "mask")``, and the ``loss_*`` entries are then means over valid steps
  (``loss.loss_mask_key = "valid"`` does the same). TorchRL does not mask its logged statistics
  (``entropy``, ``kl_approx``, ``clip_fraction``, ``ESS``, ``explained_variance``) nor
  ``normalize_advantage`` (which only reads ``"shifted_valid"``, and divides by the biased std). For those,
  compute advantages on the ``[N, T]`` TensorDict, then hand the loss the flat copy of the valid steps,
  ``td[td["valid"]]``.
- fastrl's value loss is ``0.5 * (V - R)^2``; TorchRL's ``loss_critic_type="l2"`` is ``(V - R)^2``, so
  ``critic_coeff = 0.5 * vf_coef`` gives fastrl's total loss. fastrl's ``clip_vloss`` is TorchRL's
  ``clip_value=clip_coef``; fastrl's ``clip_coef`` is ``clip_epsilon``.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

_NEXT_KEYS = ("reward", "done", "terminated", "truncated", "state_value")
_ROOT_KEYS = ("observation", "action", "sample_log_prob", "state_value", "valid")


def default_log_prob_key() -> str:
    """The behaviour log-prob key the installed TorchRL's ``ClipPPOLoss`` reads by default.

    ``"action_log_prob"`` in TorchRL 0.14 (``"sample_log_prob"`` when ``tensordict.nn.composite_lp_aggregate()``
    is True). A ``ProbabilisticActor`` with ``out_keys=["action"]`` writes the same key.
    """
    from torchrl.objectives import ClipPPOLoss

    key = ClipPPOLoss.default_keys().sample_log_prob
    return key if isinstance(key, str) else key[0]


def _check(batch, next_observation) -> None:
    op = "to_torchrl"
    if not isinstance(batch, TensorDictBase):
        raise ValueError(f"{op}: `batch` must be fastrl's [T, N] rollout TensorDict, got {type(batch).__name__}")
    if batch.batch_dims != 2:
        raise ValueError(f"{op}: `batch` has batch size {tuple(batch.batch_size)}; expected fastrl's time-major [T, N]")
    missing = [k for k in _ROOT_KEYS if k not in batch.keys()]
    missing += [("next", k) for k in _NEXT_KEYS if ("next", k) not in batch.keys(include_nested=True)]
    if missing:
        raise ValueError(f"{op}: `batch` lacks {missing}; build it with fastrl.buffers.make_rollout_buffer")
    if next_observation is None:
        return
    obs = batch["observation"]
    if not isinstance(next_observation, torch.Tensor):
        raise ValueError(f"{op}: `next_observation` must be a tensor [N, *obs], got {type(next_observation).__name__}")
    if next_observation.shape != obs.shape[1:]:
        raise ValueError(f"{op}: `next_observation` has shape {tuple(next_observation.shape)}; expected "
                         f"{tuple(obs.shape[1:])} (the observations after the last step, e.g. trainer.next_obs)")
    if next_observation.dtype != obs.dtype:
        raise ValueError(f"{op}: `next_observation` has dtype {next_observation.dtype}; the buffer's observations "
                         f"are {obs.dtype}")


def _batch_first(x: torch.Tensor) -> torch.Tensor:
    # clone, not contiguous(): for T == 1 or N == 1 the transpose is already contiguous and would alias the buffer.
    return x.transpose(0, 1).clone(memory_format=torch.contiguous_format)


def to_torchrl(batch: TensorDictBase, next_observation: torch.Tensor | None = None, *,
               log_prob_key: str | None = None, with_advantage: bool = False) -> TensorDict:
    """fastrl's ``[T, N]`` rollout as TorchRL's batch-first ``[N, T]`` TensorDict (layout in the module docstring).

    Args:
        batch: the rollout buffer of ``fastrl.buffers.make_rollout_buffer`` (``trainer.buffer``), any device.
        next_observation: ``[N, *obs]``, the observations the env returned on the last step (``trainer.next_obs``,
            read after ``collect()``). Without it ``("next", "observation")`` is left out: enough for
            ``GAE(value_network=None)`` and for losses given precomputed advantages, not for a value estimator
            that calls a value network.
        log_prob_key: the key of the behaviour log-prob; None takes ``default_log_prob_key()``.
        with_advantage: also copy the buffer's ``advantage`` and ``value_target``. Only valid after
            ``fastrl.ppo.compute_advantages`` ran on this rollout (between ``collect()`` and ``update()`` they
            hold the previous rollout's values), and a loss given an ``advantage`` does not compute its own.
    """
    _check(batch, next_observation)
    if log_prob_key is None:
        log_prob_key = default_log_prob_key()
    T, N = batch.batch_size
    nxt = batch["next"]
    next_entries = {key: _batch_first(nxt[key]).unsqueeze(-1) for key in _NEXT_KEYS}
    if next_observation is not None:
        obs = batch["observation"]
        following = torch.cat([obs[1:], next_observation.to(obs.device).unsqueeze(0)], dim=0)
        next_entries["observation"] = _batch_first(following)
    valid = _batch_first(batch["valid"])
    entries = {
        "observation": _batch_first(batch["observation"]),
        "action": _batch_first(batch["action"]),
        log_prob_key: _batch_first(batch["sample_log_prob"]),
        "state_value": _batch_first(batch["state_value"]).unsqueeze(-1),
        "valid": valid,
        "collector": TensorDict({"mask": valid}, batch_size=[N, T]),
        "next": TensorDict(next_entries, batch_size=[N, T]),
    }
    if with_advantage:
        entries["advantage"] = _batch_first(batch["advantage"]).unsqueeze(-1)
        entries["value_target"] = _batch_first(batch["value_target"]).unsqueeze(-1)
    return TensorDict(entries, batch_size=[N, T], device=batch.device)
