"""`python -m train ...`: the command line (train/cli/)."""

import sys

from train.cli import main

sys.exit(main())
