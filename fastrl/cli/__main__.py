import sys

from fastrl.cli import entry

sys.exit(entry())
