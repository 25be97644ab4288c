"""``fastrl tune``: a hyperparameter search on Optuna (TPE sampling, median pruning) whose trials train as populations.

    fastrl tune --space space.yaml [--config FILE|NAME] [--trials 20] [--batch 4] [--trial-seeds 1]
                [--trial-steps N] [--evals 4] [--dir DIR] [any fastrl train flag ...]

**The search space** (``--space``, YAML) maps config keys to distributions::

    lr:           {type: loguniform, low: 1.0e-5, high: 1.0e-2}
    clip_coef:    {type: uniform, low: 0.1, high: 0.3}
    n_epochs:     {type: int, low: 2, high: 10}                  # optional: step, log
    n_steps:      {type: categorical, choices: [16, 32, 64]}
    hidden_sizes: {type: categorical, choices: ["64,64", "256,256"]}   # a list-valued key: strings

The base config is ``--config`` and the train flags, as for ``fastrl train``; ``--trial-steps`` (default: the base's
``total_steps``) is each trial's budget per seed.

**A batch of trials is one population.** ``--batch`` B trials are asked from the study at once (ask-and-tell) and
trained as one population of B x ``--trial-seeds`` S members in one process (``fastrl.run.trainer.Trainer`` with
explicit members; member j of a trial has seed ``seed + j``), so a batch costs about one run. The keys members can
differ in (``fastrl.defaults.VARY_KEYS``: lr, clip_coef, ent_coef, gamma, gae_lambda, target_kl, ...) are sampled per
trial; any other key of the space (n_envs, n_steps, n_epochs, network sizes, ...) is sampled once per batch, by the
batch's first trial, and its other trials share those values (enqueued as fixed parameters, the rest sampled by TPE).

**Objective** (maximised): the mean, over the trial's seeds, of each member's deterministic evaluation return
(``eval_episodes`` x ``eval_seeds`` episodes of the base config, ``eval_deterministic`` as set there) at the end of
its budget.

**Pruning.** Each trial is evaluated ``--evals`` E times, evenly over its budget; the first E - 1 are reported as
intermediate values at the nominal env step ``k * trial_steps / E`` (aligned across batches of other shapes), which
Optuna's MedianPruner judges once ``--startup-trials`` trials completed. A pruned trial's members stop costing compute
at once: the population's segment ends there (a callback's False), and the surviving members continue as a smaller
population (fewer envs, a smaller update) from their exact state (weights, optimizer state, normalizers, generators,
episode statistics; their envs restart from a reset) on the same LR schedule. When every trial of a batch is pruned,
the batch ends.

**Files** in ``--dir`` (default ``runs/tune__<env>__<algo>``): ``study.db`` (the SQLite study;
``optuna-dashboard sqlite:///DIR/study.db`` opens it), ``runs/`` (a run directory per batch segment: metrics,
TensorBoard, ``members.yaml``, summary, checkpoint), ``best.yaml`` (the best complete trial as a ready
``fastrl train --config`` file, rewritten after each batch).

**Resume.** Re-running the same command continues the study: finished (complete or pruned) trials count toward
``--trials``. The directory is locked to one process, so a trial found running belongs to a process that was killed:
it is marked failed, and its parameters run again first.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import statistics
import sys
from pathlib import Path

from fastrl.cli.flags import ArgParser, parse_cli_overrides
from fastrl.config import (_TYPES, FIELDS, Config, UserError, _coerce, _unknown_key, brief, check_applicable,
                           numeric, read_yaml)
from fastrl.defaults import VARY_KEYS, YAML_IGNORED
from fastrl.errors import first_line

INSTALL_HINT = 'fastrl tune needs optuna: pip install "fastrl[tune]" (or pip install optuna)'
SPACE_TYPES = ("loguniform", "uniform", "int", "categorical")
# The run itself, not a hyperparameter: the tuner sets these (or its own flags do).
NOT_TUNABLE = {"seed": "--seed", "n_seeds": "--trial-seeds", "vary": "the space", "total_steps": "--trial-steps",
               "run_dir": "--dir", "resume": "--dir (re-run the command)", "overwrite": "--dir"}
# Base-config keys a resumed study may change: they do not change what a trial computes.
COSMETIC_KEYS = (*YAML_IGNORED, "progress", "quiet", "tensorboard", "wandb", "wandb_project", "plot", "device",
                 "torch_threads")


def _number(where: str, value, integer: bool = False):
    """``value`` as a number; a string that spells one too, as YAML 1.1 leaves ``1e-4`` and ``1.5e6`` (no dot)."""
    if isinstance(value, str):
        value = numeric(value)
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if not ok or isinstance(value, bool):
        raise UserError(f"{where}: expected {'an integer' if integer else 'a number'}, got {brief(value)}")
    return value


def parse_space(data, where: str) -> dict:
    """The entries of a space file (see the module docstring) as Optuna distributions by config key, or a one-line
    UserError naming the entry."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
    if not isinstance(data, dict) or not data:
        raise UserError(f"{where}: expected a mapping of config key: {{type: ..., ...}}, e.g. "
                        "lr: {type: loguniform, low: 1.0e-5, high: 1.0e-2}")
    space = {}
    for name, entry in data.items():
        name = str(name).replace("-", "_")
        if name not in FIELDS:
            raise _unknown_key(name, where)
        if name in NOT_TUNABLE:
            raise UserError(f"{where}: {name} is not a hyperparameter to search; set it with {NOT_TUNABLE[name]}")
        at = f"{where}: {name}"
        if not isinstance(entry, dict) or entry.get("type") not in SPACE_TYPES:
            raise UserError(f"{at}: expected {{type: {'|'.join(SPACE_TYPES)}, ...}}, got {brief(entry)}")
        kind = entry["type"]
        allowed = {"categorical": {"type", "choices"}, "int": {"type", "low", "high", "step", "log"}}.get(
            kind, {"type", "low", "high"})
        extra = sorted(set(entry) - allowed)
        if extra:
            raise UserError(f"{at}: {kind} takes {', '.join(sorted(allowed - {'type'}))}, not "
                            f"{', '.join(map(str, extra))[:80]}")
        if kind == "categorical":
            choices = entry.get("choices")
            if not isinstance(choices, list) or not choices or not all(
                    isinstance(c, (str, int, float, bool)) for c in choices):
                raise UserError(f"{at}: categorical needs choices: a non-empty list of numbers, strings or booleans "
                                "(a list-valued key takes strings: \"64,64\")")
            if _TYPES[name] in (int, float):  # a number YAML read as a string (1e-4) is a number
                choices = [numeric(c) if isinstance(c, str) else c for c in choices]
            space[name] = CategoricalDistribution(choices)
        else:
            if "low" not in entry or "high" not in entry:
                raise UserError(f"{at}: {kind} needs low and high")
            integer = kind == "int"
            low, high = _number(f"{at}: low", entry["low"], integer), _number(f"{at}: high", entry["high"], integer)
            if not low < high:
                raise UserError(f"{at}: low={brief(low)} must be below high={brief(high)}")
            if kind == "loguniform" and low <= 0:
                raise UserError(f"{at}: loguniform needs low > 0, got {low}")
            step = _number(f"{at}: step", entry.get("step", 1), True)
            log = entry.get("log", False)
            if step < 1 or not isinstance(log, bool) or (log and (low < 1 or step != 1)):
                raise UserError(f"{at}: int takes step >= 1 and log true|false (log needs low >= 1 and step 1)")
            if not integer and _TYPES[name] is int:
                raise UserError(f"{at}: {name} is an integer: use type int or categorical")
            space[name] = (IntDistribution(low, high, log=log, step=step) if integer
                           else FloatDistribution(float(low), float(high), log=kind == "loguniform"))
        for value in extremes(space[name]):
            try:
                _coerce(name, value)
            except UserError as e:
                raise UserError(f"{at}: {e}") from None
    return space


def extremes(distribution) -> list:
    """The values a space entry's checks try: a categorical's choices, or the low and high ends of a range."""
    return list(getattr(distribution, "choices", ())) or [distribution.low, distribution.high]


def load_space(path: str) -> dict:
    return parse_space(read_yaml(path, "space file"), f"space file {path}")


def check_space_with(base: Config, space: dict) -> None:
    """Each entry's every extreme (low, high, each choice) on the base config must make a valid run config."""
    for name, distribution in space.items():
        for value in extremes(distribution):
            coerced = _coerce(name, value)
            try:
                check_applicable(base.algo, {name: coerced})
                dataclasses.replace(base, **{name: coerced}).validate()
            except UserError as e:
                raise UserError(f"space: {name}={value} does not fit the base config: {e}") from None


# --------------------------------------------------------------------------- batches of trials
def ask_batch(study, space: dict, size: int, retry: list[dict]) -> list[tuple]:
    """``size`` trials ``(trial, values)`` that share the keys members cannot differ in: the first decides them (TPE,
    or the first parameters to retry), the others are enqueued with them fixed. Parameters in ``retry`` (a killed
    process's trials) that fit the batch are taken first."""
    shared = [name for name in space if name not in VARY_KEYS]

    def ask(fixed):
        if fixed:
            study.enqueue_trial(fixed)
        trial = study.ask(space)
        return trial, trial.params

    first = ask(retry.pop(0) if retry else None)
    group = {name: first[1][name] for name in shared}
    batch = [first]
    while len(batch) < size:
        match = next((r for r in retry if all(r.get(k) == v for k, v in group.items())), None)
        if match is not None:
            retry.remove(match)
        batch.append(ask(match if match is not None else group))
    return batch


class TrialEvaluations:
    """The run-loop callback of a batch: at every ``eval_every`` iterations and at the end, each member's
    deterministic evaluation, averaged per trial over its seeds. Intermediate ones are reported to the trials and
    judged by the pruner; a pruning ends the segment (returns False) with the population's state kept in ``state``."""

    def __init__(self, trials: dict, member_trial: list[int], eval_every: int, trial_steps: int, n_evals: int):
        self.trials, self.member_trial, self.eval_every = trials, member_trial, eval_every
        self.trial_steps, self.n_evals = trial_steps, n_evals
        self.final: dict | None = None
        self.pruned: list[int] = []
        self.state = None

    def __call__(self, metrics: dict, run):
        from fastrl.run.loop import evaluate_members, member_labels
        trainer = run.trainer
        if not trainer.finished() and trainer.iteration % self.eval_every:
            return None
        results = evaluate_members(trainer)
        if trainer.n_members > 1:
            for m, (mean, std) in enumerate(results):
                run.log({**member_labels(trainer, m), "eval/return_mean": mean, "eval/return_std": std})
        per_trial: dict = {}
        for number, (mean, _) in zip(self.member_trial, results):
            per_trial.setdefault(number, []).append(mean)
        values = {number: statistics.fmean(means) for number, means in per_trial.items()}
        if trainer.finished():
            self.final = values
            return None
        rung = trainer.iteration // self.eval_every
        for number, value in values.items():
            self.trials[number].report(value, rung * self.trial_steps // self.n_evals)
            if self.trials[number].should_prune():
                self.pruned.append(number)
        if self.pruned:
            self.state = trainer.state_dict()
            return False
        return None


def _survivors_state(state: dict, keep: list[int]) -> dict:
    """The population checkpoint ``state`` cut to the members ``keep`` (a resume state for a smaller population)."""
    members = state.get("members", [state])
    step = int(state["global_step"]) // len(members)
    return {"config": state["config"], "global_step": step * len(keep), "iteration": int(state["iteration"]),
            "members": [members[i] for i in keep]}


def run_batch(study, batch: list[tuple], base: Config, settings: argparse.Namespace, runs_dir: Path) -> str:
    """Train ``batch`` as one population (segments that shrink as trials are pruned) and tell the study each
    trial's result. Returns ``"done"`` or ``"stopped"`` (a stop signal: the trials stay running, to be retried)."""
    from optuna.trial import TrialState

    from fastrl.run.session import run as train_run
    trials, members, member_trial = {}, [], []
    for trial, values in batch:
        values = {name: _coerce(name, value) for name, value in values.items()}  # "64,64" -> [64, 64]
        shared = {k: v for k, v in values.items() if k not in VARY_KEYS}
        try:
            population = dataclasses.replace(base, **shared).validate()
            own = [dataclasses.replace(population, **values, seed=base.seed + j).validate()
                   for j in range(settings.trial_seeds)]
        except UserError as e:
            print(f"fastrl tune: trial {trial.number} failed: {e}", file=sys.stderr)
            study.tell(trial, state=TrialState.FAIL)
            continue
        trials[trial.number] = trial
        members += own
        member_trial += [trial.number] * len(own)
    if not members:
        return "done"
    population = dataclasses.replace(
        population, eval_interval=0, eval_episodes=0, stop_at_return=0.0, plot=False, wandb="disabled", quiet=True,
        progress=False, checkpoint_interval=0).validate()
    n_iterations = max(1, base.total_steps // (population.n_envs * population.n_steps))
    eval_every = max(1, n_iterations // settings.evals)
    name = f"trials{min(trials):04d}-{max(trials):04d}"
    state, segment = None, 0
    while members:
        cfg = dataclasses.replace(population, run_dir=str(runs_dir / (name + (f"-s{segment}" if segment else ""))))
        judge = TrialEvaluations(trials, member_trial, eval_every, base.total_steps, settings.evals)
        summary = train_run(cfg, state, callbacks=[judge], members=members)
        if summary.get("stopped_by_signal"):
            return "stopped"
        if judge.final is not None:
            for number, value in judge.final.items():
                study.tell(trials[number], value)
            return "done"
        if not judge.pruned:  # ended otherwise (an env's error is raised before this): nothing to judge
            for number in dict.fromkeys(member_trial):
                study.tell(trials[number], state=TrialState.FAIL)
            return "done"
        for number in judge.pruned:
            study.tell(trials[number], state=TrialState.PRUNED)
        keep = [m for m, number in enumerate(member_trial) if number not in judge.pruned]
        state = _survivors_state(judge.state, keep)
        members, member_trial = [members[m] for m in keep], [member_trial[m] for m in keep]
        segment += 1
    return "done"


# --------------------------------------------------------------------------- the study
def retry_left_over(study) -> list[dict]:
    """Trials a killed process left running (or enqueued): marked failed; their parameters, to run again."""
    from optuna.trial import TrialState
    retry = []
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        retry.append(dict(frozen.system_attrs.get("fixed_params", {})))
        study.tell(study.ask(), state=TrialState.FAIL)  # ask() takes the oldest waiting trial
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        retry.append(dict(frozen.params))
        study.tell(frozen.number, state=TrialState.FAIL)
    return [r for r in retry if r]


def finished_trials(study) -> list:
    from optuna.trial import TrialState
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))


def write_best(study, base: Config, settings: argparse.Namespace, path: Path) -> dict | None:
    """``best.yaml``: the base config with the best complete trial's values, one seed, ``fastrl train --config``-ready
    (every key, as a run's config.yaml). Returns the figures, or None while no trial completed."""
    import yaml

    from fastrl.run.storage import atomic_write
    try:
        best = study.best_trial
    except ValueError:  # no trial completed yet
        return None
    values = {name: _coerce(name, value) for name, value in best.params.items()}
    cfg = dataclasses.replace(base, **values).validate()
    data = {key: value for key, value in cfg.to_dict().items() if key not in YAML_IGNORED}
    header = (f"# fastrl tune: the best of {len(finished_trials(study))} finished trials in "
              f"{path.parent / 'study.db'}: "
              f"trial {best.number}, mean deterministic evaluation return {best.value:.4g} over "
              f"{settings.trial_seeds} seed(s) at {base.total_steps} steps each\n"
              f"# its values: {json.dumps(best.params)}\n# run it: fastrl train --config {path}\n")
    atomic_write(path, (header + yaml.safe_dump(data, sort_keys=False)).encode(), "the best config")
    return {"best_trial": best.number, "best_value": best.value, "best_params": best.params, "best_config": str(path)}


def build_parser() -> argparse.ArgumentParser:
    parser = ArgParser(prog="fastrl tune", allow_abbrev=False,
                       usage="fastrl tune --space FILE [--config FILE|NAME] [--trials N] [--batch B] "
                              "[--trial-seeds S] [--trial-steps N] [--evals E] [--dir DIR] [train flags ...]",
                       description="Search hyperparameters with Optuna (TPE, median pruning); a batch of trials "
                                   "trains as one population. Every fastrl train flag sets the base config (see "
                                   "fastrl train --help).")
    parser.add_argument("--space", required=True, metavar="FILE",
                        help="YAML search space: KEY: {type: loguniform|uniform|int|categorical, low:, high: | "
                             "choices: [...]}")
    parser.add_argument("--trials", type=int, default=20, help="finished trials the study should reach (default 20)")
    parser.add_argument("--batch", type=int, default=4, help="trials trained together as one population (default 4)")
    parser.add_argument("--trial-seeds", type=int, default=1, help="seeds per trial: its objective is their mean "
                                                                   "(default 1)")
    parser.add_argument("--trial-steps", type=int, default=None, help="env steps per seed of a trial (default: the "
                                                                      "base config's total_steps)")
    parser.add_argument("--evals", type=int, default=4, help="evaluations per trial, evenly over its budget; all but "
                                                            "the last are pruning points (default 4)")
    parser.add_argument("--startup-trials", type=int, default=5, help="trials TPE samples at random and the pruner "
                                                                     "waits for (default 5)")
    parser.add_argument("--pruner", choices=("median", "none"), default="median", help="median (default) or none")
    parser.add_argument("--dir", default=None, help="the study's directory (default runs/tune__<env>__<algo>); the "
                                                    "same --dir continues its study")
    return parser


def base_config(settings: argparse.Namespace, rest: list[str]) -> Config:
    own = tuple(flag.removeprefix("--") for action in build_parser()._actions for flag in action.option_strings)
    overrides, yaml_path = parse_cli_overrides(rest, prog="fastrl tune", also=own)
    for key in overrides:
        if key in NOT_TUNABLE and key != "seed":
            raise UserError(f"--{key.replace('_', '-')} does not apply to fastrl tune: use {NOT_TUNABLE[key]}")
    from fastrl.run.run_config import build_config
    base, _ = build_config(overrides, yaml_path, where="command-line flags")
    if base.vary or base.n_seeds != 1:
        raise UserError("the base config holds a population (vary/n_seeds): drop it; the space says what varies and "
                        "--trial-seeds how many seeds a trial has")
    if base.algo not in ("ppo", "a2c"):
        raise UserError(f"fastrl tune trains trials as populations, which algo {base.algo} does not support: use "
                        "--algo ppo or a2c")
    if base.eval_episodes < 1:
        raise UserError("fastrl tune's objective is the evaluation return: eval_episodes must be >= 1")
    if settings.trial_steps is not None:
        base = dataclasses.replace(base, total_steps=settings.trial_steps).validate()
    return base


def tune_main(argv: list[str]) -> int:
    """The command line: 0 when the study has its trials, 130 after a stop signal (re-run the command to continue);
    a user error is raised (``fastrl.cli.main`` prints its one line and exits 2)."""
    try:
        settings, rest = build_parser().parse_known_args(argv)
        for name in ("trials", "batch", "trial_seeds", "evals"):
            if getattr(settings, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be >= 1")
        if settings.startup_trials < 0:
            raise UserError("--startup-trials must be >= 0")
        try:
            import optuna
        except ImportError:
            raise UserError(INSTALL_HINT) from None
        space = load_space(settings.space)
        base = base_config(settings, rest)
        check_space_with(base, space)
        return _tune(optuna, settings, space, base)
    except KeyboardInterrupt:
        print("fastrl tune: interrupted; re-run the same command to continue the study", file=sys.stderr)
        return 130


def _tune(optuna, settings, space: dict, base: Config) -> int:
    import sqlalchemy.exc

    from fastrl.run.rundir import RunLock, make_dirs
    tune_dir = Path(settings.dir or Path("runs") / f"tune__{base.env.replace('/', '_').replace(':', '_')}__{base.algo}")
    make_dirs(tune_dir / "runs")
    try:
        lock = RunLock(tune_dir).acquire()
    except UserError as e:
        raise UserError(str(e).replace("--run-dir", "--dir")) from None
    try:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = f"sqlite:///{tune_dir.resolve() / 'study.db'}"
        study = optuna.create_study(storage=storage, study_name="fastrl", direction="maximize", load_if_exists=True)
        identity = {"space": {k: optuna.distributions.distribution_to_json(d) for k, d in space.items()},
                    "trial_seeds": settings.trial_seeds,
                    "base": {k: v for k, v in base.to_dict().items() if k not in COSMETIC_KEYS}}
        identity = json.loads(json.dumps(identity))
        saved = study.user_attrs.get("fastrl")
        if saved is None:
            study.set_user_attr("fastrl", identity)
        elif saved != identity:
            changed = [key for key in identity if saved.get(key) != identity[key]]
            raise UserError(f"{tune_dir} holds a study with another {' and '.join(changed)}: re-run it with its own "
                            "flags and space, or pass another --dir")
        retry = retry_left_over(study)
        if retry:
            print(f"fastrl tune: {len(retry)} trial(s) a stopped process left unfinished run again first",
                  file=sys.stderr)
        study.pruner = (optuna.pruners.MedianPruner(n_startup_trials=settings.startup_trials)
                        if settings.pruner == "median" else optuna.pruners.NopPruner())
        study.sampler = optuna.samplers.TPESampler(n_startup_trials=settings.startup_trials, constant_liar=True,
                                                   seed=base.seed + len(study.trials))
        while (done := len(finished_trials(study))) < settings.trials:
            batch = ask_batch(study, space, min(settings.batch, settings.trials - done), retry)
            if os.environ.get("FASTRL_TUNE_TEST_KILL_AT") == str(done):  # test hook: die with this batch RUNNING
                os.kill(os.getpid(), signal.SIGKILL)
            if run_batch(study, batch, base, settings, tune_dir / "runs") == "stopped":
                print(f"fastrl tune: interrupted with {done} of {settings.trials} trials finished; re-run the same "
                      "command to continue the study", file=sys.stderr)
                return 130
            _report_batch(study, batch, settings, write_best(study, base, settings, tune_dir / "best.yaml"))
            if len(finished_trials(study)) == done and all(
                    study.trials[t.number].state.name == "FAIL" for t, _ in batch):
                raise UserError("every trial of a batch failed (see above): narrow the space")
        best = write_best(study, base, settings, tune_dir / "best.yaml")
        print(json.dumps({"finished_trials": len(finished_trials(study)), "study": storage, **(best or {})}))
        return 0
    except sqlalchemy.exc.SQLAlchemyError as e:  # a truncated, overwritten or foreign study.db
        raise UserError(f"the study database {tune_dir / 'study.db'} cannot be used "
                        f"({brief(first_line(getattr(e, 'orig', None) or e), 120)}): it is "
                        "damaged or not a fastrl study; move it away, or pass another --dir, to start anew") from None
    finally:
        lock.release()


def _report_batch(study, batch: list[tuple], settings, best: dict | None) -> None:
    """One line per batch: each trial's result and the best so far (``write_best``'s figures)."""
    parts = []
    for trial, _ in batch:
        frozen = study.trials[trial.number]
        state = frozen.state.name.lower()
        at = f" at {frozen.last_step:,}" if frozen.last_step is not None else ""
        parts.append(f"#{frozen.number} {frozen.value:.4g}" if state == "complete" else f"#{frozen.number} {state}{at}")
    best = f"; best #{best['best_trial']} {best['best_value']:.4g}" if best else ""
    print(f"fastrl tune: {len(finished_trials(study))}/{settings.trials} trials: {', '.join(parts)}{best}",
          file=sys.stderr, flush=True)
