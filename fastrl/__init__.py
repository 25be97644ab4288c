"""fastrl: fast, correct PPO / A2C / IMPALA on EnvPool.

Entry points: ``python -m fastrl.train``, the ``fastrl`` console script, and the Python API::

    import fastrl
    run = fastrl.train(env="CartPole-v1", total_steps=50_000)    # -> Run(run_dir, summary, agent)
    agent = fastrl.load(run.run_dir)                              # -> Agent: act(obs), predict(obs), evaluate(), save(path), learn(steps)

The names below are imported on first use, so ``import fastrl`` stays light (no torch until then).
"""
import importlib
import importlib.util

__version__ = "0.1.0"

# name -> the module that defines it ("fastrl.train" is itself the callable train(); see fastrl/train.py)
_LAZY = {
    "train": "fastrl.train",
    "load": "fastrl.api",
    "Run": "fastrl.api",
    "Agent": "fastrl.api",
    "UserError": "fastrl.config",
    "EvalCallback": "fastrl.callbacks",
    "StopOnReturn": "fastrl.callbacks",
    "register_env_factory": "fastrl.envs",
    "to_torchrl": "fastrl.torchrl_adapter",
    "Collector": "fastrl.collector",
}
__all__ = ["__version__", "train", "load", "Run", "Agent", "UserError", "EvalCallback", "StopOnReturn",
           "register_env_factory", "to_torchrl", "Collector"]


def __getattr__(name: str):
    if name not in _LAZY:
        if not name.startswith("_") and importlib.util.find_spec(f"fastrl.{name}") is not None:
            return importlib.import_module(f"fastrl.{name}")  # a submodule, e.g. fastrl.callbacks.EvalCallback
        raise AttributeError(f"module 'fastrl' has no attribute {name!r}")
    module = importlib.import_module(_LAZY[name])
    value = module if name == "train" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
