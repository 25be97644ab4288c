"""Run fastrl's benchmark suite: ``python -m benchmarks.run [PART ...] [--quick]`` (also ``fastrl bench``).

Parts, each one script writing JSON under ``<out-dir>/<machine-tag>/`` (``--out-dir``, default ``bench-results`` in
the current directory; ``--out-dir benchmarks/results`` updates the committed results, which nothing else touches):
  envs        raw env steps/s, EnvPool against Gymnasium vector envs        benchmarks/envs_sps.py
  kernels     GAE / V-trace against loops, TorchRL and the memory-copy limit  benchmarks/kernels.py
  rollout     collect() sync/async against raw EnvPool sync/async; end to end  benchmarks/rollout_sps.py
              one rollout step eager / compiled / env op / fused torch env     benchmarks/rollout_step.py
  end-to-end  PPO training steps/s against SB3; DDP scaling over 1-2 ranks     benchmarks/train_sps.py, ddp_scaling.py
  peers       learning curves and time to threshold, fastrl against SB3        benchmarks/peers.py --part peers
  learning    fastrl at the zoo's step budgets beside the zoo's scores         benchmarks/peers.py --part learning
  impala      IMPALA actor-learner throughput (not in the default set)         benchmarks/impala_sps.py
No part means all but impala. ``train_sps`` is an alias of end-to-end. A part that fails is reported and the rest
still run (exit status 1). Afterwards ``benchmarks/report.py`` writes ``<out-dir>/RESULTS.md`` and the plots.
``--quick`` passes each script its smoke profile (peers + learning: about 5 minutes on the busy 2-core dev box;
the whole default set was not timed there).

``--profile gpu`` runs ``benchmarks/gpu_profile.py`` on its own (kernels against the device's bandwidth, PPO on
Atari and CartPole eager / compiled / CUDA graphs; one GPU, under 8 minutes); ``--profile gpu --dry-run`` runs the
same code on CPU with tiny sizes, in under a minute.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from pathlib import Path

from fastrl.errors import ArgParser, UserError

# part -> [(module, extra argv), ...]
PARTS = {
    "envs": [("benchmarks.envs_sps", [])],
    "kernels": [("benchmarks.kernels", [])],
    "rollout": [("benchmarks.rollout_sps", []), ("benchmarks.rollout_step", [])],
    "end-to-end": [("benchmarks.train_sps", []), ("benchmarks.ddp_scaling", [])],
    "peers": [("benchmarks.peers", ["--part", "peers"])],
    "learning": [("benchmarks.peers", ["--part", "learning"])],
    "impala": [("benchmarks.impala_sps", [])],
    "learner": [("benchmarks.learner", [])],
    "default": [("benchmarks.default_solve", []), ("benchmarks.default_process", [])],
}
DEFAULT_PARTS = ("envs", "kernels", "rollout", "end-to-end", "peers", "learning")
ALIASES = {"train_sps": "end-to-end", "end_to_end": "end-to-end", "e2e": "end-to-end"}


def _run_script(module_name: str, argv: list) -> int:
    """``module.main(argv)`` as an exit status: exceptions are reported (traceback) as status 1."""
    try:
        module = importlib.import_module(module_name)
        entry = getattr(module, "main", None)
        if entry is None:
            print(f"fastrl bench: {module_name} has no main(argv) entry point", file=sys.stderr)
            return 1
        code = entry(argv)
    except SystemExit as e:  # argparse inside a script
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        raise
    except Exception:
        traceback.print_exc()
        return 1
    return code or 0


def _parse(argv):
    parser = ArgParser(prog="fastrl bench", description=__doc__.splitlines()[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("parts", nargs="*", metavar="PART",
                        help=f"any of {', '.join(PARTS)} (default: {' '.join(DEFAULT_PARTS)})")
    parser.add_argument("--quick", action="store_true", help="each part's smoke profile (short budgets, one seed)")
    parser.add_argument("--no-report", action="store_true", help="do not write <out-dir>/RESULTS.md and the plots")
    parser.add_argument("--out-dir", default="bench-results", metavar="DIR",
                        help="where the JSON, RESULTS.md and plots go (default: bench-results in the current directory; "
                             "benchmarks/results updates the committed results)")
    parser.add_argument("--profile", choices=["gpu"], default=None,
                        help="gpu: the one-GPU profile, benchmarks/gpu_profile.py (under 8 minutes), instead of parts")
    parser.add_argument("--dry-run", action="store_true", help="with --profile gpu: the same code on CPU, tiny sizes")
    args = parser.parse_args(argv)
    parts = [ALIASES.get(p, p) for p in args.parts]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise UserError(f"unknown part {unknown[0]!r}; choose from {', '.join(PARTS)}")
    if args.dry_run and not args.profile:
        raise UserError("--dry-run goes with --profile gpu: use fastrl bench --profile gpu --dry-run")
    if args.profile and (parts or args.quick):
        raise UserError(f"--profile {args.profile} runs on its own: drop the parts and --quick")
    args.parts = list(dict.fromkeys(parts or DEFAULT_PARTS))
    return args


def main(argv=None) -> int:
    try:
        args = _parse(argv)
    except UserError as e:
        print(f"fastrl bench: error: {e}", file=sys.stderr)
        return 2
    from benchmarks import common
    out_dir = Path(args.out_dir).resolve()
    common.RESULTS_DIR = out_dir  # every script's default_out() reads it when it writes
    print(f"# fastrl bench: results go to {out_dir}", flush=True)
    if args.profile == "gpu":
        from benchmarks import gpu_profile
        return gpu_profile.main(["--dry-run"] if args.dry_run else [])
    extra = ["--quick"] if args.quick else []
    steps = [(part, module, [*part_argv, *extra]) for part in args.parts for module, part_argv in PARTS[part]]
    outcomes = []
    started = time.perf_counter()
    for i, (part, module, argv_) in enumerate(steps, 1):
        print(f"\n# [{i}/{len(steps)}] {part}: python -m {module} {' '.join(argv_)}".rstrip(), flush=True)
        t0 = time.perf_counter()
        code = _run_script(module, argv_)
        outcomes.append((part, module, code, time.perf_counter() - t0))
        print(f"# [{i}/{len(steps)}] {part}: {'ok' if code == 0 else f'FAILED (exit {code})'} "
              f"in {time.perf_counter() - t0:.0f}s", flush=True)
    if not args.no_report:
        print("\n# report: python -m benchmarks.report", flush=True)
        report_argv = ["--results", str(out_dir), "--out", str(out_dir / "RESULTS.md")]
        outcomes.append(("report", "benchmarks.report", _run_script("benchmarks.report", report_argv), 0.0))
    print(f"\n# done in {time.perf_counter() - started:.0f}s")
    for part, module, code, seconds in outcomes:
        print(f"#   {part:<10} {module:<26} {'ok' if code == 0 else f'exit {code}':>7} {seconds:7.0f}s")
    return 0 if all(code == 0 for *_, code, _ in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
