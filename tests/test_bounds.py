"""Resources bounded before they are spent: YAML with an alias bomb, a huge document or a key given twice is refused
in one line; error messages show at most about 80 characters of a value; a run or an evaluation whose estimated
memory exceeds what the machine has is refused in one line naming the sizes and the flag, before allocating."""
import time

import pytest

import fastrl.run.footprint
from conftest import QUIET, one_line_error, train_main
from fastrl.cli import main as cli
from fastrl.cli.tune import load_space
from fastrl.config import make_config


@pytest.mark.parametrize("key", ["hidden_sizes", "env"])
def test_an_alias_bomb_in_a_config_is_one_short_line(tmp_path, key):
    """10**9 values by reference under a valid key: refused at load, in well under a second of work."""
    path = tmp_path / "bomb.yaml"
    path.write_text(f"lr: 0.001\n{key}: {_nest(9)}\n")
    start = time.monotonic()
    message = one_line_error(make_config, yaml_path=str(path))
    assert time.monotonic() - start < 30  # a hang guard: the check is linear in the document
    assert "alias" in message and len(message) < 300, message


def _nest(depth: int) -> str:
    """A flow sequence of 10**depth ones, written in O(depth) text with anchors and aliases."""
    text = "&l0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"
    for level in range(1, depth):
        text = f"&l{level} [{text}, " + ", ".join([f"*l{level - 1}"] * 9) + "]"
    return text


def test_an_alias_bomb_in_a_tune_space_is_one_line(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(f"lr: {{type: categorical, choices: {_nest(9)}}}\n")
    message = one_line_error(load_space, str(path))
    assert "alias" in message and len(message) < 300, message


def test_a_duplicate_yaml_key_is_refused_naming_it(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("lr: 0.001\nn_envs: 8\nlr: 0.01\n")
    message = one_line_error(make_config, yaml_path=str(path))
    assert "'lr' is given twice" in message and "line 3" in message, message


def test_a_huge_config_document_is_refused(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text("lr: 0.001\n" + "# padding\n" * 200_000)
    assert "over the limit" in one_line_error(make_config, yaml_path=str(path))


@pytest.mark.parametrize("overrides", [{"hidden_sizes": "x" * 100_000}, {"algo": "x" * 100_000},
                                       {"device": "x" * 100_000}, {"n_envs": list(range(100_000))},
                                       {"x" * 100_000: 1}])
def test_error_messages_show_at_most_about_80_characters_of_a_value(overrides):
    message = one_line_error(make_config, overrides)
    assert len(message) < 300, message[:400]


@pytest.fixture
def sixteen_gib(monkeypatch):
    """This machine, as the check sees it, has 16 GiB available: the refusals below hold on any machine."""
    monkeypatch.setattr(fastrl.run.footprint, "available_host_bytes", lambda: 16 << 30)


@pytest.mark.parametrize("flags, named", [
    (["--n-envs", "1000000000"], "--n-envs"),
    (["--hidden-sizes", "100000", "100000", "100000"], "lower --hidden-sizes"),
    (["--n-steps", "1000000000"], "--n-steps"),
    (["--n-seeds", "100000"], "lower --n-seeds or --vary"),
    (["--n-envs", "2000000"], "--n-envs"),
])
def test_a_run_that_cannot_fit_in_memory_is_refused_before_allocating(sixteen_gib, tmp_path, capsys, flags, named):
    assert train_main([*flags, *QUIET, "--run-dir", str(tmp_path / "run"), "--device", "cpu"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(lines) == 1 and "this run needs about" in lines[0] and "16.0 GiB" in lines[0] and named in lines[0]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_the_check_lets_an_ordinary_run_through(sixteen_gib):
    from fastrl.envs.batched import probe_env
    cfg = make_config({"n_envs": 64, "hidden_sizes": [256, 256]})
    shape, dtype, spec = probe_env(cfg)
    import torch
    fastrl.run.footprint.check_run_memory(cfg, shape, dtype, spec, torch.device("cpu"))  # no error
    assert fastrl.run.footprint.available_host_bytes() == 16 << 30


def test_available_memory_is_read_from_the_machine():
    have = fastrl.run.footprint.available_host_bytes()
    assert have is not None and have > 1 << 20


def test_an_evaluation_that_cannot_fit_is_refused(sixteen_gib, tmp_path, capsys):
    run = tmp_path / "run"
    assert train_main(["--env", "CartPole-v1", "--n-envs", "4", "--n-steps", "32", "--n-minibatches", "1",
                       "--n-epochs", "1", "--total-steps", "128", "--eval-episodes", "0", "--compile", "off",
                       "--device", "cpu", *QUIET, "--run-dir", str(run)]) == 0
    capsys.readouterr()
    assert cli(["eval", str(run), "--episodes", "200000", "--seeds", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "1,000,000 episodes at once" in err and "--episodes or --seeds" in err, err
