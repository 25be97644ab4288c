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

Without JAX installed (the default install) ``import_envpool`` saves nothing and costs nothing. Measured at the same
time and removed: a collector paused for the start-up and frozen before the exit (saving 1.11 / 0.08 s) and
``envpool.jumanji``'s code deferred to the first Jumanji env (1.21 / 0.14 s): not clearly above 0.3 s, nor
obviously above 1 s. A trick that saves less than 0.3 s is not kept. None of this changes what a run computes.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

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
    alone, and JAX imports normally afterwards."""
    if "envpool" in sys.modules:
        return sys.modules["envpool"]
    blocked = "jax" not in sys.modules
    if blocked:
        sys.modules["jax"] = None  # a None entry makes `import jax` raise ImportError
    try:
        import envpool
    finally:
        if blocked and "jax" in sys.modules and sys.modules["jax"] is None:
            del sys.modules["jax"]
    return envpool
