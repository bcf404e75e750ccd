"""Error metrics between a reference and an approximation, and a small report of them.

All computed on the host in float64 over concrete values.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

import dtypes
from dtypes import Format

from ._assertions import _as_float_array, _broadcast, ulp_distance

__all__ = ["ErrorReport", "error_report", "relative_error", "sqnr_db"]


def _pair(ref: Any, approx: Any) -> tuple[np.ndarray, np.ndarray]:
    r = _as_float_array(ref, "ref").astype(np.float64)
    a = _as_float_array(approx, "approx").astype(np.float64)
    r, a = _broadcast(r, a, "ref", "approx")
    return r, a


def _log10_sum_squares(x: np.ndarray) -> float:
    """log10(Σ x²) of finite values, scaled so the squares neither overflow nor underflow."""
    top = float(np.max(np.abs(x), initial=0.0))
    if top == 0:
        return -math.inf
    return 2 * math.log10(top) + math.log10(float(np.sum((x / top) ** 2)))


def sqnr_db(ref: Any, approx: Any) -> float:
    """Signal-to-quantization-noise ratio in decibels, `10 log10(Σ ref² / Σ (ref - approx)²)`.

    inf when `approx` equals `ref` exactly (including both all zero); -inf
    when `ref` is all zero and `approx` is not. NaN or inf in either input
    gives NaN. Computed from scaled sums, so huge and tiny inputs are exact
    to rounding.

    Examples:
        >>> sqnr_db([1.0, -1.0], [1.0, -1.0])
        inf
        >>> round(sqnr_db([1.0, 1.0], [1.1, 0.9]), 3)
        20.0
        >>> round(sqnr_db([1e300, 1e300], [0.0, 0.0]), 3)
        0.0
    """
    r, a = _pair(ref, approx)
    if not (np.all(np.isfinite(r)) and np.all(np.isfinite(a))):
        return math.nan
    signal = _log10_sum_squares(r)
    with np.errstate(over="ignore"):
        error = r - a
    if np.all(np.isfinite(error)):
        noise = _log10_sum_squares(error)
    else:  # ref - approx overflowed: work with halves
        noise = _log10_sum_squares(r / 2 - a / 2) + math.log10(4.0)
    if noise == -math.inf:
        return math.inf
    return 10.0 * (signal - noise)


def relative_error(ref: Any, approx: Any) -> np.ndarray:
    """Elementwise `|approx - ref| / |ref|` in float64.

    Where `ref` is 0 the error is 0 if `approx` is 0 too, else inf. NaN in
    either input gives NaN there.

    Examples:
        >>> relative_error([2.0, 0.0, 0.0], [2.5, 0.0, 1.0])
        array([0.25, 0.  ,  inf])
    """
    r, a = _pair(ref, approx)
    with np.errstate(over="ignore"):
        diff = np.abs(a - r)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rel = diff / np.abs(r)
    rel = np.where(r == 0, np.where(diff == 0, 0.0, np.inf), rel)
    return np.where(np.isnan(r) | np.isnan(a), np.nan, rel)


# ULP histogram buckets: exact counts for 0, 1 and 2 steps, then powers of two.
_BUCKETS = ((0, 0), (0, 1), (1, 2), (2, 4), (4, 8), (8, 16), (16, 256), (256, math.inf))


def _bucket_label(lo: float, hi: float) -> str:
    if hi == 0:
        return "0"
    return f">{lo:g}" if math.isinf(hi) else f"({lo:g}, {hi:g}]"


@dataclasses.dataclass(frozen=True)
class ErrorReport:
    """How far an approximation is from its reference (see `error_report`).

    Attributes:
        size: number of compared elements.
        max_abs_error: largest `|approx - ref|`.
        mean_abs_error: mean `|approx - ref|`.
        max_rel_error: largest `relative_error`.
        mean_rel_error: mean `relative_error`.
        sqnr_db: `sqnr_db(ref, approx)`.
        format_name: the format the ULP histogram counts in, or None.
        ulp_histogram: `(bucket label, count)` pairs of `ulp_distance`
            (empty without a format); buckets are "0", "(0, 1]", "(1, 2]",
            then powers of two.
        nonfinite: elements where `ref` or `approx` is NaN or inf; they are
            left out of every error above except the histogram.
    """

    size: int
    max_abs_error: float
    mean_abs_error: float
    max_rel_error: float
    mean_rel_error: float
    sqnr_db: float
    format_name: str | None = None
    ulp_histogram: tuple[tuple[str, int], ...] = ()
    nonfinite: int = 0

    def __str__(self) -> str:
        head = f"error report: {self.size} values"
        if self.format_name:
            head += f", ULPs of {self.format_name}"
        lines = [
            head,
            f"  max abs error   {self.max_abs_error:.6g}",
            f"  mean abs error  {self.mean_abs_error:.6g}",
            f"  max rel error   {self.max_rel_error:.6g}",
            f"  mean rel error  {self.mean_rel_error:.6g}",
            f"  SQNR            {self.sqnr_db:.2f} dB",
        ]
        if self.nonfinite:
            lines.append(f"  non-finite      {self.nonfinite} (left out of the errors)")
        if self.ulp_histogram:
            lines.append("  ULP distance    count")
            width = max(len(label) for label, _ in self.ulp_histogram)
            lines += [f"    {label:<{width}}  {count}" for label, count in self.ulp_histogram]
        return "\n".join(lines)


def error_report(ref: Any, approx: Any, fmt: Format | str | None = None) -> ErrorReport:
    """Summarize the error of `approx` against `ref` (and in ULPs of `fmt`, if given).

    Examples:
        >>> import dtypes
        >>> ref = [1.0, 2.0, 3.0, 4.0]
        >>> print(error_report(ref, [1.0, 2.0, 3.0, 4.03125], dtypes.bfloat16))
        error report: 4 values, ULPs of bfloat16
          max abs error   0.03125
          mean abs error  0.0078125
          max rel error   0.0078125
          mean rel error  0.00195312
          SQNR            44.87 dB
          ULP distance    count
            0       3
            (0, 1]  1
    """
    r, a = _pair(ref, approx)
    finite = np.isfinite(r) & np.isfinite(a)
    rf, af = r[finite], a[finite]
    with np.errstate(over="ignore"):
        abs_err = np.abs(af - rf)
    rel_err = relative_error(rf, af)
    hist: tuple[tuple[str, int], ...] = ()
    name = None
    if fmt is not None:
        f = dtypes.get(fmt)
        name = f.name
        d = ulp_distance(a, r, f)
        counts = []
        for lo, hi in _BUCKETS:
            n = int(np.sum(d == 0)) if hi == 0 else int(np.sum((d > lo) & (d <= hi)))
            if n:
                counts.append((_bucket_label(lo, hi), n))
        hist = tuple(counts)

    def stat(values: np.ndarray, how: Callable[[np.ndarray], Any]) -> float:
        return float(how(values)) if values.size else 0.0

    return ErrorReport(
        size=int(r.size),
        max_abs_error=stat(abs_err, np.max),
        mean_abs_error=stat(abs_err, np.mean),
        max_rel_error=stat(rel_err, np.max),
        mean_rel_error=stat(rel_err, np.mean),
        sqnr_db=sqnr_db(rf, af),
        format_name=name,
        ulp_histogram=hist,
        nonfinite=int(np.sum(~finite)),
    )
