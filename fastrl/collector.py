"""``fastrl.Collector``: fastrl's rollouts (its envs, auto-reset and acting policy) without its training, for a loss
of your own, TorchRL's for instance::

    collector = fastrl.Collector("CartPole-v1", n_envs=8, n_steps=128)  # or a TorchRL env, a Config, agent=...
    buffer = collector.collect()      # fastrl's time-major [T, N] rollout TensorDict (see fastrl.envs.buffers)
    td = collector.to_torchrl()       # the same rollout in TorchRL's batch-first [N, T] layout (fastrl.to_torchrl)
    collector.close()

It is the trainer of ``fastrl.train`` (``collector.trainer``, a ``fastrl.run.trainer.Trainer``) asked only to ``collect``:
``policy`` is the ``nn.Module`` that acts (sampling its actions), ``buffer`` the rollout ``collect`` refills each call
(clone what you keep), ``next_obs`` the observations after its last step.
"""
from __future__ import annotations

import os

import torch


class Collector:
    """Rollouts of ``n_steps`` steps in ``n_envs`` envs.

    ``env_or_config``: what ``fastrl.train`` takes as ``env`` (an id, ``module:Id``, a gymnasium.Env class or factory,
    a Gymnasium vector env or a TorchRL env), or as ``config`` (a ``Config``, a dict of config keys or a YAML path).
    ``agent``: a ``fastrl.Agent`` (``fastrl.load(run_dir)``) whose weights, observation normalizer and config act;
    None: a freshly initialized policy. ``overrides``: config keys (``n_envs=8, n_steps=128, seed=1``).
    """

    def __init__(self, env_or_config=None, agent=None, **overrides):
        from fastrl.api import _env_keys
        from fastrl.config import Config, UserError
        from fastrl.defaults import YAML_IGNORED
        from fastrl.run.run_config import build_config, config_layer
        from fastrl.run.trainer import Trainer
        given, config, self._made = overrides, None, None
        if isinstance(env_or_config, (Config, dict)) or (isinstance(env_or_config, (str, os.PathLike))
                                                        and str(env_or_config).endswith((".yaml", ".yml"))):
            config = env_or_config
        elif env_or_config is not None:
            env_keys, self._made = _env_keys(env_or_config, overrides)
            given = {**env_keys, **overrides}
        if agent is not None:  # the agent's config (every key) lies under what is given here
            saved = {key: value for key, value in agent.config.to_dict().items() if key not in YAML_IGNORED}
            config = {**saved, **config_layer(config, "the Collector arguments")[1]}
        threads = torch.get_num_threads()
        try:
            self.trainer = Trainer(build_config(given, config, where="the Collector arguments")[0])
        except BaseException:
            if self._made is not None:
                self._made.close()
            raise
        finally:
            torch.set_num_threads(threads)  # the trainer picks its own; the caller's process keeps its own
        if agent is not None:
            env = self.trainer.env
            if (tuple(env.observation_shape), env.action_spec) != (agent.observation_shape, agent.action_spec):
                self.close()
                raise UserError(f"the agent acts on observations {agent.observation_shape} with {agent.action_spec}, "
                                f"but this env has {tuple(env.observation_shape)} and {env.action_spec}: pass the "
                                "agent's own env")
            self.trainer.agent.load_state_dict(agent.policy.state_dict())
            if agent.normalizer is not None:
                env.load_state_dict(agent.normalizer)

    @property
    def policy(self) -> torch.nn.Module:
        return self.trainer.agent

    @property
    def buffer(self):
        return self.trainer.buffer

    @property
    def next_obs(self) -> torch.Tensor:
        return self.trainer.next_obs

    def collect(self):
        """One rollout: ``buffer``, refilled (``[T, N]``; ``valid`` False on auto-reset steps, see ``fastrl.envs``)."""
        self.trainer.collect()
        return self.trainer.buffer

    def to_torchrl(self, **kwargs):
        """The last rollout as TorchRL's ``[N, T]`` TensorDict, with ``("next", "observation")``: ``fastrl.to_torchrl
        (buffer, next_obs, **kwargs)`` (a copy; see ``fastrl.envs.torchrl_adapter`` for the layout)."""
        from fastrl.envs.torchrl_adapter import to_torchrl
        return to_torchrl(self.trainer.buffer, self.trainer.next_obs, **kwargs)

    def close(self) -> None:
        """Close the envs fastrl made (a TorchRL or vector env object you passed stays open: it is yours)."""
        self.trainer.close()
        if self._made is not None:
            self._made.close()

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
