"""``fastrl tune``: the space format and its one-line errors, optuna missing, trials as populations that shrink when
trials are pruned, and a study killed mid-way (SIGKILL), resumed by re-running the command, its best.yaml trained."""
import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import QUIET, one_line_error, parse_cli, train_main

from fastrl.config import make_config

optuna = pytest.importorskip("optuna")

from fastrl.cli.tune import ask_batch, check_space_with, parse_space, run_batch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SPACE = {"lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2},
         "ent_coef": {"type": "uniform", "low": 0.0, "high": 0.02},
         "n_steps": {"type": "categorical", "choices": [16, 32]}}
TINY = ["--n-envs", "4", "--compile", "off", "--eval-episodes", "2", "--eval-seeds", "1"]


@pytest.mark.parametrize("space, expected", [
    ({"lrr": {"type": "uniform", "low": 0.1, "high": 0.2}}, "did you mean lr"),
    ({"lr": {"low": 0.1, "high": 0.2}}, "expected {type: loguniform|uniform|int|categorical"),
    ({"lr": {"type": "uniform", "low": 0.2, "high": 0.1}}, "low=0.2 must be below high=0.1"),
    ({"lr": {"type": "loguniform", "low": 0.0, "high": 0.1}}, "loguniform needs low > 0"),
    ({"lr": {"type": "uniform", "low": 0.1, "high": 0.2, "choices": [1]}}, "not choices"),
    ({"n_steps": {"type": "uniform", "low": 8, "high": 64}}, "n_steps is an integer: use type int"),
    ({"n_steps": {"type": "int", "low": 8.5, "high": 64}}, "expected an integer"),
    ({"gamma": {"type": "categorical", "choices": []}}, "categorical needs choices"),
    ({"hidden_sizes": {"type": "categorical", "choices": ["64,x"]}}, "hidden_sizes: expected list"),
    ({"total_steps": {"type": "int", "low": 1000, "high": 2000}}, "set it with --trial-steps"),
    ({"seed": {"type": "int", "low": 1, "high": 9}}, "set it with --seed"),
    ([1, 2], "expected a mapping"),
])
def test_a_bad_space_entry_is_one_line(space, expected):
    assert expected in one_line_error(parse_space, space, "space file s.yaml")


def test_numbers_yaml_reads_as_strings_are_numbers(tmp_path):
    """YAML 1.1 reads 1e-4 and 1.5e6 (no dot) as strings: the space, the config file and the flags take them."""
    from fastrl.cli.tune import load_space
    (tmp_path / "space.yaml").write_text("lr: {type: loguniform, low: 1e-5, high: 3e-4}\n"
                                         "n_steps: {type: int, low: 1e1, high: 1.5e2}\n"
                                         "ent_coef: {type: categorical, choices: [0, 1e-3, 1.5e-2]}\n")
    lr, n_steps, ent_coef = load_space(str(tmp_path / "space.yaml")).values()
    assert (lr.low, lr.high) == (1e-5, 3e-4) and isinstance(lr.low, float)
    assert (n_steps.low, n_steps.high) == (10, 150) and isinstance(n_steps.low, int)
    assert ent_coef.choices == (0, 1e-3, 1.5e-2)
    (tmp_path / "config.yaml").write_text("lr: 1e-4\ntotal_steps: 1.5e6\n")
    cfg = make_config(yaml_path=str(tmp_path / "config.yaml"))
    assert (cfg.lr, cfg.total_steps) == (1e-4, 1_500_000)
    assert parse_cli(["--lr", "3e-4", "--total-steps", "1e5"]).lr == 3e-4


def test_a_space_value_the_base_config_refuses_is_one_line():
    params = parse_space({"gamma": {"type": "uniform", "low": 0.9, "high": 1.5}}, "space")
    assert "gamma=1.5 does not fit the base config" in one_line_error(check_space_with, make_config(), params)
    params = parse_space({"clip_coef": {"type": "uniform", "low": 0.1, "high": 0.3}}, "space")
    assert "does not apply to a2c" in one_line_error(check_space_with, make_config({"algo": "a2c"}), params)


def test_the_command_reports_a_bad_space_in_one_line(tmp_path, capsys):
    from fastrl.cli import main
    (tmp_path / "space.yaml").write_text("lr: {type: uniform, low: 1, high: 0}\n")
    assert main(["tune", "--space", str(tmp_path / "space.yaml"), "--dir", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fastrl tune: error: space file") and "below high" in err
    assert not (tmp_path / "d").exists(), "nothing is written before the space is checked"


@pytest.mark.parametrize("flags, expected", [
    (["--n-seeds", "2"], "use --trial-seeds"),
    (["--total-steps", "1000"], "use --trial-steps"),
    (["--eval-episodes", "0"], "eval_episodes must be >= 1"),
    (["--algo", "impala"], "use --algo ppo or a2c"),
    (["--lrr", "1"], "did you mean --lr"),
])
def test_a_base_config_tune_cannot_use_is_one_line(tmp_path, capsys, flags, expected):
    from fastrl.cli import main
    (tmp_path / "space.yaml").write_text("ent_coef: {type: uniform, low: 0.0, high: 0.01}\n")
    assert main(["tune", "--space", str(tmp_path / "space.yaml"), "--dir", str(tmp_path / "d"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fastrl tune: error:") and expected in err


def test_without_optuna_one_line_says_how_to_install_it(tmp_path):
    (tmp_path / "space.yaml").write_text("lr: {type: loguniform, low: 1.0e-4, high: 1.0e-2}\n")
    hide = "import sys; sys.modules['optuna'] = None; from fastrl.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", hide, "tune", "--space", str(tmp_path / "space.yaml")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ('fastrl tune: error: fastrl tune needs optuna: pip install "fastrl[tune]" '
                                   '(or pip install optuna)')


class PruneTrials(optuna.pruners.BasePruner):
    """Prunes the trials numbered in ``numbers`` at their first report."""

    def __init__(self, numbers):
        self.numbers = set(numbers)

    def prune(self, study, trial):
        return trial.number in self.numbers


def test_a_pruned_trial_leaves_the_population_and_the_others_train_on(tmp_path):
    """Three trials x two seeds in one population; trial 1 is pruned at the first evaluation: the next segment trains
    the other two trials' four members only, from the step of that evaluation, to the end of their budget."""
    study = optuna.create_study(direction="maximize", pruner=PruneTrials({1}),
                                sampler=optuna.samplers.RandomSampler(seed=0))
    params = parse_space(SPACE, "space")
    base = make_config({"n_envs": 4, "n_steps": 16, "total_steps": 1024, "compile": "off", "eval_episodes": 2,
                        "eval_seeds": 1})
    settings = argparse.Namespace(trial_seeds=2, evals=2)
    batch = ask_batch(study, params, 3, retry=[])
    assert len({values["n_steps"] for _, values in batch}) == 1, "a shape key is shared by the batch"
    assert run_batch(study, batch, base, settings, tmp_path) == "done"
    assert [t.state.name for t in study.trials] == ["COMPLETE", "PRUNED", "COMPLETE"]
    n_steps = batch[0][1]["n_steps"]
    rung = (1024 // (4 * n_steps)) // 2 * 4 * n_steps  # the member step of the first evaluation
    first = json.loads((tmp_path / "trials0000-0002" / "summary.json").read_text())
    second = json.loads((tmp_path / "trials0000-0002-s1" / "summary.json").read_text())
    assert first["n_members"] == 6 and first["stopped_by_callback"] and first["total_steps"] == 6 * rung
    assert second["n_members"] == 4 and second["resumed_from_step"] == 4 * rung
    assert second["total_steps"] == 4 * 1024, "the survivors run to the end of their budget, nothing more"
    assert [m["seed"] for m in second["members"]] == [1, 2, 1, 2]
    lrs = [batch[0][1]["lr"], batch[0][1]["lr"], batch[2][1]["lr"], batch[2][1]["lr"]]
    assert [m["hyperparameters"]["lr"] for m in second["members"]] == lrs
    assert study.trials[1].intermediate_values and study.trials[0].value is not None


def _with_repo_on_path() -> dict:
    """The environment for a subprocess that imports this checkout's fastrl."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def _states(db: Path) -> list[str]:
    try:
        with sqlite3.connect(db) as connection:
            return [row[0] for row in connection.execute("SELECT state FROM trials ORDER BY number")]
    except sqlite3.OperationalError:  # the file exists before Optuna has made its tables
        return []


def test_a_killed_study_resumes_and_its_best_config_trains(tmp_path):
    (tmp_path / "space.yaml").write_text(json.dumps(SPACE))
    tune_dir = tmp_path / "study"
    command = [sys.executable, "-m", "fastrl", "tune", "--space", str(tmp_path / "space.yaml"), "--trials", "4",
               "--batch", "2", "--evals", "2", "--startup-trials", "1", "--trial-steps", "2048", "--dir", str(tune_dir),
               *TINY]
    env = _with_repo_on_path()
    # The tuner kills itself once the second batch's trials are asked and their parameters stored, before any
    # is told: a SIGKILL at a fixed point, not a poll racing Optuna's writes.
    killed = subprocess.run(command, cwd=tmp_path, env={**env, "FASTRL_TUNE_TEST_KILL_AT": "2"},
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert sum(s in ("COMPLETE", "PRUNED") for s in _states(tune_dir / "study.db")) == 2
    left_running = [n for n, s in enumerate(_states(tune_dir / "study.db")) if s == "RUNNING"]
    assert left_running, "killed with trials running"
    study = optuna.load_study(study_name="fastrl", storage=f"sqlite:///{tune_dir / 'study.db'}")
    killed_params = [study.trials[n].params for n in left_running]

    resumed = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "left unfinished run again first" in resumed.stderr
    study = optuna.load_study(study_name="fastrl", storage=f"sqlite:///{tune_dir / 'study.db'}")
    states = [t.state.name for t in study.trials]
    assert sum(s in ("COMPLETE", "PRUNED") for s in states) == 4, states
    assert all(states[n] == "FAIL" for n in left_running)
    later = [t.params for t in study.trials[max(left_running) + 1:]]
    assert all(params in later for params in killed_params if params), "the killed trials' parameters ran again"
    shown = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert shown["finished_trials"] == 4 and shown["best_value"] == study.best_value

    best = make_config(yaml_path=str(tune_dir / "best.yaml"))
    assert best.lr == pytest.approx(study.best_params["lr"]) and best.n_steps == study.best_params["n_steps"]
    assert best.total_steps == 2048 and best.n_seeds == 1 and best.vary == {}
    run_dir = tmp_path / "best-run"
    assert train_main(["--config", str(tune_dir / "best.yaml"), "--total-steps", "256", "--eval-episodes", "0",
                       "--run-dir", str(run_dir), *QUIET]) == 0
    assert json.loads((run_dir / "summary.json").read_text())["total_steps"] >= 256

    # The same directory with another space is refused in one line; the finished study is left as it was.
    (tmp_path / "other.yaml").write_text(json.dumps({"lr": SPACE["lr"]}))
    other = subprocess.run([*command[:5], str(tmp_path / "other.yaml"), *command[6:]], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert other.returncode == 2 and "holds a study with another space" in other.stderr
    assert other.stderr.count("\n") == 1


def test_a_study_directory_in_use_by_another_process_is_one_line(tmp_path, capsys):
    """A second tuner on a live study's directory would fail its running trials: refused while another process
    holds the directory's lock."""
    from fastrl.cli import main
    tune_dir = tmp_path / "study"
    tune_dir.mkdir()
    hold = ("import sys, time; from pathlib import Path; from fastrl.run.rundir import RunLock; "
            "RunLock(Path(sys.argv[1])).acquire(); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tune_dir)], stdout=subprocess.PIPE, text=True,
                              env=_with_repo_on_path())
    try:
        assert holder.stdout.readline().strip() == "held"
        (tmp_path / "space.yaml").write_text(json.dumps({"lr": SPACE["lr"]}))
        assert main(["tune", "--space", str(tmp_path / "space.yaml"), "--dir", str(tune_dir)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"is in use by the live process PID {holder.pid}" in err and "--dir" in err
        assert not (tune_dir / "study.db").exists()
    finally:
        holder.kill()
        holder.wait()


def test_the_shipped_search_spaces_fit_their_configs():
    from fastrl.cli.tune import load_space
    spaces = sorted((REPO / "benchmarks" / "spaces").glob("*.yaml"))
    assert spaces
    for path in spaces:  # benchmarks/spaces/<algo>_<config>.yaml searches configs/<algo>/<config>.yaml
        algo, name = path.stem.split("_", 1)
        check_space_with(make_config({}, f"{algo}/{name}"), load_space(str(path)))
