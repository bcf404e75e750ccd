"""Property-testing kit: hypothesis strategies, ULP assertions and error metrics.

Test your own numerics against our formats: draw data weighted toward each
format's hard cases, compare results in units of the format's spacing, and
run a test over every format with the `fmt` fixture of the pytest plugin.

Names load on first use, because pytest imports this package (for its
plugin) in every session: a test run that never asks for a strategy pays
neither for hypothesis nor for JAX.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._assertions import assert_representable as assert_representable
    from ._assertions import assert_ulp_close as assert_ulp_close
    from ._assertions import ulp_distance as ulp_distance
    from ._metrics import ErrorReport as ErrorReport
    from ._metrics import error_report as error_report
    from ._metrics import relative_error as relative_error
    from ._metrics import sqnr_db as sqnr_db
    from ._strategies import arrays as arrays
    from ._strategies import formats as formats
    from ._strategies import keys as keys
    from ._strategies import representable as representable
    from ._strategies import roundings as roundings
    from ._strategies import scalings as scalings
    from ._strategies import tensors as tensors
    from ._strategies import values as values

_HOME = {
    "ErrorReport": "_metrics",
    "arrays": "_strategies",
    "assert_representable": "_assertions",
    "assert_ulp_close": "_assertions",
    "error_report": "_metrics",
    "formats": "_strategies",
    "keys": "_strategies",
    "relative_error": "_metrics",
    "representable": "_strategies",
    "roundings": "_strategies",
    "scalings": "_strategies",
    "sqnr_db": "_metrics",
    "tensors": "_strategies",
    "ulp_distance": "_assertions",
    "values": "_strategies",
}

__all__ = [
    "ErrorReport",
    "arrays",
    "assert_representable",
    "assert_ulp_close",
    "error_report",
    "formats",
    "keys",
    "relative_error",
    "representable",
    "roundings",
    "scalings",
    "sqnr_db",
    "tensors",
    "ulp_distance",
    "values",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
