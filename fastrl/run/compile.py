"""What gets compiled, and how: ``compile_plan`` (a function of the config and the shapes only), ``CompiledOrEager``
(``torch.compile`` with an eager fallback) and ``skip_guards`` (the hot loops' guard-free stance).

The plan never looks at what a cache holds, so the same command computes the same thing on a cold and a warm cache
(``tests/test_update.py`` runs one command twice, with an empty and a filled cache, and compares the metrics). The
inductor caches only make the second compile faster.
"""
from __future__ import annotations

import math
import os
import warnings
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.utils._pytree import tree_map

from fastrl.errors import first_line
from fastrl.signals import STOP_HANDLER_CODE, stop_requested

# From how many gradient steps compiling the update on CPU pays for itself. The compiled step of a 64x64 MLP saves
# about 2.8 ms of a 3.7 ms eager step at minibatch 64 (2.6 of 3.9 at 256) and compiles in about 46 s with a cold
# inductor cache (2 cores, benchmarks/learner.py): break-even near 16,000 steps. Judged as if the cache were cold,
# whatever it holds: a warm cache then only makes the compile cheaper.
CPU_COMPILE_MIN_GRADIENT_STEPS = 20_000
# The same for a population (K > 1 members in one process): its eager step costs more and its compile less. Measured
# for 3 members (2-core Intel Xeon, 2026-12-05, cold cache): CartPole at the zoo's settings (minibatch 256) steps in
# 2.8 ms eager and 1.0 ms compiled and compiles in about 21 s, break-even near 12k steps (7.8k-step process: 30.5 s
# eager, 44 s compiled); Pendulum with gSDE (minibatch 64) compiles in about 14 s and saves about 1.8 ms a step,
# break-even near 8k (15.4k-step process: 56 s eager, 42 s compiled). Between those: 10k.
CPU_POPULATION_COMPILE_MIN_GRADIENT_STEPS = 10_000
# The same for a population whose eager step is ``fastrl.learn.mlp_gradient``'s hand-derived gradient (an MLP actor-critic,
# PPO or A2C, gSDE included): that eager step costs about half of autograd's, so the compile saves less per step. Measured
# for 3 members (2-core Intel Xeon, 2026-12-05): MountainCarContinuous (Gaussian, minibatch 256) 1.6 ms eager against
# 0.84 ms compiled, CartPole at the zoo's settings (minibatch 256) about 1.7 against 1.0, for a compile of about 20 s
# cold: break-even near 26k-29k steps.
CPU_HAND_GRADIENT_COMPILE_MIN_GRADIENT_STEPS = 30_000
# From how many rollout steps per env (total_steps / n_envs) compiling the rollout step pays on CPU: the compiled step
# saves 60-90 us per step and compiles in about 10 s cold.
CPU_ROLLOUT_COMPILE_MIN_STEPS = 150_000
# From how many iterations compiling the whole iteration (``fastrl.run.iteration``, env_backend torch) pays on CPU. Its
# scans are never cached by inductor ("can't cache HigherOrderOperator: scan"), so every process compiles them cold:
# about 20 s for one CartPole agent at PureJaxRL's config (4 envs x 128 steps, 4 x 4 minibatches), 27-40 s for 4-16
# members, against 174 ms an iteration eager and 24 ms compiled (2-core AMD EPYC, 1 thread, 2026-12-06): break-even
# near 135 iterations.
CPU_ITERATION_COMPILE_MIN_ITERATIONS = 150
# How many minibatch gradient steps one compiled update call runs (unrolled in one graph): each call costs a prologue
# (Python, Dynamo, AOT), each unrolled step adds compile time. Measured on the 2-core CPU (3 Acrobot members, 64x64
# MLPs, minibatch 64, cold inductor cache, 2026-12-04): the first update call took 17.2 / 22.0 / 32.0 / 56.0 s at
# 1 / 2 / 4 / 8 steps per call (about 5.5 s per unrolled step) and an iteration's 256 steps 153 / 134 / 104 / 102 ms
# (about 0.23 ms per call). A run's update time, about compile(k) + G * (step + CALL_OVERHEAD_S / k) over its G
# gradient steps, is least near k = sqrt(G * CALL_OVERHEAD_S / COMPILE_S_PER_UNROLLED_STEP): 1 for Pendulum's 15k
# steps (3 members: 46 s process at 1 step per call, 56 s at 2, 65 s at 4), 2 for 1M-step MuJoCo, 6 for 1M steps.
MAX_STEPS_PER_CALL = 8
# The unrolling is planned over at most this many gradient steps: a budget meant as "until I stop it"
# (total_steps: 1e30) would otherwise unroll the whole update (8 steps: about 45 s of compiling before the first
# step, and as long for a SIGTERM to be heard). The zoo's longest runs (Atari, 10M steps: 156k) stay below it.
PLANNING_HORIZON_GRADIENT_STEPS = 200_000
COMPILE_S_PER_UNROLLED_STEP = 5.5
CALL_OVERHEAD_S = 0.23e-3


@dataclass(frozen=True)
class CompilePlan:
    """What a PPO / A2C run compiles: the rollout step's and the update's ``torch.compile`` mode (``off``: eager), and
    how many minibatch steps one update call runs (``steps_per_call``). Recorded in summary.json (``compiled``)."""
    rollout: str
    update: str
    steps_per_call: int

    def to_dict(self) -> dict:
        return asdict(self)


def target_steps_per_call(gradient_steps: int) -> int:
    """The steps per call that least costs a run of ``gradient_steps`` (compile against per-call prologue), in
    ``[1, MAX_STEPS_PER_CALL]``."""
    best = math.sqrt(max(gradient_steps, 0) * CALL_OVERHEAD_S / COMPILE_S_PER_UNROLLED_STEP)
    return min(MAX_STEPS_PER_CALL, max(1, round(best)))


def steps_per_call(n_epochs: int, n_minibatches: int, limit: int = MAX_STEPS_PER_CALL) -> int:
    """Minibatch steps per update call, at most ``limit``: the whole update (``n_epochs * n_minibatches``) when it
    fits, else the most whole epochs that do, else the largest divisor of ``n_minibatches`` that does (every call
    then has the same shapes: one graph). Under torchrun too: each step's gradient all-reduce is a functional
    collective, traced into the compiled call (``fastrl.distributed.torchrun.rank_mean``)."""
    if n_minibatches <= limit:
        epochs = max(e for e in range(1, n_epochs + 1) if n_epochs % e == 0 and e * n_minibatches <= limit)
        return epochs * n_minibatches
    return max(d for d in range(1, limit + 1) if n_minibatches % d == 0)


def compile_plan(mode: str, device: torch.device, gradient_steps: int, rollout_steps: int = 0,
                 iterations: int = 0, n_epochs: int = 1, n_minibatches: int = 1, members: int = 1,
                 hand_gradient: bool = False) -> CompilePlan:
    """The plan for ``cfg.compile``.

    ``auto``: on CUDA both parts compiled with CUDA graphs (``reduce-overhead``). On CPU each part is compiled when the
    run is long enough to repay its compile: the update from ``CPU_COMPILE_MIN_GRADIENT_STEPS`` gradient steps
    (``gradient_steps`` over the whole run; a population of ``members`` > 1 from
    ``CPU_POPULATION_COMPILE_MIN_GRADIENT_STEPS``, or ``CPU_HAND_GRADIENT_COMPILE_MIN_GRADIENT_STEPS`` when its eager
    step is the hand-derived gradient, ``hand_gradient``), the rollout step from ``CPU_ROLLOUT_COMPILE_MIN_STEPS`` steps per env
    (``rollout_steps``). Any other mode applies to both.

    ``iterations`` > 0: the run's iteration is one function (``fastrl.run.iteration``), compiled whole (rollout and
    update in one mode, every minibatch step in its one call) on CPU from ``CPU_ITERATION_COMPILE_MIN_ITERATIONS``.
    """
    if mode != "auto":
        rollout = update = mode
    elif device.type == "cuda":
        # Under torchrun the update's NCCL all-reduce is then captured in the CUDA graph too: checked with gloo on
        # CPU only (tests/test_distributed.py), never yet on two GPUs.
        rollout = update = "reduce-overhead"
    elif iterations:
        rollout = update = "default" if iterations >= CPU_ITERATION_COMPILE_MIN_ITERATIONS else "off"
    else:
        rollout = "default" if rollout_steps >= CPU_ROLLOUT_COMPILE_MIN_STEPS else "off"
        update_needs = CPU_COMPILE_MIN_GRADIENT_STEPS
        if members > 1:
            update_needs = (CPU_HAND_GRADIENT_COMPILE_MIN_GRADIENT_STEPS if hand_gradient
                            else CPU_POPULATION_COMPILE_MIN_GRADIENT_STEPS)
        update = "default" if gradient_steps >= update_needs else "off"
    if (rollout, update) != ("off", "off"):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(compile_cache_dir())
    if iterations:
        return CompilePlan(rollout, update, n_epochs * n_minibatches)
    horizon = min(gradient_steps, PLANNING_HORIZON_GRADIENT_STEPS)
    per_call = (steps_per_call(n_epochs, n_minibatches, target_steps_per_call(horizon))
                if update != "off" else 1)
    return CompilePlan(rollout, update, per_call)


def compile_cache_dir() -> Path:
    """Where inductor's FX-graph and AOTAutograd caches live, so a second compile is fast:
    ``$TORCHINDUCTOR_CACHE_DIR`` if the user set it, else ``$XDG_CACHE_HOME/fastrl/torch_compile`` (``~/.cache/...``).

    torch writes its own default (``/tmp/torchinductor_<user>``) into ``os.environ`` the first time it needs the
    directory (importing ``torch._dynamo`` is enough), so in a process that did that before calling fastrl the
    variable holds the default without anyone having set it: that value counts as unset."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen and os.path.abspath(chosen) != _torch_default_cache_dir():
        return Path(chosen)
    return base / "fastrl" / "torch_compile"


def _torch_default_cache_dir() -> str:
    """The directory inductor uses, and writes into ``TORCHINDUCTOR_CACHE_DIR``, when the variable is unset."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
        return os.path.abspath(default_cache_dir())
    except (ImportError, AttributeError):  # another torch layout: its documented default
        import getpass
        import tempfile
        return os.path.abspath(os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}"))


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
    """Calls ``torch.compile(fn, mode=mode)``; if the first call fails to compile, warns once and runs ``fn`` eagerly
    (or ``eager``, its twin for eager use, where ``fn`` only runs compiled: a scan).

    ``fullgraph``: a graph break is a compile failure (so it falls back to eager, with the warning) instead of a
    silently split graph."""

    def __init__(self, fn, mode: str, name: str, fullgraph: bool = False, eager=None):
        self.eager, self.name = fn if eager is None else eager, name
        self.compiled = mode != "off"
        # CUDA graphs replay into the same output memory: each call starts a new graph step, and its CUDA outputs
        # are copied out, so that a caller may hold them past the next call (the update sums chunk by chunk).
        self.graph_outputs = mode == "reduce-overhead"
        # dynamic=False: every shape here is fixed for a run, and a second trainer in the same process (another
        # n_envs, another minibatch) gets its own static graph instead of turning the shared code dynamic.
        self.fn = torch.compile(fn, mode=mode, fullgraph=fullgraph, dynamic=False) if self.compiled else fn
        if self.compiled:
            _prime_tensordict_memo()
        self._checked = not self.compiled

    def _invoke(self, *args, **kwargs):
        if not (self.graph_outputs and self.compiled):
            return self.fn(*args, **kwargs)
        torch.compiler.cudagraph_mark_step_begin()
        return own_graph_outputs(self.fn(*args, **kwargs))

    def __call__(self, *args, **kwargs):
        if self._checked:
            return self._invoke(*args, **kwargs)
        try:
            out = self._invoke(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any compiler failure means: run eagerly
            # A Ctrl-C to the process group also stops inductor's compile workers: an interruption, not a failure.
            if not stop_requested():
                warnings.warn(f"torch.compile failed for {self.name} ({type(e).__name__}: {first_line(e)[:200]}); running it "
                              "eagerly", RuntimeWarning, stacklevel=2)
            self.fn, self.compiled = self.eager, False
            out = self.fn(*args, **kwargs)
        self._checked = True
        return out


# The devices whose compiled outputs live in CUDA graphs' memory pool (a test adds "cpu" to check the copying).
GRAPH_OUTPUT_DEVICES = ("cuda",)


def own_graph_outputs(out):
    """``out`` (tensors in tuples, lists and dicts) with each tensor on one of ``device_types`` cloned: CUDA graphs
    write every replay's outputs to the same memory, which the next replay overwrites."""
    return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) and x.device.type in GRAPH_OUTPUT_DEVICES
                    else x, out)


# Tests turn this off to check that the hot loops never need a recompile (what makes skipping the guards safe).
SKIP_GUARDS = True


def skip_guards(enabled: bool):
    """A context in which compiled functions skip guard evaluation (``torch.compiler.set_stance(...,
    skip_guard_eval_unsafe=True)``): about 40-140 us per call on the 2-core CPU.

    Only for a hot loop whose compiled functions have already compiled for every input they will see (static
    shapes, dtypes and Python constants): the trainer enters it from its second iteration on."""
    if not (enabled and SKIP_GUARDS):
        return nullcontext()
    from torch._dynamo.eval_frame import skip_code
    skip_code(STOP_HANDLER_CODE)  # a stop signal inside a compiled call must run its handler, not compile it
    return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)
