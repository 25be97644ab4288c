"""The Python API: ``fastrl.train(...) -> Run``, ``fastrl.load(path) -> Agent`` and ``fastrl.evaluate(path)``.

::

    import fastrl
    run = fastrl.train(env="CartPole-v1", total_steps=50_000)   # any config key is a keyword
    agent = fastrl.load(run.run_dir)                             # or run.agent
    action = agent.act(obs)                                      # one observation or a batch, numpy or torch
    action, _ = agent.predict(obs)                               # the same, as Stable-Baselines3 returns it
    agent.save("agent.pt"); agent = fastrl.load("agent.pt")      # one self-contained file
    agent.export("policy.onnx")                                  # for onnxruntime (or format="torchscript")
    run = agent.learn(50_000)                                    # 50k more steps, in a new run directory
    returns = agent.evaluate(episodes=10)                        # numpy [seeds * episodes]

``train`` runs what ``python -m fastrl.train`` runs (preflight checks, the run directory, the algorithm's trainer,
the one run loop), so both write the same run directory. ``env`` is an EnvPool or Gymnasium id, ``module:Id`` (the
module is imported first, so its registration runs), a ``gymnasium.Env`` subclass or a zero-argument factory
returning a ``gymnasium.Env`` (see ``fastrl.envs.registry.env_name``). A mistake in what was asked raises
``fastrl.config.UserError`` with a one-line message.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch

from fastrl.config import CODE_KEYS, FIELDS, Config, UserError, _unknown_key
from fastrl.envs.masks import observation_with_masks
from fastrl.envs.registry import env_name
from fastrl.envs.spaces import action_spec_of, observation_format, pack_observation, spaces_to_data
from fastrl.export import RawPolicy


def train(
        env: str | type | Callable | None = None, algo: str | None = None,
        config: str | os.PathLike | dict | Config | None = None, callbacks: Callable | Iterable[Callable] | None = (),
        *,
        # run
        total_steps: int | None = None, seed: int | None = None, n_seeds: int | None = None, vary: dict | None = None,
        device: str | None = None, run_dir: str | os.PathLike | None = None, overwrite: bool | None = None,
        per_rank: bool | None = None, torch_threads: int | None = None, deterministic: bool | None = None,
        resume: str | os.PathLike | None = None,
        # environment
        n_envs: int | None = None, env_backend: str | None = None, env_threads: int | None = None,
        env_mode: str | None = None, normalize_obs: bool | None = None, normalize_reward: bool | None = None,
        obs_clip: float | None = None, reward_clip: float | None = None, time_feature: bool | None = None,
        frame_skip: int | None = None, frame_stack: int | None = None, noop_max: int | None = None,
        episodic_life: bool | None = None, clip_atari_reward: bool | None = None, env_timeout_s: float | None = None,
        # model
        hidden_sizes: list[int] | None = None, pi_sizes: list[int] | None = None, vf_sizes: list[int] | None = None,
        policy: str | type | None = None, activation: str | None = None, shared_trunk: bool | None = None,
        init_log_std: float | None = None, use_sde: bool | None = None, sde_sample_freq: int | None = None,
        ortho_init: bool | None = None, recurrent: str | None = None, recurrent_size: int | None = None,
        encoder: str | None = None, amp: str | None = None, compile: str | None = None,
        # algorithm (every algorithm)
        n_steps: int | None = None, lr: float | None = None, anneal_lr: bool | None = None,
        lr_floor: float | None = None, adam_eps: float | None = None, optimizer: str | None = None,
        rmsprop_alpha: float | None = None, rmsprop_eps: float | None = None, gamma: float | None = None,
        gae_lambda: float | None = None, ent_coef: float | None = None, vf_coef: float | None = None,
        max_grad_norm: float | None = None,
        # PPO
        n_epochs: int | None = None, n_minibatches: int | None = None, clip_coef: float | None = None,
        anneal_clip: bool | None = None, clip_vloss: bool | None = None, norm_adv: bool | None = None,
        target_kl: float | None = None,
        # IMPALA / APPO
        n_actors: int | None = None, n_slots: int | None = None, learner_batch: int | None = None,
        sync_interval: int | None = None, max_policy_lag: int | None = None, rho_bar: float | None = None,
        c_bar: float | None = None, vtrace_lambda: float | None = None, actor_timeout_s: float | None = None,
        actors: str | None = None, ray_address: str | None = None, actor_resources: str | None = None,
        # logging, checkpoints, evaluation
        log_interval: int | None = None, progress: bool | None = None, quiet: bool | None = None,
        tensorboard: bool | None = None, wandb: str | None = None, wandb_project: str | None = None,
        checkpoint_interval: int | None = None, keep_checkpoints: int | None = None, eval_episodes: int | None = None,
        eval_seeds: int | None = None, eval_interval: int | None = None, eval_deterministic: bool | None = None,
        eval_max_episode_steps: int | None = None, eval_max_steps: int | None = None,
        stop_at_return: float | None = None, capture_video: bool | None = None, video_member: int | None = None,
        plot: bool | None = None,
        # guards
        rollback: bool | None = None, rollback_drop: float | None = None, rollback_lr_factor: float | None = None,
        max_rollbacks: int | None = None, rollback_patience: int | None = None,
        max_nonfinite_iterations: int | None = None,
        **unknown) -> Run:
    """Train an agent and return the finished ``Run``.

    ``env``: an env id, ``module:Id``, a gymnasium.Env subclass or a zero-argument factory, a Gymnasium vector env or
    a TorchRL env (``EnvBase``: unbatched, ``SerialEnv``/``ParallelEnv``; see ``TorchRLVectorEnv``) (None: the
    config's, else CartPole-v1). ``algo``: ppo (default), a2c, impala or appo. ``config``: a YAML path, a tuned config's
    name, a dict of config keys or a ``fastrl.Config``, whose fields that differ from ``Config()`` count as set. Like
    flags, what it sets lies over the env's tuned config (``Config(env="HalfCheetah-v4")`` trains with
    ``configs/ppo/halfcheetah.yaml`` under its values, as ``--env HalfCheetah-v4`` does); a field left at its default
    takes the tuned value, so pass a value equal to the default as a keyword. ``fastrl.run.run_config`` builds every
    door's config the same way. ``callbacks``: callables ``(metrics, run) -> bool`` called
    after every iteration (False stops the run; see ``fastrl.run.callbacks``).

    Every keyword after them is a field of ``fastrl.Config`` of the same name and type (its meaning and default:
    ``fastrl train --help``, where ``n_envs`` is ``--n-envs``); None, the default, leaves it to ``config``, else to
    the env's tuned config or the defaults. Given, it wins over ``config``. ``resume=run_dir`` continues a run as
    ``--resume`` does; ``policy`` also takes the class itself. By group:

    - run: ``total_steps``, ``seed``, ``n_seeds``, ``vary``, ``device``, ``run_dir``, ``overwrite``, ``per_rank``,
      ``torch_threads``, ``deterministic``, ``resume``
    - environment: ``n_envs``, ``env_backend``, ``env_threads``, ``env_mode``, ``normalize_obs``,
      ``normalize_reward``, ``obs_clip``, ``reward_clip``, ``time_feature``, ``frame_skip``, ``frame_stack``,
      ``noop_max``, ``episodic_life``, ``clip_atari_reward``, ``env_timeout_s``
    - model: ``hidden_sizes``, ``pi_sizes``, ``vf_sizes``, ``policy``, ``activation``, ``shared_trunk``,
      ``init_log_std``, ``use_sde``, ``sde_sample_freq``, ``ortho_init``, ``recurrent``, ``recurrent_size``,
      ``encoder``, ``amp``, ``compile``
    - algorithm (every algorithm): ``n_steps``, ``lr``, ``anneal_lr``, ``lr_floor``, ``adam_eps``, ``optimizer``,
      ``rmsprop_alpha``, ``rmsprop_eps``, ``gamma``, ``gae_lambda``, ``ent_coef``, ``vf_coef``, ``max_grad_norm``
    - PPO: ``n_epochs``, ``n_minibatches``, ``clip_coef``, ``anneal_clip``, ``clip_vloss``, ``norm_adv``,
      ``target_kl``
    - IMPALA / APPO: ``n_actors``, ``n_slots``, ``learner_batch``, ``sync_interval``, ``max_policy_lag``,
      ``rho_bar``, ``c_bar``, ``vtrace_lambda``, ``actor_timeout_s``, ``actors``, ``ray_address``,
      ``actor_resources``
    - logging, checkpoints, evaluation: ``log_interval``, ``progress``, ``quiet``, ``tensorboard``, ``wandb``,
      ``wandb_project``, ``checkpoint_interval``, ``keep_checkpoints``, ``eval_episodes``, ``eval_seeds``,
      ``eval_interval``, ``eval_deterministic``, ``eval_max_episode_steps``, ``eval_max_steps``,
      ``stop_at_return``, ``capture_video``, ``video_member``, ``plot``
    - guards: ``rollback``, ``rollback_drop``, ``rollback_lr_factor``, ``max_rollbacks``, ``rollback_patience``,
      ``max_nonfinite_iterations``

    Any other keyword is a one-line ``UserError`` naming the key meant (``learning_rate`` -> ``lr``, SB3's
    ``policy_kwargs`` -> its keys here).
    """
    # Every parameter but env, config and callbacks is a config key: those given (not None) override.
    overrides = {name: value for name, value in locals().items()
                 if name in FIELDS and name != "env" and value is not None}
    if unknown:
        raise _unknown_key(next(iter(unknown)), "the fastrl.train() arguments")
    refuse_in_spawned_child()
    from fastrl.run.callbacks import check_callbacks
    from fastrl.run.run_config import build_config
    from fastrl.run.session import run

    given, made_vector_env = _env_keys(env, overrides) if env is not None else ({}, None)
    given.update(overrides)
    callbacks = check_callbacks(callbacks)
    cfg, resume_state = build_config(given, config, where="the fastrl.train() arguments")
    threads = torch.get_num_threads()
    try:
        summary = run(cfg, resume_state, callbacks, agent_type=Agent)
    finally:
        torch.set_num_threads(threads)  # the trainer picks its own thread count; the caller's process keeps its own
        if made_vector_env is not None:
            made_vector_env.close()  # fastrl called the factory, so fastrl closes what it made
    code_names = {key: getattr(cfg, key) or None for key in CODE_KEYS}
    return Run(Path(summary["run_dir"]) if summary.get("run_dir") else None, summary, _code_names=code_names)


def _env_keys(env, overrides: dict) -> tuple[dict, object]:
    """``(keys, made)``: the config keys ``env`` (as ``train`` takes it) sets, and the vector env fastrl made of it
    (None: none; whoever called this closes it). A vector env sets ``n_envs`` (its ``num_envs``) and has no separate
    envs to evaluate on (``eval_episodes`` 0): ``overrides`` asking otherwise are a one-line UserError.

    A function, or a ``VectorEnv`` subclass, that makes a ``gymnasium.vector.VectorEnv`` (or a TorchRL env) is called
    once; a TorchRL env becomes a ``fastrl.envs.torchrl_adapter.TorchRLVectorEnv``; anything else is named as it is.
    A function that makes a single env is called once more than it would be otherwise: the env it made here is
    closed at once."""
    import gymnasium
    from fastrl.envs.torchrl_adapter import TorchRLVectorEnv, is_torchrl_env
    made = None
    if is_torchrl_env(env):  # an nn.Module, so callable: it is the env, not a factory
        env = TorchRLVectorEnv(env)
    elif callable(env) and not isinstance(env, str) and not (
            isinstance(env, type) and not issubclass(env, gymnasium.vector.VectorEnv)):
        if not isinstance(env, type):
            from fastrl.names import check_env_factory
            check_env_factory(env, getattr(env, "__qualname__", None) or type(env).__name__)  # no arguments needed
        made = env()
        if is_torchrl_env(made):
            made = TorchRLVectorEnv(made, owned=True)
        if isinstance(made, gymnasium.vector.VectorEnv):
            env = made
        else:
            if isinstance(made, gymnasium.Env):
                made.close()
            made = None
    if not isinstance(env, gymnasium.vector.VectorEnv):
        return {"env": env_name(env)}, made
    if "n_envs" in overrides and overrides["n_envs"] != env.num_envs:
        raise UserError(f"n_envs={overrides['n_envs']} but the vector env holds {env.num_envs} envs: drop n_envs (it "
                        "comes from the vector env)")
    if overrides.get("eval_episodes"):
        raise UserError("a vector env object gives fastrl no separate envs to evaluate on: drop eval_episodes, or "
                        "pass the id, class or factory of one env (fastrl then builds the vector env itself)")
    return {"env": env_name(env), "n_envs": env.num_envs, "eval_episodes": 0}, made


def _state_in(state, x: torch.Tensor) -> torch.Tensor | None:
    """``predict``'s ``state`` (a tuple of ``[B, H]`` arrays or tensors) as one ``[B, S]`` tensor on ``x``'s device."""
    if state is None:
        return None
    parts = state if isinstance(state, (tuple, list)) else (state,)
    return torch.cat([torch.as_tensor(p).float().reshape(x.shape[0], -1) for p in parts], dim=1).to(x.device)


def refuse_in_spawned_child() -> None:
    """A spawned child (an IMPALA/APPO actor) imports the parent's script as ``__mp_main__`` before it runs; a script
    without ``if __name__ == "__main__":`` then calls ``fastrl.train()`` again, which would start a run in every
    actor. The child exits at once with ``NO_MAIN_GUARD_EXIT`` instead, and the learner turns that into one line."""
    import multiprocessing.process
    if getattr(multiprocessing.process.current_process(), "_inheriting", False):  # still bootstrapping
        from fastrl.distributed.actors import NO_MAIN_GUARD_EXIT
        os._exit(NO_MAIN_GUARD_EXIT)


@dataclasses.dataclass
class Run:
    """A finished run: ``run_dir`` (None on torchrun ranks other than 0), ``summary`` (summary.json's contents) and
    ``agent`` (its newest checkpoint, loaded on first access)."""
    run_dir: Path | None
    summary: dict
    _agent: Agent | None = dataclasses.field(default=None, repr=False, compare=False)
    # The code names (env, policy) this process gave the run: the agent is loaded with them, never with a file's.
    _code_names: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def agent(self) -> Agent:
        if self._agent is None:
            if self.run_dir is None:
                raise UserError("this process wrote no run directory (a torchrun rank other than 0); load the agent "
                                "on rank 0")
            self._agent = load(self.run_dir, **self._code_names)
        return self._agent


def load(path: str | os.PathLike, best: bool = False, env: str | type | Callable | None = None, device: str = "cpu",
         member: int | None = None, policy: str | type | None = None) -> Agent:
    """The agent of a checkpoint file, or of a run directory's newest checkpoint (``best=True``: the
    ``EvalCallback``'s ``checkpoints/best.pt``). The checkpoint carries the env's observation and action spaces, so
    the agent acts (``act``, ``predict``) without building its env or importing its code; ``env`` overrides the env
    the checkpoint names, for what steps an env (``evaluate``), and must be given there for a saved ``module:Name``
    env, which a checkpoint alone never makes fastrl import (and for loading an older checkpoint, without spaces, of
    such an env); ``policy``: the same for a saved custom policy class (the class, or its ``module:ClassName``),
    needed to build the model; ``device`` is where the policy runs. ``member``: which agent of a population run
    (``--n-seeds``/``--vary``)."""
    from fastrl.run.callbacks import best_checkpoint_path
    from fastrl.run.checkpoint import (checkpoint_config, checkpoint_spaces, load_checkpoint, resolve_checkpoint,
                                   select_member)
    from fastrl.distributed.torchrun import resolve_device

    target = Path(path)
    if best:
        if target.is_dir():
            target = best_checkpoint_path(target) if (target / "checkpoints").is_dir() else target / "best.pt"
        if not target.is_file():
            raise UserError(f"no best checkpoint at {str(target)!r}; it is written by fastrl.run.callbacks.EvalCallback "
                            "(drop best=True to load the newest checkpoint)")
    state = load_checkpoint(target)  # one-line UserError for a missing, corrupted or foreign file
    state = select_member(state, member, f"checkpoint {target}")
    where = f"checkpoint {target}"
    # With the spaces saved, the env is judged only when one is stepped (Agent.evaluate); a saved module:Name policy
    # is used only if passed, as it must be imported to build the model.
    spaces_saved = env is None and checkpoint_spaces(state, where) is not None
    given = {"env": state["config"].get("env") if spaces_saved else env, "policy": policy}
    cfg = checkpoint_config(state, where, given)
    return Agent(state, cfg, resolve_device(device), resolve_checkpoint(target), env_named=env is not None)


def evaluate(path: str | os.PathLike, *, episodes: int = 10, seeds: int = 1, deterministic: bool | None = None,
             env: str | type | Callable | None = None, best: bool = False, member: int | None = None,
             device: str = "cpu", max_episode_steps: int | None = None, max_steps: int | None = None) -> np.ndarray:
    """Evaluate a saved agent: ``fastrl.load(path, best=..., env=..., device=..., member=...).evaluate(...)``, as
    ``fastrl eval`` does. ``path``: a checkpoint file or a run directory (its newest checkpoint; ``best=True``: the
    ``EvalCallback``'s best). Plays ``episodes`` whole episodes on each of ``seeds`` fresh envs of the run's env (or
    ``env``, an id, ``module:Id``, class or factory); ``deterministic``: the policy's mode, False samples (None: the
    run's ``eval_deterministic``); an episode is cut after ``max_episode_steps`` and the evaluation after
    ``max_steps`` env steps in all (None: the run's ``eval_max_episode_steps`` / ``eval_max_steps``). Returns the
    returns, float64 ``[seeds * episodes]``."""
    agent = load(path, best=best, env=env, device=device, member=member)
    return agent.evaluate(episodes=episodes, seeds=seeds, deterministic=deterministic,
                          max_episode_steps=max_episode_steps, max_steps=max_steps)


def _probe(probe, cfg: Config, hint: str):
    """``probe(cfg)`` (``fastrl.envs.batched.probe_env`` or ``probe_spaces``), ``hint`` added to its one-line errors."""
    try:
        return probe(cfg)
    except UserError as e:
        raise UserError(f"{e}; {hint}") from None


class Agent:
    """A trained policy. ``act(obs)`` / ``predict(obs)`` act; ``evaluate()`` plays whole episodes on fresh envs;
    ``save(path)`` writes it to one file; ``export(path)`` writes its policy for onnxruntime or libtorch;
    ``learn(steps)`` trains it further.

    ``config`` is the run's ``Config``, ``policy`` the ``nn.Module`` (``act_deterministic``,
    ``get_action_and_value``), ``observation_space`` / ``action_space`` one env's Gymnasium spaces (read from the
    checkpoint, or from one env built for an older checkpoint), ``observation_shape`` / ``observation_dtype`` /
    ``action_spec`` what the policy takes and gives, ``raw_policy`` the ``fastrl.export.RawPolicy`` that ``act`` runs
    (raw observations in, env actions out), ``path`` the checkpoint it came from. ``env_named``: whether the
    user named the env (else a saved ``module:Name`` env is refused where an env must be stepped).

    ``policy(obs)`` (its ``forward``, for fastrl's models) is the deterministic action of raw observations (one or a
    batch ``[B, *obs]``), as ``act`` gives it: the saved observation normalizer applied, continuous actions clamped to the
    bounds. So in TorchRL (discrete actions as indices: ``GymEnv(..., categorical_action_encoding=True)``)::

        env.rollout(10, TensorDictModule(agent.policy, in_keys=["observation"], out_keys=["action"]))
    """

    def __init__(self, state: dict, cfg: Config, device: torch.device, path: Path | None = None,
                 env_named: bool = True):
        from fastrl.run.checkpoint import checkpoint_spaces, load_weights
        from fastrl.envs.batched import probe_spaces
        from fastrl.learn.models import make_agent
        self.config, self.device, self.path, self._state, self._env_named = cfg, device, path, state, env_named
        spaces = checkpoint_spaces(state, f"checkpoint {path}") or _probe(
            probe_spaces, cfg, "pass env= to fastrl.load to name the env this agent acts in")
        self.observation_space, self.action_space = spaces
        form = observation_format(self.observation_space, cfg.env)
        self._layout = form.layout  # a Dict observation's packing, whatever the policy (a custom one has none)
        shape = (form.shape[0] + 1,) if cfg.time_feature else form.shape  # the time feature: one more entry
        spec = action_spec_of(self.action_space)
        self.observation_shape, self.observation_dtype, self.action_spec = shape, form.dtype, spec
        # A pixel model's obs_scale is a buffer: the state restores it.
        self.policy = make_agent(cfg, shape, spec, observation_space=self.observation_space)
        load_weights(self.policy, state["model"], f"checkpoint {path}" if path else "this agent's state")
        self.policy.to(device).eval()
        self.normalizer = state.get("normalizer")
        obs_rms = bounds = None
        if cfg.normalize_obs and self.normalizer is not None:
            obs_rms = self.normalizer["obs_rms"]
        if spec.kind == "continuous":
            bounds = tuple(torch.tensor(b, dtype=torch.float32).view(spec.shape) for b in (spec.low, spec.high))
        # Raw observations in, env actions out: what act runs, policy(obs) gives and export writes.
        self.raw_policy = RawPolicy(self.policy, shape, form.dtype, obs_rms, cfg.obs_clip, bounds).to(device)
        if hasattr(self.policy, "act_deterministic"):  # fastrl's models (a custom policy keeps its own forward)
            self.raw_policy.install()

    def __repr__(self) -> str:
        return (f"Agent(env={self.config.env!r}, algo={self.config.algo!r}, observation_shape={self.observation_shape}, "
                f"action={self.action_spec.kind}, path={str(self.path)!r})")

    def _as_tensor(self, obs) -> torch.Tensor:
        from tensordict import TensorDictBase
        if isinstance(obs, TensorDictBase):  # TorchRL's: its "observation" entry
            if "observation" not in obs.keys():
                raise UserError(f"act takes a TensorDict with an 'observation' entry (or an array, tensor or dict of "
                                f"them); this one has {sorted(map(str, obs.keys()))}")
            obs = obs["observation"]
        layout = self._layout
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
    def act(self, obs, deterministic: bool = True, check_finite: bool = True, action_masks=None, state=None,
            episode_start=None):
        """Actions for one observation ``[*observation_shape]`` or a batch ``[B, *observation_shape]``, of any real
        dtype. numpy (or a list) in, numpy out; a torch tensor (or a TensorDict, its ``"observation"``) in, a tensor
        out on its device. Discrete actions are
        int64 ``[]`` / ``[B]``; continuous ones float32 ``[*action_shape]`` / ``[B, *action_shape]``, within the
        action bounds. ``deterministic``: the policy's mode (else a sample). The saved observation normalizer is
        applied as in training. A NaN/Inf observation is refused with one line (``check_finite=False`` passes it
        to the policy as it is). An agent trained with action masks (``fastrl.envs.masks``) takes the Dict observation
        with its ``action_mask``, or the observation and ``action_masks`` (bool ``[n]`` / ``[B, n]``, sb3-contrib's),
        and picks valid actions only. ``state`` / ``episode_start``: see ``predict``; given to a recurrent policy,
        returns ``(action, state)``."""
        from tensordict import TensorDictBase
        if action_masks is not None:
            obs = observation_with_masks(obs, action_masks, self._layout)
        returns_tensor = torch.is_tensor(obs) or isinstance(obs, TensorDictBase) or \
            isinstance(obs, dict) and torch.is_tensor(obs.get("image"))
        x = self._as_tensor(obs)
        if getattr(self.observation_space, "shape", None) == () and x.dim() <= 1:  # Discrete: one integer, or [B]
            x = x.unsqueeze(-1)
        if x.is_complex():
            raise UserError(f"observations must be real numbers, got dtype {x.dtype}")
        expected, got = self.observation_shape, tuple(x.shape)
        if len(expected) == 3 and expected[0] < expected[1] and got[-3:] == (*expected[1:], expected[0]):
            x = x.movedim(-1, -3)  # a channels-last image, as the env gives it: channels first, as the model takes it
            got = tuple(x.shape)
        if expected not in (got, got[1:]):
            if self.config.time_feature and len(expected) == 1 and got[-1:] == (expected[0] - 1,):
                raise UserError(f"observation shape {got} lacks the time feature this agent was trained with "
                                f"(time_feature): append 1 - t / max_episode_steps to each observation, t the steps "
                                f"taken in its episode, for shape {expected}")
            raise UserError(f"observation shape {got} does not fit {self.config.env}'s observations: expected "
                            f"{expected} for one or (batch, {', '.join(map(str, expected))}) for a batch")
        single = got == expected
        if check_finite and x.is_floating_point() and not bool(torch.isfinite(x).all()):
            raise UserError("the observation holds NaN or Inf values; fix the env (or pass check_finite=False to act "
                            "on them anyway)")
        out_device = x.device
        x = x.to(self.device)
        if single:
            x = x.unsqueeze(0)
        recurrent = hasattr(self.policy, "state_size")
        if recurrent:
            state = _state_in(state, x)
            if episode_start is not None:
                episode_start = torch.as_tensor(episode_start).bool().reshape(-1).to(x.device)
        action, state = self.raw_policy.step(x, state, episode_start, deterministic)
        if single:
            action = action[0]
        action = action.to(out_device) if returns_tensor else action.cpu().numpy()
        if not recurrent:
            return action
        h = self.policy.hidden_size  # SB3's layout: (h, c) for an LSTM, (h,) for a GRU, each [B, H]
        parts = tuple(state[:, i:i + h] for i in range(0, state.shape[1], h))
        return action, tuple(p.to(out_device) if returns_tensor else p.cpu().numpy() for p in parts)

    def predict(self, obs, state=None, episode_start=None, deterministic: bool = True, check_finite: bool = True,
                action_masks=None):
        """Stable-Baselines3's ``predict``: ``(action, state)``, the action as ``act`` gives it. A recurrent policy
        (``recurrent: lstm | gru``) returns its state after the step, ``(h, c)`` (LSTM) or ``(h,)`` (GRU), each
        ``[B, H]``, to pass back with the next observation; ``state`` None is zeros and ``episode_start [B]`` (bool,
        SB3's: the observation starts an episode) zeroes those rows first. Other policies keep none: ``state`` and
        ``episode_start`` are ignored and the state is None. So ``action, _ = agent.predict(obs)`` reads the same for
        one observation and for a batch."""
        if hasattr(self.policy, "state_size"):
            return self.act(obs, deterministic, check_finite, action_masks, state, episode_start)
        return self.act(obs, deterministic, check_finite, action_masks), None

    def _checkpoint_state(self) -> dict:
        """The checkpoint this agent came from, with the policy's current weights."""
        return {**self._state, "spaces": spaces_to_data(self.observation_space, self.action_space),
                "model": {k: v.detach().cpu() for k, v in self.policy.state_dict().items()}}

    def save(self, path: str | os.PathLike) -> Path:
        """Write this agent to one self-contained file (weights, config, observation normalizer, optimizer state and
        counters: a fastrl checkpoint), atomically; ``fastrl.load(path)`` reads it, ``fastrl.train(resume=path)``
        continues its training. Returns the path."""
        from fastrl.run.checkpoint import save_checkpoint
        return save_checkpoint(self._checkpoint_state(), Path(path))

    def export(self, path: str | os.PathLike, format: str = "onnx") -> Path:
        """Write the deterministic policy of raw observations, as ``predict(obs, deterministic=True)`` gives it
        (normalizer, pixel scaling and action clamping inside), to ``path`` for onnxruntime (``format="onnx"``,
        needs ``pip install 'fastrl[export]'``) or libtorch (``"torchscript"``); inputs and output: see
        ``fastrl.export``. Returns the path."""
        from fastrl.export import export
        return export(self, path, format)

    @property
    def global_step(self) -> int:
        """Env steps this agent has trained for."""
        return int(self._state.get("global_step", 0))

    def learn(self, steps: int, run_dir: str | os.PathLike | None = None, callbacks=(), **overrides) -> Run:
        """Train this agent ``steps`` more env steps, as SB3's ``learn(steps, reset_num_timesteps=False)``: a new run
        directory (``run_dir``, default ``runs/<env>__<algo>__<seed>__<time>``) continues the checkpoint, optimizer
        state and step count included, to the budget ``global_step + steps`` (the learning-rate schedule is
        stretched over that new total; ``overrides``: config keys, e.g. ``lr``). The agent then holds the new
        weights and observation statistics; returns the ``Run``."""
        from fastrl.run.checkpoint import checkpoint_path, save_checkpoint
        from fastrl.run.rundir import default_run_dir, holds_run
        if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
            raise UserError(f"learn: steps must be a positive int, got {steps!r}")
        if "total_steps" in overrides or "resume" in overrides:
            raise UserError("learn: pass the steps to add as learn(steps); total_steps and resume are set from them")
        target = Path(run_dir) if run_dir is not None else default_run_dir(self.config)
        if holds_run(target):
            raise UserError(f"learn: run_dir {str(target)!r} already holds a run; pick another")
        start = save_checkpoint(self._checkpoint_state(), checkpoint_path(target, self.global_step))
        names = {key: getattr(self.config, key) for key in CODE_KEYS if getattr(self.config, key)}  # given to load
        run = train(resume=start, total_steps=self.global_step + steps, callbacks=callbacks, **{**names, **overrides})
        trained = load(run.run_dir, device=str(self.device), **names) if run.run_dir is not None else self
        self._state, self.path, self.config, self.normalizer = trained._state, trained.path, trained.config, \
            trained.normalizer
        self.raw_policy.load_state_dict(trained.raw_policy.state_dict())  # the weights and the observation statistics
        return run

    def evaluate(self, env=None, episodes: int = 10, seeds: int = 1, deterministic: bool | None = None,
                 max_episode_steps: int | None = None, max_steps: int | None = None, should_stop=None,
                 label: str | None = None) -> np.ndarray:
        """Play ``episodes`` whole episodes on each of ``seeds`` fresh evaluation envs (the saved normalizer frozen,
        rewards unscaled). ``deterministic``: the policy's mode, False samples (None: the run's
        ``eval_deterministic``). An episode is cut after ``max_episode_steps`` steps and the evaluation after
        ``max_steps`` env steps in all (None: the run's ``eval_max_episode_steps`` / ``eval_max_steps``); a cut
        episode counts its return so far. ``env``: another env than the run's (an id, ``module:Id``, class or
        factory) with the same observation and action spaces. ``should_stop`` and ``label`` (``fastrl eval``'s): see
        ``fastrl.run.evaluate.play_first_episodes``. Returns the returns, float64 ``[seeds * episodes]``."""
        from fastrl.run.evaluate import evaluate
        if not (isinstance(episodes, int) and isinstance(seeds, int) and episodes > 0 and seeds > 0):
            raise UserError(f"episodes and seeds must be positive ints, got {episodes!r} and {seeds!r}")
        from fastrl.run.checkpoint import checkpoint_config
        from fastrl.envs.batched import probe_env
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
                           deterministic, max_steps, should_stop, label)
        return returns.numpy()
