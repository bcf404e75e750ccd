"""Strategies for scalar values: each format's hard cases, its grid, ordinary magnitudes."""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

import numpy as np
from hypothesis import strategies as st

import dtypes
from dtypes import FloatFormat, Format, IntFormat, PrecisionTypeError

from .._grid import data_grid, decode_magnitude, max_code, ordinals

if TYPE_CHECKING:
    pass

from ..._errors import KitError
from ._constants import _INT_SCALE_EXPONENTS, _check_flag

# -- scalar values ------------------------------------------------------------

_F32_MAX = float(np.finfo(np.float32).max)


def _f32(v: float) -> np.float32:
    return np.float32(v)


def _is_f32(v: float) -> bool:
    # Range check first: casting a larger value to float32 warns about overflow.
    return abs(v) <= _F32_MAX and float(np.float32(v)) == v


class _Bounds:
    """The closed interval [lo, hi] a strategy's values must lie in."""

    def __init__(self, min_value: float | None, max_value: float | None):
        self.lo = -math.inf if min_value is None else _bound(min_value, "min_value")
        self.hi = math.inf if max_value is None else _bound(max_value, "max_value")
        self.given = min_value is not None or max_value is not None
        if math.isnan(self.lo) or math.isnan(self.hi) or self.lo > self.hi:
            raise KitError(
                f"min_value={min_value!r} and max_value={max_value!r} bound no value; pass "
                "finite bounds with min_value <= max_value, or None for no bound"
            )
        if self.lo == math.inf or self.hi == -math.inf:
            raise KitError(
                f"min_value={min_value!r} and max_value={max_value!r} bound only an infinity; "
                "leave the bound out and keep allow_infinity=True to draw infinities"
            )

    def __contains__(self, v: float) -> bool:
        return math.isnan(v) or self.lo <= v <= self.hi

    def clamp(self, v: float) -> float:
        return v if math.isnan(v) else min(max(v, self.lo), self.hi)

    def f32_range(self, lo: float, hi: float) -> tuple[float, float] | None:
        """[max(lo, self.lo), min(hi, self.hi)] shrunk to float32 end points, or None."""
        a, b = max(lo, self.lo), min(hi, self.hi)
        a32 = np.float32(np.clip(a, -_F32_MAX, _F32_MAX)) if math.isfinite(a) else np.float32(a)
        b32 = np.float32(np.clip(b, -_F32_MAX, _F32_MAX)) if math.isfinite(b) else np.float32(b)
        if float(a32) < a:
            a32 = np.nextafter(a32, np.float32(np.inf))
        if float(b32) > b:
            b32 = np.nextafter(b32, np.float32(-np.inf))
        return (float(a32), float(b32)) if a32 <= b32 else None


def _bound(value: Any, name: str) -> float:
    """A bound as a float: a real number (bools, text and arrays are refused)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise PrecisionTypeError(
            f"{name} must be a real number or None, got {type(value).__name__} {value!r:.60}; "
            f"pass e.g. {name}=0.0"
        )
    return float(value)


_NO_BOUNDS = _Bounds(None, None)


def _bounds_or_inf(pair: tuple[float | None, float | None]) -> tuple[float, float]:
    """A (lo, hi) pair with None read as an infinite bound."""
    lo, hi = pair
    return (-math.inf if lo is None else lo, math.inf if hi is None else hi)


def _float_extremes(g: FloatFormat, allow_subnormal: bool) -> list[float]:
    """±0, ±1, the smallest normal, ±max, the smallest and largest subnormal."""
    # 1 and -1 are not hard, but early in this list they give the shrinker a
    # simpler target than ±max.
    out = [0.0, -0.0, 1.0, -1.0, g.min_normal, -g.min_normal, g.max, -g.max]
    if g.mantissa_bits > 0 and allow_subnormal:
        largest_sub = decode_magnitude(g, (1 << g.mantissa_bits) - 1)
        out += [g.smallest_subnormal, -g.smallest_subnormal, largest_sub, -largest_sub]
    return out


def _nonfinite(allow_nan: bool, allow_infinity: bool) -> list[float]:
    return ([math.nan] if allow_nan else []) + ([math.inf, -math.inf] if allow_infinity else [])


def _float_edges(g: FloatFormat, allow_subnormal: bool) -> list[float]:
    """The float32 values beside the smallest normal and max, and just beyond max."""
    top = g.max
    f32 = np.float32
    out: list[float] = []
    # The float32 values on either side of the smallest normal and of max.
    for v in (g.min_normal, top):
        for direction in (np.inf, 0.0):
            with np.errstate(over="ignore"):  # above float32's max lies inf: left out
                w = float(np.nextafter(f32(v), f32(direction)))
            out += [w, -w] if math.isfinite(w) else []
    # Just beyond max: the rounding boundary max + ulp/2 (where round-to-nearest
    # overflows) and the float32 values beside it, plus one binade up.
    half_ulp = math.ldexp(1.0, g.emax - g.mantissa_bits - 1)
    for v in (top + half_ulp, 2.0 * top):
        if _is_f32(v):
            beside = [v, float(np.nextafter(f32(v), f32(0.0)))]
            with np.errstate(over="ignore"):
                above = float(np.nextafter(f32(v), f32(np.inf)))
            beside += [above] if math.isfinite(above) else []
            out += [w for u in beside for w in (u, -u)]
    if not allow_subnormal:
        out = [v for v in out if v == 0 or abs(v) >= g.min_normal]
    unique: list[float] = []
    for v in out:  # keep order, drop repeats (signed zeros and NaN compared by bits)
        if not any(np.float32(v).tobytes() == np.float32(u).tobytes() for u in unique):
            unique.append(v)
    return unique


def _position(g: FloatFormat, magnitude: float) -> float:
    """Where a magnitude sits on `g`'s code line (code + fraction); inf for inf."""
    if math.isinf(magnitude):
        return math.inf
    _, index, frac = ordinals(np.float64(magnitude), g)
    return float(index) + float(frac)


def _coded(
    g: FloatFormat, first: int, last: int, bounds: _Bounds, *, tie: bool = False
) -> st.SearchStrategy[float] | None:
    """Values decoded from magnitude codes first..last, both signs, inside `bounds`.

    With `tie=True` a code c stands for the midpoint between codes c and c+1,
    or (a second draw) the float32 value just below or above it. Codes grow
    with the magnitude and the positive side comes first, so shrinking goes
    toward small positive values.
    """
    offset = 0.5 if tie else 0.0

    def side(mag_lo: float, mag_hi: float, sign: float) -> st.SearchStrategy[float] | None:
        c_lo = max(first, math.ceil(_position(g, mag_lo) - offset))
        pos_hi = _position(g, mag_hi)
        c_hi = last if math.isinf(pos_hi) else min(last, math.floor(pos_hi - offset))
        if c_lo > c_hi:
            return None
        codes = st.integers(c_lo, c_hi)
        if not tie:
            return codes.map(lambda c: sign * decode_magnitude(g, c))

        def build(c: int, step: int) -> float:
            mid = np.float32((decode_magnitude(g, c) + decode_magnitude(g, c + 1)) / 2)
            if step:  # the float32 neighbours of the (exact) midpoint
                mid = np.nextafter(mid, np.float32(np.inf if step > 0 else 0.0))
            return bounds.clamp(sign * float(mid))

        return st.tuples(codes, st.sampled_from((0, 1, -1))).map(lambda t: build(*t))

    drawn = []
    if bounds.hi >= 0:
        drawn.append(side(max(bounds.lo, 0.0), bounds.hi, 1.0))
    if bounds.lo < 0:
        drawn.append(side(max(-bounds.hi, 0.0), -bounds.lo, -1.0))
    sides = [s for s in drawn if s is not None]
    return st.one_of(sides) if sides else None


def _code_of_power(g: FloatFormat, k: int) -> int:
    """Magnitude code of 2**k, with k clamped to the normal exponents of `g`."""
    k = min(max(k, g.emin), g.emax)
    return min((k + g.bias) << g.mantissa_bits, max_code(g))


# "Ordinary" magnitudes, 2**-4 to 2**8: where most real data lives, and where
# arithmetic bugs (lost low-order terms, double rounding) show up between
# values of similar size rather than between 1e-38 and 1e38.
_ORDINARY_EXPONENTS = (-4, 8)


def _float_values(
    fmt: FloatFormat,
    allow_nan: bool,
    allow_infinity: bool,
    allow_subnormal: bool,
    bounds: _Bounds,
) -> st.SearchStrategy[np.float32]:
    g = data_grid(fmt)
    m, top = g.mantissa_bits, max_code(g)
    first = 0 if allow_subnormal else 1 << m
    if not (allow_subnormal or 0.0 in bounds or max(-bounds.lo, bounds.hi) >= g.min_normal):
        raise KitError(
            f"[{bounds.lo}, {bounds.hi}] holds only subnormal values of {fmt.name} (its smallest "
            f"normal is {g.min_normal}), and allow_subnormal=False leaves those out"
        )
    extremes = [v for v in _float_extremes(g, allow_subnormal) if v in bounds]
    nonfinite = _nonfinite(allow_nan and not bounds.given, allow_infinity)
    nonfinite = [v for v in nonfinite if v in bounds]
    edges = [v for v in _float_edges(g, allow_subnormal) if v in bounds]
    # Branch order is shrink order: grid values by code (0, then the smallest
    # magnitudes) come first, so a failing example shrinks toward small values.
    branches: list[st.SearchStrategy[float] | None] = [_coded(g, first, top, bounds)]
    lo, hi = (_code_of_power(g, k) for k in _ORDINARY_EXPONENTS)
    ordinary = [_coded(g, lo, hi, bounds)]
    if m < 23 and lo < hi:
        ordinary.append(_coded(g, lo, hi - 1, bounds, tie=True))
    present = [s for s in ordinary if s is not None]
    branches.append(st.one_of(present) if present else None)
    branches.append(st.sampled_from(extremes) if extremes else None)
    branches.append(st.sampled_from(edges) if edges else None)
    if m < 23:  # a float32 holds every midpoint of a narrower grid
        branches.append(_coded(g, first, top - 1, bounds, tie=True))
    if allow_subnormal and m > 0:
        branches.append(_coded(g, 1, (1 << m) - 1, bounds))

    def flush(v: float) -> float:
        # Without subnormals, a general float below the smallest normal becomes
        # the nearest allowed of ±0 and ±min_normal.
        if allow_subnormal or not 0 < abs(v) < g.min_normal:
            return v
        for c in (0.0, g.min_normal, -g.min_normal):
            if math.copysign(c, v) in bounds:
                return math.copysign(c, v)
        return v

    in_range = bounds.f32_range(-g.max, g.max)
    if in_range is not None:
        branches.append(st.floats(*in_range, width=32).map(flush))
    anywhere = bounds.f32_range(-math.inf, math.inf) if bounds.given else (None, None)
    if anywhere is not None:
        branches.append(
            st.floats(
                *anywhere,
                width=32,
                allow_nan=allow_nan and not bounds.given,
                allow_infinity=allow_infinity and math.inf in map(abs, _bounds_or_inf(anywhere)),
                # None: hypothesis decides from the bounds (True would be refused by
                # bounds that leave float32's subnormals out, e.g. min_value=2.5)
                allow_subnormal=None if allow_subnormal else False,
            ).map(flush)
        )
    branches.append(st.sampled_from(nonfinite) if nonfinite else None)  # last: shrinks away
    return st.one_of([b for b in branches if b is not None]).map(_f32)


def _int_values(
    fmt: IntFormat,
    k: int | None,
    allow_nan: bool,
    allow_infinity: bool,
    allow_subnormal: bool,
    bounds: _Bounds,
) -> st.SearchStrategy[np.float32]:
    """Data for an integer format at a scale `s = 2**k` (`k=None`: drawn per value).

    A group whose absmax is `qmax * s` gets exactly the scale `s`, so
    `(c + 0.5) * s` is then an exact tie between codes c and c + 1. The
    exponent is part of each draw rather than a `flatmap`, so it shrinks
    together with the code, toward k = 0 and code 0.
    """
    q = fmt.qmax
    lo, hi = _INT_SCALE_EXPONENTS
    ks = st.integers(lo, hi) if k is None else st.just(k)

    def code(t: tuple[int, int, bool]) -> float:
        k_, c, negative = t
        return (-c if negative else c) * math.ldexp(1.0, k_)

    named = ["zero", "-zero", "anchor", "-anchor"]
    named += ["inf", "-inf"] if allow_infinity else []
    named += ["nan"] if allow_nan and not bounds.given else []

    def special(t: tuple[int, str]) -> float:
        k_, name = t
        sign = -1.0 if name.startswith("-") else 1.0
        base = name.lstrip("-")
        if base == "anchor":
            return sign * q * math.ldexp(1.0, k_)
        return {"zero": 0.0, "inf": math.inf, "nan": math.nan}[base] * sign

    def tie(t: tuple[int, int, int]) -> float:
        k_, c, step = t
        v = np.float32((c + 0.5) * math.ldexp(1.0, k_))
        if step:
            v = np.nextafter(v, np.float32(np.inf if step > 0 else -np.inf))
        return float(v)

    def in_range(t: tuple[int, float]) -> float:
        v = t[1] * math.ldexp(1.0, t[0])  # exact: a power-of-two multiple of a float32
        return math.copysign(0.0, v) if not allow_subnormal and abs(v) < 2.0**-126 else v

    branches: list[st.SearchStrategy[float]] = [
        st.tuples(ks, st.integers(0, q), st.booleans()).map(code),
        st.tuples(ks, st.sampled_from(named)).map(special),
        st.tuples(ks, st.integers(-q, q - 1), st.sampled_from((0, 1, -1))).map(tie),
        st.tuples(ks, st.floats(-q, q, width=32, allow_subnormal=allow_subnormal)).map(in_range),
        st.floats(
            width=32,
            allow_nan=allow_nan and not bounds.given,
            allow_infinity=allow_infinity,
            allow_subnormal=allow_subnormal,
        ),
    ]
    # Integer data is relative to a scale: bounds clamp rather than reshape it.
    return st.one_of(branches).map(bounds.clamp).map(_f32)


def _float_format(fmt: Format) -> FloatFormat:
    """`fmt`, which the strategies draw from as a float grid, or raise."""
    if not isinstance(fmt, FloatFormat):
        raise dtypes.PrecisionTypeError(
            f"{fmt.name} is a {fmt.kind} format: the strategies draw float formats "
            "(dtypes.FloatFormat) and integer formats (dtypes.IntFormat)"
        )
    return fmt


def _check_format(fmt: Any, where: str) -> Format:
    if isinstance(fmt, str):
        return dtypes.get(fmt)
    if not isinstance(fmt, Format):
        raise PrecisionTypeError(
            f"{where} needs a dtypes.Format or a format name such as 'bfloat16', got "
            f"{type(fmt).__name__} {fmt!r:.60}"
        )
    return fmt


def _check_flags(where: str, **flags: Any) -> None:
    for name, value in flags.items():
        _check_flag(value, name, where)


def values(
    fmt: Format | str,
    *,
    min_value: float | None = None,
    max_value: float | None = None,
    allow_nan: bool = True,
    allow_infinity: bool = True,
    allow_subnormal: bool = True,
) -> st.SearchStrategy[np.float32]:
    """float32 scalars weighted toward the hard cases of `fmt`.

    For a float format, most draws come from its hard cases: ±0; its
    subnormals (smallest, largest, any); the smallest normal and the float32
    values beside it; ±max and just beyond (the overflow boundary
    `max + ulp/2`, the float32 values beside it, `2 * max`); exact ties
    between neighbouring grid values and the float32 values just beside them
    (`np.nextafter`); grid values, both over the whole range and at ordinary
    magnitudes (2**-4 to 2**8); NaN and ±inf. The rest are general float32
    values, in range and anywhere. Formats wider than float32 (float64) use
    float32's own hard cases.

    For an integer format a draw picks a power-of-two scale `s` and gives
    ±0, ±qmax·s (a group's absmax, which fixes its scale at exactly `s`),
    exact code ties `(c + 1/2)·s` and their float32 neighbours, codes `c·s`,
    and general values.

    Shrinks toward 0.0 (or the bound nearest to it).

    Args:
        fmt: a `dtypes.Format` or a format name.
        min_value: smallest value to draw (inclusive); with a bound, NaN is
            never drawn and ±inf only if the bound allows it.
        max_value: largest value to draw (inclusive).
        allow_nan: include NaN.
        allow_infinity: include ±inf.
        allow_subnormal: include the format's subnormal range (nonzero
            values below `fmt.min_normal`) and float32 subnormals. XLA on CPU
            flushes float32 subnormals to zero in arithmetic; leave them out
            when testing kernels that compute on them.

    Returns:
        A strategy of `numpy.float32` scalars.

    Raises:
        KitError: (a ValueError) the bounds hold no value.
        PrecisionTypeError: (a TypeError) a bound that is not a real number, or
            a flag that is not True or False.

    Examples:
        >>> import numpy as np
        >>> from hypothesis import given, settings
        >>> import dtypes
        >>> @settings(max_examples=30, database=None, deadline=None)
        ... @given(values(dtypes.bfloat16, allow_nan=False))
        ... def test_rounding_twice_changes_nothing(x):
        ...     once = np.asarray(dtypes.bfloat16.round(x))
        ...     assert dtypes.bfloat16.round(once) == once
        >>> test_rounding_twice_changes_nothing()
    """
    fmt = _check_format(fmt, "values()")
    _check_flags(
        "values()",
        allow_nan=allow_nan,
        allow_infinity=allow_infinity,
        allow_subnormal=allow_subnormal,
    )
    return _values(fmt, allow_nan, allow_infinity, allow_subnormal, _Bounds(min_value, max_value))


def _values(
    fmt: Format, allow_nan: bool, allow_infinity: bool, allow_subnormal: bool, bounds: _Bounds
) -> st.SearchStrategy[Any]:
    if isinstance(fmt, IntFormat):
        return _int_values(fmt, None, allow_nan, allow_infinity, allow_subnormal, bounds)
    return _float_values(_float_format(fmt), allow_nan, allow_infinity, allow_subnormal, bounds)


def representable(fmt: Format | str, *, allow_subnormal: bool = True) -> st.SearchStrategy[Any]:
    """float32 scalars exactly on `fmt`'s grid: `fmt.round(x)` is `x`, bit for bit.

    Float formats: a sign and a magnitude code from 0 up to the code of
    `fmt.max`, decoded exactly (never NaN or inf). Integer formats scale per
    group by the absmax, so a lone value survives a round trip only when it
    *is* the absmax: the draws are 0 and ±qmax·2**k. For whole arrays of
    representable integer-format data use `arrays(fmt, representable=True)`.

    Shrinks toward 0.0.

    Args:
        fmt: a `dtypes.Format` or a format name.
        allow_subnormal: include the format's subnormal values.

    Examples:
        >>> import numpy as np
        >>> from hypothesis import given, settings
        >>> import dtypes
        >>> @settings(max_examples=30, database=None, deadline=None)
        ... @given(representable(dtypes.float8_e4m3fn))
        ... def test_on_grid(x):
        ...     assert np.float32(x).astype(dtypes.float8_e4m3fn.native_dtype) == x
        >>> test_on_grid()
    """
    fmt = _check_format(fmt, "representable()")
    _check_flags("representable()", allow_subnormal=allow_subnormal)
    if isinstance(fmt, IntFormat):
        lo, hi = _INT_SCALE_EXPONENTS
        anchor = st.tuples(st.integers(lo, hi), st.booleans()).map(
            lambda t: (-1 if t[1] else 1) * fmt.qmax * math.ldexp(1.0, t[0])
        )
        return st.one_of(st.just(0.0), anchor).map(_f32)
    return _on_grid(_float_format(fmt), allow_subnormal)


def _on_grid(
    fmt: FloatFormat, allow_subnormal: bool, bounds: _Bounds = _NO_BOUNDS
) -> st.SearchStrategy[np.float32]:
    """Values of `fmt`'s grid (decoded codes) inside `bounds`."""
    g = data_grid(fmt)
    codes = _coded(g, 0 if allow_subnormal else 1 << g.mantissa_bits, max_code(g), bounds)
    zero = not allow_subnormal and 0.0 in bounds
    if codes is None and not zero:
        raise KitError(
            f"no value of {fmt.name}'s grid lies in [{bounds.lo}, {bounds.hi}]; widen the bounds"
        )
    # without subnormals: zero, then the normal codes
    parts = ([st.just(0.0)] if zero else []) + ([codes] if codes is not None else [])
    return st.one_of(parts).map(_f32)
