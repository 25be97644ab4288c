"""End-to-end training: run-dir contents, resume, determinism, continuous actions with normalizers,
the Gymnasium fallback and wandb offline. (PPO learning CartPole-v1, the median of 3 seeds trained as one population:
tests/test_population.py::test_ppo_learns_cartpole_median_of_members.)"""
import json
import shutil
import signal

import pytest
import torch

import fastrl
from conftest import QUIET, SUMMARY_KEYS
from fastrl.cli.flags import config_from_cli
from fastrl.cli.train import main
from fastrl.run.checkpoint import list_checkpoints, load_checkpoint
from fastrl.run.trainer import Trainer

TINY = ["--env", "CartPole-v1", "--n-envs", "4", "--n-steps", "32", "--n-epochs", "2", "--n-minibatches", "2",
        "--torch-threads", "1", "--device", "cpu"]
METRIC_KEYS = {"global_step", "charts/SPS", "charts/episodic_return", "charts/episodic_length", "charts/episodes",
               "charts/learning_rate", "time/elapsed_s", "losses/approx_kl", "losses/clipfrac",
               "losses/explained_variance", "losses/entropy", "losses/policy_loss", "losses/value_loss"}


def _main(args):
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        assert main(args) == 0
    finally:  # keep pytest's Ctrl-C working whatever train does with the handlers
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])


def _read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _training_rows(run_dir):
    """The per-log-interval rows, without the final evaluation's ``eval/*`` row."""
    return [r for r in _read_metrics(run_dir) if "charts/SPS" in r]


def _adam_steps(state):
    return {int(s["step"]) for s in state["optimizer"]["state"].values()}


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """3 iterations of 128 steps, TensorBoard on, a checkpoint every iteration (keep 2), 2 eval episodes."""
    run_dir = tmp_path_factory.mktemp("base") / "run"
    _main(TINY + ["--total-steps", "384", "--seed", "3", "--run-dir", str(run_dir), "--wandb", "disabled",
                  "--progress", "false", "--tensorboard", "true", "--checkpoint-interval", "1",
                  "--keep-checkpoints", "2", "--eval-episodes", "2"])
    return run_dir


def test_run_dir_contents(base_run):
    assert (base_run / "config.yaml").is_file()
    import yaml
    saved = yaml.safe_load((base_run / "config.yaml").read_text())
    assert saved["n_envs"] == 4 and saved["total_steps"] == 384 and saved["seed"] == 3
    records = _read_metrics(base_run)
    assert [r["global_step"] for r in records] == [128, 256, 384, 384]  # 3 log steps, then the final evaluation
    for record in records[:-1]:
        missing = METRIC_KEYS - record.keys()
        assert not missing, f"metrics.jsonl lacks {missing}"
        assert record["charts/SPS"] > 0 and record["losses/entropy"] > 0
        assert not {"sps", "episode_return_mean", "episode_length_mean"} & record.keys(), "one name per metric"
    summary = json.loads((base_run / "summary.json").read_text())
    assert records[-1] == {"global_step": 384, "eval/return_mean": summary["eval_return_mean"],
                           "eval/return_std": summary["eval_return_std"]}
    assert list((base_run / "tb").glob("events.out.tfevents.*")), "TensorBoard events file"
    checkpoints = list_checkpoints(base_run / "checkpoints")
    assert [p.name for p in checkpoints] == ["ckpt_000000000256.pt", "ckpt_000000000384.pt"]  # keep-last-2
    summary = json.loads((base_run / "summary.json").read_text())
    assert SUMMARY_KEYS <= summary.keys()
    assert summary["total_steps"] == 384 and summary["sps"] > 0 and summary["wall_time_s"] > 0
    # the final evaluation (2 episodes on each of 5 seeds), replayed by the saved agent: the same returns
    replay = fastrl.load(base_run).evaluate(episodes=2, seeds=5)
    assert replay.shape == (10,) and all(r == int(r) for r in replay), replay  # CartPole: whole episode lengths
    assert (replay.mean(), replay.std()) == pytest.approx((summary["eval_return_mean"], summary["eval_return_std"]))
    assert (summary["algo"], summary["env"], summary["seed"], summary["iterations"]) == ("ppo", "CartPole-v1", 3, 3)
    assert (summary["resumed_from_step"], summary["rollbacks"], summary["reached_return"]) == (0, 0, False)
    assert summary["steps_to_return"] is None and summary["time_to_return_s"] is None


def test_checkpoint_is_weights_only_and_complete(base_run):
    path = list_checkpoints(base_run / "checkpoints")[-1]
    state = torch.load(path, weights_only=True)
    assert state["global_step"] == 384 and state["iteration"] == 3
    assert state["config"]["n_envs"] == 4
    assert _adam_steps(state) == {3 * 2 * 2}  # iterations x epochs x minibatches


def test_resume_continues(tmp_path):
    run_dir = tmp_path / "run"
    _main(TINY + QUIET + ["--total-steps", "256", "--seed", "3", "--eval-episodes", "0", "--run-dir", str(run_dir)])
    before = load_checkpoint(run_dir)
    assert before["global_step"] == 256 and _adam_steps(before) == {2 * 2 * 2}
    _main(["--resume", str(run_dir), "--total-steps", "512", "--progress", "false", "--eval-episodes", "0"])
    records = _read_metrics(run_dir)
    assert [r["global_step"] for r in records] == [128, 256, 384, 512]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["total_steps"] == 512 and summary["resumed_from_step"] == 256
    state = load_checkpoint(run_dir)
    assert state["global_step"] == 512 and state["iteration"] == 4
    assert state["config"]["n_envs"] == 4 and state["config"]["total_steps"] == 512  # from the checkpoint + the flag
    assert _adam_steps(state) == {4 * 2 * 2}, "the optimizer state must be restored, not restarted"
    assert any(not torch.equal(before["model"][k], state["model"][k]) for k in state["model"])


def test_resume_of_moved_run_writes_into_that_run(base_run, tmp_path):
    from fastrl.distributed.torchrun import DistInfo
    from fastrl.run.rundir import agree_run_dir
    moved = tmp_path / "moved"
    shutil.copytree(base_run, moved)
    cfg, _ = config_from_cli(["--resume", str(moved), "--total-steps", "768"])
    assert agree_run_dir(cfg, DistInfo()) == moved


def test_resume_from_checkpoint_file_flags_override(base_run):
    ckpt = list_checkpoints(base_run / "checkpoints")[-1]
    cfg, state = config_from_cli(["--resume", str(ckpt), "--lr", "0.003"])
    assert state["global_step"] == 384
    assert cfg.lr == 0.003 and cfg.n_envs == 4 and cfg.seed == 3 and cfg.resume == str(ckpt)


def test_resume_with_yaml_keeps_checkpoint_values(base_run, tmp_path):
    path = tmp_path / "extra.yaml"
    path.write_text("lr: 0.002\n")
    cfg, _ = config_from_cli(["--resume", str(base_run), "--config", str(path)])
    assert cfg.lr == 0.002
    assert cfg.n_envs == 4 and cfg.seed == 3 and cfg.n_epochs == 2  # from the checkpoint, not the defaults


def test_run_restores_signal_handlers(tmp_path):
    before = signal.getsignal(signal.SIGINT)
    try:
        assert main(TINY + QUIET + ["--total-steps", "128", "--eval-episodes", "0",
                                          "--run-dir", str(tmp_path / "r")]) == 0
        assert signal.getsignal(signal.SIGINT) is before
    finally:
        signal.signal(signal.SIGINT, before)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _final_weights(run_dir):
    return load_checkpoint(run_dir)["model"]


def test_determinism(tmp_path):
    common = TINY + QUIET + ["--total-steps", "256", "--eval-episodes", "0"]
    for name, seed in (("a", "5"), ("b", "5"), ("c", "6")):
        _main(common + ["--seed", seed, "--run-dir", str(tmp_path / name)])
    a, b, c = (_final_weights(tmp_path / n) for n in "abc")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs between two runs with the same seed"
    assert any(not torch.equal(a[k], c[k]) for k in a), "a different seed must give different weights"
    ra, rb = (_read_metrics(tmp_path / n) for n in "ab")
    assert [r["losses/policy_loss"] for r in ra] == [r["losses/policy_loss"] for r in rb]


def test_continuous_actions_with_normalizers_and_resume(tmp_path):
    run_dir = tmp_path / "pendulum"
    common = ["--env", "Pendulum-v1", "--n-envs", "4", "--n-steps", "32", "--n-epochs", "2", "--n-minibatches", "2",
              "--normalize-obs", "true", "--normalize-reward", "true", "--torch-threads", "1", "--device", "cpu"]
    _main(common + QUIET + ["--total-steps", "256", "--eval-episodes", "2", "--run-dir", str(run_dir)])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["total_steps"] == 256
    # the saved agent, its observation normalizer frozen, replays the final evaluation (2 episodes x 5 seeds)
    replay = fastrl.load(run_dir).evaluate(episodes=2, seeds=5)
    assert replay.mean() == pytest.approx(summary["eval_return_mean"], rel=1e-9), (replay, summary)
    state = load_checkpoint(run_dir)
    obs_rms, return_rms = state["normalizer"]["obs_rms"], state["normalizer"]["return_rms"]
    assert obs_rms["mean"].shape == (3,) and obs_rms["var"].shape == (3,)
    saved_count = float(obs_rms["count"])
    assert saved_count >= 256, "observation statistics were updated during training"
    assert not torch.allclose(obs_rms["mean"], torch.zeros(3, dtype=obs_rms["mean"].dtype)) and float(return_rms["count"]) > 200
    assert "log_std" in state["model"]
    _main(["--resume", str(run_dir), "--total-steps", "512", "--progress", "false", "--eval-episodes", "0"])
    resumed = load_checkpoint(run_dir)
    assert resumed["global_step"] == 512
    count = float(resumed["normalizer"]["obs_rms"]["count"])
    # restored, then 2 more iterations of 4 envs x 32 steps; a fresh normalizer would hold only ~128 + 4
    assert count == pytest.approx(saved_count + 256, abs=8)
    assert float(resumed["normalizer"]["return_rms"]["count"]) > float(return_rms["count"])


def test_gymnasium_backend_trains(tmp_path):
    """The Gymnasium fallback runs the whole loop: the updates move the weights, the metrics are logged, and the
    same seed gives the same weights and the same evaluation twice. (Whether it learns is the learning tests' job.)"""
    flags = TINY + QUIET + ["--env-backend", "gymnasium", "--total-steps", "256", "--eval-episodes", "2",
                            "--eval-seeds", "1", "--seed", "4"]
    cfg, _ = config_from_cli(flags)
    trainer = Trainer(cfg)  # the same seed builds the run's initial weights
    initial = {k: v.clone() for k, v in trainer.agent.state_dict().items()}
    trainer.close()
    for name in ("a", "b"):
        _main(flags + ["--run-dir", str(tmp_path / name)])
    a, b = (load_checkpoint(tmp_path / name) for name in "ab")
    assert a["config"]["env_backend"] == "gymnasium"
    assert a["global_step"] == 256 and _adam_steps(a) == {2 * 2 * 2}
    assert any(not torch.equal(initial[k], a["model"][k]) for k in initial), "training did not change the weights"
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), f"{key} differs between two runs with the same seed"
    records = _training_rows(tmp_path / "a")
    assert [r["global_step"] for r in records] == [128, 256]
    for record in records:
        assert not METRIC_KEYS - record.keys(), f"metrics.jsonl lacks {METRIC_KEYS - record.keys()}"
    summaries = [json.loads((tmp_path / name / "summary.json").read_text()) for name in "ab"]
    assert summaries[0]["total_steps"] == 256
    assert 1 <= summaries[0]["eval_return_mean"] <= 500
    assert summaries[0]["eval_return_mean"] == summaries[1]["eval_return_mean"], "evaluation is deterministic"


def test_wandb_offline_run(tmp_path):
    run_dir = tmp_path / "wb"
    _main(TINY + ["--total-steps", "128", "--eval-episodes", "0", "--wandb", "offline", "--tensorboard", "false",
                  "--progress", "false", "--run-dir", str(run_dir)])
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, f"expected one offline wandb run in {run_dir / 'wandb'}, found {runs}"
    run_id = runs[0].name.rsplit("-", 1)[1]  # offline-run-<date>_<time>-<id> holds run-<id>.wandb
    log = runs[0] / f"run-{run_id}.wandb"
    assert log.is_file() and log.stat().st_size > 0, f"no wandb log {log.name} in {runs[0]}"
