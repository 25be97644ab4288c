"""The Python API: ``fastrl.train(...) -> Run`` and ``fastrl.load(path) -> Agent``.

::

    import fastrl
    run = fastrl.train(env="CartPole-v1", total_steps=50_000)   # any config key is a keyword
    agent = fastrl.load(run.run_dir)                             # or run.agent
    action = agent.act(obs)                                      # one observation or a batch, numpy or torch
    action, _ = agent.predict(obs)                               # the same, as Stable-Baselines3 returns it
    agent.save("agent.pt"); agent = fastrl.load("agent.pt")      # one self-contained file
    run = agent.learn(50_000)                                    # 50k more steps, in a new run directory
    returns = agent.evaluate(episodes=10)                        # numpy [seeds * episodes]

``train`` runs what ``python -m fastrl.train`` runs (preflight checks, the run directory, the algorithm's trainer,
the one run loop), so both write the same run directory. ``env`` is an EnvPool or Gymnasium id, ``module:Id`` (the
module is imported first, so its registration runs), a ``gymnasium.Env`` subclass or a zero-argument factory
returning a ``gymnasium.Env`` (see ``fastrl.envs.env_name``). A mistake in what was asked raises
``fastrl.config.UserError`` with a one-line message.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import torch

from fastrl.config import Config, UserError
from fastrl.envs import RunningMeanStd, env_name, normalize_observation
from fastrl.spaces import action_spec_of, observation_format, pack_observation, spaces_to_data


def train(env=None, algo: str | None = None, config=None, callbacks=(), **overrides) -> Run:
    """Train an agent and return the finished ``Run``.

    ``env``: an env id, ``module:Id``, a gymnasium.Env subclass or a zero-argument factory (None: the config's,
    else CartPole-v1). ``algo``: ppo (default), a2c, impala or appo. ``config``: a YAML path, a dict of config keys
    or a ``Config``. ``callbacks``: callables ``(metrics, run) -> bool`` called after every iteration (False stops
    the run; see ``fastrl.callbacks``). ``overrides``: config keys (``total_steps=50_000, n_envs=16``), which win
    over ``config``; ``resume=run_dir`` continues a run as ``--resume`` does.
    """
    refuse_in_spawned_child()
    from fastrl.callbacks import check_callbacks
    from fastrl.train import resolve_config, run

    given, yaml_path = {}, None
    if isinstance(config, Config):
        given.update(config.to_dict())
    elif isinstance(config, dict):
        given.update(config)
    elif isinstance(config, (str, os.PathLike)):
        yaml_path = str(config)
    elif config is not None:
        raise UserError(f"config must be a YAML path, a dict or a fastrl Config, got {type(config).__name__}")
    if algo is not None:
        given["algo"] = algo
    made_vector_env = None
    if env is not None:
        env, made_vector_env = _vector_env_of(env)
        given["env"] = env_name(env)
    given.update(overrides)
    if _is_vector_env(env):
        _fit_to_vector_env(given, env, overrides)
    if isinstance(given.get("policy"), type):
        given["policy"] = policy_name(given["policy"])
    callbacks = check_callbacks(callbacks)
    cfg, resume_state = resolve_config(given, yaml_path, where="the fastrl.train() arguments")
    threads = torch.get_num_threads()
    try:
        summary = run(cfg, resume_state, callbacks)
    finally:
        torch.set_num_threads(threads)  # the trainer picks its own thread count; the caller's process keeps its own
        if made_vector_env is not None:
            made_vector_env.close()  # fastrl called the factory, so fastrl closes what it made
    return Run(Path(summary["run_dir"]) if summary.get("run_dir") else None, summary)


def _is_vector_env(env) -> bool:
    import gymnasium
    return isinstance(env, gymnasium.vector.VectorEnv)


def _vector_env_of(env):
    """``(env, made)``: a function, or a ``VectorEnv`` subclass, that makes a ``gymnasium.vector.VectorEnv`` is called
    once, and ``made`` is that vector env (which ``train`` closes at the end); anything else is returned as it is
    (``made`` None). A function that makes a single env is called once more than it would be otherwise: the env it
    made here is closed at once."""
    import gymnasium
    is_class = isinstance(env, type)
    if isinstance(env, str) or not callable(env) or (is_class and not issubclass(env, gymnasium.vector.VectorEnv)):
        return env, None
    made = env()
    if isinstance(made, gymnasium.vector.VectorEnv):
        return made, made
    if isinstance(made, gymnasium.Env):
        made.close()
    return env, None


def _fit_to_vector_env(given: dict, vector_env, overrides: dict) -> None:
    """A user's vector env sets ``n_envs`` (its ``num_envs``) and has no separate envs to evaluate on
    (``eval_episodes`` 0): asking otherwise is a one-line UserError."""
    n_envs = vector_env.num_envs
    if "n_envs" in overrides and overrides["n_envs"] != n_envs:
        raise UserError(f"n_envs={overrides['n_envs']} but the vector env holds {n_envs} envs: drop n_envs (it comes "
                        "from the vector env)")
    if overrides.get("eval_episodes"):
        raise UserError("a vector env object gives fastrl no separate envs to evaluate on: drop eval_episodes, or "
                        "pass the id, class or factory of one env (fastrl then builds the vector env itself)")
    given["n_envs"], given["eval_episodes"] = n_envs, 0


def policy_name(cls: type) -> str:
    """``module:QualName`` of a policy class, which every process (actors, ``fastrl.load``) imports back."""
    name = f"{cls.__module__}:{cls.__qualname__}"
    if "<locals>" in cls.__qualname__ or cls.__module__ == "__main__":
        raise UserError(f"policy {cls.__qualname__} must be a module-level class in an importable module (not "
                        "__main__ or a function), so checkpoints and other processes can rebuild it")
    return name


def refuse_in_spawned_child() -> None:
    """A spawned child (an IMPALA/APPO actor) imports the parent's script as ``__mp_main__`` before it runs; a script
    without ``if __name__ == "__main__":`` then calls ``fastrl.train()`` again, which would start a run in every
    actor. The child exits at once with ``NO_MAIN_GUARD_EXIT`` instead, and the learner turns that into one line."""
    import multiprocessing.process
    if getattr(multiprocessing.process.current_process(), "_inheriting", False):  # still bootstrapping
        from fastrl.actor_learner import NO_MAIN_GUARD_EXIT
        os._exit(NO_MAIN_GUARD_EXIT)


@dataclasses.dataclass
class Run:
    """A finished run: ``run_dir`` (None on torchrun ranks other than 0), ``summary`` (summary.json's contents) and
    ``agent`` (its newest checkpoint, loaded on first access)."""
    run_dir: Path | None
    summary: dict
    _agent: Agent | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def agent(self) -> Agent:
        if self._agent is None:
            if self.run_dir is None:
                raise UserError("this process wrote no run directory (a torchrun rank other than 0); load the agent "
                                "on rank 0")
            self._agent = load(self.run_dir, env=self.summary.get("env"))  # the env this process was given
        return self._agent


def load(path: str | os.PathLike, best: bool = False, env=None, device: str = "cpu", member: int | None = None) -> Agent:
    """The agent of a checkpoint file, or of a run directory's newest checkpoint (``best=True``: the
    ``EvalCallback``'s ``checkpoints/best.pt``). The checkpoint carries the env's observation and action spaces, so
    the agent acts (``act``, ``predict``) without building its env or importing its code; ``env`` overrides the env
    the checkpoint names, for what steps an env (``evaluate``), and must be given there for a saved ``module:Name``
    env, which a checkpoint alone never makes fastrl import (and for loading an older checkpoint, without spaces, of
    such an env); ``device`` is where the policy runs. ``member``: which agent of a population run
    (``--n-seeds``/``--vary``)."""
    from fastrl.callbacks import best_checkpoint_path
    from fastrl.checkpoint import (checkpoint_config, checkpoint_spaces, load_checkpoint, resolve_checkpoint,
                                   select_member)
    from fastrl.config import make_config
    from fastrl.distributed import resolve_device

    target = Path(path)
    if best:
        if target.is_dir():
            target = best_checkpoint_path(target) if (target / "checkpoints").is_dir() else target / "best.pt"
        if not target.is_file():
            raise UserError(f"no best checkpoint at {str(target)!r}; it is written by fastrl.callbacks.EvalCallback "
                            "(drop best=True to load the newest checkpoint)")
    state = load_checkpoint(target)  # one-line UserError for a missing, corrupted or foreign file
    state = select_member(state, member, f"checkpoint {target}")
    if env is None and checkpoint_spaces(state, f"checkpoint {target}") is not None:
        cfg = make_config(state["config"], where=f"checkpoint {target}")  # its env is judged only when one is stepped
    else:
        cfg = checkpoint_config(state, f"checkpoint {target}", env)  # a saved module:Name env is used only if passed
    return Agent(state, cfg, resolve_device(device), resolve_checkpoint(target), env_named=env is not None)


def _probe(probe, cfg: Config, hint: str):
    """``probe(cfg)`` (``fastrl.envs.probe_env`` or ``probe_spaces``), ``hint`` added to its one-line errors."""
    try:
        return probe(cfg)
    except UserError as e:
        raise UserError(f"{e}; {hint}") from None


class Agent:
    """A trained policy. ``act(obs)`` / ``predict(obs)`` act; ``evaluate()`` plays whole episodes on fresh envs;
    ``save(path)`` writes it to one file; ``learn(steps)`` trains it further.

    ``config`` is the run's ``Config``, ``policy`` the ``nn.Module`` (``act_deterministic``,
    ``get_action_and_value``), ``observation_space`` / ``action_space`` one env's Gymnasium spaces (read from the
    checkpoint, or from one env built for an older checkpoint), ``observation_shape`` / ``observation_dtype`` /
    ``action_spec`` what the policy takes and gives, ``path`` the checkpoint it came from. ``env_named``: whether the
    user named the env (else a saved ``module:Name`` env is refused where an env must be stepped).
    """

    def __init__(self, state: dict, cfg: Config, device: torch.device, path: Path | None = None,
                 env_named: bool = True):
        from fastrl.checkpoint import checkpoint_spaces
        from fastrl.envs import probe_spaces
        from fastrl.models import make_agent
        self.config, self.device, self.path, self._state, self._env_named = cfg, device, path, state, env_named
        spaces = checkpoint_spaces(state, f"checkpoint {path}") or _probe(
            probe_spaces, cfg, "pass env= to fastrl.load to name the env this agent acts in")
        self.observation_space, self.action_space = spaces
        form = observation_format(self.observation_space, cfg.env)
        shape = (form.shape[0] + 1,) if cfg.time_feature else form.shape  # the time feature: one more entry
        spec = action_spec_of(self.action_space)
        self.observation_shape, self.observation_dtype, self.action_spec = shape, form.dtype, spec
        # A pixel model's obs_scale is a buffer: the state restores it.
        self.policy = make_agent(cfg, shape, spec, observation_space=self.observation_space)
        self.policy.load_state_dict(state["model"])
        self.policy.to(device).eval()
        self.normalizer = state.get("normalizer")
        self._obs_rms = None
        if cfg.normalize_obs and self.normalizer is not None:
            self._obs_rms = RunningMeanStd(self.observation_shape)
            self._obs_rms.load_state_dict(self.normalizer["obs_rms"])
            self._obs_rms.mean, self._obs_rms.var = self._obs_rms.mean.to(device), self._obs_rms.var.to(device)
        if spec.kind == "continuous":
            self._low = torch.tensor(spec.low, dtype=torch.float32, device=device).view(spec.shape)
            self._high = torch.tensor(spec.high, dtype=torch.float32, device=device).view(spec.shape)

    def __repr__(self) -> str:
        return (f"Agent(env={self.config.env!r}, algo={self.config.algo!r}, observation_shape={self.observation_shape}, "
                f"action={self.action_spec.kind}, path={str(self.path)!r})")

    def _as_tensor(self, obs) -> torch.Tensor:
        layout = getattr(self.policy, "layout", None)
        if isinstance(obs, dict) and layout is not None:  # a Dict observation: packed as the env packs it
            if any(part.key not in obs for part in layout):
                raise UserError(f"the observation lacks {', '.join(p.key for p in layout if p.key not in obs)}; "
                                f"pass a dict with the keys {', '.join(p.key for p in layout)}")
            size = sum(int(np.prod(np.shape(obs[part.key]))) for part in layout)
            return pack_observation(obs, layout, batched=size != self.observation_shape[0])  # one, or a batch
        if isinstance(obs, dict) and "image" in obs:  # a raw MiniGrid observation: its HWC image, channels first
            image = obs["image"]
            obs = image.movedim(-1, -3) if torch.is_tensor(image) else np.moveaxis(np.asarray(image), -1, -3)
        if torch.is_tensor(obs):
            return obs
        array = np.asarray(obs)
        if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_) or np.iscomplexobj(array):
            raise UserError(f"observations must be real numbers (a numpy array or torch tensor), got dtype {array.dtype}")
        return torch.from_numpy(array.copy() if any(stride < 0 for stride in array.strides) else array)

    @torch.no_grad()
    def act(self, obs, deterministic: bool = True, check_finite: bool = True):
        """Actions for one observation ``[*observation_shape]`` or a batch ``[B, *observation_shape]``, of any real
        dtype. numpy (or a list) in, numpy out; a torch tensor in, a tensor out on its device. Discrete actions are
        int64 ``[]`` / ``[B]``; continuous ones float32 ``[*action_shape]`` / ``[B, *action_shape]``, within the
        action bounds. ``deterministic``: the policy's mode (else a sample). The saved observation normalizer is
        applied as in training. A NaN/Inf observation is refused with one line (``check_finite=False`` passes it
        to the policy as it is)."""
        returns_tensor = torch.is_tensor(obs) or isinstance(obs, dict) and torch.is_tensor(obs.get("image"))
        x = self._as_tensor(obs)
        if getattr(self.observation_space, "shape", None) == () and x.dim() <= 1:  # Discrete: one integer, or [B]
            x = x.unsqueeze(-1)
        if x.is_complex():
            raise UserError(f"observations must be real numbers, got dtype {x.dtype}")
        expected, got = self.observation_shape, tuple(x.shape)
        if len(expected) == 3 and expected[0] < expected[1] and got[-3:] == (*expected[1:], expected[0]):
            x = x.movedim(-1, -3)  # a channels-last image, as the env gives it: channels first, as the model takes it
            got = tuple(x.shape)
        if got == expected:
            single = True
        elif got[1:] == expected:
            single = False
        elif self.config.time_feature and len(expected) == 1 and got[-1:] == (expected[0] - 1,):
            raise UserError(f"observation shape {got} lacks the time feature this agent was trained with "
                            f"(time_feature): append 1 - t / max_episode_steps to each observation, t the steps "
                            f"taken in its episode, for shape {expected}")
        else:
            raise UserError(f"observation shape {got} does not fit {self.config.env}'s observations: expected "
                            f"{expected} for one or (batch, {', '.join(map(str, expected))}) for a batch")
        if check_finite and x.is_floating_point() and not bool(torch.isfinite(x).all()):
            raise UserError("the observation holds NaN or Inf values; fix the env (or pass check_finite=False to act "
                            "on them anyway)")
        out_device = x.device
        x = x.to(self.device).to(self.observation_dtype)
        if single:
            x = x.unsqueeze(0)
        if self._obs_rms is not None:
            x = normalize_observation(x, self._obs_rms, self.config.obs_clip)
        if deterministic:
            action = self.policy.act_deterministic(x)
        else:
            action = self.policy.get_action_and_value(x)[0]
        if self.action_spec.kind == "continuous":
            action = torch.maximum(torch.minimum(action.float(), self._high), self._low)
        if single:
            action = action[0]
        return action.to(out_device) if returns_tensor else action.cpu().numpy()

    def predict(self, obs, state=None, episode_start=None, deterministic: bool = True, check_finite: bool = True):
        """Stable-Baselines3's ``predict``: ``(action, None)``, the action as ``act`` gives it, and no recurrent state
        (fastrl policies keep none; ``state`` and ``episode_start`` are accepted and ignored). So
        ``action, _ = agent.predict(obs)`` reads the same for one observation and for a batch."""
        return self.act(obs, deterministic, check_finite), None

    def _checkpoint_state(self) -> dict:
        """The checkpoint this agent came from, with the policy's current weights."""
        return {**self._state, "spaces": spaces_to_data(self.observation_space, self.action_space),
                "model": {k: v.detach().cpu() for k, v in self.policy.state_dict().items()}}

    def save(self, path: str | os.PathLike) -> Path:
        """Write this agent to one self-contained file (weights, config, observation normalizer, optimizer state and
        counters: a fastrl checkpoint), atomically; ``fastrl.load(path)`` reads it, ``fastrl.train(resume=path)``
        continues its training. Returns the path."""
        from fastrl.checkpoint import save_checkpoint
        return save_checkpoint(self._checkpoint_state(), Path(path))

    @property
    def global_step(self) -> int:
        """Env steps this agent has trained for."""
        return int(self._state.get("global_step", 0))

    def learn(self, steps: int, run_dir: str | os.PathLike | None = None, callbacks=(), **overrides) -> Run:
        """Train this agent ``steps`` more env steps, as SB3's ``learn(steps, reset_num_timesteps=False)``: a new run
        directory (``run_dir``, default ``runs/<env>__<algo>__<seed>__<time>``) continues the checkpoint, optimizer
        state and step count included, to the budget ``global_step + steps`` (the learning-rate schedule is
        stretched over that new total; ``overrides``: config keys, e.g. ``lr``). The agent then holds the new
        weights; returns the ``Run``."""
        from fastrl.checkpoint import checkpoint_path, save_checkpoint
        from fastrl.rundir import default_run_dir, holds_run
        if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
            raise UserError(f"learn: steps must be a positive int, got {steps!r}")
        if "total_steps" in overrides or "resume" in overrides:
            raise UserError("learn: pass the steps to add as learn(steps); total_steps and resume are set from them")
        target = Path(run_dir) if run_dir is not None else default_run_dir(self.config)
        if holds_run(target):
            raise UserError(f"learn: run_dir {str(target)!r} already holds a run; pick another")
        start = save_checkpoint(self._checkpoint_state(), checkpoint_path(target, self.global_step))
        run = train(resume=start, total_steps=self.global_step + steps, callbacks=callbacks, **overrides)
        trained = load(run.run_dir, device=str(self.device)) if run.run_dir is not None else self
        self._state, self.path, self.config = trained._state, trained.path, trained.config
        self.policy.load_state_dict(trained.policy.state_dict())
        return run

    def evaluate(self, env=None, episodes: int = 10, seeds: int = 1, deterministic: bool | None = None,
                 max_episode_steps: int | None = None, max_steps: int | None = None) -> np.ndarray:
        """Play ``episodes`` whole episodes on each of ``seeds`` fresh evaluation envs (the saved normalizer frozen,
        rewards unscaled). ``deterministic``: the policy's mode, False samples (None: the run's
        ``eval_deterministic``). An episode is cut after ``max_episode_steps`` steps and the evaluation after
        ``max_steps`` env steps in all (None: the run's ``eval_max_episode_steps`` / ``eval_max_steps``); a cut
        episode counts its return so far. ``env``: another env than the run's (an id, ``module:Id``, class or
        factory) with the same observation and action spaces. Returns the returns, float64 ``[seeds * episodes]``."""
        from fastrl.evaluate import evaluate
        if not (isinstance(episodes, int) and isinstance(seeds, int) and episodes > 0 and seeds > 0):
            raise UserError(f"episodes and seeds must be positive ints, got {episodes!r} and {seeds!r}")
        from fastrl.checkpoint import checkpoint_config
        from fastrl.envs import probe_env
        cfg = self.config
        if env is None and not self._env_named:
            checkpoint_config(self._state, f"checkpoint {self.path}")  # refuses a saved module:Name env
        if env is not None:
            cfg = dataclasses.replace(cfg, env=env_name(env))
            shape, _, spec = _probe(probe_env, cfg, "pass an env this agent can act in")
            if tuple(shape) != self.observation_shape or spec != self.action_spec:
                raise UserError(f"env {cfg.env!r} has observations {tuple(shape)} and {spec.kind} actions, but this agent "
                                f"was trained on {self.observation_shape} and {self.action_spec.kind} actions "
                                f"({self.config.env}); pass an env with the same spaces")
        returns = evaluate(self.policy, cfg, self.normalizer, episodes, seeds, self.device, max_episode_steps,
                           deterministic, max_steps)
        return returns.numpy()
