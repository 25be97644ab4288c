"""What a run starts from before anyone sets a key: the per-algorithm defaults, the tuned config of each env (and
where those YAML files live), the general PPO defaults, which keys each algorithm reads, and what ``--vary`` may
set. Data only; ``fastrl.config`` validates and layers it, ``fastrl.run.run_config`` picks an env's base from it."""
from __future__ import annotations

from pathlib import Path

from fastrl.errors import UserError

ALGOS = ("ppo", "a2c", "impala", "appo")
ACTOR_LEARNER_ALGOS = ("impala", "appo")
# Per-algorithm defaults, applied over the field defaults (PPO's: ``Config()`` is the embedded default) and under the
# YAML file and the flags (an A2C or IMPALA run needs no config file).
_ACTOR_LEARNER_DEFAULTS = dict(n_envs=16, n_steps=32, n_epochs=20, n_minibatches=1, lr=1e-3, clip_vloss=True,
                               total_steps=120_000)
ALGO_DEFAULTS = {
    "ppo": {},
    "a2c": dict(n_steps=5, lr=7e-4, lr_floor=1e-5, anneal_lr=True, gamma=0.99, gae_lambda=1.0, ent_coef=0.01,
                vf_coef=0.5, max_grad_norm=0.5, n_epochs=1, n_minibatches=1, norm_adv=False, clip_vloss=False),
    "impala": _ACTOR_LEARNER_DEFAULTS,
    "appo": _ACTOR_LEARNER_DEFAULTS,
}

# The tuned config an env trains with when no --config is given (fastrl train --env X, fastrl.train(env=X)), as the
# RL Zoo's train.py picks an env's hyperparameters; flags still override it. "atari" and "procgen" stand for every
# EnvPool id of that kind. Gymnasium's newer versions of the same tasks (LunarLander-v3, HalfCheetah-v5: the
# fallback backend) share their EnvPool twin's config.
_PPO_TUNED = {"CartPole-v1": "ppo/cartpole", "Acrobot-v1": "ppo/acrobot", "MountainCar-v0": "ppo/mountaincar",
              "MountainCarContinuous-v0": "ppo/mountaincar_continuous", "Pendulum-v1": "ppo/pendulum",
              "LunarLander-v2": "ppo/lunarlander", "LunarLanderContinuous-v2": "ppo/lunarlander_continuous",
              "BipedalWalker-v3": "ppo/bipedalwalker", "MiniGrid-Empty-5x5-v0": "ppo/minigrid",
              "FrozenLake-v1": "ppo/frozenlake",
              "atari": "ppo/atari", "procgen": "ppo/procgen",
              **{f"{name}-v4": f"ppo/{name.lower()}" for name in ("HalfCheetah", "Hopper", "Walker2d", "Ant", "Swimmer",
                                                                 "Humanoid")}}
_GYMNASIUM_TWINS = {"LunarLander-v3": "LunarLander-v2", "LunarLanderContinuous-v3": "LunarLanderContinuous-v2",
                    **{f"{name}-v5": f"{name}-v4" for name in ("HalfCheetah", "Hopper", "Walker2d", "Ant", "Swimmer",
                                                               "Humanoid")}}
TUNED_CONFIGS = {
    "ppo": {**_PPO_TUNED, **{twin: _PPO_TUNED[of] for twin, of in _GYMNASIUM_TWINS.items()}},
    "a2c": {"CartPole-v1": "a2c/cartpole", "atari": "a2c/atari"},
    "impala": {"CartPole-v1": "impala/cartpole", "LunarLander-v2": "impala/lunarlander", "atari": "impala/atari"},
}
# PPO on an env with no tuned config: CleanRL's ppo.py (discrete actions) and ppo_continuous_action.py (continuous;
# its 1 env x 2048 steps as 8 x 256, the same batch) settings, the general-purpose defaults of the PPO literature,
# not the CartPole-tuned ones of Config(). A budget of 1M steps unless total_steps is given.
_GENERAL_SHARED = dict(n_envs=8, total_steps=1_000_000, anneal_lr=True, gamma=0.99, gae_lambda=0.95, clip_coef=0.2,
                       clip_vloss=True, vf_coef=0.5, max_grad_norm=0.5, hidden_sizes=[64, 64], activation="tanh")
GENERAL_DEFAULTS = {
    "discrete": dict(_GENERAL_SHARED, n_steps=128, lr=2.5e-4, n_epochs=4, n_minibatches=4, ent_coef=0.01),
    "continuous": dict(_GENERAL_SHARED, n_steps=256, lr=3e-4, n_epochs=10, n_minibatches=32, ent_coef=0.0,
                       normalize_obs=True, normalize_reward=True),
}

# Keys only some algorithms read: (the algorithms that read it, why the others do not, the fix). Given in a YAML
# file or a flag with a value other than the chosen algorithm's default, such a key is refused (see make_config).
_PPO_CLIP = ("ppo", "appo"), "{algo} has no clipped surrogate", "use --algo ppo or appo"
_ACTOR_LEARNER = ACTOR_LEARNER_ALGOS, "{algo} runs no actor processes", "use --algo impala or appo"
_V_TRACE = ACTOR_LEARNER_ALGOS, "{algo} has no V-trace targets", "use --algo impala or appo"
APPLIES_TO = {
    "clip_coef": _PPO_CLIP,
    "clip_vloss": _PPO_CLIP,
    "anneal_clip": (("ppo",), "{algo} anneals no clip range", "use --algo ppo"),
    "target_kl": (("ppo",), "{algo} does not stop its update early on approx_kl", "use --algo ppo"),
    # n_minibatches applies to all (impala: env-column minibatches); a2c reads n_epochs and validate() requires 1.
    "n_epochs": (("ppo", "appo", "a2c"), "one pass per batch; APPO reuses batches", "use --algo appo"),
    "gae_lambda": (("ppo", "a2c"), "V-trace advantages take vtrace_lambda", "set vtrace_lambda instead"),
    **{name: _ACTOR_LEARNER for name in ("n_actors", "n_slots", "learner_batch", "sync_interval", "max_policy_lag",
                                         "actor_timeout_s", "actors", "ray_address", "actor_resources")},
    **{name: _V_TRACE for name in ("rho_bar", "c_bar", "vtrace_lambda")},
}

# A YAML file describes an experiment, not a place: a saved config.yaml (which records these) starts a new run
# directory instead of writing into the run it came from.
YAML_IGNORED = ("run_dir", "resume", "overwrite")

# What --vary may set: each is per member in the trainer (a [K] hyperparameter tensor, the member's GAE, LR/clip
# schedule, early stop or initial weights) and keeps every tensor's shape, so members share one compiled program.
# SHAPE_KEYS change shapes or the program itself; every other key is shared by the members of one population.
VARY_KEYS = ("lr", "lr_floor", "anneal_lr", "clip_coef", "anneal_clip", "ent_coef", "vf_coef", "max_grad_norm",
             "gamma", "gae_lambda", "target_kl", "init_log_std", "ortho_init")
SHAPE_KEYS = ("n_envs", "n_steps", "n_minibatches", "hidden_sizes", "pi_sizes", "vf_sizes", "policy", "encoder",
              "activation", "shared_trunk", "use_sde", "env", "recurrent", "recurrent_size",
              "algo", "n_epochs", "optimizer")


def configs_root() -> Path | None:
    """The folder of the tuned YAML configs: the installed package's data, or a source checkout's top-level configs/."""
    here = Path(__file__).resolve().parent
    for root in (here / "configs", here.parent / "configs"):
        if root.is_dir():
            return root
    return None


def config_names() -> list[str]:
    """The tuned configs reachable by name (``--config ppo/lunarlander``)."""
    root = configs_root()
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml")) if root else []


def resolve_config_path(name: str | Path) -> Path:
    """``name`` itself when it is a file; else the tuned config of that name (``ppo/lunarlander``, also spelled
    ``configs/ppo/lunarlander.yaml`` from any directory). Raises a one-line UserError naming the choices."""
    path = Path(name)
    if path.is_file():
        return path
    root = configs_root()
    stem = path.as_posix().removeprefix("./").removeprefix("configs/")
    if root is not None:
        candidate = root / (stem if path.suffix in (".yaml", ".yml") else f"{stem}.yaml")
        if candidate.is_file():
            return candidate
    names = ", ".join(config_names()) or "none installed"
    if path.suffix in (".yaml", ".yml"):
        raise UserError(f"config file {str(name)!r} not found; pass an existing YAML file to --config or a tuned "
                        f"config name: {names}")
    raise UserError(f"unknown config name {str(name)!r}; the tuned configs are: {names} (or pass a YAML file)")
