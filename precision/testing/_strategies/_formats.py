"""Strategies for formats, rounding modes, scalings and PRNG keys."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st

import dtypes
from dtypes import (
    FloatFormat,
    Format,
    IntFormat,
    PerAxis,
    PerBlock,
    PerTensor,
    PrecisionTypeError,
    Scaling,
)

if TYPE_CHECKING:
    import jax


from ..._errors import KitError
from ._constants import _KINDS, _check_count, _check_flag
from ._values import _check_format

# -- formats, roundings, scalings, keys ---------------------------------------


def formats(
    kinds: str | Sequence[str] = _KINDS,
    min_bits: int = 1,
    max_bits: int = 64,
    include_custom: bool = False,
    include_named: bool = False,
) -> st.SearchStrategy[Format]:
    """Formats from the registry (`dtypes.FORMATS`), optionally custom float layouts too.

    Shrinks toward the first matching format in registry order.

    Args:
        kinds: "float", "int" or both.
        min_bits: smallest storage width (`fmt.bits`) to draw.
        max_bits: largest storage width. float64 is drawn only when
            `jax_enable_x64` is on when the strategy is built: without it,
            float64 cannot encode or round.
        include_custom: also draw `dtypes.FloatFormat(e, m)` layouts with
            2 <= e <= 8 and 0 <= m <= 23, IEEE-style or `finite`, saturating
            or not (only when "float" is among `kinds`). Layouts whose values
            leave float32's range (finite with e = 8) are not drawn.
        include_named: also draw the float and int entries of
            `dtypes.ENCODINGS`: ml_dtypes' layouts (`float4_e2m1fn`, both fp6,
            `float8_e4m3`, `float8_e3m4`) and the OCP MX / NVFP4 compositions
            (`mxfp4`, `nvfp4`, `mxint8`, …), which carry their own scaling.

    Returns:
        A strategy of `dtypes.Format`s.

    Raises:
        KitError: (a ValueError) an unknown kind, or no format fits the
            bounds.
        PrecisionTypeError: (a TypeError) kinds, bits or flags of the wrong type.

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
    if not isinstance(kinds, str | Sequence):
        raise PrecisionTypeError(
            f"formats(): kinds must be 'float', 'int' or a sequence of them, got "
            f"{type(kinds).__name__} {kinds!r:.60}; pass e.g. kinds='float'"
        )
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    unknown = [k for k in kinds if k not in _KINDS]
    if unknown or not kinds:
        raise KitError(
            f"formats(kinds={kinds!r}): each kind must be 'float' or 'int'; pass e.g. "
            "kinds=('float', 'int')"
        )
    _check_count(min_bits, "min_bits", "formats()")
    _check_count(max_bits, "max_bits", "formats()")
    _check_flag(include_custom, "include_custom", "formats()")
    _check_flag(include_named, "include_named", "formats()")
    import jax

    x64 = jax.config.read("jax_enable_x64")
    pool = list(dtypes.FORMATS.values())
    if include_named:
        pool += [f for f in dtypes.ENCODINGS.values() if f.kind in _KINDS]
    registry = [
        f
        for f in pool
        if f.kind in kinds and min_bits <= f.bits <= max_bits and (x64 or f.bits <= 32)
    ]
    branches: list[st.SearchStrategy[Format]] = []
    if registry:
        branches.append(st.sampled_from(registry))
    if include_custom and "float" in kinds and min_bits <= 32 and max_bits >= 3:
        branches.append(_custom_float_formats(min_bits, max_bits))
    if not branches:
        known = ", ".join(f"{f.name} ({f.bits})" for f in dtypes.FORMATS.values())
        raise KitError(
            f"no format has kind in {kinds} and {min_bits} <= bits <= {max_bits}; "
            f"the registry holds {known}, or pass include_custom=True"
        )
    return st.one_of(branches)


@st.composite
def _custom_float_formats(draw: st.DrawFn, min_bits: int, max_bits: int) -> FloatFormat:
    # 1 + e + m bits with 2 <= e <= 8 and 0 <= m <= 23 (e = 1 IEEE layouts
    # have no normal numbers at all and are left out).
    bits = draw(st.integers(max(3, min_bits), min(32, max_bits)))
    e = draw(st.integers(max(2, bits - 24), min(8, bits - 1)))
    m = bits - 1 - e
    if e == 8 and m == 0:
        e, m = 7, 1
    # Without mantissa bits the top binade holds a single code: only a finite
    # layout without NaN can use it. With 8 exponent bits a finite layout would
    # reach 2**128, past float32's range, so it keeps IEEE infinities.
    finite = True if m == 0 else (False if e == 8 else draw(st.booleans()))
    saturate = draw(st.booleans())
    nan = False if m == 0 else None
    return FloatFormat(e, m, finite=finite, nan=nan, saturate=saturate)


def roundings(deterministic_only: bool = False) -> st.SearchStrategy[str]:
    """Rounding mode names from `dtypes.ROUNDING_MODES` (shrinks toward "nearest_even").

    "stochastic" needs a `key=` when rounding; draw one with `keys()`.

    Args:
        deterministic_only: leave "stochastic" out.

    Examples:
        >>> from hypothesis import given, settings
        >>> import numpy as np
        >>> import dtypes
        >>> @settings(max_examples=10, database=None, deadline=None)
        ... @given(roundings(deterministic_only=True))
        ... def test_grid_values_are_kept(mode):
        ...     assert float(dtypes.float16.round(np.float32(0.5), rounding=mode)) == 0.5
        >>> test_grid_values_are_kept()
    """
    _check_flag(deterministic_only, "deterministic_only", "roundings()")
    modes = [r for r in dtypes.ROUNDING_MODES if not (deterministic_only and r == "stochastic")]
    return st.sampled_from(modes)


def keys() -> st.SearchStrategy[jax.Array]:
    """`jax.random` keys, for `rounding="stochastic"` (shrinks toward `key(0)`).

    Examples:
        >>> import numpy as np
        >>> from hypothesis import given, settings
        >>> import dtypes
        >>> @settings(max_examples=5, database=None, deadline=None)
        ... @given(keys())
        ... def test_stochastic_rounding_stays_on_a_neighbour(key):
        ...     y = float(dtypes.bfloat16.round(np.float32(1.001), rounding="stochastic", key=key))
        ...     assert y in (1.0, 1.0078125)
        >>> test_stochastic_rounding_stays_on_a_neighbour()
    """
    import jax

    return st.integers(0, 2**32 - 1).map(jax.random.key)


def scalings(
    fmt: Format | None = None,
    *,
    ndim: int = 1,
    block_sizes: Sequence[int] = (32, 2, 4, 8, 16, 3),
    scale_formats: Sequence[str] = ("float32",),
) -> st.SearchStrategy[Scaling | None]:
    """Scalings that fit arrays with `ndim` dimensions, for `fmt`.

    Draws `None` (unscaled; only for float formats or `fmt=None`),
    `PerTensor()`, `PerAxis(axis)` and `PerBlock(size, axis)`, each with or
    without `power_of_two`. Float formats with float32's exponent range
    (bfloat16, tf32, float32, float64) are never scaled: only `None`; nor is
    a scale format (E8M0). Code books and zero-point integers get absmax
    scales only (no `power_of_two`, scales held at float32 or 16 bits).
    Shrinks toward `None` (floats) or `PerTensor()`.

    Args:
        fmt: the format the scaling is for; integer formats always scale.
        ndim: rank of the arrays the scaling will meet; 0 allows only
            `None` and `PerTensor()`.
        block_sizes: `PerBlock` sizes to draw from (the first is preferred).
        scale_formats: formats of the scales to draw from (`dtypes.SCALE_FORMATS`;
            the first is preferred). Only valid pairs are drawn: E8M0 with
            `power_of_two`, float8_e4m3fn (two-level) without it and only for
            float formats, int1 only with float32/bfloat16/float16 scales.

    Examples:
        >>> from hypothesis import given, settings
        >>> import dtypes
        >>> @settings(max_examples=20, database=None)
        ... @given(scalings(dtypes.int4, ndim=2))
        ... def test_fits(scaling):
        ...     assert scaling is not None and len(scaling.scale_shape((3, 64))) == 2
        >>> test_fits()
    """
    if fmt is not None:
        fmt = _check_format(fmt, "scalings()")
    _check_count(ndim, "ndim", "scalings()")
    if isinstance(block_sizes, str | bytes) or not isinstance(block_sizes, Sequence):
        raise PrecisionTypeError(
            f"scalings(): block_sizes must be a sequence of ints, got "
            f"{type(block_sizes).__name__} {block_sizes!r:.60}; pass e.g. block_sizes=(32, 16)"
        )
    if not block_sizes:
        raise KitError("scalings(): block_sizes is empty; pass e.g. block_sizes=(32, 16)")
    for size in block_sizes:
        _check_count(size, "each of block_sizes", "scalings()", least=1)
    if isinstance(scale_formats, str | bytes) or not isinstance(scale_formats, Sequence):
        raise PrecisionTypeError(
            f"scalings(): scale_formats must be a sequence of names, got "
            f"{type(scale_formats).__name__} {scale_formats!r:.60}; pass e.g. "
            "scale_formats=('float32',)"
        )
    # int1's scale is a mean, code books and zero points map each group onto their
    # codes exactly: none has a power-of-two variant.
    absmax_only = isinstance(fmt, IntFormat) and fmt.binary
    absmax_only = absmax_only or (fmt is not None and fmt.kind in ("codebook", "uint"))
    pairs = _scale_pairs(fmt, absmax_only, scale_formats)
    if fmt is not None and fmt.kind == "scale":
        return st.none()  # a scale format takes no scaling of its own
    branches: list[st.SearchStrategy[Any]] = []
    if fmt is None or isinstance(fmt, FloatFormat):
        branches.append(st.none())
        if fmt is not None and fmt.exponent_bits >= 8:
            # A format with float32's exponent range gains nothing from a scale
            # (and dtypes refuses one): unscaled only.
            return st.none()
    branches.append(_scaling(PerTensor, pairs))
    if ndim >= 1:
        axes = st.integers(0, ndim - 1)
        branches.append(_scaling(PerAxis, pairs, axes))
        sizes = st.sampled_from(tuple(block_sizes))
        branches.append(_scaling(PerBlock, pairs, sizes, axes))
    return st.one_of(branches)


def _scale_pairs(
    fmt: Format | None, absmax_only: bool, scale_formats: Sequence[str]
) -> st.SearchStrategy[tuple[bool, str]]:
    """(power_of_two, scale_format) pairs valid for `fmt`, simplest first."""
    unknown = [f for f in scale_formats if f not in dtypes.SCALE_FORMATS]
    if unknown or not scale_formats:
        raise KitError(
            f"scalings(scale_formats={tuple(scale_formats)!r}): each must be one of "
            f"{', '.join(dtypes.SCALE_FORMATS)}"
        )
    pairs = []
    for name in scale_formats:
        for p in (False, True):
            if p and absmax_only:
                continue
            if name == "float8_e8m0fnu" and (not p or absmax_only):
                continue
            if name == "float8_e4m3fn" and (p or (fmt is not None and fmt.kind != "float")):
                continue
            pairs.append((p, name))
    if not pairs:
        raise KitError(
            f"no scale format in {tuple(scale_formats)!r} can scale {getattr(fmt, 'name', fmt)}"
        )
    return st.sampled_from(pairs)


@st.composite
def _scaling(draw: st.DrawFn, cls: Any, pairs: Any, *args: Any) -> Scaling:
    p, name = draw(pairs)
    scaling: Scaling = cls(*(draw(a) for a in args), power_of_two=p, scale_format=name)
    return scaling
