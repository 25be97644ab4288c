"""``--vary``: a single value applies, a repeated key merges, every per-member key varies and a shape key is one line;
members.yaml records what each member ran; TensorBoard has one run per member at its own steps; stdout and
summary.json aggregate per variant, never across variants."""
import json
import statistics

import pytest
import torch
import yaml
from conftest import QUIET, one_line_error, parse_cli, train_main

from fastrl.config import make_config
from fastrl.defaults import SHAPE_KEYS, VARY_KEYS
from fastrl.run.population import member_configs
from fastrl.run.trainer import Trainer

TINY = ["--total-steps", "512", "--n-envs", "4", "--n-steps", "16", "--n-epochs", "1", "--compile", "off"]
SMALL = {"total_steps": 512, "n_envs": 4, "n_steps": 16, "n_epochs": 2, "n_minibatches": 2, "compile": "off",
         "progress": False}


def test_a_single_value_applies_to_the_member():
    trainer = Trainer(make_config({**SMALL, "vary": "lr=3e-4"}))
    trainer.collect()
    metrics = trainer.update()
    trainer.close()
    assert trainer.n_members == 1 and trainer.members[0].lr == 3e-4
    assert metrics["charts/learning_rate"].item() == pytest.approx(3e-4)  # the schedule starts at the member's lr


def test_a_key_given_twice_merges_its_values():
    cfg = parse_cli(["--vary", "lr=1e-3", "--vary", "lr=3e-4,1e-3", "--vary", "gamma=0.9"])
    assert cfg.vary == {"lr": [1e-3, 3e-4], "gamma": [0.9]}
    assert [m.lr for m in member_configs(cfg)] == [1e-3, 3e-4]


VALUES = {"lr": [1e-3, 3e-4], "lr_floor": [0.0, 1e-5], "anneal_lr": [True, False], "clip_coef": [0.1, 0.3],
          "anneal_clip": [True, False], "ent_coef": [0.0, 0.01], "vf_coef": [0.25, 1.0], "max_grad_norm": [0.5, 0.0],
          "gamma": [0.9, 0.99], "gae_lambda": [0.9, 1.0], "target_kl": [0.0, 0.02], "init_log_std": [0.0, -1.0],
          "ortho_init": [True, False]}


@pytest.mark.parametrize("key", VARY_KEYS)
def test_every_per_member_key_varies(key):
    members = member_configs(make_config({"vary": {key: VALUES[key]}}))
    assert [getattr(m, key) for m in members] == VALUES[key]


@pytest.mark.parametrize("key", [k for k in SHAPE_KEYS if k not in ("env", "policy")] + ["adam_eps", "norm_adv"])
def test_a_key_members_cannot_differ_in_is_one_line(key):
    message = one_line_error(make_config, {"vary": {key: ["1", "2"]}})
    assert f"{key} cannot vary within one population" in message and "run one population per" in message


def test_ortho_init_false_gives_pytorchs_default_init_per_member():
    """``ortho_init: false`` (SB3's ``ortho_init=False``): every linear layer as ``nn.Linear`` leaves it (weights and
    biases within +-1/sqrt(fan_in)), log_std at ``init_log_std``; in a population each member gets its own variant's
    init (member 0 orthogonal, member 1 PyTorch's)."""
    cfg = make_config({"env": "Pendulum-v1", "hidden_sizes": [64, 64], "init_log_std": -2.0, "compile": "off",
                       "n_envs": 2, "n_steps": 8, "n_minibatches": 1, "vary": {"ortho_init": [True, False]},
                       "progress": False, "tensorboard": False, "wandb": "disabled"})
    trainer = Trainer(cfg)
    try:
        ortho_head = trainer.agent.policy_head.weight.detach().clone()  # member 0, orthogonal
        default = trainer.member_agent(1)
        for name, layer in default.named_modules():
            if isinstance(layer, torch.nn.Linear):
                bound = 1 / layer.in_features ** 0.5
                assert layer.weight.abs().max() <= bound and layer.bias.abs().max() <= bound, name
                assert layer.bias.abs().max() > 0, name  # orthogonal init leaves biases at 0
        torch.testing.assert_close(default.log_std.detach(), torch.full((1,), -2.0))
        # Orthogonal: the policy head's rows are orthogonal with norm 0.01 (a 1 x 64 head: one row).
        torch.testing.assert_close(ortho_head.norm(dim=1), torch.full((1,), 0.01))
        assert default.policy_head.weight.norm() > 0.1
    finally:
        trainer.close()


def test_target_kl_stops_each_member_alone():
    """A member whose target_kl every epoch exceeds makes one epoch of steps; the other all of them."""
    trainer = Trainer(make_config({**SMALL, "n_epochs": 3, "vary": {"target_kl": [1e-12, 0.0]}}))
    trainer.collect()
    trainer.update()
    trainer.close()
    assert [row["losses/n_updates"] for row in trainer.member_rows()] == [2.0, 6.0]


def test_vary_with_impala_is_refused_even_for_one_value():
    assert "algo impala" in one_line_error(make_config, {"algo": "impala", "vary": "lr=3e-4"})


@pytest.fixture(scope="module")
def two_variants(tmp_path_factory):
    """One population of 2 variants x 2 seeds, with TensorBoard on."""
    run_dir = tmp_path_factory.mktemp("vary") / "run"
    args = ["--n-seeds", "2", "--vary", "lr=1e-3,5e-4", "--eval-episodes", "1", "--eval-seeds", "1",
            "--run-dir", str(run_dir), *TINY, *QUIET, "--tensorboard", "true"]
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert train_main(args) == 0
    return run_dir, json.loads(out.getvalue().strip().splitlines()[-1])


def test_members_yaml_records_what_each_member_ran(two_variants):
    run_dir, _ = two_variants
    base = yaml.safe_load((run_dir / "config.yaml").read_text())
    rows = yaml.safe_load((run_dir / "members.yaml").read_text())
    assert [(r["member"], r["seed"], r["lr"]) for r in rows] == [(0, 1, 1e-3), (1, 2, 1e-3), (2, 3, 5e-4), (3, 4, 5e-4)]
    population = make_config({k: v for k, v in base.items() if k not in ("run_dir", "resume", "overwrite")})
    for row, member in zip(rows, member_configs(population)):
        values = {k: v for k, v in row.items() if k not in ("member", "variant")}
        rebuilt = make_config({**{k: v for k, v in base.items() if k not in ("run_dir", "resume", "overwrite")},
                               **values, "n_seeds": 1, "vary": {}})
        assert rebuilt == member


def test_tensorboard_has_one_run_per_member_at_its_own_steps(two_variants):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run_dir, _ = two_variants
    names = sorted(p.name for p in (run_dir / "tb").iterdir() if p.is_dir())
    assert names == ["lr=0.0005-seed3", "lr=0.0005-seed4", "lr=0.001-seed1", "lr=0.001-seed2"]
    for name in names:
        events = EventAccumulator(str(run_dir / "tb" / name)).Reload()
        steps = [e.step for e in events.Scalars("losses/policy_loss")]
        assert steps == list(range(64, 513, 64)), "each member at its own env steps (64 per iteration), to 512"
        assert events.Scalars("eval/return_mean")[-1].step == 512
    root = EventAccumulator(str(run_dir / "tb")).Reload()
    assert "charts/SPS" in root.Tags()["scalars"] and "losses/policy_loss" not in root.Tags()["scalars"]
    assert max(e.step for e in root.Scalars("charts/SPS")) == 512


def test_summary_and_stdout_aggregate_per_variant(two_variants):
    run_dir, shown = two_variants
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["episode_return_mean"] is None and summary["eval_return_mean"] is None
    assert "members_eval_return_mean" not in summary and "members_episode_return_mean" not in summary
    variants = {v["variant"]: v for v in summary["variants"]}
    assert list(variants) == ["lr=0.001", "lr=0.0005"]
    for name, members in (("lr=0.001", [0, 1]), ("lr=0.0005", [2, 3])):
        entry = variants[name]
        assert entry["members"] == members and entry["hyperparameters"] == {"lr": float(name.split("=")[1])}
        evals = [summary["members"][m]["eval_return_mean"] for m in members]
        assert entry["eval_return_mean"]["mean"] == pytest.approx(statistics.fmean(evals))
        assert entry["eval_return_mean"]["median"] == pytest.approx(statistics.median(evals))
        assert shown["variants"][name]["eval_return_mean"]["mean"] == pytest.approx(statistics.fmean(evals))
    assert "eval_return_mean" not in shown and "episode_return_mean" not in shown


def test_the_run_rows_of_several_variants_hold_no_mean_across_them(two_variants):
    run_dir, _ = two_variants
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    run_rows = [r for r in rows if "member" not in r]
    assert run_rows and all(k == "global_step" or k.startswith(("charts/SPS", "time/", "perf/")) for r in run_rows for k in r)
    member_rows = [r for r in rows if "member" in r and "charts/episodic_return" in r]
    assert {r["variant"] for r in member_rows} == {"lr=0.001", "lr=0.0005"}  # the figures are per member


def test_one_variant_keeps_the_population_figures(tmp_path):
    run_dir = tmp_path / "seeds"
    assert train_main(["--n-seeds", "2", "--eval-episodes", "0", "--run-dir", str(run_dir), *TINY, *QUIET]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("charts/episodic_return" in r for r in rows if "member" not in r)  # seeds of one variant: their mean
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "variants" not in summary and summary["members_episode_return_mean"]["n"] == 2
    assert summary["episode_return_mean"] == pytest.approx(
        statistics.fmean(m["episode_return_mean"] for m in summary["members"]))


def test_the_progress_line_shows_each_variant_never_their_mean():
    from fastrl.run.loop import progress_returns
    ret = "charts/episodic_return"  # the member rows' name for it (Trainer.member_rows)
    rows = [{"variant": "lr=0.001", ret: 100.0}, {"variant": "lr=0.001", ret: 200.0},
            {"variant": "lr=0.0005", ret: 20.0}, {"variant": "lr=0.0005", ret: 40.0}]
    recent = {"episode_return_mean": 90.0}  # the members' mean, across variants
    assert progress_returns(recent, rows) == {"return[lr=0.001]": 150.0, "return[lr=0.0005]": 30.0}
    assert progress_returns(recent, rows[:2]) == {"return": 90.0}  # seeds of one variant: the population's mean
    assert progress_returns(recent, []) == {"return": 90.0}  # a single run
    many = [{"variant": f"lr={k}", ret: float(k)} for k in (3, 1, 4, 2)]
    assert progress_returns(recent, many) == {"best[lr=4]": 4.0, "worst[lr=1]": 1.0, "variants": 4}
    waiting = rows[:2] + [{"variant": "lr=0.0005"}, {"variant": "lr=0.0005", ret: 40.0}]
    shown = progress_returns(recent, waiting)  # a variant with a member before its first episode: no figure yet
    assert shown["return[lr=0.001]"] == 150.0 and shown["return[lr=0.0005]"] != shown["return[lr=0.0005]"]


def test_a_varied_runs_progress_line_shows_each_variants_return(tmp_path, capfd):
    """End to end: the member rows the run loop hands to the progress line carry the returns (a NaN per variant
    here once meant the line read another name than the rows hold)."""
    loud = ["--wandb", "disabled", "--tensorboard", "false", "--progress", "false", "--plot", "false"]
    assert train_main(["--vary", "lr=1e-3,5e-4", "--eval-episodes", "0", "--run-dir", str(tmp_path / "run"),
                       *TINY, *loud]) == 0
    lines = [line for line in capfd.readouterr().err.splitlines()
             if line.startswith("fastrl: step ") and "(100.0%)" in line]
    assert lines, "no final progress line"
    shown = dict(zip(lines[-1].split()[::2], lines[-1].split()[1::2]))
    returns = {key: float(value) for key, value in shown.items() if key.startswith("return[")}
    assert set(returns) == {"return[lr=0.001]", "return[lr=0.0005]"}, lines[-1]
    assert all(value > 0 for value in returns.values()), lines[-1]  # CartPole pays 1 a step: any episode is > 0
