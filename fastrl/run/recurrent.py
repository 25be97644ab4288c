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
    iterations; for a policy without one (no ``recurrent_state`` in ``buffer``) every call passes straight through."""

    def __init__(self, cfg, n_envs: int, env_mode: str, buffer, device):
        self.recurrent = "recurrent_state" in buffer.keys()
        if self.recurrent and n_envs % cfg.n_minibatches:
            raise UserError(f"n_minibatches={cfg.n_minibatches} must divide n_envs={n_envs}: a recurrent policy's "
                            "minibatches are whole env columns (n_steps sequences); pick n_minibatches that divides "
                            "n_envs")
        if self.recurrent and env_mode != "sync":
            raise UserError("a recurrent policy steps every env together: use --env-mode sync")
        self.buffer, self.device = buffer, device
        self.state = torch.zeros(buffer["recurrent_state"].shape[1:], device=device) if self.recurrent else None

    def act(self, policy_step, obs: torch.Tensor, noise: torch.Tensor, t: int) -> tuple:
        """``policy_step(obs, None, noise, ...)``'s ``(action, logp, entropy, value)`` at row ``t`` on ``device``, the
        state carried on."""
        out = policy_step(obs.to(self.device, non_blocking=True), None, noise.to(self.device, non_blocking=True),
                          *self.inputs(t))
        if self.recurrent:  # a copy: a CUDA-graph replay would overwrite its output while the next call reads it
            self.state = out[4].clone()
        return out[:4]

    def bootstrap(self, get_value, obs: torch.Tensor) -> torch.Tensor:
        """``get_value`` of the observation after the rollout's last row, from the carried state."""
        return get_value(obs.to(self.device, non_blocking=True), *self.inputs(self.buffer.shape[0], record=False))

    def inputs(self, t: int, record: bool = True) -> tuple:
        """``(state, episode_start)`` for the policy's step at row ``t`` (``t = T``: the bootstrap value's, after the
        last row), or ``()`` without recurrence; ``record``: also write the rollout's start state (t = 0) and row t's
        ``episode_start``."""
        if not self.recurrent:
            return ()
        buffer = self.buffer
        episode_start = ~buffer["valid"][t - 1]
        if record:
            if t == 0:
                buffer["recurrent_state"].copy_(self.state.expand_as(buffer["recurrent_state"]))
            buffer["episode_start"][t].copy_(episode_start)
        return self.state, episode_start.to(self.device, non_blocking=True)

    def tensors(self) -> dict:
        """The whole iteration's (``fastrl.run.iteration``) carried ``recurrent_state [K * N, S]`` and the next step's
        ``episode_start [K * N]`` (none without recurrence)."""
        return {"recurrent_state": self.state, "episode_start": ~self.buffer["valid"][-1]} if self.recurrent else {}
