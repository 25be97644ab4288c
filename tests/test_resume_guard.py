"""A resume is a continuation or a one-line refusal, and no file makes fastrl import or call code: a checkpoint
naming a ``module:Name`` env is loaded only with the env passed explicitly. Also the one-line errors the issue found
as tracebacks (other architecture or env on resume, a mismatched state_dict, a binary YAML, --run-dir /proc/x), and a
hypothesis fuzz of --resume with changed flags."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from conftest import QUIET, train_main
from fastrl.run.checkpoint import list_checkpoints
from fastrl.run.run_config import RESUME_FIXED

TINY = ["--env", "CartPole-v1", "--n-envs", "4", "--n-steps", "32", "--n-epochs", "2", "--n-minibatches", "2",
        "--torch-threads", "1", "--device", "cpu", "--eval-episodes", "0"]
TESTS_DIR = Path(__file__).parent


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished run of 256 steps (2 iterations of 128), checkpointed at each iteration."""
    run_dir = tmp_path_factory.mktemp("resume") / "run"
    assert train_main(TINY + QUIET + ["--total-steps", "256", "--checkpoint-interval", "1", "--run-dir",
                                      str(run_dir)]) == 0
    return run_dir


@pytest.fixture
def run_copy(finished_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    return copy


def _one_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fastrl: error:"), lines
    return lines[0]


@pytest.mark.parametrize("flags, named", [
    (["--hidden-sizes", "128", "128"], "hidden_sizes [64, 64] -> [128, 128]"),
    (["--env", "Acrobot-v1"], "env 'CartPole-v1' -> 'Acrobot-v1'"),
    (["--algo", "a2c"], "algo 'ppo' -> 'a2c'"),
    (["--n-envs", "64", "--total-steps", "80000"], "n_envs 4 -> 64"),
])
def test_resume_that_changes_the_run_is_refused_naming_the_keys(run_copy, capsys, flags, named):
    before = (run_copy / "metrics.jsonl").read_bytes()
    assert train_main(["--resume", str(run_copy), *flags, *QUIET]) == 2
    assert named in _one_line(capsys)
    assert (run_copy / "metrics.jsonl").read_bytes() == before


@pytest.mark.parametrize("total, needle", [("128", "past total_steps=128"),
                                           ("256", "already trained its budget of 256 steps; pass --total-steps 384"),
                                           ("300", "already trained its budget of 256 steps; pass --total-steps 384")])
def test_resume_that_would_train_nothing_is_refused(run_copy, capsys, total, needle):
    assert train_main(["--resume", str(run_copy), "--total-steps", total, *QUIET]) == 2
    assert needle in _one_line(capsys)


def test_resume_with_a_mismatched_state_dict_is_one_line(run_copy, capsys):
    ckpt = list_checkpoints(run_copy / "checkpoints")[-1]
    state = torch.load(ckpt, weights_only=True)
    state.pop("checksum")  # a crafted file, as one written before checksums
    name = next(k for k in state["model"] if k.endswith("weight"))
    state["model"][name] = torch.zeros(3, 3)
    torch.save(state, ckpt)
    assert train_main(["--resume", str(run_copy), "--total-steps", "512", *QUIET]) == 2
    line = _one_line(capsys)
    assert "does not fit this run's model" in line and name in line


def test_binary_yaml_and_unwritable_run_dir_are_one_line(tmp_path, capsys):
    binary = tmp_path / "c.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    assert train_main(["--config", str(binary), *QUIET]) == 2
    assert "not text" in _one_line(capsys)
    assert train_main(TINY + QUIET + ["--total-steps", "128", "--run-dir", "/proc/x"]) == 2
    assert "'/proc/x' cannot be created" in _one_line(capsys)


# --------------------------------------------------------------------------- nothing from a file runs code
PROBE = textwrap.dedent("""
    import sys
    import fastrl
    from fastrl.cli import main as cli
    from fastrl.train import main as train
    run = sys.argv[1]
    print("eval", cli(["eval", run, "--episodes", "1", "--seeds", "1"]))
    print("resume", train(["--resume", run, "--total-steps", "512", "--wandb", "disabled", "--progress", "false"]))
    agent = fastrl.load(run)  # acting needs only the spaces the checkpoint carries
    print("load", agent.predict([0.0, 0.0, 0.0, 0.0])[0] in (0, 1))
    try:
        agent.evaluate(episodes=1)  # stepping the env needs it named
    except fastrl.UserError as e:
        print("evaluate refused", e, file=sys.stderr)
    print("imported", "fastrl_fault_envs" in sys.modules)
    fastrl.load(run, env="fastrl_fault_envs:touch_marker").evaluate(episodes=1)  # named by the user: now it may run
""")


def test_a_checkpoint_never_makes_fastrl_import_or_call_code(run_copy, tmp_path):
    """A tampered checkpoint names ``fastrl_fault_envs:touch_marker`` as its env: fastrl eval, --resume and the
    loaded agent's evaluate each refuse with one line saying how to pass the env, and neither import nor call it
    (fastrl.load acts from the spaces the checkpoint carries); passing the env explicitly is what makes it run."""
    for ckpt in list_checkpoints(run_copy / "checkpoints"):
        state = torch.load(ckpt, weights_only=True)
        state["config"]["env"] = "fastrl_fault_envs:touch_marker"
        state.pop("checksum")  # a crafted file, as one written before checksums
        torch.save(state, ckpt)
    marker = tmp_path / "called"
    env = {**os.environ, "FASTRL_MARKER": str(marker), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", PROBE, str(run_copy)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["eval", "2", "resume", "2", "load", "True", "imported", "False"], done.stdout
    errors = [line for line in done.stderr.splitlines() if "error" in line or "refused" in line]
    assert len(errors) == 3 and all("--env fastrl_fault_envs:touch_marker" in line for line in errors), errors
    assert marker.read_text() == "called\n" * marker.read_text().count("called"), "only the explicit env= call ran it"


# --------------------------------------------------------------------------- fuzz: --resume with changed flags
CHANGES = {
    "--hidden-sizes": [["64", "64"], ["32"]],
    "--env": [["CartPole-v1"], ["Acrobot-v1"]],
    "--algo": [["ppo"], ["a2c"]],
    "--n-envs": [["4"], ["8"]],
    "--n-steps": [["32"], ["16"]],
    "--activation": [["tanh"], ["relu"]],
    "--lr": [["0.001"], ["0.0003"]],
    "--n-epochs": [["2"], ["1"]],
    "--seed": [["1"], ["2"]],
}
TOTALS = [["128"], ["256"], ["300"], ["512"], ["512"], ["640"]]
SAVED = {"--hidden-sizes": ["64", "64"], "--env": ["CartPole-v1"], "--algo": ["ppo"], "--n-envs": ["4"],
         "--n-steps": ["32"], "--activation": ["tanh"]}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(changes=st.sets(st.sampled_from(sorted(CHANGES)), max_size=2).flatmap(
    lambda keys: st.fixed_dictionaries({"--total-steps": st.sampled_from(TOTALS),
                                        **{k: st.sampled_from(CHANGES[k]) for k in keys}})))
@example(changes={"--total-steps": ["512"], "--lr": ["0.0003"], "--seed": ["2"]})
@example(changes={"--total-steps": ["512"], "--n-envs": ["4"], "--hidden-sizes": ["64", "64"]})
def test_fuzz_resume_with_changed_flags_continues_or_refuses_in_one_line(finished_run, capsys, changes):
    """Whatever flags change on --resume, the outcome is a continuation (exit 0, steps past the checkpoint logged
    once, in order) or a one-line refusal naming what changed; never a traceback, never a run that trains nothing."""
    flags = [part for flag, values in changes.items() for part in (flag, *values)]
    changed_fixed = [flag for flag, values in changes.items()
                     if flag.strip("-").replace("-", "_") in RESUME_FIXED and values != SAVED[flag]]
    total = int(changes.get("--total-steps", ["256"])[0])
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        shutil.copytree(finished_run, run_dir)
        capsys.readouterr()
        code = train_main(["--resume", str(run_dir), *flags, *QUIET])
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        event("refused" if code else "continued")
        if changed_fixed:
            assert code == 2 and len(err) == 1, (flags, err)
            assert all(flag.strip("-").replace("-", "_") in err[0] for flag in changed_fixed), (flags, err)
        elif total < 384:  # nothing left to train (the budget rounds down to whole iterations of 128)
            assert code == 2 and len(err) == 1 and ("past total_steps" in err[0] or "already trained" in err[0]), err
        else:
            assert code == 0, (flags, err)
            steps = [json.loads(line)["global_step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            assert steps == list(range(128, total // 128 * 128 + 1, 128)), steps
