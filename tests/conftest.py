"""Shared test set-up: offline, quiet wandb; no gymnasium Box-precision noise; small helpers.

Learning checks (``@pytest.mark.learning``) never hang on one seed: a learning trajectory differs between CPUs
(BLAS, kernels built with -march=native), so each runs ``LEARNING_SEEDS`` and judges the median with
``median_of_seeds``, against a threshold far above a random policy and far below what training reaches.
"""
import math
import os
import statistics
from pathlib import Path
import warnings
from collections.abc import Callable, Mapping

import pytest

os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_SILENT"] = "true"
os.environ.setdefault("WANDB_DISABLE_GIT", "true")

warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32.*")

# Flags every training test passes unless it is testing those outputs.
QUIET = ["--wandb", "disabled", "--tensorboard", "false", "--progress", "false", "--plot", "false", "--quiet", "true"]

# The summary.json schema every algorithm's run writes (the one run loop); IMPALA/APPO add their own extras.
SUMMARY_KEYS = {"algo", "env", "seed", "total_steps", "wall_time_s", "sps", "episode_return_mean", "episodes",
                "iterations", "stopped_by_signal", "resumed_from_step", "rollbacks", "reached_return",
                "steps_to_return", "time_to_return_s", "eval_return_mean", "eval_return_std"}

LEARNING_SEEDS = (1, 2, 3)
# LEARNING_SEEDS as one population call (members' seeds: seed, seed + 1, ...): where the code path allows it, a
# learning check trains every seed in one process and judges the median member (``median_of_members``); each member
# equals its single run (tests/test_population.py), so the median member is the median single run.
LEARNING_POPULATION = {"seed": LEARNING_SEEDS[0], "n_seeds": len(LEARNING_SEEDS)}
assert LEARNING_SEEDS == tuple(range(LEARNING_SEEDS[0], LEARNING_SEEDS[0] + len(LEARNING_SEEDS)))


# Files whose tests start clusters (torchrun's two ranks on a shared rendezvous port, Ray heads): under
# ``pytest -n 2 --dist loadgroup`` (the README's command) they run one at a time, on one worker.
CLUSTER_FILES = {"test_distributed.py", "test_run_owner.py", "test_ray_actors.py"}


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", "ignore:.*precision lowered by casting to float32.*:UserWarning")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the mark into each nodeid's @group suffix
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in CLUSTER_FILES:
            item.add_marker(pytest.mark.xdist_group("cluster"))


def one_line_error(fn, *args, **kwargs) -> str:
    """Call ``fn`` expecting a ``UserError`` whose message is one non-empty line; return the message."""
    from fastrl.config import UserError
    with pytest.raises(UserError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert message and "\n" not in message
    return message


def parse_cli(argv: list[str]):
    """The ``Config`` the command line's flags ``argv`` train with."""
    from fastrl.cli.flags import config_from_cli
    return config_from_cli(argv)[0]


def train_main(args) -> int:
    """``fastrl.cli.train.main(args)``, restoring the SIGINT/SIGTERM handlers so pytest's Ctrl-C keeps working."""
    import signal

    from fastrl.cli.train import main
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        return main(args)
    finally:
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])


@pytest.fixture(scope="session")
def one_iteration_run(tmp_path_factory):
    """A finished CartPole-v1 run of 128 steps (one iteration of 4 envs x 32 steps) and its checkpoint, shared by
    the tests that load or tamper with a real run: copy it before changing anything in it."""
    run_dir = tmp_path_factory.mktemp("one_iteration") / "run"
    assert train_main(["--env", "CartPole-v1", "--n-envs", "4", "--n-steps", "32", "--n-epochs", "1",
                       "--n-minibatches", "1", "--torch-threads", "1", "--device", "cpu", "--eval-episodes", "0",
                       "--compile", "off", "--total-steps", "128", "--run-dir", str(run_dir), *QUIET]) == 0
    return run_dir


@pytest.fixture
def quiet_flags():
    return list(QUIET)


def _median(values: list) -> float:
    """The median, a missing figure (None: no episode finished) counting as the worst, -inf."""
    return statistics.median(-math.inf if v is None else float(v) for v in values)


def median_of_seeds(run_fn: Callable, seeds=LEARNING_SEEDS) -> tuple:
    """Run ``run_fn(seed)`` for each seed and return ``(median, {seed: value})``.

    ``run_fn`` returns a number, or a dict of numbers (several figures of one run, e.g. training and evaluation
    return); then the median is a dict with the median of each key. Assert on the median and put the values in
    the message, so a failure shows every seed.
    """
    values = {seed: run_fn(seed) for seed in seeds}
    first = next(iter(values.values()))
    if isinstance(first, Mapping):
        return {key: _median([v[key] for v in values.values()]) for key in first}, values
    return _median(list(values.values())), values


def median_of_members(summary: Mapping, keys=("eval_return_mean",)) -> tuple:
    """The summary.json of a ``LEARNING_POPULATION`` run: ``(median, {seed: value})`` over its members of the figure
    ``keys[0]``, or (several keys) of each key, as ``median_of_seeds`` gives them."""
    members = summary["members"]
    assert [m["seed"] for m in members] == list(LEARNING_SEEDS), members
    return median_of_seeds(lambda seed: (members[seed - LEARNING_SEEDS[0]][keys[0]] if len(keys) == 1 else
                                         {key: members[seed - LEARNING_SEEDS[0]][key] for key in keys}))


class ManualClock:
    """The ``time`` module with ``perf_counter`` under the test's control (``now``, seconds): put it in place of a
    module's ``time`` so a throttle or an elapsed-time figure does not depend on how busy the machine is."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def perf_counter(self) -> float:
        return self.now

    def __getattr__(self, name):
        import time
        return getattr(time, name)


def descendant_pids(pid: int) -> set[int]:
    """All descendants of ``pid`` (from /proc)."""
    found, stack = set(), [pid]
    while stack:
        current = stack.pop()
        try:
            kids = [int(c) for c in Path(f"/proc/{current}/task/{current}/children").read_text().split()]
        except FileNotFoundError:
            kids = []
        found.update(kids)
        stack.extend(kids)
    return found
