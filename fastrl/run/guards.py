"""Training guards: roll back to the best weights on a return collapse or on repeated non-finite updates.

The decision uses only figures every rank already shares (all-reduced returns, all-reduced non-finite
counts), so under torchrun every rank rolls back at the same iteration to the same weights.
"""
from __future__ import annotations

import copy
import math


class RollbackGuard:
    """Keeps the best weights seen so far and says when to go back to them.

    - Collapse: the recent mean return (last 100 episodes, or the periodic evaluation) falls more than
      ``drop`` x |best| below the best for ``patience`` checks in a row. Only full windows count, and the
      window restarts after a rollback, so the collapsed episodes do not trigger it again.
    - Non-finite: ``max_nonfinite`` iterations in a row each skipped an update for a NaN/Inf loss or gradient.
    At most ``max_rollbacks`` rollbacks; each multiplies the LR scale by ``lr_factor``. ``enabled`` gates the
    collapse rule only: the non-finite rule always applies.

    The last-100-episode mean lags the policy by up to 100 episodes, so weights saved at its peak can be
    already on the way down; periodic evaluation (when it runs) measures the weights themselves and is
    used instead.
    """

    def __init__(self, enabled: bool, drop: float, lr_factor: float, max_rollbacks: int, patience: int,
                 max_nonfinite: int):
        self.enabled, self.drop, self.lr_factor = enabled, drop, lr_factor
        self.max_rollbacks, self.patience, self.max_nonfinite = max_rollbacks, patience, max_nonfinite
        self.best_return = -math.inf
        self.best_state: dict | None = None
        self.best_step = 0
        self.rollbacks = 0
        self._below = 0
        self._nonfinite_streak = 0

    def observe(self, recent_return: float | None, window_full: bool, nonfinite_updates: float,
                state_fn, step: int) -> str | None:
        """Feed one log step. Returns the reason to roll back ("collapse" / "nonfinite"), or None.

        ``state_fn()`` gives the current weights; it is called only when they become the new best.
        """
        self._nonfinite_streak = self._nonfinite_streak + 1 if nonfinite_updates > 0 else 0
        if self.best_state is None:
            self.best_state, self.best_step = copy.deepcopy(state_fn()), step
        reason = None
        if self._nonfinite_streak >= self.max_nonfinite:
            reason = "nonfinite"
        elif recent_return is not None and window_full:
            if recent_return > self.best_return and nonfinite_updates == 0:
                self.best_return = recent_return
                self.best_state, self.best_step = copy.deepcopy(state_fn()), step
                self._below = 0
            elif recent_return < self.best_return - self.drop * abs(self.best_return):
                self._below += 1
                if self._below >= self.patience:
                    reason = "collapse"
            else:
                self._below = 0
        if reason is None or (reason == "collapse" and not self.enabled) or self.rollbacks >= self.max_rollbacks:
            if reason == "nonfinite":
                self._nonfinite_streak = 0
            return None
        self.rollbacks += 1
        self._below = 0
        self._nonfinite_streak = 0
        return reason
