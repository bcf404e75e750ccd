"""`python -m precision`: the `precision` command line."""

import sys

from ._cli import main

sys.exit(main())
