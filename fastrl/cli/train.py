"""``fastrl train`` (and ``python -m fastrl.train``): parse the config, run it, print the result line. Torch is
imported only once the run starts, so ``--help`` answers without it."""
from __future__ import annotations

import signal
import sys

from fastrl.cli.flags import config_from_cli
from fastrl.config import UserError
from fastrl.errors import print_line
from fastrl.run.session import run
from fastrl.signals import (STARTUP_INTERRUPT, Terminated, install_startup_interrupt, restore_handlers,
                            stopped_during_startup)


def main(argv: list[str] | None = None, prog: str = "python -m fastrl.train") -> int:
    """The command line: 0 when the run ends (its budget, stop_at_return, SIGTERM), 2 with one line for a user
    error, 130 with one line for Ctrl-C at any moment (mid-run after the clean stop that saves the run)."""
    previous = {}
    try:
        previous = install_startup_interrupt()
        try:
            cfg, resume_state = config_from_cli(argv, prog=prog)
            summary = run(cfg, resume_state)
        except UserError as e:  # an env's failure (an EnvError) carries the env's own traceback first
            print_line(getattr(e, "trace", "") + f"fastrl: error: {e}")
            return 2
        where = f": {summary['run_dir']} is saved; continue it with --resume" if summary.get("run_dir") else ""
        if summary.get("stop_signal") == "SIGINT" or STARTUP_INTERRUPT["signal"] == signal.SIGINT:
            print(f"fastrl: interrupted (Ctrl-C) at step {summary.get('total_steps', 0)}{where}", file=sys.stderr)
            return 130
        if summary.get("stop_signal"):
            print(f"fastrl: stopped by {summary['stop_signal']} at step {summary.get('total_steps', 0)}{where}",
                  file=sys.stderr)
    except KeyboardInterrupt:
        print("fastrl: interrupted (Ctrl-C)", file=sys.stderr)
        STARTUP_INTERRUPT["cut_imports"] = True
        return 130
    except (Terminated, Exception) as e:
        # A Ctrl-C that cut an import short (numpy's, inside a library that caught it) surfaces as another error.
        signum = e.signum if isinstance(e, Terminated) else STARTUP_INTERRUPT["signal"]
        if signum is None:
            raise
        print(f"fastrl: {stopped_during_startup(signum)}", file=sys.stderr)
        STARTUP_INTERRUPT["cut_imports"] = True
        return 128 + signum
    finally:
        restore_handlers(previous)
    if summary.get("run_dir"):
        shown = {k: summary[k]
                 for k in ("total_steps", "wall_time_s", "sps", "episode_return_mean", "eval_return_mean")}
        shown.update({k: v for k, v in summary.items() if k.startswith("perf/")})  # CPU, memory, GPU: run figures
        shown["run_dir"] = summary["run_dir"]
        if "variants" in summary:  # per variant, over its seeds: never a mean across variants
            del shown["episode_return_mean"], shown["eval_return_mean"]
            shown["variants"] = {v["variant"]: {key: {s: v[key][s] for s in ("mean", "median", "iqm")}
                                                for key in ("episode_return_mean", "eval_return_mean") if key in v}
                                 for v in summary["variants"]}
        from fastrl.run.console import print_result
        from fastrl.run.storage import strict_json
        if not print_result(strict_json(shown, indent=None)):
            return 1
    return 0
