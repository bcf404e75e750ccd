"""The `precision` command line: `formats`, `convert`, `report` and `demo`.

`_main` parses arguments and dispatches, `_convert_command` and `_report` hold the
two checkpoint commands, `_output` their shared table and error helpers, and
`_demo` the training demo. Importing this package loads none of them: `main`
first starts recording Ctrl-C (when it runs as the program), then loads them.
"""

from __future__ import annotations

from ._interrupts import record_from_start

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the `precision` command line with `argv` (default: sys.argv[1:]).

    Returns the exit status: 0 success, 1 data error, 2 usage error, 130
    interrupted. JAX is imported only once the arguments are parsed.

    Examples:
        >>> main(["formats"])  # doctest: +ELLIPSIS
        format ...
        0
    """
    if argv is None:  # the program: a Ctrl-C while the modules below load is recorded
        record_from_start()
    from ._main import main as run

    return run(argv)
