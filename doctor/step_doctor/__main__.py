"""`python -m step_doctor ...`: the command line (step_doctor/cli.py)."""

import sys

from step_doctor.cli import main

sys.exit(main())
