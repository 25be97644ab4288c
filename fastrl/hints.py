"""The "did you mean" of an unknown config key or flag, and of a Stable-Baselines3 policy name: one table of the names
CleanRL, Stable-Baselines3, the RL Zoo and Optuna users bring (``ALIASES``), then typos of fastrl's own names.

A typo suggestion needs both a small edit distance and the same first letter, so a word that merely looks alike
(``callback`` and ``rollback``, ``n_trials`` and ``env_threads``) is never offered as the name meant. Imports nothing
of fastrl: the config, the CLI and fastrl tune all read it.
"""
from __future__ import annotations

_MINIBATCH = "--n-minibatches (the minibatch size is n_envs * n_steps / n_minibatches)"
_RECURRENT = "--recurrent lstm (or gru) with algo ppo, a2c, impala or appo; --recurrent-size sets the width"
_ONE_LSTM = "fastrl's recurrent policy is one LSTM (or GRU) layer that actor and critic share: --recurrent lstm"
_MASKING = ("no flag: an observation Dict's action_mask key or the env's action_masks() method masks the policy "
            "(algo ppo or a2c)")
_CALLBACKS = "callbacks= (an argument of fastrl.train and Agent.learn: a list of callables (metrics, run) -> bool)"

# Another library's name (lower case, words joined by "-") -> what fastrl calls it: a flag ("--lr", "--device cuda",
# "--x (why)"), read as a config key where a key was given, or, for what fastrl lacks, a sentence saying so.
ALIASES = {
    # CleanRL
    "num-envs": "--n-envs", "env-id": "--env", "gym-id": "--env", "learning-rate": "--lr",
    "total-timesteps": "--total-steps", "num-steps": "--n-steps", "update-epochs": "--n-epochs",
    "num-minibatches": "--n-minibatches", "minibatch-size": _MINIBATCH, "norm-obs": "--normalize-obs",
    "norm-reward": "--normalize-reward", "torch-deterministic": "--deterministic", "cuda": "--device cuda",
    "track": "--wandb online", "wandb-project-name": "--wandb-project", "exp-name": "--run-dir",
    "save-model": "--checkpoint-interval (the final checkpoint is always written)", "num-actors": "--n-actors",
    # Stable-Baselines3 and the RL Zoo
    "n-timesteps": "--total-steps", "timesteps": "--total-steps", "batch-size": _MINIBATCH,
    "clip-range": "--clip-coef", "clip-range-vf": "--clip-vloss", "normalize-advantage": "--norm-adv",
    "normalize": "--normalize-obs (and --normalize-reward: SB3's VecNormalize)", "entropy-coef": "--ent-coef",
    "value-coef": "--vf-coef", "lambda": "--gae-lambda", "env-name": "--env",
    "net-arch": "--hidden-sizes (SB3's dict(pi=[...], vf=[...]): pi_sizes and vf_sizes)",
    "hidden-size": "--hidden-sizes", "activation-fn": "--activation", "log-std-init": "--init-log-std",
    "policy-kwargs": ("fastrl has no policy_kwargs: its keys are config keys here, net_arch -> hidden_sizes (or "
                      "pi_sizes and vf_sizes), activation_fn -> activation, log_std_init -> init_log_std, ortho_init, "
                      "share_features_extractor -> shared_trunk"),
    "share-features-extractor": "--shared-trunk",
    "lstm-hidden-size": "--recurrent-size (with --recurrent lstm)", "n-lstm-layers": _ONE_LSTM,
    "shared-lstm": _ONE_LSTM, "enable-critic-lstm": _ONE_LSTM, "use-masking": _MASKING,
    "n-eval-episodes": "--eval-episodes", "eval-freq": "--eval-interval", "n-eval-envs": "--eval-seeds",
    "save-freq": "--checkpoint-interval", "verbose": "--quiet (or --progress false)",
    "tensorboard-log": "--tensorboard (the events go to run_dir/tb)",
    "stats-window-size": "no window to set: the episode statistics always cover the last 100 episodes",
    "env-kwargs": "no env_kwargs: pass fastrl.train an env factory, env=lambda: gymnasium.make(id, **kwargs)",
    "n-stack": "--frame-stack", "callback": _CALLBACKS, "callbacks": _CALLBACKS,
    # Optuna / the RL Zoo's tuner (fastrl tune)
    "n-trials": "--trials (fastrl tune)", "n-startup-trials": "--startup-trials (fastrl tune)",
    "n-evaluations": "--evals (fastrl tune)", "study-name": "--dir (fastrl tune: one study per directory)",
}

# Stable-Baselines3's policy and algorithm class names, given as fastrl's ``policy`` (a module:ClassName of the user's
# own nn.Module actor-critic) -> what fastrl does instead.
POLICY_NAMES = {
    "MlpPolicy": "the built-in MLP actor-critic is the default: drop policy (--hidden-sizes sets its widths)",
    "CnnPolicy": "image observations get a CNN by default (encoder auto, or --encoder nature_cnn): drop policy",
    "MultiInputPolicy": "Dict observations get the built-in multi-input model by default: drop policy",
    "MlpLstmPolicy": _RECURRENT, "CnnLstmPolicy": _RECURRENT, "MultiInputLstmPolicy": _RECURRENT,
    "RecurrentPPO": _RECURRENT, "MaskablePPO": _MASKING,
}
_SB3_MODULES = ("stable_baselines3", "sb3_contrib")
_SB3_CLASS = ("policy takes your own nn.Module actor-critic class (module:ClassName, built as cls(observation_shape, "
              "action_spec, config)), not a Stable-Baselines3 class")


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance with adjacent transpositions (optimal string alignment)."""
    previous, current = None, list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        before, previous, current = previous, current, [i] + [0] * len(b)
        for j, y in enumerate(b, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y))
            if before is not None and i > 1 and j > 1 and x == b[j - 2] and a[i - 2] == y:
                current[j] = min(current[j], before[j - 2] + 1)
    return current[-1]


def close_names(name: str, candidates) -> list[str]:
    """The candidates ``name`` is a typo of, nearest first: the same first letter and at most 2 edits (1 for names
    of up to 4 letters), ignoring case and ``-`` / ``_``."""
    def plain(text: str) -> str:
        return text.lower().replace("-", "").replace("_", "")
    typed = plain(name)
    limit = 1 if len(typed) <= 4 else 2
    scored = sorted((edit_distance(typed, plain(c)), c) for c in candidates if plain(c)[:1] == typed[:1])
    return [c for distance, c in scored if distance <= limit]


def _phrase(hint: str, as_key: bool) -> str:
    """A name meant (a flag, or ``callbacks=``) as ``did you mean ...?``, a flag as config keys read it when
    ``as_key`` (``--device cuda`` -> ``device=cuda``, ``--n-minibatches (...)`` -> ``n_minibatches (...)``); a
    sentence as it is."""
    if not hint.startswith(("--", "callbacks=")):
        return hint
    if as_key and hint.startswith("--"):
        flag, space, rest = hint.partition(" ")
        hint = flag.removeprefix("--").replace("-", "_") + ("=" if rest and not rest.startswith("(") else space) + rest
    return f"did you mean {hint}?"


def key_hint(name: str, keys) -> str:
    """The end of an unknown config key's message: ``did you mean lr?``, what fastrl lacks, or where to look."""
    alias = ALIASES.get(name.lower().replace("_", "-"))
    if alias:
        return _phrase(alias, as_key=True)
    close = close_names(name, keys)[:3]
    return f"did you mean {', '.join(close)}?" if close else "see --help for the valid keys"


def flag_hint(flag: str, flags) -> str:
    """The end of an unknown flag's message (``flags``: the valid ones without ``--``)."""
    key = flag.lstrip("-").lower().replace("_", "-")
    if key in ALIASES:
        return _phrase(ALIASES[key], as_key=False)
    close = close_names(key, flags)[:1]
    return f"did you mean --{close[0]}?" if close else "see --help for the flags"


def policy_hint(policy: str) -> str | None:
    """What fastrl does instead of a Stable-Baselines3 policy or algorithm named as ``policy``, or None."""
    module, _, name = policy.rpartition(":")
    if module and module.split(".")[0] not in _SB3_MODULES:
        return None  # a class of the user's own module, whatever its name
    return POLICY_NAMES.get(name.rsplit(".", 1)[-1]) or (_SB3_CLASS if module else None)
