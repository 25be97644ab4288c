import sys

from fastrl.cli import main

sys.exit(main())
