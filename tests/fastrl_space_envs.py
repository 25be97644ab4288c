"""Tiny Gymnasium envs with the spaces an SB3 user brings (tests/ on PYTHONPATH, importable by name), and a custom
policy. Each shows a target each step and pays for naming it; an episode is 8 steps, so a learned policy scores 8.

- ``PixelMatch``: the target (one of 2) as the bright half of a channels-last RGB image ``[H, W, 3]`` uint8.
- ``MultiMatch``: two one-hot targets (4 values each); MultiDiscrete([4, 4]) actions; 0.5 per component named.
- ``BitsMatch``: 3 random bits; MultiBinary(3) actions; 1/3 per bit copied.
- ``DictMatch``: Dict(cue: one-hot of 4 [4], frame: uint8 [1, 6, 6] noise); Discrete(4) actions.
- ``CodeMatch``: the target as a MultiDiscrete([4, 3], start=[1, 0]) observation ``(target + 1, noise)``;
  Discrete(4) actions.
- ``DictCodeMatch``: Dict(cue: Discrete(4, start=2) holding target + 2, noise: Box [2]); Discrete(4) actions.
- ``PixelSteer``: a channels-last uint8 image ``[48, 48, 3]`` whose brightness is the target in [-1, 1]; Box(-1, 1,
  (1,)) actions, paid ``1 - |action - target|``.
- ``TinyPolicy``: an ``nn.Module`` actor-critic of the documented interface (one linear layer each head).
"""
import math

import gymnasium
import numpy as np
import torch
from torch import nn

EPISODE_STEPS = 8


class _Match(gymnasium.Env):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self._draw()
        return self._observation(), {}

    def step(self, action):
        reward = self._reward(np.asarray(action))
        self.t += 1
        self._draw()
        return self._observation(), reward, self.t >= EPISODE_STEPS, False, {}


class PixelMatch(_Match):
    size = 32
    observation_space = gymnasium.spaces.Box(0, 255, (size, size, 3), np.uint8)
    action_space = gymnasium.spaces.Discrete(2)

    def _draw(self):
        self.target = int(self.np_random.integers(2))

    def _observation(self):
        image = np.zeros((self.size, self.size, 3), np.uint8)
        half = self.size // 2
        image[:, half * self.target:half * (self.target + 1)] = 255
        return image

    def _reward(self, action):
        return float(int(action) == self.target)


class PixelMatchSmall(PixelMatch):
    size = 4
    observation_space = gymnasium.spaces.Box(0, 255, (size, size, 3), np.uint8)


class MultiMatch(_Match):
    observation_space = gymnasium.spaces.Box(0.0, 1.0, (8,), np.float32)
    action_space = gymnasium.spaces.MultiDiscrete([4, 4])

    def _draw(self):
        self.target = self.np_random.integers(4, size=2)

    def _observation(self):
        return np.concatenate([np.eye(4, dtype=np.float32)[t] for t in self.target])

    def _reward(self, action):
        return float(np.mean(action == self.target))


class BitsMatch(_Match):
    observation_space = gymnasium.spaces.Box(0.0, 1.0, (3,), np.float32)
    action_space = gymnasium.spaces.MultiBinary(3)

    def _draw(self):
        self.target = self.np_random.integers(2, size=3)

    def _observation(self):
        return self.target.astype(np.float32)

    def _reward(self, action):
        return float(np.mean(action == self.target))


class DictMatch(_Match):
    observation_space = gymnasium.spaces.Dict({"cue": gymnasium.spaces.Box(0.0, 1.0, (4,), np.float32),
                                               "frame": gymnasium.spaces.Box(0, 255, (6, 6, 1), np.uint8)})
    action_space = gymnasium.spaces.Discrete(4)

    def _draw(self):
        self.target = int(self.np_random.integers(4))

    def _observation(self):
        return {"cue": np.eye(4, dtype=np.float32)[self.target],
                "frame": self.np_random.integers(0, 256, (6, 6, 1), dtype=np.uint8)}

    def _reward(self, action):
        return float(int(action) == self.target)


class CodeMatch(_Match):
    observation_space = gymnasium.spaces.MultiDiscrete([4, 3], start=[1, 0])
    action_space = gymnasium.spaces.Discrete(4)

    def _draw(self):
        self.target = int(self.np_random.integers(4))

    def _observation(self):
        return np.array([self.target + 1, self.np_random.integers(3)])

    def _reward(self, action):
        return float(int(action) == self.target)


class DictCodeMatch(CodeMatch):
    observation_space = gymnasium.spaces.Dict({"cue": gymnasium.spaces.Discrete(4, start=2),
                                               "noise": gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)})

    def _observation(self):
        return {"cue": self.target + 2, "noise": self.np_random.uniform(-1, 1, 2).astype(np.float32)}


class PixelSteer(_Match):
    observation_space = gymnasium.spaces.Box(0, 255, (48, 48, 3), np.uint8)
    action_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def _draw(self):
        self.target = float(self.np_random.uniform(-1, 1))

    def _observation(self):
        return np.full((48, 48, 3), round((self.target + 1) * 127.5), np.uint8)

    def _reward(self, action):
        return 1.0 - abs(float(action[0]) - self.target)


class TinyPolicy(nn.Module):
    """The interface a custom policy implements: built as ``cls(observation_shape, action_spec, config)``;
    ``get_value(obs) -> [B]``, ``get_action_and_value(obs, action=None, noise=None) -> (action, logp, entropy,
    value)``, ``act_deterministic(obs) -> action``. Discrete actions only, here."""

    def __init__(self, observation_shape, action_spec, cfg):
        super().__init__()
        width = math.prod(observation_shape)
        self.policy = nn.Linear(width, action_spec.n)
        self.value = nn.Linear(width, 1)

    def get_value(self, obs):
        return self.value(obs.flatten(1).float()).squeeze(-1)

    def get_action_and_value(self, obs, action=None, noise=None):
        x = obs.flatten(1).float()
        logits = self.policy(x)
        if action is None:
            uniform = torch.rand_like(logits) if noise is None else noise
            action = torch.argmax(logits - torch.log(-torch.log(uniform.clamp(1e-20, 1.0))), dim=-1)
        log_probs = torch.log_softmax(logits, -1)
        logp = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return action, logp, entropy, self.value(x).squeeze(-1)

    @torch.no_grad()
    def act_deterministic(self, obs):
        return self.policy(obs.flatten(1).float()).argmax(-1)
