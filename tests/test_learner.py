"""fastrl.learner.CompiledUpdate against the eager step (``*_loss_terms`` + ``backward_step``): same parameters,
same optimizer state, same diagnostics, step after step; the non-finite guard; no recompiles; state reloads."""
import copy

import pytest
import torch
from torch._dynamo.utils import counters

import fastrl.amp as amp
from fastrl.a2c import a2c_loss_terms, a2c_update
from fastrl.amp import autocast_factory, backward_step, make_optimizer
from fastrl.buffers import make_rollout_buffer
from fastrl.config import make_config
from fastrl.envs import ActionSpec
from fastrl.learner import CompiledUpdate
from fastrl.models import ActorCritic, PixelActorCritic
from fastrl.ppo import compute_advantages, ppo_loss_terms, ppo_update

DISCRETE = ActionSpec("discrete", n=2)
GAUSSIAN = ActionSpec("continuous", shape=(2,), low=(-1.0, -1.0), high=(1.0, 1.0))
CASES = {  # name -> (algo, action spec); a2c's optimizer is RMSprop, ppo's fused Adam
    "ppo-discrete": ("ppo", DISCRETE),
    "ppo-gaussian": ("ppo", GAUSSIAN),
    "a2c-discrete": ("a2c", DISCRETE),
}
TOL = dict(atol=1e-5, rtol=1e-4)


@pytest.fixture(autouse=True)
def one_thread_fresh_dynamo():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch._dynamo.reset()  # every test compiles its own CompiledUpdate; keep dynamo's per-code cache small
    counters.clear()
    yield
    torch.set_num_threads(threads)


def _cfg(algo, **overrides):
    return make_config(dict(algo=algo, env="CartPole-v1", ent_coef=0.01, **overrides))


def _agent(spec, seed=0):
    torch.manual_seed(seed)
    return ActorCritic((4,), spec, hidden_sizes=(64, 64))


def _minibatches(agent, count=3, n=64, seed=0):
    """Minibatches of the agent's own actions with perturbed old log-probs (some ratios clip) and ~10% invalid."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        obs = torch.randn(n, 4, generator=gen)
        with torch.no_grad():
            action, logp, _, value = agent.get_action_and_value(obs)
        old_logp = logp + 0.3 * torch.randn(n, generator=gen)
        advantage = 2 * torch.randn(n, generator=gen)
        target = value + 3 * torch.randn(n, generator=gen)  # gradient norms above the 0.5 clip
        valid = torch.rand(n, generator=gen) > 0.1
        out.append((obs, action, old_logp, advantage, value, target, valid))
    return out


def _pair(case, **cfg_overrides):
    """The same agent twice, each with its own ``make_optimizer`` optimizer: (cfg, eager, compiled)."""
    algo, spec = CASES[case]
    cfg = _cfg(algo, **cfg_overrides)
    agent = _agent(spec)
    eager, functional = copy.deepcopy(agent), copy.deepcopy(agent)
    return cfg, (eager, make_optimizer(cfg, eager.parameters())), (functional, make_optimizer(cfg, functional.parameters()))


def _eager_step(agent, optimizer, cfg, batch, sync_grads=None):
    loss_terms = a2c_loss_terms if cfg.algo == "a2c" else ppo_loss_terms
    loss, stats = loss_terms(agent, cfg, *batch)
    stats = dict(stats)
    stats["grad_norm"], nonfinite = backward_step(loss, optimizer, list(agent.parameters()), cfg.max_grad_norm,
                                                  sync_grads)
    return stats, nonfinite


def _assert_same_state(a, b, **tol):
    (agent_a, opt_a), (agent_b, opt_b) = a, b
    tol = tol or TOL
    for (name, p), q in zip(agent_a.named_parameters(), agent_b.parameters()):
        torch.testing.assert_close(q, p, **tol, msg=lambda m, name=name: f"parameter {name}: {m}")
        state_a, state_b = opt_a.state[p], opt_b.state[q]
        assert state_a.keys() == state_b.keys()
        for key in state_a:
            torch.testing.assert_close(state_b[key].to(state_a[key]), state_a[key], **tol,
                                       msg=lambda m, name=name, key=key: f"{key} of {name}: {m}")


def _assert_same_stats(stats, eager_stats, **tol):
    assert stats.keys() == eager_stats.keys()
    for key in eager_stats:
        torch.testing.assert_close(stats[key], eager_stats[key], **(tol or TOL), msg=lambda m, key=key: f"{key}: {m}")


def _no_inductor(monkeypatch):
    """Dynamo (guards, graph capture) with the cheap aot_eager backend: for tests about recompiles, not codegen."""
    real_compile = torch.compile
    monkeypatch.setattr(amp.torch, "compile", lambda fn, mode=None, fullgraph=False, dynamic=None: real_compile(
        fn, backend="aot_eager", fullgraph=fullgraph, dynamic=dynamic))


@pytest.mark.parametrize("mode", ["off", "default"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_eager_step_after_step(case, mode):
    """6 consecutive steps (clip active: max_grad_norm 0.5) give the eager step's parameters, state and stats."""
    cfg, eager, functional = _pair(case)
    update = CompiledUpdate(*functional, cfg, cfg.algo, mode=mode)
    batches = _minibatches(eager[0])
    for i in range(6):
        batch = batches[i % len(batches)]
        eager_stats, eager_nonfinite = _eager_step(*eager, cfg, batch)
        stats, nonfinite = update(*batch)
        assert not nonfinite and not eager_nonfinite and nonfinite.dtype == torch.bool
        _assert_same_stats(stats, eager_stats)
        _assert_same_state(eager, functional)
    assert update.compiled == (mode != "off")
    assert float(stats["grad_norm"]) > cfg.max_grad_norm  # the clip is active
    if cfg.algo == "ppo":
        assert float(stats["clipfrac"]) > 0  # the clipped branch of the surrogate is exercised


@pytest.mark.parametrize("case", ["ppo-discrete", "a2c-discrete"])
def test_without_grad_clip_matches_eager(case):
    cfg, eager, functional = _pair(case, max_grad_norm=0.0)
    update = CompiledUpdate(*functional, cfg, cfg.algo, mode="off")
    for batch in _minibatches(eager[0]) * 2:
        eager_stats, _ = _eager_step(*eager, cfg, batch)
        stats, _ = update(*batch)
        _assert_same_stats(stats, eager_stats)
    _assert_same_state(eager, functional)
    assert float(stats["grad_norm"]) > 0.5  # the default 0.5 would have clipped


@pytest.mark.parametrize("agent_kind", ["shared-trunk", "pixels"])
def test_tied_weights_and_buffers_match_eager(agent_kind):
    """A trunk shared by actor and critic (one parameter, two module paths) and a CNN with a buffer
    (``obs_scale``): functional_call sees the same model the eager step does."""
    cfg = _cfg("ppo")
    torch.manual_seed(0)
    if agent_kind == "shared-trunk":
        agent = ActorCritic((4,), DISCRETE, hidden_sizes=(64, 64), shared_trunk=True)
        batches = _minibatches(agent, count=2)
    else:
        agent = PixelActorCritic((3, 7, 7), ActionSpec("discrete", n=7), "minigrid_cnn", obs_scale=0.1)
        gen = torch.Generator().manual_seed(0)
        batches = []
        for _ in range(2):
            obs = torch.randint(0, 11, (32, 3, 7, 7), dtype=torch.uint8, generator=gen)
            with torch.no_grad():
                action, logp, _, value = agent.get_action_and_value(obs)
            batches.append((obs, action, logp + 0.3 * torch.randn(32, generator=gen), torch.randn(32, generator=gen),
                            value, value + 3 * torch.randn(32, generator=gen), torch.rand(32, generator=gen) > 0.1))
    eager, functional = copy.deepcopy(agent), copy.deepcopy(agent)
    eager, functional = (eager, make_optimizer(cfg, eager.parameters())), (functional, make_optimizer(cfg, functional.parameters()))
    update = CompiledUpdate(*functional, cfg, "ppo", mode="off")
    for batch in batches * 3:
        eager_stats, _ = _eager_step(*eager, cfg, batch)
        stats, _ = update(*batch)
        _assert_same_stats(stats, eager_stats)
    _assert_same_state(eager, functional)


@pytest.mark.parametrize("mode", ["off", "default"])
def test_grad_sync_sits_between_gradient_and_clip(monkeypatch, mode):
    """With ``sync_grads`` the step splits in two around it; a sync that triples the gradient shows it runs
    before the clip and the optimizer, as ``backward_step``'s does. (Both pieces must capture as full graphs;
    their math is the one-graph step's, which inductor compiles in the tests above.)"""
    _no_inductor(monkeypatch)
    cfg, eager, functional = _pair("ppo-discrete")
    seen = []

    def sync_flat(flat_grad):
        seen.append((flat_grad.shape, flat_grad.dtype))
        flat_grad.mul_(3.0)

    eager_params = list(eager[0].parameters())
    update = CompiledUpdate(*functional, cfg, "ppo", mode=mode, sync_grads=sync_flat)
    for batch in _minibatches(eager[0]) * 2:
        eager_stats, _ = _eager_step(*eager, cfg, batch, sync_grads=lambda: [p.grad.mul_(3.0) for p in eager_params])
        stats, _ = update(*batch)
        _assert_same_stats(stats, eager_stats)
        _assert_same_state(eager, functional)
    n_params = sum(p.numel() for p in eager_params)
    assert seen == [(torch.Size([n_params]), torch.float32)] * 6
    assert update.compiled == (mode != "off")


@pytest.mark.parametrize("case", ["ppo-discrete", "a2c-discrete"])
def test_nonfinite_minibatch_changes_nothing(case):
    """A NaN advantage makes the loss NaN: parameters and optimizer state (step included) stay bitwise as they
    were, ``nonfinite`` is True, and the next finite step goes on exactly like the eager path's."""
    cfg, eager, functional = _pair(case)
    update = CompiledUpdate(*functional, cfg, cfg.algo, mode="default")
    batches = _minibatches(eager[0])
    for batch in batches[:2]:
        _eager_step(*eager, cfg, batch)
        update(*batch)
    agent, optimizer = functional
    before = (copy.deepcopy(agent.state_dict()), copy.deepcopy(optimizer.state_dict()))
    obs, action, old_logp, advantage, old_value, target, valid = batches[2]
    advantage = advantage.clone()
    advantage[valid.nonzero()[0]] = float("nan")
    poisoned = (obs, action, old_logp, advantage, old_value, target, valid)
    stats, nonfinite = update(*poisoned)
    _, eager_nonfinite = _eager_step(*eager, cfg, poisoned)
    assert bool(nonfinite) and bool(eager_nonfinite)
    for key, value in before[0].items():
        assert torch.equal(agent.state_dict()[key], value), key
    for index, state in before[1]["state"].items():
        for key, value in state.items():
            assert torch.equal(optimizer.state_dict()["state"][index][key], value), (index, key)
    _assert_same_state(eager, functional)
    stats, nonfinite = update(*batches[0])
    eager_stats, _ = _eager_step(*eager, cfg, batches[0])
    assert not bool(nonfinite)
    _assert_same_stats(stats, eager_stats)
    _assert_same_state(eager, functional)
    assert update.compiled


def test_learning_rate_change_takes_effect_without_recompiling(monkeypatch):
    _no_inductor(monkeypatch)
    cfg, eager, functional = _pair("ppo-discrete")
    update = CompiledUpdate(*functional, cfg, "ppo", mode="default")
    batches = _minibatches(eager[0])
    _eager_step(*eager, cfg, batches[0])
    update(*batches[0])  # compiles
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1
    with torch._dynamo.config.patch(error_on_recompile=True):
        for lr in (1e-3, 3e-5, 0.0):
            for opt in (eager[1], functional[1]):
                opt.param_groups[0]["lr"] = lr
            before = [p.clone() for p in functional[0].parameters()]
            _eager_step(*eager, cfg, batches[1])
            update(*batches[1])
            _assert_same_state(eager, functional)
            unchanged = all(torch.equal(p, q) for p, q in zip(before, functional[0].parameters()))
            assert unchanged == (lr == 0.0)
    assert counters["stats"]["unique_graphs"] == graphs and not counters["recompiles"]
    assert update.compiled


@pytest.mark.parametrize("case,mode", [("ppo-discrete", "default"), ("a2c-discrete", "off")])
def test_restored_optimizer_state_is_used(monkeypatch, case, mode):
    """``load_state_dict`` replaces the optimizer's state tensors (a rollback, a resume): the next step reads the
    restored ones, as the eager optimizer does, and nothing recompiles."""
    _no_inductor(monkeypatch)
    cfg, eager, functional = _pair(case)
    update = CompiledUpdate(*functional, cfg, cfg.algo, mode=mode)
    batches = _minibatches(eager[0])
    for pair, step in ((eager, lambda b: _eager_step(*eager, cfg, b)), (functional, lambda b: update(*b))):
        agent, optimizer = pair
        for batch in batches:
            step(batch)
        saved = copy.deepcopy(agent.state_dict()), copy.deepcopy(optimizer.state_dict())
        for batch in batches[:2]:
            step(batch)
        agent.load_state_dict(saved[0])
        optimizer.load_state_dict(saved[1])
        with torch._dynamo.config.patch(error_on_recompile=True):
            for batch in batches[1:]:
                step(batch)
    _assert_same_state(eager, functional)
    assert not counters["recompiles"]


def test_bf16_autocast_compiles_and_stays_float32(monkeypatch):
    """autocast inside functional_call inside grad_and_value captures as one graph; parameters, state and stats
    stay float32 and agree with the eager bf16 step to bf16 precision. (aot_eager: inductor takes ~35 s on a
    2-core CPU for this graph and passes too.)"""
    _no_inductor(monkeypatch)
    cfg, eager, functional = _pair("ppo-discrete")
    autocast = autocast_factory(torch.device("cpu"), "bf16")
    update = CompiledUpdate(*functional, cfg, "ppo", autocast=autocast, mode="default")
    batch = _minibatches(eager[0], count=1)[0]
    loss, eager_stats = ppo_loss_terms(eager[0], cfg, *batch, autocast=autocast)
    eager_stats = dict(eager_stats)
    eager_stats["grad_norm"], _ = backward_step(loss, eager[1], list(eager[0].parameters()), cfg.max_grad_norm)
    stats, nonfinite = update(*batch)
    assert update.compiled and not nonfinite
    assert all(v.dtype == torch.float32 for v in stats.values())
    assert all(p.dtype == torch.float32 for p in functional[0].parameters())
    _assert_same_stats(stats, eager_stats, atol=2e-2, rtol=2e-2)
    _assert_same_state(eager, functional, atol=1e-4, rtol=2e-2)


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_update_with_step_fn_gives_the_eager_metrics(algo):
    """``ppo_update`` / ``a2c_update`` with ``step_fn``: same metric keys and values as their eager default."""
    cfg = _cfg(algo, n_envs=4, n_steps=16, **({"n_minibatches": 2, "n_epochs": 2} if algo == "ppo" else {}))
    agent = _agent(DISCRETE)
    buffer = make_rollout_buffer(cfg.n_steps, cfg.n_envs, (4,), torch.float32, DISCRETE)
    gen = torch.Generator().manual_seed(1)
    buffer["observation"].copy_(torch.randn(buffer["observation"].shape, generator=gen))
    with torch.no_grad():
        action, logp, _, value = agent.get_action_and_value(buffer["observation"].reshape(-1, 4))
    buffer["action"].copy_(action.view(cfg.n_steps, cfg.n_envs))
    buffer["sample_log_prob"].copy_(logp.view(cfg.n_steps, cfg.n_envs))
    buffer["state_value"].copy_(value.view(cfg.n_steps, cfg.n_envs))
    buffer["valid"].copy_(torch.rand(buffer["valid"].shape, generator=gen) > 0.1)
    nxt = buffer["next"]
    nxt["reward"].copy_(torch.randn(nxt["reward"].shape, generator=gen))
    nxt["done"].copy_(torch.rand(nxt["done"].shape, generator=gen) < 0.1)
    nxt["terminated"].copy_(nxt["done"])
    nxt["state_value"][:-1].copy_(buffer["state_value"][1:])
    compute_advantages(buffer, cfg.gamma, cfg.gae_lambda)
    eager, functional = copy.deepcopy(agent), copy.deepcopy(agent)
    eager_opt, functional_opt = make_optimizer(cfg, eager.parameters()), make_optimizer(cfg, functional.parameters())
    step_fn = CompiledUpdate(functional, functional_opt, cfg, algo, mode="off")
    if algo == "ppo":
        expected = ppo_update(eager, eager_opt, buffer, cfg, torch.Generator().manual_seed(5))
        metrics = ppo_update(functional, functional_opt, buffer, cfg, torch.Generator().manual_seed(5), step_fn=step_fn)
    else:
        expected = a2c_update(eager, eager_opt, buffer, cfg)
        metrics = a2c_update(functional, functional_opt, buffer, cfg, step_fn=step_fn)
    assert metrics.keys() == expected.keys()
    assert {"losses/grad_norm", "losses/nonfinite_updates", "losses/n_updates"} <= metrics.keys()
    for key in expected:
        torch.testing.assert_close(torch.as_tensor(metrics[key]), torch.as_tensor(expected[key]), **TOL,
                                   msg=lambda m, key=key: f"{key}: {m}")
    _assert_same_state((eager, eager_opt), (functional, functional_opt))


def test_unsupported_optimizers_are_refused():
    cfg, (agent, _), _ = _pair("ppo-discrete")
    for optimizer, match in ((torch.optim.Adam(agent.parameters(), weight_decay=0.1), "weight_decay"),
                             (torch.optim.RMSprop(agent.parameters(), momentum=0.9), "momentum"),
                             (torch.optim.SGD(agent.parameters(), lr=0.1), "Adam and RMSprop")):
        with pytest.raises(ValueError, match=match):
            CompiledUpdate(agent, optimizer, cfg, "ppo", mode="off")
