"""What a run says on stderr besides progress: its run directory, and each adjustment it made to what was asked,
once, in one line (``fastrl: note: ...``). ``quiet`` silences both."""
from __future__ import annotations

import os
import sys

from fastrl.config import FIELDS, Config
from fastrl.errors import print_line

# Settings only EnvPool's Atari envs read.
ATARI_KEYS = ("frame_skip", "frame_stack", "noop_max", "episodic_life", "clip_atari_reward")


def say(cfg: Config, message: str) -> None:
    if not cfg.quiet:
        print_line(f"fastrl: {message}")


def print_result(text: str) -> bool:
    """Print a command's result line on stdout. A reader that closed the pipe (``fastrl train ... | head -0``) gets
    no traceback: stdout is pointed at /dev/null (so the interpreter's exit flush cannot fail again) and this returns
    False (the caller exits 1, as Python's docs advise for SIGPIPE). The run itself is saved before this line."""
    try:
        print(text, flush=True)
        return True
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return False


def adjustments(cfg: Config, trainer) -> list[str]:
    """One line per adjustment made to ``cfg``: a budget rounded to whole iterations, settings the env ignores, a
    stop rule that may end the run before its budget."""
    from fastrl.envs.registry import is_atari, is_process_local, resolve_env
    notes = []
    per_iteration = getattr(trainer, "steps_per_iteration", None)
    if per_iteration:  # PPO/A2C run whole iterations (a population's figures are per member)
        members = cfg.population_size
        actual, per_iteration = trainer.total_steps // members, per_iteration // members
        if actual != cfg.total_steps:
            notes.append(f"total_steps={cfg.total_steps:,} runs as {actual:,}: whole iterations of {per_iteration:,} "
                         f"steps (n_envs x n_steps)")
    if is_process_local(cfg.env) and cfg.env.startswith("vector:"):
        notes.append(f"env is your vector env: n_envs={cfg.n_envs} from it, and no evaluation on separate envs "
                     "(eval_episodes=0; the figures are its training episodes)")
    atari = cfg.env_backend != "gymnasium" and is_atari(resolve_env(cfg.env)[0])
    ignored = [] if atari else [name for name in ATARI_KEYS if getattr(cfg, name) != FIELDS[name].default]
    if ignored:
        flags = ", ".join("--" + name.replace("_", "-") for name in ignored)
        notes.append(f"{flags} {'applies' if len(ignored) == 1 else 'apply'} to Atari envs only; {cfg.env} ignores "
                     f"{'it' if len(ignored) == 1 else 'them'}")
    if cfg.stop_at_return:
        who = "every member's" if cfg.population_size > 1 else "the"
        what = "periodic evaluation (or last-100-episode mean)" if cfg.eval_interval else "last-100-episode mean"
        notes.append(f"stops early once {who} {what} return reaches {cfg.stop_at_return:g} "
                     "(--stop-at-return 0 trains the whole budget)")
    return notes
