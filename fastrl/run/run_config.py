"""The one way a run's ``Config`` is built, whatever the door: ``fastrl train`` flags, ``--config FILE``,
``fastrl.train(config=...)``, ``fastrl.train(**keys)``, ``fastrl tune``'s base and ``fastrl.Collector``.

Layers, lowest first; each key takes the value of the highest layer that sets it:

1. the dataclass defaults (``Config()``), then ``ALGO_DEFAULTS[algo]``;
2. the env's base: its tuned config (``TUNED_CONFIGS``, as the RL Zoo's ``train.py`` picks one); else, for PPO on an
   env without one, the general default of its action kind (``GENERAL_DEFAULTS``); else nothing;
3. the user's YAML file (``--config FILE|NAME``, ``config="x.yaml"``): its keys, ``YAML_IGNORED`` dropped;
4. the user's ``config=`` object: a dict's keys; a ``Config``'s fields that differ from ``Config()``;
5. flags and keywords.

So ``--env HalfCheetah-v4``, a YAML file holding ``env: HalfCheetah-v4``, ``config=Config(env="HalfCheetah-v4")`` and
``fastrl.train(env="HalfCheetah-v4")`` all train with ``configs/ppo/halfcheetah.yaml``. Input that sets every key (a
saved ``config.yaml``, a checkpoint's config) has nothing under it. ``algo`` and ``env`` pick the base from the
layers above it. With ``resume``, the checkpoint's config replaces layers 1-2 (see ``build_config``).
"""
from __future__ import annotations

import os

from fastrl.config import (CODE_KEYS, FIELDS, Config, UserError, _coerce, brief, config_keys, load_yaml,
                           make_config)
from fastrl.defaults import GENERAL_DEFAULTS, TUNED_CONFIGS, YAML_IGNORED

# What a resume keeps: the model and its inputs (architecture, env, observation/action spaces, normalizers, the
# optimizer's state) and the batch shape that the budget's iteration count is measured in.
RESUME_FIXED = ("algo", "env", "n_seeds", "vary", "hidden_sizes", "activation", "shared_trunk", "use_sde",
                "encoder", "normalize_obs", "normalize_reward", "frame_skip", "frame_stack", "optimizer", "n_envs",
                "n_steps", "per_rank")


def config_layer(config: str | os.PathLike | dict | Config | None, where: str) -> tuple[str | None, dict]:
    """Layers 3-4 as ``(yaml_path or None, {key: raw value})``: what ``config`` sets (see ``build_config``)."""
    if isinstance(config, Config):  # it sets the fields that differ from Config()
        default = Config().to_dict()
        return None, {key: value for key, value in config.to_dict().items() if value != default[key]}
    if isinstance(config, dict):
        values, yaml_path = config, None
    elif isinstance(config, (str, os.PathLike)):
        yaml_path = str(config)
        values = {key: value for key, value in load_yaml(yaml_path).items()
                  if key.replace("-", "_") not in YAML_IGNORED}
    elif config is None:
        return None, {}
    else:
        raise UserError(f"config must be a YAML path, a dict or a fastrl Config, got {type(config).__name__}")
    return yaml_path, config_keys(values, yaml_path or where)


def build_config(given: dict | None = None, config: str | os.PathLike | dict | Config | None = None,
                 where: str = "command-line flags") -> tuple[Config, dict | None]:
    """The run's ``Config`` from the layers in this module's docstring, coerced and validated, and the checkpoint
    state to resume from (None unless ``resume`` is set). ``given``: flags or keywords (raw values); ``config``: a
    YAML path or tuned config's name, a dict of keys, or a ``Config`` (its fields that differ from ``Config()``).

    A resume is a continuation or a refusal: the checkpoint's config is the base, and keys that change what
    ``RESUME_FIXED`` lists, or a budget the checkpoint has already passed, are one-line UserErrors; the checkpoint's
    env is used only if it imports no code (else the user must name it: see ``checkpoint.checkpoint_config``)."""
    yaml_path, user = config_layer(config, where)
    user = {**user, **{key.replace("-", "_"): value for key, value in (given or {}).items()}}
    if user.get("resume"):
        return _resumed(user, where)
    under, origin = _base_layer(user, where)
    if yaml_path:
        origin = f"config {yaml_path}" + (f" over {origin}" if origin else "")
    cfg = make_config({**under, **user}, where=where)
    cfg.origin = origin
    return cfg, None


def _resumed(user: dict, where: str) -> tuple[Config, dict]:
    from fastrl.run.checkpoint import checkpoint_config, load_checkpoint
    target = user["resume"]
    state = load_checkpoint(target)
    # The checkpoint's code names (env, policy) are used only if the user names them too; what the user passed is an
    # override, judged below against the checkpoint's own.
    saved = checkpoint_config(state, f"checkpoint {target}", user).to_dict()
    saved.update({key: state["config"][key] for key in CODE_KEYS if key in state["config"]})
    changed = [key for key in RESUME_FIXED if key in user and _coerce(key, user[key]) != saved[key]]
    if changed:
        diffs = ", ".join(f"{k} {brief(saved[k])} -> {brief(_coerce(k, user[k]))}" for k in changed)
        raise UserError(f"--resume {target} would change {diffs}; a resume continues the same model, env and batch "
                        f"shape: drop those flags, or start a new run with them (--config <run>/config.yaml)")
    base = {**saved, "run_dir": ""}  # a moved or copied run continues where it now lies (see rundir.resume_run_dir)
    cfg = make_config({**base, **user}, where=where)
    done = int(state.get("global_step", 0))
    if "members" in state:  # a population's checkpoint counts the steps of all members; the budget is per member
        done //= max(len(state["members"]), 1)
    if cfg.total_steps < done:
        raise UserError(f"--resume {target}: its checkpoint is at step {done}, past total_steps={cfg.total_steps}; "
                        f"pass --total-steps above {done} to train on")
    return cfg, state


def _base_layer(user: dict, where: str) -> tuple[dict, str]:
    """Layer 2 under the user's keys, as ``(values, origin)``; ``origin`` says which, for the run's first line."""
    if set(FIELDS) - set(YAML_IGNORED) <= set(user):  # every key given: nothing lies under it
        return {}, ""
    algo, env = str(user.get("algo", Config.algo)), str(user.get("env", Config.env))
    tuned = TUNED_CONFIGS.get("impala" if algo == "appo" else algo, {})
    name = tuned.get(env) or tuned.get(_env_kind(env, user))
    if name:
        origin = f"the tuned config {name}" + (" (the embedded default)" if name == "ppo/cartpole" else "")
        values = load_yaml(name)
        # The embedded default's n_minibatches stays a count, as Config() has always had it
        if algo == "ppo" and name != "ppo/cartpole":
            values.update(_same_minibatch(values, user))
        return values, origin
    if algo != "ppo":
        return {}, f"the {algo} defaults (no tuned {algo} config for {env})"
    from fastrl.envs.batched import probe_env
    # Only what the env is built from: the other values are checked once, against the default they choose.
    env_keys = ("env", "env_backend", "frame_skip", "frame_stack", "noop_max", "episodic_life", "clip_atari_reward")
    _, dtype, action_spec = probe_env(make_config({k: v for k, v in user.items() if k in env_keys}, where=where))
    kind = action_spec.kind  # discrete (MultiDiscrete and MultiBinary included) or continuous
    under = {**GENERAL_DEFAULTS[kind], **_same_minibatch(GENERAL_DEFAULTS[kind], user)}
    if not dtype.is_floating_point:  # uint8 frames, Discrete observations: scaled or one-hot encoded in the model
        under["normalize_obs"] = False
    return under, f"the general PPO default for {kind} actions (CleanRL's settings; no tuned config ships for {env})"


def _same_minibatch(base: dict, user: dict) -> dict:
    """``n_minibatches`` that keeps ``base``'s minibatch size when the user changes its rollout shape (n_envs,
    n_steps) but not n_minibatches: the most minibatches of at least that size that divide the new batch (at least
    1)."""
    if "n_minibatches" in user or not {"n_envs", "n_steps"} & set(user) or "n_minibatches" not in base:
        return {}
    shape = {key: _coerce(key, user.get(key, base.get(key, getattr(Config, key)))) for key in ("n_envs", "n_steps")}
    minibatch = base.get("n_envs", Config.n_envs) * base.get("n_steps", Config.n_steps) // base["n_minibatches"]
    batch = shape["n_envs"] * shape["n_steps"]
    return {"n_minibatches": max(d for d in range(1, max(batch // max(minibatch, 1), 1) + 1) if batch % d == 0)}


def _env_kind(env: str, user: dict) -> str | None:
    """``atari`` or ``procgen`` for an EnvPool id of that kind (the env backend permitting), else None."""
    if ":" in env or user.get("env_backend") in ("gymnasium", "torch"):
        return None
    from fastrl.envs.registry import is_atari, is_procgen
    return "atari" if is_atari(env) else "procgen" if is_procgen(env) else None

