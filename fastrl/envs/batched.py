"""One batched environment interface over EnvPool (sync), Gymnasium's subprocess vector env and torch-native envs
(``env_backend: torch``, see ``fastrl.envs.torch_envs``).

Conventions shared by every backend:
- ``step(action)`` returns CPU tensors ``observation [N, *obs_shape]`` (native dtype; float64 becomes
  float32), ``reward [N] float32``, ``terminated [N] bool``, ``truncated [N] bool`` and ``valid [N] bool``.
- An env whose episode ended on step t auto-resets on step t+1: that step's action is ignored, its
  reward is 0 and it returns the first observation of the new episode. ``valid`` is False on exactly
  those reset steps; they must be masked out of every loss and statistic.
- The observation returned on the step that ends an episode is the episode's real final observation,
  so a truncated episode can be bootstrapped from it.
- Env i of a batch built with ``seed`` is seeded ``seed + i`` (the torch backend: one generator seeded ``seed``).
- ``time_feature`` (flat float observations): a last entry ``1 - t / max_episode_steps`` is appended, ``t`` the
  steps taken in the episode, so 1.0 on a first observation (reset steps included) and 0.0 where the limit cuts.

Pixel tasks (EnvPool): Atari ``*-v5`` observations are uint8 ``[N, frame_stack, 84, 84]`` (grayscale, frame
skip, no-op starts, optional episodic life and reward clipping, all in C++). With episodic life a lost life is a
``terminated`` step for training, but ``stats`` follow the real game: the unclipped reward summed over all lives,
closed only at game over (or truncation). MiniGrid observations are the uint8 egocentric grid ``[N, 3, 7, 7]``
(object, colour, state codes). ``obs_scale`` is the factor a model applies to turn raw observations into floats
of order 1 (frames stay uint8 until then).

Env names and backends: ``fastrl.envs.registry``; step tensors, statistics and normalizers: ``fastrl.envs.stats``.
"""
from __future__ import annotations

import functools
import multiprocessing
import sys
import warnings

import gymnasium
import numpy as np
import torch

from fastrl._startup import import_envpool
from fastrl.config import UserError, brief
from fastrl.errors import first_line
from fastrl.envs.env_workers import (EnvCodeError, EnvError, ObservationError, WatchedSyncVectorEnv,
                                     WorkerGroupsVectorEnv, check_finite_observation)
from fastrl.envs.masks import (check_action_mask, env_action_masks, masked_observation, masked_observation_space,
                               with_action_mask)
from fastrl.envs.registry import (OBSERVATION_SUBSETS, atari_kwargs, env_identity, is_atari, is_procgen,
                                  require_procgen_runtime, resolve_backend, resolve_env)
from fastrl.envs.spaces import ActionSpec, action_spec_of, observation_format, pack_observation
from fastrl.envs.stats import EnvStep, EpisodeStats, MemberRunningMeanStd


class EnvGuard(gymnasium.Wrapper):
    """Around each Python env: an exception in reset/step becomes an EnvCodeError carrying the env's traceback,
    and a Box observation of another shape than the space's raises ObservationError (not a numpy broadcast
    error further on). An env with ``action_masks()`` puts its mask in each step's info (``fastrl.envs.masks``)."""

    def __init__(self, env, env_id: str):
        super().__init__(env)
        self._env_id = env_id
        space = env.observation_space
        self._shape = tuple(space.shape) if isinstance(space, gymnasium.spaces.Box) else None
        self._action_masks = env_action_masks(env)
        self.reads_action_masks = self._action_masks is not None

    def _check(self, obs, call: str):
        if self._shape is not None and np.shape(obs) != self._shape:
            raise ObservationError(
                f"env {self._env_id!r} returned an observation of shape {np.shape(obs)} from {call}(), but its "
                f"observation_space has shape {self._shape}: return observations of shape {self._shape} from "
                f"{call}() (or declare the shape it returns in observation_space)")

    def reset(self, **kwargs):
        try:
            obs, info = self.env.reset(**kwargs)
        except Exception as e:  # noqa: BLE001  (the user's code: whatever it raises is reported the same way)
            raise EnvCodeError.from_exception(e) from None
        self._check(obs, "reset")
        return obs, with_action_mask(info, self._action_masks)

    def step(self, action):
        try:
            obs, reward, terminated, truncated, info = self.env.step(action)
        except Exception as e:  # noqa: BLE001
            raise EnvCodeError.from_exception(e) from None
        self._check(obs, "step")
        flags = (_step_scalar(self._env_id, name, x, bool) for name, x in (("terminated", terminated),
                                                                         ("truncated", truncated)))
        return (obs, _step_scalar(self._env_id, "reward", reward, float), *flags,
                with_action_mask(info, self._action_masks))


def _step_scalar(env_id: str, name: str, value, kind):
    """A step's ``reward``, ``terminated`` or ``truncated`` as a Python ``kind``: one of shape [1] (a TorchRL env
    registered into Gymnasium returns tensors of shape [1]) is squeezed, a larger one refused naming the field."""
    if isinstance(value, (bool, int, float, np.number, np.bool_)):
        return value
    array = np.asarray(value.cpu() if torch.is_tensor(value) else value)
    if array.size != 1:
        raise UserError(f"env {env_id!r} returned {name} of shape {array.shape} from step(); return one number "
                        "per step (a scalar, or an array of shape [1])")
    return kind(array.reshape(()))


def make_checked_env(env_id: str, make_one, kwargs: dict):
    """``make_one(**kwargs)``, which must return a gymnasium.Env with Gymnasium spaces and at least one action (else a
    one-line UserError naming what is wrong), inside the guard that reports the env's exceptions and wrong
    observation shapes."""
    try:
        env = make_one(**kwargs)
    except UserError:
        raise
    except Exception as e:  # the env's constructor (a space too large to allocate included): the user's code
        raise UserError(f"env {env_id!r} could not be built: {type(e).__name__}: {first_line(e)[:120]}; fix the env's "
                        "constructor (try it alone: gymnasium.make or calling the class)") from None
    if not isinstance(env, gymnasium.Env):
        raise UserError(f"env {env_id!r}: its factory returned {type(env).__name__} ({str(env)[:40]}), not a "
                        "gymnasium.Env; make it return an environment instance")
    for name in ("observation_space", "action_space"):
        space = getattr(env, name, None)
        if not isinstance(space, gymnasium.spaces.Space):
            raise UserError(f"env {env_id!r}: its {name} is {brief(space, 40)}, not a gymnasium space; set it to one "
                            "(gymnasium.spaces.Box, Discrete, ...)")
    actions = env.action_space
    counts = ([int(actions.n)] if isinstance(actions, gymnasium.spaces.Discrete) else
              np.asarray(actions.nvec).ravel().tolist() if isinstance(actions, gymnasium.spaces.MultiDiscrete) else [1])
    if min(counts, default=1) < 1:
        raise UserError(f"env {env_id!r}: its action space {brief(actions, 40)} leaves no action to take; give it at "
                        "least one")
    return EnvGuard(env, env_id)


def _to_tensor(array: np.ndarray) -> torch.Tensor:
    tensor = torch.from_numpy(np.asarray(array))
    return tensor.float() if tensor.dtype == torch.float64 else tensor


class BatchedEnv:
    """``n_envs`` environments stepped as one batch. See the module docstring for the step contract.

    ``backend="torch"`` builds a ``fastrl.envs.torch_envs.TorchEnv`` (same interface, tensors all the way)."""

    def __new__(cls, env_id: str, n_envs: int, seed: int, backend: str = "auto", num_threads: int = 0,
                env_kwargs: dict | None = None, n_members: int = 1, time_feature: bool = False, timeout_s: float = 60.0):
        if backend == "torch":  # not a BatchedEnv, so Python skips __init__ on it
            from fastrl.envs.torch_envs import TorchEnv
            return TorchEnv(env_id, n_envs, seed, env_kwargs, n_members=n_members)
        return super().__new__(cls)

    def __init__(self, env_id: str, n_envs: int, seed: int, backend: str = "auto", num_threads: int = 0,
                 env_kwargs: dict | None = None, n_members: int = 1, time_feature: bool = False, timeout_s: float = 60.0):
        """``n_members``: the envs are that many members' equal blocks (env i is seeded ``seed + i`` either way).
        ``time_feature``: each observation ``[D]`` gets a last entry ``1 - t / max_episode_steps`` (``[D + 1]``),
        ``t`` the steps taken in its episode (0 on the first observation, so 1.0 there and 0.0 on the observation a
        time limit cuts at): the RL Zoo's TimeFeatureWrapper, which lets the value tell how much time is left.
        ``timeout_s``: the deadline of each call of a Gymnasium env (``fastrl.envs.env_workers``)."""
        self.env_id, self.n_envs = env_id, n_envs
        self.backend = resolve_backend(env_id, backend)
        lookup_id, factory = resolve_env(env_id)  # module:Id -> Id, after importing module
        env_kwargs = dict(env_kwargs or {})
        self._keep = None
        if self.backend == "envpool":
            envpool = import_envpool()
            if num_threads:
                env_kwargs["num_threads"] = num_threads
            if is_procgen(lookup_id):
                require_procgen_runtime(env_id)
            try:
                # EnvPool's float64 Box bounds make Gymnasium warn each time a space is built, and EnvPool builds
                # them lazily, on first access: both inside the filter.
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32.*")
                    base_id, self._keep = OBSERVATION_SUBSETS.get(lookup_id, (lookup_id, None))
                    self._env = envpool.make(base_id, env_type="gymnasium", num_envs=n_envs, seed=seed, **env_kwargs)
                    obs_space, act_space = self._env.observation_space, self._env.action_space
                    if self._keep:  # an id of some of base_id's observation entries
                        keep = list(self._keep)
                        obs_space = type(obs_space)(obs_space.low[keep], obs_space.high[keep], dtype=obs_space.dtype)
            except (TypeError, ValueError, RuntimeError) as e:
                raise UserError(f"EnvPool could not build {env_id!r}: {first_line(e)}") from None
        elif isinstance(factory, gymnasium.vector.VectorEnv):
            # The user's vector env, stepped as it is (its n_envs); a probe (n_envs=1) only reads its spaces.
            self._env = factory
            if n_envs not in (1, self._env.num_envs):
                raise UserError(f"env {env_id!r} is a vector env of {self._env.num_envs} envs, and fastrl cannot build "
                                f"{n_envs} more of it (evaluation on separate envs, a population): pass the id, class "
                                "or factory of one env instead")
            self.n_envs = n_envs = self._env.num_envs
            self._user_env = True  # the user's (or fastrl.train's caller's) to close, never this wrapper's
            obs_space, act_space = self._env.single_observation_space, self._env.single_action_space
        else:
            # gymnasium.make imports module of a module:Id itself, so worker processes find the id however started.
            make_one = factory if factory is not None else functools.partial(gymnasium.make, env_id)
            fns = [functools.partial(make_checked_env, env_id, make_one, env_kwargs) for _ in range(n_envs)]
            # A daemonic process (an IMPALA actor) may not start worker processes, and one env gains nothing from a
            # worker (probes, single-env evaluation): those step in-process.
            in_process = multiprocessing.current_process().daemon or n_envs == 1
            # A worker's exception is re-raised here with the env's own traceback (EnvCodeError, shown once by the
            # command line); Gymnasium would also warn it line by line, through our guard's frames.
            warnings.filterwarnings("ignore", message=".*ERROR: (Received the following error|Traceback|Raising the last)",
                                    module=r"gymnasium\.vector\.async_vector_env")
            # Workers fork on Linux whatever the global start method: `import torchrl` sets spawn, which re-runs a
            # script without a __main__ guard in each worker. They run the env's code only, never CUDA.
            fork = {"context": "fork"} if not in_process and sys.platform.startswith("linux") else {}
            vector_env = WatchedSyncVectorEnv if in_process else WorkerGroupsVectorEnv  # every call under a deadline
            self._env = vector_env(fns, timeout_s, autoreset_mode=gymnasium.vector.AutoresetMode.NEXT_STEP, **fork)
            obs_space, act_space = self._env.single_observation_space, self._env.single_action_space
        self._seed = seed
        try:
            self.action_spec = action_spec_of(act_space)
            # sb3-contrib's action_masks(): read from each step's info (fastrl.envs.masks)
            self._masks_in_info = (self.backend != "envpool" and not getattr(self, "_user_env", False)
                                   and any(self._env.get_attr("reads_action_masks")))
            if self._masks_in_info:
                obs_space = masked_observation_space(obs_space, self.action_spec)
            form = observation_format(obs_space, env_id)
            check_action_mask(form, self.action_spec, env_id)
        except UserError:
            self.close()
            raise
        self.observation_space, self.action_space = obs_space, act_space  # one env's, as Gymnasium spaces
        self.mask_width = form.mask
        self._image_key, self.layout, self._hwc = form.image_key, form.layout, form.hwc
        self.observation_shape, self.observation_dtype, self.obs_scale = form.shape, form.dtype, form.scale
        # Atari: statistics from the unclipped reward and the real game over, not the (per-life) terminated flag.
        self._game_stats = self.backend == "envpool" and is_atari(lookup_id)
        self._np_action_dtype = act_space.dtype if self.action_spec.nvec else None
        self.n_members = n_members
        self.stats = EpisodeStats(n_envs, n_members=n_members)
        self._prev_done = np.zeros(n_envs, dtype=bool)
        if self.action_spec.kind == "continuous":
            self._low = torch.tensor(self.action_spec.low, dtype=torch.float32).view(self.action_spec.shape)
            self._high = torch.tensor(self.action_spec.high, dtype=torch.float32).view(self.action_spec.shape)
            self._np_action_dtype = np.float32 if self.backend == "envpool" else act_space.dtype
        self._time_limit = self._time_feature_limit(env_id, obs_space) if time_feature else 0
        if self._time_limit:
            self.observation_shape = (self.observation_shape[0] + 1,)
            self._elapsed = np.zeros(n_envs, dtype=np.int64)

    def _time_feature_limit(self, env_id: str, obs_space) -> int:
        """The episode time limit the time feature counts down (refused with one line where it cannot apply)."""
        why = None
        if self.layout is not None or self._image_key or len(self.observation_shape) != 1:
            why = f"its observations are {'a Dict' if self.layout is not None else 'images'}, not one flat vector"
        elif not np.issubdtype(obs_space.dtype, np.floating):
            why = f"its observations are {obs_space.dtype}, not floats"
        limit = None
        if why is None:
            if self.backend == "envpool":
                limit = getattr(self._env.spec.config, "max_episode_steps", None)
            elif hasattr(self._env, "get_attr"):  # a Gymnasium vector env: its first env's spec, with its time limit
                limit = getattr(self._env.get_attr("spec")[0], "max_episode_steps", None)
            if not limit or limit <= 0:
                why = "it has no episode time limit fastrl can read (register it with max_episode_steps)"
        if why:
            self.close()
            raise UserError(f"time_feature does not apply to {env_id!r}: {why}; drop time_feature")
        return int(limit)

    def _obs(self, obs, info: dict | None = None) -> torch.Tensor:
        if self._keep:
            obs = obs[:, list(self._keep)]
        if self._masks_in_info:
            obs = masked_observation(obs, info)
        if self._time_limit:
            feature = 1.0 - np.minimum(self._elapsed, self._time_limit) / self._time_limit
            return torch.cat([_to_tensor(obs).float(), torch.from_numpy(feature.astype(np.float32))[:, None]], dim=1)
        if self.layout is not None:
            return pack_observation(obs, self.layout)
        if self._image_key is not None:
            return torch.from_numpy(obs[self._image_key]).permute(0, 3, 1, 2)  # a view; the buffer write copies
        tensor = _to_tensor(obs)
        if tensor.dim() == 1:  # Discrete (or scalar Box) observations: [N] as [N, 1]
            return tensor.unsqueeze(1)
        return tensor.permute(0, 3, 1, 2) if self._hwc else tensor

    def reset(self) -> torch.Tensor:
        if self.backend == "envpool":
            obs, info = self._env.reset()
        else:
            try:
                obs, info = self._env.reset(seed=[self._seed + i for i in range(self.n_envs)])
            except Exception as e:  # noqa: BLE001  (the user's env code: whatever it raises stops the run)
                raise EnvError(self.env_id, e, "reset") from e
        self._restart()
        return self._obs(obs, info)

    def _restart(self) -> None:
        """Every env at the start of an episode: no reset step due, the running episode totals at 0."""
        self._prev_done[:] = False
        if self._time_limit:
            self._elapsed[:] = 0
        self.stats.running_return.zero_()
        self.stats.running_length.zero_()

    def _action(self, action: torch.Tensor) -> np.ndarray:
        """``action`` (CPU tensor, see ActionSpec) as the env takes it: a continuous one clipped to the Box; the
        space's own dtype where it has one (MultiDiscrete, MultiBinary, Box)."""
        if self.action_spec.kind == "continuous":
            action = torch.maximum(torch.minimum(action, self._high), self._low)
        act = action.numpy()
        return act if self._np_action_dtype is None else act.astype(self._np_action_dtype, copy=False)

    def _flags(self, reward, terminated, truncated, info, env_ids=None) -> tuple:
        """``(reward, terminated, truncated, valid, done)`` of one step of the envs ``env_ids`` (None: all) as numpy
        arrays (cheaper than torch at these sizes), ``_prev_done`` and ``stats`` updated (Atari: by the game)."""
        ids = slice(None) if env_ids is None else env_ids
        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool)
        reward = np.asarray(reward, dtype=np.float32)
        valid = ~self._prev_done[ids]
        done = terminated | truncated
        self._prev_done[ids] = done
        if self._game_stats:
            self.stats.update(info["reward"], info["terminated"].astype(bool) | truncated, valid, env_ids)
        else:
            self.stats.update(reward, done, valid, env_ids)
        return reward, terminated, truncated, valid, done

    def step(self, action: torch.Tensor) -> EnvStep:
        """Step all envs with ``action`` (CPU tensor, see ActionSpec)."""
        try:
            obs, reward, terminated, truncated, info = self._env.step(self._action(action))
        except Exception as e:  # noqa: BLE001
            if self.backend == "envpool":
                raise
            raise EnvError(self.env_id, e, "step") from e
        flags = self._flags(reward, terminated, truncated, info)
        if self._time_limit:  # a reset step starts its episode's count again
            self._elapsed = np.where(flags[3], self._elapsed + 1, 0)
        return EnvStep(self._obs(obs, info), *map(torch.from_numpy, flags))

    def close(self) -> None:
        """Idempotent: the run loop closes its trainer's env before the final evaluation and again on the way out."""
        if not getattr(self, "_closed", False):
            self._closed = True
            if not getattr(self, "_user_env", False):
                self._env.close()

class NormalizedEnv:
    """Running observation normalization and reward scaling around a BatchedEnv, per member.

    Rewards are divided by the running std of the discounted return (reset at episode ends; reset steps left out of
    its statistics). ``training=False`` freezes the statistics and leaves rewards unscaled (evaluation).
    Episode statistics stay those of the raw env. ``gammas``: one discount per member; member m owns envs
    ``[m * n, (m + 1) * n)`` and keeps its own statistics (``state_dict(m)``), equal to its single run's: every
    member's are updated at once over ``[K, n, ...]``, the same arithmetic at K = 1.
    """

    def __init__(self, env: BatchedEnv, normalize_obs: bool, normalize_reward: bool, gamma: float | list,
                 obs_clip: float = 10.0, reward_clip: float = 10.0, training: bool = True):
        self.env, self.normalize_obs, self.normalize_reward = env, normalize_obs, normalize_reward
        self.gammas = list(gamma) if isinstance(gamma, (list, tuple)) else [gamma]
        self.n_members = len(self.gammas)
        self.obs_clip, self.reward_clip, self.training = obs_clip, reward_clip, training
        self.obs_stats = MemberRunningMeanStd(self.n_members, env.observation_shape)
        self.return_stats = MemberRunningMeanStd(self.n_members)
        self.member_gamma = torch.tensor(self.gammas, dtype=torch.float64).unsqueeze(1)  # [K, 1]
        self.discounted_return = torch.zeros(env.n_envs, dtype=torch.float64)
        self.steps = 0  # steps of the batch since it was built (each env's step count)

    def __getattr__(self, name):
        return getattr(self.env, name)

    def _obs(self, obs: torch.Tensor) -> torch.Tensor:
        """``obs [K * n, ...]``, normalized by each member's statistics (updated first when training): float32."""
        if not self.normalize_obs:
            return obs
        grouped = obs.reshape(self.n_members, -1, *obs.shape[1:]).double()  # converted once, for both uses
        if self.training:
            check_finite_observation(obs, self.env_id, self.steps)  # a NaN would poison the statistics for good
            self.obs_stats.update(grouped)
        mean = self.obs_stats.mean.unsqueeze(1)
        std = torch.sqrt(self.obs_stats.var.unsqueeze(1) + 1e-8)
        return ((grouped - mean) / std).clamp_(-self.obs_clip, self.obs_clip).float().reshape(obs.shape)

    def reset(self) -> torch.Tensor:
        self.discounted_return.zero_()
        return self._obs(self.env.reset())

    def step(self, action: torch.Tensor) -> EnvStep:
        out = self.env.step(action)
        self.steps += 1
        out.observation = self._obs(out.observation)
        if self.normalize_reward and self.training:
            k = self.n_members
            reward = out.reward.double().view(k, -1)
            returns = self.discounted_return.view(k, -1) * self.member_gamma + reward
            self.discounted_return = returns.reshape(-1)
            self.return_stats.update(returns, out.valid.view(k, -1))
            scaled = reward / torch.sqrt(self.return_stats.var.unsqueeze(1) + 1e-8)
            out.reward = scaled.clamp_(-self.reward_clip, self.reward_clip).float().reshape(-1)
            self.discounted_return.masked_fill_(out.done, 0.0)
        return out

    def state_dict(self, member: int = 0) -> dict:
        """Member ``member``'s statistics (a single run's format)."""
        return {"obs_rms": self.obs_stats.member(member), "return_rms": self.return_stats.member(member)}

    def load_state_dict(self, state: dict, member: int = 0) -> None:
        self.obs_stats.load_member(member, state["obs_rms"])
        self.return_stats.load_member(member, state["return_rms"])


def make_env(cfg, n_envs: int | None = None, seed: int | None = None, training: bool = True,
             members: list | None = None) -> NormalizedEnv:
    """Build the (normalized) batched env that ``cfg`` describes. ``members`` (a population's configs, K > 1): the
    ``n_envs`` envs are K members' blocks, each with its own normalizer and episode statistics."""
    kwargs = atari_kwargs(cfg, training) if cfg.env_backend != "gymnasium" and is_atari(cfg.env) else None
    env = BatchedEnv(cfg.env, n_envs or cfg.n_envs, cfg.seed if seed is None else seed, cfg.env_backend,
                     cfg.env_threads, env_kwargs=kwargs, n_members=len(members or [cfg]),
                     time_feature=cfg.time_feature, timeout_s=cfg.env_timeout_s)
    if cfg.normalize_obs and getattr(env, "mask_width", 0):
        env.close()
        raise UserError(f"env {cfg.env!r} has action masks, which normalize_obs would rescale: drop normalize_obs")
    return NormalizedEnv(env, cfg.normalize_obs, cfg.normalize_reward, [m.gamma for m in members or [cfg]],
                         cfg.obs_clip, cfg.reward_clip, training)


def probe_env(cfg) -> tuple[tuple, torch.dtype, ActionSpec]:
    """Observation shape, observation dtype and action spec of ``cfg``'s env, from one env built and closed
    (cached per env settings)."""
    return _probe(*_probe_key(cfg))[:3]


def probe_spaces(cfg) -> tuple:
    """``(observation_space, action_space)`` of one of ``cfg``'s envs, Gymnasium spaces (the probe's, cached)."""
    return _probe(*_probe_key(cfg))[3]


def _probe_key(cfg) -> tuple:
    kwargs = atari_kwargs(cfg) if cfg.env_backend != "gymnasium" and is_atari(cfg.env) else {}
    return cfg.env, cfg.env_backend, tuple(sorted(kwargs.items())), env_identity(cfg.env), cfg.time_feature


@functools.lru_cache(maxsize=32)
def _probe(env_id: str, backend: str, env_kwargs: tuple, identity=None, time_feature: bool = False) -> tuple:
    """``(observation shape, dtype, action spec, (observation space, action space))``. ``identity`` (the env's class,
    factory or Gymnasium entry point) keys the cache only: a redefined class or a re-registered id under the same
    name is probed afresh."""
    try:
        env = BatchedEnv(env_id, 1, seed=0, backend=backend, env_kwargs=dict(env_kwargs) or None,
                         time_feature=time_feature)
    except ImportError as e:  # Gymnasium's DependencyNotInstalled too: an env whose extra package is missing
        raise UserError(f"{env_id!r} needs a package that is not installed: {first_line(e, type(e).__name__)}") from None
    try:
        return (tuple(env.observation_shape), env.observation_dtype, env.action_spec,
                (env.observation_space, env.action_space))
    finally:
        env.close()
