"""``import tensordict`` without importing ``torch._dynamo`` (about a second of start-up) in a run that compiles nothing.

At import, TensorDict registers a few functions with the compiler (``torch.compiler.allow_in_graph`` for functorch's
batch-dim ops and ``_foreach_copy_``, ``assume_constant_result`` for two helpers), and each of those calls imports
``torch._dynamo``. Both only mark the function they are given and return it unchanged, so the marks can wait: while
TensorDict imports they are recorded, and they are applied the moment ``torch._dynamo`` is imported (by
``torch.compile`` or anything else), before anything could be compiled. A process that never compiles never loads it.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

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
