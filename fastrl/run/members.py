"""The per-member state every trainer of the run loop keeps in the same form (``fastrl.run.trainer.Trainer`` for K
members, ``fastrl.run.actor_learner.ActorLearnerTrainer`` for one): flat weights ``params [K, P]``, optimizer state
``opt_state`` (``[K, ...]``), ``hparams [K]``, an LR scale per member (``lr_scales``), each member's generators and
episode statistics. From them ``MemberState`` gives the loop's member interface (see ``fastrl.run.loop``): the
checkpoint (one format for PPO, A2C, IMPALA and APPO; a population's holds every member in it), rollbacks and the
per-member figures.
"""
from __future__ import annotations

import copy

import torch

from fastrl.config import UserError
from fastrl.learn.optim import load_optimizer_state_dict, optimizer_state_dict
from fastrl.learn.update import copy_weights
from fastrl.run.checkpoint import env_spaces, load_rng_state, rng_state


class MemberState:
    """The member interface over a trainer's ``cfg``, ``members``, ``n_members``, ``varied_keys``, ``agent`` (member
    0's module, bound to ``params[0]``), ``layout``, ``params``, ``opt_state``, ``hparams``, ``spec``, ``device``,
    ``lr_scales``, ``minibatch_generators``, ``action_generators`` (empty where the actions are drawn elsewhere),
    ``global_step``, ``iteration``, and its ``member_stats(m)`` (an ``EpisodeStats``), ``normalizer_state(m)`` and
    ``load_normalizer(state, m)``."""

    @property
    def lr_scale(self) -> float:
        """The first member's LR scale (lowered by its rollbacks): the run's, at K = 1."""
        return self.lr_scales[0]

    def member_agent(self, m: int = 0) -> torch.nn.Module:
        """An ``nn.Module`` with member m's current weights (at K > 1 one shared scratch module: use it before the
        next call)."""
        if m == 0:
            return self.agent
        if not hasattr(self, "_scratch_agent"):
            self._scratch_agent = copy.deepcopy(self.agent)
        return self.layout.load_into(self._scratch_agent, self.params[m])

    def weights_finite(self) -> bool:
        """Whether every member's weights are finite (no checkpoint is written from NaN/Inf weights)."""
        return bool(torch.isfinite(self.params).all())

    def member_episode_summary(self, m: int = 0) -> dict:
        """Member m's last-100-episode figures."""
        return self.member_stats(m).summary()

    def member_info(self, m: int = 0) -> dict:
        """Member m's index, seed and ``hyperparameters``: what ``--vary`` set for it (empty for plain seeds)."""
        member = self.members[m]
        return {"member": m, "seed": member.seed,
                "hyperparameters": {key: getattr(member, key) for key in self.varied_keys}}

    def member_rows(self) -> list[dict]:
        """One metrics row per member (``member``, ``seed``, ``variant``, ``member_step``, what ``--vary`` set, its
        episode figures and the update's figures, ``_member_metrics``); empty for a single run, whose run row is its
        member's."""
        if self.n_members == 1:
            return []
        from fastrl.run.loop import episode_metrics, member_labels  # the loop's names
        return [{**member_labels(self, m), **self.member_info(m)["hyperparameters"],
                 **episode_metrics(self.member_episode_summary(m)),
                 **{key: value[m].item() for key, value in self._member_metrics.items()}}
                for m in range(self.n_members)]

    def member_state(self, m: int) -> dict:
        """Member m's checkpoint: weights, optimizer (torch.optim's format), counters, config, normalizer, episode
        statistics, RNG states and the env's spaces. A single run's checkpoint is its one member's."""
        member = self.members[m]
        state = {key: value[m] for key, value in self.opt_state.items()}
        optimizer = optimizer_state_dict(self.spec.optimizer, dict(self.spec.constants), state, self.layout.numels,
                                         self.layout.shapes, float(self.hparams["lr"][m]))
        rng = rng_state(self.minibatch_generators[m])
        if self.action_generators:
            rng["action"] = self.action_generators[m].get_state()
        out = {"model": copy.deepcopy(self.member_agent(m).state_dict()), "optimizer": optimizer,
               "global_step": self.global_step // self.n_members, "iteration": self.iteration,
               "lr_scale": self.lr_scales[m], "config": member.to_dict(), "normalizer": self.normalizer_state(m),
               "episode_stats": self.member_stats(m).state_dict(), "rng": rng, "spaces": env_spaces(member)}
        if "loss_scale" in self.opt_state:
            out["loss_scale"] = {"loss_scale": self.opt_state["loss_scale"][m].clone(),
                                 "good_steps": self.opt_state["good_steps"][m].clone()}
        return out

    def state_dict(self) -> dict:
        if self.n_members == 1:
            return self.member_state(0)
        return {"config": self.cfg.to_dict(), "global_step": self.global_step, "iteration": self.iteration,
                "members": [self.member_state(m) for m in range(self.n_members)]}

    def load_state_dict(self, state: dict) -> None:
        saved_members = state.get("members", [state])
        if len(saved_members) != self.n_members:
            raise UserError(f"the checkpoint holds {len(saved_members)} member(s), this run {self.n_members}: resume "
                            "with the checkpoint's own --n-seeds/--vary")
        for m, saved in enumerate(saved_members):
            self._load_member(m, saved)
        self.global_step = int(state["global_step"]) * (1 if "members" in state else self.n_members)
        self.iteration = int(state["iteration"])

    def _load_member(self, m: int, saved: dict) -> None:
        agent = self.member_agent(m)
        agent.load_state_dict(saved["model"])
        self.params[m].copy_(self.layout.flatten(agent).to(self.device))
        state = {key: value[m] for key, value in self.opt_state.items()}
        load_optimizer_state_dict(self.spec.optimizer, saved["optimizer"], state, self.layout.numels)
        if "loss_scale" in saved and "loss_scale" in self.opt_state:
            for key, value in saved["loss_scale"].items():
                self.opt_state[key][m].copy_(value)
        self.lr_scales[m] = float(saved.get("lr_scale", 1.0))
        self.load_normalizer(saved["normalizer"], m)
        self.member_stats(m).load_state_dict(saved["episode_stats"])
        rng = saved["rng"]
        if m == 0:
            load_rng_state(rng, self.minibatch_generators[0])
        else:
            self.minibatch_generators[m].set_state(rng["sample"])
        if "action" in rng and self.action_generators:
            self.action_generators[m].set_state(rng["action"])

    def weights_state(self, m: int = 0) -> dict:
        """What member m's rollback restores: its parameters, optimizer state and normalizer statistics."""
        return {"params": self.params[m].clone(), "opt_state": {k: v[m].clone() for k, v in self.opt_state.items()},
                "normalizer": self.normalizer_state(m)}

    def roll_back(self, state: dict, lr_factor: float, m: int = 0) -> None:
        """Return member m to ``state`` (see weights_state), scale its LR and restart its episode-return window."""
        copy_weights(self.params, self.opt_state, state["params"], state["opt_state"], m)
        self.load_normalizer(state["normalizer"], m)
        self.lr_scales[m] *= lr_factor
        self.member_stats(m).restart_window()
