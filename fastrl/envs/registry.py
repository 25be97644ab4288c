"""Env names: which ids EnvPool, Gymnasium and the torch suite know, what a config's ``env`` resolves to and which
backend runs it.

A config's ``env`` is an EnvPool or Gymnasium id; ``module:Id`` (``module`` is imported first, so its Gymnasium
registration runs); ``module:QualName`` of a gymnasium.Env subclass or zero-argument factory; or a name given to a
factory with ``register_env_factory`` (this process only). Python envs run on the Gymnasium vector env, in worker
processes (in-process inside a daemonic process, such as an IMPALA actor)."""
from __future__ import annotations

import difflib
import functools
import sys

from fastrl._startup import import_envpool
from fastrl.config import UserError, brief



@functools.lru_cache(maxsize=1)
def envpool_ids() -> frozenset:
    try:
        envpool = import_envpool()
    except ImportError:
        return frozenset()
    return frozenset(envpool.list_all_envs())


@functools.lru_cache(maxsize=None)
def envpool_family(env_id: str) -> str | None:
    """The EnvPool module that registers ``env_id`` (``envpool.atari``, ``envpool.procgen``, ...), None for an id
    EnvPool lacks. Read from EnvPool's registry, so no env code (and no Procgen Qt) is loaded to answer."""
    if env_id not in envpool_ids():
        return None
    from envpool.registration import registry
    return registry.specs[env_id][0]


def is_procgen(env_id: str) -> bool:
    """An EnvPool Procgen id (``CoinrunEasy-v0``, ...): uint8 ``[3, 64, 64]`` frames, 15 actions."""
    return envpool_family(env_id) == "envpool.procgen"


# EnvPool's Procgen links the system Qt 5 libraries (libQt5Core, libQt5Gui); Debian/Ubuntu ship both in this package.
PROCGEN_QT_PACKAGE = "libqt5gui5"


def _load_procgen():
    """Load EnvPool's Procgen extension (raises ImportError when the Qt 5 runtime is missing)."""
    import envpool.procgen
    return envpool.procgen.ProcgenEnvSpec  # the module defers its import error to the first attribute access


def require_procgen_runtime(env_id: str) -> None:
    """Raise a one-line UserError naming the system package to install when Procgen cannot load for want of Qt 5."""
    try:
        _load_procgen()
    except ImportError as e:
        causes = f"{e} {e.__cause__ or ''}"
        if "qt" not in causes.lower():
            raise
        raise UserError(f"{env_id} (EnvPool Procgen) needs the system Qt 5 runtime, which is not installed: install "
                        f"it with `apt-get install -y {PROCGEN_QT_PACKAGE}` (Debian/Ubuntu; `dnf install qt5-qtbase` "
                        "on Fedora)") from None


def is_atari(env_id: str) -> bool:
    """An EnvPool Atari id (``Pong-v5``, ...): its spec has the Atari preprocessing options."""
    return envpool_family(env_id) == "envpool.atari"


def atari_kwargs(cfg, training: bool = True) -> dict:
    """EnvPool Atari options from ``cfg``. Evaluation (``training=False``) plays whole, unclipped games."""
    return dict(frame_skip=cfg.frame_skip, stack_num=cfg.frame_stack, noop_max=cfg.noop_max,
                episodic_life=cfg.episodic_life and training, reward_clip=cfg.clip_atari_reward and training)


# Ids of another env's observations with some entries only: id -> (that env's id, the entries kept). EnvPool runs
# the other env and the entries are taken from its observations (``fastrl.envs.batched``); Gymnasium registers the id
# (``register_gymnasium_ids``); the torch suite has its own (``fastrl.envs.torch_envs``).
OBSERVATION_SUBSETS = {"CartPoleNoVel-v1": ("CartPole-v1", (0, 2))}  # the RL Zoo's: [x, theta], no velocities


def gymnasium_ids() -> frozenset:
    """Gymnasium's registered ids (with ``OBSERVATION_SUBSETS``'), read afresh each call: an id registered after an
    earlier look-up is found."""
    import gymnasium
    register_gymnasium_ids()
    return frozenset(gymnasium.registry.keys())


def register_gymnasium_ids() -> None:
    """Register ``OBSERVATION_SUBSETS``' ids with Gymnasium (once; an id already registered is kept)."""
    import gymnasium
    for env_id, (base, keep) in OBSERVATION_SUBSETS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(env_id, entry_point=functools.partial(observation_subset, base, keep),
                               max_episode_steps=gymnasium.spec(base).max_episode_steps)


def observation_subset(base: str, keep: tuple, **kwargs):
    """One Gymnasium env ``base`` (without its time limit, which the registration adds) whose observations keep
    the entries ``keep`` only."""
    import gymnasium
    import numpy as np
    env = gymnasium.make(base, max_episode_steps=None, **kwargs).unwrapped
    space = env.observation_space
    subset = gymnasium.spaces.Box(space.low[list(keep)], space.high[list(keep)], dtype=space.dtype)
    return gymnasium.wrappers.TransformObservation(env, functools.partial(np.take, indices=list(keep)), subset)


# Envs given as Python objects that cannot be imported back by name (a lambda, a class defined inside a function, a
# user's gymnasium.vector.VectorEnv: see vector_env_name): a config keeps the name, this registry the object, for this
# process.
_ENV_FACTORIES: dict = {}


def vector_env_name(vector_env) -> str:
    """The config name of a user's ``gymnasium.vector.VectorEnv`` instance, registered in this process (for good:
    ``fastrl.load`` of its run reads its spaces there).

    Training steps it as it is: ``n_envs`` is its ``num_envs``, env i is reset with seed ``seed + i``. It must
    autoreset as Gymnasium's vector envs do by default (``AutoresetMode.NEXT_STEP``: the step after an episode's
    end is a reset step, its action ignored, ``valid`` False); a vector env without an ``autoreset_mode`` in its
    metadata is taken to do so. SAME_STEP and DISABLED are refused, in one line that names the fix."""
    import gymnasium
    mode = getattr(vector_env, "metadata", {}).get("autoreset_mode", gymnasium.vector.AutoresetMode.NEXT_STEP)
    if str(getattr(mode, "value", mode)) != gymnasium.vector.AutoresetMode.NEXT_STEP.value:
        raise UserError(f"env {type(vector_env).__name__} autoresets in mode {getattr(mode, 'name', mode)}; fastrl "
                        "needs the reset step after each episode's end: build it with "
                        "autoreset_mode=gymnasium.vector.AutoresetMode.NEXT_STEP (Gymnasium's default)")
    return _registered(_ENV_FACTORIES, f"vector:{type(vector_env).__name__}", vector_env)


def _registered(table: dict, base: str, obj) -> str:
    """The name of ``obj`` in ``table``: ``base``, or ``base#2``, ``#3``, ... where other objects hold those names;
    registered under it if it was not yet."""
    name, k = base, 1
    while table.get(name, obj) is not obj:
        k += 1
        name = f"{base}#{k}"
    table[name] = obj
    return name


def register_env_factory(name: str, factory) -> str:
    """Make the env name ``name`` build each env with ``factory()`` (a gymnasium.Env subclass or a zero-argument
    function returning a gymnasium.Env) in this process. Returns ``name``."""
    _ENV_FACTORIES[name] = factory
    return name


def env_name(env) -> str:
    """The config string for ``env``. An id string is kept as given (``Id`` or ``module:Id``); a gymnasium.Env
    subclass or zero-argument factory becomes ``module:QualName`` when that imports back to the same object (so
    evaluation, a later ``fastrl.load`` and IMPALA's actor processes rebuild it), else a name registered here."""
    if isinstance(env, str):
        return env
    import gymnasium

    from fastrl.envs.torchrl_adapter import TorchRLVectorEnv, is_torchrl_env
    if is_torchrl_env(env):  # an nn.Module, so callable, but the env itself: stepped through the adapter
        env = TorchRLVectorEnv(env)
    if isinstance(env, gymnasium.vector.VectorEnv):
        return vector_env_name(env)
    if isinstance(env, gymnasium.Env):
        raise UserError(f"env is an environment instance ({type(env).__name__}); pass its class or a zero-argument "
                        "factory instead: fastrl builds n_envs copies")
    from fastrl.names import attribute, check_env_factory
    check_env_factory(env, getattr(env, "__qualname__", None) or brief(env))
    module_name = getattr(env, "__module__", None) or type(env).__module__
    qualname = getattr(env, "__qualname__", None) or type(env).__qualname__
    name = f"{module_name}:{qualname}"
    if attribute(sys.modules.get(module_name), qualname) is env:  # what another process imports back
        return name
    return _registered(_ENV_FACTORIES, name, env)


def is_process_local(env_id: str) -> bool:
    """Whether ``env_id`` names a factory registered in this process only (other processes cannot rebuild it)."""
    return env_id in _ENV_FACTORIES


def resolve_env(env_id: str) -> tuple[str, object]:
    """``(id, factory)`` for a config's ``env``: a registered factory; for ``module:Name``, ``module`` is imported
    first (so its Gymnasium registrations run), then ``Name`` is an EnvPool/Gymnasium id or a class/factory in
    ``module``; otherwise ``env_id`` itself, with no factory."""
    if env_id in _ENV_FACTORIES:
        return env_id, _ENV_FACTORIES[env_id]
    if env_id.startswith("vector:"):
        raise UserError(f"env {env_id!r} was a vector env object of another process (or of a run that ended); pass the "
                        "vector env itself, or the id, class or factory of one env")
    if ":" not in env_id:
        return env_id, None
    from fastrl.names import attribute, check_env_factory, import_target
    module, name = import_target(env_id, "env")  # the one resolver of module:Name and path/to/file.py:Name
    if name in envpool_ids() or name in gymnasium_ids():
        return name, None
    factory = attribute(module, name)
    from fastrl.envs.torch_envs import TorchEnvSpec
    if isinstance(factory, TorchEnvSpec):  # a torch-native env: env_backend torch (resolve_backend)
        return env_id, factory
    if factory is None:
        raise UserError(f"env {brief(env_id)}: module {module.__name__!r} registers no Gymnasium id {name!r} and has "
                        "no class or factory of that name")
    factory = check_env_factory(factory, env_id)
    return env_id, factory


def env_identity(env_id: str):
    """What an env built from ``env_id`` depends on beyond the name (a cache key part): its class or factory, or its
    Gymnasium entry point, so a re-registered id or a redefined class is not served from a stale cache."""
    lookup_id, factory = resolve_env(env_id)
    if factory is not None:
        return factory
    import gymnasium
    spec = gymnasium.registry.get(lookup_id)
    return None if spec is None else spec.entry_point


def resolve_backend(env_id: str, backend: str = "auto") -> str:
    """Pick the backend for ``env_id`` or raise a one-line UserError with the closest valid ids.

    A class or factory (see ``resolve_env``) runs on the Gymnasium vector env. ``torch`` takes the ids of
    ``fastrl.envs.torch_envs.TORCH_ENVS`` and a user's ``TorchEnvSpec`` (``module:NAME``, which needs it); ``auto``
    never picks it."""
    if backend == "torch":
        from fastrl.envs.torch_envs import resolve_torch_env
        resolve_torch_env(env_id)
        return "torch"
    env_id, factory = resolve_env(env_id)
    from fastrl.envs.torch_envs import TorchEnvSpec
    if isinstance(factory, TorchEnvSpec):
        raise UserError(f"env {env_id!r} is a torch-native env (a TorchEnvSpec): use env_backend torch")
    if factory is not None:
        if backend == "envpool":
            raise UserError(f"env {env_id!r} is a Python class or factory, which EnvPool cannot run; use env_backend "
                            "auto or gymnasium")
        return "gymnasium"
    in_envpool, in_gym = OBSERVATION_SUBSETS.get(env_id, (env_id,))[0] in envpool_ids(), env_id in gymnasium_ids()
    if backend in ("envpool", "auto") and in_envpool:
        return "envpool"
    if backend in ("gymnasium", "auto") and in_gym:
        return "gymnasium"
    known = sorted(envpool_ids() | gymnasium_ids()) if backend == "auto" else sorted(
        envpool_ids() if backend == "envpool" else gymnasium_ids())
    close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.5)
    hint = f"; closest valid ids: {', '.join(close)}" if close else "; run `python -c 'import envpool; print(envpool.list_all_envs())'` for the list"
    where = "EnvPool or Gymnasium" if backend == "auto" else backend
    raise UserError(f"unknown env id {env_id!r} for {where}{hint}")
