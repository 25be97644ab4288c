"""The command line's flags: every ``Config`` field as a ``--flag`` (grouped in ``--help`` as in ``Config``), parsed
into raw overrides that ``fastrl.run.run_config.build_config`` layers like every other door's."""
from __future__ import annotations

import argparse
import dataclasses

from fastrl.config import _TYPES, FIELDS, Config, UserError, algo_default, brief
from fastrl.errors import ArgParser
from fastrl.defaults import ALGO_DEFAULTS, config_names
from fastrl.hints import flag_hint
from fastrl.run.run_config import build_config


# --help groups: (title, the field that opens the group in Config's order). A field belongs to the group opened last
# above it, unless HELP_GROUP_OF names another.
HELP_GROUPS = (("run", "algo"), ("environment", "env_backend"), ("model", "hidden_sizes"),
               ("algorithm (every algorithm)", "n_steps"), ("PPO", "n_epochs"), ("IMPALA / APPO", "n_actors"),
               ("logging, checkpoints, evaluation", "log_interval"), ("guards", "rollback"))
HELP_GROUP_OF = {"env": "environment", "n_envs": "environment", "resume": "run"}


def build_parser(prog: str = "fastrl train") -> argparse.ArgumentParser:
    """Every Config field as a flag, grouped as in Config. Booleans also take no value (``--progress``) and have a
    ``--no-`` form; lists take several values, commas or brackets."""
    parser = ArgParser(
        prog=prog, allow_abbrev=False, usage="%(prog)s [--config FILE|NAME] [--FLAG VALUE ...]",
        description="Train an agent. Flags override --config, which overrides the env's tuned config (when one ships), "
                    "which overrides the defaults. A boolean flag alone "
                    "means true (--progress; --no-progress or --progress false for false). Lists: --hidden-sizes "
                    "128 128, 128,128 or [128,128].")
    parser.add_argument("--config", default=None, metavar="FILE|NAME",
                        help="YAML file with config keys, or the name of a tuned config shipped with fastrl: "
                             + ", ".join(config_names()))
    groups = {title: parser.add_argument_group(title) for title, _ in HELP_GROUPS}
    starts = {first: title for title, first in HELP_GROUPS}
    current = HELP_GROUPS[0][0]
    for f in dataclasses.fields(Config):
        current = starts.get(f.name, current)
        group = groups[HELP_GROUP_OF.get(f.name, current)]
        kind = _TYPES[f.name]
        default = algo_default("ppo", f.name)  # Config()'s: PPO takes the field defaults
        per_algo = "".join(f"; {algo}: {values[f.name]}" for algo, values in ALGO_DEFAULTS.items()
                           if f.name in values and values[f.name] != default)
        help_text = f"{f.metadata['help']} (default: {default}{per_algo})"
        if f.metadata.get("choices"):
            help_text += f" [choices: {', '.join(f.metadata['choices'])}]"
        flag = "--" + f.name.replace("_", "-")
        if kind is dict:
            group.add_argument(flag, dest=f.name, default=None, action="append", metavar="KEY=V1,V2", help=help_text)
        elif kind is bool:
            group.add_argument(flag, dest=f.name, default=None, nargs="?", const="true", metavar="BOOL", help=help_text)
            group.add_argument("--no-" + f.name.replace("_", "-"), dest=f.name, action="store_const", const="false",
                               help=argparse.SUPPRESS)
        else:
            group.add_argument(flag, dest=f.name, default=None, nargs="+" if kind is list else None, help=help_text,
                               metavar=kind.__name__.upper())
    return parser


def _unrecognized(extras: list[str], also: tuple = ()) -> UserError:
    """One line for the first argument no flag took: the flag meant, when a spelling of it is known (``also``: the
    command's own flags besides the config's, without ``--``)."""
    token = next((t for t in extras if t.startswith("-")), extras[0])
    if not token.startswith("-"):
        return UserError(f"unrecognized argument {brief(token)}; flags take the form --name value (see --help)")
    name = token.split("=", 1)[0]
    flags = sorted({n.replace("_", "-") for n in FIELDS} | {"config", *also})
    return UserError(f"unrecognized flag {name}; {flag_hint(name, flags)}")


def parse_cli_overrides(argv: list[str] | None = None, prog: str = "fastrl train",
                        also: tuple = ()) -> tuple[dict, str | None]:
    """The flags the user actually passed (as raw strings) and the ``--config`` path or name (``also``: the
    command's own flags, offered by an unknown flag's hint)."""
    args, extras = build_parser(prog).parse_known_args(argv)
    if extras:
        raise _unrecognized(extras, also)
    overrides = {k: " ".join(v) if _TYPES[k] is list else v  # a list flag's words, as _coerce reads them
                 for k, v in vars(args).items() if k != "config" and v is not None}
    return overrides, args.config


def config_from_cli(argv: list[str] | None = None, prog: str = "fastrl train") -> tuple[Config, dict | None]:
    """The command line's door: ``build_config`` of the flags and ``--config``."""
    overrides, yaml_path = parse_cli_overrides(argv, prog)
    return build_config(overrides, yaml_path, where="command-line flags")
