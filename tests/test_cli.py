"""The command line as a user meets it: one-line errors with exit code 2 and no traceback, and `fastrl eval`."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import QUIET

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
    (["train", "--algo", "impala", "--n-epochs", "4"], "n_epochs=4 does not apply to impala"),
    (["train", "--algo", "a2c", "--target-kl", "0.02"], "target_kl=0.02 does not apply to a2c"),
    (["train", "--amp", "fp16", "--device", "cpu"] + QUIET, "amp=fp16"),
    (["train", "--encoder", "nature_cnn"] + QUIET, "encoder=nature_cnn"),
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
    from fastrl.train import main
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


def test_readme_test_command_is_what_ci_runs_and_is_pinned():
    """The README's set-up/test command is the one .ci/run runs, and it installs through constraints.txt, which
    pins every dependency that pyproject.toml names (base and dev)."""
    import tomllib
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    readme = (ROOT / "README.md").read_text()
    commands = [line for line in readme.splitlines() if "pytest -q tests" in line and "pip install" in line]
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
    for spec in project["dependencies"] + project["optional-dependencies"]["dev"]:
        name = canonicalize_name(Requirement(spec).name)
        assert name in pinned, f"{name} is not in constraints.txt"
    assert str(pinned["torch"].specifier) == "==2.13.0"
