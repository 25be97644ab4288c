"""Config: coercion, validation, YAML < CLI precedence, --help, one-line UserErrors (with a hypothesis fuzz)."""
import math
import re
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import one_line_error, parse_cli
from fastrl.cli.flags import build_parser
from fastrl.config import FIELDS, Config, UserError, algo_default, load_yaml, make_config
from fastrl.defaults import ALGO_DEFAULTS, ALGOS, APPLIES_TO

INT_FIELDS = sorted(n for n, t in typing.get_type_hints(Config).items() if t is int)
FLOAT_FIELDS = sorted(n for n, t in typing.get_type_hints(Config).items() if t is float)
POSITIVE_INTS = ["n_envs", "total_steps", "n_steps", "n_epochs", "n_minibatches", "log_interval",
                 "keep_checkpoints", "eval_seeds"]


def test_defaults_are_valid_and_round_trip():
    cfg = make_config()
    assert cfg == Config().validate() and ALGO_DEFAULTS["ppo"] == {}  # Config() is the embedded default
    assert make_config(cfg.to_dict()) == cfg
    assert cfg.batch_size == cfg.n_envs * cfg.n_steps
    assert cfg.minibatch_size * cfg.n_minibatches == cfg.batch_size


def test_coercion_of_strings_and_dashes():
    cfg = make_config({"n-envs": "4", "lr": "1e-3", "normalize_obs": "yes", "hidden_sizes": "32, 16",
                       "total_steps": "1e5", "gamma": 1})
    assert cfg.n_envs == 4 and cfg.lr == 1e-3 and cfg.normalize_obs is True
    assert cfg.hidden_sizes == [32, 16] and cfg.total_steps == 100_000 and cfg.gamma == 1.0
    assert isinstance(cfg.gamma, float) and isinstance(cfg.total_steps, int)


@pytest.mark.parametrize("key, suggestion", [("n_env", "n_envs"), ("learning_rate", "lr"), ("gama", "gamma"),
                                             ("n-minibatch", "n_minibatches"), ("n_timesteps", "total_steps"),
                                             ("total_timesteps", "total_steps"), ("num_envs", "n_envs"),
                                             ("batch_size", "n_minibatches (the minibatch size is"),
                                             ("cuda", "device=cuda"), ("xyzzy", None)])
def test_unknown_key_suggests(key, suggestion):
    message = one_line_error(make_config, {key: 1})
    assert f"unknown config key {key.replace('-', '_')!r}" in message, message  # dashes read as underscores
    if suggestion:
        assert f"did you mean {suggestion}" in message, message
    else:  # nothing close: no guess, a pointer to the list of keys
        assert "did you mean" not in message and "see --help for the valid keys" in message, message


@pytest.mark.parametrize("overrides, needle", [
    ({"n_envs": "abc"}, "n_envs"),
    ({"lr": "x"}, "lr"),
    ({"n_envs": 2.5}, "n_envs"),
    ({"n_envs": "2.5"}, "n_envs"),
    ({"n_envs": True}, "n_envs"),
    ({"normalize_obs": "maybe"}, "normalize_obs"),
    ({"normalize_obs": 2}, "normalize_obs"),
    ({"hidden_sizes": "64 abc"}, "hidden_sizes"),
    ({"hidden_sizes": [64, 1.5]}, "hidden_sizes"),
    ({"hidden_sizes": []}, "hidden_sizes"),
    ({"hidden_sizes": [64, 0]}, "hidden_sizes"),
    ({"env": 5}, "env"),
    ({"n_envs": -1}, "n_envs"),
    ({"n_envs": 0}, "n_envs"),
    ({"n_steps": -8}, "n_steps"),
    ({"total_steps": 0}, "total_steps"),
    ({"lr": -1e-3}, "lr"),
    ({"ent_coef": -0.1}, "ent_coef"),
    ({"env_threads": -1}, "env_threads"),
    ({"gamma": 1.01}, "gamma"),
    ({"gamma": -0.1}, "gamma"),
    ({"gae_lambda": 2}, "gae_lambda"),
    ({"n_envs": 3, "n_steps": 5, "n_minibatches": 4}, "n_minibatches"),
    ({"algo": "dqn"}, "algo"),
    ({"activation": "sigmoid"}, "activation"),
    ({"env_backend": "mujoco"}, "env_backend"),
    ({"wandb": "on"}, "wandb"),
    ({"device": "tpu"}, "device"),
    ({"lr": 1e-6}, "lr_floor"),
])
def test_bad_values_raise_one_line_user_error(overrides, needle):
    message = one_line_error(make_config, overrides)
    assert needle in message


def test_yaml_precedence(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("n_envs: 4\nlr: 0.003\ngamma: 0.9\nhidden-sizes: [32, 32]\n")
    from_yaml = make_config(yaml_path=str(path))
    assert (from_yaml.n_envs, from_yaml.lr, from_yaml.gamma, from_yaml.hidden_sizes) == (4, 0.003, 0.9, [32, 32])
    assert from_yaml.n_steps == Config.n_steps  # untouched keys keep their defaults
    cfg = parse_cli(["--config", str(path), "--lr", "0.01", "--hidden-sizes", "16", "8"])
    assert cfg.lr == 0.01 and cfg.hidden_sizes == [16, 8]  # flag beats YAML
    assert cfg.n_envs == 4 and cfg.gamma == 0.9  # YAML beats default
    assert cfg.n_steps == Config.n_steps
    assert parse_cli([]) == make_config(yaml_path="ppo/cartpole")  # no flags: the embedded default's tuned config


def test_yaml_keys_get_the_flags_hints(tmp_path):
    """A YAML key spelled as SB3/CleanRL spell it names the key meant, as an unknown flag does."""
    path = tmp_path / "sb3.yaml"
    path.write_text("learning_rate: 0.001\n")
    assert one_line_error(make_config, yaml_path=str(path)).endswith("did you mean lr?")
    path.write_text("n_timesteps: 1000\n")
    assert one_line_error(make_config, yaml_path=str(path)).endswith("did you mean total_steps?")


def test_paths_are_accepted_where_strings_are(tmp_path):
    cfg = make_config({"run_dir": tmp_path / "run", "resume": Path("x")})
    assert cfg.run_dir == str(tmp_path / "run") and cfg.resume == "x"


@pytest.mark.parametrize("text, needle", [
    ("n_envz: 4\n", "n_envs"),
    ("n_envs: abc\n", "n_envs"),
    ("n_envs: [1, 2\n", "not valid YAML"),
    ("- 1\n- 2\n", "mapping"),
])
def test_bad_yaml_files(tmp_path, text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    message = one_line_error(parse_cli, ["--config", str(path)])
    assert needle in message


def test_missing_yaml_file(tmp_path):
    message = one_line_error(load_yaml, tmp_path / "missing.yaml")
    assert "missing.yaml" in message and "not found" in message


def test_empty_yaml_file_is_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert make_config(yaml_path=str(path)) == make_config()


def test_shipped_configs_load():
    import pathlib
    root = pathlib.Path(__file__).resolve().parent.parent / "configs"
    files = sorted(root.rglob("*.yaml"))
    assert files
    for path in files:
        make_config(yaml_path=str(path))


@pytest.mark.parametrize("argv, needle", [
    (["--n-envs", "abc"], "n_envs"),
    (["--no-such-flag", "1"], "unrecognized"),
    (["--n-envs"], "expected one argument"),
    (["--n-env", "4"], "unrecognized"),  # no prefix abbreviations
])
def test_bad_cli_flags(argv, needle):
    message = one_line_error(parse_cli, argv)
    assert needle in message


def test_help_lists_every_field_with_help():
    help_out = build_parser().format_help()
    squashed = "".join(help_out.split())  # argparse wraps lines, also at hyphens: compare without whitespace
    for name, f in FIELDS.items():
        flag = "--" + name.replace("_", "-")
        assert re.search(r"^\s+" + re.escape(flag) + r"\s", help_out, re.M), f"{flag} missing from --help"
        assert "".join(f.metadata["help"].split()) in squashed, f"help text of {name} missing from --help"
    text = help_out
    assert "--config" in text


# --------------------------------------------------------------------------- fuzz
def _is_integral_number(value) -> bool:
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return math.isfinite(x) and x.is_integer()


bad_int_values = st.one_of(
    st.text(max_size=12).filter(lambda s: not _is_integral_number(s)),
    st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not _is_integral_number(x)),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(name=st.sampled_from(INT_FIELDS), value=bad_int_values)
def test_fuzz_bad_int_values_raise_user_error(name, value):
    with pytest.raises(UserError):
        make_config({name: value})


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(POSITIVE_INTS), value=st.integers(max_value=0))
def test_fuzz_non_positive_sizes_raise_user_error(name, value):
    with pytest.raises(UserError):
        make_config({name: value})


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(FIELDS)),
       value=st.one_of(st.text(max_size=10), st.integers(min_value=-10**6, max_value=10**6),
                       st.floats(allow_nan=False, allow_infinity=False, width=32), st.booleans(), st.none(),
                       st.lists(st.integers(min_value=-5, max_value=300), max_size=3)))
def test_fuzz_any_value_is_accepted_or_user_error(name, value):
    """Whatever a YAML file or a flag holds, the outcome is a valid Config or a UserError, never a crash."""
    try:
        cfg = make_config({name: value})
    except UserError as e:
        assert "\n" not in str(e)
        return
    assert isinstance(cfg, Config)


@pytest.mark.parametrize("overrides", [{"lr": "nan"}, {"lr": "inf"}, {"clip_coef": "nan"}, {"max_grad_norm": "nan"}])
def test_non_finite_floats_are_rejected(overrides):
    with pytest.raises(UserError):
        make_config(overrides)


def test_huge_int_for_float_field_is_user_error():
    with pytest.raises(UserError):
        make_config({"lr": 10**400})


def test_embedded_default_matches_cartpole_yaml():
    from pathlib import Path
    yaml_path = Path(__file__).resolve().parent.parent / "configs" / "ppo" / "cartpole.yaml"
    tuned = make_config({}, str(yaml_path))
    assert tuned.stop_at_return == 475 and Config().stop_at_return == 0  # the tuned config stops once solved
    assert tuned == make_config({"stop_at_return": 475})


# --------------------------------------------------------------------------- per-algorithm keys
def _other_value(name: str, algo: str):
    """A valid value of ``name`` that differs from ``algo``'s default."""
    default = algo_default(algo, name)
    if isinstance(default, bool):
        return not default
    if name in ("gae_lambda", "vtrace_lambda"):
        return 0.5
    if name == "actor_timeout_s":
        return default * 2
    if isinstance(default, str):  # the Ray actor keys
        return {"actors": "ray", "ray_address": "127.0.0.1:6379", "actor_resources": "CPU=2"}[name]
    return default + 1 if isinstance(default, int) else default / 2 or 0.05


NOT_APPLICABLE = sorted((algo, name) for name, (algos, _, _) in APPLIES_TO.items()
                        for algo in ALGOS if algo not in algos)


def test_applicability_table_covers_the_issue():
    expected = {("impala", "n_epochs"), ("a2c", "clip_coef"), ("impala", "clip_vloss"), ("appo", "target_kl"),
                ("impala", "gae_lambda"), ("appo", "gae_lambda"), ("ppo", "n_actors"), ("a2c", "vtrace_lambda"),
                ("ppo", "actor_timeout_s"), ("a2c", "max_policy_lag")}
    assert expected <= set(NOT_APPLICABLE)
    for algo in ALGOS:
        assert (algo, "n_minibatches") not in NOT_APPLICABLE and (algo, "per_rank") not in NOT_APPLICABLE


@pytest.mark.parametrize("algo, name", NOT_APPLICABLE)
def test_key_that_does_not_apply_is_refused_in_one_line(algo, name):
    value = _other_value(name, algo)
    message = one_line_error(make_config, {"algo": algo, name: value})
    assert message.startswith(f"{name}=") and f"does not apply to {algo}" in message and "drop it" in message


def test_a_key_that_does_not_apply_shows_its_value_on_one_line():
    """The value is shown as repr, cut short: a newline in it (the fuzz test's find) stays one line."""
    try:
        make_config({"actor_resources": "\n" + "x" * 200})
    except UserError as e:
        message = str(e)
    assert "\n" not in message and message.startswith("actor_resources='\\nxxx") and "..." in message, message
    assert "does not apply to ppo" in message


@pytest.mark.parametrize("algo, name", NOT_APPLICABLE)
def test_key_that_does_not_apply_passes_at_its_default(algo, name, tmp_path):
    """A saved config.yaml holds every key; at the algorithm's own default a key is harmless."""
    make_config({"algo": algo, name: algo_default(algo, name)})
    path = tmp_path / "cfg.yaml"
    path.write_text(f"algo: {algo}\n{name}: {algo_default(algo, name)}\n")
    make_config(yaml_path=str(path))


def test_not_applicable_key_from_yaml_is_refused(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("algo: impala\nn_epochs: 4\n")
    message = one_line_error(parse_cli, ["--config", str(path)])
    assert "n_epochs=4 does not apply to impala" in message and "--algo appo" in message
    # a flag back to the default wins over the YAML value
    assert parse_cli(["--config", str(path), "--n-epochs", str(algo_default("impala", "n_epochs"))]).algo == "impala"


@pytest.mark.parametrize("algo", ALGOS)
def test_saved_config_of_every_algo_reloads(algo, tmp_path):
    import yaml
    cfg = make_config({"algo": algo})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    assert make_config(yaml_path=str(path)) == cfg
    assert make_config(cfg.to_dict()) == cfg


def test_algo_defaults_themselves_pass():
    for algo, defaults in ALGO_DEFAULTS.items():
        assert make_config({"algo": algo, **defaults}) == make_config({"algo": algo})


@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_actor_learner_compile_is_auto_or_off(algo):
    assert make_config({"algo": algo, "compile": "off"}).compile == "off"
    assert make_config({"algo": algo}).compile == "auto"
    for mode in ("default", "max-autotune"):
        message = one_line_error(make_config, {"algo": algo, "compile": mode})
        assert f"compile={mode}" in message and algo in message and "--compile off" in message


@pytest.mark.parametrize("overrides, needle", [({"device": "cuda:x"}, "device"), ({"device": "cuda:"}, "device"),
                                               ({"seed": -1}, "seed"), ({"seed": 10**20}, "seed")])
def test_device_string_and_seed_range(overrides, needle):
    assert needle in one_line_error(make_config, overrides)


@settings(max_examples=40, deadline=None)
@given(algo=st.sampled_from(ALGOS),
       chosen=st.lists(st.sampled_from(sorted(APPLIES_TO)), min_size=1, max_size=3, unique=True),
       at_default=st.lists(st.booleans(), min_size=3, max_size=3))
def test_fuzz_per_algorithm_keys(algo, chosen, at_default):
    """Any mix of algorithm-specific keys: accepted exactly when every key the algorithm does not read is at its
    default, else one line naming such a key and the algorithm."""
    given_values = {name: algo_default(algo, name) if keep else _other_value(name, algo)
                    for name, keep in zip(chosen, at_default)}
    foreign = {name for name, value in given_values.items()
               if algo not in APPLIES_TO[name][0] and value != algo_default(algo, name)}
    try:
        cfg = make_config({"algo": algo, **given_values})
    except UserError as e:
        message = str(e)
        assert "\n" not in message
        if foreign:
            assert any(message.startswith(f"{name}=") for name in foreign) and algo in message, message
        return
    assert not foreign, f"{sorted(foreign)} accepted for {algo}"
    for name, value in given_values.items():
        assert getattr(cfg, name) == value


# ------------------------------------------------------------------ the config an env trains with when none is given
def test_every_tuned_config_named_in_the_table_ships_and_trains_its_env():
    from fastrl.config import load_yaml
    from fastrl.defaults import _GYMNASIUM_TWINS, TUNED_CONFIGS, config_names
    shipped = set(config_names())
    for algo, table in TUNED_CONFIGS.items():
        for env, name in table.items():
            assert name in shipped, (algo, env, name)
            assert name.split("/")[0] == algo
            if env not in ("atari", "procgen") and env not in _GYMNASIUM_TWINS:
                assert load_yaml(name)["env"] == env, (env, name)


def test_an_env_with_a_tuned_config_trains_with_it_and_flags_override():
    from fastrl.run.run_config import build_config
    cfg, _ = build_config({"env": "Pendulum-v1"})
    pendulum = make_config(yaml_path="ppo/pendulum")
    assert cfg == pendulum and "ppo/pendulum" in cfg.origin
    cfg, _ = build_config({"env": "Pendulum-v1", "lr": "5e-4", "n_envs": 8})
    assert (cfg.lr, cfg.n_envs, cfg.gamma) == (5e-4, 8, pendulum.gamma)
    # Gymnasium's newer version of an EnvPool task shares its config; the env stays the one asked for
    cfg, _ = build_config({"env": "HalfCheetah-v5"})
    assert "ppo/halfcheetah" in cfg.origin and cfg.env == "HalfCheetah-v5" and cfg.hidden_sizes == [256, 256]
    # the embedded default is the CartPole config, by name or by omission
    cartpole = make_config(yaml_path="ppo/cartpole")  # Config() with the tuned config's stop rule
    assert build_config({})[0] == cartpole == build_config({"env": "CartPole-v1"})[0]
    assert cartpole == make_config({"stop_at_return": 475}) != Config()
    assert build_config({"algo": "a2c"})[0] == make_config(yaml_path="a2c/cartpole")


def test_an_env_without_one_gets_the_general_default_of_its_action_kind():
    from fastrl.defaults import GENERAL_DEFAULTS
    from fastrl.run.run_config import build_config
    cfg, _ = build_config({"env": "BipedalWalkerHardcore-v3"})  # continuous, no tuned config
    assert "continuous" in cfg.origin and "BipedalWalkerHardcore-v3" in cfg.origin
    assert all(getattr(cfg, k) == v for k, v in GENERAL_DEFAULTS["continuous"].items())
    cfg, _ = build_config({"env": "CartPole-v0", "n_envs": 4})  # discrete, no tuned config; flags still win
    assert "discrete" in cfg.origin and cfg.n_envs == 4 and cfg.lr == GENERAL_DEFAULTS["discrete"]["lr"]
    assert cfg.gamma != Config().gamma  # not the CartPole-tuned default
    # other algorithms keep their own defaults; a --config file lies over the env's tuned config, as flags do
    cfg, _ = build_config({"env": "CartPole-v0", "algo": "a2c"})
    assert cfg.lr == ALGO_DEFAULTS["a2c"]["lr"] and "a2c defaults" in cfg.origin
    cfg, _ = build_config({"env": "Pendulum-v1"}, "ppo/mujoco")
    assert cfg.n_steps == make_config(yaml_path="ppo/mujoco").n_steps and cfg.origin == "config ppo/mujoco over the tuned config ppo/pendulum"


def test_an_unknown_env_is_still_one_line():
    from fastrl.run.run_config import build_config
    with pytest.raises(UserError, match="unknown env id"):
        build_config({"env": "NoSuchEnv-v0"})


def test_changing_a_tuned_configs_rollout_shape_keeps_its_minibatch_size():
    """The zoo's settings are minibatches of 64: --n-envs/--n-steps alone keep that size (as n_minibatches), where it
    divides; the embedded default's n_minibatches stays a count; an explicit --n-minibatches wins."""
    from fastrl.run.run_config import build_config
    tuned = make_config(yaml_path="ppo/pendulum")
    assert tuned.minibatch_size == 64
    assert build_config({"env": "Pendulum-v1", "n_envs": 8})[0].minibatch_size == 64
    assert build_config({"env": "Pendulum-v1", "n_envs": 2, "n_steps": 16})[0].n_minibatches == 1
    assert build_config({"env": "Pendulum-v1", "n_envs": 8, "n_minibatches": 4})[0].n_minibatches == 4
    assert build_config({"n_envs": 2, "n_steps": 16})[0].n_minibatches == Config().n_minibatches


_OWN_POLICY = "recurrent={} builds fastrl's own policy without gSDE: drop use_sde and policy, or use --recurrent none"


@pytest.mark.parametrize("overrides, message", [
    ({"recurrent": "lstm", "use_sde": True}, _OWN_POLICY.format("lstm")),
    ({"recurrent": "gru", "policy": "my_models:Net"}, _OWN_POLICY.format("gru")),
    ({"recurrent": "lstm", "recurrent_size": 0}, "recurrent_size must be > 0, got 0"),
    ({"policy": "my_models:Net", "use_sde": True}, "use_sde (gSDE) is built into fastrl's MLP policy, not into a "
                                                   "custom policy class: drop use_sde, or give your class its own "
                                                   "exploration"),
])
def test_policy_settings_no_model_builds_are_refused_by_the_config(overrides, message):
    assert one_line_error(make_config, overrides) == message


def test_recurrent_size_is_checked_only_for_a_recurrent_policy():
    assert make_config({"recurrent_size": 0}).recurrent == "none"
