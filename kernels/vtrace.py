"""V-trace targets and policy-gradient advantages (IMPALA, Espeholt et al. 2018), time-major ``[T, *B]``.

    ratio_t = exp(target_logp_t - behavior_logp_t)
    rho_t   = min(rho_bar, ratio_t),   c_t = lam * min(c_bar, ratio_t)
    delta_t = rho_t * (r_t + gamma * (1 - terminated_t) * next_value_t - value_t)
    vs_t - value_t = delta_t + gamma * (1 - done_t) * c_t * (vs_{t+1} - value_{t+1}),   0 past the end
    pg_advantage_t = rho_t * (r_t + gamma * (1 - terminated_t) * vhat_{t+1} - value_t)

where ``vhat_{t+1}`` is ``vs_{t+1}`` inside an episode and ``next_value_t`` where ``done_t`` or t = T-1.
With lam = 1 these are the semantics of TorchRL's ``vtrace_advantage_estimate`` (whose ``log_pi`` is
our ``target_logp`` and ``log_mu`` our ``behavior_logp``). TorchRL's tensors are batch-first ``[N, T, 1]``: pass
``time_dim=1`` (``-2``), or the recursion runs over envs instead of time.
"""
import torch

from . import _backend
from ._validate import check_backend, check_range, check_tensors, scalar, to_time_major

_OP = "kernels.vtrace"
_FLOATS = ("behavior_logp", "target_logp", "reward", "value", "next_value")


def vtrace_reference(
    behavior_logp, target_logp, reward, value, next_value, done, terminated, gamma, rho_bar=1.0, c_bar=1.0, lam=1.0
):
    """Plain loop twin. Float64 inputs are computed in float64, everything else in float32.

    Returns ``(vs, pg_advantage)`` shaped ``[T, *B]``.
    """
    floats = (behavior_logp, target_logp, reward, value, next_value)
    dtype = torch.float64 if any(x.dtype == torch.float64 for x in floats) else torch.float32
    behavior_logp, target_logp, reward, value, next_value = (x.to(dtype) for x in floats)
    done, terminated = done.to(dtype), terminated.to(dtype)
    ratio = torch.exp(target_logp - behavior_logp)
    rho = ratio.clamp(max=rho_bar)
    c = lam * ratio.clamp(max=c_bar)
    T = reward.shape[0]
    vs = torch.zeros_like(reward)
    pg_advantage = torch.zeros_like(reward)
    acc = torch.zeros_like(reward[0])
    for t in range(T - 1, -1, -1):
        discount = gamma * (1.0 - terminated[t])
        delta = rho[t] * (reward[t] + discount * next_value[t] - value[t])
        acc = delta + gamma * (1.0 - done[t]) * c[t] * acc
        vs[t] = value[t] + acc
        if t == T - 1:
            vhat = next_value[t]
        else:
            vhat = torch.where(done[t] != 0, next_value[t], vs[t + 1])
        pg_advantage[t] = rho[t] * (reward[t] + discount * vhat - value[t])
    return vs, pg_advantage


def _run(backend, *args):
    if backend == "cpu":
        from . import _cpu

        return _cpu.vtrace(*args)
    if backend == "triton":
        return _backend.triton_module().vtrace(*args)
    vs, pg_advantage = vtrace_reference(*args)
    return vs.float(), pg_advantage.float()


@torch.library.custom_op("fastrl_kernels::vtrace", mutates_args=())
def _vtrace_op(
    behavior_logp: torch.Tensor,
    target_logp: torch.Tensor,
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float,
    rho_bar: float,
    c_bar: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    backend = _backend.resolve(_OP, None, reward.device)
    return _run(backend, behavior_logp, target_logp, reward, value, next_value, done, terminated,
                gamma, rho_bar, c_bar, lam)


@_vtrace_op.register_fake
def _(behavior_logp, target_logp, reward, value, next_value, done, terminated, gamma, rho_bar, c_bar, lam):
    return torch.empty_like(reward, dtype=torch.float32), torch.empty_like(reward, dtype=torch.float32)


def vtrace(
    behavior_logp, target_logp, reward, value, next_value, done, terminated, gamma,
    rho_bar=1.0, c_bar=1.0, lam=1.0, *, backend=None, time_dim=0,
):
    """V-trace value targets and policy-gradient advantages (see the module docstring).

    Args:
        behavior_logp: log mu(a_t | s_t) of the acting policy, ``[T, *B]``.
        target_logp: log pi(a_t | s_t) of the learner policy, ``[T, *B]``.
        reward, value, next_value: ``[T, *B]``; float inputs are float32, bfloat16 or float16.
        done, terminated: bool or 0/1 float ``[T, *B]``; ``done`` = terminated or truncated.
        gamma, rho_bar, c_bar, lam: Python floats or 0-d tensors; ``gamma`` and ``lam`` in [0, 1], ``rho_bar``
            and ``c_bar`` > 0 (anything else is a ValueError).
        backend: as in :func:`kernels.gae`.
        time_dim: the axis of time (default 0, time-major); TorchRL's ``[N, T, 1]`` tensors take ``time_dim=1``.

    Returns:
        ``(vs, pg_advantage)``, float32 ``[T, *B]``, not differentiable (use them as targets), with time back on
        ``time_dim``. Inside ``torch.compile`` this is ``torch.ops.fastrl_kernels.vtrace`` (no graph break).
    """
    tensors = dict(
        behavior_logp=behavior_logp, target_logp=target_logp, reward=reward, value=value,
        next_value=next_value, done=done, terminated=terminated,
    )
    if time_dim != 0:
        out = vtrace(*to_time_major(_OP, tensors, time_dim).values(), gamma, rho_bar, c_bar, lam, backend=backend)
        return tuple(x.movedim(0, time_dim) for x in out)
    check_backend(_OP, backend, _backend.BACKENDS)
    _, device = check_tensors(_OP, tensors, _FLOATS, ("done", "terminated"))
    scalars = [scalar(_OP, n, x) for n, x in (("gamma", gamma), ("rho_bar", rho_bar), ("c_bar", c_bar), ("lam", lam))]
    check_range(_OP, "gamma", scalars[0], 0.0, 1.0)
    check_range(_OP, "rho_bar", scalars[1], 0.0, low_open=True)
    check_range(_OP, "c_bar", scalars[2], 0.0, low_open=True)
    check_range(_OP, "lam", scalars[3], 0.0, 1.0)
    args = [x.detach() for x in tensors.values()] + scalars
    if backend is None and _backend.compiling():
        return _vtrace_op(*args)
    return _run(_backend.resolve(_OP, backend, device), *args)
