"""IMPALA / APPO: V-trace targets from the learner's T+1 values, reset-step masking, the slot ring and
weight board protocols, a short CartPole learning run, and the faults (SIGKILLed actor, SIGTERM)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

import kernels
from fastrl.actor_learner import FILLING, FREE, FULL, SlotRing, WeightBoard
from fastrl.config import UserError, make_config
from fastrl.envs import ActionSpec
from fastrl.impala import appo_update, impala_update, learner_forward, vtrace_targets
from fastrl.models import make_agent

from conftest import QUIET

REPO = Path(__file__).resolve().parents[1]
SPEC = ActionSpec("discrete", n=2)


def _batch(T=6, N=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    done = torch.zeros(T, N, dtype=torch.bool)
    terminated = torch.zeros(T, N, dtype=torch.bool)
    truncated = torch.zeros(T, N, dtype=torch.bool)
    terminated[1, 0] = True   # env 0: terminates at t=1, reset step at t=2
    truncated[3, 1] = True    # env 1: truncated at t=3, reset step at t=4
    done = terminated | truncated
    valid = torch.ones(T, N, dtype=torch.bool)
    valid[1:] = ~done[:-1]
    reward = torch.rand(T, N, generator=g) * valid
    batch = TensorDict({
        "observation": torch.randn(T, N, 4, generator=g),
        "action": torch.randint(0, 2, (T, N), generator=g),
        "sample_log_prob": -torch.rand(T, N, generator=g),
        "valid": valid,
        "next": TensorDict({"reward": reward, "done": done, "terminated": terminated, "truncated": truncated},
                           batch_size=[T, N]),
    }, batch_size=[T, N])
    return batch, torch.randn(N, 4, generator=g)


def _cfg(**kw):
    return make_config({"algo": "impala", **kw})


def _agent(cfg):
    torch.manual_seed(0)
    return make_agent(cfg, (4,), SPEC)


def test_learner_forward_uses_t_plus_one_observations():
    cfg = _cfg()
    agent = _agent(cfg)
    batch, boot = _batch()
    target_logp, entropy, value = learner_forward(agent, batch["observation"], boot, batch["action"])
    assert target_logp.shape == entropy.shape == (6, 3) and value.shape == (7, 3)
    torch.testing.assert_close(value[:-1], agent.get_value(batch["observation"].flatten(0, 1)).view(6, 3))
    torch.testing.assert_close(value[-1], agent.get_value(boot))
    _, logp, _, _ = agent.get_action_and_value(batch["observation"].flatten(0, 1), batch["action"].flatten())
    torch.testing.assert_close(target_logp, logp.view(6, 3))


def test_vtrace_targets_bootstrap_truncation_not_termination():
    """On-policy (rho = c = 1): vs at an episode's last step is r + gamma * V(real final obs) when truncated
    and r alone when terminated; both equal the reference twin fed next_value[t] = value[t + 1]."""
    cfg = _cfg(gamma=0.9)
    agent = _agent(cfg)
    batch, boot = _batch()
    with torch.no_grad():
        target_logp, _, value = learner_forward(agent, batch["observation"], boot, batch["action"])
    batch["sample_log_prob"] = target_logp.clone()
    vs, pg_adv, stats = vtrace_targets(batch, target_logp, value, cfg)
    nxt = batch["next"]
    ref_vs, ref_adv = kernels.vtrace_reference(target_logp, target_logp, nxt["reward"], value[:-1], value[1:],
                                               nxt["done"], nxt["terminated"], 0.9)
    torch.testing.assert_close(vs, ref_vs)
    torch.testing.assert_close(pg_adv, ref_adv)
    r = nxt["reward"]
    torch.testing.assert_close(vs[1, 0], r[1, 0])                            # terminated: no bootstrap
    torch.testing.assert_close(vs[3, 1], r[3, 1] + 0.9 * value[4, 1])        # truncated: V(final obs)
    torch.testing.assert_close(vs[-1, 2], r[-1, 2] + 0.9 * value[-1, 2])     # rollout end: V(bootstrap obs)
    assert abs(stats["vtrace/rho_mean"].item() - 1.0) < 1e-5 and stats["vtrace/rho_clipfrac"].item() == 0.0


@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_reset_steps_are_masked_out_of_the_update(algo):
    """The action, behaviour log-prob and reward of auto-reset steps (valid False) change nothing."""
    cfg = make_config({"algo": algo, "n_envs": 3, "n_steps": 6, "n_minibatches": 1, "n_epochs": 1})
    results = []
    for perturb in (False, True):
        agent = _agent(cfg)
        optimizer = torch.optim.SGD(agent.parameters(), lr=0.1)
        batch, boot = _batch()
        if perturb:
            invalid = ~batch["valid"]
            batch["action"][invalid] = 1 - batch["action"][invalid]
            batch["sample_log_prob"][invalid] = -5.0
        update = impala_update if algo == "impala" else appo_update
        metrics = update(agent, optimizer, batch, boot, cfg) if algo == "impala" else update(
            agent, optimizer, batch, boot, cfg, torch.Generator().manual_seed(0))
        results.append((metrics["losses/policy_loss"], torch.nn.utils.parameters_to_vector(agent.parameters())))
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])


@pytest.mark.parametrize("n_minibatches", [1, 3])
def test_impala_update_changes_weights_and_reports(n_minibatches):
    """One step per env-column minibatch; every sample used once (n_epochs is ignored by IMPALA)."""
    cfg = _cfg(n_envs=3, n_epochs=4, n_minibatches=n_minibatches)
    agent = _agent(cfg)
    before = torch.nn.utils.parameters_to_vector(agent.parameters()).clone()
    batch, boot = _batch()
    metrics = impala_update(agent, torch.optim.Adam(agent.parameters(), lr=1e-3), batch, boot, cfg,
                            torch.Generator().manual_seed(0))
    assert metrics["losses/n_updates"].item() == n_minibatches
    assert not torch.equal(before, torch.nn.utils.parameters_to_vector(agent.parameters()))
    for key in ("losses/policy_loss", "losses/value_loss", "losses/entropy", "vtrace/rho_mean", "vtrace/rho_clipfrac"):
        assert torch.isfinite(metrics[key]), key


def test_slot_ring_protocol_and_reclaim():
    ring = SlotRing(4, 2, 3, 2, (4,), torch.float32, SPEC)
    assert list(ring.owned(1)) == [2, 3]
    assert ring.rollout.batch_size == (4, 3, 2) and ring.bootstrap_observation.shape == (4, 2, 4)
    assert ring.rollout.is_shared()
    assert ring.acquire(3) and not ring.acquire(3)
    ring.commit(3, version=7)
    assert ring.acquire(0)
    time.sleep(0.001)
    ring.commit(0, version=8)
    assert ring.full_slots().tolist() == [3, 0]  # oldest first
    assert ring.acquire(1) and ring.acquire(2)
    assert ring.reclaim(0) == 1  # actor 0 died while filling slot 1; its full slot 0 stays
    assert ring.state.tolist() == [FULL, FREE, FILLING, FULL]
    ring.release(3)
    assert ring.full_slots().tolist() == [0] and int(ring.version[0]) == 8


def test_weight_board_round_trip():
    cfg = _cfg()
    learner, actor = _agent(cfg), make_agent(cfg, (4,), SPEC)
    board = WeightBoard(learner)
    board.publish(learner, version=5)
    version, seq = board.pull(actor)
    assert version == 5 and seq == board.seq() and seq % 2 == 0
    for a, b in zip(learner.parameters(), actor.parameters()):
        torch.testing.assert_close(a, b)


def test_config_validation():
    with pytest.raises(UserError, match="n_slots"):
        make_config({"algo": "impala", "n_actors": 3, "n_slots": 8})
    with pytest.raises(UserError, match="learner_batch"):
        make_config({"algo": "appo", "n_actors": 2, "n_slots": 2, "learner_batch": 4})
    with pytest.raises(UserError, match="normalize"):
        make_config({"algo": "impala", "normalize_obs": True})
    with pytest.raises(UserError, match="env columns"):
        make_config({"algo": "impala", "n_envs": 6, "n_steps": 16, "n_minibatches": 4})
    with pytest.raises(UserError, match="sync_interval"):
        make_config({"algo": "impala", "sync_interval": 50, "max_policy_lag": 50})
    make_config({"algo": "ppo", "n_actors": 3, "n_slots": 8})  # only checked for impala/appo


def test_auto_sync_interval_stays_below_max_policy_lag():
    """Small rollouts make ~10k env steps many updates; the auto interval is capped so rollouts stay usable."""
    from fastrl.actor_learner import Learner
    cfg = make_config({"algo": "impala", "n_envs": 4, "n_steps": 16, "max_policy_lag": 50})
    learner = Learner(cfg, torch.device("cpu"), (4,), torch.float32, SPEC)
    assert learner.sync_interval == 25
    cfg = make_config({"algo": "impala", "n_envs": 16, "n_steps": 32, "max_policy_lag": 0})
    assert Learner(cfg, torch.device("cpu"), (4,), torch.float32, SPEC).sync_interval == 20


# ------------------------------------------------------------------ processes
def _children(pid: int) -> list:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _actor_pids(pid: int) -> list:
    pids = []
    for child in _children(pid):
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                pids.append(child)
        except OSError:
            pass
    return pids


def _train(run_dir: Path, *flags) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "fastrl.train", "--algo", "impala", "--run-dir", str(run_dir), *QUIET, *flags]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_metrics(proc, run_dir: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    metrics = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.exists() and metrics.read_text().strip():
            return
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    proc.kill()
    pytest.fail("no metrics within the time limit")


def test_cartpole_learns(tmp_path):
    """A short IMPALA run reaches a mean return of 150 on CartPole-v1 (stops early once it does)."""
    from fastrl.train import main
    cfg = str(REPO / "configs" / "impala" / "cartpole.yaml")
    assert main(["--config", cfg, "--run-dir", str(tmp_path), "--total-steps", "300000", "--stop-at-return", "195",
                 "--eval-episodes", "0", *QUIET]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["episode_return_mean"] >= 150, summary
    assert summary["actor_restarts"] == 0 and summary["policy_lag_max"] >= 0
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    for key in ("staleness/policy_lag_mean", "staleness/policy_lag_max", "vtrace/rho_mean", "vtrace/rho_clipfrac",
                "queue/learner_wait_s", "charts/actor_sps", "losses/value_loss"):
        assert key in record, key


def test_killed_actor_is_restarted_and_training_finishes(tmp_path):
    """With a single actor the learner cannot finish unless the SIGKILLed actor comes back."""
    proc = _train(tmp_path, "--n-actors", "1", "--n-slots", "2", "--n-envs", "4", "--n-steps", "16",
                  "--total-steps", "20000", "--eval-episodes", "0", "--log-interval", "5")
    try:
        _wait_for_metrics(proc, tmp_path)
        actors = _actor_pids(proc.pid)
        assert len(actors) == 1, actors
        os.kill(actors[0], signal.SIGKILL)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["actor_restarts"] >= 1 and summary["total_steps"] >= 20000, summary
    assert not summary["stopped_by_signal"]


def test_sigterm_stops_cleanly_with_checkpoint_and_no_orphans(tmp_path):
    proc = _train(tmp_path, "--n-actors", "2", "--n-slots", "4", "--n-envs", "4", "--n-steps", "16",
                  "--total-steps", "100000000", "--log-interval", "5")
    try:
        _wait_for_metrics(proc, tmp_path)
        children = _children(proc.pid)
        assert len(_actor_pids(proc.pid)) == 2
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
        elapsed = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert elapsed < 10, elapsed
    assert list((tmp_path / "checkpoints").glob("ckpt_*.pt"))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stopped_by_signal"] and summary["total_steps"] > 0
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if _alive(pid)], "child processes outlived the learner"
