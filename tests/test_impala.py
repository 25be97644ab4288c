"""IMPALA / APPO: V-trace targets from the learner's T+1 values, reset-step masking, the slot ring and
weight board protocols, a short run's summary and step arithmetic, learning CartPole (the median of 3 seeds),
and the faults (SIGKILLed actor, SIGTERM)."""
import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from tensordict import TensorDict

from fastrl import kernels
from fastrl.config import UserError, make_config
from fastrl.distributed.actors import FILLING, FREE, FULL, SlotRing, WeightBoard
from fastrl.envs.spaces import ActionSpec
from fastrl.learn.impala import learner_batch, learner_forward, vtrace_targets
from fastrl.learn.models import make_agent
from fastrl.learn.stacked import FlatLayout
from fastrl.learn.update import (VTRACE_STAT_KEYS, Update, UpdateSpec, learner_minibatch_index, member_hparams,
                                 stat_names)

from conftest import QUIET, SUMMARY_KEYS, median_of_seeds, one_line_error
from reference_update import reference_learner_update, reference_optimizer

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
    target_logp, entropy, value = learner_forward(agent.get_action_and_value, batch["observation"], boot,
                                                  batch["action"])
    assert target_logp.shape == entropy.shape == (6, 3) and value.shape == (7, 3)
    torch.testing.assert_close(value[:-1], agent.get_value(batch["observation"].flatten(0, 1)).view(6, 3))
    torch.testing.assert_close(value[-1], agent.get_value(boot))
    _, logp, _, _ = agent.get_action_and_value(batch["observation"].flatten(0, 1), batch["action"].flatten())
    torch.testing.assert_close(target_logp, logp.view(6, 3))


def test_vtrace_targets_bootstrap_truncation_not_termination():
    """On-policy (rho = c = 1): vs at an episode's last step is r + gamma * V(real final obs) when truncated
    and r alone when terminated; both equal the reference twin fed next_value[t] = value[t + 1]."""
    agent = _agent(_cfg())
    batch, boot = _batch()
    with torch.no_grad():
        target_logp, _, value = learner_forward(agent.get_action_and_value, batch["observation"], boot,
                                                batch["action"])
    batch["sample_log_prob"] = target_logp.clone()
    nxt = batch["next"]
    vs, pg_adv, stats = vtrace_targets(target_logp, target_logp, value, nxt["reward"], nxt["done"], nxt["terminated"],
                                       batch["valid"], 0.9)
    ref_vs, ref_adv = kernels.vtrace_reference(target_logp, target_logp, nxt["reward"], value[:-1], value[1:],
                                               nxt["done"], nxt["terminated"], 0.9)
    torch.testing.assert_close(vs, ref_vs)
    torch.testing.assert_close(pg_adv, ref_adv)
    r = nxt["reward"]
    torch.testing.assert_close(vs[1, 0], r[1, 0])                            # terminated: no bootstrap
    torch.testing.assert_close(vs[3, 1], r[3, 1] + 0.9 * value[4, 1])        # truncated: V(final obs)
    torch.testing.assert_close(vs[-1, 2], r[-1, 2] + 0.9 * value[-1, 2])     # rollout end: V(bootstrap obs)
    assert abs(stats["vtrace/rho_mean"].item() - 1.0) < 1e-5 and stats["vtrace/rho_clipfrac"].item() == 0.0


def _learner_cfg(**overrides):
    """A learner batch of one 2-actor rollout: 6 envs in all, 3 per actor (``_batch``'s N), 6 steps."""
    return make_config({"algo": "impala", "n_envs": 6, "n_actors": 2, "n_slots": 2, "n_steps": 6, "lr": 3e-3,
                        "gamma": 0.9, "n_minibatches": 1, **overrides})


def _learner_inputs(cfg, batch, boot, seed=0):
    """The update's batch (``VTRACE_KEYS`` and the minibatch index the learner draws) and the index alone."""
    index = learner_minibatch_index(UpdateSpec.of(cfg), *batch.batch_size, torch.Generator().manual_seed(seed), "cpu")
    inputs = learner_batch(batch, boot)
    return ({**inputs, "minibatch_index": index} if index is not None else inputs), index


def _learner_update(cfg, agent, batch, boot, seed=0):
    """One update the way ``ActorLearnerTrainer`` runs it: the agent bound to flat weights, eager autograd through it,
    weights and optimizer state written in place after every step. Returns ``(flat weights, metrics)``."""
    layout = FlatLayout(agent)
    params = layout.flatten(agent)
    layout.bind(agent, params)
    update = Update(UpdateSpec.of(cfg), layout, path="module", agent=agent)
    inputs, _ = _learner_inputs(cfg, batch, boot, seed)
    metrics = update(params, update.init_opt_state(params), inputs, member_hparams(cfg, "cpu"), in_place=True)[2]
    return params, metrics


LEARNER_CASES = [dict(), dict(n_minibatches=3, optimizer="rmsprop"), dict(max_grad_norm=0.05, norm_adv=False),
                 dict(algo="appo", n_epochs=2, n_minibatches=2), dict(algo="appo", optimizer="rmsprop", n_epochs=1),
                 dict(algo="appo", n_epochs=3, n_minibatches=3, clip_vloss=False, clip_coef=0.1)]


@pytest.mark.parametrize("overrides", LEARNER_CASES,
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "impala")
def test_learner_update_equals_the_torch_optim_twin(overrides):
    """The learner's pure update (eager, through the bound module; and functional, what compiles) against torch.optim
    plus autograd of the same V-trace loss, parameters within 1e-6."""
    cfg = _learner_cfg(**overrides)
    agent = _agent(cfg)
    start = FlatLayout(agent).flatten(agent)
    twin, functional_agent = copy.deepcopy(agent), copy.deepcopy(agent)
    batch, boot = _batch()
    batch["sample_log_prob"] -= 0.3 * torch.rand(6, 3, generator=torch.Generator().manual_seed(5))  # off-policy
    params, metrics = _learner_update(cfg, agent, batch, boot)
    inputs, index = _learner_inputs(cfg, batch, boot)
    counts = reference_learner_update(twin, reference_optimizer(twin, cfg), cfg, learner_batch(batch, boot), index,
                                      cfg.lr)
    torch.testing.assert_close(params, FlatLayout(twin).flatten(twin), atol=1e-6, rtol=1e-5)
    spec = UpdateSpec.of(cfg)
    assert metrics["n_updates"].item() == counts["n_updates"] == spec.n_steps and counts["nonfinite_updates"] == 0
    update = Update(spec, FlatLayout(functional_agent))
    functional, _, _ = update(start, update.init_opt_state(start), inputs, member_hparams(cfg, "cpu"))
    torch.testing.assert_close(functional, params, atol=1e-6, rtol=1e-5)
    expected = set(stat_names(cfg.algo)) | {"n_updates", "nonfinite_updates"} | set(VTRACE_STAT_KEYS)
    assert set(metrics) == expected and all(bool(torch.isfinite(v)) for v in metrics.values()), metrics


@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_compiled_learner_update_equals_eager(algo):
    """The same pure update under torch.compile(fullgraph=True) on CPU (the V-trace kernel as its registered op)."""
    # Each step is unrolled in the graph: IMPALA's 3 minibatches cover the split, APPO's 2 epochs the epoch loop.
    cfg = _learner_cfg(algo=algo, **({"n_minibatches": 3} if algo == "impala" else {"n_epochs": 2, "n_minibatches": 1}))
    agent = _agent(cfg)
    layout = FlatLayout(agent)
    update = Update(UpdateSpec.of(cfg), layout)
    params = layout.flatten(agent)
    batch, boot = _batch()
    inputs, _ = _learner_inputs(cfg, batch, boot)
    hparams = member_hparams(cfg, "cpu")
    eager, _, eager_metrics = update(params, update.init_opt_state(params), inputs, hparams)
    compiled = torch.compile(update, backend="aot_eager", fullgraph=True)
    result, _, metrics = compiled(params, update.init_opt_state(params), inputs, hparams)
    torch.testing.assert_close(result, eager, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(metrics["policy_loss"], eager_metrics["policy_loss"], atol=1e-5, rtol=1e-5)
    assert not torch.equal(result, params)


def test_the_vtrace_gradient_by_parameter_concatenated_equals_the_gradient_by_the_flat_vector():
    """The functional V-trace gradient pulls back to each parameter's view and concatenates (what inductor compiles
    well); the vector-Jacobian product with respect to the flat vector itself gives the same numbers, bit for bit."""
    from functools import partial

    from torch.func import grad, vjp
    cfg = _learner_cfg()
    agent = _agent(cfg)
    layout = FlatLayout(agent)
    update = Update(UpdateSpec.of(cfg), layout)
    params = layout.flatten(agent)
    batch, boot = _batch()
    batch["sample_log_prob"] -= 0.3 * torch.rand(6, 3, generator=torch.Generator().manual_seed(5))
    inputs, _ = _learner_inputs(cfg, batch, boot)
    minibatch, _ = update.inputs(params, inputs)
    hparams = member_hparams(cfg, "cpu")
    by_views, loss, _ = update.gradient(params, update.init_opt_state(params), minibatch, hparams)

    def forward(flat):
        return learner_forward(partial(layout.call, "get_action_and_value", flat), *minibatch[:3], update.autocast)
    outputs, pullback = vjp(forward, params)
    targets = update.vtrace_targets_of(outputs[0], outputs[2], minibatch)
    cotangents = grad(lambda *o: update.vtrace_loss_of(*o, targets, minibatch, hparams)[0], argnums=(0, 1, 2))(*outputs)
    by_flat, = pullback(cotangents)
    assert by_views.shape == params.shape and by_views.abs().sum() > 0
    assert torch.equal(by_views, by_flat)


@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_reset_steps_are_masked_out_of_the_update(algo):
    """The action, behaviour log-prob and reward of auto-reset steps (valid False) change nothing."""
    cfg = _learner_cfg(algo=algo, **({"n_epochs": 1} if algo == "appo" else {}))
    results = []
    for perturb in (False, True):
        batch, boot = _batch()
        if perturb:
            invalid = ~batch["valid"]
            batch["action"][invalid] = 1 - batch["action"][invalid]
            batch["sample_log_prob"][invalid] = -5.0
            batch["next", "reward"][invalid] = 3.0
        params, metrics = _learner_update(cfg, _agent(cfg), batch, boot)
        results.append((metrics["policy_loss"], params))
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])


@pytest.mark.parametrize("n_minibatches", [1, 3])
def test_impala_update_changes_weights_and_reports(n_minibatches):
    """One step per env-column minibatch; every sample used once (IMPALA makes one pass per batch)."""
    cfg = _learner_cfg(n_minibatches=n_minibatches)
    agent = _agent(cfg)
    before = FlatLayout(agent).flatten(agent)
    batch, boot = _batch()
    params, metrics = _learner_update(cfg, agent, batch, boot)
    assert metrics["n_updates"].item() == n_minibatches
    assert not torch.equal(before, params)
    for key in ("policy_loss", "value_loss", "entropy", "vtrace/rho_mean", "vtrace/rho_clipfrac"):
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
        make_config({"algo": "impala", "n_envs": 18, "n_actors": 3, "n_slots": 8})
    with pytest.raises(UserError, match="learner_batch"):
        make_config({"algo": "appo", "n_actors": 2, "n_slots": 2, "learner_batch": 4})
    with pytest.raises(UserError, match="normalize"):
        make_config({"algo": "impala", "normalize_obs": True})
    with pytest.raises(UserError, match="env columns"):
        make_config({"algo": "impala", "n_envs": 6, "n_steps": 16, "n_minibatches": 4})
    with pytest.raises(UserError, match="sync_interval"):
        make_config({"algo": "impala", "sync_interval": 50, "max_policy_lag": 50})
    with pytest.raises(UserError, match="n_actors"):  # PPO runs no actors: the key is refused, not ignored
        make_config({"algo": "ppo", "n_actors": 3, "n_slots": 8})


def test_n_envs_counts_every_actors_envs():
    """n_envs is the envs of one agent, all its actors together: each actor's env batch, ring slots and share of a
    learner batch hold n_envs / n_actors; a count that does not split is one line naming both values and the fix.
    The shipped configs keep their 16 envs per actor."""
    from fastrl.distributed.actors import RolloutCollector
    from fastrl.run.actor_learner import ActorLearnerTrainer
    cfg = make_config({"algo": "impala", "n_envs": 12, "n_actors": 3, "n_slots": 3, "learner_batch": 2})
    assert cfg.n_envs_per_actor == 4
    trainer = ActorLearnerTrainer(cfg, torch.device("cpu"))  # its actors start on the first collect(), not here
    try:
        assert trainer.ring.rollout.batch_size == (3, cfg.n_steps, 4)
        assert trainer.batch.batch_size == (cfg.n_steps, 2 * 4) and trainer.steps_per_update == 2 * cfg.n_steps * 4
    finally:
        trainer.close()
    collector = RolloutCollector(cfg, actor_id=2, restart=0)
    try:
        assert collector.obs.shape == (4, 4)
    finally:
        collector.close()
    message = one_line_error(make_config, {"algo": "appo", "n_envs": 10, "n_actors": 4, "n_slots": 4})
    assert "n_envs=10" in message and "n_actors=4" in message and "multiple of n_actors" in message
    for name in ("cartpole", "lunarlander", "atari"):
        assert make_config(yaml_path=str(REPO / "configs" / "impala" / f"{name}.yaml")).n_envs_per_actor == 16, name


def test_auto_sync_interval_stays_below_max_policy_lag():
    """Small rollouts make ~10k env steps many updates; the auto interval is capped so rollouts stay usable."""
    from fastrl.run.actor_learner import ActorLearnerTrainer  # its actors start on the first collect(), not here
    for values, expected in (({"n_envs": 8, "n_steps": 16, "max_policy_lag": 50}, 25),
                             ({"n_envs": 32, "n_steps": 32, "max_policy_lag": 0}, 20)):
        trainer = ActorLearnerTrainer(make_config({"algo": "impala", **values}), torch.device("cpu"))
        try:
            assert trainer.sync_interval == expected, values
        finally:
            trainer.close()


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


CARTPOLE = str(REPO / "configs" / "impala" / "cartpole.yaml")  # 2 actors x 16 envs x 32 steps, learner_batch 1
IMPALA_SUMMARY_EXTRAS = {"actor_restarts", "policy_lag_mean", "policy_lag_max", "dropped_rollouts"}
IMPALA_METRIC_KEYS = {"staleness/policy_lag_mean", "staleness/policy_lag_max", "vtrace/rho_mean",
                      "vtrace/rho_clipfrac", "queue/learner_wait_s", "charts/actor_sps", "losses/value_loss"}


def test_short_run_summary_and_step_arithmetic(tmp_path):
    """A 16-update run (not a learning check): summary.json has PPO's schema plus IMPALA's extras, every env step
    consumed is a whole slot that was trained on or dropped, and the policy lag stays within max_policy_lag."""
    from fastrl.cli.train import main
    assert main(["--config", CARTPOLE, "--run-dir", str(tmp_path), "--total-steps", "8192", "--log-interval", "4",
                 "--eval-episodes", "0", *QUIET]) == 0
    cfg = yaml.safe_load((tmp_path / "config.yaml").read_text())
    slot_steps = cfg["n_steps"] * cfg["n_envs"] // cfg["n_actors"]  # one actor rollout
    summary = json.loads((tmp_path / "summary.json").read_text())
    missing = (SUMMARY_KEYS | IMPALA_SUMMARY_EXTRAS) - summary.keys()
    assert not missing, f"summary.json lacks {missing}"
    assert summary["algo"] == "impala" and not summary["stopped_by_signal"]
    assert (summary["resumed_from_step"], summary["rollbacks"], summary["actor_restarts"]) == (0, 0, 0)
    assert summary["reached_return"] is False and summary["steps_to_return"] is None
    assert summary["total_steps"] >= 8192 and summary["total_steps"] % slot_steps == 0
    assert summary["total_steps"] == (summary["iterations"] * cfg["learner_batch"] + summary["dropped_rollouts"]) \
        * slot_steps, summary
    assert 0 <= summary["policy_lag_mean"] <= summary["policy_lag_max"] <= cfg["max_policy_lag"], summary
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r["global_step"] for r in rows]
    assert steps == sorted(set(steps)) and all(s % slot_steps == 0 for s in steps), steps
    assert steps[-1] == summary["total_steps"]
    for record in rows:
        assert not IMPALA_METRIC_KEYS - record.keys(), f"metrics.jsonl lacks {IMPALA_METRIC_KEYS - record.keys()}"
        lag_mean, lag_max = record["staleness/policy_lag_mean"], record["staleness/policy_lag_max"]
        assert 0 <= lag_mean <= lag_max <= summary["policy_lag_max"], record
        assert 0 <= record["vtrace/rho_clipfrac"] <= 1 and record["vtrace/rho_mean"] > 0, record


@pytest.mark.learning
def test_cartpole_learns(tmp_path):
    """IMPALA learns CartPole-v1: the median over 3 seeds of the last-100-episode mean return >= 70 (a random
    policy gets about 22; each run stops once it reaches 100, within at most 300k steps)."""
    from fastrl.cli.train import main

    def last_100_return(seed):
        run_dir = tmp_path / f"seed{seed}"
        assert main(["--config", CARTPOLE, "--run-dir", str(run_dir), "--seed", str(seed), "--total-steps", "300000",
                     "--stop-at-return", "100", "--eval-episodes", "0", *QUIET]) == 0
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["actor_restarts"] == 0, summary
        return summary["episode_return_mean"]

    median, by_seed = median_of_seeds(last_100_return)
    assert median >= 70, f"median return {median}; per seed {by_seed}"


def test_killed_actor_is_restarted_and_training_finishes(tmp_path):
    """With a single actor the learner cannot finish unless the SIGKILLed actor comes back."""
    proc = _train(tmp_path, "--n-actors", "1", "--n-slots", "2", "--n-envs", "4", "--n-steps", "16",
                  "--total-steps", "6400", "--eval-episodes", "0", "--log-interval", "5")
    try:  # 100 rollouts of 4 envs x 16 steps; the kill after the first 5 leaves most of them to the restarted actor
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
    assert summary["actor_restarts"] >= 1 and summary["total_steps"] >= 6400, summary
    assert not summary["stopped_by_signal"]


def test_sigterm_stops_cleanly_with_checkpoint_and_no_orphans(tmp_path):
    proc = _train(tmp_path, "--n-actors", "2", "--n-slots", "4", "--n-envs", "8", "--n-steps", "16",
                  "--total-steps", "100000000", "--log-interval", "5")
    try:
        _wait_for_metrics(proc, tmp_path)
        children = _children(proc.pid)
        assert len(_actor_pids(proc.pid)) == 2
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)  # a hang guard: SIGTERM must end the run, however busy the machine
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert list((tmp_path / "checkpoints").glob("ckpt_*.pt"))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stopped_by_signal"] and summary["total_steps"] > 0
    deadline = time.monotonic() + 30  # a hang guard: the loop ends as soon as they are gone
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if _alive(pid)], "child processes outlived the learner"
