"""Start-up costs that fastrl pays differently from a plain import, all of them here, each with its measured saving.

Measured on the 2-core shared CPU machine (WHEN, load LOAD): process wall seconds of
``python -m fastrl.train --total-steps 2048 --eval-episodes 0 --wandb disabled --tensorboard false --plot false
--run-dir /tmp/x --overwrite``, median of 3 interleaved runs each, with everything below and without one of them:

FIGURES

A trick that saves less than 0.3 s there is not kept. None of this changes what a run computes.
"""
from __future__ import annotations

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


# --------------------------------------------------------------------------- EnvPool without JAX and Jumanji's code
def import_envpool():
    """``import envpool``, without two imports EnvPool makes that fastrl's runs rarely need:

    - JAX, for EnvPool's optional XLA interface, which fastrl never uses (about 1.5 s of start-up where JAX is
      installed): while EnvPool loads, ``import jax`` fails, which EnvPool takes as "no XLA". A JAX the process
      already imported is left alone, and JAX imports normally afterwards.
    - the body of ``envpool.jumanji`` (its renderer imports matplotlib.pyplot, about 0.4 s): registering the Jumanji
      ids needs only the package's path, so the package is built empty and runs its own code on first use
      (``_DeferredPackage``), which is when EnvPool makes a Jumanji env."""
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
    parent, _, _ = name.rpartition(".")
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


# --------------------------------------------------------------------------- the collector during start-up
# Start-up (importing torch and EnvPool, building the trainer) makes about a million objects that live as long as the
# process, and no garbage: Python's full collections among them free nothing, and the interpreter's last collection
# at exit walks them all again. So when fastrl.train's main is the process (``python -m fastrl.train``, ``fastrl
# train``: ``run_as_process``), the collector pauses until the run loop starts, what exists then is frozen
# (``gc.freeze``: later full collections skip it), and everything is frozen again before the exit (where Triton's
# nanobind bindings are loaded, everything is unfrozen instead: ``settle_collection_for_exit``). Called from Python
# (tests, the API), main changes nothing about the caller's collector.
_STARTUP_GC = {"paused": False}


def _nanobind_loaded() -> bool:
    """Whether a nanobind extension is loaded (Triton's, which torchrl and parts of torch import). nanobind reports
    every object of its own still alive at exit as a leak, a screen of stderr, and frozen objects are never collected;
    its objects can also end up held by containers frozen before it loaded."""
    return "triton" in sys.modules


def settle_collection_for_exit() -> None:
    """Right before the process exits: freeze everything, so the interpreter's last collection skips it; where nanobind
    is loaded, unfreeze everything instead, so that collection frees its objects as it would have."""
    import gc
    if _nanobind_loaded():
        gc.unfreeze()
    else:
        gc.freeze()


def pause_collector() -> None:
    """The process's work starts (``fastrl.train.run_as_process``): no cyclic collection until the run loop."""
    import gc
    if gc.isenabled():
        gc.disable()
        _STARTUP_GC["paused"] = True


def end_startup_gc_pause() -> None:
    """The run loop starts: the collector runs again (if ``pause_collector`` paused it), over new objects only."""
    if _STARTUP_GC["paused"]:
        import gc
        _STARTUP_GC["paused"] = False
        gc.freeze()
        gc.enable()


