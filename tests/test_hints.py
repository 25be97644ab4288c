"""The "did you mean" of unknown names (``fastrl.hints``): other libraries' names answered with fastrl's (or with what
fastrl lacks), typos with the near name of the same first letter, and no look-alike of another meaning."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fastrl
from conftest import one_line_error, parse_cli
from fastrl.config import make_config
from fastrl.hints import close_names, edit_distance

REPO = Path(__file__).resolve().parent.parent
QUIET = dict(progress=False, wandb="disabled", tensorboard=False, plot=False, quiet=True)


def test_edit_distance_and_close_names():
    assert edit_distance("gama", "gamma") == 1 and edit_distance("lr", "rl") == 1
    assert edit_distance("callback", "rollback") == 2 and edit_distance("", "abc") == 3
    assert close_names("gama", ["gamma", "seed"]) == ["gamma"]
    assert close_names("total-step", ["total_steps", "torch_threads"]) == ["total_steps"]
    assert close_names("callback", ["rollback"]) == [], "a look-alike of another meaning"
    assert close_names("n_trials", ["env_threads", "n_steps", "n_slots"]) == []
    assert close_names("lrr", ["lr", "lr_floor"]) == ["lr"]


@pytest.mark.parametrize("key, expected", [
    ("callback", "did you mean callbacks="),
    ("policy_kwargs", "net_arch -> hidden_sizes"),
    ("net_arch", "did you mean hidden_sizes"),
    ("lstm_hidden_size", "did you mean recurrent_size (with --recurrent lstm)?"),
    ("enable_critic_lstm", "actor and critic share: --recurrent lstm"),
    ("use_masking", "action_mask key or the env's action_masks() method"),
    ("learning_rate", "did you mean lr?"),
    ("n_trials", "did you mean trials (fastrl tune)?"),
    ("activation_fn", "did you mean activation?"),
    ("log_std_init", "did you mean init_log_std?"),
])
def test_other_libraries_keys_get_fastrls_name(key, expected):
    message = one_line_error(make_config, {key: 1})
    assert expected in message, message
    assert "rollback" not in message and "max_policy_lag" not in message and "env_threads" not in message


def test_a_users_own_policy_class_may_bear_an_sb3_name():
    assert make_config({"policy": "mymod:MlpLstmPolicy"}).policy == "mymod:MlpLstmPolicy"


def test_sb3_spellings_fastrl_shares_are_keys():
    cfg = make_config({"n_epochs": 3, "ent_coef": 0.01, "gae_lambda": 0.9, "vf_coef": 0.4, "max_grad_norm": 1.0})
    assert (cfg.n_epochs, cfg.ent_coef, cfg.gae_lambda, cfg.vf_coef, cfg.max_grad_norm) == (3, 0.01, 0.9, 0.4, 1.0)


@pytest.mark.parametrize("argv, expected", [
    (["--net-arch", "64"], "did you mean --hidden-sizes"),
    (["--n-trials", "4"], "did you mean --trials (fastrl tune)?"),
    (["--policy-kwargs", "x"], "net_arch -> hidden_sizes"),
    (["--lstm-hidden-size", "64"], "did you mean --recurrent-size (with --recurrent lstm)?"),
    (["--policy", "MlpLstmPolicy"], "--recurrent lstm (or gru)"),
    (["--policy", "sb3_contrib:MaskablePPO"], "action_mask key"),
    (["--policy", "MlpPolicy"], "the default: drop policy"),
    (["--policy", "stable_baselines3.ppo:MlpPolicy"], "the default: drop policy"),
    (["--policy", "stable_baselines3.common.policies:ActorCriticPolicy"], "not a Stable-Baselines3 class"),
])
def test_other_libraries_flags_and_policies_get_fastrls_name(argv, expected):
    message = one_line_error(parse_cli, argv)
    assert expected in message, message


def test_train_keywords_get_hints():
    assert "did you mean callbacks=" in one_line_error(fastrl.train, env="CartPole-v1", callback=print)
    assert "rollback" not in one_line_error(fastrl.train, env="CartPole-v1", callback=print)
    assert "net_arch -> hidden_sizes" in one_line_error(fastrl.train, policy_kwargs={"net_arch": [64]})


def test_tune_offers_its_own_flags(tmp_path, capsys):
    from fastrl.cli import main
    (tmp_path / "space.yaml").write_text("ent_coef: {type: uniform, low: 0.0, high: 0.01}\n")
    for flag in ("--n-trials", "--trails"):
        assert main(["tune", "--space", str(tmp_path / "space.yaml"), "--dir", str(tmp_path / "d"), flag, "8"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "did you mean --trials" in err and "env-threads" not in err, err


def test_recurrent_ppo_as_policy_is_one_line_naming_the_flag_and_leaves_no_run_dir(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.run([sys.executable, "-m", "fastrl", "train", "--policy", "sb3_contrib:RecurrentPPO",
                           "--run-dir", str(tmp_path / "run"), "--total-steps", "64"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "--recurrent lstm" in lines[0], proc.stderr[-2000:]
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


def test_a_start_that_fails_after_the_run_dir_leaves_none(tmp_path):
    """The policy is found wanting only when the trainer builds it, after the run directory was made and locked."""
    run_dir = tmp_path / "nested" / "run"
    message = one_line_error(fastrl.train, env="CartPole-v1", policy="fastrl.config:Config", run_dir=run_dir,
                             total_steps=64, n_envs=2, n_steps=16, **QUIET)
    assert "is not an nn.Module class" in message and "cls(observation_shape, action_spec, config)" in message
    assert not run_dir.exists(), list(run_dir.iterdir())
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    one_line_error(fastrl.train, env="CartPole-v1", policy="fastrl.config:Config", run_dir=kept, total_steps=64,
                   n_envs=2, n_steps=16, **QUIET)
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"], "a directory holding other files stays, unlocked"
