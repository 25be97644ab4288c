"""IMPALA with Ray actors (``--actors ray``): flags and refusals, the update on a fixed batch equal to the local pool's,
and, on a 2-node Ray cluster on 127.0.0.1 started here (a head, and an actor node offering ``actor_node``): a run
with every actor on the actor node, the weight version of every rollout and the lag bound, every rollout accounted
for, an actor killed with kill -9, and the actor node stopped then replaced by a new one.

The cluster is started with the ``ray`` CLI (each node in a temp dir of its own) and torn down by killing the
processes of those nodes only, never ``ray stop``, which would stop every Ray cluster on the machine."""
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import QUIET, one_line_error
from fastrl.config import make_config

REPO = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
SMALL = dict(algo="impala", env="CartPole-v1", n_actors=2, n_envs=8, n_steps=16, n_slots=4, device="cpu",
             torch_threads=1, eval_episodes=0, progress=False, tensorboard=False, wandb="disabled", plot=False)


# ------------------------------------------------------------------ without a cluster
def test_flags_and_refusals():
    cfg = make_config({**SMALL, "actors": "ray", "ray_address": "127.0.0.1:6379",
                       "actor_resources": "actor_node=1, CPU=0.5"})
    assert (cfg.actors, cfg.ray_address, cfg.actor_resources) == ("ray", "127.0.0.1:6379", "actor_node=1, CPU=0.5")
    from fastrl.distributed.ray_actors import actor_options
    options = actor_options(cfg)
    assert (options["num_cpus"], options["resources"], options["max_restarts"]) == (0.5, {"actor_node": 1.0}, -1)
    assert "--actors ray" in one_line_error(make_config, {**SMALL, "ray_address": "10.0.0.1:6379"})
    assert "--actors ray" in one_line_error(make_config, {**SMALL, "actor_resources": "actor_node=1"})
    assert "KEY=V" in one_line_error(make_config, {**SMALL, "actors": "ray", "actor_resources": "actor_node"})
    assert "KEY=V" in one_line_error(make_config, {**SMALL, "actors": "ray", "actor_resources": "x=-1"})
    assert "does not apply to ppo" in one_line_error(make_config, {"algo": "ppo", "actors": "ray"})
    from fastrl.run.preflight import check_launch
    assert "DDP" in one_line_error(check_launch, make_config({**SMALL, "actors": "ray"}), 2)


def test_without_ray_one_line_says_how_to_install(monkeypatch):
    from fastrl.distributed.ray_actors import check_ray
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    message = one_line_error(check_ray, make_config({**SMALL, "actors": "ray"}))
    assert 'pip install "fastrl[ray]"' in message
    check_ray(make_config(SMALL))  # the local pool does not need it


def test_unreachable_ray_address_is_one_line():
    pytest.importorskip("ray", reason='ray is not installed: pip install "fastrl[ray]"')
    from fastrl.distributed.ray_actors import check_ray
    port = _free_port()  # nothing listens there
    message = one_line_error(check_ray, make_config({**SMALL, "actors": "ray", "ray_address": f"127.0.0.1:{port}"}))
    assert f"127.0.0.1:{port}" in message and "ray start --head" in message
    assert "HOST:PORT" in one_line_error(check_ray, make_config({**SMALL, "actors": "ray", "ray_address": "head"}))


@pytest.mark.parametrize("env_mode, recurrent", [("sync", "none"), ("async", "none"), ("sync", "lstm")])
def test_update_on_a_fixed_batch_equals_the_local_pools(monkeypatch, env_mode, recurrent):
    """One rollout collected by the shared collection code (either env mode; a recurrent policy's with its start
    state and episode starts), reaching the learner through a local actor's shared-memory slot and through a Ray
    actor's result: the same batch, then bit-identical weights and metrics after the update."""
    pytest.importorskip("ray", reason='ray is not installed: pip install "fastrl[ray]"')
    from fastrl.distributed import ray_actors
    from fastrl.distributed.actors import RolloutCollector, flat_weights
    from fastrl.distributed.async_collect import RolloutViews
    from fastrl.run.actor_learner import ActorLearnerTrainer
    monkeypatch.setattr(ray_actors, "_actor_context", lambda: (False, "node-under-test"))
    monkeypatch.setattr(ray_actors, "_fetch", lambda ref: ref)  # the "object store" hands back the array itself
    overrides = {"env_mode": env_mode, "recurrent": recurrent, "recurrent_size": 16}
    local = ActorLearnerTrainer(make_config({**SMALL, **overrides}), CPU)
    remote = ActorLearnerTrainer(make_config({**SMALL, **overrides, "actors": "ray"}), CPU)
    try:
        assert torch.equal(flat_weights(local.agent), flat_weights(remote.agent))
        weights = flat_weights(local.agent).numpy()
        # local actor 0: the shared collection code into its first shared-memory slot, as actor_main does
        collector = RolloutCollector(local.cfg, 0, 0)
        local.board.publish(local.agent, 0)
        local.board.pull(collector.agent)
        ring = local.ring
        assert ring.acquire(0)
        ring.n_episodes[0], _, _ = collector.collect(RolloutViews.of(ring.rollout[0]), ring.bootstrap_observation[0],
                                                     ring.episode_return[0], ring.episode_length[0], lambda: None)
        ring.commit(0, 0)
        collector.close()
        # Ray actor 0: the same code behind RolloutWorker.rollout, its result delivered into the learner's ring
        worker = ray_actors.RolloutWorker(remote.cfg, 0, 0)
        result = worker.rollout(0, [weights])
        worker.collector.close()
        assert result["data"]["observation"].dtype == np.float32 and result["version"] == 0
        remote.pool._deliver(0, result)
        assert local.gather(local.ring, lambda: True) and remote.gather(remote.ring, lambda: True)
        assert ("recurrent_state" in local.keys) == (recurrent != "none")
        for key in local.keys:
            assert torch.equal(local.batch.get(key), remote.batch.get(key)), key
        assert torch.equal(local.bootstrap_observation, remote.bootstrap_observation)
        assert local.episodes.count == remote.episodes.count
        local_metrics, remote_metrics = local.update(), remote.update()
        assert torch.equal(flat_weights(local.agent), flat_weights(remote.agent))
        assert not torch.equal(flat_weights(local.agent), torch.from_numpy(weights))
        for key, value in local_metrics.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(remote_metrics[key])), key
    finally:
        local.close()
        remote.close()


# ------------------------------------------------------------------ a 2-node cluster on 127.0.0.1
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes() -> dict:
    """pid -> (parent pid, command line) of every process."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")  # each argument then ends in " "
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            out[int(entry.name)] = (parent, cmd)
    return out


class LoopbackCluster:
    """Ray nodes on 127.0.0.1, each in a temp dir of its own under ``root``; only their processes are ever killed."""

    def __init__(self, root: Path):
        self.root, self.port = root, _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.client_port = _free_port()  # the head's Ray client server: the one process without the session dir
        # RAY_AUTH_MODE set: a token in ~/.ray (which any local ray.init() writes) must not turn on token auth for
        # the head but not for the node joining it.
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
                    "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
        self.env.pop("RAY_ADDRESS", None)
        ray_cli = Path(sys.executable).with_name("ray")
        self.ray = [str(ray_cli)] if ray_cli.exists() else [sys.executable, "-m", "ray.scripts.scripts"]
        self.nodes: list = []

    def _start(self, name: str, *flags) -> None:
        common = ["--node-ip-address=127.0.0.1", f"--temp-dir={self.root / name}", "--object-store-memory=150000000",
                  "--disable-usage-stats"]
        self.nodes.append(name)
        done = subprocess.run(self.ray + ["start", *common, *flags], env=self.env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr

    def start_head(self) -> None:
        self._start("head", "--head", f"--port={self.port}", "--num-cpus=1", "--include-dashboard=false",
                    f"--ray-client-server-port={self.client_port}", f"--dashboard-port={_free_port()}")

    def add_actor_node(self, name: str) -> None:
        self._start(name, f"--address={self.address}", "--num-cpus=2", '--resources={"actor_node": 2}')

    def node_pids(self, name: str) -> list:
        """The processes of node ``name``: those started with its session dir, and all their descendants."""
        procs = _processes()
        marker = f"{self.root / name}/session_"
        client = f"--port={self.client_port} " if name == "head" else marker
        pids = {pid for pid, (_, cmd) in procs.items() if marker in cmd or ("ray.util.client.server" in cmd and client in cmd)}
        grew = True
        while grew:
            children = {pid for pid, (parent, _) in procs.items() if parent in pids} - pids
            pids |= children
            grew = bool(children)
        return sorted(pids)

    def actor_pids(self, name: str) -> list:
        procs = _processes()
        return [pid for pid in self.node_pids(name) if procs.get(pid, (0, ""))[1].startswith("ray::RolloutWorker")]

    def stop_node(self, name: str, timeout_s: float = 15.0) -> None:
        """What ``ray stop`` does, for this one node: SIGTERM its processes, SIGKILL what is left."""
        pids = self.node_pids(name)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() and not _zombie(p) for p in pids):
                time.sleep(0.1)

    def teardown(self) -> None:
        for name in reversed(self.nodes):
            self.stop_node(name, timeout_s=5.0)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pytest.importorskip("ray", reason='ray is not installed: pip install "fastrl[ray]"')
    # Ray's socket paths must stay short (AF_UNIX: 107 bytes), so not pytest's deep tmp dirs.
    import tempfile
    root = Path(tempfile.mkdtemp(prefix="fr", dir="/tmp"))
    c = LoopbackCluster(root)
    auth_mode = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # for the in-process drivers of this module, as for the nodes
    try:
        c.start_head()
        c.add_actor_node("a1")
        yield c
    finally:
        c.teardown()
        shutil.rmtree(root, ignore_errors=True)
        if auth_mode is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = auth_mode


def _train(cluster, run_dir: Path, *flags) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "fastrl.train", "--algo", "impala", "--actors", "ray", "--ray-address",
           cluster.address, "--actor-resources", "actor_node=1", "--run-dir", str(run_dir), *QUIET, *flags]
    return subprocess.Popen(cmd, cwd=REPO, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _wait_for(predicate, proc, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            pytest.fail(f"the run ended before {what}: {proc.stdout.read()}")
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"no {what} within {timeout_s} s: {proc.stdout.read()}")


@contextlib.contextmanager
def _killed_on_failure(proc: subprocess.Popen):
    try:
        yield proc
    except BaseException:
        proc.kill()
        raise


def _finished(proc: subprocess.Popen, run_dir: Path, timeout_s: float = 150) -> dict:
    """Wait for the run to end (killing it past ``timeout_s``); it must exit 0. Returns its summary.json."""
    with _killed_on_failure(proc):
        out, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, out
    return json.loads((run_dir / "summary.json").read_text())


def _has_metrics(run_dir: Path) -> bool:
    """A metrics row was written: the actors have delivered rollouts (the file itself exists from the start)."""
    path = run_dir / "metrics.jsonl"
    return path.exists() and bool(path.read_text().strip())


def _node_ids(cluster) -> dict:
    """Node id -> its resources, of the live nodes (asked through a short driver connection)."""
    import ray
    ray.init(address=cluster.address, _node_ip_address="127.0.0.1", logging_level="ERROR")
    try:
        return {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
    finally:
        ray.shutdown()


def test_every_actor_runs_on_the_actor_node_and_the_run_finishes(cluster, tmp_path):
    """IMPALA CartPole (the tuned config: 2 actors x 16 envs) with both actors on the actor node: the run finishes its
    budget, each actor delivered from the actor node only, none restarted, no rollout lost. (Learning is
    test_impala.py::test_cartpole_learns on the same config; the Ray path hands the learner the same batch and
    weights as the local actors, test_update_on_a_fixed_batch_equals_the_local_pools.)"""
    total = 100 * 512  # 100 rollouts of 16 envs x 32 steps: both actors deliver many
    proc = _train(cluster, tmp_path, "--config", str(REPO / "configs/impala/cartpole.yaml"), "--total-steps",
                  str(total), "--eval-episodes", "0", "--seed", "1")
    summary = _finished(proc, tmp_path, timeout_s=240)
    assert summary["actors"] == "ray" and summary["actor_restarts"] == summary["lost_rollouts"] == 0, summary
    assert summary["total_steps"] >= total and summary["rollouts_received"] >= 100, summary
    actor_nodes = {node for node, resources in _node_ids(cluster).items() if "actor_node" in resources}
    assert sorted(summary["actor_nodes"]) == ["0", "1"] and actor_nodes, (summary["actor_nodes"], actor_nodes)
    for actor_id, nodes in summary["actor_nodes"].items():
        assert nodes and set(nodes) <= actor_nodes, (actor_id, nodes, actor_nodes)


def test_versions_lag_bound_and_every_rollout_accounted_for(cluster):
    """In-process learner on the cluster, with a tight lag bound so that stale rollouts occur: every rollout taken
    carries the version it was collected with, none is trained on beyond max_policy_lag, and every rollout received is
    trained on, dropped as stale (counted) or still waiting in the ring."""
    from fastrl.distributed.actors import FULL
    from fastrl.run.actor_learner import ActorLearnerTrainer
    cfg = make_config({**SMALL, "actors": "ray", "ray_address": cluster.address, "actor_resources": "actor_node=1",
                       "n_slots": 8, "max_policy_lag": 1, "total_steps": 10**6})
    trainer = ActorLearnerTrainer(cfg, CPU)
    taken = []  # (learner version at pickup, rollout version) of every rollout the gather took
    release = trainer.ring.release

    def recording_release(slot):
        taken.append((trainer.iteration, int(trainer.ring.version_np[slot])))
        release(slot)
    trainer.ring.release = recording_release
    trainer.should_stop = lambda: False
    try:
        while trainer.iteration < 20:
            assert trainer.collect()
            trainer.update()
        # The learner pauses while the actors fill the ring: the rollouts it then takes oldest first grow older by one
        # update each, so from the third on they exceed max_policy_lag=1 and must be dropped.
        deadline = time.monotonic() + 120  # a hang guard only
        while np.count_nonzero(trainer.ring.state_np == FULL) < 4:
            assert time.monotonic() < deadline, "the actors never filled 4 slots"
            trainer.pool.check(wait_s=0.05)
        while trainer.iteration < 40:
            assert trainer.collect()
            trainer.update()
        lags = [now - version for now, version in taken]
        assert min(lags) >= 0, "a rollout claims weights newer than the learner's"
        assert max(trainer.lags + [0]) <= cfg.max_policy_lag and trainer.lag_totals["max"] <= cfg.max_policy_lag
        stale = sum(lag > cfg.max_policy_lag for lag in lags)
        assert stale >= 2 and stale == trainer.lag_totals["dropped"], (stale, trainer.lag_totals)
        assert len(taken) == trainer.iteration * cfg.learner_batch + trainer.lag_totals["dropped"]
        waiting = int(np.count_nonzero(trainer.ring.state_np == FULL))
        assert trainer.pool.rollouts_received == len(taken) + waiting
        assert trainer.global_step == len(taken) * cfg.n_steps * cfg.n_envs_per_actor
        assert trainer.pool.lost_rollouts == 0 and trainer.pool.publishes >= trainer.iteration
        extras = trainer.summary_extras()
        assert extras["object_store_bytes"] > 0 and extras["rollouts_received"] == trainer.pool.rollouts_received
    finally:
        trainer.close()
    import ray
    assert not ray.is_initialized(), "the trainer disconnects from the cluster it joined"


# A single actor's run: 50 rollouts of 8 envs x 32 steps, the fault injected once the first metrics row is written
# (after 5 of them), so most of the budget is left for the actor that comes back.
ONE_ACTOR_STEPS = 50 * 256


def test_kill_9_of_an_actor_is_survived_and_counted(cluster, tmp_path):
    """With a single actor the run cannot finish unless the actor killed with SIGKILL comes back."""
    proc = _train(cluster, tmp_path, "--n-actors", "1", "--n-slots", "2", "--n-envs", "8", "--n-steps", "32",
                  "--total-steps", str(ONE_ACTOR_STEPS), "--eval-episodes", "0", "--log-interval", "5")
    with _killed_on_failure(proc):
        _wait_for(lambda: _has_metrics(tmp_path), proc, 90, "metrics")
        actors = _wait_for(lambda: cluster.actor_pids("a1"), proc, 30, "an actor process")
        assert len(actors) == 1, actors
        os.kill(actors[0], signal.SIGKILL)
    summary = _finished(proc, tmp_path)
    assert summary["actor_restarts"] >= 1 and summary["actor_failures"] >= 1, summary
    assert summary["lost_rollouts"] >= 1 and summary["total_steps"] >= ONE_ACTOR_STEPS, summary
    assert not summary["stopped_by_signal"]
    assert len(summary["actor_nodes"]["0"]) == summary["actor_restarts"] + 1


def test_hung_actor_is_restarted_and_the_learner_goes_on(cluster):
    """An actor stopped with SIGSTOP (alive, silent) is restarted after actor_timeout_s; meanwhile the other actor keeps
    the learner going, and the hung actor's calls are counted as lost."""
    from fastrl.run.actor_learner import ActorLearnerTrainer
    cfg = make_config({**SMALL, "actors": "ray", "ray_address": cluster.address, "actor_resources": "actor_node=1",
                       "actor_timeout_s": 3.0, "total_steps": 10**7})
    trainer = ActorLearnerTrainer(cfg, CPU)
    trainer.should_stop = lambda: False
    frozen = None

    def step_until(condition, timeout_s, what):
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline, what
            assert trainer.collect(), "the learner must not stall on a hung actor"
            trainer.update()
    try:
        step_until(lambda: None not in trainer.pool.pids, 60, "both actors deliver")
        frozen = trainer.pool.pids[0]
        os.kill(frozen, signal.SIGSTOP)
        iterations = trainer.iteration
        # at least one: on a loaded machine the live actor may miss a 3 s heartbeat too, and is then restarted as well
        step_until(lambda: trainer.pool.hung_restarts >= 1, 60, "the hung actor is detected")
        assert trainer.iteration > iterations, "the other actor kept the learner going"
        step_until(lambda: trainer.pool.pids[0] != frozen, 90, "the hung actor comes back")
        assert trainer.pool.restarts >= 1 and trainer.pool.lost_rollouts >= 1 and _zombie(frozen)
    finally:
        trainer.close()
        if frozen is not None and not _zombie(frozen):
            os.kill(frozen, signal.SIGCONT)


def test_learner_crash_resumes_from_its_checkpoint_with_new_actors(cluster, tmp_path):
    """kill -9 of the learner takes its Ray actors with it; --resume continues from the checkpoint with new ones."""
    flags = ["--n-actors", "1", "--n-slots", "2", "--n-envs", "8", "--n-steps", "32", "--eval-episodes", "0",
             "--log-interval", "5", "--checkpoint-interval", "5"]
    proc = _train(cluster, tmp_path, *flags, "--total-steps", "10000000")
    with _killed_on_failure(proc):
        _wait_for(lambda: list((tmp_path / "checkpoints").glob("ckpt_*.pt")), proc, 90, "a checkpoint")
        actors = cluster.actor_pids("a1")
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(not _zombie(pid) for pid in actors) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(_zombie(pid) for pid in actors), "Ray ends the actors of a learner that died"
    resumed = subprocess.run([sys.executable, "-m", "fastrl.train", "--resume", str(tmp_path), "--total-steps",
                              str(ONE_ACTOR_STEPS), *QUIET], cwd=REPO, env=cluster.env, capture_output=True, text=True,
                             timeout=150)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["resumed_from_step"] > 0 and summary["total_steps"] >= ONE_ACTOR_STEPS and summary["actors"] == "ray"
    assert summary["actor_restarts"] == 0 and len(summary["actor_nodes"]["0"]) == 1, summary


def test_actor_node_stopped_then_a_new_node_joins(cluster, tmp_path):
    """The only actor node stops mid-run (its processes ended as ray stop ends them): the learner waits, counts the
    lost rollouts, and finishes on the actor Ray restarts on the node that joins next (a single actor, so the run
    cannot finish without it). (Last in this module: it
    replaces the module's actor node.)"""
    proc = _train(cluster, tmp_path, "--n-actors", "1", "--n-slots", "2", "--n-envs", "8", "--n-steps", "32",
                  "--total-steps", str(ONE_ACTOR_STEPS), "--eval-episodes", "0", "--log-interval", "5")
    with _killed_on_failure(proc):
        _wait_for(lambda: _has_metrics(tmp_path), proc, 90, "metrics")
        cluster.stop_node("a1")
        time.sleep(2.0)
        assert proc.poll() is None, "the learner must wait for actors, not exit"
        cluster.add_actor_node("a2")
    summary = _finished(proc, tmp_path)
    assert summary["total_steps"] >= ONE_ACTOR_STEPS, summary
    assert summary["actor_restarts"] >= 1 and summary["lost_rollouts"] >= 1, summary
    new_node = {node for node, resources in _node_ids(cluster).items() if "actor_node" in resources}
    assert len(new_node) == 1
    assert summary["actor_nodes"]["0"][-1] in new_node and len(summary["actor_nodes"]["0"]) == 2, summary
