"""What the `precision` command line prints: its name, its one-line errors, its tables.

The subcommands raise the errors of `precision._errors` (a `UsageError` for
flags that cannot go together), `OSError`s, and `ModuleNotFoundError` for an
optional package (`_require`); `main` (in `_main`) reports each as one line on
stderr with exit status 2 for a `UsageError`, 1 for the rest. `_progress` is the
progress bar, drawn only on a terminal.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import Any

PROG = "precision"

_SEED_LIMIT = 2**63


def seed_argument(text: str) -> int:
    """An argparse `type=` for `--seed`: an integer in [0, 2**63)."""
    try:
        seed = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad seed {text!r}; give an integer") from None
    if not 0 <= seed < _SEED_LIMIT:
        raise argparse.ArgumentTypeError(
            f"seed {text} is out of range; give an integer from 0 to 2**63 - 1"
        )
    return seed


def _require(module: str, what: str) -> Any:
    """Import `module`, or raise `ModuleNotFoundError` naming the extra that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".")[0]
        raise ModuleNotFoundError(
            f"{what} needs the {top} package; install it with pip install 'precision[cli]'",
            name=top,
        ) from None


# --------------------------------------------------------------------------
# helpers


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def _natural_key(name: str) -> list[Any]:
    """Sort key putting h.2 before h.10 (digit runs compare as numbers)."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name) if p]


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


class _NoBar:
    """What `_progress` gives when no bar is drawn."""

    def update(self, n: int) -> None:
        pass

    def set_postfix_str(self, s: str, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, quiet: bool, desc: str, unit: str = "B") -> Any:
    """A tqdm bar on stderr when stderr is a terminal, not `quiet` and tqdm installed."""
    if quiet or not sys.stderr.isatty():
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a convenience: without tqdm, no bar
        return _NoBar()
    scaled = unit == "B"
    return tqdm(
        total=total,
        unit=unit,
        unit_scale=scaled,
        unit_divisor=1024 if scaled else 1000,
        file=sys.stderr,
        desc=desc,
        leave=False,
    )
