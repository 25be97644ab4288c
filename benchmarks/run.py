"""Run fastrl's benchmarks: ``python -m benchmarks.run [PART ...] [--quick]`` (also ``fastrl bench``).

Parts: ``kernels`` (GAE / V-trace kernels, benchmarks/kernels.py) and ``train_sps`` (end-to-end PPO steps/s
against Stable-Baselines3, and rollout overhead against raw EnvPool). No part means all of them.
Each part writes its JSON under ``benchmarks/results/<machine-tag>/`` and prints its table.
"""
from __future__ import annotations

import argparse
import sys

PARTS = ("kernels", "train_sps")


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit 2, never a usage dump or SystemExit from inside main()
        raise _UsageError(message)


def _run_part(part: str, quick: bool) -> int:
    argv = ["--quick"] if quick else []
    if part == "kernels":
        from benchmarks import kernels
        code = kernels.main(argv)
    else:
        from benchmarks import train_sps
        code = train_sps.main(argv)
    return code or 0


def main(argv=None) -> int:
    parser = _Parser(prog="fastrl bench", description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", metavar="PART", help=f"any of {', '.join(PARTS)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="short measurements (a smoke run, minutes)")
    try:
        args = parser.parse_args(argv)
        unknown = [p for p in args.parts if p not in PARTS]
        if unknown:
            raise _UsageError(f"unknown part {unknown[0]!r}; choose from {', '.join(PARTS)}")
    except _UsageError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    status = 0
    for part in dict.fromkeys(args.parts or PARTS):
        print(f"# {part}", flush=True)
        status = max(status, _run_part(part, args.quick))
    return status


if __name__ == "__main__":
    sys.exit(main())
