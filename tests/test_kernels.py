"""GAE and V-trace: every CPU backend against the loop twin and against TorchRL's functionals."""
import pytest
import torch

from fastrl import kernels
from fastrl.kernels.testing import SCAN_CASES, gae_args, scan_inputs, strided, to_float64, transposed, vtrace_args

GAMMA, LAM = 0.97, 0.9
TOL = dict(rtol=1e-5, atol=1e-5)
CPU_BACKENDS = [None, "cpu", "torch"]


def _check(got, want):
    assert all(g.dtype == torch.float32 for g in got)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g.double(), w, **TOL)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("shape,p_done", SCAN_CASES)
def test_gae_matches_reference(backend, shape, p_done):
    x = scan_inputs(shape, p_done, seed=hash(shape) % 1000)
    want = kernels.gae_reference(*to_float64(gae_args(x)), GAMMA, LAM)
    _check(kernels.gae(*gae_args(x), GAMMA, LAM, backend=backend), want)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("shape,p_done", SCAN_CASES)
@pytest.mark.parametrize("clip", [(1.0, 1.0, 1.0), (2.0, 0.8, 0.95)])
def test_vtrace_matches_reference(backend, shape, p_done, clip):
    x = scan_inputs(shape, p_done, seed=hash(shape) % 1000 + 1)
    want = kernels.vtrace_reference(*to_float64(vtrace_args(x)), GAMMA, *clip)
    _check(kernels.vtrace(*vtrace_args(x), GAMMA, *clip, backend=backend), want)


@pytest.mark.parametrize("layout", [transposed, strided])
@pytest.mark.parametrize("shape", [(31, 10), (9, 3, 5), (5, 1)])
@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_non_contiguous(layout, shape, backend):
    x = scan_inputs(shape, 0.2, seed=3)
    y = layout(x)
    assert not y["reward"].is_contiguous() or y["reward"].numel() == y["reward"].shape[0]
    _check(kernels.gae(*gae_args(y), GAMMA, LAM, backend=backend),
           kernels.gae_reference(*to_float64(gae_args(x)), GAMMA, LAM))
    _check(kernels.vtrace(*vtrace_args(y), GAMMA, 1.5, 0.9, 0.8, backend=backend),
           kernels.vtrace_reference(*to_float64(vtrace_args(x)), GAMMA, 1.5, 0.9, 0.8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("flag_dtype", [torch.bool, torch.float32, torch.bfloat16])
def test_low_precision_inputs(dtype, flag_dtype):
    # the kernels upcast each input and compute in float32: same as the twin on the upcast values
    x = scan_inputs((37, 11), 0.2, dtype=dtype, flag_dtype=flag_dtype, seed=5)
    _check(kernels.gae(*gae_args(x), GAMMA, LAM), kernels.gae_reference(*to_float64(gae_args(x)), GAMMA, LAM))
    _check(kernels.vtrace(*vtrace_args(x), GAMMA, 1.0, 1.0, 0.9),
           kernels.vtrace_reference(*to_float64(vtrace_args(x)), GAMMA, 1.0, 1.0, 0.9))


def test_mixed_dtypes_and_tensor_scalars():
    x = scan_inputs((15, 4), 0.3, seed=6)
    x["value"] = x["value"].bfloat16()
    gamma, lam = torch.tensor(GAMMA), torch.tensor(LAM, dtype=torch.float64)
    _check(kernels.gae(*gae_args(x), gamma, lam), kernels.gae_reference(*to_float64(gae_args(x)), GAMMA, LAM))


@pytest.mark.parametrize("backend", [None, "cpu", "torch"])
def test_gae_keeps_float64_inputs_float64(backend):
    """Float64 in, float64 out, exactly the reference twin's figures (no rounding through float32)."""
    x = scan_inputs((17, 3), 0.3, seed=8)
    args = to_float64(gae_args(x))
    adv, target = kernels.gae(*args, GAMMA, LAM, backend=backend)
    want_adv, want_target = kernels.gae_reference(*args, GAMMA, LAM)
    assert adv.dtype == target.dtype == torch.float64
    assert torch.equal(adv, want_adv) and torch.equal(target, want_target)
    assert not torch.equal(adv, adv.float().double()), "precondition: the figures need float64"


def test_gae_hand_computed():
    """T=5, N=2, gamma=0.9, lam=0.8 (gamma*lam = 0.72); next_value[t] = V(obs after step t).
    env 0: terminated at t=1, its reset step at t=2; env 1: truncated at t=2, its reset step at t=3.
    delta_t = r_t + g(1-term_t) nv_t - v_t,  A_t = delta_t + g*l*(1-done_t) A_{t+1}:
    env 0: delta = [1+.36-.5, 1+0-.4, 0+.54-.3, 1+.63-.6, 1+.72-.7] = [.86, .6, .24, 1.03, 1.02]
           A4 = 1.02; A3 = 1.03+.72*1.02 = 1.7644; A2 = .24+.72*1.7644 = 1.510368 (reset step)
           A1 = .6 (terminated: no bootstrap, trace cut, the reset step does not leak); A0 = .86+.72*.6 = 1.292
    env 1: delta = [1+.9-1, 1+.9-1, 1+1.8-1, 0+.45-2, 1+1.35-.5] = [.9, .9, 1.8, -1.55, 1.85]
           A4 = 1.85; A3 = -1.55+.72*1.85 = -.218 (reset step); A2 = 1.8 (truncated: bootstraps from nv=2, trace cut)
           A1 = .9+.72*1.8 = 2.196; A0 = .9+.72*2.196 = 2.48112"""
    value = torch.tensor([[0.5, 1.0], [0.4, 1.0], [0.3, 1.0], [0.6, 2.0], [0.7, 0.5]])
    next_value = torch.tensor([[0.4, 1.0], [0.3, 1.0], [0.6, 2.0], [0.7, 0.5], [0.8, 1.5]])
    reward = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    terminated = torch.zeros(5, 2, dtype=torch.bool)
    truncated = torch.zeros(5, 2, dtype=torch.bool)
    terminated[1, 0] = truncated[2, 1] = True
    want = torch.tensor([[1.292, 2.48112], [0.6, 2.196], [1.510368, 1.8], [1.7644, -0.218], [1.02, 1.85]])
    for backend in CPU_BACKENDS:
        adv, target = kernels.gae(reward, value, next_value, terminated | truncated, terminated, 0.9, 0.8,
                                  backend=backend)
        torch.testing.assert_close(adv, want, rtol=0, atol=1e-5)
        torch.testing.assert_close(target, want + value, rtol=0, atol=1e-5)


def test_outputs_not_differentiable():
    x = scan_inputs((6, 3), 0.2)
    value = x["value"].requires_grad_()
    adv, _ = kernels.gae(x["reward"], value, x["next_value"], x["done"], x["terminated"], GAMMA, LAM)
    assert not adv.requires_grad


# ---- TorchRL agreement: its functionals are batch-major [*B, T, F] with time_dim=-2 -------------------

def _batch_major(x):
    return x.t().unsqueeze(-1).double() if x.is_floating_point() else x.t().unsqueeze(-1)


def _time_major(x):
    return x.squeeze(-1).t()


@pytest.mark.parametrize("shape,p_done", [((1, 3), 0.3), ((40, 17), 0.1), ((12, 9), 1.0), ((33, 8), 0.0)])
def test_gae_matches_torchrl(shape, p_done):
    F = pytest.importorskip("torchrl.objectives.value.functional")
    x = scan_inputs(shape, p_done, seed=11)
    adv, target = kernels.gae(*gae_args(x), GAMMA, LAM)
    reward, value, next_value, done, terminated = (_batch_major(a) for a in gae_args(x))
    for fn in (F.generalized_advantage_estimate, F.vec_generalized_advantage_estimate):
        want_adv, want_target = fn(GAMMA, LAM, value, next_value, reward, done, terminated)
        torch.testing.assert_close(adv.double(), _time_major(want_adv), **TOL)
        torch.testing.assert_close(target.double(), _time_major(want_target), **TOL)


@pytest.mark.parametrize("shape,p_done", [((1, 3), 0.3), ((40, 17), 0.1), ((12, 9), 1.0), ((33, 8), 0.0)])
@pytest.mark.parametrize("rho_bar,c_bar", [(1.0, 1.0), (2.0, 0.7)])
def test_vtrace_matches_torchrl(shape, p_done, rho_bar, c_bar):
    # TorchRL computes rho = exp(log_pi - log_mu), so its log_pi is our target_logp and its log_mu our
    # behavior_logp. It has no lambda (c_t = min(c_bar, ratio)): compare at lam = 1. It returns
    # (pg_advantage, vs) where we return (vs, pg_advantage); both bootstrap pg_advantage from
    # next_value at done steps and at t = T-1.
    F = pytest.importorskip("torchrl.objectives.value.functional")
    x = scan_inputs(shape, p_done, seed=12)
    vs, pg_adv = kernels.vtrace(*vtrace_args(x), GAMMA, rho_bar, c_bar, 1.0)
    behavior_logp, target_logp, reward, value, next_value, done, terminated = (
        _batch_major(a) for a in vtrace_args(x)
    )
    want_pg, want_vs = F.vtrace_advantage_estimate(
        GAMMA, target_logp, behavior_logp, value, next_value, reward, done, terminated,
        rho_thresh=rho_bar, c_thresh=c_bar,
    )
    torch.testing.assert_close(vs.double(), _time_major(want_vs), **TOL)
    torch.testing.assert_close(pg_adv.double(), _time_major(want_pg), **TOL)


# ---- torch.compile: the ops are registered, so a compiled trainer step has no graph break ------------

def test_compiles_without_graph_break():
    x = scan_inputs((16, 5), 0.2, seed=4)

    @torch.compile(fullgraph=True, backend="eager")
    def step(behavior_logp, target_logp, reward, value, next_value, done, terminated):
        adv, target = kernels.gae(reward, value, next_value, done, terminated, GAMMA, LAM)
        vs, pg_adv = kernels.vtrace(behavior_logp, target_logp, reward, value, next_value, done, terminated, GAMMA)
        return adv * 2, target, vs, pg_adv

    got = step(*vtrace_args(x))
    want_gae = kernels.gae_reference(*to_float64(gae_args(x)), GAMMA, LAM)
    want_vt = kernels.vtrace_reference(*to_float64(vtrace_args(x)), GAMMA)
    _check([got[0] / 2, got[1], got[2], got[3]], [*want_gae, *want_vt])


def test_registered_ops_pass_opcheck():
    x = scan_inputs((8, 3), 0.3, seed=2)
    torch.library.opcheck(torch.ops.fastrl_kernels.gae.default, (*gae_args(x), GAMMA, LAM))
    torch.library.opcheck(torch.ops.fastrl_kernels.vtrace.default, (*vtrace_args(x), GAMMA, 1.0, 1.0, 1.0))


# ---- errors: one ValueError that names the argument ----------------------------------------------------

@pytest.mark.parametrize(
    "change,match",
    [
        (lambda x: x.update(value=x["value"][:-1]), "`value` has shape"),
        (lambda x: x.update(next_value=x["next_value"].unsqueeze(-1)), "`next_value` has shape"),
        (lambda x: x.update(reward=x["reward"].long()), "`reward` has dtype"),
        (lambda x: x.update(done=x["done"].long()), "`done` has dtype"),
        (lambda x: x.update(terminated=x["terminated"].tolist()), "`terminated` must be a torch.Tensor"),
        (lambda x: x.update(value=x["value"].to("meta")), "`value` is on meta"),
    ],
)
def test_errors_name_the_argument(change, match):
    x = scan_inputs((5, 3), 0.2)
    change(x)
    with pytest.raises(ValueError, match=match):
        kernels.gae(*gae_args(x), GAMMA, LAM)
    with pytest.raises(ValueError, match=match):
        kernels.vtrace(*vtrace_args(x), GAMMA)


def test_scalar_and_backend_errors():
    x = scan_inputs((5, 3), 0.2)
    with pytest.raises(ValueError, match="`gamma` must be a Python float or a 0-d tensor"):
        kernels.gae(*gae_args(x), torch.ones(2), LAM)
    with pytest.raises(ValueError, match="`rho_bar` must be"):
        kernels.vtrace(*vtrace_args(x), GAMMA, rho_bar="1")
    with pytest.raises(ValueError, match="`backend` must be one of"):
        kernels.gae(*gae_args(x), GAMMA, LAM, backend="cuda")
    with pytest.raises(ValueError, match=r"`reward` has shape \(\)"):
        kernels.gae(*(a[0, 0] for a in gae_args(x)), GAMMA, LAM)


def test_cpu_build_failure_falls_back_with_one_warning(monkeypatch):
    from fastrl.kernels import _cpu

    monkeypatch.setattr(_cpu, "_state", {"lib": None, "tried": False})
    monkeypatch.setenv("CC", "/nonexistent/cc")
    x = scan_inputs((9, 4), 0.2, seed=8)
    with pytest.warns(UserWarning, match="CPU C kernels unavailable"):
        got = kernels.gae(*gae_args(x), GAMMA, LAM)
    _check(got, kernels.gae_reference(*to_float64(gae_args(x)), GAMMA, LAM))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernels.gae(*gae_args(x), GAMMA, LAM)


# ---- argument ranges, valid=None, and the CleanRL convention --------------------------------------------
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x: kernels.gae(*gae_args(x), 1.5, LAM), r"`gamma` must be in \[0, 1\], got 1.5"),
        (lambda x: kernels.gae(*gae_args(x), -0.1, LAM), "`gamma` must be in"),
        (lambda x: kernels.gae(*gae_args(x), float("nan"), LAM), "`gamma` must be in"),
        (lambda x: kernels.gae(*gae_args(x), torch.tensor(1.5), LAM), "`gamma` must be in"),
        (lambda x: kernels.gae(*gae_args(x), GAMMA, 1.01), r"`lam` must be in \[0, 1\]"),
        (lambda x: kernels.vtrace(*vtrace_args(x), 1.5), "`gamma` must be in"),
        (lambda x: kernels.vtrace(*vtrace_args(x), GAMMA, lam=-1.0), "`lam` must be in"),
        (lambda x: kernels.vtrace(*vtrace_args(x), GAMMA, rho_bar=0.0), "`rho_bar` must be > 0, got 0.0"),
        (lambda x: kernels.vtrace(*vtrace_args(x), GAMMA, c_bar=-1.0), "`c_bar` must be > 0"),
    ],
)
def test_scan_coefficients_out_of_range_are_refused(call, match):
    x = scan_inputs((5, 3), 0.2)
    with pytest.raises(ValueError, match=match) as info:
        call(x)
    assert "\n" not in str(info.value)


def test_scan_coefficients_at_the_bounds_are_accepted():
    x = scan_inputs((6, 2), 0.3, seed=4)
    for gamma, lam in ((0.0, 0.0), (1.0, 1.0), (torch.tensor(1.0), torch.tensor(0.0))):
        _check(kernels.gae(*gae_args(x), gamma, lam), kernels.gae_reference(*to_float64(gae_args(x)), float(gamma),
                                                                            float(lam)))
    _check(kernels.vtrace(*vtrace_args(x), 1.0, float("inf"), 1e-3, 0.0),
           kernels.vtrace_reference(*to_float64(vtrace_args(x)), 1.0, float("inf"), 1e-3, 0.0))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(clip_coef=0.0), "`clip_coef` must be > 0, got 0.0"),
        (dict(clip_coef=-0.2), "`clip_coef` must be > 0"),
        (dict(vf_clip=0.0), "`vf_clip` must be > 0"),
        (dict(vf_coef=-0.5), "`vf_coef` must be >= 0"),
        (dict(ent_coef=-0.01), "`ent_coef` must be >= 0"),
    ],
)
def test_loss_coefficients_out_of_range_are_refused(kwargs, match):
    from fastrl.kernels.testing import loss_inputs, pg_args, ppo_args

    x = loss_inputs((7, 3))
    with pytest.raises(ValueError, match=match) as info:
        kernels.ppo_loss(*ppo_args(x), **kwargs)
    assert "\n" not in str(info.value)
    if set(kwargs) <= {"vf_coef", "ent_coef"}:
        with pytest.raises(ValueError, match=match):
            kernels.pg_loss(*pg_args(x), **kwargs)


def test_valid_defaults_to_none_everywhere():
    import inspect

    from fastrl.kernels.testing import loss_inputs

    for fn in (kernels.ppo_loss, kernels.ppo_loss_reference, kernels.pg_loss, kernels.pg_loss_reference):
        assert inspect.signature(fn).parameters["valid"].default is None, fn.__name__
    for fn in (kernels.gae, kernels.vtrace):  # scans take no mask: `done` cuts traces, invalid steps are masked later
        assert "valid" not in inspect.signature(fn).parameters
    x = loss_inputs((9, 2), valid=False)
    ppo = ("new_logp", "old_logp", "advantage", "new_value", "old_value", "value_target", "entropy")
    pg = ("new_logp", "advantage", "new_value", "value_target", "entropy")
    all_valid = torch.ones(9, 2, dtype=torch.bool)
    # valid and every coefficient left to their defaults: all samples count, CleanRL's 0.2 / 0.5 / 0.01
    pairs = [(kernels.ppo_loss(*(x[k] for k in ppo)), kernels.ppo_loss(*(x[k] for k in ppo), all_valid, 0.2, 0.5, 0.01)),
             (kernels.pg_loss(*(x[k] for k in pg)), kernels.pg_loss(*(x[k] for k in pg), all_valid, 0.5, 0.01))]
    for (loss, stats), (want_loss, want_stats) in pairs:
        torch.testing.assert_close(loss, want_loss)
        for k in stats:
            torch.testing.assert_close(stats[k], want_stats[k])


def _cleanrl_gae(rewards, values, dones, next_value, next_done, gamma, lam):
    """CleanRL's ppo.py loop verbatim (``dones[t]``: obs[t] began a new episode; every episode end is terminal)."""
    T = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(T)):
        if t == T - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * lam * nextnonterminal * lastgaelam
    return advantages, advantages + values


@pytest.mark.parametrize("T, N", [(16, 4), (1, 3), (9, 1)])
def test_gae_from_a_cleanrl_loop(T, N):
    """The README recipe: shift CleanRL's dones by one step and append the bootstrap value."""
    g = torch.Generator().manual_seed(T * 10 + N)
    rewards, values = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
    dones = (torch.rand(T, N, generator=g) < 0.2).float()
    next_done = (torch.rand(N, generator=g) < 0.2).float()
    next_value = torch.randn(N, generator=g)
    want = _cleanrl_gae(rewards, values, dones, next_value, next_done, GAMMA, LAM)

    done = torch.cat([dones[1:], next_done[None]])               # done[t]: step t ended an episode
    next_values = torch.cat([values[1:], next_value[None]])      # V of the observation step t returned
    got = kernels.gae(rewards, values, next_values, done, terminated=done, gamma=GAMMA, lam=LAM)
    for g_, w in zip(got, want):
        torch.testing.assert_close(g_, w, **TOL)


def _batch_first(x):
    """Time-major ``[T, N]`` as TorchRL's batch-first ``[N, T, 1]`` (a non-contiguous view)."""
    return x.t().unsqueeze(-1)


@pytest.mark.parametrize("time_dim", [1, -2])
@pytest.mark.parametrize("shape,p_done", [((1, 3), 0.3), ((23, 1), 0.15), ((40, 17), 0.1), ((12, 9), 1.0)])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_time_dim_reads_torchrl_layout(time_dim, shape, p_done, backend):
    """``[N, T, 1]`` with ``time_dim`` gives the reference twin's figures on the time-major inputs, in that layout."""
    x = scan_inputs(shape, p_done, seed=21)
    y = {k: _batch_first(v) for k, v in x.items()}
    got = kernels.gae(*gae_args(y), GAMMA, LAM, backend=backend, time_dim=time_dim)
    _check(got, tuple(_batch_first(w) for w in kernels.gae_reference(*to_float64(gae_args(x)), GAMMA, LAM)))
    got = kernels.vtrace(*vtrace_args(y), GAMMA, 1.5, 0.9, 0.8, backend=backend, time_dim=time_dim)
    want = kernels.vtrace_reference(*to_float64(vtrace_args(x)), GAMMA, 1.5, 0.9, 0.8)
    _check(got, tuple(_batch_first(w) for w in want))


def test_time_dim_default_reads_axis_zero_as_time():
    """Without ``time_dim`` a ``[N, T, 1]`` input is read time-major: its envs as time (what time_dim fixes)."""
    x = scan_inputs((30, 5), 0.1, seed=22)
    y = {k: _batch_first(v) for k, v in x.items()}
    want = kernels.gae_reference(*to_float64(gae_args(y)), GAMMA, LAM)
    _check(kernels.gae(*gae_args(y), GAMMA, LAM), want)
    assert not torch.allclose(want[0], _batch_first(kernels.gae_reference(*to_float64(gae_args(x)), GAMMA, LAM)[0]))


@pytest.mark.parametrize("time_dim", [3, -4, 1.0, True])
def test_time_dim_out_of_range_is_refused(time_dim):
    y = {k: _batch_first(v) for k, v in scan_inputs((6, 2), 0.2, seed=23).items()}
    with pytest.raises(ValueError, match="kernels.gae: `time_dim` must be an int in \\[-3, 3\\)"):
        kernels.gae(*gae_args(y), GAMMA, LAM, time_dim=time_dim)
    with pytest.raises(ValueError, match="kernels.vtrace: `time_dim`"):
        kernels.vtrace(*vtrace_args(y), GAMMA, time_dim=time_dim)
