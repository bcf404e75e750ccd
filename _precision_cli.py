"""The `precision` command's entry point: it records Ctrl-C from its first line.

A top-level module, so that the console script imports nothing before the
handler below is in place (importing the `precision` package and its command
line takes tens of milliseconds, and a KeyboardInterrupt raised in the middle
of those imports printed a traceback). Only the console script imports it.
"""

import _signal  # type: ignore[import-not-found]  # the C module: `signal` imports enum

_received: list[int] = []
_signal.signal(_signal.SIGINT, lambda signum, frame: _received.append(signum))


def main() -> int:
    """Run the command line as the program, acting on a Ctrl-C that came while it loaded."""
    from precision._cli._interrupts import record_from_start

    record_from_start(received=_received)
    from precision._cli._main import main as run

    return run()
