"""The Atari case of bounded, interruptible evaluation, as a user runs it: ``fastrl train --config ppo/atari`` with a
tiny budget ends (its final evaluation within the configured caps) and, on SIGINT during the final evaluation,
stops within one env step and exits 0 with the checkpoint written and no evaluation recorded."""
import json
import os
import signal
import subprocess
import sys
import threading

from conftest import QUIET

# One iteration with one epoch (not the config's 4): the evaluation after it is what these tests check.
TINY_ATARI = ["-m", "fastrl", "train", "--config", "ppo/atari", "--env", "Breakout-v5", "--total-steps", "1024",
              "--n-epochs", "1", "--env-threads", "1", *QUIET, "--quiet", "false"]


def _start(tmp_path, *extra):
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen([sys.executable, *TINY_ATARI, "--run-dir", str(tmp_path / "run"), *extra], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_atari_final_evaluation_is_capped(tmp_path):
    """The Atari config samples actions; a cap of 1,600 env steps over 16 games is 100 steps a game, said in one line."""
    proc = _start(tmp_path, "--eval-max-steps", "1600")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "final evaluation: 16 episodes (2 seeds x 8), sampled actions" in err, err
    assert "final evaluation: cut 16 of 16 episodes at 100 steps" in err, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["eval_return_mean"] is not None and not summary["stopped_by_signal"]
    assert json.loads(out.splitlines()[-1])["eval_return_mean"] == summary["eval_return_mean"]


def test_sigint_during_the_atari_final_evaluation(tmp_path):
    """Uncapped (27,000 steps a game, 200,000 in all), the evaluation outlasts the moment SIGINT arrives, sent as soon
    as the evaluation announces itself; the flag is checked before every env step."""
    proc = _start(tmp_path)
    watchdog = threading.Timer(300, proc.kill)  # a process that never announces its evaluation fails, not hangs
    watchdog.start()
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "final evaluation:" in line:
            proc.send_signal(signal.SIGINT)
            break
    else:
        raise AssertionError(f"no final evaluation announced: {''.join(lines)}")
    _, err = proc.communicate(timeout=60)
    watchdog.cancel()
    assert proc.returncode == 130, err  # interrupted (Ctrl-C), as the README says, though all was saved
    assert "final evaluation stopped by a signal" in err, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stopped_by_signal"] and summary["eval_return_mean"] is None
    assert list((tmp_path / "run" / "checkpoints").glob("*.pt")), "the final checkpoint precedes the evaluation"
