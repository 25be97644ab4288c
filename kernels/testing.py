"""Random inputs for testing the kernels: terminations and truncations at random places, edge shapes."""
import torch

from fastrl import kernels

# (shape, p_done): T=1, N=1, all-done, no-done, multi-dim batch, episodes crossing the rollout boundary
SCAN_CASES = [
    ((1, 1), 0.2),
    ((1, 6), 0.5),
    ((23, 1), 0.15),
    ((40, 17), 0.1),
    ((33, 8), 0.0),
    ((12, 9), 1.0),
    ((19, 3, 4), 0.2),
    ((70, 130), 0.05),
]


def scan_inputs(shape, p_done=0.1, dtype=torch.float32, flag_dtype=torch.bool, seed=0, device="cpu"):
    """Inputs for gae/vtrace as a dict; ``done`` at rate ``p_done``, about half of the dones terminations."""
    g = torch.Generator().manual_seed(seed)
    reward, value, next_value, behavior_logp = (torch.randn(shape, generator=g) for _ in range(4))
    target_logp = behavior_logp + 0.7 * torch.randn(shape, generator=g)
    done = torch.rand(shape, generator=g) < p_done
    terminated = done & (torch.rand(shape, generator=g) < 0.5)
    floats = [x.to(dtype) for x in (behavior_logp, target_logp, reward, value, next_value)]
    out = dict(
        behavior_logp=floats[0], target_logp=floats[1], reward=floats[2], value=floats[3], next_value=floats[4],
        done=done.to(flag_dtype), terminated=terminated.to(flag_dtype),
    )
    return {k: v.to(device) for k, v in out.items()}


def gae_args(x):
    return x["reward"], x["value"], x["next_value"], x["done"], x["terminated"]


def vtrace_args(x):
    return x["behavior_logp"], x["target_logp"], x["reward"], x["value"], x["next_value"], x["done"], x["terminated"]


def transposed(x):
    """The same values stored with every dim's stride reversed (time fastest): not contiguous."""
    out = {}
    for k, v in x.items():
        dims = tuple(reversed(range(v.dim())))
        buf = torch.empty(tuple(reversed(v.shape)), dtype=v.dtype, device=v.device).permute(*dims)
        out[k] = buf.copy_(v)
    return out


def strided(x):
    """The same values as every other column of a wider buffer: strides (2 * N, 2)."""
    out = {}
    for k, v in x.items():
        buf = torch.zeros(v.shape[0], 2 * v[0].numel(), dtype=v.dtype, device=v.device)
        buf[:, ::2] = v.reshape(v.shape[0], -1)
        out[k] = buf[:, ::2].unflatten(1, v.shape[1:]) if v.dim() > 1 else buf[:, 0]
    return out


def to_float64(args):
    return [a.double() if a.is_floating_point() else a for a in args]


# ---- losses ---------------------------------------------------------------------------------------------

def loss_inputs(shape=(37, 5), dtype=torch.float32, p_valid=0.8, seed=0, entropy=True, valid=True):
    g = torch.Generator().manual_seed(seed)
    r = lambda: torch.randn(shape, generator=g).to(dtype)  # noqa: E731
    new_logp = r().requires_grad_()
    old_logp = new_logp.detach() + 0.3 * r()
    new_value = r().requires_grad_()
    old_value = new_value.detach() + 0.3 * r()
    ent = r().abs().requires_grad_() if entropy else None
    mask = (torch.rand(shape, generator=g) < p_valid) if valid else None
    return dict(new_logp=new_logp, old_logp=old_logp, advantage=r(), new_value=new_value, old_value=old_value,
                value_target=r(), entropy=ent, valid=mask)


def ppo_args(x):
    return [x[k] for k in ("new_logp", "old_logp", "advantage", "new_value", "old_value", "value_target",
                           "entropy", "valid")]


def pg_args(x):
    return [x[k] for k in ("new_logp", "advantage", "new_value", "value_target", "entropy", "valid")]


def grads(loss, x):
    wrt = [x[k] for k in ("new_logp", "new_value", "entropy") if x[k] is not None]
    return torch.autograd.grad(loss, wrt)


def assert_same(got, want, x, tol=1e-5):
    (loss, stats), (want_loss, want_stats) = got, want
    assert loss.dim() == 0 and set(stats) == set(want_stats)
    torch.testing.assert_close(loss, want_loss, rtol=tol, atol=tol)
    for k in stats:
        assert stats[k].dim() == 0 and not stats[k].requires_grad
        torch.testing.assert_close(stats[k], want_stats[k], rtol=tol, atol=tol)
    for g, w in zip(grads(loss, x), grads(want_loss, x)):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)


PPO_OPTIONS = [
    dict(),
    dict(clip_vloss=False),
    dict(normalize_advantage=False, vf_clip=0.5),
]
INPUT_OPTIONS = [dict(), dict(valid=False), dict(entropy=False), dict(shape=(1,)), dict(p_valid=0.0)]


def check_ppo(backend, opts, inp, dtype=torch.float32, tol=1e-5):
    x = loss_inputs(dtype=dtype, **inp)
    got = kernels.ppo_loss(*ppo_args(x), 0.2, 0.5, 0.01, backend=backend, **opts)
    want = kernels.ppo_loss_reference(*ppo_args(x), 0.2, 0.5, 0.01, **opts)
    assert_same(got, want, x, tol)


def check_pg(backend, normalize, inp, dtype=torch.float32, tol=1e-5):
    x = loss_inputs(dtype=dtype, **inp)
    got = kernels.pg_loss(*pg_args(x), 0.5, 0.01, normalize, backend=backend)
    want = kernels.pg_loss_reference(*pg_args(x), 0.5, 0.01, normalize)
    assert_same(got, want, x, tol)


def gradcheck_ppo(backend, opts):
    x = loss_inputs(shape=(6, 3), dtype=torch.float64, seed=3)
    nl, ol, adv, nv, ov, vt, ent, valid = ppo_args(x)
    f = lambda nl, nv, ent: kernels.ppo_loss(nl, ol, adv, nv, ov, vt, ent, valid, 0.2, 0.5, 0.01,  # noqa: E731
                                             backend=backend, **opts)[0]
    assert torch.autograd.gradcheck(f, (nl, nv, ent))


def gradcheck_pg(backend):
    x = loss_inputs(shape=(6, 3), dtype=torch.float64, seed=4)
    lp, adv, v, vt, ent, valid = pg_args(x)
    f = lambda lp, v, ent: kernels.pg_loss(lp, adv, v, vt, ent, valid, 0.5, 0.01, True, backend=backend)[0]  # noqa: E731
    assert torch.autograd.gradcheck(f, (lp, v, ent))
