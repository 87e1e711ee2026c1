"""`python -m train ...`: the command line (train/cli.py)."""

import sys

from train.cli import main

sys.exit(main())
