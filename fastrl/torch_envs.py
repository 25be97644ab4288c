"""Torch-native batched envs (``env_backend: torch``): the env step is a pure function over tensors, gymnax-style,
so a rollout can step the env inside one ``torch.compile``'d graph, on any device.

CartPole (``CartPole-v1``: 500 steps, ``CartPole-v0``: 200) follows Gymnasium's dynamics (Euler integration, float64
physics, float32 observations, reward 1 on every step including the terminating one) and the step contract of
``fastrl.envs`` (next-step auto-reset, ``valid`` False on reset steps). At the time limit the step is ``truncated``
and never ``terminated``, as EnvPool reports it (Gymnasium's TimeLimit would set both when the pole falls on the
last step).

The state is ``(physics [N, 4] float64 (x, x_dot, theta, theta_dot), elapsed [N] int64, prev_done [N] bool)``.
Reset draws come in as an argument (``reset_uniform [N, 4]`` float64 U(0, 1), drawn for every env on every step),
so the step has no RNG inside and its random stream does not depend on which envs reset. A batch built with
``seed`` draws from one ``torch.Generator`` seeded ``seed`` (EnvPool's per-env streams cannot be reproduced).
"""
from __future__ import annotations

import functools
import math

import torch

from fastrl.config import UserError
from fastrl.envs import ActionSpec, EnvStep, EpisodeStats

# Gymnasium's CartPoleEnv constants, computed the same way so the float64 arithmetic matches to the bit.
GRAVITY = 9.8
MASSCART = 1.0
MASSPOLE = 0.1
TOTAL_MASS = MASSPOLE + MASSCART
LENGTH = 0.5  # half the pole's length
POLEMASS_LENGTH = MASSPOLE * LENGTH
FORCE_MAG = 10.0
TAU = 0.02
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4
RESET_BOUND = 0.05

# id -> max_episode_steps (Gymnasium's and EnvPool's registrations)
TORCH_ENV_IDS = {"CartPole-v1": 500, "CartPole-v0": 200}


def cartpole_reset_state(uniform: torch.Tensor) -> torch.Tensor:
    """``uniform [N, 4]`` float64 U(0, 1) draws -> first physics state ``[N, 4]`` float64, uniform in [-0.05, 0.05]."""
    return uniform * (2 * RESET_BOUND) - RESET_BOUND


def cartpole_step(physics: torch.Tensor, elapsed: torch.Tensor, prev_done: torch.Tensor, action: torch.Tensor,
                  reset_uniform: torch.Tensor, max_episode_steps: int):
    """One batched CartPole step with next-step auto-reset; pure, branch-free (fine under ``fullgraph=True``).

    ``physics [N, 4]`` float64 (x, x_dot, theta, theta_dot); ``elapsed [N]`` int64 steps taken in the current episode;
    ``prev_done [N]`` bool (the previous step ended the episode: this step resets, its action is ignored);
    ``action [N]`` int64 (0 pushes left, 1 right); ``reset_uniform [N, 4]`` float64 U(0, 1), read by resetting envs.

    Returns ``(physics, elapsed, done, observation [N, 4] float32, reward [N] float32, terminated [N] bool,
    truncated [N] bool, valid [N] bool)``: the new state (``done = terminated | truncated`` is the next call's
    ``prev_done``), then the step's outputs as ``fastrl.envs.EnvStep`` defines them.
    """
    x, x_dot, theta, theta_dot = physics.unbind(-1)
    force = (action.to(physics.dtype) * 2 - 1) * FORCE_MAG  # exactly +-10 for actions 1/0
    costheta, sintheta = torch.cos(theta), torch.sin(theta)
    temp = (force + POLEMASS_LENGTH * theta_dot.square() * sintheta) / TOTAL_MASS
    thetaacc = (GRAVITY * sintheta - costheta * temp) / (
        LENGTH * (4.0 / 3.0 - MASSPOLE * costheta.square() / TOTAL_MASS))
    xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS
    stepped = torch.stack((x + TAU * x_dot, x_dot + TAU * xacc, theta + TAU * theta_dot,
                           theta_dot + TAU * thetaacc), dim=-1)

    valid = ~prev_done
    physics = torch.where(prev_done.unsqueeze(-1), cartpole_reset_state(reset_uniform), stepped)
    elapsed = torch.where(prev_done, torch.zeros_like(elapsed), elapsed + 1)
    x, theta = physics[:, 0], physics[:, 2]
    fallen = (x < -X_THRESHOLD) | (x > X_THRESHOLD) | (theta < -THETA_THRESHOLD) | (theta > THETA_THRESHOLD)
    truncated = valid & (elapsed >= max_episode_steps)
    terminated = valid & fallen & ~truncated
    done = terminated | truncated
    return physics, elapsed, done, physics.float(), valid.float(), terminated, truncated, valid


def resolve_torch_env(env_id: str) -> int:
    """``max_episode_steps`` of a torch-native ``env_id``, or a one-line UserError naming the supported ids."""
    if env_id not in TORCH_ENV_IDS:
        raise UserError(f"env_backend torch has no torch-native env {env_id!r} (it has {', '.join(TORCH_ENV_IDS)}); "
                        "use env_backend auto")
    return TORCH_ENV_IDS[env_id]


class TorchCartPoleEnv:
    """``n_envs`` CartPoles stepped as one batch of tensors, with ``fastrl.envs.BatchedEnv``'s interface.

    ``step()`` runs ``cartpole_step`` eagerly (a handful of vectorized torch ops, no per-env Python, no numpy)
    and updates ``stats``. A compiled rollout uses ``pure_step``, ``tensor_state``, ``set_tensor_state`` and
    ``draw_reset_uniform`` instead. Tensors live on ``device`` (CPU by default, as the EnvStep contract has them).
    ``env_kwargs`` may set ``max_episode_steps``; ``num_threads`` is accepted and ignored.
    """
    backend = "torch"

    def __init__(self, env_id: str, n_envs: int, seed: int, num_threads: int = 0, env_kwargs: dict | None = None,
                 device: torch.device | str = "cpu", n_members: int = 1):
        max_episode_steps = resolve_torch_env(env_id)
        env_kwargs = dict(env_kwargs or {})
        max_episode_steps = int(env_kwargs.pop("max_episode_steps", max_episode_steps))
        if env_kwargs:
            raise UserError(f"env_backend torch: {env_id} takes no option {', '.join(sorted(env_kwargs))}; "
                            "use env_backend auto")
        self.env_id, self.n_envs, self.max_episode_steps = env_id, n_envs, max_episode_steps
        self.device = torch.device(device)
        self.observation_shape, self.observation_dtype, self.obs_scale = (4,), torch.float32, 1.0
        self.action_spec = ActionSpec("discrete", n=2)
        import gymnasium  # the spaces Gymnasium's CartPole-v1 declares, bounds loosened to the real line
        self.observation_space = gymnasium.spaces.Box(-float("inf"), float("inf"), (4,), "float32")
        self.action_space = gymnasium.spaces.Discrete(2)
        self.stats = EpisodeStats(n_envs)
        # A population's member m owns envs [m * n, (m + 1) * n) and draws its resets from the generator its single
        # run would have (seeded with its base env seed, seed + m * n), so its envs replay that run's.
        n = n_envs // n_members
        self._generators = [torch.Generator(device=self.device).manual_seed(seed + m * n) for m in range(n_members)]
        self._member_envs = n
        # Until reset(), every env is due to reset on its next step.
        self._physics = torch.zeros(n_envs, 4, dtype=torch.float64, device=self.device)
        self._elapsed = torch.zeros(n_envs, dtype=torch.int64, device=self.device)
        self._prev_done = torch.ones(n_envs, dtype=torch.bool, device=self.device)
        self.pure_step = functools.partial(cartpole_step, max_episode_steps=max_episode_steps)

    @property
    def tensor_state(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The live ``(physics, elapsed, prev_done)`` tensors."""
        return self._physics, self._elapsed, self._prev_done

    def set_tensor_state(self, state) -> None:
        """Copy ``(physics, elapsed, prev_done)`` into the live tensors (e.g. after a compiled rollout)."""
        for live, new in zip(self.tensor_state, state, strict=True):
            live.copy_(new)

    def draw_reset_uniform(self) -> torch.Tensor:
        """``[n_envs, 4]`` float64 U(0, 1) draws from the env's generator: one step's ``reset_uniform``."""
        if len(self._generators) == 1:
            return torch.rand(self.n_envs, 4, dtype=torch.float64, generator=self._generators[0], device=self.device)
        return torch.cat([torch.rand(self._member_envs, 4, dtype=torch.float64, generator=g, device=self.device)
                          for g in self._generators])

    def reset(self) -> torch.Tensor:
        self._physics.copy_(cartpole_reset_state(self.draw_reset_uniform()))
        self._elapsed.zero_()
        self._prev_done.zero_()
        self.stats.running_return.zero_()
        self.stats.running_length.zero_()
        return self._physics.float()

    def step(self, action: torch.Tensor) -> EnvStep:
        """Step all envs with ``action`` (int64 ``[N]`` on ``device``)."""
        physics, elapsed, done, obs, reward, terminated, truncated, valid = self.pure_step(
            *self.tensor_state, action, self.draw_reset_uniform())
        self.set_tensor_state((physics, elapsed, done))  # in place: tensor_state's tensors stay the live ones
        self.stats.update(reward.cpu(), done.cpu(), valid.cpu())
        return EnvStep(obs, reward, terminated, truncated, valid, done)

    def close(self) -> None:
        """Idempotent; there is nothing to release."""
