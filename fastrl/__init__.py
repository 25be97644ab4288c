"""fastrl: fast, correct PPO / A2C / IMPALA on EnvPool.

Entry points: ``python -m fastrl.train``, the ``fastrl`` console script, and the Python API::

    import fastrl
    run = fastrl.train(env="CartPole-v1", total_steps=50_000)    # -> Run(run_dir, summary, agent)
    agent = fastrl.load(run.run_dir)                              # -> Agent: act(obs), predict(obs), evaluate(), save(path), learn(steps)
    returns = fastrl.evaluate(run.run_dir, episodes=10)           # numpy [seeds * episodes]

``fastrl.train`` takes every config key as a typed keyword (``help(fastrl.train)``); ``fastrl.Config`` is the typed
config itself. The names below are imported on first use, so ``import fastrl`` stays light (no torch until then).
"""
import importlib
import importlib.util
import sys
import types

# name -> the module that defines it
_LAZY = {
    "train": "fastrl.api",
    "load": "fastrl.api",
    "evaluate": "fastrl.api",
    "Run": "fastrl.api",
    "Agent": "fastrl.api",
    "Config": "fastrl.config",
    "UserError": "fastrl.config",
    "EvalCallback": "fastrl.callbacks",
    "StopOnReturn": "fastrl.callbacks",
    "register_env_factory": "fastrl.envs",
    "to_torchrl": "fastrl.torchrl_adapter",
    "Collector": "fastrl.collector",
}
__all__ = ["__version__", "train", "load", "evaluate", "Run", "Agent", "Config", "UserError", "EvalCallback",
           "StopOnReturn", "register_env_factory", "to_torchrl", "Collector"]
# fastrl.train and fastrl.evaluate are the API's functions, though modules of those names exist (the command's
# ``python -m fastrl.train``, the evaluation code): importing such a module must not replace the function here.
_FUNCTIONS_OVER_MODULES = ("train", "evaluate")


def _version() -> str:
    """The installed distribution's version (pyproject.toml's, the one source); in a source checkout that was never
    installed, pyproject.toml's own line."""
    from importlib import metadata
    try:
        return metadata.version("fastrl")
    except metadata.PackageNotFoundError:
        import re
        from pathlib import Path
        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        found = re.search(r'^version = "([^"]+)"', pyproject.read_text(), re.M) if pyproject.is_file() else None
        return found.group(1) if found else "unknown"


def __getattr__(name: str):
    if name == "__version__":
        value = globals()["__version__"] = _version()
        return value
    if name not in _LAZY:
        if not name.startswith("_") and importlib.util.find_spec(f"fastrl.{name}") is not None:
            return importlib.import_module(f"fastrl.{name}")  # a submodule, e.g. fastrl.callbacks.EvalCallback
        raise AttributeError(f"module 'fastrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | {"__version__"})


class _Package(types.ModuleType):
    def __setattr__(self, name, value):
        if name in _FUNCTIONS_OVER_MODULES and isinstance(value, types.ModuleType):
            return  # ``import fastrl.train`` binds the module here: the function keeps the name
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
