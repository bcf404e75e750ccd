"""`FloatFormat`: binary floating-point layouts, and how they encode, decode and round.

The class and its numbers (`max`, `eps`, `emin`, `native_dtype`, the
container and whether codes are packed) need only numpy and ml_dtypes. The
operations are computed in its codec, `_float_codec`, which `Format`'s methods
import on first use: building or looking up a format, as `import dtypes`
does, loads no JAX. Which dtype `round` returns is decided here, from the
numbers alone.

A format says how a number is represented; it never holds data. Equality and
hashing cover the numbers a format can represent and how it rounds, not its
display name, so `FloatFormat(8, 7) == bfloat16`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING, Any, ClassVar

import ml_dtypes
import numpy as np

from ._argument_checks import (
    as_dtype,
    check_format_fields,
    check_scaling_field,
    resolve_scaling,
)
from ._errors import FormatError, PrecisionTypeError
from ._format import Format
from ._scaling import Scaling

if TYPE_CHECKING:
    from ._bit_rounding import Grid

__all__ = ["FloatFormat"]


# Layouts that ml_dtypes/numpy implement natively, keyed by
# (exponent bits, mantissa bits, finite, has NaN).
_NATIVE: dict[tuple[int, int, bool, bool], tuple[str, Any]] = {
    (11, 52, False, True): ("float64", np.float64),
    (8, 23, False, True): ("float32", np.float32),
    (8, 7, False, True): ("bfloat16", ml_dtypes.bfloat16),
    (5, 10, False, True): ("float16", np.float16),
    (4, 3, True, True): ("float8_e4m3fn", ml_dtypes.float8_e4m3fn),
    (5, 2, False, True): ("float8_e5m2", ml_dtypes.float8_e5m2),
    (4, 3, False, True): ("float8_e4m3", ml_dtypes.float8_e4m3),
    (3, 4, False, True): ("float8_e3m4", ml_dtypes.float8_e3m4),
}


@dataclasses.dataclass(frozen=True)
class FloatFormat(Format):
    """A binary floating-point layout: sign, `exponent_bits`, `mantissa_bits`.

    Subnormals are always represented. With `finite=False` (IEEE style) the
    all-ones exponent holds ±inf and NaN. With `finite=True` there are no
    infinities and the all-ones exponent holds numbers too; an 8-bit or wider
    finite format keeps one NaN code (all ones, as `float8_e4m3fn`), a
    narrower one has none (as OCP's float6/float4). `saturate=True` clamps
    overflow to ±max in every rounding mode instead of giving ±inf/NaN.

    Args:
        exponent_bits: 1 to 8 (11 only for float64).
        mantissa_bits: 0 to 23 (52 only for float64).
        finite: no infinities (the "fn" formats).
        nan: override whether a finite format keeps a NaN code.
        saturate: clamp overflow to ±max.
        name: display name; derived from the layout when omitted.

    Examples:
        >>> fmt = FloatFormat(5, 10)
        >>> fmt.name, fmt.max, fmt == FloatFormat(5, 10, name="half")
        ('float16', 65504.0, True)
        >>> FloatFormat(2, 1, finite=True).max
        6.0
    """

    exponent_bits: int
    mantissa_bits: int
    finite: bool = dataclasses.field(default=False, kw_only=True)
    nan: bool | None = dataclasses.field(default=None, kw_only=True)
    saturate: bool = dataclasses.field(default=False, kw_only=True)
    scaling: Scaling | None = dataclasses.field(default=None, kw_only=True)
    name: str = dataclasses.field(default="", kw_only=True, compare=False)

    kind: ClassVar[str] = "float"
    _codec: ClassVar[str] = "_float_codec"

    def __post_init__(self) -> None:
        check_scaling_field(self, self.scaling)
        e, m = self.exponent_bits, self.mantissa_bits
        if not all(isinstance(b, int) and not isinstance(b, bool) for b in (e, m)):
            raise PrecisionTypeError(
                f"FloatFormat needs int bit counts, got ({e!r}, {m!r}); pass e.g. FloatFormat(4, 3)"
            )
        if (e, m) != (11, 52) and not (1 <= e <= 8 and 0 <= m <= 23):
            raise FormatError(
                f"FloatFormat({e}, {m}) is not supported: exponent_bits must be in 1..8 and "
                "mantissa_bits in 0..23 (the layouts a float32 can hold exactly), or (11, 52)"
            )
        check_format_fields(self, f"FloatFormat({e}, {m})", ("finite", "nan", "saturate"))
        nan = self.nan
        if nan is None:
            nan = (not self.finite) or (1 + e + m >= 8)
        if not self.finite and not nan:
            raise FormatError(
                f"FloatFormat({e}, {m}, nan=False): an IEEE-style (finite=False) format always "
                "has NaN; pass finite=True for a format without NaN"
            )
        object.__setattr__(self, "nan", bool(nan))
        if self.finite and e == 8:
            raise FormatError(
                f"FloatFormat(8, {m}, finite=True) would reach 2**128, past float32's range, "
                "which every format must fit in; use finite=False (IEEE style) for 8 exponent bits"
            )
        if not self.finite and e == 1:
            raise FormatError(
                f"FloatFormat(1, {m}) with infinities has no normal numbers (its only "
                "exponent binade above the subnormals holds inf/NaN); pass finite=True"
            )
        if not self.finite and m == 0:
            raise FormatError(
                f"FloatFormat({e}, 0) cannot hold NaN (its top binade is only ±inf); "
                "give it a mantissa bit or pass finite=True"
            )
        if self.finite and self.nan and m == 0:
            raise FormatError(
                f"FloatFormat({e}, 0, finite=True) would spend its whole top binade on NaN; "
                "pass nan=False or give it mantissa bits"
            )
        if not self.name:
            object.__setattr__(self, "name", self._default_name())

    def _default_name(self) -> str:
        """A name that no other layout has, and that `dtypes.get` reads back.

        `fn` marks a finite layout with the usual NaN choice (one NaN code from
        8 bits up, as float8_e4m3fn; none below, as float6_e3m2fn/float4_e2m1fn);
        the other choice is spelled out (`fn_nonan`, `fn_nan`), so
        FloatFormat(4, 3, finite=True, nan=False), whose max is 480, is not
        called float8_e4m3fn (max 448).
        """
        native = _NATIVE.get(self._layout())
        if native:
            base = native[0]
        else:
            base = f"float{self.bits}_e{self.exponent_bits}m{self.mantissa_bits}"
            if self.finite:
                usual_nan = self.bits >= 8
                base += (
                    "fn" if bool(self.nan) == usual_nan else ("fn_nan" if self.nan else "fn_nonan")
                )
        return base + ("_sat" if self.saturate else "")

    def _layout(self) -> tuple[int, int, bool, bool]:
        return (self.exponent_bits, self.mantissa_bits, self.finite, bool(self.nan))

    # -- numbers ---------------------------------------------------------
    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        """Exponent bias, `2**(exponent_bits - 1) - 1`."""
        return (1 << (self.exponent_bits - 1)) - 1

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal number."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Unbiased exponent of the largest finite number."""
        return self.bias + (1 if self.finite else 0)

    @property
    def max(self) -> float:
        """Largest finite value."""
        top_mantissa = (1 << self.mantissa_bits) - (2 if (self.finite and self.nan) else 1)
        return math.ldexp(1 + top_mantissa / (1 << self.mantissa_bits), self.emax)

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value."""
        return math.ldexp(1.0, self.emin)

    @property
    def smallest_subnormal(self) -> float:
        """Smallest positive value."""
        return math.ldexp(1.0, self.emin - self.mantissa_bits)

    @property
    def eps(self) -> float:
        """Distance from 1.0 to the next larger value."""
        # With one exponent bit 1.0 is subnormal, where the spacing is 2**(emin - m).
        return math.ldexp(1.0, max(self.emin, 0) - self.mantissa_bits)

    @property
    def has_inf(self) -> bool:
        """Whether ±inf are representable."""
        return not self.finite

    @property
    def native_dtype(self) -> np.dtype | None:
        """The numpy/ml_dtypes type with exactly this layout, if one exists."""
        return _native_dtype(self._layout())

    @property
    def container(self) -> np.dtype:
        """The native type if one exists; else packed uint8 codes (≤ 16 bits) or float32."""
        if self.native_dtype is not None:
            return self.native_dtype
        return np.dtype(np.uint8) if self.bits <= 16 else np.dtype(np.float32)

    @property
    def code_bits(self) -> int:
        if self.native_dtype is None and self.bits <= 16:
            return self.bits  # packed densely: fp6 takes 4 values in 3 bytes
        return self.container.itemsize * 8

    @property
    def is_full_precision(self) -> bool:
        return self._layout() in ((8, 23, False, True), (11, 52, False, True)) and not self.saturate

    @property
    def grid(self) -> Grid:
        """What the bit-level rounding needs to know of this format."""
        from ._bit_rounding import Grid  # the rounding kernels import JAX

        return Grid(
            self.mantissa_bits, self.emin, self.max, self.has_inf, bool(self.nan), self.saturate
        )

    def result_dtype(self, dtype: Any, scaling: Scaling | None = None) -> np.dtype[Any]:
        """The dtype `round` returns for input of `dtype` (see `Format.result_dtype`)."""
        given = as_dtype(dtype, f"{self.name}.result_dtype")
        return _result_dtype(self, given, resolve_scaling(self, scaling))

    def __repr__(self) -> str:
        args = [str(self.exponent_bits), str(self.mantissa_bits)]
        if self.finite:
            args.append("finite=True")
            if bool(self.nan) != (self.bits >= 8):
                args.append(f"nan={self.nan}")
        if self.saturate:
            args.append("saturate=True")
        if self.scaling is not None:
            args.append(f"scaling={self.scaling!r}")
        return f"FloatFormat({', '.join(args)}, name={self.name!r})"


# (mantissa bits, emin, max, has inf, has NaN) of a grid
_Grid = tuple[int, int, float, bool, bool]


def _params_of_dtype(dtype: np.dtype[Any]) -> _Grid:
    fi = ml_dtypes.finfo(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        specials = np.array([np.inf, np.nan], np.float32).astype(dtype).astype(np.float32)
    return (
        int(fi.nmant),
        int(fi.minexp),
        float(fi.max),
        bool(np.isinf(specials[0])),
        bool(np.isnan(specials[1])),
    )


def _holds(outer: _Grid, inner: _Grid) -> bool:
    """Whether every value (finite, inf, NaN) of the `inner` grid is one of `outer`'s."""
    m_o, emin_o, max_o, inf_o, nan_o = outer
    m_i, emin_i, max_i, inf_i, nan_i = inner
    return (
        m_o >= m_i
        and emin_o - m_o <= emin_i - m_i  # smallest subnormals
        and max_o >= max_i
        and (inf_o or not inf_i)
        and (nan_o or not nan_i)
    )


@functools.cache
def _native_dtype(layout: Any) -> np.dtype | None:
    native = _NATIVE.get(layout)
    return np.dtype(native[1]) if native else None


def _result_dtype(fmt: FloatFormat, dtype: np.dtype[Any], scaling: Scaling | None) -> np.dtype[Any]:
    """The dtype `fmt.round` returns for `dtype` input (see `Format.round`).

    `dtype` itself when it holds every value the rounding can produce: then
    casting the result to it is exact. Otherwise float32 (float64 for float64
    input or a float64 format): a narrow input dtype would round the result a
    second time (float16 input 65504 rounded onto bfloat16 is 65536, which
    float16 holds only as inf).
    """
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return dtype
    if scaling is not None or fmt.default_scaling() is not None:
        # values are float32 codes times float32 scales
        return dtype if dtype == np.float32 else np.dtype(np.float32)
    wide = np.dtype(np.float64 if fmt.exponent_bits == 11 else np.float32)
    d = _params_of_dtype(dtype)
    f = (fmt.mantissa_bits, fmt.emin, fmt.max, fmt.has_inf, bool(fmt.nan))
    if _holds(d, f):
        return dtype
    if _holds((*f[:3], True, True), (*d[:3], False, False)):
        # The format holds every finite value of `dtype`: rounding is the
        # identity on them, and only ±inf can leave `dtype` (a saturating or
        # inf-less format without NaN puts its own max there).
        if not d[3] or (fmt.has_inf and not fmt.saturate) or (fmt.nan and not fmt.saturate):
            return dtype
        return dtype if fmt.max <= d[2] else wide
    return wide
