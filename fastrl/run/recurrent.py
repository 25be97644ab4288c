"""The recurrent state a PPO / A2C rollout carries (``recurrent: lstm | gru``; the model: ``fastrl.learn.models``).

When the state is zeroed, under the next-step auto-reset convention (EnvPool's and Gymnasium's): the step after an
episode's end is a reset step (its action ignored, ``valid`` False) that returns the new episode's first
observation. So the observation acted on at row t starts an episode exactly when row t - 1 was a reset step:

    episode_start[t] = ~valid[t - 1]     (row -1: the previous rollout's last row; all True before the first rollout)

and the policy zeroes a row's state where ``episode_start`` before its step. The reset step's own row (the ended
episode's final observation) still carries that episode's state: its value is the truncation bootstrap of the
episode, and its action is masked out of every loss.

Per rollout the buffer keeps ``episode_start [T, N]`` and ``recurrent_state [T, N, S]``: the state each column
started the rollout from (before that first step's zeroing), the same in every row of the column, so that the
update's minibatches of whole columns gather it as any other input (``fastrl.learn.update.SEQUENCE_KEYS``). The state
itself carries over from one rollout to the next; a run that resumes starts from zeros on freshly reset envs.
"""
from __future__ import annotations

import torch

from fastrl.config import UserError


class RecurrentCarry:
    """The state ``[K * N, S]`` of a ``[T, K * N]`` rollout ``buffer`` (on ``device``), carried across steps and
    iterations."""

    def __init__(self, cfg, n_envs: int, env_mode: str, state_size: int, buffer, device):
        if n_envs % cfg.n_minibatches:
            raise UserError(f"n_minibatches={cfg.n_minibatches} must divide n_envs={n_envs}: a recurrent policy's "
                            "minibatches are whole env columns (n_steps sequences); pick n_minibatches that divides "
                            "n_envs")
        if env_mode != "sync":
            raise UserError("a recurrent policy steps every env together: use --env-mode sync")
        self.buffer, self.device = buffer, device
        self.state = torch.zeros(buffer.shape[1], state_size, device=device)

    def inputs(self, t: int, record: bool = True) -> tuple:
        """``(state, episode_start)`` for the policy's step at row ``t`` (``t = T``: the bootstrap value's, after the
        last row); ``record``: also write the rollout's start state (t = 0) and row t's ``episode_start``."""
        buffer = self.buffer
        episode_start = ~buffer["valid"][t - 1]
        if record:
            if t == 0:
                buffer["recurrent_state"].copy_(self.state.expand_as(buffer["recurrent_state"]))
            buffer["episode_start"][t].copy_(episode_start)
        return self.state, episode_start.to(self.device, non_blocking=True)

    def tensors(self) -> dict:
        """The whole iteration's (``fastrl.run.iteration``) carried ``recurrent_state [K * N, S]`` and the next step's
        ``episode_start [K * N]``."""
        return {"recurrent_state": self.state, "episode_start": ~self.buffer["valid"][-1]}
