"""Start-up costs that fastrl pays differently from a plain import, all of them here, each with its measured saving.

Measured 2026-12-06, 22:09-22:12 UTC, on the 2-core CPU machine shared with other work (1-minute load 1.90 at the
first series' start, 2.03 at the second's; the runs themselves add about 1): process wall seconds of ``python -m
fastrl.train --total-steps 2048 --eval-episodes 0 --wandb disabled --tensorboard false --plot false --run-dir /tmp/x
--overwrite``, median of 3 interleaved runs, with everything here and with one thing undone, two series:

=====================================================  ==============  ==============  ==================
undone                                                 with (s)        without (s)     saving (s)
=====================================================  ==============  ==============  ==================
``import_tensordict`` (a plain ``import tensordict``)  3.54 / 4.00     7.20 / 6.34     3.66 / 2.34
``import_envpool`` (``import jax`` first; JAX 0.10.2   3.96 / 3.80     4.70 / 5.96     0.74 / 2.16
installed, as ``pip install -e '.[jax]'`` does)
=====================================================  ==============  ==============  ==================

Without JAX installed (the default install) ``import_envpool``'s JAX block saves nothing and costs nothing.

Two more, first measured in that noisy series as 1.11 / 0.08 s and 1.21 / 0.14 s and removed, then measured again
side by side at 23:05-23:10 UTC (1-minute load 1.35-1.85 at the start; ``python -m benchmarks.default_process
--trees A B --runs 2 --seeds 1``, the default command, medians): without them the start-up and tear-down around the
training took 7.27 s against 4.63 s, and putting back the collector pause alone took it to 6.18 s. They are back:

- ``envpool.jumanji``'s code deferred to the first Jumanji env (``import_envpool``): importing EnvPool took 2.27 s
  with it, 3.37 s without (its renderer imports matplotlib.pyplot): about 1.1 s.
- the collector paused for the start-up, what exists frozen when the run loop starts, everything frozen again before
  the exit (``pause_collector``, ``end_collector_pause``, ``settle_collector_for_exit``): about 1.1 s of the
  default command (full collections over the million start-up objects, and the interpreter's last one at exit).

None of this changes what a run computes.
"""
from __future__ import annotations

import gc
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

# --------------------------------------------------------------------------- tensordict without torch._dynamo
# The torch.compiler functions TensorDict calls at import time; each marks its argument and returns it.
DEFERRABLE = ("allow_in_graph", "assume_constant_result")


class _MarkAfterDynamoImport(importlib.abc.MetaPathFinder):
    """Finds ``torch._dynamo`` as the path finder does, and applies the recorded marks right after it executes."""

    def __init__(self, marks: list):
        self.marks = marks  # [(torch.compiler function name, fn)]

    def find_spec(self, name, path, target=None):
        if name != "torch._dynamo":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, marks = spec.loader.exec_module, self.marks

        def exec_then_mark(module):
            exec_module(module)
            for function_name, fn in marks:
                getattr(module, function_name)(fn)  # torch._dynamo's own allow_in_graph / assume_constant_result

        spec.loader.exec_module = exec_then_mark  # a fresh loader per spec: nothing else sees this
        return spec


def import_tensordict():
    """The ``tensordict`` module, imported (the first time) without ``torch._dynamo``; see the module docstring.
    Where ``torch._dynamo`` is already loaded, or the marks cannot be deferred, a plain import."""
    if "tensordict" in sys.modules or "torch._dynamo" in sys.modules:
        import tensordict
        return tensordict
    import torch.compiler
    marks: list = []
    originals = {name: getattr(torch.compiler, name) for name in DEFERRABLE}

    def deferred(function_name):
        original = originals[function_name]

        def mark(fn):
            if "torch._dynamo" in sys.modules:  # a name TensorDict bound while importing, called later
                return original(fn)
            marks.append((function_name, fn))
            return fn
        return mark

    finder = _MarkAfterDynamoImport(marks)
    sys.meta_path.insert(0, finder)
    for name in DEFERRABLE:
        setattr(torch.compiler, name, deferred(name))
    try:
        import tensordict
    finally:
        for name, original in originals.items():
            setattr(torch.compiler, name, original)
    if "torch._dynamo" in sys.modules and finder in sys.meta_path:  # imported by another route meanwhile
        sys.meta_path.remove(finder)
        for function_name, fn in marks:
            originals[function_name](fn)
    return tensordict


# --------------------------------------------------------------------------- EnvPool without JAX
def import_envpool():
    """``import envpool`` without JAX, which EnvPool imports for an optional XLA interface fastrl never uses: while
    EnvPool loads, ``import jax`` fails, which EnvPool takes as "no XLA". A JAX the process already imported is left
    alone, and JAX imports normally afterwards. ``envpool.jumanji``'s body runs on first use (``_DeferredPackage``):
    registering the Jumanji ids needs only the package's path."""
    if "envpool" in sys.modules:
        return sys.modules["envpool"]
    blocked = "jax" not in sys.modules
    if blocked:
        sys.modules["jax"] = None  # a None entry makes `import jax` raise ImportError
    deferred = _defer_package("envpool.jumanji")
    try:
        import envpool
    except BaseException:
        if deferred is not None and sys.modules.get("envpool.jumanji") is deferred:
            del sys.modules["envpool.jumanji"]
        raise
    finally:
        if blocked and "jax" in sys.modules and sys.modules["jax"] is None:
            del sys.modules["jax"]
    if deferred is not None and not hasattr(envpool, "jumanji"):
        envpool.jumanji = deferred  # the binding an ordinary import of the package makes
    return envpool


class _DeferredPackage(types.ModuleType):
    """A package module whose ``__init__`` code has not run yet: its submodules import through its ``__path__``; the
    first attribute it lacks runs that code in it (so ``from package import X`` and ``getattr`` work as usual)."""

    def __getattr__(self, name):
        if name.startswith("__"):  # the import system's and pickle's probes: no reason to load anything
            raise AttributeError(name)
        self.__class__ = types.ModuleType  # plain from here on, also if the package's code raises
        self.__spec__.loader.exec_module(self)
        return getattr(self, name)


def _defer_package(name: str):
    """Put ``name`` (a package not imported yet) into ``sys.modules`` as a ``_DeferredPackage``; None if it is
    imported already or cannot be found (the import then goes as usual)."""
    if name in sys.modules:
        return None
    parent = name.rpartition(".")[0]
    try:
        parent_spec = importlib.util.find_spec(parent)
        locations = parent_spec.submodule_search_locations if parent_spec else None
        spec = importlib.machinery.PathFinder.find_spec(name, locations) if locations else None
    except (ImportError, ValueError):
        return None
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return None
    module = importlib.util.module_from_spec(spec)
    module.__class__ = _DeferredPackage
    sys.modules[name] = module
    return module


# --------------------------------------------------------------------------- the collector around start-up and exit
_COLLECTOR = {"paused": False}


def pause_collector() -> None:
    """The command line's process starts: no full collections while start-up builds its long-lived objects."""
    if gc.isenabled():
        gc.disable()
        _COLLECTOR["paused"] = True


def end_collector_pause() -> None:
    """The run loop starts: the collector runs again (if ``pause_collector`` paused it), over new objects only."""
    if _COLLECTOR["paused"]:
        _COLLECTOR["paused"] = False
        gc.freeze()
        gc.enable()


def settle_collector_for_exit() -> None:
    """Right before the process exits: freeze everything, so the interpreter's last collection skips it; where a
    nanobind extension is loaded (Triton's), unfreeze instead: nanobind reports each of its objects still alive at
    exit as a leak, a screen of stderr."""
    if "triton" in sys.modules:
        gc.unfreeze()
    else:
        gc.freeze()
