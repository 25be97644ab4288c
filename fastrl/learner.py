"""The PPO / A2C gradient step as one compiled function: forward, loss, gradient, clip, guard and optimizer.

``CompiledUpdate(agent, optimizer, cfg, algo)`` is called once per minibatch with the plain tensors of
``fastrl.ppo.LOSS_KEYS`` and does, inside one ``torch.compile(fullgraph=True)`` graph:

    loss, grads  = grad_and_value(kernels.ppo_loss | kernels.pg_loss of functional_call(agent, params, ...))
    grad_norm    = ||grads||_2 (global);  grads *= clamp(max_grad_norm / (grad_norm + 1e-6), max=1)  if max_grad_norm > 0
    ok           = isfinite(loss) & isfinite(grad_norm)
    Adam:    step += 1;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
             p -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
    RMSprop: step += 1;  s = a s + (1 - a) g^2;  p -= lr * g / (sqrt(s) + eps)
    parameters and optimizer state <- where(ok, new, old), written in place

It replaces ``loss_fn`` + ``fastrl.amp.backward_step`` and gives the same result (the tests compare the two):
the eager step runs ~60 small ops plus autograd's tape per minibatch, this one runs a few fused kernels.

Conventions:
- The agent stays an ``nn.Module`` and the optimizer a ``torch.optim`` optimizer: new values are written into
  the module's parameters and into ``optimizer.state[p]`` (``exp_avg``, ``exp_avg_sq``, ``step`` for Adam;
  ``square_avg``, ``step`` for RMSprop), so evaluation, ``state_dict()`` and ``load_state_dict()`` (checkpoints,
  rollbacks) work unchanged. The state tensors are looked up per call, so a ``load_state_dict`` that replaces
  them needs nothing else. Empty state is created as torch does, with ``step`` a float32 0-d tensor on the
  parameters' device (as fused Adam keeps it).
- The learning rate is read from ``optimizer.param_groups[0]["lr"]`` per call; it, ``clip_coef`` and
  ``ent_coef`` enter the graph as 0-d tensors, so schedules never recompile. Betas, eps, alpha, ``vf_coef``
  and ``max_grad_norm`` are read once, at construction.
- No host sync per call: the non-finite guard is a ``torch.where``.
- ``sync_grads(flat_grad)`` (torchrun): averages the flat ``[n_params]`` float32 gradient across ranks in
  place. When given, the step runs as two compiled pieces with the all-reduce between them (before the clip,
  as in ``backward_step``); without it, one graph.
- Supported: Adam (fused, foreach or for-loop; no weight decay, amsgrad or maximize) and RMSprop (no momentum,
  not centered, no weight decay), one parameter group, autocast (bf16 / fp16 forward) without a GradScaler.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn
from torch.func import functional_call, grad_and_value

from fastrl import kernels
from fastrl.amp import CompiledOrEager

_NORM_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


class _ActionAndValue(nn.Module):
    """``forward`` is ``agent.get_action_and_value``: what ``functional_call`` needs to call that method."""

    def __init__(self, agent: nn.Module):
        super().__init__()
        self.agent = agent

    def forward(self, observation, action):
        return self.agent.get_action_and_value(observation, action)


def _parameter_slots(module: nn.Module, params: list) -> list:
    """``(name, index into params)`` for every module attribute that holds one of ``params``.

    A parameter reachable by two paths of one shared submodule (a shared trunk) is one slot, named by its first
    path; a parameter assigned to two modules (tied weights) is two slots with one index, so autograd sums its
    gradient. (``functional_call(tie_weights=True)`` swaps a shared submodule's attribute twice and restores the
    wrong tensor, replacing the module's parameter.)
    """
    index = {id(p): i for i, p in enumerate(params)}
    slots, seen, found = [], set(), set()
    for prefix, sub in module.named_modules(remove_duplicate=False):
        for attr, p in sub._parameters.items():
            if p is None or id(p) not in index or (id(sub), attr) in seen:
                continue
            seen.add((id(sub), attr))
            found.add(id(p))
            slots.append((f"{prefix}.{attr}" if prefix else attr, index[id(p)]))
    missing = [i for i, p in enumerate(params) if id(p) not in found]
    if missing:
        raise ValueError(f"CompiledUpdate: optimizer parameters {missing} are not parameters of the agent")
    return slots


def _optimizer_kind(optimizer: torch.optim.Optimizer) -> str:
    """``adam`` or ``rmsprop``; a ValueError naming the setting this step cannot reproduce otherwise."""
    if len(optimizer.param_groups) != 1:
        raise ValueError(f"CompiledUpdate needs one parameter group, got {len(optimizer.param_groups)}")
    group = optimizer.param_groups[0]
    if isinstance(optimizer, torch.optim.Adam):
        kind, unsupported = "adam", ("weight_decay", "amsgrad", "maximize", "differentiable")
    elif isinstance(optimizer, torch.optim.RMSprop):
        kind, unsupported = "rmsprop", ("weight_decay", "momentum", "centered", "maximize", "differentiable")
    else:
        raise ValueError(f"CompiledUpdate supports Adam and RMSprop, got {type(optimizer).__name__}")
    for key in unsupported:
        if group.get(key):
            raise ValueError(f"CompiledUpdate does not support {type(optimizer).__name__}({key}={group[key]!r}); "
                             "use the eager update (compile off)")
    return kind


class CompiledUpdate:
    """One PPO / A2C gradient step on one minibatch, compiled as one function (see the module docstring).

    ``step(observation, action, sample_log_prob, advantage, state_value, value_target, valid)`` -> ``(stats,
    nonfinite)``: ``stats`` the loss's 0-d diagnostics plus ``grad_norm`` (before clipping), ``nonfinite`` a
    0-d bool, True when the step was skipped for a NaN/Inf loss or gradient. ``mode`` is a ``torch.compile``
    mode or ``"off"`` (the same functional code, eagerly). ``autocast`` is ``fastrl.amp.autocast_factory``'s.
    """

    def __init__(self, agent: nn.Module, optimizer: torch.optim.Optimizer, cfg, algo: str = "ppo",
                 autocast=nullcontext, mode: str = "default", sync_grads=None):
        if algo not in ("ppo", "a2c"):
            raise ValueError(f"CompiledUpdate: algo must be 'ppo' or 'a2c', got {algo!r}")
        self.kind = _optimizer_kind(optimizer)
        self.optimizer, self.cfg, self.algo, self.autocast = optimizer, cfg, algo, autocast
        self.forward_module = _ActionAndValue(agent)
        self.params = list(optimizer.param_groups[0]["params"])
        self.slots = _parameter_slots(self.forward_module, self.params)
        self.shapes = [p.shape for p in self.params]
        self.numels = [p.numel() for p in self.params]
        self.device = self.params[0].device
        group = optimizer.param_groups[0]
        if self.kind == "adam":
            self.beta1, self.beta2 = (float(b) for b in group["betas"])
        else:
            self.alpha = float(group["alpha"])
        self.eps = float(group["eps"])
        self.max_grad_norm = float(cfg.max_grad_norm)
        self.vf_coef = float(cfg.vf_coef)
        # Hyperparameters that may change between calls: graph inputs, filled when their Python value changes.
        # lr is float64 so the step size lr / (1 - beta1^step) rounds as in torch's fused Adam (double on the host).
        self.lr = torch.zeros((), dtype=torch.float64, device=self.device)
        self.clip_coef = torch.zeros((), dtype=torch.float32, device=self.device)
        self.ent_coef = torch.zeros((), dtype=torch.float32, device=self.device)
        self._filled: dict = {}
        self.sync_grads = sync_grads
        # CUDA graphs (reduce-overhead) replay fixed addresses: parameters and optimizer state, which the step updates
        # in place, are marked static so the graph may mutate them (a replaced state tensor, after a rollback's
        # load_state_dict, is marked when first seen).
        self._static_ids: set | None = set() if mode == "reduce-overhead" and self.device.type == "cuda" else None
        name = f"the {algo} gradient step"
        if sync_grads is None:
            self._step = CompiledOrEager(self._fused_step, mode, name, fullgraph=True)
        else:
            self._grad_part = CompiledOrEager(self._flat_grads, mode, f"{name} (gradient)", fullgraph=True)
            self._apply_part = CompiledOrEager(self._apply_flat, mode, f"{name} (optimizer)", fullgraph=True)

    @property
    def compiled(self) -> bool:
        """False when running eagerly: ``mode`` "off", or after a compile failure fell back."""
        parts = (self._step,) if self.sync_grads is None else (self._grad_part, self._apply_part)
        return all(part.compiled for part in parts)

    # ------------------------------------------------------------------ Python side, per call
    def __call__(self, *loss_inputs: torch.Tensor) -> tuple[dict, torch.Tensor]:
        self._fill(self.lr, "lr", self.optimizer.param_groups[0]["lr"])
        self._fill(self.clip_coef, "clip_coef", getattr(self.cfg, "clip_coef", 0.0))
        self._fill(self.ent_coef, "ent_coef", self.cfg.ent_coef)
        state = self._state_lists()
        if self._static_ids is not None:
            self._mark_static(self.params, *state)
        with torch.no_grad():  # the writes are to leaves; torch.func.grad differentiates regardless
            if self.sync_grads is None:
                return self._step(self.params, state, self.lr, self.clip_coef, self.ent_coef, *loss_inputs)
            flat_grad, loss, stats = self._grad_part(self.params, self.clip_coef, self.ent_coef, *loss_inputs)
            self.sync_grads(flat_grad)
            grad_norm, nonfinite = self._apply_part(self.params, state, self.lr, flat_grad, loss)
        return {**stats, "grad_norm": grad_norm}, nonfinite

    def _mark_static(self, *tensor_lists) -> None:
        for tensors in tensor_lists:
            for tensor in tensors:
                if id(tensor) not in self._static_ids:
                    torch._dynamo.mark_static_address(tensor)
                    self._static_ids.add(id(tensor))

    def _fill(self, tensor: torch.Tensor, key: str, value) -> None:
        if isinstance(value, torch.Tensor):
            tensor.copy_(value)
        elif self._filled.get(key) != value:
            tensor.fill_(value)
            self._filled[key] = value

    def _state_lists(self) -> tuple[list, ...]:
        """The optimizer's own state tensors, per parameter, in the step's order (created if absent)."""
        keys = ("exp_avg", "exp_avg_sq", "step") if self.kind == "adam" else ("square_avg", "step")
        state = self.optimizer.state
        try:
            lists = tuple([state[p][key] for p in self.params] for key in keys)
        except KeyError:
            self._init_state()
            lists = tuple([state[p][key] for p in self.params] for key in keys)
        steps = lists[-1]
        if steps[0].device != self.device:  # load_state_dict keeps a non-fused optimizer's step on the CPU
            for p in self.params:
                state[p]["step"] = state[p]["step"].to(self.device)
            lists = lists[:-1] + ([state[p]["step"] for p in self.params],)
        return lists

    def _init_state(self) -> None:
        """What torch's first ``step()`` creates (keys in its order), with ``step`` on the parameter's device."""
        moments = ("exp_avg", "exp_avg_sq") if self.kind == "adam" else ("square_avg",)
        for p in self.params:
            state = self.optimizer.state[p]
            if state:
                continue
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            for key in moments:
                state[key] = torch.zeros_like(p, memory_format=torch.preserve_format)

    # ------------------------------------------------------------------ the compiled functions
    def _loss(self, params: list, clip_coef, ent_coef, observation, action, old_logp, advantage, old_value,
              value_target, valid, vf_coef=None):
        """The loss ``ppo_loss_terms`` / ``a2c_loss_terms`` compute, with the parameters as an argument.
        ``vf_coef``: a 0-d tensor (a population member's own), default ``cfg.vf_coef``."""
        cfg = self.cfg
        vf_coef = self.vf_coef if vf_coef is None else vf_coef
        named = {slot: params[index] for slot, index in self.slots}
        with self.autocast():
            _, logp, entropy, value = functional_call(self.forward_module, named, (observation, action),
                                                      tie_weights=False)
        # backend="torch": the composed ops, which inductor fuses (and which torch.func can differentiate).
        if self.algo == "a2c":
            return kernels.pg_loss(logp.float(), advantage, value.float(), value_target, entropy.float(), valid,
                                   vf_coef=vf_coef, ent_coef=ent_coef, normalize_advantage=cfg.norm_adv,
                                   backend="torch")
        return kernels.ppo_loss(logp.float(), old_logp, advantage, value.float(), old_value, value_target,
                                entropy.float(), valid, clip_coef=clip_coef, vf_coef=vf_coef,
                                ent_coef=ent_coef, clip_vloss=cfg.clip_vloss, normalize_advantage=cfg.norm_adv,
                                backend="torch")

    def _grads(self, params: list, clip_coef, ent_coef, *loss_inputs):
        grads, (loss, stats) = grad_and_value(self._loss, has_aux=True)(params, clip_coef, ent_coef, *loss_inputs)
        return grads, loss, stats

    def _apply(self, params: list, state: tuple, lr, grads: list, loss):
        """Clip, guard, optimizer math and the in-place writes. Returns ``(grad_norm, nonfinite)``."""
        new, grad_norm, nonfinite = self._new_values(params, state, lr, grads, loss)
        for old_list, new_list in zip((params, *state), new):
            for old, value in zip(old_list, new_list):
                old.copy_(value)
        return grad_norm, nonfinite

    def _new_values(self, params: list, state: tuple, lr, grads: list, loss, max_grad_norm=None):
        """Clip, guard and optimizer math, out of place (what ``torch.func.vmap`` over a population needs).

        Returns ``(new, grad_norm, nonfinite)``: ``new`` the lists ``(params, *state)`` after the step, equal to
        the old ones where the step was skipped. ``max_grad_norm``: a 0-d tensor (a population member's own,
        0 disables), default ``cfg.max_grad_norm``."""
        grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        if max_grad_norm is not None:
            scale = torch.where(max_grad_norm > 0, (max_grad_norm / (grad_norm + _NORM_EPS)).clamp(max=1.0),
                                torch.ones_like(grad_norm))
            grads = [g * scale for g in grads]
        elif self.max_grad_norm > 0:
            scale = (self.max_grad_norm / (grad_norm + _NORM_EPS)).clamp(max=1.0)
            grads = [g * scale for g in grads]
        ok = torch.isfinite(loss) & torch.isfinite(grad_norm)
        if self.kind == "adam":
            exp_avgs, exp_avg_sqs, steps = state
            new = _adam(params, grads, exp_avgs, exp_avg_sqs, steps, lr, self.beta1, self.beta2, self.eps)
        else:
            square_avgs, steps = state
            new = _rmsprop(params, grads, square_avgs, steps, lr, self.alpha, self.eps)
        guarded = tuple([torch.where(ok, value, old) for old, value in zip(old_list, new_list)]
                        for old_list, new_list in zip((params, *state), new))
        return guarded, grad_norm, ~ok

    def _fused_step(self, params: list, state: tuple, lr, clip_coef, ent_coef, *loss_inputs):
        grads, loss, stats = self._grads(params, clip_coef, ent_coef, *loss_inputs)
        grad_norm, nonfinite = self._apply(params, state, lr, grads, loss)
        return {**stats, "grad_norm": grad_norm}, nonfinite

    def _flat_grads(self, params: list, clip_coef, ent_coef, *loss_inputs):
        grads, loss, stats = self._grads(params, clip_coef, ent_coef, *loss_inputs)
        return torch.cat([g.reshape(-1).float() for g in grads]), loss, stats

    def _apply_flat(self, params: list, state: tuple, lr, flat_grad, loss):
        grads = [g.view(shape).to(p.dtype) for g, shape, p in zip(flat_grad.split(self.numels), self.shapes, params)]
        return self._apply(params, state, lr, grads, loss)


def _adam(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps):
    """torch.optim.Adam's update (no weight decay): new ``(params, exp_avgs, exp_avg_sqs, steps)`` lists.

    Bias corrections and the step size are computed in float64, as fused Adam does on the host."""
    new_params, new_avgs, new_sqs, new_steps = [], [], [], []
    for p, g, m, v, step in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
        step = step + 1
        step64 = step.double()
        step_size = (lr / (1 - beta1 ** step64)).float()
        bias_correction2_sqrt = (1 - beta2 ** step64).sqrt().float()
        m = m * beta1 + g * (1 - beta1)
        v = v * beta2 + g * g * (1 - beta2)
        denom = v.sqrt() / bias_correction2_sqrt + eps
        new_params.append(p - step_size * m / denom)
        new_avgs.append(m)
        new_sqs.append(v)
        new_steps.append(step)
    return new_params, new_avgs, new_sqs, new_steps


def _rmsprop(params, grads, square_avgs, steps, lr, alpha, eps):
    """torch.optim.RMSprop's update (no momentum, not centered, no weight decay): new ``(params, square_avgs,
    steps)`` lists."""
    new_params, new_avgs, new_steps = [], [], []
    lr = lr.float()
    for p, g, s, step in zip(params, grads, square_avgs, steps):
        s = s * alpha + g * g * (1 - alpha)
        new_params.append(p - lr * (g / (s.sqrt() + eps)))
        new_avgs.append(s)
        new_steps.append(step + 1)
    return new_params, new_avgs, new_steps
