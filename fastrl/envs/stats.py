"""What every env backend shares: one step's tensors (``EnvStep``), episode statistics over envs and members
(``EpisodeStats``, reset steps masked out by ``valid``) and running observation / return normalizers."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class EnvStep:
    observation: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    valid: torch.Tensor
    done: torch.Tensor  # terminated | truncated


class EpisodeStats:
    """Per-env running return and length, and a ring of the last ``window`` finished episodes.

    Reset steps (``valid`` False) add nothing. All bookkeeping is vectorized over envs. ``n_members`` K: the envs are
    K members' equal blocks (member m owns envs ``[m * n, (m + 1) * n)``), and ``members[m]`` is member m's own
    ``EpisodeStats`` (running sums: views of these; at K = 1 this one), whose ``recent()``, ``summary()`` and state
    equal those of member m's single run.
    """

    def __init__(self, n_envs: int, window: int = 100, n_members: int = 1):
        self.running_return = torch.zeros(n_envs, dtype=torch.float64)
        self.running_length = torch.zeros(n_envs, dtype=torch.int64)
        self.returns = torch.zeros(window, dtype=torch.float64)
        self.lengths = torch.zeros(window, dtype=torch.int64)
        self.window = window
        self.count = 0  # finished episodes so far
        self.window_start = 0  # recent() only looks at episodes from here on
        self.member_envs = n = n_envs // n_members
        self.members = [EpisodeStats(n, window) for _ in range(n_members)] if n_members > 1 else [self]
        for m, member in enumerate(self.members):  # at K = 1 a view of the whole, which changes nothing
            member.running_return = self.running_return[m * n:(m + 1) * n]
            member.running_length = self.running_length[m * n:(m + 1) * n]

    def update(self, reward, done, valid, env_ids=None) -> None:
        """``reward``, ``done``, ``valid``: ``[N]`` CPU tensors or numpy arrays; or ``[k]`` for the envs ``env_ids``
        (distinct ints ``[k]``, as an async env's recv returns them).

        Per-step bookkeeping runs in numpy on views of the tensors: a numpy op on 8-64 elements costs
        about a microsecond, a torch op several.
        """
        reward, done, valid = np.asarray(reward), np.asarray(done), np.asarray(valid)
        running_return, running_length = self.running_return.numpy(), self.running_length.numpy()
        ids = slice(None) if env_ids is None else np.asarray(env_ids)
        running_return[ids] += reward * valid  # env_ids are distinct, so the indexed += adds once per env
        running_length[ids] += valid
        if done.any():
            finished = np.flatnonzero(done) if env_ids is None else ids[done]
            self.record(running_return[finished], running_length[finished], finished)
            running_return[finished] = 0.0
            running_length[finished] = 0

    def record(self, returns: np.ndarray, lengths: np.ndarray, env_ids: np.ndarray | None = None) -> None:
        """Add finished episodes (their returns and lengths, in order; ``env_ids``: the envs they ended in) to the
        ring, and a population's to their members' rings too."""
        if len(self.members) > 1:
            owner = np.asarray(env_ids) // self.member_envs
            for m in np.unique(owner):
                self.members[m].record(returns[owner == m], lengths[owner == m])
        slots = np.arange(self.count, self.count + returns.size) % self.window
        self.returns.numpy()[slots] = returns
        self.lengths.numpy()[slots] = lengths
        self.count += returns.size

    def recent(self, limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns and lengths of the last ``min(count - window_start, window, limit)`` finished episodes."""
        n = min(self.count - self.window_start, self.window, self.window if limit is None else limit)
        slots = torch.arange(self.count - n, self.count) % self.window
        return self.returns[slots], self.lengths[slots]

    def restart_window(self) -> None:
        """Forget the episodes so far for ``recent()`` (e.g. after a rollback); ``count`` keeps counting."""
        self.window_start = self.count

    def summary(self) -> dict:
        """``episodes`` (finished so far), ``episode_window_full``, and once ``recent()`` holds any, the window's
        ``episode_return_mean`` and ``episode_length_mean`` and the last episode's ``episode_return_last``."""
        returns, lengths = self.recent()
        out = {"episodes": self.count, "episode_window_full": returns.numel() == self.window}
        if returns.numel():
            out.update(episode_return_mean=returns.mean().item(), episode_length_mean=lengths.double().mean().item(),
                       episode_return_last=self.recent(1)[0].item())
        return out

    def state_dict(self) -> dict:
        return {"returns": self.returns.clone(), "lengths": self.lengths.clone(), "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.returns.copy_(state["returns"])
        self.lengths.copy_(state["lengths"])
        self.count = int(state["count"])


def normalize_observation(obs: torch.Tensor, obs_rms, clip: float) -> torch.Tensor:
    """``(obs - mean) / sqrt(var + 1e-8)`` (``obs_rms.mean``, ``obs_rms.var``), clipped to ``[-clip, clip]``, float32:
    what the policy was trained on."""
    scaled = (obs.double() - obs_rms.mean) / torch.sqrt(obs_rms.var + 1e-8)
    return scaled.clamp_(-clip, clip).float()


class MemberRunningMeanStd:
    """K running means and variances, one per member, updated at once from ``[K, n, *shape]`` batches (Chan et al.
    parallel update), float64: ``mean``, ``var`` ``[K, *shape]``, ``count`` ``[K]``."""

    def __init__(self, members: int, shape=()):
        self.mean = torch.zeros((members, *shape), dtype=torch.float64)
        self.var = torch.ones((members, *shape), dtype=torch.float64)
        self.count = torch.full((members,), 1e-4, dtype=torch.float64)

    def update(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Fold in ``x [K, n, *shape]``; ``mask [K, n]`` keeps only its rows (None: all). A member with no row
        keeps its statistics (no NaN from an empty mean)."""
        x = x.double()
        trailing = (1,) * (x.dim() - 2)
        if mask is None:
            if x.shape[1] == 0:
                return
            n = torch.full_like(self.count, x.shape[1])
            batch_mean, batch_var = x.mean(1), x.var(1, unbiased=False)
        else:
            n = mask.sum(1).double()
            weight = mask.double().view(*mask.shape, *trailing)
            rows = n.clamp(min=1.0).view(-1, *trailing)
            batch_mean = (x * weight).sum(1) / rows
            batch_var = ((x - batch_mean.unsqueeze(1)).square() * weight).sum(1) / rows
        n_, count = n.view(-1, *trailing), self.count.view(-1, *trailing)
        delta = batch_mean - self.mean
        total = count + n_
        mean = self.mean + delta * n_ / total
        var = (self.var * count + batch_var * n_ + delta.square() * count * n_ / total) / total
        if mask is None:
            self.mean, self.var, self.count = mean, var, self.count + n
        else:
            seen = (n > 0).view(-1, *trailing)
            self.mean, self.var = torch.where(seen, mean, self.mean), torch.where(seen, var, self.var)
            self.count = torch.where(n > 0, self.count + n, self.count)

    def member(self, m: int) -> dict:
        """Member ``m``'s statistics in a single run's checkpoint format: ``{"mean", "var", "count"}`` (copies)."""
        return {"mean": self.mean[m].clone(), "var": self.var[m].clone(), "count": self.count[m].clone()}

    def load_member(self, m: int, state: dict) -> None:
        self.mean[m], self.var[m], self.count[m] = state["mean"], state["var"], state["count"]
