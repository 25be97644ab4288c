"""Action masks from an env, in either convention, as the last columns of its packed Dict observation.

- A Dict observation with an ``action_mask`` entry (``fastrl.envs.spaces.MASK_KEY``; MultiBinary(n) or a 0/1 Box
  ``[n]``: PettingZoo's and RLlib's convention): the other entries are the observation.
- sb3-contrib's (``MaskablePPO``'s): an env with an ``action_masks()`` method returning bool ``[n]``. Each env's
  guard (``fastrl.envs.batched.make_checked_env``) calls it after every reset and step and puts the mask in the step's
  ``info``, which the vector env gathers into ``[N, n]`` with the rest of the step: no call of its own, no extra
  round trip to a worker process. The env's observation space then reads as
  ``Dict(observation=<its space>, action_mask=MultiBinary(n))`` (its entries, when it is a Dict already).

Either way ``n`` is the policy's logits (``ActionSpec.n``: ``sum(nvec)`` for MultiDiscrete) and the mask travels as
the observation's last ``n`` columns (``fastrl.learn.masking``).
"""
from __future__ import annotations

import numpy as np

from fastrl.config import UserError
from fastrl.envs.spaces import MASK_KEY, ActionSpec, ObservationFormat


def env_action_masks(env):
    """The ``action_masks`` method of a Gymnasium ``env`` (found through its wrappers), or None."""
    try:
        method = env.get_wrapper_attr("action_masks")
    except AttributeError:
        return None
    return method if callable(method) else None


def with_action_mask(info: dict, action_masks) -> dict:
    """A step's ``info`` with the env's current mask (``action_masks()``, bool ``[n]``) under ``MASK_KEY``."""
    return info if action_masks is None else {**info, MASK_KEY: np.asarray(action_masks(), dtype=bool)}


def masked_observation_space(space, action_spec: ActionSpec):
    """The observation space of an env with ``action_masks()``: a Dict of its observation (or its Dict's entries)
    and the ``MASK_KEY`` entry, ``MultiBinary(n)``."""
    import gymnasium.spaces as s
    entries = dict(space.spaces) if isinstance(space, s.Dict) else {"observation": space}
    return s.Dict({**entries, MASK_KEY: s.MultiBinary(action_spec.n)})


def masked_observation(obs, info: dict) -> dict:
    """An ``action_masks()`` env's batched observation (an array, or a dict of arrays) with its masks ``[N, n]``
    from ``info``, as ``masked_observation_space`` describes it."""
    return {**(obs if isinstance(obs, dict) else {"observation": obs}), MASK_KEY: info[MASK_KEY]}


def check_action_mask(form: ObservationFormat, action_spec: ActionSpec, env_id: str) -> None:
    """One line where an env's action mask cannot mask its policy: continuous actions, or another width than the
    policy's ``n`` logits."""
    if not form.mask:
        return
    if action_spec.kind != "discrete":
        raise UserError(f"env {env_id!r} has an {MASK_KEY}, and its actions are continuous: masks apply to Discrete "
                        "and MultiDiscrete actions; drop the mask")
    if form.mask != action_spec.n:
        raise UserError(f"env {env_id!r}: its {MASK_KEY} has {form.mask} entries, and its actions need "
                        f"{action_spec.n} (one per action{', over every component' if action_spec.nvec else ''}): "
                        "fix the mask")
    if form.layout[-1].one_hot is not None or len(form.layout) == 1:
        raise UserError(f"env {env_id!r}: its {MASK_KEY} must be a MultiBinary or 0/1 Box beside at least one "
                        "observation entry: fix the observation space")


def observation_with_masks(obs, action_masks, layout) -> dict:
    """``predict(obs, action_masks=...)`` (sb3-contrib's): ``obs`` (one or a batch; an array, or a dict of the other
    entries) and its mask as the Dict observation ``layout`` packs."""
    if layout is None or not layout[-1].mask:
        raise UserError("action_masks was given, but this agent was trained without action masks: drop action_masks")
    if not isinstance(obs, dict) and len(layout) != 2:
        raise UserError(f"this agent's observation is a dict of {', '.join(p.key for p in layout[:-1])}: pass that "
                        "dict with action_masks")
    return {**(obs if isinstance(obs, dict) else {layout[0].key: obs}), MASK_KEY: action_masks}
