"""Strategies for arrays and Tensors, filled from the value strategies."""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import dtypes
from dtypes import FloatFormat, Format, IntFormat, Scaling, ShapeError

if TYPE_CHECKING:
    from precision import Tensor

from ..._errors import KitError
from ._constants import _INT_SCALE_EXPONENTS, Shape
from ._formats import formats
from ._values import (
    _Bounds,
    _check_flags,
    _check_format,
    _float_format,
    _float_values,
    _int_values,
    _on_grid,
)

# -- arrays and tensors -------------------------------------------------------


def _shapes(
    shape: Shape | st.SearchStrategy[tuple[int, ...]] | None,
) -> st.SearchStrategy[tuple[int, ...]]:
    if shape is None:
        return hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=8)
    if isinstance(shape, st.SearchStrategy):
        return shape
    sides = (shape,) if isinstance(shape, numbers.Integral) else shape
    if not isinstance(sides, tuple | list) or not all(
        isinstance(n, numbers.Integral) and not isinstance(n, bool | np.bool_) and n >= 0
        for n in sides
    ):
        raise ShapeError(
            f"arrays(): shape must be an int, a tuple of non-negative ints or a strategy of "
            f"tuples, got {type(shape).__name__} {shape!r:.60}; pass e.g. shape=(3, 5)"
        )
    if math.prod(int(n) for n in sides) > _MAX_VALUES:
        raise ShapeError(
            f"arrays(): shape {tuple(sides)!r:.60} holds more than {_MAX_VALUES:,} values, "
            "more than a test can draw; pass a smaller shape"
        )
    return st.just(tuple(int(n) for n in sides))


_MAX_VALUES = 2**24  # (hypothesis draws every value; its buffer runs out long before)


def _fill(elements: st.SearchStrategy[Any], shape: tuple[int, ...]) -> st.SearchStrategy:
    """Arrays of `shape`: every element its own draw, or mostly one repeated value.

    The second kind (at least three elements in four share a fill value) is
    what exposes reductions: many equal terms meeting a large one is the
    classic way an accumulator loses them. It shrinks toward one repeated
    simple value, the first toward zeros.
    """
    n = math.prod(shape)

    def as_array(xs: list[Any]) -> np.ndarray:
        return np.asarray(xs, np.float32).reshape(shape)

    independent = st.lists(elements, min_size=n, max_size=n).map(as_array)
    if n < 2:
        return independent

    def filled(fill: Any, overrides: list[tuple[int, Any]]) -> np.ndarray:
        xs = [fill] * n
        for i, v in overrides:
            xs[i] = v
        return as_array(xs)

    # A common fill value with at most a quarter of the elements drawn apart.
    # (hypothesis may print a failing one as `filled(fill=..., overrides=[(index, value)])`.)
    overrides = st.lists(st.tuples(st.integers(0, n - 1), elements), max_size=max(1, n // 4))
    return st.one_of(independent, st.builds(filled, fill=elements, overrides=overrides))


def _representable_int_array(
    fmt: IntFormat, shape: tuple[int, ...], bounds: _Bounds
) -> st.SearchStrategy[np.ndarray]:
    """Codes times one power-of-two scale, the largest code set to ±qmax.

    That element is the absmax, so the per-tensor scale comes out as exactly
    the drawn power of two and every element decodes back to itself. Under
    bounds, only scales whose ±qmax·2**k lies inside them are drawn, and each
    code from those whose value does.
    """
    n = math.prod(shape)
    q = fmt.qmax
    choices = _int_choices(fmt, bounds)

    def build(k: int, sign: int, codes: list[int]) -> np.ndarray:
        c = np.asarray(codes, np.float64)
        if n:  # one element is the absmax: the scale comes out as 2**k exactly
            big = np.abs(c) == q
            c[int(np.argmax(big)) if big.any() else 0] = sign * q
        return np.asarray(c * math.ldexp(1.0, k), np.float32).reshape(shape)

    def for_scale(choice: tuple[int, list[int], list[int]]) -> st.SearchStrategy[np.ndarray]:
        k, signs, allowed = choice
        code = st.sampled_from(allowed)
        codes = st.lists(code, min_size=n, max_size=n)
        return st.tuples(st.sampled_from(signs), codes).map(lambda t: build(k, *t))

    return st.sampled_from(choices).flatmap(for_scale)


def _int_choices(fmt: IntFormat, bounds: _Bounds) -> list[tuple[int, list[int], list[int]]]:
    """(k, signs of ±qmax·2**k inside bounds, codes c with c·2**k inside) per usable k."""
    lo, hi = _INT_SCALE_EXPONENTS
    q = fmt.qmax
    out = []
    for k in range(lo, hi + 1):
        step = math.ldexp(1.0, k)
        signs = [s for s in (1, -1) if s * q * step in bounds]
        codes = (-1, 1) if fmt.binary else range(-q, q + 1)
        allowed = [c for c in codes if c * step in bounds]
        if signs:
            out.append((k, signs, allowed))
    if not out:
        raise KitError(
            f"no array of {fmt.name} codes round-trips inside [{bounds.lo}, {bounds.hi}]: its "
            f"absmax ±{q}·2**k must lie inside; widen the bounds"
        )
    return out


def arrays(
    fmt: Format | str,
    shape: Shape | st.SearchStrategy[tuple[int, ...]] | None = None,
    *,
    representable: bool = False,
    min_value: float | None = None,
    max_value: float | None = None,
    allow_nan: bool = True,
    allow_infinity: bool = True,
    allow_subnormal: bool = True,
) -> st.SearchStrategy[np.ndarray]:
    """numpy float32 arrays of `values(fmt)` (or `representable(fmt)`) elements.

    Half the draws make every element its own draw, so a 64-element array
    holds dozens of hard cases; the other half repeat one value with a few
    others set apart, the shape that exposes accumulation bugs. For an
    integer format one power-of-two scale is drawn per array, so code ties
    are ties of that array's scale.

    Args:
        fmt: a `dtypes.Format` or a format name.
        shape: an int, a tuple, or a strategy of tuples; by default rank 1
            or 2 with sides up to 8 (shrinking toward small shapes).
        representable: draw only values on `fmt`'s grid (for integer formats,
            arrays that round-trip as a whole under per-tensor scaling).
        min_value: as in `values`.
        max_value: as in `values`.
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
    _check_flags(
        "arrays()",
        representable=representable,
        allow_nan=allow_nan,
        allow_infinity=allow_infinity,
        allow_subnormal=allow_subnormal,
    )
    bounds = _Bounds(min_value, max_value)
    flags = (allow_nan, allow_infinity, allow_subnormal, bounds)
    # refuse impossible bounds now, not at the first draw
    if isinstance(fmt, FloatFormat):
        _float_values(fmt, *flags)
        if representable:
            _on_grid(_float_format(fmt), allow_subnormal, bounds)
    elif isinstance(fmt, IntFormat) and representable:
        _int_choices(fmt, bounds)

    def for_shape(shp: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
        if isinstance(fmt, IntFormat):
            if representable:
                return _representable_int_array(fmt, shp, bounds)
            lo, hi = _INT_SCALE_EXPONENTS
            return st.integers(lo, hi).flatmap(lambda k: _fill(_int_values(fmt, k, *flags), shp))
        if representable:
            return _fill(_on_grid(_float_format(fmt), allow_subnormal, bounds), shp)
        return _fill(_float_values(_float_format(fmt), *flags), shp)

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

    Examples:
        >>> import numpy as np
        >>> from hypothesis import given, settings
        >>> import dtypes
        >>> @settings(max_examples=5, database=None, deadline=None)
        ... @given(tensors(dtypes.int8, shape=(2, 3)))
        ... def test_int8_tensors(t):
        ...     assert t.format == dtypes.int8 and np.asarray(t).shape == (2, 3)
        >>> test_int8_tensors()
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
