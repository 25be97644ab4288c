"""fastrl: fast, correct PPO / A2C / IMPALA on EnvPool.

Entry points: ``python -m fastrl.train``, the ``fastrl`` console script, and the Python API::

    import fastrl
    run = fastrl.train(env="CartPole-v1", total_steps=50_000)    # -> Run(run_dir, summary, agent)
    agent = fastrl.load(run.run_dir)                              # -> Agent: act(obs), predict(obs), evaluate(), save(path), learn(steps)
    returns = fastrl.evaluate(run.run_dir, episodes=10)           # numpy [seeds * episodes]

``fastrl.train`` takes every config key as a typed keyword (``help(fastrl.train)``); ``fastrl.Config`` is the typed
config itself. The names below are imported on first use, so ``import fastrl`` stays light (no torch until then).

The map: data flows left to right, and a package imports only those to its left (``fastrl.kernels``: torch only)::

    config -> envs -> learn -> distributed -> run -> export, api, collector -> cli, train
    config.py     the typed Config; beside it defaults, errors, names, signals, hints, bounded_yaml, _startup
    envs/         EnvPool, Gymnasium, TorchRL and torch-native envs, their spaces, the rollout buffer they fill
    learn/        models, losses, optimizers, the pure update (given envs' observation shapes and action specs)
    distributed/  torchrun ranks, IMPALA/APPO actor processes and Ray actors, async collection, seeds
    run/          the iteration, the trainers, the loop, checkpoints, run dirs, logging, evaluation;
                  session.run(cfg) is one run whatever the door
    export.py     the policy of raw observations (RawPolicy, which Agent.act runs) as an ONNX or TorchScript file
    api.py        train / load / evaluate / Agent; collector.py: TorchRL's Collector over a Trainer
    cli/          fastrl train | eval | export | tune | plot; train.py is ``python -m fastrl.train``
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
    "EvalCallback": "fastrl.run.callbacks",
    "StopOnReturn": "fastrl.run.callbacks",
    "register_env_factory": "fastrl.envs.registry",
    "to_torchrl": "fastrl.envs.torchrl_adapter",
    "Collector": "fastrl.collector",
}
__all__ = ["__version__", *_LAZY]
# fastrl.train is the API's function, though a module of that name exists (the command's ``python -m fastrl.train``):
# importing that module must not replace the function here.


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
            return importlib.import_module(f"fastrl.{name}")  # a subpackage, e.g. fastrl.run
        raise AttributeError(f"module 'fastrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | {"__version__"})


class _Package(types.ModuleType):
    def __setattr__(self, name, value):
        if name == "train" and isinstance(value, types.ModuleType):
            return  # ``import fastrl.train`` binds the module here: the function keeps the name
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
