"""`python -m precision`: the `precision` command line (the console script's entry point,
which records Ctrl-C from its first line)."""

import sys

from _precision_cli import main

sys.exit(main())
