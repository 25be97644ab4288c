"""GAE and V-trace: every CPU backend against the loop twin and against TorchRL's functionals."""
import pytest
import torch

import kernels
from kernels.testing import SCAN_CASES, gae_args, scan_inputs, strided, to_float64, transposed, vtrace_args

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


def test_gae_hand_computed():
    # one env, 3 steps: a truncation at t=0 (bootstrap from next_value), a termination at t=2
    reward = torch.tensor([[1.0], [0.0], [2.0]])
    value = torch.tensor([[0.5], [1.0], [1.5]])
    next_value = torch.tensor([[3.0], [1.5], [9.0]])
    done = torch.tensor([[True], [False], [True]])
    terminated = torch.tensor([[False], [False], [True]])
    gamma, lam = 0.5, 0.5
    a2 = 2.0 - 1.5
    a1 = (0.0 + 0.5 * 1.5 - 1.0) + 0.25 * a2
    a0 = 1.0 + 0.5 * 3.0 - 0.5
    adv, target = kernels.gae(reward, value, next_value, done, terminated, gamma, lam)
    torch.testing.assert_close(adv, torch.tensor([[a0], [a1], [a2]]))
    torch.testing.assert_close(target, adv + value)


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
    from kernels import _cpu

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
