"""fastrl and TorchRL (checked with TorchRL 0.14): fastrl's rollout buffer in the layout TorchRL's losses and value
estimators read (``to_torchrl``), and TorchRL envs stepped by fastrl's contract (``TorchRLVectorEnv``, which
``fastrl.train(env=torchrl_env)`` uses).

    import fastrl
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    collector = fastrl.Collector("CartPole-v1", n_envs=8, n_steps=128)    # see fastrl.collector
    collector.collect()
    td = fastrl.to_torchrl(collector.buffer, next_observation=collector.next_obs)   # [N, T]: collector.to_torchrl()
    GAE(gamma=0.99, lmbda=0.95, value_network=None)(td)                      # or value_network=critic
    losses = ClipPPOLoss(actor, critic, loss_critic_type="l2")(td)           # reset steps are masked out

fastrl's buffer (``fastrl.envs.buffers``) is time-major ``[T, N]``, has no trailing ``[..., 1]`` dims, no
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

import sys

import gymnasium
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from fastrl.config import UserError

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
        raise ValueError(f"{op}: `batch` lacks {missing}; build it with fastrl.envs.buffers.make_rollout_buffer")
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
        batch: the rollout buffer of ``fastrl.envs.buffers.make_rollout_buffer`` (``trainer.buffer``), any device.
        next_observation: ``[N, *obs]``, the observations the env returned on the last step (``trainer.next_obs``,
            read after ``collect()``). Without it ``("next", "observation")`` is left out: enough for
            ``GAE(value_network=None)`` and for losses given precomputed advantages, not for a value estimator
            that calls a value network.
        log_prob_key: the key of the behaviour log-prob; None takes ``default_log_prob_key()``.
        with_advantage: also copy the buffer's ``advantage`` and ``value_target``. Only valid after
            ``fastrl.learn.ppo.compute_advantages`` ran on this rollout (between ``collect()`` and ``update()`` they
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
    for key in ("advantage", "value_target") if with_advantage else ():
        entries[key] = _batch_first(batch[key]).unsqueeze(-1)
    return TensorDict(entries, batch_size=[N, T], device=batch.device)


def is_torchrl_env(obj) -> bool:
    """Whether ``obj`` is a TorchRL ``EnvBase`` (without importing TorchRL: a process that made one imported it)."""
    envs = sys.modules.get("torchrl.envs")
    return envs is not None and isinstance(obj, envs.EnvBase)


def _box(spec):
    """A Gymnasium Box for a TorchRL leaf spec: its bounds, or the dtype's whole range for an unbounded one."""
    dtype = torch.empty(0, dtype=spec.dtype).numpy().dtype
    low, high = getattr(spec.space, "low", None), getattr(spec.space, "high", None)
    if low is not None and high is not None:
        return gymnasium.spaces.Box(low.cpu().numpy(), high.cpu().numpy(), tuple(spec.shape), dtype)
    if np.issubdtype(dtype, np.floating):
        return gymnasium.spaces.Box(-np.inf, np.inf, tuple(spec.shape), dtype)
    return gymnasium.spaces.Box(np.iinfo(dtype).min, np.iinfo(dtype).max, tuple(spec.shape), dtype)


def _action_space(spec, env_name: str):
    """``(space, one_hot)``: the Gymnasium space fastrl acts in for a TorchRL action spec, and for a ``OneHot`` spec
    its size (fastrl's integer actions are one-hot encoded for the env), else 0."""
    from torchrl.data import Binary, Categorical, MultiCategorical, OneHot
    if isinstance(spec, OneHot) and spec.ndim == 1:
        return gymnasium.spaces.Discrete(spec.space.n), spec.space.n
    if isinstance(spec, Categorical) and spec.shape.numel() == 1:
        return gymnasium.spaces.Discrete(spec.space.n), 0
    if isinstance(spec, MultiCategorical) and spec.ndim == 1:
        return gymnasium.spaces.MultiDiscrete(spec.nvec.cpu().numpy()), 0
    if isinstance(spec, Binary) and spec.ndim == 1:
        return gymnasium.spaces.MultiBinary(spec.shape[0]), 0
    if spec.domain == "continuous":
        return _box(spec), 0
    raise UserError(f"TorchRL env {env_name} has action spec {type(spec).__name__} of shape {list(spec.shape)}; "
                    "fastrl takes OneHot, Categorical, MultiCategorical, Binary and continuous actions")


class TorchRLVectorEnv(gymnasium.vector.VectorEnv):
    """A TorchRL ``EnvBase`` as a Gymnasium vector env that auto-resets on the next step (fastrl's contract, see
    ``fastrl.envs``), which ``fastrl.train(env=torchrl_env)`` steps as any user vector env.

    - ``batch_size []`` is one env; ``[N]`` is N envs: a ``SerialEnv``/``ParallelEnv`` or an env that is not
      batch-locked, transformed or not. An env whose episode ended on step t is reset (TorchRL's ``"_reset"`` mask)
      on step t + 1 while the others step (its ``"_step"`` mask), so a batch-locked ``[N]`` env that cannot step a
      subset of its envs is refused.
    - Observations: the observation spec's leaves (one key: a Box; several: a Dict, which fastrl packs). Actions:
      fastrl's integers are one-hot encoded for a ``OneHot`` spec. Rewards and flags ``[*batch, 1]`` become ``[N]``;
      no ``"truncated"`` entry reads as False.
    - ``reset(seed=[s, ...])`` seeds the env with ``env.set_seed(s)``. ``close()`` closes the TorchRL env only when
      ``owned`` (fastrl made it from a factory).
    """

    def __init__(self, env, owned: bool = False):
        from torchrl.envs import TransformedEnv
        from torchrl.envs.batched_envs import BatchedEnvBase
        self.metadata = {"autoreset_mode": gymnasium.vector.AutoresetMode.NEXT_STEP}
        self.env, self.owned, name = env, owned, type(env).__name__
        batch = tuple(env.batch_size)
        if len(batch) > 1:
            raise UserError(f"TorchRL env {name} has batch_size {list(batch)}; fastrl steps one batch dimension: "
                            "pass an env of batch_size [] or [N]")
        self.num_envs, self._batch = (batch[0] if batch else 1), batch
        base = env
        while isinstance(base, TransformedEnv):  # it hands "_step" on to the env it wraps
            base = base.base_env
        if self.num_envs > 1 and base.batch_locked and not isinstance(base, BatchedEnvBase):
            raise UserError(f"TorchRL env {name} (batch_size {list(batch)}) cannot step some of its envs alone, which "
                            "fastrl's auto-reset needs: pass ParallelEnv(N, make_env) or SerialEnv(N, make_env) of "
                            "unbatched envs, or the Gymnasium id itself")
        obs_spec = env.observation_spec_unbatched
        self._obs_keys = list(obs_spec.keys(True, True))
        if not self._obs_keys or any(isinstance(key, tuple) for key in self._obs_keys):
            raise UserError(f"TorchRL env {name} has observation keys {self._obs_keys}; fastrl reads flat (not "
                            "nested) observation entries: flatten them with a transform")
        spaces = {key: _box(obs_spec[key]) for key in self._obs_keys}
        self.single_observation_space = spaces[self._obs_keys[0]] if len(spaces) == 1 else \
            gymnasium.spaces.Dict(spaces)
        self.single_action_space, self._one_hot = _action_space(env.action_spec_unbatched, name)
        batch_space = gymnasium.vector.utils.batch_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._action_dtype = env.action_spec_unbatched.dtype
        self._done_shape = env.full_done_spec["done"].shape
        self._pending = torch.zeros(self.num_envs, dtype=torch.bool)
        self._root = None

    def _rows(self, x: torch.Tensor, trailing: tuple = ()) -> torch.Tensor:
        return x.reshape((self.num_envs, *trailing))

    def _observation(self, td):
        # copies: a ParallelEnv hands out views of buffers that its next step overwrites
        obs = {key: self._rows(td[key], td[key].shape[len(self._batch):]).cpu().clone().numpy()
               for key in self._obs_keys}
        return obs[self._obs_keys[0]] if len(obs) == 1 else obs

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.env.set_seed(int(seed[0] if isinstance(seed, (list, tuple)) else seed))
        self._root = self.env.reset()
        self._pending.zero_()
        return self._observation(self._root), {}

    def step(self, actions):
        from torchrl.envs.utils import step_mdp
        action = torch.as_tensor(actions).reshape((*self._batch, *self.single_action_space.shape))
        if self._one_hot:
            action = torch.nn.functional.one_hot(action.long(), self._one_hot)
        action = action.to(self._action_dtype)
        pending, root = self._pending, self._root
        reward = torch.zeros(self.num_envs)
        terminated, truncated = torch.zeros_like(reward, dtype=torch.bool), torch.zeros_like(reward, dtype=torch.bool)
        if pending.all():  # every episode ended last step: this is everyone's reset step
            root = self.env.reset()
        else:
            if pending.any():  # their episodes ended last step: reset them, step the others
                root = root.clone()
                root.set("_reset", pending.view(self._done_shape))
                root = self.env.reset(root)
                root.set("_step", ~pending.view(self._batch))
            root.set(self.env.action_key, action)
            out = self.env.step(root)
            nxt, stepped = out["next"], ~pending
            reward = torch.where(stepped, self._rows(nxt[self.env.reward_key]).float().cpu(), 0.0)
            terminated = stepped & self._rows(nxt.get("terminated", nxt["done"])).cpu()
            if "truncated" in nxt.keys():
                truncated = stepped & self._rows(nxt["truncated"]).cpu()
            following = step_mdp(out).exclude("_step", "_reset")  # masks of this step only
            if pending.any():  # a reset env's observation is its new episode's first one
                mask = pending.view(self._batch)
                observation = following.select(*self._obs_keys).clone()
                observation[mask] = root.select(*self._obs_keys)[mask]
                following.update(observation)
            root = following
        self._root, self._pending = root, terminated | truncated
        return (self._observation(root), reward.numpy(), terminated.numpy(), truncated.numpy(), {})

    def close(self, **kwargs):
        if self.owned and not self.env.is_closed:
            self.env.close()
