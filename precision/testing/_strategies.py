"""Hypothesis strategies for formats, rounding modes, scalings and the data they hold.

hypothesis cannot build bfloat16, float8 or int4 values itself (it refuses
their dtypes), so these strategies draw float32 data: bit patterns decoded
exactly for grid values, and hand-picked families for the cases that break
numerical code (signed zeros, subnormals, the smallest normal, the top of the
range and just past it, exact ties between neighbours and the float32 values
beside them, NaN and infinities).

Every strategy is built so that a failing example shrinks toward small,
simple values: each is a `one_of` whose first branch holds the simplest
cases (zero first), and grid values come from integer codes that grow with
the magnitude, so shrinking a code shrinks the value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import dtypes
from dtypes import FloatFormat, Format, IntFormat, PerAxis, PerBlock, PerTensor, Scaling

from ._grid import data_grid, decode_magnitude, max_code

if TYPE_CHECKING:
    import jax

    from precision import Tensor

__all__ = [
    "arrays",
    "formats",
    "keys",
    "representable",
    "roundings",
    "scalings",
    "tensors",
    "values",
]

_KINDS = ("float", "int")
# Integer-format data is drawn at a power-of-two scale 2**k, k in this range
# (k = 0 first when shrinking): wide enough to matter, narrow enough that
# every code times the scale is a normal float32.
_INT_SCALE_EXPONENTS = (-8, 8)

Shape = int | tuple[int, ...]


# -- formats, roundings, scalings, keys ---------------------------------------


def formats(
    kinds: str | Sequence[str] = _KINDS,
    min_bits: int = 1,
    max_bits: int = 64,
    include_custom: bool = False,
) -> st.SearchStrategy[Format]:
    """Formats from the registry (`dtypes.FORMATS`), optionally custom float layouts too.

    Shrinks toward the first matching format in registry order.

    Args:
        kinds: "float", "int" or both.
        min_bits: smallest storage width (`fmt.bits`) to draw.
        max_bits: largest storage width. float64 (64 bits) is included by
            default; encoding into it needs `jax_enable_x64`, so pass
            `max_bits=32` to leave it out.
        include_custom: also draw `dtypes.FloatFormat(e, m)` layouts with
            2 <= e <= 8 and 0 <= m <= 23, IEEE-style or `finite`, saturating
            or not (only when "float" is among `kinds`).

    Returns:
        A strategy of `dtypes.Format`s.

    Raises:
        ValueError: an unknown kind, or no format fits the bounds.

    Examples:
        >>> from hypothesis import given, settings
        >>> import dtypes
        >>> seen = set()
        >>> @settings(max_examples=50, database=None)
        ... @given(formats(kinds="int"))
        ... def collect(fmt):
        ...     seen.add(fmt.name)
        >>> collect()
        >>> seen <= {"int8", "int4", "int2", "int1"}
        True
    """
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    unknown = [k for k in kinds if k not in _KINDS]
    if unknown or not kinds:
        raise ValueError(f"formats(kinds={kinds!r}): each kind must be 'float' or 'int'")
    registry = [
        f for f in dtypes.FORMATS.values() if f.kind in kinds and min_bits <= f.bits <= max_bits
    ]
    branches: list[st.SearchStrategy[Format]] = []
    if registry:
        branches.append(st.sampled_from(registry))
    if include_custom and "float" in kinds and min_bits <= 32 and max_bits >= 3:
        branches.append(_custom_float_formats(min_bits, max_bits))
    if not branches:
        known = ", ".join(f"{f.name} ({f.bits})" for f in dtypes.FORMATS.values())
        raise ValueError(
            f"no format has kind in {kinds} and {min_bits} <= bits <= {max_bits}; "
            f"the registry holds {known}, or pass include_custom=True"
        )
    return st.one_of(branches)


@st.composite
def _custom_float_formats(draw, min_bits: int, max_bits: int) -> FloatFormat:
    # 1 + e + m bits with 2 <= e <= 8 and 0 <= m <= 23 (e = 1 IEEE layouts
    # have no normal numbers at all and are left out).
    bits = draw(st.integers(max(3, min_bits), min(32, max_bits)))
    e = draw(st.integers(max(2, bits - 24), min(8, bits - 1)))
    m = bits - 1 - e
    finite = draw(st.booleans())
    saturate = draw(st.booleans())
    # A finite layout of 8+ bits keeps an all-ones NaN code, which needs a mantissa bit.
    nan = False if finite and m == 0 else None
    return FloatFormat(e, m, finite=finite, nan=nan, saturate=saturate)


def roundings(deterministic_only: bool = False) -> st.SearchStrategy[str]:
    """Rounding mode names from `dtypes.ROUNDING_MODES` (shrinks toward "nearest_even").

    "stochastic" needs a `key=` when rounding; draw one with `keys()`.

    Args:
        deterministic_only: leave "stochastic" out.

    Examples:
        >>> import dtypes
        >>> roundings(deterministic_only=True).validate()
        >>> "stochastic" in dtypes.ROUNDING_MODES
        True
    """
    modes = [r for r in dtypes.ROUNDING_MODES if not (deterministic_only and r == "stochastic")]
    return st.sampled_from(modes)


def keys() -> st.SearchStrategy[jax.Array]:
    """`jax.random` keys, for `rounding="stochastic"` (shrinks toward `key(0)`).

    Examples:
        >>> import jax
        >>> keys().validate()
    """
    import jax

    return st.integers(0, 2**32 - 1).map(jax.random.key)


def scalings(
    fmt: Format | None = None, *, ndim: int = 1, block_sizes: Sequence[int] = (32, 2, 4, 8, 16, 3)
) -> st.SearchStrategy[Scaling | None]:
    """Scalings that fit arrays with `ndim` dimensions, for `fmt`.

    Draws `None` (unscaled; only for float formats or `fmt=None`),
    `PerTensor()`, `PerAxis(axis)` and `PerBlock(size, axis)`, each with or
    without `power_of_two`. Shrinks toward `None` (floats) or `PerTensor()`.

    Args:
        fmt: the format the scaling is for; integer formats always scale.
        ndim: rank of the arrays the scaling will meet; 0 allows only
            `None` and `PerTensor()`.
        block_sizes: `PerBlock` sizes to draw from (the first is preferred).

    Examples:
        >>> import dtypes
        >>> scalings(dtypes.int4, ndim=2).validate()
    """
    power_of_two = st.booleans()
    branches: list[st.SearchStrategy[Any]] = []
    if fmt is None or fmt.kind == "float":
        branches.append(st.none())
    branches.append(st.builds(PerTensor, power_of_two=power_of_two))
    if ndim >= 1:
        axes = st.integers(0, ndim - 1)
        branches.append(st.builds(PerAxis, axes, power_of_two=power_of_two))
        sizes = st.sampled_from(tuple(block_sizes))
        branches.append(st.builds(PerBlock, sizes, axes, power_of_two=power_of_two))
    return st.one_of(branches)


# -- scalar values ------------------------------------------------------------


def _f32(v: float) -> np.float32:
    return np.float32(v)


_F32_MAX = float(np.finfo(np.float32).max)


def _is_f32(v: float) -> bool:
    # Range check first: casting a larger value to float32 warns about overflow.
    return abs(v) <= _F32_MAX and float(np.float32(v)) == v


def _float_specials(
    g: FloatFormat, allow_nan: bool, allow_infinity: bool, allow_subnormal: bool
) -> list[float]:
    """The named hard cases of grid `g`, simplest first, as exact float32 values."""
    top = g.max
    f32 = np.float32
    out: list[float] = [0.0, -0.0, g.min_normal, -g.min_normal, top, -top]
    # The float32 values on either side of the smallest normal and of max.
    for v in (g.min_normal, top):
        for direction in (np.inf, 0.0):
            out.append(float(np.nextafter(f32(v), f32(direction))))
    # Just beyond max: the rounding boundary max + ulp/2 (where round-to-nearest
    # overflows) and the float32 values beside it, plus one binade up.
    half_ulp = math.ldexp(1.0, g.emax - g.mantissa_bits - 1)
    boundary = top + half_ulp
    for v in (boundary, 2.0 * top):
        if _is_f32(v):
            out.append(v)
            out.append(float(np.nextafter(f32(v), f32(0.0))))
            nxt = float(np.nextafter(f32(v), f32(np.inf)))
            if math.isfinite(nxt):
                out.append(nxt)
    if g.mantissa_bits > 0 and allow_subnormal:
        largest_sub = decode_magnitude(g, (1 << g.mantissa_bits) - 1)
        out += [g.smallest_subnormal, -g.smallest_subnormal, largest_sub, -largest_sub]
    if not allow_subnormal:
        out = [v for v in out if v == 0 or abs(v) >= g.min_normal]
    if allow_infinity:
        out += [math.inf, -math.inf]
    if allow_nan:
        out.append(math.nan)
    unique: list[float] = []
    for v in out:  # keep order, drop repeats (signed zeros and NaN compared by bits)
        if not any(np.float32(v).tobytes() == np.float32(u).tobytes() for u in unique):
            unique.append(v)
    return unique


def _signed(magnitudes: st.SearchStrategy[float]) -> st.SearchStrategy[float]:
    return st.tuples(magnitudes, st.booleans()).map(lambda t: -t[0] if t[1] else t[0])


def _grid_magnitudes(g: FloatFormat, allow_subnormal: bool) -> st.SearchStrategy[float]:
    """Non-negative grid values from their codes; code 0 (the value 0) first."""
    first = 0 if allow_subnormal else 1 << g.mantissa_bits
    top = max_code(g)
    if first == 0:
        return st.integers(0, top).map(lambda c: decode_magnitude(g, c))
    # Without subnormals: 0, then the normal codes.
    return st.integers(first - 1, top).map(
        lambda c: 0.0 if c == first - 1 else decode_magnitude(g, c)
    )


def _ties(g: FloatFormat, allow_subnormal: bool) -> st.SearchStrategy[float]:
    """Midpoints between grid neighbours, and the float32 values just beside them."""
    first = 0 if allow_subnormal else 1 << g.mantissa_bits
    codes = st.integers(first, max_code(g) - 1)
    nudge = st.sampled_from((0, 1, -1))  # exactly on the tie first

    def build(code: int, step: int) -> float:
        lo, hi = decode_magnitude(g, code), decode_magnitude(g, code + 1)
        tie = np.float32((lo + hi) / 2)  # exact: one bit below the format's mantissa
        if step:
            tie = np.nextafter(tie, np.float32(np.inf if step > 0 else 0.0))
        return float(tie)

    return _signed(st.builds(build, codes, nudge))


def _subnormals(g: FloatFormat) -> st.SearchStrategy[float]:
    n = (1 << g.mantissa_bits) - 1
    return _signed(st.integers(1, n).map(lambda k: math.ldexp(k, g.emin - g.mantissa_bits)))


def _flush_small(g: FloatFormat, allow_subnormal: bool):
    if allow_subnormal:
        return lambda v: v
    return lambda v: math.copysign(0.0, v) if 0 < abs(v) < g.min_normal else v


def _float_values(
    fmt: FloatFormat, allow_nan: bool, allow_infinity: bool, allow_subnormal: bool
) -> st.SearchStrategy[np.float32]:
    g = data_grid(fmt)
    flush = _flush_small(g, allow_subnormal)
    branches: list[st.SearchStrategy[float]] = [
        st.sampled_from(_float_specials(g, allow_nan, allow_infinity, allow_subnormal)),
    ]
    if allow_subnormal and g.mantissa_bits > 0:
        branches.append(_subnormals(g))
    if g.mantissa_bits < 23:  # a float32 holds every midpoint of a narrower grid
        branches.append(_ties(g, allow_subnormal))
    branches += [
        _signed(_grid_magnitudes(g, allow_subnormal)),
        st.floats(-g.max, g.max, width=32).map(flush),
        st.floats(
            width=32,
            allow_nan=allow_nan,
            allow_infinity=allow_infinity,
            allow_subnormal=allow_subnormal,
        ).map(flush),
    ]
    return st.one_of(branches).map(_f32)


def _int_values(
    fmt: IntFormat, k: int, allow_nan: bool, allow_infinity: bool, allow_subnormal: bool
) -> st.SearchStrategy[np.float32]:
    """Data for an integer format at the scale `s = 2**k`.

    A group whose absmax is `qmax * s` gets exactly the scale `s`, so
    `(c + 0.5) * s` is then an exact tie between codes c and c + 1.
    """
    s, q = math.ldexp(1.0, k), fmt.qmax
    specials = [0.0, -0.0, q * s, -q * s]
    if allow_infinity:
        specials += [math.inf, -math.inf]
    if allow_nan:
        specials.append(math.nan)

    def tie(c: int, step: int) -> float:
        t = np.float32((c + 0.5) * s)
        if step:
            t = np.nextafter(t, np.float32(np.inf if step > 0 else -np.inf))
        return float(t)

    branches: list[st.SearchStrategy[float]] = [
        st.sampled_from(specials),
        st.builds(tie, st.integers(-q, q - 1), st.sampled_from((0, 1, -1))),
        _signed(st.integers(0, q).map(lambda c: c * s)),
        st.floats(-q * s, q * s, width=32, allow_subnormal=allow_subnormal),
        st.floats(
            width=32,
            allow_nan=allow_nan,
            allow_infinity=allow_infinity,
            allow_subnormal=allow_subnormal,
        ),
    ]
    return st.one_of(branches).map(_f32)


def _check_format(fmt: Any, where: str) -> Format:
    if isinstance(fmt, str):
        return dtypes.get(fmt)
    if not isinstance(fmt, Format):
        raise TypeError(
            f"{where} needs a dtypes.Format or a format name such as 'bfloat16', got {fmt!r}"
        )
    return fmt


def values(
    fmt: Format | str,
    *,
    allow_nan: bool = True,
    allow_infinity: bool = True,
    allow_subnormal: bool = True,
) -> st.SearchStrategy[np.float32]:
    """float32 scalars weighted toward the hard cases of `fmt`.

    For a float format, about two draws in three come from its hard cases:
    ±0; its subnormals (smallest, largest, any); the smallest normal; ±max;
    just beyond max (the overflow boundary `max + ulp/2`, the float32 values
    beside it, `2 * max`); exact ties between neighbouring grid values and
    the float32 values just beside them (`np.nextafter`); grid values; NaN
    and ±inf. The rest are general float32 values, in range and anywhere.
    Formats wider than float32 (float64) use float32's own hard cases.

    For an integer format a draw picks a power-of-two scale `s` and gives
    ±0, ±qmax·s (a group's absmax, which fixes its scale at exactly `s`),
    exact code ties `(c + 1/2)·s` and their float32 neighbours, codes `c·s`,
    and general values.

    Shrinks toward 0.0.

    Args:
        fmt: a `dtypes.Format` or a format name.
        allow_nan: include NaN.
        allow_infinity: include ±inf.
        allow_subnormal: include the format's subnormal range (nonzero
            values below `fmt.min_normal`) and float32 subnormals. XLA on CPU
            flushes float32 subnormals to zero in arithmetic; leave them out
            when testing kernels that compute on them.

    Returns:
        A strategy of `numpy.float32` scalars.

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
    if isinstance(fmt, IntFormat):
        lo, hi = _INT_SCALE_EXPONENTS
        return st.integers(lo, hi).flatmap(
            lambda k: _int_values(fmt, k, allow_nan, allow_infinity, allow_subnormal)
        )
    return _float_values(fmt, allow_nan, allow_infinity, allow_subnormal)


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
    if isinstance(fmt, IntFormat):
        lo, hi = _INT_SCALE_EXPONENTS
        anchors = _signed(st.integers(lo, hi).map(lambda k: fmt.qmax * math.ldexp(1.0, k)))
        return st.one_of(st.just(0.0), anchors).map(_f32)
    return _on_grid(fmt, allow_subnormal)


def _on_grid(fmt: FloatFormat, allow_subnormal: bool) -> st.SearchStrategy[np.float32]:
    return _signed(_grid_magnitudes(data_grid(fmt), allow_subnormal)).map(_f32)


# -- arrays and tensors -------------------------------------------------------


def _shapes(shape: Shape | st.SearchStrategy[tuple[int, ...]] | None):
    if shape is None:
        return hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=8)
    if isinstance(shape, st.SearchStrategy):
        return shape
    if isinstance(shape, int):
        return st.just((shape,))
    return st.just(tuple(int(n) for n in shape))


def _fill(elements: st.SearchStrategy[Any], shape: tuple[int, ...]) -> st.SearchStrategy:
    n = math.prod(shape)
    return st.lists(elements, min_size=n, max_size=n).map(
        lambda xs: np.asarray(xs, np.float32).reshape(shape)
    )


def _representable_int_array(fmt: IntFormat, shape: tuple[int, ...]):
    """Codes times one power-of-two scale, the largest code set to ±qmax.

    That element is the absmax, so the per-tensor scale comes out as exactly
    the drawn power of two and every element decodes back to itself.
    """
    n = math.prod(shape)
    lo, hi = _INT_SCALE_EXPONENTS
    q = fmt.qmax
    code = st.sampled_from((1, -1)) if fmt.binary else st.integers(-q, q)

    def build(k: int, codes: list[int]) -> np.ndarray:
        c = np.asarray(codes, np.float64)
        if n and np.any(c != 0):
            i = int(np.argmax(np.abs(c)))
            c[i] = math.copysign(q, c[i])
        return np.asarray(c * math.ldexp(1.0, k), np.float32).reshape(shape)

    return st.builds(build, st.integers(lo, hi), st.lists(code, min_size=n, max_size=n))


def arrays(
    fmt: Format | str,
    shape: Shape | st.SearchStrategy[tuple[int, ...]] | None = None,
    *,
    representable: bool = False,
    allow_nan: bool = True,
    allow_infinity: bool = True,
    allow_subnormal: bool = True,
) -> st.SearchStrategy[np.ndarray]:
    """numpy float32 arrays whose elements are drawn independently from `values(fmt)`.

    Unlike a fill-based array strategy, every element is its own draw, so a
    64-element array holds about forty hard cases. For an integer format one
    power-of-two scale is drawn per array, so code ties are ties of that array.

    Args:
        fmt: a `dtypes.Format` or a format name.
        shape: an int, a tuple, or a strategy of tuples; by default rank 1
            or 2 with sides up to 8 (shrinking toward small shapes).
        representable: draw only values on `fmt`'s grid (`representable`
            elements; for integer formats the array as a whole round-trips
            under the default per-tensor scaling).
        allow_nan: as in `values`.
        allow_infinity: as in `values`.
        allow_subnormal: as in `values`.

    Examples:
        >>> import numpy as np
        >>> from hypothesis import given, settings
        >>> import dtypes
        >>> @settings(max_examples=20, database=None, deadline=None)
        ... @given(arrays(dtypes.int4, shape=(3, 5), representable=True))
        ... def test_round_trip(x):
        ...     np.testing.assert_array_equal(dtypes.int4.round(x), x)
        >>> test_round_trip()
    """
    fmt = _check_format(fmt, "arrays()")
    flags = (allow_nan, allow_infinity, allow_subnormal)

    def for_shape(shp: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
        if isinstance(fmt, IntFormat):
            if representable:
                return _representable_int_array(fmt, shp)
            lo, hi = _INT_SCALE_EXPONENTS
            return st.integers(lo, hi).flatmap(lambda k: _fill(_int_values(fmt, k, *flags), shp))
        if representable:
            return _fill(_on_grid(fmt, allow_subnormal), shp)
        return _fill(_float_values(fmt, *flags), shp)

    return _shapes(shape).flatmap(for_shape)


def tensors(
    fmt: Format | str | st.SearchStrategy[Format] | None = None,
    shape: Shape | st.SearchStrategy[tuple[int, ...]] | None = None,
    scaling: Scaling | st.SearchStrategy[Scaling | None] | None = None,
    *,
    allow_nan: bool | None = None,
    allow_infinity: bool | None = None,
    allow_subnormal: bool = True,
) -> st.SearchStrategy[Tensor]:
    """`precision.Tensor`s stored in `fmt`, from `arrays(fmt, shape)` data.

    A float32 format gives a full-precision Tensor; any other format gives
    `Tensor(x).to_reduced_precision(fmt, scaling=scaling)`.

    Args:
        fmt: a format, a name, or a strategy of formats; by default
            `formats(max_bits=32)`.
        shape: as in `arrays`.
        scaling: a scaling, a strategy of them (e.g. `scalings(fmt, ndim=2)`,
            which must fit the drawn shapes), or None for the format's default.
        allow_nan: as in `values`; by default NaN and inf are drawn only for
            unscaled float formats, since a scaled encoding refuses them.
        allow_infinity: as `allow_nan`.
        allow_subnormal: as in `values`.
    """
    from precision import Tensor

    fmt_strategy = formats(max_bits=32) if fmt is None else fmt
    if not isinstance(fmt_strategy, st.SearchStrategy):
        fmt_strategy = st.just(_check_format(fmt_strategy, "tensors()"))
    scaling_strategy = scaling if isinstance(scaling, st.SearchStrategy) else st.just(scaling)

    def build(f: Format, sc: Scaling | None) -> st.SearchStrategy[Tensor]:
        scaled = sc is not None or f.kind == "int"
        nan = (not scaled) if allow_nan is None else allow_nan
        inf = (not scaled) if allow_infinity is None else allow_infinity
        data = arrays(f, shape, allow_nan=nan, allow_infinity=inf, allow_subnormal=allow_subnormal)
        if f == dtypes.float32:
            return data.map(Tensor)
        return data.map(lambda x: Tensor(x).to_reduced_precision(f, scaling=sc))

    return st.tuples(fmt_strategy, scaling_strategy).flatmap(lambda t: build(*t))
