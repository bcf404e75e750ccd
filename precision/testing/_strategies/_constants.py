"""Constants and argument checks the strategies share."""

import numbers
from typing import Any

import numpy as np

from dtypes import PrecisionTypeError

from ..._errors import KitError

_KINDS = ("float", "int")
# Integer-format data is drawn at a power-of-two scale 2**k, k in this range
# (k = 0 first when shrinking): wide enough to matter, narrow enough that
# every code times the scale is a normal float32.
_INT_SCALE_EXPONENTS = (-8, 8)

Shape = int | tuple[int, ...]


def _check_flag(value: Any, name: str, where: str) -> bool:
    """A True/False argument: anything else (a string is truthy) is refused."""
    if not isinstance(value, bool | np.bool_):
        raise PrecisionTypeError(
            f"{where}: {name} must be True or False, got {type(value).__name__} {value!r:.60}; "
            f"pass e.g. {name}=False"
        )
    return bool(value)


def _check_count(value: Any, name: str, where: str, *, least: int = 0) -> int:
    """An integer argument of at least `least` (bools and floats are refused)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral):
        raise PrecisionTypeError(
            f"{where}: {name} must be an int, got {type(value).__name__} {value!r:.60}; pass "
            f"e.g. {name}={max(least, 1)}"
        )
    if value < least:
        raise KitError(
            f"{where}: {name} must be at least {least}, got {value!r}; pass e.g. "
            f"{name}={max(least, 1)}"
        )
    return int(value)
