"""Envs that fail the way user code fails, for the fault tests (tests/ on PYTHONPATH; the subprocess tests add it).

``FailingEnv`` raises in ``step()`` once the step count given by ``FASTRL_FAIL_AT_STEP`` (default 200) is reached,
counting that env's steps; at that step ``HangingEnv`` hangs (sleeps for an hour), ``ExitingEnv`` ends its process
(``FASTRL_EXIT_HOW``: ``os._exit`` or ``SystemExit``) and ``NaNObservationEnv`` returns a NaN observation;
``HangingResetEnv`` hangs in ``reset()``; ``WrongShapeEnv`` declares observations of shape (4,) but returns (3,) after the first
episode starts; ``make_none`` and ``make_int`` are factories that return no env. Built wrong: ``InitFailsEnv`` raises in
``__init__``, ``HugeSpaceEnv`` declares a 2**32 x 2**32 Box (numpy refuses its bounds on any machine),
``NoActionEnv`` has a Discrete(0) action space, ``NotASpaceEnv`` a tuple for an observation space. ``touch_marker`` records that it
was called (in the file ``FASTRL_MARKER``): a checkpoint naming it must never make fastrl call it.
"""
import os
import time

import gymnasium
import numpy as np


class _Base(gymnasium.Env):
    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self):
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(4, np.float32), 1.0, self.t % 10 == 0, False, {}


class FailingEnv(_Base):
    def step(self, action):
        if self.t + 1 >= int(os.environ.get("FASTRL_FAIL_AT_STEP", "200")):
            raise RuntimeError("the simulator lost its connection")
        return super().step(action)


def _at_fault_step(env) -> bool:
    return env.t + 1 >= int(os.environ.get("FASTRL_FAIL_AT_STEP", "200"))


class HangingEnv(_Base):
    def step(self, action):
        if _at_fault_step(self):
            time.sleep(3600)
        return super().step(action)


class HangingResetEnv(_Base):
    def reset(self, *, seed=None, options=None):
        time.sleep(3600)


class ExitingEnv(_Base):
    def step(self, action):
        if _at_fault_step(self):
            if os.environ.get("FASTRL_EXIT_HOW") == "SystemExit":
                raise SystemExit(3)
            os._exit(3)
        return super().step(action)


class NaNObservationEnv(_Base):
    def step(self, action):
        obs, *rest = super().step(action)
        return (obs + np.nan if _at_fault_step(self) else obs), *rest


class WrongShapeEnv(_Base):
    def step(self, action):
        obs, *rest = super().step(action)
        return obs[:3], *rest


def make_none():
    return None


def make_int():
    return 3


def touch_marker():
    with open(os.environ["FASTRL_MARKER"], "a") as f:
        f.write("called\n")
    return _Base()


class InitFailsEnv(_Base):
    def __init__(self):
        raise RuntimeError("licence file not found")


class HugeSpaceEnv(_Base):
    def __init__(self):
        super().__init__()
        self.observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2**32, 2**32), np.float32)


class NoActionEnv(_Base):
    def __init__(self):
        super().__init__()
        self.action_space = gymnasium.spaces.Discrete(1)
        self.action_space.n = np.int64(0)  # what Discrete(0) holds where Gymnasium lets it be built


class NotASpaceEnv(_Base):
    observation_space = (4,)
