"""Gymnasium's classic-control dynamics as batched, branch-free torch functions (``fastrl.envs.torch_envs`` steps them).

Each env is three pure functions over a float64 physics state ``[N, S]``:

- ``<env>_reset(uniform) -> physics``: Gymnasium's reset distribution from ``uniform [N, R]`` float64 U(0, 1) draws;
- ``<env>_dynamics(physics, action, fresh, uniform) -> (physics, reward [N] float64, reached [N] bool)``: the
  unwrapped Gymnasium env's ``step`` (``reached`` is its ``terminated``; the time limit is the caller's). ``fresh [N]``
  bool: no step taken since the reset (only MountainCarContinuous reads it); ``uniform``: the step's draws, which
  these deterministic dynamics ignore;
- ``<env>_observe(physics) -> observation [N, D]`` float32 (``state_observation`` where it is the state itself).

The arithmetic follows Gymnasium's op for op, in float64 where NumPy computes in float64. Where NumPy computes in
float32 (MountainCarContinuous keeps a float32 state; the float32 actions of Pendulum and MountainCarContinuous meet
Python floats, which NumPy 2 casts down to float32), each float32 result is the float64 result rounded once to
float32 (``_f32``): for +, - and * of float32 values that is the float32 op's result exactly. Continuous actions
arrive clipped to their Box (``fastrl.envs.torch_envs.env_step`` does it, as ``fastrl.envs.batched.BatchedEnv`` does).
"""
from __future__ import annotations

import math
import struct

import torch


def _f32(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to the nearest float32, kept float64."""
    return x.float().double()


def _f32_value(value: float) -> float:
    """The float32 nearest ``value``, as a Python float (a NumPy float32 compared with or scaled by it)."""
    return struct.unpack("f", struct.pack("f", value))[0]


def _uniform(uniform: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """NumPy's ``uniform(low, high)`` from U(0, 1) draws."""
    return low + (high - low) * uniform


def _as_float32(*columns: torch.Tensor) -> torch.Tensor:
    return torch.stack(columns, dim=-1).float()


# ---------------------------------------------------------------------------------------------------- CartPole
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


def cartpole_reset(uniform: torch.Tensor) -> torch.Tensor:
    """``[N, 4]`` draws -> ``(x, x_dot, theta, theta_dot)``, each uniform in [-0.05, 0.05]."""
    return _uniform(uniform, -RESET_BOUND, RESET_BOUND)


def cartpole_dynamics(physics: torch.Tensor, action: torch.Tensor, fresh: torch.Tensor, uniform=None):
    """Euler step; ``action [N]`` int64 (0 pushes left, 1 right); reward 1 on every step, the falling one too."""
    x, x_dot, theta, theta_dot = physics.unbind(-1)
    force = (action.to(physics.dtype) * 2 - 1) * FORCE_MAG  # exactly +-10 for actions 1/0
    costheta, sintheta = torch.cos(theta), torch.sin(theta)
    temp = (force + POLEMASS_LENGTH * theta_dot.square() * sintheta) / TOTAL_MASS
    thetaacc = (GRAVITY * sintheta - costheta * temp) / (
        LENGTH * (4.0 / 3.0 - MASSPOLE * costheta.square() / TOTAL_MASS))
    xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS
    x, theta = x + TAU * x_dot, theta + TAU * theta_dot
    stepped = torch.stack((x, x_dot + TAU * xacc, theta, theta_dot + TAU * thetaacc), dim=-1)
    fallen = (x < -X_THRESHOLD) | (x > X_THRESHOLD) | (theta < -THETA_THRESHOLD) | (theta > THETA_THRESHOLD)
    return stepped, torch.ones_like(x), fallen


def cartpole_positions(physics: torch.Tensor) -> torch.Tensor:
    """CartPole without its velocities (CartPoleNoVel-v1): ``[x, theta]`` float32."""
    return physics[..., 0::2].float()


def state_observation(physics: torch.Tensor) -> torch.Tensor:
    """The physics state itself, as float32 (CartPole, MountainCar)."""
    return physics.float()


# ---------------------------------------------------------------------------------------------------- Acrobot-v1
ACROBOT_MAX_VEL_1 = 4 * math.pi
ACROBOT_MAX_VEL_2 = 9 * math.pi
ACROBOT_DT = 0.2


def acrobot_reset(uniform: torch.Tensor) -> torch.Tensor:
    """``[N, 4]`` draws -> ``(theta1, theta2, dtheta1, dtheta2)`` uniform in [-0.1, 0.1], rounded to float32 as
    Gymnasium's reset stores them."""
    return _f32(_uniform(uniform, -0.1, 0.1))


def _acrobot_derivatives(theta1, theta2, dtheta1, dtheta2, a):
    """Gymnasium's ``_dsdt`` with ``book_or_nips = "book"``, written as it is so the float64 ops come in its order."""
    m1 = m2 = l1 = 1.0
    lc1 = lc2 = 0.5
    I1 = I2 = 1.0  # noqa: N806 - Gymnasium's names
    g, pi = 9.8, math.pi
    cos, sin = torch.cos, torch.sin
    d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * cos(theta2)) + I1 + I2
    d2 = m2 * (lc2**2 + l1 * lc2 * cos(theta2)) + I2
    phi2 = m2 * lc2 * g * cos(theta1 + theta2 - pi / 2.0)
    phi1 = (-m2 * l1 * lc2 * dtheta2**2 * sin(theta2) - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * sin(theta2)
            + (m1 * lc1 + m2 * l1) * g * cos(theta1 - pi / 2) + phi2)
    ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1**2 * sin(theta2) - phi2) / (m2 * lc2**2 + I2 - d2**2 / d1)
    ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
    return dtheta1, dtheta2, ddtheta1, ddtheta2


def _wrap_angle(x: torch.Tensor) -> torch.Tensor:
    """Gymnasium's ``wrap(x, -pi, pi)``: whole turns added or taken off until ``x`` lies in [-pi, pi] (one turn, the
    usual case, gives its loop's result to the bit)."""
    turn = 2 * math.pi
    turns = torch.ceil((x - math.pi) / turn).clamp(min=0) - torch.ceil((-math.pi - x) / turn).clamp(min=0)
    return x - turns * turn


def acrobot_dynamics(physics: torch.Tensor, action: torch.Tensor, fresh: torch.Tensor, uniform=None):
    """One RK4 step of ``dt = 0.2`` under torque ``action - 1`` (``action [N]`` int64 in {0, 1, 2}), angles wrapped,
    velocities clipped to [-4 pi, 4 pi] and [-9 pi, 9 pi]; reward -1, 0 on the step that reaches the goal
    (``-cos(theta1) - cos(theta1 + theta2) > 1``)."""
    torque = action.to(physics.dtype) - 1
    y0 = physics.unbind(-1)
    dt = ACROBOT_DT
    dt2 = dt / 2.0
    k1 = _acrobot_derivatives(*y0, torque)
    k2 = _acrobot_derivatives(*(y + dt2 * k for y, k in zip(y0, k1)), torque)
    k3 = _acrobot_derivatives(*(y + dt2 * k for y, k in zip(y0, k2)), torque)
    k4 = _acrobot_derivatives(*(y + dt * k for y, k in zip(y0, k3)), torque)
    theta1, theta2, dtheta1, dtheta2 = (y + dt / 6.0 * (a + 2 * b + 2 * c + d)
                                        for y, a, b, c, d in zip(y0, k1, k2, k3, k4))
    theta1, theta2 = _wrap_angle(theta1), _wrap_angle(theta2)
    dtheta1 = dtheta1.clamp(-ACROBOT_MAX_VEL_1, ACROBOT_MAX_VEL_1)
    dtheta2 = dtheta2.clamp(-ACROBOT_MAX_VEL_2, ACROBOT_MAX_VEL_2)
    reached = -torch.cos(theta1) - torch.cos(theta2 + theta1) > 1.0
    reward = torch.where(reached, 0.0, -1.0).to(physics.dtype)
    return torch.stack((theta1, theta2, dtheta1, dtheta2), dim=-1), reward, reached


def acrobot_observe(physics: torch.Tensor) -> torch.Tensor:
    """``(cos theta1, sin theta1, cos theta2, sin theta2, dtheta1, dtheta2)``."""
    theta1, theta2, dtheta1, dtheta2 = physics.unbind(-1)
    return _as_float32(torch.cos(theta1), torch.sin(theta1), torch.cos(theta2), torch.sin(theta2), dtheta1, dtheta2)


# ---------------------------------------------------------------------------------------------------- MountainCar
MOUNTAIN_CAR_MIN_POSITION = -1.2
MOUNTAIN_CAR_MAX_POSITION = 0.6
MOUNTAIN_CAR_MAX_SPEED = 0.07
MOUNTAIN_CAR_GOAL = 0.5
MOUNTAIN_CAR_CONTINUOUS_GOAL = 0.45


def mountain_car_reset(uniform: torch.Tensor) -> torch.Tensor:
    """``[N, 1]`` draws -> ``(position, velocity)``: position uniform in [-0.6, -0.4], velocity 0 (both versions)."""
    position = _uniform(uniform[:, 0], -0.6, -0.4)
    return torch.stack((position, torch.zeros_like(position)), dim=-1)


def mountain_car_dynamics(physics: torch.Tensor, action: torch.Tensor, fresh: torch.Tensor, uniform=None):
    """MountainCar-v0: ``action [N]`` int64 in {0, 1, 2} pushes with ``(action - 1) * 0.001``; velocity clipped to
    +-0.07, position to [-1.2, 0.6] (stopping at the left wall); reward -1; goal: position >= 0.5."""
    position, velocity = physics.unbind(-1)
    velocity = velocity + ((action.to(physics.dtype) - 1) * 0.001 + torch.cos(3 * position) * (-0.0025))
    velocity = velocity.clamp(-MOUNTAIN_CAR_MAX_SPEED, MOUNTAIN_CAR_MAX_SPEED)
    position = (position + velocity).clamp(MOUNTAIN_CAR_MIN_POSITION, MOUNTAIN_CAR_MAX_POSITION)
    velocity = torch.where((position == MOUNTAIN_CAR_MIN_POSITION) & (velocity < 0), 0.0, velocity)
    reached = (position >= MOUNTAIN_CAR_GOAL) & (velocity >= 0)
    return torch.stack((position, velocity), dim=-1), torch.full_like(position, -1.0), reached


# MountainCarContinuous compares and scales its float32 state and action with these, cast to float32 by NumPy.
_POWER_F32 = _f32_value(0.0015)
_MAX_SPEED_F32 = _f32_value(MOUNTAIN_CAR_MAX_SPEED)
_MIN_POSITION_F32 = _f32_value(MOUNTAIN_CAR_MIN_POSITION)
_MAX_POSITION_F32 = _f32_value(MOUNTAIN_CAR_MAX_POSITION)
_CONTINUOUS_GOAL_F32 = _f32_value(MOUNTAIN_CAR_CONTINUOUS_GOAL)


def mountain_car_continuous_dynamics(physics: torch.Tensor, action: torch.Tensor, fresh: torch.Tensor, uniform=None):
    """MountainCarContinuous-v0: ``action [N, 1]`` float32 in [-1, 1] pushes with ``0.0015 * action``; the state is
    float32 after the first step (``fresh``: still Gymnasium's float64 reset state); reward ``-0.1 * action ** 2``,
    plus 100 on the step that reaches the goal (position >= 0.45)."""
    position, velocity = physics.unbind(-1)
    force = action[:, 0].double()
    angle = 3 * position  # float64 on the reset state, a float32 product afterwards
    angle = torch.where(fresh, angle, _f32(angle))
    velocity = _f32(velocity + _f32(_f32(force * _POWER_F32) - _f32(0.0025 * torch.cos(angle))))
    # Gymnasium stores +-0.07, -1.2 and 0.6 as Python floats, which the float32 state then rounds to these.
    velocity = velocity.clamp(-_MAX_SPEED_F32, _MAX_SPEED_F32)
    position = _f32(position + velocity).clamp(_MIN_POSITION_F32, _MAX_POSITION_F32)
    velocity = torch.where((position == _MIN_POSITION_F32) & (velocity < 0), 0.0, velocity)
    reached = (position >= _CONTINUOUS_GOAL_F32) & (velocity >= 0)
    reward = torch.where(reached, 100.0, 0.0).to(physics.dtype) - force.square() * 0.1
    return torch.stack((position, velocity), dim=-1), reward, reached


# ---------------------------------------------------------------------------------------------------- Pendulum-v1
PENDULUM_MAX_SPEED = 8.0
PENDULUM_MAX_TORQUE = 2.0
PENDULUM_DT = 0.05
_TORQUE_COST_F32 = _f32_value(0.001)


def pendulum_reset(uniform: torch.Tensor) -> torch.Tensor:
    """``[N, 2]`` draws -> ``(theta, theta_dot)``: theta uniform in [-pi, pi], theta_dot in [-1, 1]."""
    return torch.stack((_uniform(uniform[:, 0], -math.pi, math.pi), _uniform(uniform[:, 1], -1.0, 1.0)), dim=-1)


def pendulum_dynamics(physics: torch.Tensor, action: torch.Tensor, fresh: torch.Tensor, uniform=None):
    """Pendulum-v1 (g = 10): ``action [N, 1]`` float32 torque in [-2, 2]; reward ``-(angle_normalize(theta) ** 2 +
    0.1 * theta_dot ** 2 + 0.001 * torque ** 2)`` from the state before the step; theta_dot clipped to +-8; never
    terminates."""
    th, thdot = physics.unbind(-1)
    u = action[:, 0].double()
    g, m, length, dt = 10.0, 1.0, 1.0, PENDULUM_DT
    # NumPy's float64 % (fmod, then the divisor added to a negative remainder), exact where a floor-based one is not
    turn = 2 * math.pi
    remainder = torch.fmod(th + math.pi, turn)
    normalized = torch.where(remainder < 0, remainder + turn, remainder) - math.pi
    costs = normalized**2 + 0.1 * thdot**2 + _f32(_TORQUE_COST_F32 * _f32(u * u))
    newthdot = thdot + (3 * g / (2 * length) * torch.sin(th) + _f32(3.0 / (m * length**2) * u)) * dt
    newthdot = newthdot.clamp(-PENDULUM_MAX_SPEED, PENDULUM_MAX_SPEED)
    newth = th + newthdot * dt
    return torch.stack((newth, newthdot), dim=-1), -costs, torch.zeros_like(th, dtype=torch.bool)


def pendulum_observe(physics: torch.Tensor) -> torch.Tensor:
    """``(cos theta, sin theta, theta_dot)``."""
    th, thdot = physics.unbind(-1)
    return _as_float32(torch.cos(th), torch.sin(th), thdot)
