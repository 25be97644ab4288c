"""Mixed precision and torch.compile for the rollout forward and the loss, the optimizer, and the one optimizer step
every algorithm uses.

- ``autocast_factory(device, amp)``: a zero-argument callable returning the context to run a model forward in
  (``torch.autocast`` for bf16/fp16, ``nullcontext`` otherwise). Always entered with ``with``. Losses,
  advantages and optimizer state stay float32: models return float32 log-probs and values, and the autocast
  region covers only the forward.
- ``grad_scaler(device, amp)``: a GradScaler for fp16 on CUDA, else None.
- ``maybe_compile(fn, mode, name)``: ``torch.compile(fn)`` that falls back to eager, with one warning, when
  compilation fails.
"""
from __future__ import annotations

import functools
import warnings
from contextlib import nullcontext

import torch

_AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_factory(device: torch.device, amp: str):
    if amp == "off":
        return nullcontext
    if amp == "fp16" and device.type != "cuda":
        raise ValueError("amp=fp16 needs a CUDA device; use amp=bf16 on CPU")
    return functools.partial(torch.autocast, device_type=device.type, dtype=_AMP_DTYPES[amp])


def grad_scaler(device: torch.device, amp: str):
    """fp16 gradients underflow without loss scaling; bf16 has float32's range and needs none."""
    if amp == "fp16" and device.type == "cuda":
        return torch.amp.GradScaler("cuda")
    return None


def resolve_compile(mode: str, device: torch.device) -> str:
    """``auto``: ``default`` on CUDA; ``off`` on CPU, where compiling did not pay off for these small models
    (see benchmarks/rollout_sps.py) and costs tens of seconds of start-up."""
    if mode != "auto":
        return mode
    return "default" if device.type == "cuda" else "off"


class CompiledOrEager:
    """Calls ``torch.compile(fn, mode=mode)``; if the first call fails to compile, warns once and runs ``fn`` eagerly."""

    def __init__(self, fn, mode: str, name: str):
        self.eager, self.name = fn, name
        self.compiled = mode != "off"
        self.fn = torch.compile(fn, mode=mode) if self.compiled else fn
        self._checked = not self.compiled

    def __call__(self, *args, **kwargs):
        if self._checked:
            return self.fn(*args, **kwargs)
        try:
            out = self.fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any compiler failure means: run eagerly
            first = (str(e).strip().splitlines() or [""])[0][:200]
            warnings.warn(f"torch.compile failed for {self.name} ({type(e).__name__}: {first}); running it eagerly",
                          RuntimeWarning, stacklevel=2)
            self.fn, self.compiled = self.eager, False
            out = self.fn(*args, **kwargs)
        self._checked = True
        return out


def maybe_compile(fn, mode: str, name: str) -> CompiledOrEager:
    return CompiledOrEager(fn, mode, name)


def make_optimizer(cfg, params) -> torch.optim.Optimizer:
    """``cfg.optimizer``: RMSprop (auto for A2C, the original A2C's optimizer) or fused Adam (auto otherwise).

    Fused Adam runs one kernel for all parameters (about 4x faster than the per-tensor loop on CPU) and takes
    ``found_inf``, which is how ``backward_step`` skips a non-finite update without a host sync.
    """
    name = cfg.optimizer if cfg.optimizer != "auto" else ("rmsprop" if cfg.algo == "a2c" else "adam")
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=cfg.lr, alpha=cfg.rmsprop_alpha, eps=cfg.rmsprop_eps)
    return torch.optim.Adam(params, lr=cfg.lr, eps=cfg.adam_eps, fused=True)


def backward_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, params: list, max_grad_norm: float,
                  sync_grads=None, scaler=None) -> tuple[torch.Tensor, torch.Tensor]:
    """zero_grad, backward (scaled for fp16), cross-rank sync, unscale, global-norm clip, step.

    Returns ``(grad_norm, nonfinite)`` as 0-d tensors. A NaN/Inf loss or gradient skips the step: on-device
    through the fused optimizer's ``found_inf`` (no host sync), else with one host check.
    """
    optimizer.zero_grad(set_to_none=True)
    (scaler.scale(loss) if scaler is not None else loss).backward()
    if sync_grads is not None:
        sync_grads()
    if scaler is not None:
        scaler.unscale_(optimizer)
    if max_grad_norm > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    else:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    nonfinite = ~(torch.isfinite(loss.detach()) & torch.isfinite(grad_norm))
    if scaler is not None:  # the GradScaler already skips steps with non-finite gradients
        scaler.step(optimizer)
        scaler.update()
    elif optimizer.defaults.get("fused"):
        optimizer.found_inf = nonfinite.float()
        optimizer.step()
    elif not bool(nonfinite):
        optimizer.step()
    return grad_norm, nonfinite
