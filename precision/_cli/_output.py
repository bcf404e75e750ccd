"""What the `precision` command line prints: its name, its one-line errors, its tables.

`_DataError` and `_UsageError` are raised by the subcommands and reported
by `main` (in `_cli`) as one line on stderr with exit status 1 or 2.
"""

from __future__ import annotations

import math

PROG = "precision"


class _DataError(Exception):
    """A problem with the data (exit status 1), reported as one line."""


class _UsageError(Exception):
    """Flags that cannot go together (exit status 2), reported as one line."""


# --------------------------------------------------------------------------
# helpers


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def _table(rows: list[list[str]], header: list[str], right: set[int]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def _fmt_db(x: float) -> str:
    return "inf" if x == math.inf else ("-inf" if x == -math.inf else f"{x:.2f}")
