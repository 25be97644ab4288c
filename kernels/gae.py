"""Generalized advantage estimation over time-major tensors ``[T, *B]``.

    delta_t = r_t + gamma * (1 - terminated_t) * next_value_t - value_t
    A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1},   A_T = 0
    value_target = A + value

``next_value[t]`` is V(s_{t+1}), the value of the observation that followed step t (the final
observation when the episode was truncated). ``done = terminated | truncated`` cuts the recursion;
only ``terminated`` stops bootstrapping. Same semantics as TorchRL's ``generalized_advantage_estimate``. TorchRL's tensors are batch-first ``[N, T, 1]``:
pass ``time_dim=1`` (``-2``), or the recursion runs over envs instead of time without a word.

From a CleanRL-style loop, where ``dones[t]`` flags that ``obs[t]`` began a new episode (the previous step's
done) and ``next_done`` / ``next_obs`` follow the last step, shift by one step::

    done = torch.cat([dones[1:], next_done[None]])                                  # step t ended an episode
    next_value = torch.cat([values[1:], agent.get_value(next_obs).reshape(1, -1)])  # V(obs step t returned)
    adv, returns = kernels.gae(rewards, values, next_value, done, terminated=done, gamma=0.99, lam=0.95)

``terminated=done`` is CleanRL's own rule (every end is terminal), right when the env's auto-reset hands back
the next episode's first observation. To bootstrap time-limit truncations, pass ``terminated`` (shifted the
same way) and put V(real final observation) in ``next_value`` at truncated steps.
"""
import torch

from . import _backend
from ._validate import check_backend, check_range, check_tensors, scalar, to_time_major

_OP = "kernels.gae"


def gae_reference(reward, value, next_value, done, terminated, gamma, lam):
    """Plain loop twin. Float64 inputs are computed in float64, everything else in float32.

    Returns ``(advantage, value_target)`` shaped ``[T, *B]``.
    """
    dtype = torch.float64 if torch.float64 in (reward.dtype, value.dtype, next_value.dtype) else torch.float32
    reward, value, next_value = (x.to(dtype) for x in (reward, value, next_value))
    not_done = 1.0 - done.to(dtype)
    not_term = 1.0 - terminated.to(dtype)
    adv = torch.zeros_like(reward)
    last = torch.zeros_like(reward[0])
    for t in range(reward.shape[0] - 1, -1, -1):
        delta = reward[t] + gamma * not_term[t] * next_value[t] - value[t]
        last = delta + gamma * lam * not_done[t] * last
        adv[t] = last
    return adv, adv + value


def _run(backend, reward, value, next_value, done, terminated, gamma, lam):
    if backend == "cpu":
        from . import _cpu

        return _cpu.gae(reward, value, next_value, done, terminated, gamma, lam)
    if backend == "triton":
        return _backend.triton_module().gae(reward, value, next_value, done, terminated, gamma, lam)
    adv, target = gae_reference(reward, value, next_value, done, terminated, gamma, lam)
    return adv.float(), target.float()


@torch.library.custom_op("fastrl_kernels::gae", mutates_args=())
def _gae_op(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    backend = _backend.resolve(_OP, None, reward.device)
    return _run(backend, reward, value, next_value, done, terminated, gamma, lam)


@_gae_op.register_fake
def _(reward, value, next_value, done, terminated, gamma, lam):
    return torch.empty_like(reward, dtype=torch.float32), torch.empty_like(reward, dtype=torch.float32)


def gae(reward, value, next_value, done, terminated, gamma, lam, *, backend=None, time_dim=0):
    """Advantages and value targets by GAE (see the module docstring for the recursion).

    Args:
        reward, value, next_value: float32/bfloat16/float16 ``[T, *B]`` (time first, any batch dims); float64
            ones are computed and returned in float64 by the reference twin (the fast kernels run in float32).
        done, terminated: bool or 0/1 float ``[T, *B]``; ``done`` = terminated or truncated.
        gamma, lam: Python floats or 0-d tensors, each in [0, 1] (anything else is a ValueError).
        backend: None picks Triton for CUDA tensors and the C kernel for CPU tensors. "reference",
            "torch", "cpu" or "triton" force one ("triton" on CPU tensors needs TRITON_INTERPRET=1).
        time_dim: the axis of time (default 0, time-major). TorchRL's ``[N, T, 1]`` tensors take ``time_dim=1``.

    Returns:
        ``(advantage, value_target)``, float32 ``[T, *B]`` (float64 when an input is), not differentiable, with time
        back on ``time_dim``. Inside ``torch.compile`` this is the registered op ``torch.ops.fastrl_kernels.gae``
        (no graph break).
    """
    if time_dim != 0:
        moved = to_time_major(_OP, dict(reward=reward, value=value, next_value=next_value, done=done,
                                        terminated=terminated), time_dim)
        out = gae(*moved.values(), gamma, lam, backend=backend)
        return tuple(x.movedim(0, time_dim) for x in out)
    check_backend(_OP, backend, _backend.BACKENDS)
    tensors = dict(reward=reward, value=value, next_value=next_value, done=done, terminated=terminated)
    _, device = check_tensors(_OP, tensors, ("reward", "value", "next_value"), ("done", "terminated"))
    gamma, lam = scalar(_OP, "gamma", gamma), scalar(_OP, "lam", lam)
    check_range(_OP, "gamma", gamma, 0.0, 1.0)
    check_range(_OP, "lam", lam, 0.0, 1.0)
    args = [x.detach() for x in tensors.values()]
    if any(x.dtype == torch.float64 for x in args[:3]):  # a float64 caller asked for float64 precision: keep it
        return gae_reference(*args, gamma, lam)
    if backend is None and _backend.compiling():
        return _gae_op(*args, gamma, lam)
    return _run(_backend.resolve(_OP, backend, device), *args, gamma, lam)
