"""Names of code in a config (``module:QualName`` or ``path/to/file.py:QualName``), resolved in one place.

``resolve_name`` is the only function in fastrl that imports a module a config names, whatever the key (``env``,
``policy``: the fields whose metadata has ``code=True``, ``CODE_KEYS``). Names are resolved only when the user gave
them in this process: a flag, a YAML config or tune space the user passes, a keyword of the Python API. A config read
back from a file (a checkpoint, ``--resume``) goes through ``checkpoint.checkpoint_config`` first, which refuses any
code key whose value names code unless the user passed that key, so a file alone never makes fastrl import or call.

An env name must build an env, and is checked before anything is called (``check_env_factory``): a class must
subclass ``gymnasium.Env``; any other callable must be a function that takes no required argument (so ``os:system``
is refused without being called), and what it returns must be a ``gymnasium.Env`` (``envs.make_checked_env``).
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys
from pathlib import Path

from fastrl.config import UserError, brief
from fastrl.errors import first_line


def names_code(value) -> bool:
    """Whether a config value has the form of a code name (``module:Name``, ``file.py:Name``)."""
    return isinstance(value, str) and ":" in value


def import_target(name: str, key: str):
    """``(module, qualname)`` for ``name``: ``path/to/file.py:QualName`` imports the file as the module of its stem
    with its directory importable (as ``python path/to/file.py`` would); ``module:QualName`` imports ``module`` with
    the current directory importable (as ``python -m`` would). One-line UserError when the import fails."""
    target, _, qualname = name.rpartition(":")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise UserError(f"{key} {brief(name)}: no file {brief(target)}; name an existing .py file "
                            "(path/to/file.py:Name)")
        directory, module_name = str(path.parent), path.stem
    else:
        directory, module_name = os.getcwd(), target
    if directory not in sys.path:
        sys.path.insert(0, directory)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001  (whatever the module raises, the user's fix is the same)
        raise UserError(f"{key} {brief(name)}: importing module {brief(module_name)} failed ({type(e).__name__}: "
                        f"{brief(first_line(e), 120)}); put it in the current directory or on PYTHONPATH, or fix the "
                        "name") from None
    if target.endswith(".py") and Path(getattr(module, "__file__", "") or "").resolve() != path:
        raise UserError(f"{key} {brief(name)}: module name {module_name!r} is already taken by "
                        f"{getattr(module, '__file__', None) or 'a built-in module'}; rename the file")
    return module, qualname


def resolve_name(name: str, key: str):
    """The object ``name`` (``module:QualName`` or ``path/to/file.py:QualName``, see ``import_target``) names, for
    config key ``key``; a one-line UserError when it cannot be imported or found."""
    module, qualname = import_target(name, key)
    found = attribute(module, qualname)
    if found is None:
        raise UserError(f"{key} {brief(name)}: module {module.__name__!r} has no {qualname!r}; name a module-level "
                        "class or function")
    return found


def attribute(module, qualname: str):
    """``module.qualname`` (dotted), or None."""
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def check_env_factory(obj, name: str):
    """``obj`` if it can build an env without running anything else first: a ``gymnasium.Env`` subclass, or a
    function (or other non-class callable) callable with no arguments; else a one-line UserError. What a function
    returns is checked where it is called (``envs.make_checked_env``)."""
    import gymnasium
    fix = "name a gymnasium.Env subclass or a zero-argument factory (a function that returns one)"
    if isinstance(obj, type):
        if not issubclass(obj, gymnasium.Env):
            raise UserError(f"env {brief(name)} is the class {obj.__qualname__}, not a gymnasium.Env subclass; {fix}")
        return obj
    if not callable(obj):
        raise UserError(f"env {brief(name)} is a {type(obj).__name__}, not a class or function; {fix}")
    try:
        inspect.signature(obj).bind()
    except (TypeError, ValueError):  # required arguments, or a builtin whose signature is unknown
        raise UserError(f"env {brief(name)} cannot be called with no arguments, so it builds no env; {fix}") from None
    return obj
