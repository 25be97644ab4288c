"""The ``fastrl`` console script: ``fastrl train|tune|eval|export|plot|bench`` (``train``: ``fastrl.cli.train``, also
``python -m fastrl.train``; ``tune``: ``fastrl.cli.tune``). Nothing heavy is imported before a command runs, so
``--help`` answers at once."""
from __future__ import annotations

import json
import sys

from fastrl.errors import ArgParser, UserError

USAGE = """usage: fastrl {train,tune,eval,export,plot,bench} ... | fastrl --version

  fastrl train [--config FILE|NAME] [--algo ppo] [--env ID] [--n-envs N] ...   train (see fastrl train --help)
  fastrl tune --space FILE [--config FILE|NAME] [--trials N] [--batch B] [--trial-seeds S] [--trial-steps N]
              [--dir DIR] [train flags ...]      search hyperparameters with Optuna (pip install "fastrl[tune]");
                                                 DIR/best.yaml is the best trial's --config (see fastrl tune --help)
  fastrl eval CKPT [--episodes N] [--seeds K] [--stochastic] [--device DEV] [--env ID]   evaluate a checkpoint
  fastrl export RUN --out FILE [--format onnx|torchscript]                    the policy for onnxruntime / libtorch
  fastrl plot RUN [RUN ...] [--out FILE]                                       learning curves to a PNG
  fastrl bench [PART ...] [--quick] [--out-dir DIR]                            run benchmarks (see fastrl bench --help)
  fastrl bench --profile gpu [--dry-run]                                       the one-GPU profile, under 8 minutes
"""


def eval_main(argv: list[str]) -> int:
    parser = ArgParser(prog="fastrl eval", description="Evaluate a checkpoint's policy on fresh envs (its mode, or "
                                                       "sampled actions with --stochastic), within step caps.")
    parser.add_argument("checkpoint", help="checkpoint file or run directory (its newest checkpoint)")
    parser.add_argument("--episodes", type=int, default=10, help="episodes per seed (default 10)")
    parser.add_argument("--seeds", type=int, default=3, help="number of eval seeds (default 3)")
    parser.add_argument("--device", default="cpu", help="device for the policy (default cpu)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--member", type=int, default=None, help="which agent of a population run (--n-seeds/--vary)")
    parser.add_argument("--env", default=None, help="the env to evaluate on (required when the run's env is a "
                        "module:Name, which a checkpoint alone never makes fastrl import)")
    parser.add_argument("--policy", default=None, help="the run's custom policy class, module:ClassName or "
                        "path/to/file.py:ClassName (required when the run had one: a checkpoint alone never makes "
                        "fastrl import it)")
    rule = parser.add_mutually_exclusive_group()
    rule.add_argument("--stochastic", dest="deterministic", action="store_false", default=None,
                      help="sample actions (default: the run's eval_deterministic, normally the policy's mode)")
    rule.add_argument("--deterministic", dest="deterministic", action="store_true", default=None,
                      help="the policy's mode (argmax / mean)")
    parser.add_argument("--max-episode-steps", type=int, default=None,
                        help="cut an episode after this many steps (default: the run's eval_max_episode_steps, 27,000)")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="cut the evaluation after this many env steps, all envs together (default: the run's "
                             "eval_max_steps, 1,000,000)")
    args = parser.parse_args(argv)  # --help exits here, before torch is imported
    if any(value is not None and value <= 0 for value in (args.max_episode_steps, args.max_steps)):
        raise UserError("--max-episode-steps and --max-steps must be positive")
    from fastrl.api import load
    from fastrl.run.evaluate import EvaluationStopped
    from fastrl.signals import install_stop_handlers, restore_handlers
    stop = {"stop": None}
    previous_handlers = install_stop_handlers(stop)
    try:
        # --env to load (a saved module:Name env needs it) and to evaluate (its spaces checked against the agent's)
        agent = load(args.checkpoint, env=args.env, device=args.device, member=args.member, policy=args.policy)
        returns = agent.evaluate(args.env, args.episodes, args.seeds, deterministic=args.deterministic,
                                 max_episode_steps=args.max_episode_steps, max_steps=args.max_steps,
                                 should_stop=lambda: stop["stop"] is not None, label="evaluation")
    except EvaluationStopped:
        print("fastrl eval: stopped by a signal before the episodes finished", file=sys.stderr)
        return 130
    finally:
        restore_handlers(previous_handlers)
    mean, std, env = float(returns.mean()), float(returns.std()), agent.config.env
    from fastrl.run.console import print_result
    if args.json:
        line = json.dumps({"env": env, "episodes": returns.size, "return_mean": mean, "return_std": std,
                           "returns": returns.tolist()})
    else:
        line = f"{env}: return {mean:.2f} ± {std:.2f} over {args.seeds} seeds x {args.episodes} episodes"
    return 0 if print_result(line) else 1


def export_main(argv: list[str]) -> int:
    parser = ArgParser(prog="fastrl export", description="Write a run's deterministic policy of raw observations (its "
                       "observation normalizer, pixel scaling and action clamping inside) for onnxruntime or libtorch "
                       "alone: what fastrl.load(RUN).predict(obs, deterministic=True) gives. Inputs: obs (a Dict "
                       "observation: one per key), batch first; output: action.")
    parser.add_argument("run", help="run directory (its newest checkpoint) or checkpoint file")
    parser.add_argument("--format", default="onnx", metavar="onnx|torchscript",
                        help="onnx (default; pip install 'fastrl[export]') or torchscript (torch.jit.load runs it)")
    parser.add_argument("--out", required=True, help="the file to write")
    parser.add_argument("--member", type=int, default=None, help="which agent of a population run (--n-seeds/--vary)")
    parser.add_argument("--policy", default=None, help="the run's custom policy class, module:ClassName or "
                        "path/to/file.py:ClassName (required when the run had one)")
    args = parser.parse_args(argv)  # --help exits here, before torch is imported
    from fastrl.api import load
    from fastrl.export import export_target
    export_target(args.out, args.format)  # before the checkpoint loads
    path = load(args.run, member=args.member, policy=args.policy).export(args.out, args.format)
    from fastrl.run.console import print_result
    return 0 if print_result(f"wrote {path} ({args.format})") else 1


def bench_main(argv: list[str]) -> int:
    """The benchmarks live in a source checkout's ``benchmarks/`` folder, beside ``fastrl/``: they are not installed
    (the package installs the top-level name ``fastrl`` only), so an install from a checkout (``pip install -e .``)
    finds them there."""
    from pathlib import Path
    checkout = Path(__file__).resolve().parents[2]
    if not (checkout / "benchmarks" / "run.py").is_file():
        raise UserError("the benchmarks come with a source checkout, not the installed package: clone the "
                        "repository, pip install -e . there and run fastrl bench")
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    from benchmarks.run import main as run_benchmarks
    return run_benchmarks(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        import fastrl
        print(f"fastrl {fastrl.__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command == "train":
        from fastrl.cli.train import main as train_main
        return train_main(rest, prog="fastrl train")
    try:
        if command == "plot":  # its errors: one line, as every command's
            from fastrl.run.plot import plot_main
            return plot_main(rest)
        if command == "tune":
            from fastrl.cli.tune import tune_main
            return tune_main(rest)
        if command in ("eval", "export", "bench"):
            return {"eval": eval_main, "export": export_main, "bench": bench_main}[command](rest)
    except UserError as e:
        print(f"fastrl {command}: error: {e}", file=sys.stderr)
        return 2
    print(f"fastrl: error: unknown command {command!r}; use train, tune, eval, export, plot or bench", file=sys.stderr)
    return 2


def entry() -> int:
    """The installed ``fastrl`` command and ``python -m fastrl``: ``main``, with ``fastrl train`` run as the process's
    whole work (``fastrl.signals.run_as_process``: a Ctrl-C that cut the start-up short exits without teardown)."""
    if sys.argv[1:2] == ["train"]:
        from fastrl.signals import run_as_process
        return run_as_process(main)
    return main()


