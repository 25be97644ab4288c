"""Torch-native batched envs (``env_backend: torch``): the env step is a pure function over tensors, gymnax-style,
so a rollout can step the env inside one ``torch.compile``'d graph, on any device.

The suite is Gymnasium's classic control, its dynamics in ``fastrl.envs.torch_classic``: CartPole-v1 (500 steps), v0
(200) and CartPoleNoVel-v1 (v1 observed as [x, theta] only), Acrobot-v1 (500), MountainCar-v0 (200), MountainCarContinuous-v0 (999) and Pendulum-v1 (200, never
terminates). Each is a ``TorchEnvSpec``; ``env_step`` steps any of them under the step contract of ``fastrl.envs``
(next-step auto-reset, ``valid`` False on reset steps, reward 0 there). At the time limit the step is ``truncated``
and never ``terminated``, as EnvPool reports it (Gymnasium's TimeLimit would set both when the goal or the fall
comes on the last step); the reward is still the physics' own.

The state is ``(physics [N, S] float64, elapsed [N] int64, prev_done [N] bool)``. Reset draws come in as an argument
(``reset_uniform [N, R]`` float64 U(0, 1), drawn for every env on every step), so the step has no RNG inside and its
random stream does not depend on which envs reset. A batch built with ``seed`` draws from one ``torch.Generator``
seeded ``seed`` (EnvPool's per-env streams cannot be reproduced).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium
import torch

from fastrl.config import UserError
from fastrl.envs import torch_classic as classic
from fastrl.envs.spaces import MASK_KEY, ActionSpec
from fastrl.envs.stats import EnvStep, EpisodeStats


@dataclass(frozen=True)
class TorchEnvSpec:
    """One torch-native env: its pure functions (``reset``, ``dynamics``, ``observe``, as ``fastrl.envs.torch_classic``
    defines them), the physics width ``state_width``, the U(0, 1) draws one step takes (``reset_draws``: a reset's, or
    a stochastic ``dynamics``'), ``observation_shape``, ``action_spec`` (a continuous one: a Box whose entries share one
    low and one high bound) and Gymnasium's ``max_episode_steps``.

    ``action_mask(physics) -> bool [N, n]``: a masked env's valid actions (Discrete or MultiDiscrete; ``n`` the
    policy's logits). Its observation space is then ``Dict(observation=Box, action_mask=MultiBinary(n))``, and each
    observation carries the mask as its last ``n`` columns (``fastrl.envs.masks``).

    A user's own spec, a module-level object, is named ``module:NAME`` (with ``env_backend`` torch)."""
    reset: Callable
    dynamics: Callable
    observe: Callable
    state_width: int
    reset_draws: int
    observation_shape: tuple
    action_spec: ActionSpec
    max_episode_steps: int
    action_mask: Callable | None = None

    def observation(self, physics: torch.Tensor) -> torch.Tensor:
        """``observe(physics)`` ``[N, D]``, with a masked env's mask after it as 0/1 floats ``[N, D + n]``."""
        observation = self.observe(physics)
        if self.action_mask is None:
            return observation
        return torch.cat((observation, self.action_mask(physics).to(observation.dtype)), dim=-1)

    @property
    def observation_space(self):
        """The Gymnasium observation space: a Box (bounds loosened to the real line), in a Dict beside the mask."""
        box = gymnasium.spaces.Box(-float("inf"), float("inf"), self.observation_shape, "float32")
        if self.action_mask is None:
            return box
        return gymnasium.spaces.Dict({"observation": box, MASK_KEY: gymnasium.spaces.MultiBinary(self.action_spec.n)})


_CARTPOLE = dict(reset=classic.cartpole_reset, dynamics=classic.cartpole_dynamics, observe=classic.state_observation,
                 state_width=4, reset_draws=4, observation_shape=(4,), action_spec=ActionSpec("discrete", n=2))
_MOUNTAIN_CAR = dict(reset=classic.mountain_car_reset, observe=classic.state_observation, state_width=2,
                     reset_draws=1, observation_shape=(2,))
TORCH_ENVS = {
    "CartPole-v1": TorchEnvSpec(**_CARTPOLE, max_episode_steps=500),
    "CartPole-v0": TorchEnvSpec(**_CARTPOLE, max_episode_steps=200),
    "CartPoleNoVel-v1": TorchEnvSpec(**{**_CARTPOLE, "observe": classic.cartpole_positions, "observation_shape": (2,)},
                                     max_episode_steps=500),
    "Acrobot-v1": TorchEnvSpec(
        reset=classic.acrobot_reset, dynamics=classic.acrobot_dynamics, observe=classic.acrobot_observe,
        state_width=4, reset_draws=4, observation_shape=(6,), action_spec=ActionSpec("discrete", n=3),
        max_episode_steps=500),
    "MountainCar-v0": TorchEnvSpec(
        **_MOUNTAIN_CAR, dynamics=classic.mountain_car_dynamics, action_spec=ActionSpec("discrete", n=3),
        max_episode_steps=200),
    "MountainCarContinuous-v0": TorchEnvSpec(
        **_MOUNTAIN_CAR, dynamics=classic.mountain_car_continuous_dynamics,
        action_spec=ActionSpec("continuous", shape=(1,), low=(-1.0,), high=(1.0,)), max_episode_steps=999),
    "Pendulum-v1": TorchEnvSpec(
        reset=classic.pendulum_reset, dynamics=classic.pendulum_dynamics, observe=classic.pendulum_observe,
        state_width=2, reset_draws=2, observation_shape=(3,),
        action_spec=ActionSpec("continuous", shape=(1,), low=(-classic.PENDULUM_MAX_TORQUE,),
                               high=(classic.PENDULUM_MAX_TORQUE,)), max_episode_steps=200),
}


def env_step(spec: TorchEnvSpec, physics: torch.Tensor, elapsed: torch.Tensor, prev_done: torch.Tensor,
             action: torch.Tensor, reset_uniform: torch.Tensor, max_episode_steps: int):
    """One batched step of ``spec``'s env with next-step auto-reset; pure, branch-free (fine under ``fullgraph=True``).

    ``physics [N, S]`` float64; ``elapsed [N]`` int64 steps taken in the current episode; ``prev_done [N]`` bool (the
    previous step ended the episode: this step resets, its action is ignored); ``action``: int64 ``[N]`` (discrete)
    or float32 ``[N, *shape]`` (continuous: clipped to the Box first, as ``fastrl.envs.batched.BatchedEnv`` does);
    ``reset_uniform [N, R]`` float64 U(0, 1), read by resetting envs and by the others' (stochastic) dynamics: each
    env's step reads them once.

    Returns ``(physics, elapsed, done, observation float32, reward [N] float32, terminated [N] bool, truncated [N]
    bool, valid [N] bool)``: the new state (``done = terminated | truncated`` is the next call's ``prev_done``), then
    the step's outputs as ``fastrl.envs.stats.EnvStep`` defines them.
    """
    if spec.action_spec.kind == "continuous":
        action = action.clamp(spec.action_spec.low[0], spec.action_spec.high[0])
    stepped, reward, reached = spec.dynamics(physics, action, elapsed == 0, reset_uniform)
    valid = ~prev_done
    physics = torch.where(prev_done.unsqueeze(-1), spec.reset(reset_uniform), stepped)
    elapsed = torch.where(prev_done, torch.zeros_like(elapsed), elapsed + 1)
    truncated = valid & (elapsed >= max_episode_steps)
    terminated = valid & reached & ~truncated
    done = terminated | truncated
    reward = torch.where(valid, reward, 0.0).float()
    return physics, elapsed, done, spec.observation(physics), reward, terminated, truncated, valid


def resolve_torch_env(env_id: str) -> TorchEnvSpec:
    """The spec of a torch-native ``env_id`` (a suite id, or ``module:NAME`` naming a ``TorchEnvSpec``), or a
    one-line UserError naming every supported id."""
    if env_id in TORCH_ENVS:
        return TORCH_ENVS[env_id]
    if ":" in env_id:
        from fastrl.names import attribute, import_target
        module, name = import_target(env_id, "env")
        spec = attribute(module, name)
        if isinstance(spec, TorchEnvSpec):
            return spec
        raise UserError(f"env_backend torch: {env_id!r} is not a TorchEnvSpec (fastrl.envs.torch_envs); name one, or "
                        "use env_backend auto for a Gymnasium env")
    raise UserError(f"env_backend torch has no torch-native env {env_id!r} (it has {', '.join(TORCH_ENVS)}, or a "
                    "TorchEnvSpec of yours as module:NAME); use env_backend auto")


class TorchEnv:
    """``n_envs`` copies of a torch-native env stepped as one batch of tensors, with ``fastrl.envs.batched.BatchedEnv``'s
    interface.

    ``step()`` runs ``env_step`` eagerly (vectorized torch ops, no per-env Python, no numpy) and updates ``stats``.
    A compiled rollout uses ``pure_step``, ``tensor_state``, ``set_tensor_state`` and ``draw_reset_uniform``
    instead. Tensors live on the CPU, as the EnvStep contract has them. ``env_kwargs`` may set ``max_episode_steps``.
    """
    backend = "torch"

    def __init__(self, env_id: str, n_envs: int, seed: int, env_kwargs: dict | None = None, n_members: int = 1):
        spec = resolve_torch_env(env_id)
        env_kwargs = dict(env_kwargs or {})
        max_episode_steps = int(env_kwargs.pop("max_episode_steps", spec.max_episode_steps))
        if env_kwargs:
            raise UserError(f"env_backend torch: {env_id} takes no option {', '.join(sorted(env_kwargs))}; "
                            "use env_backend auto")
        self.env_id, self.n_envs, self.max_episode_steps, self.spec = env_id, n_envs, max_episode_steps, spec
        self.mask_width = spec.action_spec.n if spec.action_mask is not None else 0
        self.observation_shape = (spec.observation_shape[0] + self.mask_width,) if self.mask_width else \
            spec.observation_shape
        self.observation_dtype, self.obs_scale, self.action_spec = torch.float32, 1.0, spec.action_spec
        self.observation_space = spec.observation_space
        actions = spec.action_spec
        self.action_space = (gymnasium.spaces.Discrete(actions.n) if actions.kind == "discrete" else
                             gymnasium.spaces.Box(actions.low[0], actions.high[0], actions.shape, "float32"))
        self.stats = EpisodeStats(n_envs, n_members=n_members)
        # A population's member m owns envs [m * n, (m + 1) * n) and draws its resets from the generator its single
        # run would have (seeded with its base env seed, seed + m * n), so its envs replay that run's.
        n = n_envs // n_members
        self.member_generators = [torch.Generator().manual_seed(seed + m * n) for m in range(n_members)]
        self._member_envs = n
        # Until reset(), every env is due to reset on its next step.
        self._physics = torch.zeros(n_envs, spec.state_width, dtype=torch.float64)
        self._elapsed = torch.zeros(n_envs, dtype=torch.int64)
        self._prev_done = torch.ones(n_envs, dtype=torch.bool)
        self.pure_step = functools.partial(env_step, spec, max_episode_steps=max_episode_steps)

    @property
    def tensor_state(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The live ``(physics, elapsed, prev_done)`` tensors."""
        return self._physics, self._elapsed, self._prev_done

    def set_tensor_state(self, state) -> None:
        """Copy ``(physics, elapsed, prev_done)`` into the live tensors (e.g. after a compiled rollout)."""
        for live, new in zip(self.tensor_state, state, strict=True):
            live.copy_(new)

    def draw_reset_uniform(self) -> torch.Tensor:
        """``[n_envs, reset_draws]`` float64 U(0, 1) draws from the env's generator: one step's ``reset_uniform``."""
        width = self.spec.reset_draws
        return torch.cat([torch.rand(self._member_envs, width, dtype=torch.float64, generator=g)
                          for g in self.member_generators])

    def reset(self) -> torch.Tensor:
        self._physics.copy_(self.spec.reset(self.draw_reset_uniform()))
        self._elapsed.zero_()
        self._prev_done.zero_()
        self.stats.running_return.zero_()
        self.stats.running_length.zero_()
        return self.spec.observation(self._physics)

    def step(self, action: torch.Tensor) -> EnvStep:
        """Step all envs with ``action`` (see ``env_step``)."""
        physics, elapsed, done, obs, reward, terminated, truncated, valid = self.pure_step(
            *self.tensor_state, action, self.draw_reset_uniform())
        self.set_tensor_state((physics, elapsed, done))  # in place: tensor_state's tensors stay the live ones
        self.stats.update(reward.cpu(), done.cpu(), valid.cpu())
        return EnvStep(obs, reward, terminated, truncated, valid, done)

    def close(self) -> None:
        """Idempotent; there is nothing to release."""
