"""What a new user meets before training: every command's ``--help``, ``--version``, the license and type-hint files,
and ``fastrl.train`` / ``fastrl.evaluate`` as typed functions whose keywords are the config's keys."""
import dataclasses
import inspect
import os
import pydoc
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import fastrl
from fastrl.cli import USAGE
from fastrl.config import _TYPES, Config

REPO = Path(__file__).resolve().parent.parent


def _fastrl(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    return subprocess.run([sys.executable, "-m", "fastrl", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def test_every_command_answers_help_with_exit_0():
    commands = re.search(r"\{([a-z,]+)\}", USAGE).group(1).split(",")
    assert commands == ["train", "tune", "eval", "export", "plot", "bench"], commands
    for args in ([], *([command] for command in commands)):
        proc = _fastrl(*args, "--help")
        assert proc.returncode == 0, (args, proc.stderr[-2000:])
        assert "usage:" in proc.stdout and len(proc.stdout.splitlines()) >= 3, (args, proc.stdout)
        assert "Traceback" not in proc.stderr, (args, proc.stderr[-2000:])


def test_version_is_pyprojects():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert fastrl.__version__ == metadata.version("fastrl") == declared
    proc = _fastrl("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"fastrl {declared}", (proc.stdout, proc.stderr)
    light = subprocess.run([sys.executable, "-c", "import sys, fastrl; v = fastrl.__version__; "
                            "assert 'torch' not in sys.modules; print(v)"], cwd=REPO, capture_output=True, text=True,
                           timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert light.returncode == 0 and light.stdout.strip() == declared, light.stderr[-2000:]


def test_license_changelog_and_type_hints_ship():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["license"] == "MIT" and project["project"]["license-files"] == ["LICENSE"]
    assert (REPO / "LICENSE").read_text().startswith("MIT License")
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["fastrl"]
    assert (REPO / "fastrl" / "py.typed").is_file()
    assert f"## {project['project']['version']}" in (REPO / "CHANGELOG.md").read_text()


def test_train_takes_every_config_key_as_a_typed_documented_keyword():
    """The explicit signature and the Config dataclass stay in step: the same names, the same types, each one in the
    docstring, and ``help(fastrl.train)`` shows them."""
    parameters = inspect.signature(fastrl.train).parameters
    keywords = {name: p for name, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    fields = [f.name for f in dataclasses.fields(Config)]
    assert sorted(keywords) == sorted(set(fields) - {"env", "algo"})
    assert list(parameters)[:4] == ["env", "algo", "config", "callbacks"]
    for name, parameter in keywords.items():
        assert parameter.default is None, name
        assert parameter.annotation.startswith(_TYPES[name].__name__) and parameter.annotation.endswith("| None"), \
            (name, parameter.annotation)
        assert f"``{name}``" in fastrl.train.__doc__, f"{name} is not in fastrl.train's docstring"
    shown = pydoc.render_doc(fastrl.train, renderer=pydoc.plaintext)
    assert re.search(r"n_envs: '?int \| None'? = None", shown) and "max_nonfinite_iterations" in shown, shown[:500]


def test_evaluate_and_config_are_public_and_typed():
    assert fastrl.Config is Config
    parameters = inspect.signature(fastrl.evaluate).parameters
    assert {"path", "episodes", "seeds", "deterministic", "env", "best", "member", "device"} <= set(parameters)
    assert all(p.annotation is not inspect.Parameter.empty for p in parameters.values())
