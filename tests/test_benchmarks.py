"""Smoke tests of the benchmark suite: the entry point, the report generator and the peers' pure pieces."""
import json
import os
import statistics
import subprocess
from pathlib import Path

import pytest

from benchmarks import envs_sps, peers, peers_common, peers_learning, peers_rejax, peers_sb3, report, run
from benchmarks.common import markdown_table


# ---------------------------------------------------------------------------------------------- run.py
def test_run_rejects_unknown_part_with_exit_2(capsys):
    assert run.main(["nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown part 'nope'" in err and len(err.strip().splitlines()) == 1


def test_run_rejects_unknown_flag_with_exit_2(capsys):
    assert run.main(["--fast"]) == 2
    assert "error" in capsys.readouterr().err


def test_run_parts_map_to_scripts_with_a_main_entry_point():
    import importlib
    for part, scripts in run.PARTS.items():
        for module, _ in scripts:
            assert callable(getattr(importlib.import_module(module), "main", None)), (part, module)
    assert set(run.DEFAULT_PARTS) == set(run.PARTS) - {"impala", "learner", "default"}  # the opt-in parts
    assert run._parse(["train_sps", "end-to-end"]).parts == ["end-to-end"]  # alias, de-duplicated


def test_run_reports_a_failing_part_and_goes_on(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(run, "PARTS", {"bad": [("benchmarks.nonexistent_module", [])],
                                       "good": [("benchmarks.report", ["--help"])]})
    monkeypatch.setattr(run, "DEFAULT_PARTS", ("bad", "good"))
    monkeypatch.setattr(run, "_run_script", lambda m, a, real=run._run_script: calls.append(m) or real(m, a))
    assert run.main(["--no-report"]) == 1
    assert calls == ["benchmarks.nonexistent_module", "benchmarks.report"]
    out = capsys.readouterr().out
    assert "FAILED" in out and "bad" in out


def test_bench_writes_to_an_output_directory_never_the_committed_results(monkeypatch, tmp_path, capsys):
    """Default: ``bench-results`` under the current directory, for the scripts (``default_out``) and the report."""
    from benchmarks import common
    monkeypatch.setattr(common, "RESULTS_DIR", common.RESULTS_DIR)  # restored after the test
    committed = common.RESULTS_DIR
    calls = []
    monkeypatch.setattr(run, "PARTS", {"probe": [("benchmarks.report", ["--help"])]})
    monkeypatch.setattr(run, "DEFAULT_PARTS", ("probe",))
    monkeypatch.setattr(run, "_run_script", lambda m, a: calls.append((m, a, common.default_out("x"))) or 0)
    monkeypatch.chdir(tmp_path)
    assert run.main([]) == 0
    out_dir = tmp_path / "bench-results"
    (_, _, script_out), (report, report_argv, _) = calls
    assert script_out.parent.parent == out_dir and committed not in script_out.parents
    assert report == "benchmarks.report" and report_argv == ["--results", str(out_dir), "--out", str(out_dir / "RESULTS.md")]
    calls.clear()
    assert run.main(["--out-dir", str(tmp_path / "mine"), "--no-report"]) == 0
    assert calls[0][2].parent.parent == tmp_path / "mine"


# ---------------------------------------------------------------------------------------------- report.py
def _curve(n, final, wall_per_step):
    return [[1000 * (i + 1), 1000 * (i + 1) * wall_per_step, final * (i + 1) / n] for i in range(n)]


def _peers_run(lib, final, reached, wall_per_step):
    curve = _curve(20, final, wall_per_step)
    step, wall = (curve[-1][0], curve[-1][1]) if reached else (None, None)
    return {"lib": lib, "seed": 1, "total_steps": curve[-1][0], "wall_time_s": curve[-1][1],
            "sps": 1 / wall_per_step, "final_return": final, "reached": reached, "steps_to_threshold": step,
            "time_to_threshold_s": wall, "curve": curve}


def synthetic_results(root):
    machine = {"machine": "cpu-test", "cpu_model": "Test CPU", "cpu_count": 2, "torch": "2.x", "python": "3.11",
               "timestamp": "2026-01-01T00:00:00+0000"}
    runs = {"fastrl": [_peers_run("fastrl", 480.0, True, 2e-4)], "sb3": [_peers_run("sb3", 300.0, False, 4e-4)]}
    peers_json = {"benchmark": "peers", "machine": machine, "quick": True, "seeds": 1, "results": [
        {"env": "CartPole-v1", "algo": "ppo", "threshold": 475.0, "budget_steps": 20000, "runs": runs,
         "skipped": {}, "summary": {lib: peers_common.aggregate(r) for lib, r in runs.items()}},
        {"env": "HalfCheetah-v4", "algo": "ppo", "threshold": None, "budget_steps": 20000,
         "runs": {"fastrl": [_peers_run("fastrl", -50.0, False, 1e-3)]}, "skipped": {"sb3": "MuJoCo is missing"},
         "summary": {"fastrl": peers_common.aggregate([_peers_run("fastrl", -50.0, False, 1e-3)])}},
    ]}
    learning_json = {"benchmark": "learning", "machine": machine, "quick": True, "seeds": 1,
                     "zoo_source": peers_learning.ZOO_SOURCE, "results": [
                         {"env": "CartPole-v1", "algo": "ppo", "budget_steps": 100_000,
                          "zoo": peers_learning.ZOO[("ppo", "CartPole-v1")], "seeds": 1, "eval_episodes": 10,
                          "eval_return_median": 500.0, "train_return_median": 470.0, "runs": []}]}
    envs_json = {"benchmark": "envs_sps", "machine": machine, "quick": True, "backends": ["envpool", "gym_sync"],
                 "results": [{"env": "CartPole-v1", "n_envs": 8, "sps": {"envpool": {"median": 1e5},
                                                                        "gym_sync": {"median": 4e4}},
                              "envpool_over_gym_sync": 2.5, "skipped": {}}]}
    rows = []
    for impl, us in (("fastrl.gae", 10.0), ("loop.gae", 1000.0)):
        rows.append({"T": 128, "N": 64, "kernel": "gae", "impl": impl, "us": us, "gbps": 22 * 128 * 64 / us / 1e3,
                     "copy_ratio": 0.1, "fastrl_speedup": us / 10.0})
    kernels_json = {"device": "cpu", "machine": "cpu-test", "copy_gbps": 10.0, "quick": True, "results": rows}
    d = root / "cpu-test"
    d.mkdir(parents=True)
    for name, data in (("peers", peers_json), ("learning", learning_json), ("envs_sps", envs_json),
                       ("kernels", kernels_json)):
        (d / f"{name}.json").write_text(json.dumps(data))
    (d / "ddp_scaling.json").write_text("{not json")
    return d


def _table_rows(markdown):
    """The cells of every Markdown table row (header and separator rows included), stripped."""
    return [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in markdown.splitlines() if line.lstrip().startswith("|")]


def test_report_turns_results_into_markdown_and_pngs(tmp_path):
    pytest.importorskip("matplotlib")
    d = synthetic_results(tmp_path / "results")
    out = tmp_path / "RESULTS.md"
    assert report.main(["--results", str(tmp_path / "results"), "--out", str(out)]) == 0
    text = out.read_text()
    assert "## cpu-test" in text
    peers_rows = {row[3]: row for row in _table_rows(text) if len(row) == 9 and row[:2] == ["CartPole-v1", "ppo"]}
    assert set(peers_rows) == {"fastrl", "sb3"}, peers_rows
    assert peers_rows["fastrl"][2:6] == ["475", "fastrl", "1/1", "20,000"]  # threshold, lib, reached, steps
    assert peers_rows["sb3"][2:6] == ["475", "sb3", "0/1", "-"]  # an unreached threshold has no median
    assert "MuJoCo is missing" in text  # skipped peers are named
    assert "500.0 ± 0.0" in text  # the zoo's score beside fastrl's
    assert "ddp_scaling.json` could not be read" in text  # a broken file is named, not fatal
    for name in ("learning_curves.png", "sps.png", "kernels.png"):
        png = d / "plots" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"cpu-test/plots/{name}" in text


def test_report_renders_the_committed_gpu_profile():
    """The H200 profile and its CUDA-graph re-check, from the committed JSON: each run's tables under one heading."""
    text, _ = report.render(Path(report.RESULTS_DIR), Path(report.RESULTS_DIR).parent / "RESULTS.md",
                            machines=["nvidia-h200"])
    assert "## nvidia-h200" in text and "### GPU profile: CUDA graphs re-checked" in text
    rows = _table_rows(text)
    gae = [row for row in rows if row[:3] == ["gae", "triton", "1024x65536"]]
    assert len(gae) == 1 and gae[0][4] == "1,716"
    regraphed = [row for row in rows if row[0] == "cudagraphs / bf16 off / 256 envs" and row[1] not in ("", "steps/s")]
    assert [row[1] for row in regraphed] == ["7,940"]  # the full run's row is the error, the re-check's the figure
    assert text.count("#### PPO on CartPole-v1") == 3  # no second-level heading inside a section


def test_results_name_the_code_they_ran(monkeypatch):
    """machine_info (every result file) and each zoo row carry the checkout's commit, marked when files differ."""
    from benchmarks import common
    head = subprocess.run(["git", "-C", str(Path(common.__file__).parent.parent), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    code = common.machine_info()["code"]
    changed = subprocess.run(["git", "-C", str(Path(common.__file__).parent.parent), "diff", "HEAD", "--name-only"],
                             capture_output=True, text=True).stdout.split()
    suffix = code.removeprefix(head.stdout.strip())
    assert code.split("+")[0] == head.stdout.strip()
    assert (suffix.startswith("+changes(") and any(path in suffix for path in changed)) if changed else suffix == ""

    def fake_git(args, **kwargs):  # seven tracked files changed, one of them renamed
        status = " M fastrl/a.py\nM  b.py\nR  old.py -> c.py\n M d.py\n M e.py\n M f.py\n M g.py\n"
        return subprocess.CompletedProcess(args, 0, stdout="abc1234\n" if "rev-parse" in args else status)
    monkeypatch.setattr(common.subprocess, "run", fake_git)
    assert common.code_version() == "abc1234+changes(fastrl/a.py, b.py, c.py, d.py, e.py, 2 more)"

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")
    monkeypatch.setattr(common.subprocess, "run", no_git)
    assert common.code_version() is None


def test_report_with_no_results_still_writes_a_file(tmp_path):
    out = tmp_path / "RESULTS.md"
    assert report.main(["--results", str(tmp_path / "missing"), "--out", str(out)]) == 0
    assert "No results yet" in out.read_text()


def test_report_names_a_schema_it_does_not_know(tmp_path):
    d = tmp_path / "results" / "cpu-x"
    d.mkdir(parents=True)
    (d / "impala_sps.json").write_text(json.dumps({"results": [{"n_actors": 1}]}))
    text, _ = report.render(tmp_path / "results", tmp_path / "RESULTS.md")
    assert "has a layout this report does not know" in text


# ---------------------------------------------------------------------------------------------- peers.py
def test_fastrl_curve_integrates_sections_or_uses_elapsed():
    rows = [{"global_step": 100, "time/collect_s": 1.0, "time/update_s": 0.5},
            {"global_step": 200, "time/collect_s": 1.0, "time/update_s": 0.5, "charts/episodic_return": 10.0},
            {"global_step": 200, "eval/return_mean": 20.0, "eval/return_std": 1.0}]  # the final evaluation's row
    assert peers_common.fastrl_curve(rows) == [[100, 1.5, None], [200, 3.0, 10.0]]
    rows = [{"global_step": 100, "time/elapsed_s": 4.0, "time/collect_s": 1.0, "time/update_s": 0.5}]
    assert peers_common.fastrl_curve(rows) == [[100, 4.0, None]]


def test_first_crossing_and_medians():
    curve = [[1, 0.1, None], [2, 0.2, 50.0], [3, 0.3, 100.0], [4, 0.4, 90.0]]
    assert peers_common.first_crossing(curve, 100.0) == (3, 0.3)
    assert peers_common.first_crossing(curve, 101.0) == (None, None)
    assert peers_common.first_crossing(curve, None) == (None, None)
    assert peers_common.median_or_none([1.0, 3.0, None]) == 3.0  # the unreached seed counts as infinitely slow
    assert peers_common.median_or_none([1.0, None, None]) is None
    assert peers_common.median_or_none([2.0]) == 2.0
    assert len(peers_common.thin(list(range(1000)), 50)) <= 51 and peers_common.thin(list(range(1000)), 50)[-1] == 999


def test_sb3_lr_schedule_matches_fastrl_per_iteration():
    from fastrl.learn.optim import annealed_lr
    cfg = peers_learning.peer_config("ppo", "CartPole-v1", 1, 10 * 512, 475.0, 1)
    n = cfg.total_steps // cfg.batch_size
    schedule = peers_common.lr_schedule(cfg, n)
    for k in range(1, n + 1):  # SB3 trains rollout k with progress_remaining 1 - k/n; fastrl at progress (k-1)/n
        assert schedule(1 - k / n) == pytest.approx(annealed_lr(cfg, (k - 1) / n))


@pytest.mark.parametrize("algo,ortho_init", [("ppo", True), ("a2c", True), ("ppo", False)])
def test_sb3_mirror_takes_fastrl_hyperparameters(algo, ortho_init):
    import dataclasses
    pytest.importorskip("stable_baselines3")
    cfg = dataclasses.replace(peers_learning.peer_config(algo, "CartPole-v1", 3, 10_000, 475.0, 1), ortho_init=ortho_init)
    model = peers_common.sb3_model(cfg, cfg.total_steps // cfg.batch_size)
    try:
        assert model.policy.ortho_init is ortho_init  # the zoo's MuJoCo runs turn it off
        assert (model.n_steps, model.env.num_envs, model.gamma, model.gae_lambda) == \
            (cfg.n_steps, cfg.n_envs, cfg.gamma, cfg.gae_lambda)
        assert model.vf_coef == pytest.approx(cfg.vf_coef / 2)  # SB3's MSE vs fastrl's 1/2 MSE
        assert model.ent_coef == cfg.ent_coef and model.max_grad_norm == cfg.max_grad_norm
        assert model.lr_schedule(1.0) == pytest.approx(cfg.lr)
        if algo == "ppo":
            assert (model.batch_size, model.n_epochs) == (cfg.minibatch_size, cfg.n_epochs)
        else:
            assert type(model.policy.optimizer).__name__ == "RMSprop"
    finally:
        model.get_env().close()


def test_sb3s_time_feature_is_fastrls():
    """SB3's side of a time_feature config appends what fastrl's envs do (tests/test_envs.py): 1 - t / 500 on
    CartPole, t the steps taken in the episode, 1.0 on an episode's first observation."""
    import dataclasses

    import numpy as np
    pytest.importorskip("stable_baselines3")
    cfg = dataclasses.replace(peers_learning.peer_config("ppo", "CartPole-v1", 3, 10_000, 475.0, 1), n_envs=1,
                              normalize_obs=False, normalize_reward=False, time_feature=True)
    env = peers_common.sb3_env(cfg)
    try:
        assert env.observation_space.shape == (5,)
        assert env.reset()[0, 4] == 1.0
        steps_taken, episodes = 0, 0
        for t in range(300):  # a skewed action pattern: the pole falls within tens of steps
            obs, _, done, info = env.step(np.array([int(t % 3 == 0)]))
            steps_taken += 1
            if done[0]:  # SB3 hands out the next episode's first observation, the final one in the info
                assert info[0]["terminal_observation"][4] == pytest.approx(1.0 - steps_taken / 500)
                assert obs[0, 4] == 1.0
                steps_taken, episodes = 0, episodes + 1
            else:
                assert obs[0, 4] == pytest.approx(1.0 - steps_taken / 500)
        assert episodes >= 3
    finally:
        env.close()


def test_peers_and_learning_end_to_end_tiny(tmp_path):
    pytest.importorskip("stable_baselines3")
    out, learning_out = tmp_path / "peers.json", tmp_path / "learning.json"
    assert peers.main(["--quick", "--envs", "CartPole-v1", "--algos", "ppo", "--max-steps", "1024", "--no-progress",
                       "--eval-episodes", "1", "--out", str(out), "--learning-out", str(learning_out)]) == 0
    data = json.loads(out.read_text())
    entry = data["results"][0]
    assert set(entry["runs"]) == {"fastrl", "sb3"}
    for lib, (run_,) in entry["runs"].items():
        assert run_["total_steps"] <= 1024 and run_["curve"] and run_["sps"] > 0, lib
    learning = json.loads(learning_out.read_text())["results"][0]
    runs = learning["runs"]
    assert learning["budget_steps"] == 1024 and len(runs) == learning["seeds"] >= 1
    evals = [r["eval_return_mean"] for r in runs]  # one CartPole episode each: a whole episode length
    assert all(r is not None and r == int(r) for r in evals), evals
    assert learning["eval_return_median"] == statistics.median(evals), (learning["eval_return_median"], evals)


def test_sb3_zoo_mapping_is_sb3s_settings_term_by_term():
    from fastrl.config import make_config
    zoo = peers_sb3.fastrl_from_sb3(peers_sb3.sb3_settings("sb3-zoo"))
    cfg = make_config(zoo)  # a valid fastrl config
    assert (cfg.n_envs, cfg.n_steps, cfg.minibatch_size, cfg.n_minibatches, cfg.n_epochs) == (8, 32, 256, 1, 20)
    assert (cfg.gamma, cfg.gae_lambda, cfg.ent_coef, cfg.max_grad_norm) == (0.98, 0.8, 0.0, 0.5)
    assert (cfg.lr, cfg.anneal_lr, cfg.lr_floor) == (1e-3, True, 0.0)  # lin_0.001
    assert (cfg.clip_coef, cfg.anneal_clip) == (0.2, True)  # lin_0.2
    assert cfg.clip_vloss is False  # clip_range_vf None
    assert cfg.vf_coef == 1.0  # SB3's 0.5 x MSE is fastrl's 1.0 x 1/2 MSE
    assert (cfg.norm_adv, cfg.adam_eps, cfg.hidden_sizes, cfg.activation, cfg.shared_trunk) == \
        (True, 1e-5, [64, 64], "tanh", False)
    assert (cfg.normalize_obs, cfg.normalize_reward, cfg.target_kl) == (False, False, 0.0)
    default = make_config(peers_sb3.fastrl_from_sb3(peers_sb3.sb3_settings("sb3-default")))
    assert (default.n_envs, default.n_steps, default.minibatch_size, default.n_epochs) == (1, 2048, 64, 10)
    assert (default.lr, default.anneal_lr, default.clip_coef, default.anneal_clip) == (3e-4, False, 0.2, False)
    assert (default.gamma, default.gae_lambda, default.vf_coef, default.clip_vloss) == (0.99, 0.95, 1.0, False)
    assert peers_sb3.zoo_value("lin_0.2") == (0.2, True) and peers_sb3.zoo_value(3e-4) == (3e-4, False)
    assert peers_sb3.Linear(0.2)(0.5) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="clips the value loss"):
        peers_sb3.fastrl_from_sb3({**peers_sb3.sb3_settings("sb3-zoo"), "clip_range_vf": 0.2})


def test_rejax_mapping_term_by_term():
    from fastrl.config import make_config
    r = peers_rejax.REJAX_PPO_CARTPOLE
    cfg = make_config(peers_rejax.fastrl_from_rejax(r))
    assert (cfg.n_envs, cfg.n_steps, cfg.n_epochs, cfg.n_minibatches) == \
        (r["num_envs"], r["num_steps"], r["num_epochs"], r["num_minibatches"]) == (5, 100, 5, 5)
    assert (cfg.lr, cfg.anneal_lr, cfg.gamma, cfg.gae_lambda) == (0.00075, False, 0.99, 0.95)
    assert (cfg.clip_coef, cfg.anneal_clip, cfg.clip_vloss) == (0.2, False, True)  # rejax clips the value with clip_eps
    assert (cfg.ent_coef, cfg.vf_coef, cfg.max_grad_norm) == (0.01, 0.5, 0.5)  # both 1/2 MSE
    assert (cfg.hidden_sizes, cfg.activation, cfg.shared_trunk) == ([64, 64], "tanh", False)
    assert (cfg.optimizer, cfg.adam_eps, cfg.norm_adv) == ("adam", 1e-8, True)  # optax.adam's eps
    assert (cfg.normalize_obs, cfg.normalize_reward, cfg.env) == (False, False, "CartPole-v1")
    assert r["total_timesteps"] == peers.SPEED_BUDGETS["rejax"]["full"] and r["eval_freq"] == 1000


def test_sb3_defaults_table_is_what_sb3_uses():
    pytest.importorskip("stable_baselines3")
    h = peers_sb3.sb3_settings("sb3-default")
    model = peers_sb3.sb3_native("sb3-default", 0)
    try:
        assert model.env.num_envs == h["n_envs"]
        assert (model.n_steps, model.batch_size, model.n_epochs, model.gamma, model.gae_lambda) == \
            (h["n_steps"], h["batch_size"], h["n_epochs"], h["gamma"], h["gae_lambda"])
        assert (model.ent_coef, model.vf_coef, model.max_grad_norm, model.normalize_advantage) == \
            (h["ent_coef"], h["vf_coef"], h["max_grad_norm"], h["normalize_advantage"])
        assert model.clip_range(0.3) == h["clip_range"] and model.clip_range_vf is None
        assert model.lr_schedule(0.3) == pytest.approx(h["learning_rate"])
        assert model.policy.optimizer.defaults["eps"] == h["adam_eps"] and model.policy.ortho_init
        assert model.policy.net_arch == {"pi": h["net_arch"], "vf": h["net_arch"]}
        assert model.policy.activation_fn.__name__.lower() == h["activation"]
    finally:
        model.get_env().close()
    zoo = peers_sb3.sb3_native("sb3-zoo", 0)
    try:
        assert (zoo.env.num_envs, zoo.n_steps, zoo.batch_size, zoo.n_epochs, zoo.gamma, zoo.gae_lambda) == \
            (8, 32, 256, 20, 0.98, 0.8)
        assert zoo.clip_range(1.0) == pytest.approx(0.2) and zoo.clip_range(0.25) == pytest.approx(0.05)
        assert zoo.lr_schedule(0.5) == pytest.approx(5e-4) and zoo.clip_range_vf is None and zoo.vf_coef == 0.5
    finally:
        zoo.get_env().close()


@pytest.mark.parametrize("part,max_steps", [("sb3-zoo", 512), ("sb3-default", 2048)])
def test_sb3_parts_end_to_end_tiny(tmp_path, part, max_steps):
    pytest.importorskip("stable_baselines3", reason="the sb3 parts need stable-baselines3 (pip install -e '.[bench]')")
    assert peers.main(["--part", part, "--quick", "--max-steps", str(max_steps), "--no-compiled", "--no-progress",
                       "--out-dir", str(tmp_path)]) == 0
    data = json.loads((tmp_path / f"peers_{part.replace('-', '_')}.json").read_text())
    entry = data["result"]
    assert data["threads"] == 1 and set(entry["runs"]) == {"sb3", "fastrl"}
    for lib, (run_,) in entry["runs"].items():
        assert run_["total_steps"] <= max_steps + 256 and run_["sps"] > 0 and run_["torch_threads"] == 1, lib
    assert entry["summary"]["fastrl"]["sps_over_sb3"] > 0
    assert entry["fastrl_overrides"]["anneal_clip"] is (part == "sb3-zoo")
    text, _ = report.render(tmp_path.parent, tmp_path.parent / "RESULTS.md")
    assert peers_sb3.sb3_table(entry) in text


def test_rejax_part_end_to_end_tiny(tmp_path, monkeypatch):
    pytest.importorskip("rejax", reason="the rejax part needs rejax (pip install -e '.[jax]')")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # restored after the test, as main() sets both
    monkeypatch.setenv("XLA_FLAGS", "")
    assert peers.main(["--part", "rejax", "--quick", "--max-steps", "2000", "--no-compiled", "--no-progress",
                       "--out-dir", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "peers_rejax.json").read_text())
    entry = data["result"]
    assert data["jax_platforms"] == "cpu" and "intra_op_parallelism_threads=1" in data["xla_flags"]
    (rejax_run,), (fastrl_run,) = entry["runs"]["rejax"], entry["runs"]["fastrl"]
    assert rejax_run["compile_s"] > 0 and rejax_run["sps"] > 0 and len(rejax_run["evals"]) == 3  # steps 0, 1000, 2000
    assert fastrl_run["sps"] > 0 and [at for at, _, _ in fastrl_run["evals"]] == [1000, 2000]
    assert entry["summary"]["fastrl"]["sps_over_rejax"] > 0


def test_speed_parts_render_into_results_md(tmp_path):
    machine = {"machine": "cpu-test", "cpu_model": "Test CPU", "cpu_count": 2, "torch": "2.x", "python": "3.11",
               "timestamp": "2026-01-01T00:00:00+0000"}
    zoo_runs = {"sb3": [_peers_run("sb3", 480.0, True, 4e-4)], "fastrl": [_peers_run("fastrl", 480.0, True, 2e-4)]}
    zoo = {"env": "CartPole-v1", "algo": "ppo", "part": "sb3-zoo", "threshold": 475.0, "budget_steps": 100_000,
           "sb3_hyperparameters": peers_sb3.sb3_settings("sb3-zoo"), "compile": {"fastrl": "off"}, "runs": zoo_runs,
           "skipped": {}, "summary": {lib: peers_common.aggregate(r) for lib, r in zoo_runs.items()}}
    zoo["summary"]["fastrl"].update(sps_over_sb3=2.0, time_to_threshold_over_sb3=0.5)
    rejax_summary = {"rejax": {"seeds": 1, "reached": 1, "steps_to_threshold_median": 20_000,
                               "time_to_threshold_s_median": 0.25, "sps_median": 80_000.0, "compile_s_median": 9.0},
                     "fastrl": {"seeds": 1, "reached": 0, "steps_to_threshold_median": None,
                                "time_to_threshold_s_median": None, "sps_median": 3_000.0, "sps_over_rejax": 0.0375}}
    rejax = {"env": "CartPole-v1", "algo": "ppo", "part": "rejax", "threshold": 475.0, "budget_steps": 100_000,
             "rejax_config": peers_rejax.REJAX_PPO_CARTPOLE, "rejax_source": peers_rejax.REJAX_SOURCE, "eval_every_steps": 1000,
             "eval_episodes": 128, "compile": {"fastrl": "off"}, "runs": {}, "skipped": {}, "summary": rejax_summary}
    d = tmp_path / "results" / "cpu-test"
    d.mkdir(parents=True)
    for name, entry in (("peers_sb3_zoo", zoo), ("peers_sb3_default", {**zoo, "part": "sb3-default",
                                                                       "sb3_hyperparameters": peers_sb3.SB3_PPO_DEFAULTS}),
                        ("peers_rejax", rejax)):
        (d / f"{name}.json").write_text(json.dumps({"benchmark": name, "machine": machine, "threads": 1, "seeds": 1,
                                                    "result": entry}))
    text, _ = report.render(tmp_path / "results", tmp_path / "RESULTS.md")
    for heading in ("SB3 like for like", "SB3's default hyperparameters", "The JAX peer (rejax)"):
        assert any(line.startswith("### ") and heading in line for line in text.splitlines()), heading
    rows = {row[0]: row for row in _table_rows(text) if row[0] in ("rejax", "fastrl") and len(row) == 8}
    assert rows["rejax"][1:4] == ["9.0", "80,000", "-"] and rows["fastrl"][4:6] == ["0.04", "0/1"]
    zoo_rows = [row for row in _table_rows(text) if row[0] == "fastrl" and len(row) == 10]
    assert zoo_rows and zoo_rows[0][5:9] == ["0.50", "5,000", "-", "2.00"]


# ---------------------------------------------------------------------------------------------- envs_sps.py
def test_envs_sps_tiny(tmp_path):
    out = tmp_path / "envs.json"
    assert envs_sps.main(["--envs", "CartPole-v1", "--n-envs", "2", "--backends", "envpool", "gym_sync",
                          "--repeats", "1", "--out", str(out)]) == 0
    row = json.loads(out.read_text())["results"][0]
    assert row["sps"]["envpool"]["median"] > 0 and row["sps"]["gym_sync"]["median"] > 0
    assert row["envpool_over_gym_sync"] > 0


def test_rollout_sps_tiny(tmp_path):
    """A dry run of the rollout benchmark (CartPole, 4 envs, 4 steps, 1 round, no training part): one row per mode,
    each with raw EnvPool sync and async figures from the same run, and the keys the report reads."""
    from benchmarks import rollout_sps
    out = tmp_path / "rollout.json"
    assert rollout_sps.main(["--envs", "CartPole-v1", "--n-envs", "4", "--steps", "4", "--repeats", "1", "--no-train",
                             "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rollout"]
    assert [(r["env"], r["n_envs"], r["mode"]) for r in rows] == [("CartPole-v1", 4, "sync"), ("CartPole-v1", 4, "async")]
    for r in rows:
        assert r["rollout_over_raw"] > 0 and r["raw_sync_sps"]["median"] > 0 and r["raw_async_sps"]["median"] > 0
        assert r["raw_sps"] == r[f"raw_{r['mode']}_sps"] and r["rollout_sps"]["median"] > 0
    table = [row for row in _table_rows("\n".join(report.rollout_section({"rollout": rows}))) if row[0] == "CartPole-v1"]
    assert [(row[1], row[4]) for row in table] == [("4", f"{r['rollout_over_raw']:.0%}") for r in rows], table


def test_rollout_step_tiny(tmp_path):
    """A dry run of the rollout-step benchmark with its uncompiled contenders (2 envs, 4 steps, 1 round): µs per step
    for each, ratios over eager, and the table the report prints."""
    from benchmarks import rollout_step
    out = tmp_path / "rollout_step.json"
    assert rollout_step.main(["--n-envs", "2", "--steps", "4", "--repeats", "1", "--contenders", "eager",
                              "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    (row,) = data["results"]
    assert set(row["us_per_step"]) == {"eager"} and row["us_per_step"]["eager"] > 0
    assert row["speedup_over_eager"]["eager"] == 1.0
    assert "eager µs/step" in "\n".join(report.rollout_step_section(data))


def test_learner_tiny(tmp_path):
    """A dry run of the gradient-step benchmark with its uncompiled contenders: the twin, the trainer's update and 2
    members; then the report's table."""
    from benchmarks import learner
    out = tmp_path / "learner.json"
    assert learner.main(["--cases", "mlp-64", "--mode", "off", "--members", "2", "--repeats", "1", "--block-s", "0.01",
                         "--no-compile-times", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    row = data["results"][0]
    assert row["eager_us"] > 0 and row["pure_eager_us"] > 0 and row["population_us"] > 0
    (table_row,) = [cells for cells in _table_rows("\n".join(report.learner_section(data))) if cells[0] == "mlp-64"]
    assert table_row[2] == markdown_table(["x"], [[row["eager_us"]]]).splitlines()[-1].strip("| "), table_row
    assert table_row[6] == markdown_table(["x"], [[row["population_us"]]]).splitlines()[-1].strip("| "), table_row


def test_population_step_tiny(tmp_path, capsys):
    """The eager population step benchmark: both contenders on every case, JSON only where asked."""
    from benchmarks import population_step
    assert population_step.main(["--repeats", "1", "--calls", "1", "--threads", "1"]) == 0
    assert "autograd / hand" in capsys.readouterr().out and not list(tmp_path.iterdir())
    out = tmp_path / "population_step.json"
    assert population_step.main(["--repeats", "1", "--calls", "1", "--threads", "1", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["case"] for r in data["rows"]] == list(population_step.CASES)
    assert all(r["hand_us"] > 0 and r["autograd_us"] > 0 for r in data["rows"]) and data["members"] == 3


# ---------------------------------------------------------------------------------------------- gpu_profile.py
def test_gpu_profile_dry_run(tmp_path):
    """``fastrl bench --profile gpu --dry-run``'s code on CPU, with the Triton kernels interpreted (TRITON_INTERPRET=1
    must be set before triton is imported, hence the subprocess): every section runs or says why not."""
    import os
    from pathlib import Path
    import subprocess
    import sys
    pytest.importorskip("triton")
    out = tmp_path / "gpu_profile.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_profile", "--dry-run", "--out", str(out)],
                          cwd=Path(__file__).resolve().parent.parent, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "### Kernels" in proc.stdout and "### PPO on Breakout-v5" in proc.stdout and f"wrote {out}" in proc.stdout
    report = json.loads(out.read_text())
    assert report["dry_run"] and report["device"] == "cpu" and report["device_bandwidth"]["gbps"] is None
    assert report["kernels_skipped"] == {}
    kernels = {(r["kernel"], r["backend"], r["T"], r["N"]): r for r in report["kernels"]}
    assert {(k, b) for k, b, _, _ in kernels} == {(k, b) for k in ("gae", "vtrace", "ppo_loss fwd+bwd")
                                                  for b in ("triton", "torch")}
    assert all(r["us"] > 0 and r["gbps"] > 0 and r["of_copy"] > 0 and r["of_peak"] is None for r in kernels.values())
    for task, variants in (("atari", {"eager / bf16 off / 4 envs", "eager / bf16 on / 4 envs",
                                      "compiled / bf16 off / 4 envs"}),
                           ("cartpole", {"eager / bf16 off / 4 envs", "compiled / bf16 off / 4 envs"}),
                           ("iteration", {"eager / bf16 off / 4 envs", "compiled / bf16 off / 4 envs"})):
        rows = {r["variant"]: r for r in report[task]}
        ran = {name for name, r in rows.items() if r["status"] == "ok"}
        assert ran == variants, {name: r.get("reason") for name, r in rows.items()}
        assert all(rows[name]["sps"] > 0 for name in ran)
        assert all(rows[name]["update_compiled"] and rows[name]["rollout_compiled"] for name in ran
                   if name.startswith("compiled")), "the compiled variants trace without falling back to eager"
        cudagraphs = [r for r in rows.values() if r["mode"] == "cudagraphs"]
        assert cudagraphs and all(r["status"] == "skipped" and "CUDA" in r["reason"] for r in cudagraphs)


def test_gpu_profile_without_cuda_is_one_line(monkeypatch, capsys):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert run.main(["--profile", "gpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a CUDA device" in err and "--dry-run" in err


@pytest.mark.parametrize("argv,needle", [(["--dry-run"], "--dry-run goes with --profile gpu"),
                                         (["--profile", "gpu", "kernels"], "runs on its own"),
                                         (["--profile", "cpu"], "invalid choice")])
def test_gpu_profile_flag_mistakes_are_one_line(argv, needle, capsys):
    assert run.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err


def test_device_bandwidth_figures():
    from benchmarks.gpu_profile import bandwidth_from_properties, known_bandwidth
    assert round(bandwidth_from_properties(2_619_000, 5120)) == 3352  # H100 SXM: 2.619 GHz HBM3, 5120-bit bus
    assert bandwidth_from_properties(0, 5120) is None
    assert known_bandwidth("NVIDIA H200") == 4800 and known_bandwidth("NVIDIA H100 PCIe") == 2000
    assert known_bandwidth("NVIDIA A100-SXM4-80GB") == 2039 and known_bandwidth("NVIDIA GH200 480GB") == 4000
    assert known_bandwidth("Some Future GPU") is None


def test_zoo_covers_every_config_and_runs_tiny(tmp_path, monkeypatch, capsys):
    """Every config of configs/ has a row in the zoo or a line saying why not; a tiny 2-seed run writes its row, the
    curves and the table, keeps a finished row on a second run, and RESULTS.md renders it."""
    from benchmarks import report, zoo
    from fastrl.defaults import config_names
    assert set(config_names()) == {r.config for r in zoo.ROWS} | set(zoo.GPU_CONFIGS)
    monkeypatch.setattr(zoo, "QUICK_STEPS", 2048)
    monkeypatch.setattr(zoo, "SB3_TIMING_STEPS", 512)
    out = tmp_path / "out"
    assert zoo.main(["--quick", "--configs", "ppo/cartpole", "--seeds", "2", "--out-dir", str(out),
                     "--quiet-below", "0"]) == 0
    machine = out / zoo.machine_tag("cpu")
    row = json.loads((machine / "zoo" / "ppo_cartpole.json").read_text())
    assert row["seeds"] == 2 and len(row["eval_returns"]) == 2 and len(row["curves"]) == 2
    assert row["eval_median"] == statistics.median(row["eval_returns"])
    assert row.get("sb3_sps", 0) > 0 or row.get("sb3_skipped")  # SB3 is the bench extra: absent, the row says why
    if not row.get("sb3_skipped"):  # SB3 timed at 1 thread and at every core; the projection takes the faster
        assert set(row["sb3_sps_by_threads"]) == {str(n) for n in zoo.sb3_thread_counts()} and "1" in row["sb3_sps_by_threads"]
        assert row["sb3_sps"] == max(row["sb3_sps_by_threads"].values())
        assert row["sb3_sps"] == row["sb3_sps_by_threads"][str(row["sb3_threads"])]
    assert (machine / "plots" / "zoo_ppo_cartpole.png").stat().st_size > 0
    capsys.readouterr()
    assert zoo.main(["--quick", "--configs", "ppo/cartpole", "--seeds", "2", "--out-dir", str(out),
                     "--quiet-below", "0"]) == 0
    assert "kept from an earlier run" in capsys.readouterr().out
    text, _ = report.render(out, out / "RESULTS.md")
    assert "ppo/cartpole" in text and "ppo/atari" in text
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        zoo.main(["--configs", "ppo/atari"])  # a GPU config: refused, with the reason
    err = capsys.readouterr().err
    assert refused.value.code == 2 and f"not CPU zoo configs: ppo/atari (ppo/atari: {zoo.GPU_CONFIGS['ppo/atari']})" in err


def test_zoo_waits_for_a_quiet_machine_before_a_row_and_gives_up_at_the_limit(monkeypatch):
    """Rows run back to back: each waits until the 1-minute load falls below the threshold, at most --max-wait."""
    from benchmarks import zoo
    loads = iter([[2.1, 1.0, 0.5], [1.6, 1.0, 0.5], [1.1, 1.0, 0.5], [0.2, 0.2, 0.2]])
    slept = []
    monkeypatch.setattr(zoo, "load_average", lambda: next(loads))
    monkeypatch.setattr(zoo.time, "sleep", slept.append)
    assert zoo.wait_for_quiet(1.2, max_wait_s=60, poll_s=5) == [1.1, 1.0, 0.5] and slept == [5, 5]
    monkeypatch.setattr(zoo, "load_average", lambda: [3.0, 3.0, 3.0])
    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr(zoo.time, "monotonic", lambda: next(clock))
    slept.clear()
    assert zoo.wait_for_quiet(1.2, max_wait_s=30, poll_s=5) == [3.0, 3.0, 3.0] and len(slept) == 2  # gave up at 30 s
    slept.clear()
    assert zoo.wait_for_quiet(0, max_wait_s=30) == [3.0, 3.0, 3.0] and slept == []  # 0: no wait


def test_zoo_section_names_the_rows_span_and_the_code_they_ran():
    """RESULTS.md's zoo section spans first start to last end, and says whether every row ran the same code."""
    one_run = [{"config": "ppo/a", "started": "2026-12-05T07:45:40+0000", "timestamp": "2026-12-05T07:46:10+0000",
                "code": "6d348e0"},
               {"config": "ppo/b", "started": "2026-12-05T07:46:20+0000", "timestamp": "2026-12-05T08:40:00+0000",
                "code": "6d348e0"}]
    assert report.zoo_rows_span(one_run) == "2026-12-05 07:45 and 2026-12-05 08:40"
    assert report.zoo_rows_code(one_run) == " Every row ran on code 6d348e0."
    mixed = one_run + [{"config": "ppo/c", "timestamp": "2026-12-03T10:00:00+0000"}]  # older: no start, no code
    assert report.zoo_rows_span(mixed) == "2026-12-03 10:00 and 2026-12-05 08:40"
    assert report.zoo_rows_code(mixed) == \
        " The rows ran on different code: 6d348e0 (ppo/a, ppo/b); unrecorded (ppo/c)."
    mixed[1] |= {"code": "6d348e0+changes", "code_note": "edits beside the trainer"}
    assert report.zoo_rows_code(mixed) == " The rows ran on different code: 6d348e0 (ppo/a); 6d348e0+changes " \
        "(ppo/b: edits beside the trainer); unrecorded (ppo/c)."
    section = "\n".join(report.zoo_section({"machine": {"cpu_model": "x"}, "rows": []}))
    assert "ran between" not in section  # no rows: no span
    noted = "\n".join(report.zoo_section({"machine": {"cpu_model": "x"}, "rows": [], "note": "Found after the run: x."}))
    assert "cores. Found after the run: x. Curves" in noted  # a run's note, learned after it, goes into RESULTS.md


def test_zoo_rows_record_and_report_the_compile_cache_they_started_from(tmp_path, monkeypatch):
    """A row records how many files fastrl's inductor cache held at its start; RESULTS.md says whether the first row
    started cold (an empty cache) or warm, and nothing for rows that recorded nothing."""
    from benchmarks import zoo
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    assert zoo.compile_cache_files() == 0  # no cache directory yet
    (tmp_path / "cache" / "fxgraph" / "ab").mkdir(parents=True)
    for name in ("one", "two"):
        (tmp_path / "cache" / "fxgraph" / "ab" / name).write_text("x")
    (tmp_path / "cache" / "top").write_text("x")
    assert zoo.compile_cache_files() == 3
    pinned = str(tmp_path / "cache")
    rows = [{"config": "ppo/b", "started": "2026-12-05T11:00:00+0000", "timestamp": "2026-12-05T11:05:00+0000",
             "compile_cache_files_at_start": 40, "compile_cache_dir": pinned},
            {"config": "ppo/a", "started": "2026-12-05T10:30:00+0000", "timestamp": "2026-12-05T10:31:00+0000",
             "compile_cache_files_at_start": 0, "compile_cache_dir": pinned}]
    assert "was empty when the first row started: every graph" in report.zoo_rows_cache(rows)  # ppo/a started first
    rows[1]["compile_cache_files_at_start"] = 1234
    assert report.zoo_rows_cache(rows) == " The compile cache held 1,234 files when the first row started (earlier " \
        "runs' graphs)."
    rows[1]["compile_cache_files_at_start"] = 0
    for row in rows:  # recorded before the pin: the later rows used torch's own directory, whatever it held
        del row["compile_cache_dir"]
    unpinned = report.zoo_rows_cache(rows)
    assert "was empty when the first row started;" in unpinned and "may be warm starts" in unpinned
    assert "every graph was compiled in this run" not in unpinned
    del rows[1]["compile_cache_files_at_start"]
    assert report.zoo_rows_cache(rows) == ""


def test_the_zoo_counts_the_cache_its_rows_compile_into_after_torch_wrote_its_default(tmp_path, monkeypatch):
    """torch writes its own default into TORCHINDUCTOR_CACHE_DIR the first time it needs the directory (in the zoo's
    process, during the first row): the zoo's count, like every row's training process, stays on fastrl's cache."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    from benchmarks import zoo
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "fastrl" / "torch_compile").mkdir(parents=True)
    (tmp_path / "xdg" / "fastrl" / "torch_compile" / "graph").write_text("x")
    cache_dir()  # what torch calls when it needs the directory: it writes its default into the environment
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] != str(tmp_path / "xdg" / "fastrl" / "torch_compile")
    assert zoo.compile_cache_files() == 1


def test_zoo_rows_time_sb3_on_valid_settings_and_on_the_zoos_own_mujoco_runs():
    """Every row's ``zoo_settings`` is a valid set of config keys; Hopper and Walker2d (CleanRL's settings in their
    configs) time SB3 on the zoo's whole run: 1 env x 512 steps, minibatches of 32, 256x256 ReLU, no orthogonal init."""
    from benchmarks import zoo
    from fastrl.config import make_config
    for row in zoo.ROWS:
        make_config(dict(row.zoo_settings), row.config)
    for name, (epochs, lr, clip) in {"ppo/hopper": (5, 9.80828e-5, 0.2), "ppo/walker2d": (20, 5.05041e-5, 0.1)}.items():
        row, = [r for r in zoo.ROWS if r.config == name]
        ours, theirs = make_config({}, name), make_config(dict(row.zoo_settings), name)
        assert (ours.hidden_sizes, ours.activation, ours.ortho_init) == ([64, 64], "tanh", True)
        assert (theirs.n_envs, theirs.n_steps, theirs.minibatch_size, theirs.n_epochs) == (1, 512, 32, epochs)
        assert (theirs.hidden_sizes, theirs.activation, theirs.ortho_init, theirs.init_log_std) == \
            ([256, 256], "relu", False, -2.0)
        assert (theirs.lr, theirs.anneal_lr, theirs.clip_coef, theirs.clip_vloss) == (lr, False, clip, False)


def test_default_process_runs_each_seed(tmp_path):
    """Each seed runs as its own process (``--seed S``); the table gives each seed's steps and evaluation."""
    from benchmarks import default_process
    out = tmp_path / "process.json"
    tree = str(Path(__file__).resolve().parent.parent)
    assert default_process.main(["--quick", "--trees", tree, "--seeds", "1", "2", "--out", str(out), "--extra",
                                 "--wandb", "disabled", "--tensorboard", "false", "--plot", "false"]) == 0
    measured = json.loads(out.read_text())
    assert [r["seed"] for r in measured["runs"]] == [1, 2]
    assert measured["runs"][0]["learning"] != measured["runs"][1]["learning"], "the seeds differ"
    row, = measured["table"]
    assert row["runs"] == 2 and row["steps per seed"] == "8,192, 8,192" and row["same learning"]
    assert row["tree"].startswith(f"{tree} (") and row["tree"] != f"{tree} (?)"  # the tree's commit beside it
    (tmp_path / "cpu-test").mkdir()
    (tmp_path / "cpu-test" / "default_process.json").write_text(out.read_text())
    text, _ = report.render(tmp_path, tmp_path / "RESULTS.md")
    assert "The default command's process time, tree against tree" in text and "8,192, 8,192" in text
    assert row["eval per seed"] == ", ".join(f"{r['learning']['eval_return_mean']:.0f}" for r in measured["runs"])


def test_zoo_sb3_run_trains_sb3_at_the_rows_settings_and_scores_raw_returns():
    """benchmarks.zoo --sb3-seeds: SB3 at the row's settings (zoo_settings over the config) to the budget, then 10
    deterministic episodes whose returns are the raw, unnormalized ones."""
    pytest.importorskip("stable_baselines3")
    from benchmarks import zoo
    swimmer = zoo.sb3_config(next(r for r in zoo.ROWS if r.config == "ppo/swimmer"))
    assert (swimmer.n_envs, swimmer.batch_size, swimmer.minibatch_size, swimmer.gamma) == (1, 2048, 64, 0.9999)
    assert swimmer.time_feature and swimmer.normalize_obs and not swimmer.normalize_reward
    row = zoo.ZooRow("ppo/cartpole_zoo", 512, 500.0, "CartPole-v1", zoo_settings=(("normalize_reward", True),))
    result = zoo.train_sb3(row, 512, seed=2)
    assert result["steps"] >= 512 and result["seed"] == 2 and result["settings"] == {"normalize_reward": True}
    # CartPole pays 1 a step: raw returns are whole episode lengths whatever the reward normalizer does (a normalized
    # reward would make them fractions)
    assert len(result["eval_returns"]) == 10 and all(r == int(r) for r in result["eval_returns"]), result["eval_returns"]
    assert result["eval_mean"] == pytest.approx(statistics.mean(result["eval_returns"]))


def test_report_lists_the_zoo_sb3_runs_beside_the_zoo_figure():
    run = {"config": "ppo/swimmer", "gym_env": "Swimmer-v5", "seed": 1, "steps": 1_000_000, "eval_mean": 162.94,
           "last100_mean": 161.4, "zoo": 282.0, "train_s": 698.0, "started": "2026-12-05T22:54:04+0000",
           "load_average_at_start": [0.2, 0.1, 0.1], "code": "abc1234",
           "command": "python -m benchmarks.zoo --configs ppo/swimmer --sb3-seeds 1"}
    assert report.sb3_runs_lines([]) == []
    text = "\n".join(report.sb3_runs_lines([run]))
    assert "ppo/swimmer" in text and "Swimmer-v5" in text
    assert "162.9" in text and "282.0" in text and "2026-12-05 22:54" in text and "--sb3-seeds 1" in text
