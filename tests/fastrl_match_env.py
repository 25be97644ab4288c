"""A tiny custom Gymnasium env for the API tests, importable by name (tests/ on PYTHONPATH).

MatchTarget: each step shows one of 4 targets as a one-hot observation; the action that names it earns 1, any other
0; an episode is 8 steps. A uniformly random policy scores 2 per episode on average, a learned one 8.

Importing this module registers ``MatchTarget-v0`` with Gymnasium, so ``--env fastrl_match_env:MatchTarget-v0``
works from the command line.
"""
import gymnasium
import numpy as np

N_TARGETS = 4
EPISODE_STEPS = 8


class MatchTarget(gymnasium.Env):
    observation_space = gymnasium.spaces.Box(0.0, 1.0, (N_TARGETS,), np.float32)
    action_space = gymnasium.spaces.Discrete(N_TARGETS)

    def __init__(self):
        self.target, self.t = 0, 0

    def _observation(self) -> np.ndarray:
        return np.eye(N_TARGETS, dtype=np.float32)[self.target]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target, self.t = int(self.np_random.integers(N_TARGETS)), 0
        return self._observation(), {}

    def step(self, action):
        reward = float(int(action) == self.target)
        self.t += 1
        self.target = int(self.np_random.integers(N_TARGETS))
        return self._observation(), reward, self.t >= EPISODE_STEPS, False, {}


def make_match_target() -> MatchTarget:
    return MatchTarget()


if "MatchTarget-v0" not in gymnasium.registry:
    gymnasium.register("MatchTarget-v0", entry_point=MatchTarget)
