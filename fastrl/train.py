"""``python -m fastrl.train``: the ``fastrl train`` command (``fastrl.cli.train.main``) as a script, as nanoGPT's
``train.py`` is one; ``torchrun -m fastrl.train`` runs it on every rank.

The Python API's ``fastrl.train(env=..., **config_keys)`` is ``fastrl.api.train``: the package keeps that function
under the name ``fastrl.train`` when this module is imported (see ``fastrl/__init__.py``).
"""
import os
import signal
import sys

from fastrl.signals import STOP_SIGNALS, run_as_process, stopped_during_startup


def _interrupted_while_importing(signum, _frame):
    """A Ctrl-C (SIGTERM, SIGHUP) among the imports, before ``main`` takes over, has nothing to save."""
    sys.stderr.write(f"fastrl: {stopped_during_startup(signum)}\n")
    sys.stderr.flush()
    os._exit(128 + signum)


if __name__ == "__main__":
    for _signum in STOP_SIGNALS:
        signal.signal(_signum, _interrupted_while_importing)

from fastrl.cli.train import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_as_process(main))
