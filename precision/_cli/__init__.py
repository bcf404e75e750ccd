"""The `precision` command line: `formats`, `convert`, `report` and `demo`.

`_main` parses arguments and dispatches, `_convert` and `_report` hold the
two checkpoint commands, `_output` their shared table and error helpers, and
`_demo` the training demo.
"""

from ._main import main as main

__all__ = ["main"]
