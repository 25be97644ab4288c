"""Policy losses for PPO and A2C/IMPALA over a minibatch: one scalar loss and detached 0-d diagnostics.

Every mean is a masked mean over ``valid`` (bool, same shape as the inputs; None means all valid), and
nothing syncs with the host. Inputs can have any shape; they are treated as flat minibatches.

    ratio        = exp(new_logp - old_logp)
    A            = (advantage - mean_valid(advantage)) / (std_valid(advantage) + 1e-8)   if normalize_advantage
    policy_loss  = mean(max(-A * ratio, -A * clamp(ratio, 1 - clip_coef, 1 + clip_coef)))
    value_loss   = 0.5 * mean(max((v - R)^2, (old_v + clamp(v - old_v, -vf_clip, vf_clip) - R)^2))  if clip_vloss
                   0.5 * mean((v - R)^2)                                                             otherwise
    entropy      = mean(entropy)
    loss         = policy_loss - ent_coef * entropy + vf_coef * value_loss
    approx_kl    = mean((ratio - 1) - log ratio),   clipfrac = mean(|ratio - 1| > clip_coef)

``std_valid`` is the unbiased standard deviation (as ``Tensor.std``), and ``vf_clip`` defaults to
``clip_coef`` (CleanRL's convention). Backends: Triton forward+backward on CUDA (two launches forward, the
backward is one multiply per input); composed torch ops on CPU and inside ``torch.compile``.
"""
import torch

from . import _backend
from ._validate import FLOAT_DTYPES, check_backend, check_range, coefficient, scalar

ADV_EPS = 1e-8


def _check(op, tensors, valid):
    first_name, first = None, None
    for name, x in tensors.items():
        if x is None:
            continue
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{op}: `{name}` must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{op}: `{name}` has dtype {x.dtype}; expected float32, bfloat16, float16 or float64")
        if first is None:
            first_name, first = name, x
            continue
        if x.shape != first.shape:
            raise ValueError(
                f"{op}: `{name}` has shape {tuple(x.shape)} but `{first_name}` has {tuple(first.shape)}; "
                "all inputs must share one shape"
            )
        if x.device != first.device:
            raise ValueError(f"{op}: `{name}` is on {x.device} but `{first_name}` is on {first.device}")
    if valid is not None:
        if not isinstance(valid, torch.Tensor):
            raise ValueError(f"{op}: `valid` must be a bool torch.Tensor or None, got {type(valid).__name__}")
        if valid.dtype != torch.bool:
            raise ValueError(f"{op}: `valid` has dtype {valid.dtype}; expected bool")
        if valid.shape != first.shape:
            raise ValueError(f"{op}: `valid` has shape {tuple(valid.shape)} but `{first_name}` has {tuple(first.shape)}")
        if valid.device != first.device:
            raise ValueError(f"{op}: `valid` is on {valid.device} but `{first_name}` is on {first.device}")
    return first


def _compute_dtype(*xs):
    return torch.float64 if any(x is not None and x.dtype == torch.float64 for x in xs) else torch.float32


def _masked_mean(x, mask, count):
    # where, not multiply: a NaN/Inf at a masked-out position must not reach the mean.
    return torch.where(mask > 0, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum() / count


def _normalize(advantage, mask, count):
    mean = _masked_mean(advantage, mask, count)
    var = _masked_mean((advantage - mean) ** 2, mask, count) * count / (count - 1).clamp(min=1)
    return (advantage - mean) / (var.sqrt() + ADV_EPS)


def ppo_loss_reference(
    new_logp, old_logp, advantage, new_value, old_value, value_target, entropy, valid=None,
    clip_coef=0.2, vf_coef=0.5, ent_coef=0.01, clip_vloss=True, vf_clip=None, normalize_advantage=True,
):
    """Composed-torch twin of :func:`ppo_loss` (float64 inputs stay float64). Returns ``(loss, stats)``."""
    dtype = _compute_dtype(new_logp, old_logp, advantage, new_value, old_value, value_target, entropy)
    new_logp, old_logp, advantage, new_value, old_value, value_target = (
        x.to(dtype) for x in (new_logp, old_logp, advantage, new_value, old_value, value_target)
    )
    mask = torch.ones_like(new_logp) if valid is None else valid.to(dtype)
    count = mask.sum().clamp(min=1)
    entropy = torch.zeros_like(new_logp) if entropy is None else entropy.to(dtype)
    vf_clip = clip_coef if vf_clip is None else vf_clip

    logratio = new_logp - old_logp
    ratio = logratio.exp()
    adv = _normalize(advantage, mask, count) if normalize_advantage else advantage
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip_coef, 1 + clip_coef))
    unclipped = (new_value - value_target) ** 2
    if clip_vloss:
        v_clipped = old_value + (new_value - old_value).clamp(-vf_clip, vf_clip)
        v = 0.5 * torch.maximum(unclipped, (v_clipped - value_target) ** 2)
    else:
        v = 0.5 * unclipped
    policy_loss = _masked_mean(pg, mask, count)
    value_loss = _masked_mean(v, mask, count)
    entropy_mean = _masked_mean(entropy, mask, count)
    loss = policy_loss - ent_coef * entropy_mean + vf_coef * value_loss
    with torch.no_grad():
        approx_kl = _masked_mean((ratio - 1) - logratio, mask, count)
        clipfrac = _masked_mean(((ratio - 1).abs() > clip_coef).to(dtype), mask, count)
    stats = dict(
        policy_loss=policy_loss.detach(), value_loss=value_loss.detach(), entropy=entropy_mean.detach(),
        approx_kl=approx_kl, clipfrac=clipfrac,
    )
    return loss, stats


def ppo_loss(
    new_logp, old_logp, advantage, new_value, old_value, value_target, entropy, valid=None,
    clip_coef=0.2, vf_coef=0.5, ent_coef=0.01, clip_vloss=True, vf_clip=None, normalize_advantage=True, *,
    backend=None,
):
    """The PPO loss of one minibatch (see the module docstring for the formulas).

    Args:
        new_logp: log pi(a|s) under the current policy; differentiable.
        old_logp: log pi(a|s) at collection time.
        advantage: GAE advantages (normalized here per minibatch when ``normalize_advantage``).
        new_value: V(s) under the current critic; differentiable.
        old_value: V(s) at collection time (only used when ``clip_vloss``).
        value_target: the regression target (returns).
        entropy: per-sample policy entropy, differentiable, or None.
        valid: bool mask of the samples that count, or None (the default) for all.
        clip_coef, vf_coef, ent_coef, vf_clip: Python floats or 0-d tensors (kept as tensors, without a sync,
            except for the Triton backend); defaults 0.2, 0.5, 0.01 (CleanRL's); ``vf_clip`` None means
            ``clip_coef``. Python floats are range-checked (``clip_coef`` and ``vf_clip`` > 0, ``vf_coef`` and
            ``ent_coef`` >= 0; anything else is a ValueError); 0-d tensors are not read on the host.
        backend: None (Triton on CUDA, composed torch elsewhere and under torch.compile), "reference",
            "torch" or "triton".
    All tensors share one shape and device; float dtypes are float32, bfloat16, float16 or float64.

    Defaults against TorchRL 0.14's ``ClipPPOLoss`` (same ``clip_epsilon`` 0.2 and ``entropy_coeff`` 0.01):
    ``clip_vloss=True`` clips the value loss (TorchRL: ``clip_value=None``, no clipping; ``clip_value=clip_coef``
    matches); ``normalize_advantage=True`` normalizes per minibatch with the unbiased std (TorchRL: False, and
    the biased std when on); the value loss is ``vf_coef * 0.5 * (v - R)^2`` with ``vf_coef=0.5`` (TorchRL:
    ``critic_coeff=1.0`` on ``loss_critic_type="smooth_l1"``; ``"l2"`` with ``critic_coeff=0.5 * vf_coef`` matches).

    Returns:
        ``(loss, stats)``: ``loss`` a 0-d tensor with gradients for ``new_logp``, ``new_value`` and
        ``entropy``; ``stats`` a dict of detached 0-d tensors ``policy_loss``, ``value_loss``, ``entropy``,
        ``approx_kl`` and ``clipfrac``.
    """
    op = "kernels.ppo_loss"
    check_backend(op, backend, (None, "auto", "reference", "torch", "triton"))
    tensors = dict(new_logp=new_logp, old_logp=old_logp, advantage=advantage, new_value=new_value,
                   old_value=old_value, value_target=value_target, entropy=entropy)
    if new_logp is None:
        raise ValueError(f"{op}: `new_logp` must be a torch.Tensor, got NoneType")
    for name in ("old_logp", "advantage", "new_value", "old_value", "value_target"):
        if tensors[name] is None:
            raise ValueError(f"{op}: `{name}` must be a torch.Tensor, got NoneType")
    first = _check(op, tensors, valid)
    coefs = dict(clip_coef=clip_coef, vf_coef=vf_coef, ent_coef=ent_coef)
    resolved = _resolve_loss_backend(op, backend, first.device)
    convert = scalar if resolved == "triton" else coefficient
    coefs = {k: convert(op, k, v) for k, v in coefs.items()}
    vf_clip = coefs["clip_coef"] if vf_clip is None else convert(op, "vf_clip", vf_clip)
    check_range(op, "clip_coef", coefs["clip_coef"], 0.0, low_open=True)
    check_range(op, "vf_clip", vf_clip, 0.0, low_open=True)
    check_range(op, "vf_coef", coefs["vf_coef"], 0.0)
    check_range(op, "ent_coef", coefs["ent_coef"], 0.0)
    args = (new_logp, old_logp, advantage, new_value, old_value, value_target, entropy, valid,
            coefs["clip_coef"], coefs["vf_coef"], coefs["ent_coef"], bool(clip_vloss), vf_clip,
            bool(normalize_advantage))
    if resolved == "triton":
        return _backend.triton_module().ppo_loss(*args)
    return ppo_loss_reference(*args)


def pg_loss_reference(logp, advantage, value, value_target, entropy, valid=None, vf_coef=0.5, ent_coef=0.01,
                      normalize_advantage=False):
    """Composed-torch twin of :func:`pg_loss` (float64 inputs stay float64). Returns ``(loss, stats)``."""
    dtype = _compute_dtype(logp, advantage, value, value_target, entropy)
    logp, advantage, value, value_target = (x.to(dtype) for x in (logp, advantage, value, value_target))
    mask = torch.ones_like(logp) if valid is None else valid.to(dtype)
    count = mask.sum().clamp(min=1)
    entropy = torch.zeros_like(logp) if entropy is None else entropy.to(dtype)
    adv = _normalize(advantage, mask, count) if normalize_advantage else advantage
    policy_loss = _masked_mean(-adv * logp, mask, count)
    value_loss = _masked_mean(0.5 * (value - value_target) ** 2, mask, count)
    entropy_mean = _masked_mean(entropy, mask, count)
    loss = policy_loss - ent_coef * entropy_mean + vf_coef * value_loss
    stats = dict(policy_loss=policy_loss.detach(), value_loss=value_loss.detach(), entropy=entropy_mean.detach())
    return loss, stats


def pg_loss(logp, advantage, value, value_target, entropy, valid=None, vf_coef=0.5, ent_coef=0.01,
            normalize_advantage=False, *, backend=None):
    """The A2C / IMPALA actor-critic loss of one batch.

        policy_loss = mean(-A * logp),  value_loss = 0.5 * mean((value - value_target)^2)
        loss = policy_loss - ent_coef * mean(entropy) + vf_coef * value_loss

    ``A`` is ``advantage`` (GAE for A2C, V-trace ``pg_advantage`` for IMPALA), treated as a constant and
    normalized per batch when ``normalize_advantage``. Means are masked over ``valid`` (bool, or None, the
    default, for all samples). ``vf_coef`` and ``ent_coef`` (defaults 0.5, 0.01) are Python floats, checked
    >= 0, or 0-d tensors.
    Returns ``(loss, stats)`` with detached 0-d ``policy_loss``, ``value_loss`` and ``entropy``;
    gradients flow to ``logp``, ``value`` and ``entropy``.
    """
    op = "kernels.pg_loss"
    check_backend(op, backend, (None, "auto", "reference", "torch", "triton"))
    tensors = dict(logp=logp, advantage=advantage, value=value, value_target=value_target, entropy=entropy)
    for name in ("logp", "advantage", "value", "value_target"):
        if tensors[name] is None:
            raise ValueError(f"{op}: `{name}` must be a torch.Tensor, got NoneType")
    first = _check(op, tensors, valid)
    resolved = _resolve_loss_backend(op, backend, first.device)
    convert = scalar if resolved == "triton" else coefficient
    vf_coef, ent_coef = convert(op, "vf_coef", vf_coef), convert(op, "ent_coef", ent_coef)
    check_range(op, "vf_coef", vf_coef, 0.0)
    check_range(op, "ent_coef", ent_coef, 0.0)
    args = (logp, advantage, value, value_target, entropy, valid, vf_coef, ent_coef, bool(normalize_advantage))
    if resolved == "triton":
        return _backend.triton_module().pg_loss(*args)
    return pg_loss_reference(*args)


def _resolve_loss_backend(op, backend, device):
    if backend in (None, "auto"):
        if _backend.compiling():
            return "torch"  # inductor fuses the composed ops itself
        return "triton" if device.type == "cuda" and _backend.triton_available() else "torch"
    if backend == "triton":
        return _backend.resolve(op, backend, device)
    return backend
