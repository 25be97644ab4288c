"""Smoke tests of the benchmark suite: the entry point, the report generator and the peers' pure pieces."""
import json
import types

import pytest

from benchmarks import envs_sps, peers, report, run


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
         "skipped": {}, "summary": {lib: peers.aggregate(r) for lib, r in runs.items()}},
        {"env": "HalfCheetah-v4", "algo": "ppo", "threshold": None, "budget_steps": 20000,
         "runs": {"fastrl": [_peers_run("fastrl", -50.0, False, 1e-3)]}, "skipped": {"sb3": "MuJoCo is missing"},
         "summary": {"fastrl": peers.aggregate([_peers_run("fastrl", -50.0, False, 1e-3)])}},
    ]}
    learning_json = {"benchmark": "learning", "machine": machine, "quick": True, "seeds": 1,
                     "zoo_source": peers.ZOO_SOURCE, "results": [
                         {"env": "CartPole-v1", "algo": "ppo", "budget_steps": 100_000,
                          "zoo": peers.ZOO[("ppo", "CartPole-v1")], "seeds": 1, "eval_episodes": 10,
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
    assert peers.fastrl_curve(rows) == [[100, 1.5, None], [200, 3.0, 10.0]]
    rows = [{"global_step": 100, "time/elapsed_s": 4.0, "time/collect_s": 1.0, "time/update_s": 0.5}]
    assert peers.fastrl_curve(rows) == [[100, 4.0, None]]


def test_first_crossing_and_medians():
    curve = [[1, 0.1, None], [2, 0.2, 50.0], [3, 0.3, 100.0], [4, 0.4, 90.0]]
    assert peers.first_crossing(curve, 100.0) == (3, 0.3)
    assert peers.first_crossing(curve, 101.0) == (None, None)
    assert peers.first_crossing(curve, None) == (None, None)
    assert peers.median_or_none([1.0, 3.0, None]) == 3.0  # the unreached seed counts as infinitely slow
    assert peers.median_or_none([1.0, None, None]) is None
    assert peers.median_or_none([2.0]) == 2.0
    assert len(peers.thin(list(range(1000)), 50)) <= 51 and peers.thin(list(range(1000)), 50)[-1] == 999


def test_sb3_lr_schedule_matches_fastrl_per_iteration():
    from fastrl.train import Trainer
    cfg = peers.peer_config("ppo", "CartPole-v1", 1, 10 * 512, 475.0, 1)
    n = cfg.total_steps // cfg.batch_size
    schedule = peers.lr_schedule(cfg, n)
    for k in range(1, n + 1):  # SB3 trains rollout k with progress_remaining 1 - k/n; fastrl with iteration k-1
        fastrl_lr = Trainer.current_lr(types.SimpleNamespace(cfg=cfg, iteration=k - 1, n_iterations=n, lr_scale=1.0))
        assert schedule(1 - k / n) == pytest.approx(fastrl_lr)


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_sb3_mirror_takes_fastrl_hyperparameters(algo):
    pytest.importorskip("stable_baselines3")
    cfg = peers.peer_config(algo, "CartPole-v1", 3, 10_000, 475.0, 1)
    model = peers.sb3_model(cfg, cfg.total_steps // cfg.batch_size)
    try:
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
    assert learning["budget_steps"] == 1024 and learning["eval_return_median"] is not None


# ---------------------------------------------------------------------------------------------- envs_sps.py
def test_envs_sps_tiny(tmp_path):
    out = tmp_path / "envs.json"
    assert envs_sps.main(["--envs", "CartPole-v1", "--n-envs", "2", "--backends", "envpool", "gym_sync",
                          "--repeats", "1", "--out", str(out)]) == 0
    row = json.loads(out.read_text())["results"][0]
    assert row["sps"]["envpool"]["median"] > 0 and row["sps"]["gym_sync"]["median"] > 0
    assert row["envpool_over_gym_sync"] > 0
