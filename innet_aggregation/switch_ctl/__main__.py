"""`python -m innet_aggregation.switch_ctl`: the switch-ctl command line (cli.py)."""

import sys

from .cli import main

sys.exit(main())
