"""fastrl: fast, correct PPO / A2C / IMPALA on EnvPool. Entry points: ``python -m fastrl.train`` and ``fastrl``."""
__version__ = "0.1.0"
