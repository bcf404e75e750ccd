"""Exact arithmetic on a float format's grid, shared by the strategies and assertions.

Every non-negative finite value of a binary float layout has a *magnitude
code*: its bit pattern with the sign bit cleared. Codes are monotone in the
value (0 is +0, `2**m` is the smallest normal, `max_code` is the largest
finite value), so a code is also the value's index on the grid. Everything
here is computed in float64 and Python ints, which hold every value of a
format with at most 8 exponent and 23 mantissa bits exactly.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from dtypes import FloatFormat, float32

__all__ = ["data_grid", "decode_magnitude", "max_code", "ordinals"]


def data_grid(fmt: FloatFormat) -> FloatFormat:
    """The grid strategies draw float32 data from: `fmt`, or float32 for wider formats."""
    return float32 if fmt.exponent_bits > 8 else fmt


def max_code(fmt: FloatFormat) -> int:
    """Magnitude code of `fmt.max`, the largest finite value."""
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    if not fmt.finite:
        return (((1 << e) - 2) << m) | ((1 << m) - 1)  # the all-ones exponent is inf/NaN
    if fmt.nan:
        return (1 << (e + m)) - 2  # all ones is the one NaN code
    return (1 << (e + m)) - 1


def decode_magnitude(fmt: FloatFormat, code: int) -> float:
    """The value of magnitude code `code` (0 <= code <= max_code), exactly."""
    m = fmt.mantissa_bits
    exponent_field, mantissa = code >> m, code & ((1 << m) - 1)
    if exponent_field == 0:
        return math.ldexp(mantissa, fmt.emin - m)
    return math.ldexp((1 << m) | mantissa, exponent_field - fmt.bias - m)


def ordinals(x: npt.ArrayLike, fmt: FloatFormat) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Position of each finite `x` on `fmt`'s grid: (negative, index, fraction).

    `|x|` lies `fraction` (in [0, 1)) of the way from the grid value with
    magnitude code `index` to the next one; on-grid values have fraction 0.
    Beyond `fmt.max` the grid is continued as if the exponent were unbounded,
    so distances just past the top stay meaningful. Non-finite entries get
    index 0 and fraction 0; callers handle them first.
    """
    x = np.asarray(x, np.float64)
    a = np.abs(np.where(np.isfinite(x), x, 0.0))
    m = fmt.mantissa_bits
    _, exp = np.frexp(a)  # a = f * 2**exp with f in [0.5, 1); frexp(0) gives exp 0
    binade = np.where(a == 0, fmt.emin, np.maximum(exp.astype(np.int64) - 1, fmt.emin))
    scaled = np.ldexp(a, (m - binade).astype(np.int32))  # |x| in units of its spacing: exact
    whole = np.floor(scaled)
    index = (binade - fmt.emin) * (1 << m) + whole.astype(np.int64)
    return np.signbit(x), index, scaled - whole
