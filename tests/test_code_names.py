"""No code from data: a checkpoint's config never makes fastrl import or call anything, whichever key names it; only
the names the user passes are resolved (``fastrl.names.resolve_name``: ``module:Name`` with the current directory
importable, or ``path/to/file.py:Name``), and an env name must build an env before anything is called."""
import dataclasses
import shutil
import sys
import textwrap
import typing

import pytest
import torch

import fastrl
from conftest import QUIET, one_line_error, train_main
from fastrl.cli import main as cli
from fastrl.config import CODE_KEYS, Config, UserError
from fastrl.run.checkpoint import list_checkpoints

SENTINEL = textwrap.dedent("""\
    import pathlib
    pathlib.Path(__file__).with_suffix(".imported").write_text("imported")
    import gymnasium
    from fastrl.learn.models import ActorCritic as Policy
    from gymnasium.envs.classic_control import CartPoleEnv as Env
""")


@pytest.fixture
def sentinel(tmp_path, monkeypatch):
    """A module ``fastrl_sentinel_mod`` in the current directory that records being imported."""
    (tmp_path / "fastrl_sentinel_mod.py").write_text(SENTINEL)
    monkeypatch.chdir(tmp_path)
    yield tmp_path / "fastrl_sentinel_mod.imported"
    sys.modules.pop("fastrl_sentinel_mod", None)


def _string_keys() -> list:
    """Every config key whose value is a string: each could hold a ``module:Name``."""
    hints = typing.get_type_hints(Config)
    keys = [f.name for f in dataclasses.fields(Config) if hints[f.name] is str]
    assert set(CODE_KEYS) == {"env", "policy"} and set(CODE_KEYS) <= set(keys) and len(keys) > 10
    return keys


def _tampered(run_dir, tmp_path, key: str):
    copy = tmp_path / f"run_{key}"
    shutil.copytree(run_dir, copy)
    for ckpt in list_checkpoints(copy / "checkpoints"):
        state = torch.load(ckpt, weights_only=True)
        state["config"][key] = "fastrl_sentinel_mod:Policy" if key == "policy" else "fastrl_sentinel_mod:Env"
        state.pop("checksum", None)
        torch.save(state, ckpt)
    return copy


@pytest.mark.parametrize("key", _string_keys())
def test_no_config_key_of_a_checkpoint_imports_code(one_iteration_run, tmp_path, sentinel, capsys, key):
    """fastrl.load, fastrl eval and --resume of a checkpoint naming the sentinel module under ``key`` never import it;
    for a code key each refuses in one line naming the flag that would."""
    run = _tampered(one_iteration_run, tmp_path, key)
    try:
        fastrl.load(run)
    except UserError as e:
        assert "\n" not in str(e)
    eval_rc = cli(["eval", str(run), "--episodes", "1", "--seeds", "1", "--max-steps", "50"])
    resume_rc = train_main(["--resume", str(run), "--total-steps", "128", *QUIET])
    assert not sentinel.exists() and "fastrl_sentinel_mod" not in sys.modules
    if key in CODE_KEYS:
        assert eval_rc == 2 and resume_rc == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
        assert len(errors) == 2 and all(f"--{key} fastrl_sentinel_mod:" in line for line in errors), errors


def test_names_the_user_passes_are_imported_from_the_current_directory(one_iteration_run, tmp_path, sentinel, capsys):
    """What the checkpoint names is used once the user passes it: ``--env``/``--policy`` (module:Name, the current
    directory importable) and ``path/to/file.py:Name``."""
    run = _tampered(one_iteration_run, tmp_path, "env")
    assert cli(["eval", str(run), "--episodes", "1", "--seeds", "1", "--max-steps", "50", "--env",
                "fastrl_sentinel_mod:Env"]) == 0
    assert sentinel.exists()
    sub = tmp_path / "envs"
    sub.mkdir()
    (sub / "fastrl_file_env.py").write_text("from gymnasium.envs.classic_control import CartPoleEnv as MyEnv\n")
    agent = fastrl.load(one_iteration_run, env="envs/fastrl_file_env.py:MyEnv")
    assert agent.config.env == "envs/fastrl_file_env.py:MyEnv"
    assert len(agent.evaluate(episodes=1, seeds=1)) == 1
    sys.modules.pop("fastrl_file_env", None)


def test_env_names_that_build_no_env_are_refused_before_a_call(tmp_path, monkeypatch):
    """``env: os:system`` in a config the user passes: refused in one line, os.system never called; likewise a
    class that is not a gymnasium.Env, and a missing name."""
    calls = []
    monkeypatch.setattr("os.system", lambda command: calls.append(command))
    config = tmp_path / "c.yaml"
    for env, needle in [("os:system", "cannot be called with no arguments"),
                        ("collections:OrderedDict", "not a gymnasium.Env subclass"),
                        ("os:no_such_thing", "no class or factory")]:
        config.write_text(f"env: {env}\n")
        message = one_line_error(fastrl.train, config=str(config), total_steps=64, progress=False)
        assert needle in message and env in message, message
    assert calls == []
