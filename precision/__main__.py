"""`python -m precision`: the `precision` command line.

Python imports this package's `__init__` (which imports nothing) and then runs
this module; its first lines record Ctrl-C, as the console script's entry
module does, so that one landing while that module loads is not a traceback.
"""

import _signal  # type: ignore[import-not-found]  # the C module: `signal` imports enum

_early: list[int] = []
_signal.signal(_signal.SIGINT, lambda signum, frame: _early.append(signum))

import sys  # noqa: E402  (after the handler, on purpose)

import _precision_cli  # noqa: E402  (its import installs its own recording handler)

_precision_cli._received.extend(_early)
sys.exit(_precision_cli.main())
