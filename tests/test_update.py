"""The pure PPO / A2C update (fastrl/learn/update.py) against its torch.optim twin (tests/reference_update.py), and the
properties the trainer builds on: vmap over members, chunked calls, compiled = eager, skipped non-finite steps,
torch.optim's checkpoint format, fp16 loss scaling, and a compile plan that ignores what the cache holds.

All exact checks: no learning here.
"""
import copy
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.func import vmap

from fastrl.config import make_config
from fastrl.envs.spaces import ActionSpec
from fastrl.learn.models import make_agent
from fastrl.learn.optim import load_optimizer_state_dict, optimizer_state_dict
from fastrl.learn.stacked import FlatLayout
from fastrl.learn.update import LOSS_KEYS, Update, UpdateSpec, epoch_end_mask, member_hparams, minibatch_index
from fastrl.run.compile import (PLANNING_HORIZON_GRADIENT_STEPS, CompilePlan, compile_cache_dir, compile_plan,
                                steps_per_call, target_steps_per_call)
from reference_update import reference_optimizer, reference_update

OBS, N_ACTIONS, BATCH = (4,), 3, 64


def _setup(seed=0, **overrides):
    cfg = make_config({"n_envs": 8, "n_steps": 8, "n_epochs": 3, "n_minibatches": 4, "lr": 3e-3, **overrides})
    torch.manual_seed(seed)
    spec = ActionSpec("discrete", n=N_ACTIONS)
    agent = make_agent(cfg, OBS, spec, 1.0)
    return cfg, agent


def _batch(cfg, agent, seed=1, continuous=False):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(BATCH, *OBS, generator=g)
    with torch.no_grad():
        action, logp, _, value = agent.get_action_and_value(obs)
    valid = torch.rand(BATCH, generator=g) > 0.1  # some auto-reset rows, masked out of every mean
    batch = {"observation": obs, "action": action, "sample_log_prob": logp + 0.05 * torch.randn(BATCH, generator=g),
             "advantage": torch.randn(BATCH, generator=g), "state_value": value,
             "value_target": value + torch.randn(BATCH, generator=g), "valid": valid}
    if cfg.algo == "ppo":
        batch["minibatch_index"] = minibatch_index(BATCH, cfg.n_epochs, cfg.n_minibatches,
                                                   torch.Generator().manual_seed(seed + 7), "cpu")
    return batch


def _pure(cfg, agent, batch, lr=None):
    layout = FlatLayout(agent)
    update = Update(UpdateSpec.of(cfg), layout)
    params = layout.flatten(agent)
    state = update.init_opt_state(params)
    hparams = member_hparams(cfg, "cpu", lr=lr)
    new_params, new_state, metrics = update(params, state, batch, hparams)
    return layout, update, new_params, new_state, metrics


CASES = [dict(), dict(clip_vloss=True), dict(norm_adv=False), dict(max_grad_norm=0.0), dict(max_grad_norm=0.05),
         dict(algo="a2c", n_epochs=1, n_minibatches=1), dict(algo="a2c", n_epochs=1, n_minibatches=1, optimizer="adam"),
         dict(optimizer="rmsprop"), dict(target_kl=1e-4), dict(shared_trunk=True)]


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_pure_update_equals_the_torch_optim_twin(overrides):
    cfg, agent = _setup(**overrides)
    twin = copy.deepcopy(agent)
    batch = _batch(cfg, agent)
    layout, _, params, state, metrics = _pure(cfg, agent, batch)
    counts = reference_update(twin, reference_optimizer(twin, cfg), cfg, batch, cfg.lr)
    torch.testing.assert_close(params, layout.flatten(twin), atol=1e-6, rtol=1e-5)
    assert metrics["n_updates"].item() == counts["n_updates"]
    if cfg.target_kl:
        assert 0 < counts["n_updates"] < cfg.n_epochs * cfg.n_minibatches, "target_kl should stop some epochs here"
    assert int(state["step"]) == counts["n_updates"]


def test_continuous_actions_equal_the_twin():
    cfg, _ = _setup()
    torch.manual_seed(0)
    agent = make_agent(cfg, OBS, ActionSpec("continuous", shape=(2,), low=(-1.0, -1.0), high=(1.0, 1.0)), 1.0)
    twin = copy.deepcopy(agent)
    batch = _batch(cfg, agent)
    layout, _, params, _, _ = _pure(cfg, agent, batch)
    reference_update(twin, reference_optimizer(twin, cfg), cfg, batch, cfg.lr)
    torch.testing.assert_close(params, layout.flatten(twin), atol=1e-6, rtol=1e-5)


def test_the_eager_autograd_path_equals_the_functional_one():
    """At K = 1, eagerly, the trainer differentiates through the agent module (``Update.eager_agent``)."""
    cfg, agent = _setup()
    batch = _batch(cfg, agent)
    _, _, functional, _, _ = _pure(cfg, agent, batch)
    layout = FlatLayout(agent)
    params = layout.flatten(agent)
    layout.bind(agent, params)
    update = Update(UpdateSpec.of(cfg), layout, path="module", agent=agent)
    state = update.init_opt_state(params)
    hparams = member_hparams(cfg, "cpu")
    inputs = tuple(batch[k] for k in LOSS_KEYS)
    active = torch.ones((), dtype=torch.bool)
    ends = epoch_end_mask(0, 12, cfg.n_minibatches, "cpu")
    for j in range(12):  # one step per call, written back, as the trainer does: the module sees the new weights
        new, state, _, active = update.steps(params, state, inputs, batch["minibatch_index"][j:j + 1], hparams, active,
                                             ends[j:j + 1])
        params.copy_(new)
    torch.testing.assert_close(params, functional, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("continuous", [False, True])
def test_the_gradient_by_parameter_concatenated_equals_the_gradient_by_the_flat_vector(continuous):
    """``Update.gradient`` differentiates with respect to each parameter's view and concatenates (what inductor
    compiles well); the gradient with respect to the flat vector itself is the same numbers, bit for bit."""
    from torch.func import grad_and_value
    cfg, agent = _setup()
    if continuous:
        agent = make_agent(cfg, OBS, ActionSpec("continuous", shape=(2,), low=(-1.0, -1.0), high=(1.0, 1.0)), 1.0)
    batch = _batch(cfg, agent)
    layout = FlatLayout(agent)
    update = Update(UpdateSpec.of(cfg), layout)
    params = layout.flatten(agent)
    hparams = member_hparams(cfg, "cpu")
    minibatch = tuple(batch[k][batch["minibatch_index"][0]] for k in LOSS_KEYS)
    grad, loss, _ = update.gradient(params, update.init_opt_state(params), minibatch, hparams)
    by_flat, (flat_loss, _) = grad_and_value(update.loss, has_aux=True)(params, minibatch, hparams)
    assert grad.shape == params.shape and grad.abs().sum() > 0
    assert torch.equal(grad, by_flat) and torch.equal(loss, flat_loss)


def test_vmap_over_members_equals_each_member_alone():
    members = []
    for seed in range(3):
        cfg, agent = _setup(seed=seed, lr=[1e-3, 3e-3, 1e-2][seed])
        members.append((cfg, agent, _batch(cfg, agent, seed=seed + 10)))
    layout = FlatLayout(members[0][1])
    update = Update(UpdateSpec.of(members[0][0]), layout)
    params = torch.stack([layout.flatten(a) for _, a, _ in members])
    state = update.init_opt_state(params)
    hparams = {k: torch.stack([member_hparams(c, "cpu")[k] for c, _, _ in members]) for k in member_hparams(cfg, "cpu")}
    batch = {k: torch.stack([b[k] for _, _, b in members]) for k in members[0][2]}
    new_params, _, metrics = vmap(update)(params, state, batch, hparams)
    for m, (cfg, agent, b) in enumerate(members):
        _, _, alone, _, alone_metrics = _pure(cfg, agent, b)
        torch.testing.assert_close(new_params[m], alone, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(metrics["policy_loss"][m], alone_metrics["policy_loss"], atol=1e-6, rtol=1e-5)


def test_members_minibatch_rows_are_each_members_own_rows():
    """K members' eager minibatch (one flat index over [K * B] rows) holds, per member, the rows its own index names."""
    cfg, agent = _setup()
    update = Update(UpdateSpec.of(cfg), FlatLayout(agent))
    g = torch.Generator().manual_seed(3)
    inputs = (torch.randn(3, BATCH, *OBS, generator=g), torch.randint(0, N_ACTIONS, (3, BATCH), generator=g),
              torch.rand(3, BATCH, generator=g) > 0.5)
    index = torch.stack([minibatch_index(BATCH, 2, 4, torch.Generator().manual_seed(m), "cpu") for m in range(3)])
    for j in range(index.shape[1]):
        for tensor, rows in zip(inputs, update.minibatch(inputs, index, j)):
            assert rows.shape == (3, BATCH // 4, *tensor.shape[2:])
            for m in range(3):
                assert torch.equal(rows[m], tensor[m][index[m, j]])


def test_steps_in_chunks_equal_the_whole_update():
    cfg, agent = _setup(target_kl=2e-3)
    batch = _batch(cfg, agent)
    layout, update, whole, _, whole_metrics = _pure(cfg, agent, batch)
    params = layout.flatten(agent)
    state = update.init_opt_state(params)
    hparams = member_hparams(cfg, "cpu")
    inputs = tuple(batch[k] for k in LOSS_KEYS)
    active = torch.ones((), dtype=torch.bool)
    applied = 0.0
    for first in range(0, 12, 4):  # one epoch of 4 minibatches per call
        params, state, sums, active = update.steps(params, state, inputs, batch["minibatch_index"][first:first + 4],
                                                   hparams, active, epoch_end_mask(first, 4, cfg.n_minibatches, "cpu"))
        applied += sums["n_updates"].item()
    torch.testing.assert_close(params, whole, atol=0, rtol=0)
    assert applied == whole_metrics["n_updates"].item()


def test_a_nonfinite_minibatch_changes_nothing_and_is_counted():
    cfg, agent = _setup(n_epochs=1, n_minibatches=1)
    batch = _batch(cfg, agent)
    batch["advantage"][3] = float("nan")
    layout, _, params, state, metrics = _pure(cfg, agent, batch)
    torch.testing.assert_close(params, layout.flatten(agent), atol=0, rtol=0)
    assert metrics["nonfinite_updates"].item() == 1 and metrics["n_updates"].item() == 0
    assert int(state["step"]) == 0 and torch.isfinite(metrics["policy_loss"])


@pytest.mark.parametrize("optimizer", ["adam", "rmsprop"])
def test_optimizer_state_round_trips_through_torch_optims_format(optimizer):
    """The flat state written as torch.optim's state_dict loads into torch.optim, whose next step equals ours."""
    cfg, agent = _setup(optimizer=optimizer, n_epochs=1, n_minibatches=1)
    batch = _batch(cfg, agent)
    layout, update, params, state, _ = _pure(cfg, agent, batch)
    saved = optimizer_state_dict(update.spec.optimizer, update.constants, state, layout.numels, layout.shapes, cfg.lr)
    twin = layout.load_into(copy.deepcopy(agent), params)
    torch_optimizer = reference_optimizer(twin, cfg)
    torch_optimizer.load_state_dict(saved)
    reference_update(twin, torch_optimizer, cfg, batch, cfg.lr)
    ours, _, _ = update(params, state, batch, member_hparams(cfg, "cpu"))
    torch.testing.assert_close(ours, layout.flatten(twin), atol=1e-6, rtol=1e-5)
    loaded = update.init_opt_state(params)
    load_optimizer_state_dict(update.spec.optimizer, torch_optimizer.state_dict(), loaded, layout.numels)
    assert int(loaded["step"]) == 2


def test_fp16_loss_scaling_math_keeps_the_update_and_halves_on_overflow():
    """Dynamic loss scaling (what fp16 uses on CUDA), checked in float32: the scaled gradient, unscaled, is the same
    update; a non-finite step halves the scale and leaves the weights."""
    cfg, agent = _setup(n_epochs=1, n_minibatches=1)
    batch = _batch(cfg, agent)
    _, _, plain, _, _ = _pure(cfg, agent, batch)
    layout = FlatLayout(agent)
    update = Update(UpdateSpec.of(cfg).__class__(**{**UpdateSpec.of(cfg).__dict__, "loss_scaling": True}), layout)
    params = layout.flatten(agent)
    state = update.init_opt_state(params)
    scaled, state, _ = update(params, state, batch, member_hparams(cfg, "cpu"))
    torch.testing.assert_close(scaled, plain, atol=1e-6, rtol=1e-5)
    batch["advantage"][0] = float("inf")
    again, state2, metrics = update(scaled, state, batch, member_hparams(cfg, "cpu"))
    assert torch.equal(again, scaled) and state2["loss_scale"].item() == state["loss_scale"].item() / 2


def test_compiled_update_equals_eager(monkeypatch):
    cfg, agent = _setup(n_epochs=2, n_minibatches=2)  # each step is unrolled in the graph: few keep the compile short
    batch = _batch(cfg, agent)
    layout, update, eager, _, _ = _pure(cfg, agent, batch)
    params = layout.flatten(agent)
    compiled = torch.compile(update, backend="aot_eager", fullgraph=True)
    result, _, _ = compiled(params, update.init_opt_state(params), batch, member_hparams(cfg, "cpu"))
    torch.testing.assert_close(result, eager, atol=1e-6, rtol=1e-5)


def test_compile_plan_reads_config_and_shapes_only(tmp_path, monkeypatch):
    """The plan has no cache input: the same arguments give the same plan whatever the inductor cache holds."""
    cpu = torch.device("cpu")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "empty"))
    empty = [compile_plan("auto", cpu, steps, steps * 10) for steps in (10, 20_000, 10**6)]
    (tmp_path / "full" / "fastrl_compiled").mkdir(parents=True)
    for name in ("a", "b"):
        (tmp_path / "full" / "fastrl_compiled" / name).touch()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "full"))
    full = [compile_plan("auto", cpu, steps, steps * 10) for steps in (10, 20_000, 10**6)]
    assert empty == full
    assert [p.update for p in empty] == ["off", "default", "default"]
    assert compile_plan("auto", cpu, 0) == CompilePlan("off", "off", 1)
    assert compile_plan("auto", torch.device("cuda"), 0) == CompilePlan("reduce-overhead", "reduce-overhead", 1)
    # steps_per_call's shapes at the most steps per call (8): whole epochs, else a divisor of the minibatches
    assert steps_per_call(4, 2, 8) == 8 and steps_per_call(10, 32, 8) == 8 and steps_per_call(10, 4, 8) == 8
    assert steps_per_call(4, 1, 8) == 4 and steps_per_call(5, 5, 8) == 5 and steps_per_call(10, 7, 8) == 7
    assert steps_per_call(10, 11, 8) == 1
    # a long run plans over PLANNING_HORIZON_GRADIENT_STEPS (fastrl.run.compile): 3 steps per call at most there
    long = 2 * 10**6
    assert target_steps_per_call(PLANNING_HORIZON_GRADIENT_STEPS) == 3
    assert compile_plan("auto", cpu, long, n_epochs=4, n_minibatches=2).steps_per_call == steps_per_call(4, 2, 3) == 2
    assert compile_plan("auto", cpu, long, n_epochs=5, n_minibatches=3).steps_per_call == 3


def test_the_compile_cache_is_fastrls_even_after_torch_wrote_its_default(tmp_path, monkeypatch):
    """torch writes its own default cache directory into TORCHINDUCTOR_CACHE_DIR when it first needs it (importing
    torch._dynamo is enough, as a script that compiled or imported a library that does has); a compiled run in that
    process still uses fastrl's cache, and a directory the user set stays theirs."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    cpu = torch.device("cpu")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    fastrls = tmp_path / "xdg" / "fastrl" / "torch_compile"
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    written = subprocess.run([sys.executable, "-c", "import os, torch._dynamo; "
                              "print(os.environ.get('TORCHINDUCTOR_CACHE_DIR'))"], env=env, capture_output=True,
                             text=True, check=True).stdout.strip()
    assert Path(written) == Path(default_cache_dir())  # what torch writes, so what a later run in that process sees
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", written)
    assert compile_cache_dir() == fastrls
    compile_plan("auto", cpu, 100)  # compiles nothing: the variable is left alone
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == written
    compile_plan("default", cpu, 100)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(fastrls)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compile_cache_dir() == tmp_path / "mine"
    compile_plan("default", cpu, 100)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")


def test_a_trainer_with_a_restored_iteration_count_compiles_before_it_skips_guards():
    """fastrl tune's next segment (fewer members, in the same process) and a resume build a Trainer whose iteration
    count is restored: it compiles for its own shapes on its first iteration and skips guards only from its second,
    instead of failing over to eager (a recompile under skipped guards raises)."""
    from fastrl.run.trainer import Trainer
    base = {"env": "CartPole-v1", "n_envs": 2, "n_steps": 8, "n_epochs": 1, "n_minibatches": 2, "hidden_sizes": [8],
            "compile": "default", "progress": False, "wandb": "disabled", "tensorboard": False}
    first = Trainer(make_config({**base, "n_seeds": 2}))
    for _ in range(2):
        first.collect()
        first.update()
    second = Trainer(make_config({**base, "n_seeds": 3}))
    second.iteration = 2  # as load_state_dict restores it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            second.collect()
            second.update()
    failed = [str(w.message) for w in caught if "torch.compile failed" in str(w.message)]
    assert not failed, failed
    assert second.update_call.compiled and second.plan.update == "default"


def test_steps_per_call_weighs_the_compile_against_the_calls():
    """Short runs unroll less (each unrolled step costs compile time), long runs more (each call costs a prologue):
    the measured optimum sqrt(G * CALL_OVERHEAD_S / COMPILE_S_PER_UNROLLED_STEP), within the shapes' divisors."""
    cpu = torch.device("cpu")
    per_call = {g: compile_plan("default", cpu, g, n_epochs=10, n_minibatches=32).steps_per_call
                for g in (1_000, 15_360, 62_464, 156_250, 10**6, 10**8)}
    # from the planning horizon (200k gradient steps) on, the target stays 3: 32 minibatches allow 2 per call
    assert per_call == {1_000: 1, 15_360: 1, 62_464: 2, 156_250: 2, 10**6: 2, 10**8: 2}
    assert [target_steps_per_call(g) for g in (1_000, 62_464, 156_250, 10**6)] == [1, 2, 3, 6]
    assert compile_plan("default", cpu, 10**6, n_epochs=10, n_minibatches=6).steps_per_call == 3
    assert compile_plan("auto", cpu, 15_360).update == "off"  # one agent: eager below 20k steps
    assert compile_plan("auto", cpu, 11_680, members=3).update == "default"  # a population compiles from 10k
    assert compile_plan("auto", cpu, 7_800, members=3).update == "off"
    # a population whose eager step is the hand-derived gradient (fastrl.learn.mlp_gradient) compiles from 30k
    assert compile_plan("auto", cpu, 12_500, members=3, hand_gradient=True).update == "off"
    assert compile_plan("auto", cpu, 62_464, members=3, hand_gradient=True).update == "default"


def test_cold_and_warm_cache_runs_log_identical_metrics(tmp_path):
    """The same command and seed, compiled, first with an empty inductor cache, then with the filled one: the same
    numbers in metrics.jsonl and the same plan in summary.json."""
    cache = tmp_path / "cache"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "WANDB_MODE": "disabled"}
    args = ["--total-steps", "256", "--n-envs", "4", "--n-steps", "16", "--n-epochs", "1", "--n-minibatches", "1",
            "--hidden-sizes", "16", "16", "--compile", "default", "--eval-episodes", "0", "--no-progress",
            "--tensorboard", "false", "--wandb", "disabled", "--plot", "false", "--log-interval", "1", "--seed", "4"]
    rows = []
    for name in ("cold", "warm"):
        run_dir = tmp_path / name
        out = subprocess.run([sys.executable, "-m", "fastrl.train", *args, "--run-dir", str(run_dir)], env=env,
                             capture_output=True, text=True, timeout=400)
        assert out.returncode == 0, out.stderr[-2000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["compiled"]["update"] == "default"
        lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        rows.append([{k: v for k, v in row.items() if k.startswith(("losses/", "charts/episodic"))} for row in lines])
    assert rows[0] == rows[1] and len(rows[0]) >= 4


# The one dispatch point: (members, compiled, fp16 loss scaling, hand gradient applies) -> the step's path.
STEP_PATH_TABLE = [
    ((1, False, False, True), "members_hand"),  # a single eager MLP run: the hand-derived gradient, at K = 1
    ((1, False, False, False), "module"),  # a single eager run of another model: autograd through the agent module
    ((1, False, True, False), "functional"),  # fp16 loss scaling (CUDA) eagerly
    ((1, True, False, False), "functional"),  # compiled (CPU inductor, CUDA graphs)
    ((1, True, True, False), "functional"),
    ((3, False, False, True), "members_hand"),  # an eager MLP population: the hand-derived gradient
    ((3, False, False, False), "members_autograd"),  # an eager population of another model (CNN, ELU, MultiDiscrete)
    ((3, False, True, False), "members_autograd"),
    ((3, True, False, True), "functional"),  # a compiled population: vmap of the functional step
    ((16, True, False, False), "functional"),
    ((1, False, False, True, True), "members_hand"),  # the eager iteration (pure): no module path, even at K = 1
    ((1, False, False, False, True), "members_autograd"),
    ((3, True, False, True, True), "functional"),  # the compiled iteration
]


@pytest.mark.parametrize("case, path", STEP_PATH_TABLE, ids=[str(case) for case, _ in STEP_PATH_TABLE])
def test_step_path_is_a_pure_function_of_the_config_and_shapes(case, path):
    from fastrl.learn.update import step_path
    assert step_path(*case) == path


@pytest.mark.parametrize("overrides, path", [
    (dict(), "members_hand"), (dict(activation="elu"), "module"), (dict(compile="default"), "functional"),
    (dict(n_seeds=3), "members_hand"),
    (dict(n_seeds=3, compile="default"), "functional"), (dict(n_seeds=2, activation="elu"), "members_autograd"),
    (dict(n_seeds=2, algo="a2c", n_epochs=1, n_minibatches=1), "members_hand")])
def test_the_trainer_records_the_path_its_config_takes(overrides, path):
    """The trainer builds its update through ``step_path`` and records the path in summary.json (``compiled``)."""
    from fastrl.run.trainer import Trainer
    cfg = make_config({"env": "CartPole-v1", "n_envs": 2, "n_steps": 8, "total_steps": 64, "device": "cpu", **overrides})
    trainer = Trainer(cfg)
    try:
        assert trainer.update_fn.path == path
        assert trainer.summary_extras()["compiled"]["step_path"] == path
        assert (trainer.update_fn.eager_agent is trainer.agent) == (path == "module")
    finally:
        trainer.close()


def test_a_path_that_does_not_apply_is_refused_at_construction():
    cfg, agent = _setup(activation="elu")
    with pytest.raises(ValueError, match="hand-derived"):
        Update(UpdateSpec.of(cfg), FlatLayout(agent), path="members_hand")
    with pytest.raises(ValueError, match="module path"):
        Update(UpdateSpec.of(cfg), FlatLayout(agent), path="module")
