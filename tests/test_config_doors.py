"""Every door to a run's config (flags, a --config file, fastrl.train(config=Config(...)), fastrl.train(**keys))
builds the same Config from the same input: one builder, fastrl.run.run_config.build_config."""
import importlib

import pytest
import yaml

import fastrl
from fastrl.cli.flags import config_from_cli
from fastrl.config import Config, make_config

INPUTS = {
    "tuned env": {"env": "HalfCheetah-v4"},
    "the default": {},
    "tuned env with overrides": {"env": "LunarLander-v3", "n_envs": 4, "lr": 1e-3, "hidden_sizes": [32, 32]},
    "another algorithm": {"algo": "a2c", "gamma": 0.95},
}


class _Built(Exception):
    """Raised by the stand-in for fastrl.run.session.run: the config is built, nothing trains."""


def _through_train(monkeypatch, **kwargs) -> Config:
    def stop(cfg, *_args, **_kwargs):
        raise _Built(cfg)
    monkeypatch.setattr(importlib.import_module("fastrl.run.session"), "run", stop)
    with pytest.raises(_Built) as built:
        fastrl.train(**kwargs)
    return built.value.args[0]


def _flags(values: dict) -> list[str]:
    argv = []
    for key, value in values.items():
        argv += [f"--{key.replace('_', '-')}", *(map(str, value) if isinstance(value, list) else [str(value)])]
    return argv


@pytest.mark.parametrize("name", list(INPUTS))
def test_every_door_builds_the_same_config(name, tmp_path, monkeypatch):
    values = INPUTS[name]
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(values) if values else "{}\n")
    built = {
        "flags": config_from_cli(_flags(values))[0],
        "--config file": config_from_cli(["--config", str(path)])[0],
        "config=Config(...)": _through_train(monkeypatch, config=Config(**values)),
        "keywords": _through_train(monkeypatch, **values),
    }
    expected = built["flags"].to_dict()
    for door, cfg in built.items():
        assert cfg.to_dict() == expected, door
    for key, value in values.items():
        assert expected[key] == value, key


def test_the_doors_build_on_the_envs_tuned_config():
    """Not merely equal: each lies over the env's tuned file (a door that skipped it would differ from these)."""
    assert config_from_cli(["--env", "HalfCheetah-v4"])[0] == make_config(yaml_path="ppo/halfcheetah")
    cfg = config_from_cli(_flags(INPUTS["tuned env with overrides"]))[0]
    lunar = make_config(yaml_path="ppo/lunarlander")
    assert (cfg.gamma, cfg.n_steps, cfg.env) == (lunar.gamma, lunar.n_steps, "LunarLander-v3")
    assert config_from_cli([])[0] == make_config(yaml_path="ppo/cartpole")
    assert config_from_cli(["--algo", "a2c"])[0] == make_config(yaml_path="a2c/cartpole")


def test_a_config_objects_fields_at_their_default_take_the_tuned_value(monkeypatch):
    """A Config sets what differs from Config(): n_envs=32 is Config()'s, so HalfCheetah's tuned 8 stands; the
    keyword form pins it."""
    halfcheetah = make_config(yaml_path="ppo/halfcheetah")
    assert halfcheetah.n_envs != Config.n_envs
    cfg = _through_train(monkeypatch, config=Config(env="HalfCheetah-v4", n_envs=Config.n_envs))
    assert cfg.n_envs == halfcheetah.n_envs
    cfg = _through_train(monkeypatch, env="HalfCheetah-v4", n_envs=Config.n_envs)
    assert cfg.n_envs == Config.n_envs
