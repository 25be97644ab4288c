"""The PPO / A2C / IMPALA / APPO update as one pure function of (parameters, optimizer state, batch, hyperparameters).

    update(params, opt_state, batch, hparams) -> (params, opt_state, metrics)

for one member: ``params [P]`` (the flat weights, ``fastrl.learn.stacked.FlatLayout``), ``opt_state`` (``fastrl.learn.optim``:
flat moments ``[P]`` and a 0-d ``step``), ``batch`` (the loss inputs ``LOSS_KEYS`` flattened to ``[B, ...]``, plus
``minibatch_index [n_epochs * n_minibatches, B / n_minibatches]``: the shuffled rows of each minibatch, drawn by
the caller), ``hparams`` (0-d tensors ``HPARAM_KEYS``: lr, clip_coef, ent_coef, vf_coef, max_grad_norm). For each
minibatch, in order:

    loss, grad   = grad_and_value(kernels.ppo_loss | kernels.pg_loss of agent(params, minibatch))
    grad_norm    = ||grad||_2;  grad *= min(max_grad_norm / (grad_norm + 1e-6), 1)   if max_grad_norm > 0
    params, opt_state = Adam | RMSprop (fastrl.learn.optim)
    kept only where loss and grad_norm are finite (a NaN/Inf step is skipped, counted in ``nonfinite_updates``)
    with target_kl > 0: once an epoch ends with approx_kl > target_kl, the later steps are computed and dropped

No host sync and no Python branch on tensor values anywhere, so the same code runs eagerly, under
``torch.compile(fullgraph=True)``, in CUDA graphs, and under ``torch.func.vmap`` over a leading member axis K (every
argument ``[K, ...]``): that is how a population trains as one program, with per-member hyperparameters.
A2C is the same function with one epoch of one minibatch (the whole rollout, unshuffled). A recurrent policy's batch
adds ``SEQUENCE_KEYS`` and each minibatch is whole env columns, ``T * B`` rows time-major (``minibatch_index`` with
``sequence_length``): the loss unrolls the core over the T steps from the columns' start state (``Update.sequences``).

The IMPALA/APPO learner's batch is time-major: ``VTRACE_KEYS`` (``observation [T, N, ...]``, ``bootstrap_observation
[N, ...]``, the observation after the last step, and ``[T, N]`` actions, behaviour log-probs, ``valid``, rewards,
``done``, ``terminated``; a recurrent policy's adds ``SEQUENCE_KEYS``, unrolled per column). Both evaluate the T+1
observations with the learner's weights and take V-trace targets from them (``fastrl.learn.impala``; never
differentiated):

- IMPALA: per minibatch of env columns (``minibatch_index [n_minibatches, N / n_minibatches]``, None: all columns),
  V-trace from the current weights, then ``kernels.pg_loss`` over the V-trace advantages (the paper's loss);
- APPO: V-trace once per batch with the weights before the update, then PPO's steps (the ratio against the behaviour
  policy) over the ``[T * N]`` rows, ``minibatch_index`` as PPO's.

How each step computes its gradient is chosen once, when the update is built, by ``step_path`` (a pure function of
the config and the shapes; tests/test_update.py lists every case). Eagerly, K members run without an outer vmap:
``Update.steps`` on ``[K, P]`` parameters (``[K, ...]`` batches, ``[K]`` hyperparameters), the clip, guard and
optimizer math broadcast over the member axis: the same ops as one member, on bigger tensors.

``Update.steps`` runs a slice of the minibatch steps (the trainer puts ``compile_plan(...).steps_per_call`` of them
in one compiled call); ``Update.gradient`` and ``Update.apply`` are a step's two halves. Under torchrun the update
takes ``rank_mean`` (``fastrl.distributed.torchrun.rank_mean``) and each step averages its gradient over the ranks between
the two, in one all-reduce that also carries the loss and approx_kl (``Update.across_ranks``): every rank then
takes the step of the global minibatch, skips it when it is non-finite on any rank, and stops on target_kl at the
same step. Nothing else differs from one process, compiled or eager. fp16 (CUDA) scales the loss dynamically,
with the scale in ``opt_state``.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from functools import lru_cache, partial

import torch
from torch.func import grad_and_value, vjp, vmap

from fastrl import kernels
from fastrl.learn.impala import learner_forward, learner_sequence, vtrace_targets
from fastrl.learn.mlp_gradient import MembersMLPGradient
from fastrl.learn.optim import init_state, optimizer_hparams, optimizer_name, optimizer_step
from fastrl.learn.ppo import explained_variance
from fastrl.learn.stacked import FlatLayout

# The minibatch fields a loss reads, in the order the update takes them.
LOSS_KEYS = ("observation", "action", "sample_log_prob", "advantage", "state_value", "value_target", "valid")
# A recurrent policy's too: each row's episode_start and its column's state at the rollout's start ([B, S] rows).
SEQUENCE_KEYS = ("episode_start", "recurrent_state")
# The IMPALA/APPO learner's inputs, time-major (see the module docstring).
VTRACE_KEYS = ("observation", "bootstrap_observation", "action", "sample_log_prob", "valid", "reward", "done",
               "terminated")
HPARAM_KEYS = ("lr", "clip_coef", "ent_coef", "vf_coef", "max_grad_norm")
STAT_KEYS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "grad_norm")
VTRACE_STAT_KEYS = ("explained_variance", "vtrace/rho_mean", "vtrace/ratio_mean", "vtrace/rho_clipfrac")


def stat_names(algo: str) -> tuple:
    """The step statistics an update reports: A2C's and IMPALA's losses have no ratio, so no approx_kl or clipfrac;
    IMPALA's V-trace figures change with every step (APPO's are the batch's, computed once)."""
    if algo in ("ppo", "appo"):
        return STAT_KEYS
    plain = ("policy_loss", "value_loss", "entropy", "grad_norm")
    return plain + VTRACE_STAT_KEYS if algo == "impala" else plain
_NORM_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s
_LOSS_SCALE_GROWTH_INTERVAL = 2000  # torch.amp.GradScaler's


@dataclass(frozen=True)
class UpdateSpec:
    """What an update is, beyond its tensors: fixed for a run, shared by every member."""
    algo: str  # ppo | a2c | impala | appo
    optimizer: str  # adam | rmsprop
    constants: tuple  # sorted (name, value) pairs of fastrl.learn.optim.optimizer_hparams
    clip_vloss: bool
    norm_adv: bool
    target_kl: float
    n_epochs: int
    n_minibatches: int
    loss_scaling: bool  # fp16: dynamic loss scaling
    vtrace: tuple = ()  # impala/appo: (gamma, rho_bar, c_bar, vtrace_lambda)
    sequence_length: int = 0  # a recurrent policy's: n_steps, the T of the sequences its minibatches hold; else 0

    @classmethod
    def of(cls, cfg) -> "UpdateSpec":
        a2c = cfg.algo == "a2c"
        vtrace = ((float(cfg.gamma), float(cfg.rho_bar), float(cfg.c_bar), float(cfg.vtrace_lambda))
                  if cfg.algo in ("impala", "appo") else ())
        # IMPALA makes one pass per batch (n_epochs is APPO's), A2C one step; only PPO stops early on target_kl.
        return cls(cfg.algo, optimizer_name(cfg), tuple(sorted(optimizer_hparams(cfg).items())),
                   bool(cfg.clip_vloss), bool(cfg.norm_adv),
                   float(cfg.target_kl) if cfg.algo == "ppo" else 0.0,
                   1 if cfg.algo in ("a2c", "impala") else cfg.n_epochs, 1 if a2c else cfg.n_minibatches,
                   cfg.amp == "fp16", vtrace, cfg.n_steps if cfg.recurrent != "none" else 0)

    @property
    def loss_keys(self) -> tuple:
        """The batch fields the loss reads, in order: ``LOSS_KEYS`` (and ``SEQUENCE_KEYS``, recurrent)."""
        return LOSS_KEYS + (SEQUENCE_KEYS if self.sequence_length else ())

    @property
    def learner_keys(self) -> tuple:
        """The IMPALA/APPO learner's batch fields, in order: ``VTRACE_KEYS`` (and ``SEQUENCE_KEYS``, recurrent)."""
        return VTRACE_KEYS + (SEQUENCE_KEYS if self.sequence_length else ())

    @property
    def n_steps(self) -> int:
        return self.n_epochs * self.n_minibatches


def member_hparams(cfg, device, lr: float | None = None, clip_coef: float | None = None) -> dict:
    """One member's 0-d hyperparameter tensors (``lr`` float64, so Adam's step size rounds as fused Adam's)."""
    return {"lr": torch.tensor(cfg.lr if lr is None else lr, dtype=torch.float64, device=device),
            "clip_coef": torch.tensor(float(cfg.clip_coef if clip_coef is None else clip_coef), device=device),
            "ent_coef": torch.tensor(float(cfg.ent_coef), device=device),
            "vf_coef": torch.tensor(float(cfg.vf_coef), device=device),
            "max_grad_norm": torch.tensor(float(cfg.max_grad_norm), device=device)}


def step_path(members: int, compiled: bool, loss_scaling: bool, hand_gradient: bool, pure: bool = False) -> str:
    """The one dispatch point of the minibatch step, a pure function of the config and the shapes: how each step
    computes its gradient, one of these per run.

    - ``functional``: ``torch.func.grad_and_value`` over the flat weights' views, ``vmap``'d over K members. The only
      path under ``torch.compile`` (and so in CUDA graphs); also K = 1 eager under fp16 loss scaling.
    - ``members_hand``: eager, any K, an MLP actor-critic with PPO or A2C in float32 (``hand_gradient``:
      ``MembersMLPGradient.supports``): the loss and gradient derived by hand (``fastrl.learn.mlp_gradient``, twin-tested
      against ``members_autograd`` by tests/test_mlp_gradient.py). Figures: ``python -m benchmarks.population_step``,
      3 members' eager step, 2-core Intel Xeon, 2026-12-05: about 2x autograd's (CartPole zoo settings, minibatch 256);
      ``--members 1``, one run's step against the ``module`` path's, 2-core AMD EPYC, 2026-12-07: the module path
      takes 1.55x-1.70x the time over the four cases (CartPole zoo: 2,681 against 4,227 µs).
    - ``module``: K = 1, eager, where the hand gradient does not apply (a CNN, MultiDiscrete, masking, a custom
      policy): ``torch.autograd`` through the agent module whose parameters are views of the flat weights
      (``FlatLayout.bind``); about half of torch.func's per-step cost eagerly.
    - ``members_autograd``: K > 1, eager, anything else: one batched forward of all members and one backward of their
      summed losses (member m's weights reach only member m's loss).
    ``pure``: the update is part of a pure function (the eager iteration, ``fastrl.run.iteration``), which the
    ``module`` path's in-place weights cannot be: a single run there takes the members paths, at K = 1.
    torchrun adds only a gradient all-reduce between ``Update.gradient`` and ``Update.apply`` (same paths).
    """
    if compiled:
        return "functional"
    if hand_gradient:
        return "members_hand"
    if members == 1 and not pure:
        return "functional" if loss_scaling else "module"
    return "members_autograd"


def hand_gradient_applies(spec: UpdateSpec, layout: FlatLayout, autocast) -> bool:
    """Whether ``fastrl.learn.mlp_gradient``'s hand-derived gradient covers this agent and update (``step_path``'s input):
    never a recurrent policy's."""
    return not spec.sequence_length and MembersMLPGradient.supports(layout.agent, spec.algo, autocast is nullcontext,
                                                                    spec.loss_scaling)


class Update:
    """The update of ``spec`` for the agents shaped like ``layout``'s (see the module docstring), each minibatch step
    computed the way ``path`` names (``step_path``); ``agent`` is the module the ``module`` path differentiates;
    ``rank_mean`` (torchrun: ``tensor -> its mean over the ranks``) averages each step's gradient across ranks."""

    def __init__(self, spec: UpdateSpec, layout: FlatLayout, autocast=nullcontext, path: str = "functional",
                 agent: torch.nn.Module | None = None, rank_mean=None):
        if (path == "module") != (agent is not None):
            raise ValueError("the module path, and only it, takes the agent module")
        self.spec, self.layout, self.autocast, self.path = spec, layout, autocast, path
        self.constants = dict(spec.constants)
        self.eager_agent, self.rank_mean = agent, rank_mean
        if path == "members_hand" and not hand_gradient_applies(spec, layout, autocast):
            raise ValueError("the hand-derived gradient does not apply to this agent or update")
        self.members_gradient = (MembersMLPGradient(layout, spec.algo, spec.clip_vloss, spec.norm_adv)
                                 if path == "members_hand" else None)

    @classmethod
    def for_run(cls, spec: UpdateSpec, layout: FlatLayout, autocast, members: int, compiled: bool,
                agent: torch.nn.Module, rank_mean=None, pure: bool = False) -> "Update":
        """The update a run of ``members`` members takes, compiled or not: its path from ``step_path``."""
        path = step_path(members, compiled, spec.loss_scaling, hand_gradient_applies(spec, layout, autocast), pure)
        return cls(spec, layout, autocast, path, agent if path == "module" else None, rank_mean)

    def init_opt_state(self, params: torch.Tensor) -> dict:
        """Zero optimizer state for ``params [..., P]`` (and the fp16 loss scale)."""
        return initial_opt_state(self.spec, params)

    # ------------------------------------------------------------------ one step's halves
    def loss(self, params, minibatch: tuple, hparams: dict):
        """``(loss, stats)`` of one minibatch ``(observation, action, ..., valid)`` at weights ``params [P]`` (or a
        list of one tensor per parameter, see ``FlatLayout.call``; None: the weights of ``eager_agent``, bound to the
        same flat tensor)."""
        with self.autocast():
            out = self.policy(params)(*minibatch[:2], None, *self.sequences(minibatch))
        return self.loss_of(*out[1:4], minibatch, hparams)

    def policy(self, params):
        """``get_action_and_value`` at the weights ``params`` (the module path: ``eager_agent``'s, bound to them)."""
        return (self.eager_agent.get_action_and_value if self.path == "module"
                else partial(self.layout.call, "get_action_and_value", params))

    def sequences(self, minibatch: tuple) -> tuple:
        """A recurrent policy's ``(state [..., B, S], episode_start [..., T * B])`` for its minibatch of B whole
        columns, ``T * B`` rows time-major (the state: the rows of the first step); else ``()``."""
        if not self.spec.sequence_length:
            return ()
        episode_start, state = minibatch[len(LOSS_KEYS):]
        return state[..., :state.shape[-2] // self.spec.sequence_length, :], episode_start

    def loss_of(self, logp, entropy, value, minibatch: tuple, hparams: dict):
        """The loss given the policy's outputs on the minibatch (``kernels.ppo_loss`` / ``kernels.pg_loss``)."""
        _, _, old_logp, advantage, old_value, value_target, valid = minibatch[:len(LOSS_KEYS)]
        # backend="torch": the composed ops, which inductor fuses (and which torch.func can differentiate).
        if self.spec.algo == "a2c":
            return kernels.pg_loss(logp.float(), advantage, value.float(), value_target, entropy.float(), valid,
                                   vf_coef=hparams["vf_coef"], ent_coef=hparams["ent_coef"],
                                   normalize_advantage=self.spec.norm_adv, backend="torch")
        return kernels.ppo_loss(logp.float(), old_logp, advantage, value.float(), old_value, value_target,
                                entropy.float(), valid, clip_coef=hparams["clip_coef"], vf_coef=hparams["vf_coef"],
                                ent_coef=hparams["ent_coef"], clip_vloss=self.spec.clip_vloss,
                                normalize_advantage=self.spec.norm_adv, backend="torch")

    def learner_sequence(self, minibatch: tuple) -> tuple:
        """A recurrent policy's ``fastrl.learn.impala.learner_sequence`` of a learner minibatch (``learner_keys``)."""
        return learner_sequence(minibatch[4], *minibatch[len(VTRACE_KEYS):]) if self.spec.sequence_length else ()

    def vtrace_targets_of(self, target_logp, value, minibatch: tuple) -> tuple:
        """``fastrl.learn.impala.vtrace_targets``' ``(vs, pg_advantage, stats)`` from the learner's outputs on a minibatch."""
        _, _, _, behavior_logp, valid, reward, done, terminated = minibatch[:len(VTRACE_KEYS)]
        return vtrace_targets(behavior_logp, target_logp, value, reward, done, terminated, valid, *self.spec.vtrace)

    def vtrace_loss_of(self, target_logp, entropy, value, targets: tuple, minibatch: tuple, hparams: dict):
        """IMPALA's loss given the learner's outputs on a minibatch of env columns (``target_logp``, ``entropy``
        ``[T, n]``, ``value [T + 1, n]``) and their V-trace ``targets``: ``kernels.pg_loss``."""
        vs, pg_advantage, stats = targets
        valid = minibatch[4]
        loss, loss_stats = kernels.pg_loss(target_logp, pg_advantage, value[:-1], vs, entropy, valid,
                                           vf_coef=hparams["vf_coef"], ent_coef=hparams["ent_coef"],
                                           normalize_advantage=self.spec.norm_adv, backend="torch")
        return loss, {**loss_stats, **stats,
                      "explained_variance": explained_variance(value[:-1].detach(), vs, valid.float())}

    def vtrace_gradient(self, params, opt_state: dict, minibatch: tuple, hparams: dict):
        """IMPALA's ``(grad [P], loss, stats)`` for one member. The V-trace kernel takes plain tensors, so the
        functional path takes the forward's vector-Jacobian product (``vjp``), computes the targets from its plain
        outputs, the loss's gradient with respect to those outputs, and pulls that back to the weights."""
        observation, bootstrap_observation, action = minibatch[:3]
        sequence = self.learner_sequence(minibatch)
        scale = opt_state["loss_scale"] if self.spec.loss_scaling else None

        def forward(views):
            return learner_forward(self.policy(views), observation, bootstrap_observation, action, self.autocast,
                                   sequence)
        if self.path == "module":
            def module_loss():
                outputs = forward(params)
                targets = self.vtrace_targets_of(outputs[0], outputs[2], minibatch)
                return self.vtrace_loss_of(*outputs, targets, minibatch, hparams)
            return self._module_gradient(module_loss)
        # With respect to each parameter's view, concatenated after (``FlatLayout.flat_gradient``), as ``gradient``.
        outputs, pullback = vjp(forward, self.layout.views(params))
        targets = self.vtrace_targets_of(outputs[0], outputs[2], minibatch)

        def scaled_loss(target_logp, entropy, value):
            loss, stats = self.vtrace_loss_of(target_logp, entropy, value, targets, minibatch, hparams)
            return (loss if scale is None else loss * scale), (loss, stats)
        cotangents, (_, (loss, stats)) = grad_and_value(scaled_loss, argnums=(0, 1, 2), has_aux=True)(*outputs)
        grads, = pullback(cotangents)
        grad = self.layout.flat_gradient(grads)
        return (grad if scale is None else grad / scale), loss.detach(), stats

    def gradient(self, params, opt_state: dict, minibatch: tuple, hparams: dict):
        """``(grad [P], loss, stats)`` (``[K, P]`` etc. for K members): the loss's gradient, by ``self.path``
        (unscaled again under fp16 loss scaling)."""
        if self.spec.algo == "impala":
            return self.vtrace_gradient(params, opt_state, minibatch, hparams)
        if self.path == "module":
            return self._module_gradient(partial(self.loss, None, minibatch, hparams))
        if self.path == "members_hand":
            return self.members_gradient(params, minibatch, hparams)
        if self.path == "members_autograd":
            return self._members_autograd_gradient(params, opt_state, minibatch, hparams)
        return self._functional_gradient(params, opt_state, minibatch, hparams)

    def _functional_gradient(self, params, opt_state: dict, minibatch: tuple, hparams: dict):
        if params.dim() == 2:
            return vmap(self._functional_gradient)(params, opt_state, minibatch, hparams)
        scale = opt_state["loss_scale"] if self.spec.loss_scaling else None
        # Differentiated with respect to each parameter's view, then concatenated (``FlatLayout.flat_gradient``).
        def scaled(p):
            loss, stats = self.loss(p, minibatch, hparams)
            return (loss if scale is None else loss * scale), (loss, stats)
        grads, (_, (loss, stats)) = grad_and_value(scaled, has_aux=True)(self.layout.views(params))
        grad = self.layout.flat_gradient(grads)
        return (grad if scale is None else grad / scale), loss, stats

    def _module_gradient(self, loss_fn):
        """The ``module`` path: ``loss_fn() -> (loss, stats)`` through ``eager_agent``, differentiated by autograd."""
        with torch.enable_grad():
            loss, stats = loss_fn()
            grads = torch.autograd.grad(loss, list(self.eager_agent.parameters()))
        return torch.cat([g.reshape(-1) for g in grads]), loss.detach(), stats

    def _members_autograd_gradient(self, params, opt_state: dict, minibatch: tuple, hparams: dict):
        """K members eagerly: one forward of all members (batched matmuls for an MLP), their losses, and one backward
        of the losses' sum (member m's weights reach only member m's loss)."""
        scale = opt_state["loss_scale"] if self.spec.loss_scaling else None
        with torch.enable_grad():
            weights, views = params.detach(), None
            if self.layout.batched:
                # Differentiated with respect to each parameter's [K, *shape] view, concatenated after: the gradient
                # with respect to [K, P] itself would add one zero-padded [K, P] slice per parameter.
                leaves = views = [view.requires_grad_() for view in self.layout.views(weights)]
            else:
                leaves = [weights.requires_grad_()]
            with self.autocast():
                _, logp, entropy, value = self.layout.call_members("get_action_and_value", weights, *minibatch[:2], None,
                                                                   *self.sequences(minibatch), views=views)[:4]
            loss, stats = vmap(self.loss_of)(logp, entropy, value, minibatch, hparams)
            total = (loss * scale).sum() if scale is not None else loss.sum()
            grads = torch.autograd.grad(total, leaves)
            grad = grads[0] if len(grads) == 1 else torch.cat([g.reshape(g.shape[0], -1) for g in grads], dim=1)
        return (grad / scale[:, None] if scale is not None else grad), loss.detach(), stats

    def across_ranks(self, grad, loss, stats: dict):
        """torchrun: ``(grad, loss, stats)`` with the gradient, the loss and approx_kl (where the loss has one)
        averaged over the ranks by ``rank_mean``, packed into one all-reduce. The loss and approx_kl ride along so
        that ``apply``'s finite check and target_kl's stop decide alike on every rank (a mean is non-finite when any
        rank's is), at no extra collective; the other statistics stay this rank's."""
        scalars = [loss] + ([stats["approx_kl"]] if "approx_kl" in stats else [])
        size = grad.shape[-1]
        packed = self.rank_mean(torch.cat([grad, torch.stack(scalars, dim=-1).to(grad.dtype)], dim=-1))
        if "approx_kl" in stats:
            stats = {**stats, "approx_kl": packed[..., size + 1]}
        return packed[..., :size], packed[..., size], stats

    def apply(self, params, opt_state: dict, grad, loss, hparams: dict, keep=None):
        """Clip, guard and optimizer math, out of place: ``(params, opt_state, grad_norm, nonfinite, applied)``.
        ``keep`` (bool, default True): False computes the step and drops it (target_kl's early stop). Works on one
        member (``[P]``, 0-d figures) and on K at once (``[K, P]``, ``[K]`` figures) alike."""
        grad_norm = torch.linalg.vector_norm(grad, dim=-1)
        max_norm = hparams["max_grad_norm"]
        scale = torch.where(max_norm > 0, (max_norm / (grad_norm + _NORM_EPS)).clamp(max=1.0), torch.ones_like(grad_norm))
        finite = torch.isfinite(loss) & torch.isfinite(grad_norm)
        applied = finite if keep is None else finite & keep
        moments = {key: value for key, value in opt_state.items() if key not in ("loss_scale", "good_steps")}
        new_params, new_moments = optimizer_step(self.spec.optimizer, self.constants, params, grad * scale[..., None],
                                                 moments, hparams["lr"])
        params = torch.where(applied[..., None], new_params, params)
        new_state = {key: torch.where(applied if value.dim() < params.dim() else applied[..., None], new_moments[key],
                                      value) for key, value in moments.items()}
        if self.spec.loss_scaling:  # GradScaler's rule: halve on overflow, double after 2000 clean steps
            good = torch.where(finite, opt_state["good_steps"] + 1, torch.zeros_like(opt_state["good_steps"]))
            grow = good >= _LOSS_SCALE_GROWTH_INTERVAL
            loss_scale = torch.where(finite, torch.where(grow, opt_state["loss_scale"] * 2, opt_state["loss_scale"]),
                                     opt_state["loss_scale"] / 2)
            new_state["loss_scale"], new_state["good_steps"] = loss_scale, torch.where(grow, torch.zeros_like(good), good)
        return params, new_state, grad_norm, ~finite, applied

    # ------------------------------------------------------------------ minibatch steps
    def steps(self, params, opt_state: dict, batch: tuple, index, hparams: dict, active, epoch_ends=None,
              in_place: bool = False):
        """Some minibatch steps of the update: ``index [count, B / n_minibatches]`` their rows (None: A2C's one step
        on the whole batch). ``active`` (0-d bool): False once target_kl stopped the update; ``epoch_ends [count]``
        (bool, needed with target_kl) marks the steps that end an epoch. Returns ``(params, opt_state, sums,
        active)``: ``sums`` the stats summed over the applied steps, with ``n_updates`` and ``nonfinite_updates``.
        ``in_place``: each step's weights and optimizer state are written into ``params`` and ``opt_state`` (the eager
        module path, ``eager_agent``, reads its weights from ``params``), which are returned.
        The loop twin of ``scan_steps``: one ``step`` per minibatch."""
        carry = (params, opt_state, self.zero_sums(params), active)
        for j in range(1 if index is None else index.shape[-2]):
            carry = self.step(carry, self.minibatch(batch, index, j), hparams,
                              None if epoch_ends is None else epoch_ends[j])
            if in_place:
                copy_weights(params, opt_state, *carry[:2])
                carry = (params, opt_state, *carry[2:])
        return carry

    def scan_steps(self, params, opt_state: dict, batch: tuple, index, hparams: dict, active, epoch_ends,
                   loop: bool = False):
        """Every member's minibatch steps as one ``torch._higher_order_ops.scan`` over the minibatches, each step
        ``vmap``'d over the K members (``params [K, P]``, ``batch`` ``[K, B, ...]``, ``index [K, count, mb]`` rows,
        ``hparams`` / ``active`` ``[K]``, ``epoch_ends [count]``). Compiled, the graph holds one step whatever the
        count (unrolled, each step adds about 5 s of compiling on a 2-core CPU). ``loop``: the same body in a
        Python loop (its eager twin). PPO / APPO rows only. Returns ``steps``' ``(params, opt_state, sums, active)``."""
        k = params.shape[0]
        step = members_call(k, self.step, (0, 0, 0, None))
        members = torch.arange(k, device=params.device)[:, None]

        def body(carry, rows_and_end):
            rows, epoch_end = rows_and_end
            minibatch = tuple(tensor[members, rows] for tensor in batch)
            params, opt_state, sums, active = step(carry, minibatch, hparams, epoch_end)
            # Without target_kl ``active`` comes back as it went in: a scan's outputs may not alias its inputs.
            return (params, opt_state, sums, active.clone()), active.clone()
        carry = (params, opt_state, self.zero_sums(params), active.clone())
        xs = (index.transpose(0, 1), epoch_ends)
        if loop:
            for j in range(index.shape[1]):
                carry, _ = body(carry, (xs[0][j], xs[1][j]))
            return carry
        from torch._higher_order_ops.scan import scan
        return scan(body, carry, xs)[0]

    def zero_sums(self, params) -> dict:
        """The step statistics' running sums, zero (``[K]`` or 0-d), one tensor per key."""
        keys = (*stat_names(self.spec.algo), "n_updates", "nonfinite_updates")
        # zeros_like, not zeros: under vmap the sums are then batched as the carry a step returns (scan's rule).
        return {key: torch.zeros_like(params[..., 0]) for key in keys}

    def step(self, carry: tuple, minibatch: tuple, hparams: dict, epoch_end) -> tuple:
        """One minibatch step: ``carry = (params, opt_state, sums, active)`` -> the same after the step."""
        params, opt_state, sums, active = carry
        grad, loss, stats = self.gradient(params, opt_state, minibatch, hparams)
        if self.rank_mean is not None:
            grad, loss, stats = self.across_ranks(grad, loss, stats)
        params, opt_state, grad_norm, nonfinite, applied = self.apply(params, opt_state, grad, loss, hparams,
                                                                      keep=active)
        stats = {**stats, "grad_norm": grad_norm}
        sums, zero = dict(sums), torch.zeros_like(sums["n_updates"])
        for key in stat_names(self.spec.algo):  # where, not a product: a skipped step's NaN must not reach the sums
            sums[key] = sums[key] + torch.where(applied, stats[key].float(), zero)
        sums["n_updates"] = sums["n_updates"] + applied.float()
        sums["nonfinite_updates"] = sums["nonfinite_updates"] + (nonfinite & active).float()
        if self.spec.target_kl > 0:  # a population's limit is per member (hparams), 0 for a member without one
            limit = hparams.get("target_kl", self.spec.target_kl)
            active = active & ~(epoch_end & (limit > 0) & (stats["approx_kl"] > limit))
        return params, opt_state, sums, active

    def minibatch(self, batch: tuple, index, j: int) -> tuple:
        """Minibatch ``j`` of ``batch`` (``index`` None: the whole batch): rows, or IMPALA's env columns (of every
        time-major input, and the rows of ``bootstrap_observation``)."""
        if index is None:
            return batch
        if index.dim() == 3 and index.shape[-1] == batch[0].shape[1] and self.path == "members_hand":
            # K members' hand-derived gradient on a minibatch of every row: its means and sums do not depend on the
            # rows' order (up to rounding), so the shuffled copy is skipped.
            return batch
        if self.spec.algo == "impala":
            columns = index[j]
            return tuple(tensor[columns] if key == "bootstrap_observation" else tensor[:, columns]
                         for key, tensor in zip(self.spec.learner_keys, batch))
        if index.dim() == 3:  # K members' [K, B, ...] rows: one flat index, then one index_select per input
            k, rows = batch[0].shape[:2]
            flat = (index[:, j] + _member_row_offsets(k, rows, index.device)).reshape(-1)
            return tuple(tensor.flatten(0, 1).index_select(0, flat).view(k, -1, *tensor.shape[2:]) for tensor in batch)
        return tuple(tensor[index[j]] for tensor in batch)

    # ------------------------------------------------------------------ the whole update
    def inputs(self, params, batch: dict) -> tuple:
        """``(inputs, stats)``: the loss inputs of ``batch`` in the order the steps take them. APPO's are V-trace's
        ``LOSS_KEYS`` rows ``[T * N]`` from the weights ``params`` before the update, with the batch's V-trace
        statistics."""
        if not self.spec.vtrace:
            return tuple(batch[key] for key in self.spec.loss_keys), {}
        learner_inputs = tuple(batch[key] for key in self.spec.learner_keys)
        if self.spec.algo == "impala":
            return learner_inputs, {}
        observation, bootstrap_observation, action, behavior_logp, valid = learner_inputs[:5]
        with torch.no_grad():
            target_logp, _, value = learner_forward(self.policy(params), observation, bootstrap_observation, action,
                                                    self.autocast, self.learner_sequence(learner_inputs))
        vs, pg_advantage, stats = self.vtrace_targets_of(target_logp, value, learner_inputs)
        stats["explained_variance"] = explained_variance(value[:-1], vs, valid.float())
        rows = {"observation": observation, "action": action, "sample_log_prob": behavior_logp,
                "advantage": pg_advantage, "state_value": value[:-1], "value_target": vs, "valid": valid,
                **dict(zip(SEQUENCE_KEYS, learner_inputs[len(VTRACE_KEYS):]))}
        return tuple(rows[key].flatten(0, 1) for key in self.spec.loss_keys), stats

    def __call__(self, params, opt_state: dict, batch: dict, hparams: dict, in_place: bool = False):
        """``(params, opt_state, metrics)`` after every minibatch step of one rollout (see the module docstring).
        ``metrics``: the means of ``stat_names(algo)`` over the applied steps, ``n_updates``, ``nonfinite_updates``
        (and APPO's V-trace statistics). ``in_place``: ``params`` and ``opt_state`` are written after every step, as
        ``steps`` writes them."""
        inputs, stats = self.inputs(params, batch)
        index = batch.get("minibatch_index")
        active = torch.ones((), dtype=torch.bool, device=params.device)
        params, opt_state, sums, _ = self.steps(params, opt_state, inputs, index, hparams, active,
                                                epoch_end_mask(0, self.spec.n_steps, self.spec.n_minibatches, params.device),
                                                in_place)
        return params, opt_state, {**finish_metrics(sums), **stats}


def copy_weights(params, opt_state: dict, new_params, new_state: dict, member=...) -> None:
    """Write ``new_params`` and ``new_state`` into ``params`` and ``opt_state`` in place: all of them, or ``member``'s
    rows only (its index on the leading member axis)."""
    params[member].copy_(new_params)
    for key, value in new_state.items():
        opt_state[key][member].copy_(value)


def members_call(k: int, fn, in_dims=0):
    """``fn`` of one member -> ``fn`` of K members' ``[K, ...]`` arguments (dicts and tuples of them): ``vmap(fn,
    in_dims)`` at K > 1; at K = 1 the call on the one member's tensors, what vmap computes without its eager
    overhead. ``in_dims``: 0, or per argument 0 or None (passed as it is)."""
    if k > 1:
        return vmap(fn, in_dims=in_dims)

    def call(*args):
        dims = in_dims if isinstance(in_dims, tuple) else (in_dims,) * len(args)
        out = fn(*(arg if dim is None else _tree(lambda x: x[0], arg) for arg, dim in zip(args, dims)))
        return _tree(lambda x: x[None], out)
    return call


def _tree(fn, tree):
    if isinstance(tree, dict):
        return {key: _tree(fn, value) for key, value in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_tree(fn, value) for value in tree)
    return fn(tree) if isinstance(tree, torch.Tensor) else tree


def initial_opt_state(spec: UpdateSpec, params: torch.Tensor) -> dict:
    """Zero optimizer state of ``spec``'s optimizer for ``params [..., P]`` (and the fp16 loss scale)."""
    state = init_state(spec.optimizer, params)
    if spec.loss_scaling:
        state["loss_scale"] = torch.full(params.shape[:-1], 2.0 ** 16, device=params.device)
        state["good_steps"] = torch.zeros(params.shape[:-1], device=params.device)
    return state


@lru_cache(maxsize=16)
def _member_row_offsets(members: int, rows: int, device: torch.device) -> torch.Tensor:
    """``[K, 1]``: member m's first row in ``[K * B, ...]`` rows, ``m * B``."""
    return (torch.arange(members, device=device) * rows)[:, None]


def finish_metrics(sums: dict) -> dict:
    """Summed step statistics -> their means over the applied steps (``n_updates`` and ``nonfinite_updates`` stay
    counts)."""
    count = sums["n_updates"].clamp(min=1)
    out = {key: value / count for key, value in sums.items() if key not in ("n_updates", "nonfinite_updates")}
    out["n_updates"], out["nonfinite_updates"] = sums["n_updates"], sums["nonfinite_updates"]
    return out


def minibatch_index(batch_size: int, n_epochs: int, n_minibatches: int, generator: torch.Generator,
                    device, sequence_length: int = 0) -> torch.Tensor:
    """``[n_epochs * n_minibatches, batch_size / n_minibatches]``: each epoch one ``randperm`` of the batch rows from
    ``generator``, cut into ``n_minibatches`` equal slices. ``sequence_length`` T (a recurrent policy's): the rows are
    ``[T, N]`` time-major and each epoch permutes the N env columns instead: a minibatch is ``N / n_minibatches``
    whole columns, its rows time-major (``t * N + column``)."""
    columns = batch_size // sequence_length if sequence_length else batch_size
    perms = torch.stack([torch.randperm(columns, generator=generator, device=device) for _ in range(n_epochs)])
    perms = perms.view(n_epochs * n_minibatches, 1, columns // n_minibatches)
    if sequence_length:
        perms = perms + torch.arange(sequence_length, device=device).view(1, -1, 1) * columns
    return perms.flatten(1)


def epoch_end_mask(first: int, count: int, n_minibatches: int, device) -> torch.Tensor:
    """``[count]`` bool: which of minibatch steps ``first .. first + count - 1`` end an epoch."""
    return (torch.arange(first + 1, first + count + 1, device=device) % n_minibatches) == 0


def learner_minibatch_index(spec: UpdateSpec, n_steps: int, n_envs: int, generator: torch.Generator,
                            device) -> torch.Tensor | None:
    """The IMPALA/APPO learner's ``minibatch_index`` for a ``[n_steps, n_envs]`` batch: IMPALA's env columns
    (``[n_minibatches, n_envs / n_minibatches]``, one ``randperm``; None with one minibatch: all columns in order),
    APPO's rows as PPO's (``minibatch_index`` over the ``n_steps * n_envs`` rows; a recurrent policy's: whole
    columns)."""
    if spec.algo == "appo":
        return minibatch_index(n_steps * n_envs, spec.n_epochs, spec.n_minibatches, generator, device,
                               spec.sequence_length)
    if spec.n_minibatches == 1:
        return None
    order = torch.randperm(n_envs, generator=generator, device=device)
    return order.view(spec.n_minibatches, n_envs // spec.n_minibatches)
