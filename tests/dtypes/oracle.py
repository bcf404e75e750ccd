"""An exact rational oracle for float rounding, written from the IEEE-754 definitions.

Nothing here imports `dtypes`, numpy's float types beyond reading a float32
input, or `reference.py`: a layout is four plain numbers, every value is a
`fractions.Fraction`, and rounding is done on the real number line the way
IEEE-754 (§4.3, §7.4) defines it:

* a finite layout value is `(-1)**s * 2**(E - bias) * (1 + M / 2**m)` for a
  biased exponent field E >= 1, and `(-1)**s * 2**(emin) * (M / 2**m)` for E = 0
  (subnormals), with `bias = 2**(e - 1) - 1` and `emin = 1 - bias`;
* IEEE-style layouts (`finite=False`) spend the all-ones exponent on ±inf
  and NaN; finite layouts use it for numbers, except the all-ones code (NaN)
  when they keep a NaN;
* a real x is rounded to one of its two neighbours on the grid *of unbounded
  exponent* (the quantum at |x| is `2**(max(floor(log2|x|), emin) - m)`);
  a result beyond the layout's max is an overflow: ±inf (IEEE), NaN
  (finite layouts with a NaN, where IEEE gives inf), ±max (saturating
  layouts, and finite layouts without NaN); `toward_zero` and the directed
  mode pointing back to zero give ±max;
* ±0 keep their sign, NaN stays NaN.

`stochastic` is described by `stochastic_choices`: the two possible results
and the probability of the one farther from zero.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple

import numpy as np

__all__ = [
    "INF",
    "NAN",
    "Spec",
    "exact",
    "largest",
    "round_exact",
    "smallest_subnormal",
    "stochastic_choices",
    "to_float",
]

INF = "inf"
NAN = "nan"

DIRECTED = ("toward_zero", "up", "down")


class Spec(NamedTuple):
    """A binary layout: exponent and mantissa bits, and how it spends its top codes."""

    e: int
    m: int
    finite: bool = False
    nan: bool = True
    saturate: bool = False

    @property
    def bias(self) -> int:
        return 2 ** (self.e - 1) - 1

    @property
    def emin(self) -> int:
        return 1 - self.bias


def largest(spec: Spec) -> Fraction:
    """The largest finite value, from the top usable code."""
    top_exponent_field = 2**spec.e - 1 if spec.finite else 2**spec.e - 2
    top_mantissa_field = 2**spec.m - 1
    if spec.finite and spec.nan:
        top_mantissa_field -= 1  # the all-ones code is NaN
    return (1 + Fraction(top_mantissa_field, 2**spec.m)) * Fraction(2) ** (
        top_exponent_field - spec.bias
    )


def smallest_subnormal(spec: Spec) -> Fraction:
    return Fraction(2) ** (spec.emin - spec.m)


def exact(v: float):
    """A float as an exact value: a Fraction, or ±INF / NAN (signed zero kept apart)."""
    if math.isnan(v):
        return NAN
    if math.isinf(v):
        return INF if v > 0 else "-" + INF
    return Fraction(v)


def _floor_log2(a: Fraction) -> int:
    """floor(log2(a)) of a positive Fraction, exactly."""
    k = a.numerator.bit_length() - a.denominator.bit_length()
    # 2**k <= a < 2**(k+1) after at most one correction either way
    if a < Fraction(2) ** k:
        k -= 1
    elif a >= Fraction(2) ** (k + 1):
        k += 1
    return k


def _overflow(spec: Spec, negative: bool, mode: str):
    """The signed result of an overflow (|rounded| > max) under `mode`."""
    top = largest(spec)
    toward_zero = (
        mode == "toward_zero" or (mode == "up" and negative) or (mode == "down" and not negative)
    )
    if spec.saturate or toward_zero:
        mag = top
    elif not spec.finite:
        mag = INF
    elif spec.nan:
        return NAN
    else:
        mag = top  # neither inf nor NaN: max is all there is
    return _signed(mag, negative)


def _signed(mag, negative: bool):
    if mag == INF:
        return "-" + INF if negative else INF
    if mag == 0:
        return ("-0", Fraction(0)) if negative else ("+0", Fraction(0))
    return -mag if negative else mag


def _neighbours(spec: Spec, a: Fraction) -> tuple[Fraction, Fraction, Fraction]:
    """(lower, upper, quantum) of a > 0 on the unbounded-exponent grid."""
    exponent = max(_floor_log2(a), spec.emin)
    q = Fraction(2) ** (exponent - spec.m)
    lower = (a // q) * q
    upper = lower if lower == a else lower + q
    return lower, upper, q


def round_exact(v: float, spec: Spec, mode: str):
    """`v` rounded onto `spec` under a deterministic `mode`.

    Returns a Fraction for a nonzero finite result, `("+0", 0)`/`("-0", 0)` for
    zeros, `INF`/`"-inf"` or `NAN`.
    """
    x = exact(v)
    if x == NAN:
        return NAN
    negative = math.copysign(1.0, v) < 0
    if x in (INF, "-" + INF):
        if spec.saturate:
            return _signed(largest(spec), negative)
        if not spec.finite:
            return x
        return NAN if spec.nan else _signed(largest(spec), negative)
    a = abs(x)
    if a == 0:
        return _signed(0, negative)
    lower, upper, q = _neighbours(spec, a)
    if lower == upper:
        mag = lower
    elif mode == "nearest_even":
        mid = lower + q / 2
        if a != mid:
            mag = lower if a < mid else upper
        else:
            mag = lower if (lower / q) % 2 == 0 else upper
    elif mode == "nearest_away":
        mag = lower if a < lower + q / 2 else upper
    elif mode == "toward_zero":
        mag = lower
    elif mode == "up":
        mag = lower if negative else upper
    elif mode == "down":
        mag = upper if negative else lower
    else:
        raise ValueError(mode)
    if mag > largest(spec):
        return _overflow(spec, negative, mode)
    return _signed(mag, negative)


def stochastic_choices(v: float, spec: Spec):
    """(result toward zero, result away from zero, P(away)) of stochastic rounding.

    The two results are those of `toward_zero` and of rounding the magnitude
    up (with overflow as a nearest mode has it, since no direction is
    truncating); P(away) = (|x| - lower) / quantum, exactly.
    """
    x = exact(v)
    if x == NAN or x in (INF, "-" + INF) or x == 0:
        r = round_exact(v, spec, "nearest_even")
        return r, r, Fraction(0)
    negative = v < 0
    a = abs(x)
    lower, upper, q = _neighbours(spec, a)
    if lower == upper:  # on the grid of unbounded exponent: no choice (past max: overflow)
        r = round_exact(v, spec, "nearest_even")
        return r, r, Fraction(0)
    low = round_exact(v, spec, "toward_zero")
    high = (
        _overflow(spec, negative, "nearest_even")
        if upper > largest(spec)
        else _signed(upper, negative)
    )
    return low, high, (a - lower) / q


def to_float(r) -> float:
    """An oracle result as a Python float (for comparing with float32 bits)."""
    if r == NAN:
        return math.nan
    if r == INF:
        return math.inf
    if r == "-" + INF:
        return -math.inf
    if isinstance(r, tuple):
        return -0.0 if r[0] == "-0" else 0.0
    return float(r)  # exact: every value of a layout with e <= 8, m <= 23 is a float64


def same(actual: float, expected) -> bool:
    """Whether a float32 result is exactly the oracle's (signed zeros apart, any NaN)."""
    want = to_float(expected)
    if math.isnan(want):
        return math.isnan(actual)
    if want == 0:
        return actual == 0 and math.copysign(1.0, actual) == math.copysign(1.0, want)
    return np.float64(actual) == want
