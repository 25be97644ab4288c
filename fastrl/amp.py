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
import os
import warnings
from contextlib import nullcontext
from pathlib import Path

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
    """The rollout forward's compile mode (see ``compile_plan``)."""
    return compile_plan(mode, device, 0)[0]


# From how many gradient steps compiling the update on CPU pays for itself. The compiled step of a 64x64 MLP saves
# about 2.8 ms of a 3.7 ms eager step at minibatch 64 (2.6 of 3.9 at 256); compiling costs about 46 s with a cold
# inductor cache and 7 s with a warm one (2 cores, benchmarks/learner.py, benchmarks/results/cpu-2c/learner.json).
# Break-even is then about 16,000 steps cold and 2,600 warm; the thresholds keep a margin. Shorter runs stay eager.
CPU_COMPILE_MIN_GRADIENT_STEPS = {"cold": 20_000, "warm": 4_000}


def compile_cache_dir() -> Path:
    """Where inductor's FX-graph and AOTAutograd caches live, so a second run starts fast:
    ``$TORCHINDUCTOR_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/fastrl/torch_compile`` (``~/.cache/...``)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or base / "fastrl" / "torch_compile")


def _warm_marker(cache_key: str) -> Path:
    return compile_cache_dir() / "fastrl_compiled" / f"{torch.__version__}-{cache_key}"


def mark_compiled(cache_key: str) -> None:
    """Record that this update graph compiled once, so its inductor artifacts are in the cache (the next run's
    ``auto`` judges it warm)."""
    try:
        marker = _warm_marker(cache_key)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:  # a read-only cache only costs the next run the cold estimate
        pass


# From how many rollout steps (per env: total_steps / n_envs) compiling the rollout step on CPU pays for itself.
# The compiled step (fastrl/rollout.py) saved 60-90 us per step of the eager forward + writes at 1-5 CartPole envs,
# and about 150 us with the env fused into the graph (env_backend torch); it compiles in about 10 s cold and 2 s
# warm (2 cores). Break-even cold: about 110k (60k fused) steps, warm about 25k (13k); the thresholds keep a margin.
CPU_ROLLOUT_COMPILE_MIN_STEPS = {"cold": 150_000, "warm": 30_000}
CPU_FUSED_ROLLOUT_COMPILE_MIN_STEPS = {"cold": 80_000, "warm": 15_000}


def compile_plan(mode: str, device: torch.device, gradient_steps: int, cache_key: str = "",
                 min_gradient_steps: dict | None = None, rollout_steps: int = 0, rollout_key: str = "",
                 fused_rollout: bool = False) -> tuple[str, str]:
    """``(rollout mode, update mode)`` for ``cfg.compile``.

    ``auto``: on CUDA both compiled with CUDA graphs (``reduce-overhead``: static input buffers, one graph replay
    per call). On CPU each part is compiled when the run is long enough for the whole run, compile included, to
    finish sooner: the update from ``CPU_COMPILE_MIN_GRADIENT_STEPS["warm"]`` gradient steps when this graph
    (``cache_key``) compiled before and its artifacts are in the on-disk cache, else the cold figure
    (``min_gradient_steps`` replaces the thresholds, e.g. for a population's vmapped step); the rollout step from
    ``CPU_ROLLOUT_COMPILE_MIN_STEPS`` rollout steps per env (``rollout_steps``; ``rollout_key`` its warm marker;
    ``CPU_FUSED_ROLLOUT_COMPILE_MIN_STEPS`` when the env step is fused into it). Any other mode applies to both.
    """
    if mode != "auto":
        plan = (mode, mode)
    elif device.type == "cuda":
        plan = ("reduce-overhead", "reduce-overhead")
    else:
        warm = bool(cache_key) and _warm_marker(cache_key).exists()
        needed = (min_gradient_steps or CPU_COMPILE_MIN_GRADIENT_STEPS)["warm" if warm else "cold"]
        rollout_warm = bool(rollout_key) and _warm_marker(rollout_key).exists()
        rollout_needed = (CPU_FUSED_ROLLOUT_COMPILE_MIN_STEPS if fused_rollout else
                          CPU_ROLLOUT_COMPILE_MIN_STEPS)["warm" if rollout_warm else "cold"]
        plan = ("default" if rollout_steps >= rollout_needed else "off",
                "default" if gradient_steps >= needed else "off")
    if plan != ("off", "off"):
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(compile_cache_dir()))
    return plan


def _prime_tensordict_memo() -> None:
    """TensorDict memoizes "is this type a tensorclass?" per type, outside compiled code only, and a compiled graph
    that flattens containers (vmap, functional_call) guards on the memo's size: the first eager iteration then adds
    tuple, list, dict, Tensor and forces one recompile. Asking for those types up front makes the first graph last."""
    try:
        from tensordict.utils import _is_tensorclass
    except ImportError:  # another tensordict layout: at worst one recompile
        return
    for kind in (tuple, list, dict, torch.Tensor, int, float, bool, type(None), str, slice):
        _is_tensorclass(kind)


class CompiledOrEager:
    """Calls ``torch.compile(fn, mode=mode)``; if the first call fails to compile, warns once and runs ``fn`` eagerly.

    ``fullgraph``: a graph break is a compile failure (so it falls back to eager, with the warning) instead of a
    silently split graph."""

    def __init__(self, fn, mode: str, name: str, fullgraph: bool = False):
        self.eager, self.name = fn, name
        self.compiled = mode != "off"
        # dynamic=False: every shape here is fixed for a run, and a second trainer in the same process (another
        # n_envs, another minibatch) gets its own static graph instead of turning the shared code dynamic.
        options = {"fullgraph": True, "dynamic": False} if fullgraph else {"dynamic": False}
        self.fn = torch.compile(fn, mode=mode, **options) if self.compiled else fn
        if self.compiled:
            _prime_tensordict_memo()
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


def annealed_lr(cfg, progress: float, lr_scale: float = 1.0) -> float:
    """The learning rate at ``progress`` (0 to 1 of the run): ``lr`` annealed linearly to ``lr_floor`` when
    ``anneal_lr``, times ``lr_scale`` (lowered by each rollback)."""
    if not cfg.anneal_lr:
        return cfg.lr * lr_scale
    return (cfg.lr_floor + max(1.0 - progress, 0.0) * (cfg.lr - cfg.lr_floor)) * lr_scale


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
