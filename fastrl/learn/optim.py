"""Optimizers as pure tensor math over flat parameters, their state in torch.optim's checkpoint format, the LR schedule.

The update of every algorithm (``fastrl.learn.update``) keeps a member's parameters as one flat float32 vector ``[P]`` (a
population: ``[K, P]``) and its optimizer state as flat tensors of the same shape, so Adam or RMSprop is a handful of
element-wise ops on one tensor, eagerly or compiled, for one agent or (vmapped) for sixteen:

    Adam:    step += 1;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
             p -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
    RMSprop: step += 1;  s = a s + (1 - a) g^2;  p -= lr * g / (sqrt(s) + eps)

These equal ``torch.optim.Adam`` (no weight decay, amsgrad or maximize) and ``torch.optim.RMSprop`` (no momentum,
not centered): ``tests/test_update.py`` steps both from the same state. torch.optim itself remains only the reference
twin in the tests, and the checkpoint format: ``optimizer_state_dict`` / ``load_optimizer_state_dict`` convert flat
state to and from ``torch.optim.Optimizer.state_dict()``, so checkpoints of every algorithm share one layout.
"""
from __future__ import annotations

import torch

MOMENT_KEYS = {"adam": ("exp_avg", "exp_avg_sq"), "rmsprop": ("square_avg",)}  # each optimizer's state per parameter


def optimizer_name(cfg) -> str:
    """``adam`` or ``rmsprop``: ``cfg.optimizer``, where ``auto`` is RMSprop for A2C (the original A2C's) and Adam
    otherwise."""
    return cfg.optimizer if cfg.optimizer != "auto" else ("rmsprop" if cfg.algo == "a2c" else "adam")


def optimizer_hparams(cfg) -> dict:
    """The fixed (never scheduled, never varied) optimizer constants of ``cfg``."""
    if optimizer_name(cfg) == "rmsprop":
        return {"alpha": float(cfg.rmsprop_alpha), "eps": float(cfg.rmsprop_eps)}
    return {"betas": (0.9, 0.999), "eps": float(cfg.adam_eps)}


def init_state(kind: str, params: torch.Tensor) -> dict:
    """Zero optimizer state for flat ``params [..., P]``: the moments like ``params``, ``step [...]`` float32."""
    state = {key: torch.zeros_like(params) for key in MOMENT_KEYS[kind]}
    state["step"] = torch.zeros(params.shape[:-1], dtype=torch.float32, device=params.device)
    return state


def adam_step(params, grad, state: dict, lr, betas: tuple, eps: float) -> tuple[torch.Tensor, dict]:
    """One Adam step on flat tensors, out of place: ``(new_params, new_state)``. ``params``, ``grad`` and the moments
    ``[..., P]``; ``lr`` (float64) and ``step`` ``[...]``: one member (0-d) or K (``[K]``), broadcast over P.

    The step size and bias corrections are computed in float64, as fused Adam does on the host."""
    beta1, beta2 = betas
    step = state["step"] + 1
    step64 = step.double()
    step_size = (lr / (1 - beta1 ** step64)).float()[..., None]
    bias_correction2_sqrt = (1 - beta2 ** step64).sqrt().float()[..., None]
    exp_avg = state["exp_avg"] * beta1 + grad * (1 - beta1)
    exp_avg_sq = state["exp_avg_sq"] * beta2 + grad * grad * (1 - beta2)
    denom = exp_avg_sq.sqrt() / bias_correction2_sqrt + eps
    return params - step_size * exp_avg / denom, {"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq, "step": step}


def rmsprop_step(params, grad, state: dict, lr, alpha: float, eps: float) -> tuple[torch.Tensor, dict]:
    """One RMSprop step on flat tensors, out of place: ``(new_params, new_state)`` (shapes as ``adam_step``'s)."""
    square_avg = state["square_avg"] * alpha + grad * grad * (1 - alpha)
    new_params = params - lr.float()[..., None] * (grad / (square_avg.sqrt() + eps))
    return new_params, {"square_avg": square_avg, "step": state["step"] + 1}


def optimizer_step(kind: str, constants: dict, params, grad, state: dict, lr) -> tuple[torch.Tensor, dict]:
    if kind == "adam":
        return adam_step(params, grad, state, lr, constants["betas"], constants["eps"])
    return rmsprop_step(params, grad, state, lr, constants["alpha"], constants["eps"])


# ---------------------------------------------------------------------------------------------- checkpoint format
def optimizer_state_dict(kind: str, constants: dict, state: dict, numels: list, shapes: list, lr: float) -> dict:
    """One member's flat state (``[P]`` moments, 0-d ``step``) as ``torch.optim.Adam/RMSprop.state_dict()`` over the
    agent's parameters in ``agent.parameters()`` order (the flat layout's order)."""
    step = state["step"].detach().reshape(()).float()
    chunks = {key: state[key].detach().split(numels) for key in MOMENT_KEYS[kind]}
    per_param = {j: {"step": step.clone(), **{key: chunks[key][j].reshape(shapes[j]).clone() for key in chunks}}
                 for j in range(len(numels))}
    if kind == "adam":
        group = {"lr": lr, "betas": tuple(constants["betas"]), "eps": constants["eps"], "weight_decay": 0.0,
                 "amsgrad": False, "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
                 "fused": True, "decoupled_weight_decay": False}
    else:
        group = {"lr": lr, "alpha": constants["alpha"], "eps": constants["eps"], "weight_decay": 0.0, "momentum": 0.0,
                 "centered": False, "capturable": False, "foreach": None, "maximize": False, "differentiable": False}
    group["params"] = list(range(len(numels)))
    return {"state": per_param, "param_groups": [group]}


def load_optimizer_state_dict(kind: str, saved: dict, state: dict, numels: list) -> None:
    """Copy a ``torch.optim`` state dict (``optimizer_state_dict``'s format, or torch's own) into one member's flat
    state in place. Parameters without saved state (an optimizer that never stepped) get zeros."""
    entries = saved.get("state", {})
    step = 0.0
    for j in range(len(numels)):
        entry = entries.get(j, entries.get(str(j), {}))
        for key in MOMENT_KEYS[kind]:
            chunk = state[key].split(numels)[j]
            chunk.copy_(entry[key].reshape(-1) if key in entry else torch.zeros_like(chunk))
        if "step" in entry:
            step = float(entry["step"])
    state["step"].fill_(step)


# ---------------------------------------------------------------------------------------------- schedules
def annealed_lr(cfg, progress: float, lr_scale: float = 1.0) -> float:
    """The learning rate at ``progress`` (0 to 1 of the run): ``lr`` annealed linearly to ``lr_floor`` when
    ``anneal_lr``, times ``lr_scale`` (lowered by each rollback)."""
    if not cfg.anneal_lr:
        return cfg.lr * lr_scale
    return (cfg.lr_floor + max(1.0 - progress, 0.0) * (cfg.lr - cfg.lr_floor)) * lr_scale


def annealed_clip_coef(cfg, progress: float) -> float:
    """``clip_coef``, annealed linearly to 0 with ``anneal_clip`` (on the learning rate's per-iteration clock)."""
    if not cfg.anneal_clip:
        return cfg.clip_coef
    return cfg.clip_coef * max(1.0 - progress, 0.0)
