"""The command line as a user meets it: one-line errors with exit code 2 and no traceback, and `fastrl eval`."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import QUIET, one_line_error, parse_cli

ROOT = Path(__file__).resolve().parent.parent
ERROR_LINE = re.compile(r"^\S.*: error: .+$")


def _run(args, cwd=ROOT, timeout=240):
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _assert_user_error(proc, needle):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected exactly one stderr line, got: {proc.stderr!r}"
    assert ERROR_LINE.match(lines[0]), lines[0]
    assert needle in lines[0], lines[0]


@pytest.mark.parametrize("args, needle", [
    (["-m", "fastrl.train", "--n-envs", "abc"], "n_envs"),
    (["-m", "fastrl.train", "--env", "NoSuchEnv-v0"] + QUIET, "NoSuchEnv-v0"),
    (["-m", "fastrl.train", "--config", "missing.yaml"], "missing.yaml"),
    (["-m", "fastrl", "eval", "missing.pt"], "missing.pt"),
])
def test_user_errors_are_one_line_subprocess(tmp_path, args, needle):
    _assert_user_error(_run(args, cwd=tmp_path), needle)
    assert not (tmp_path / "runs").exists(), "a user error must stop the run before it creates anything"


@pytest.mark.parametrize("args, needle", [
    (["train", "--env", "CartPole-v9"] + QUIET, "CartPole-v1"),
    (["train", "--lr", "x"], "lr"),
    (["train", "--n-minibatch", "4"], "unrecognized"),
    (["train", "--resume", "no/such/run"], "no/such/run"),
    (["train", "--gamma", "2"], "gamma"),
    (["train", "--n-envs", "3", "--n-steps", "5", "--n-minibatches", "4"], "n_minibatches"),
    (["train", "--algo", "a2c", "--target-kl", "0.02"], "target_kl=0.02 does not apply to a2c"),
    (["eval", "missing.pt"], "missing.pt"),
    (["eval"], "checkpoint"),
    (["frobnicate"], "unknown command"),
])
def test_user_errors_are_one_line_in_process(capsys, tmp_path, monkeypatch, args, needle):
    from fastrl.cli import main
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and ERROR_LINE.match(lines[0]) and needle in lines[0], err
    assert "Traceback" not in err + out
    assert not (tmp_path / "runs").exists()


def test_train_help_lists_flags(capsys):
    from fastrl.cli.train import main
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--n-envs", "--total-steps", "--gae-lambda", "--resume", "--config", "--wandb"):
        assert flag in out


def test_bad_checkpoint_eval(tmp_path):
    bad = tmp_path / "ckpt_000000000001.pt"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    from fastrl.cli import main
    import contextlib, io
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["eval", str(bad)]) == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and "ckpt_000000000001.pt" in lines[0] and ERROR_LINE.match(lines[0])


def test_train_then_eval_real_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    proc = _run(["-m", "fastrl", "train", "--env", "CartPole-v1", "--n-envs", "4", "--n-steps", "32",
                 "--n-minibatches", "2", "--n-epochs", "1", "--total-steps", "128", "--eval-episodes", "0",
                 "--torch-threads", "1", "--run-dir", str(run_dir), *QUIET])
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout.strip().splitlines()[-1])
    assert shown["total_steps"] == 128
    proc = _run(["-m", "fastrl", "eval", str(run_dir), "--episodes", "3", "--seeds", "2"])
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"CartPole-v1: return -?\d+\.\d+ ± \d+\.\d+ over 2 seeds x 3 episodes", proc.stdout), proc.stdout
    proc = _run(["-m", "fastrl", "eval", str(run_dir), "--episodes", "2", "--seeds", "1", "--json"])
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["episodes"] == 2 and len(result["returns"]) == 2
    assert result["return_mean"] == pytest.approx(sum(result["returns"]) / 2)
    from fastrl.cli import main
    assert main(["eval", str(run_dir), "--episodes", "0"]) == 2


def test_a_closed_stdout_ends_train_and_eval_without_a_traceback_and_keeps_the_run(tmp_path):
    """A reader that closed the pipe before the result line (``| head -0``): exit 1 (Python's advice for a broken
    pipe), no traceback, and the run saved before that line is whole."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONWARNINGS": "ignore"}
    run_dir = tmp_path / "run"
    train = ["-m", "fastrl", "train", "--env", "CartPole-v1", "--n-envs", "4", "--n-steps", "32", "--n-minibatches",
             "2", "--n-epochs", "1", "--total-steps", "128", "--eval-episodes", "0", "--torch-threads", "1",
             "--run-dir", str(run_dir), *QUIET]
    for args in (train, ["-m", "fastrl", "eval", str(run_dir), "--episodes", "1", "--seeds", "1"]):
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        proc.stdout.close()  # the reader is gone before the process prints its result
        stderr = proc.stderr.read()
        assert proc.wait(timeout=240) == 1, stderr
        assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["total_steps"] == 128


def test_eval_stochastic_and_caps_reach_the_evaluation(tmp_path, monkeypatch, capsys):
    """``--stochastic`` samples, ``--max-episode-steps``/``--max-steps`` cap (CartPole: return = steps, and an untrained
    policy's episodes outlast 4 steps); a cut is said in one line."""
    import importlib

    from fastrl.cli import main
    evaluation = importlib.import_module("fastrl.run.evaluate")
    run_dir = tmp_path / "run"
    proc = _run(["-m", "fastrl", "train", "--n-envs", "4", "--n-steps", "32", "--n-minibatches", "2", "--n-epochs", "1",
                 "--total-steps", "128", "--eval-episodes", "0", "--run-dir", str(run_dir), *QUIET])
    assert proc.returncode == 0, proc.stderr
    seen, play = [], evaluation.play_first_episodes
    monkeypatch.setattr(evaluation, "play_first_episodes",
                        lambda agent, env, device, max_steps, deterministic, *rest: seen.append(deterministic)
                        or play(agent, env, device, max_steps, deterministic, *rest))
    for flags, max_steps in ((["--stochastic", "--max-episode-steps", "4"], 4), (["--max-steps", "6"], 3)):
        capsys.readouterr()
        assert main(["eval", str(run_dir), "--episodes", "2", "--seeds", "1", "--json", *flags]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["returns"] == [float(max_steps)] * 2
        assert f"evaluation: cut 2 of 2 episodes at {max_steps} steps" in err
    assert seen == [False, True]
    assert main(["eval", str(run_dir), "--stochastic", "--deterministic"]) == 2


def test_readme_test_command_is_what_ci_runs_and_is_pinned():
    """The README's set-up/test command is the one .ci/run runs, and it installs through constraints.txt, which
    pins every dependency that pyproject.toml names (base and each extra the command installs)."""
    import tomllib
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    readme = (ROOT / "README.md").read_text()
    commands = [line for line in readme.splitlines() if "pytest -q" in line and "pip install" in line]
    assert len(commands) == 1, commands
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert commands[0].strip() in ci_lines
    assert commands[0].count("-c constraints.txt") == 2  # the torch install and the project's
    pinned = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            pinned[canonicalize_name(req.name)] = req
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = re.search(r'pip install -e "\.\[([a-z,]+)\]"', commands[0]).group(1).split(",")
    assert {"dev", "jax"} <= set(extras), extras  # jax: tests/test_benchmarks.py's rejax part runs, not skipped
    for spec in project["dependencies"] + [s for extra in extras for s in project["optional-dependencies"][extra]]:
        name = canonicalize_name(Requirement(spec).name)
        assert name in pinned, f"{name} is not in constraints.txt"
    assert str(pinned["torch"].specifier) == "==2.13.0"


# ------------------------------------------------------------------------------------------ flags (issue 12)
def _imported_modules(importtime_stderr: str) -> set:
    """Module names from ``python -X importtime`` output (``import time: self | cumulative | name``)."""
    return {line.rsplit("|", 1)[1].strip() for line in importtime_stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2}


@pytest.mark.parametrize("args", [["-m", "fastrl.train", "--help"], ["-m", "fastrl", "train", "--help"],
                                  ["-m", "fastrl", "plot", "--help"], ["-m", "fastrl", "--help"]])
def test_help_is_fast_and_never_imports_torch(args):
    proc = _run(["-X", "importtime", *args], timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    heavy = {m for m in _imported_modules(proc.stderr) if m.split(".")[0] in ("torch", "numpy", "envpool", "matplotlib")}
    assert not heavy, f"--help imported {sorted(heavy)[:5]}"
    assert "usage:" in proc.stdout


def test_train_module_is_the_command_without_importing_torch_first():
    code = ("import sys, fastrl.train; assert 'torch' not in sys.modules, 'import fastrl.train loaded torch'; "
            "from fastrl.train import main; from fastrl.cli.train import main as command; "
            "from fastrl.run.session import make_trainer, run; assert 'torch' not in sys.modules; "
            "assert main is command and callable(run) and callable(make_trainer); print('ok')")
    proc = _run(["-c", code], timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_help_is_grouped():
    from fastrl.cli.flags import HELP_GROUPS, build_parser
    text = build_parser().format_help()
    titles = ["run", "environment", "model", "algorithm (every algorithm)", "PPO", "IMPALA / APPO",
              "logging, checkpoints, evaluation", "guards"]
    assert [t for t, _ in HELP_GROUPS] == titles
    positions = [text.index(f"\n{title}:\n") for title in titles]
    assert positions == sorted(positions), "groups out of order"

    def group_of(flag):
        at = re.search(r"^\s+" + re.escape(flag) + r"\s", text, re.M).start()
        return [t for t, p in zip(titles, positions) if p < at][-1]

    expected = {"--algo": "run", "--resume": "run", "--env": "environment", "--n-envs": "environment",
                "--hidden-sizes": "model", "--lr": "algorithm (every algorithm)", "--clip-coef": "PPO",
                "--n-actors": "IMPALA / APPO", "--eval-interval": "logging, checkpoints, evaluation",
                "--capture-video": "logging, checkpoints, evaluation", "--plot": "logging, checkpoints, evaluation",
                "--rollback": "guards", "--max-nonfinite-iterations": "guards"}
    assert {flag: group_of(flag) for flag in expected} == expected
    assert "--no-tensorboard" not in text and text.count("--no-progress") == 1, "--no-X is described once, not listed"


@pytest.mark.parametrize("argv, expected", [
    (["--progress"], True), (["--no-progress"], False), (["--progress", "false"], False), (["--progress", "true"], True),
    (["--progress", "0"], False), (["--no-progress", "--progress"], True), (["--progress", "--no-progress"], False),
])
def test_bare_boolean_flags(argv, expected):
    assert parse_cli(argv).progress is expected


def test_bare_boolean_does_not_swallow_the_next_flag():
    cfg = parse_cli(["--capture-video", "--seed", "7", "--no-tensorboard", "--deterministic", "--n-envs", "4"])
    assert (cfg.capture_video, cfg.seed, cfg.tensorboard, cfg.deterministic, cfg.n_envs) == (True, 7, False, True, 4)
    assert parse_cli([]).capture_video is False and parse_cli([]).plot is True


@pytest.mark.parametrize("argv", [["128", "128"], ["128,128"], ["[128,128]"], ["[128,", "128]"], ["128,", "128"]])
def test_list_flags_accept_spaces_commas_and_brackets(argv):
    assert parse_cli(["--hidden-sizes", *argv]).hidden_sizes == [128, 128]


@pytest.mark.parametrize("argv", [["--hidden-sizes", "[]"], ["--hidden-sizes", "128,x"], ["--hidden-sizes", "[0]"]])
def test_bad_list_flags_are_one_line(argv):
    message = one_line_error(parse_cli, argv)
    assert "hidden_sizes" in message


@pytest.mark.parametrize("flag, meant", [
    ("--num-envs", "--n-envs"), ("--learning-rate", "--lr"), ("--env-id", "--env"),
    ("--total-timesteps", "--total-steps"), ("--num-steps", "--n-steps"), ("--update-epochs", "--n-epochs"),
    ("--num-minibatches", "--n-minibatches"), ("--clip-range", "--clip-coef"), ("--batch-size", "--n-minibatches"),
    ("--n_envs", "--n-envs"), ("--ent_coef", "--ent-coef"), ("--gae_lambda", "--gae-lambda"),
    ("--n-minibatch", "--n-minibatches"), ("--torch-deterministic", "--deterministic"), ("--track", "--wandb online"),
    ("--normalize-advantage", "--norm-adv"), ("--clip-range-vf", "--clip-vloss"),
])
def test_unknown_flags_name_the_flag_meant(capsys, tmp_path, monkeypatch, flag, meant):
    from fastrl.cli import main
    monkeypatch.chdir(tmp_path)
    assert main(["train", flag, "8"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and ERROR_LINE.match(lines[0]), err
    assert f"unrecognized flag {flag}; did you mean {meant}" in lines[0], lines[0]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("flag", ["--ent-coef", "--gae-lambda", "--max-grad-norm", "--seed", "--n-epochs", "--vf-coef",
                                  "--clip-coef", "--target-kl", "--norm-adv", "--anneal-lr", "--capture-video"])
def test_cleanrl_spellings_that_are_ours_are_accepted(flag):
    """CleanRL/SB3 names fastrl shares need no hint: they are flags."""
    from fastrl.cli.flags import parse_cli_overrides
    overrides, _ = parse_cli_overrides([flag, "1"])
    assert overrides == {flag[2:].replace("-", "_"): "1"}


@pytest.mark.parametrize("argv, needle", [
    (["--zzqqxx", "1"], "unrecognized flag --zzqqxx; see --help"),
    (["stray"], "unrecognized argument 'stray'"),
    (["--learning-rate=0.1"], "unrecognized flag --learning-rate; did you mean --lr?"),  # the --flag=value form
])
def test_other_unrecognized_arguments(argv, needle):
    assert needle in one_line_error(parse_cli, argv)


# ------------------------------------------------------------------------------------------ packaged configs
def test_config_by_name_is_the_packaged_file(tmp_path, monkeypatch):
    from fastrl.defaults import config_names, configs_root
    monkeypatch.chdir(tmp_path)  # away from the repository: names must not depend on the working directory
    names = config_names()
    assert {"ppo/cartpole", "ppo/lunarlander", "a2c/cartpole", "impala/cartpole"} <= set(names)
    assert names == sorted(p.relative_to(ROOT / "configs").with_suffix("").as_posix()
                           for p in (ROOT / "configs").rglob("*.yaml"))
    assert configs_root().samefile(ROOT / "configs")
    by_path = parse_cli(["--config", str(ROOT / "configs" / "ppo" / "lunarlander.yaml")])
    assert parse_cli(["--config", "ppo/lunarlander"]) == by_path
    assert parse_cli(["--config", "configs/ppo/lunarlander.yaml"]) == by_path  # the README's spelling, from anywhere
    assert by_path.env.startswith("LunarLander")
    assert parse_cli(["--config", "ppo/lunarlander", "--seed", "9"]).seed == 9


def test_a_local_file_wins_over_a_config_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ppo").mkdir()
    (tmp_path / "ppo" / "lunarlander.yaml").write_text("seed: 42\n")
    assert parse_cli(["--config", "ppo/lunarlander.yaml"]).seed == 42


@pytest.mark.parametrize("name, needle", [
    ("ppo/nosuch", "unknown config name 'ppo/nosuch'; the tuned configs are: a2c/atari, a2c/cartpole"),
    ("nosuch.yaml", "config file 'nosuch.yaml' not found"),
])
def test_unknown_config_name_lists_the_names(capsys, tmp_path, monkeypatch, name, needle):
    from fastrl.cli import main
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", name]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0] and "ppo/lunarlander" in lines[0], lines


def test_configs_are_package_data():
    """pyproject ships the top-level configs/ as fastrl/configs/*/*.yaml, where configs_root() looks first."""
    import fnmatch
    import tomllib
    setuptools_cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "fastrl.configs" in setuptools_cfg["packages"]
    assert setuptools_cfg["package-dir"]["fastrl.configs"] == "configs"
    patterns = setuptools_cfg["package-data"]["fastrl.configs"]
    for path in (ROOT / "configs").rglob("*.yaml"):
        relative = path.relative_to(ROOT / "configs").as_posix()
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), f"{relative} would not be installed"
    # every package folder, named as it installs (a package-dir mapping renames its folder: kernels -> fastrl.kernels)
    installed_as = {folder: name for name, folder in setuptools_cfg["package-dir"].items()}
    folders = {p.parent.relative_to(ROOT).as_posix() for p in ROOT.glob("*/**/__init__.py")
               if "tests" not in p.parts and "benchmarks" not in p.parts}  # benchmarks/: checkout only, not installed
    packages = {installed_as.get(folder, folder.replace("/", ".")) for folder in folders}
    assert packages <= set(setuptools_cfg["packages"]), f"packages missing from pyproject: {packages}"
    assert {name.split(".")[0] for name in setuptools_cfg["packages"]} == {"fastrl"}, "the only top-level name is fastrl"
    assert setuptools_cfg["package-dir"]["fastrl.kernels"] == "kernels" and "kernels" not in setuptools_cfg["packages"]


def test_first_line_names_the_config_the_run_used(tmp_path):
    """fastrl train --env X with no --config trains with X's tuned config, and says so before anything else."""
    proc = _run(["-m", "fastrl.train", "--env", "Pendulum-v1", "--total-steps", "2048", "--n-envs", "2",
                 "--n-steps", "256", "--n-minibatches", "4", "--n-epochs", "1", "--eval-episodes", "0", "--wandb",
                 "disabled", "--tensorboard", "false", "--plot", "false", "--run-dir", str(tmp_path / "run")])
    assert proc.returncode == 0, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert "Pendulum-v1" in first and "ppo/pendulum" in first, first
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    from fastrl.config import make_config
    tuned = make_config(yaml_path="ppo/pendulum")
    assert tuned.gamma != make_config().gamma  # the check below can tell the tuned config from the default
    assert (saved["gamma"], saved["n_envs"]) == (tuned.gamma, 2)  # the tuned config's, under the flags
