"""Storage formats as frozen value objects: `FloatFormat` and `IntFormat`.

A format says how a number is represented; it never holds data. Equality and
hashing cover the numbers a format can represent and how it rounds, not its
display name, so `FloatFormat(8, 7) == bfloat16`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, ClassVar

import jax
import ml_dtypes
import numpy as np

from . import _codec
from ._encoded import Encoded
from ._errors import FormatError, PrecisionTypeError
from ._rounding import Grid
from ._scaling import Scaling

__all__ = ["FloatFormat", "Format", "IntFormat"]


class Format:
    """Common interface of every storage format.

    Subclasses are frozen dataclasses; see `FloatFormat` and `IntFormat`.
    """

    kind: ClassVar[str]
    name: str

    if TYPE_CHECKING:  # a dataclass field in some subclasses, a property in others

        @property
        def bits(self) -> int:
            """Storage bits per value, scales excluded."""
            ...

    # -- numbers ---------------------------------------------------------
    @property
    def container(self) -> np.dtype:
        """numpy dtype of the array that holds the codes."""
        raise NotImplementedError

    @property
    def code_bits(self) -> int:
        """Width of one value's field in storage (a packed field may exceed `bits`)."""
        return self.container.itemsize * 8

    @property
    def packed(self) -> bool:
        """Whether codes are packed densely into bytes (fields narrower than the container's)."""
        return self.code_bits != self.container.itemsize * 8

    @property
    def is_full_precision(self) -> bool:
        """True for float32 and float64, the formats of logical dtypes."""
        return False

    def default_scaling(self) -> Scaling | None:
        """The scaling used when `encode` is called with `scaling=None`.

        A named composition (`mxfp4`, `nvfp4`, …) is a format carrying its
        scaling in the `scaling` field; that scaling is the default.
        """
        return getattr(self, "scaling", None)

    # -- operations ------------------------------------------------------
    def encode(
        self,
        x: Any,
        *,
        scaling: Scaling | None = None,
        rounding: str = "nearest_even",
        key: jax.Array | None = None,
    ) -> Encoded:
        """Encode `x` (any float array-like) into this format.

        Args:
            x: values to encode; integer and bool input is read as float32.
            scaling: a `PerTensor`/`PerAxis`/`PerBlock` scaling, or None for the
                format's default (unscaled floats, per-tensor integers).
            rounding: one of `ROUNDING_MODES`.
            key: a `jax.random` key, required by `rounding="stochastic"`.

        Returns:
            An `Encoded` pytree holding exactly the bytes the format needs.

        Raises:
            RoundingError: bad rounding mode or missing key (a `ValueError`).
            NonFiniteError: NaN/inf given eagerly to a scaled encoding, or NaN
                to a format without a NaN code (a `ValueError`).
            ScalingError: a scaling that does not fit `x` (a `ValueError`).
            PrecisionTypeError: complex, string or object input (a `TypeError`).
        """
        return _codec.encode(self, x, scaling, rounding, key)

    def check(self, x: Any, *, scaling: Scaling | None = None) -> None:
        """Raise the error `encode(x, scaling=scaling)` would raise, encoding nothing.

        Shapes and (for concrete arrays) values are checked: NaN or inf given
        to a scaled encoding or to a format without NaN, a scaling that does
        not fit `x`. Traced values pass (their group scales become NaN).
        """
        _codec.check(self, x, scaling)

    def decode(self, encoded: Encoded, dtype: Any = np.float32) -> jax.Array:
        """Logical values of `encoded` as a `dtype` array."""
        return _codec.decode(self, encoded, dtype)

    def round(
        self,
        x: Any,
        *,
        scaling: Scaling | None = None,
        rounding: str = "nearest_even",
        key: jax.Array | None = None,
    ) -> jax.Array:
        """Snap `x` onto this format's grid (quantize-dequantize).

        Equals `decode(encode(x))`. The result has `x`'s dtype whenever that
        dtype holds every value the rounding can produce, so it is exact; an
        input dtype that cannot (bfloat16 or float16 input to a format whose
        grid it does not contain, any narrow input to a scaled or integer
        encoding, float32 input to a saturating float64 format) is computed
        and returned in float32 (float64 for float64 formats) instead of being
        rounded a second time. See `result_dtype`. The gradient is
        straight-through: 1 where the value is representable, 0 where it was
        clipped to the format's range.

        Examples:
            >>> import jax.numpy as jnp
            >>> import dtypes
            >>> x = jnp.array([65536.0], jnp.bfloat16)
            >>> r = dtypes.float16.round(x, rounding="toward_zero")
            >>> r.dtype, r.tolist()
            (dtype('float32'), [65504.0])
            >>> dtypes.bfloat16.round(x).dtype
            dtype(bfloat16)
        """
        return _codec.fake_quantize(self, x, scaling, rounding, key)

    def result_dtype(self, dtype: Any, scaling: Scaling | None = None) -> np.dtype:
        """The dtype `round` returns for input of `dtype` (and `scaling`).

        `dtype` itself when it holds every value the rounding can produce;
        otherwise float32, or float64 for float64 input and float64 formats.

        Examples:
            >>> import ml_dtypes, numpy as np
            >>> import dtypes
            >>> dtypes.float8_e4m3fn.result_dtype(ml_dtypes.bfloat16)
            dtype(bfloat16)
            >>> dtypes.float16.result_dtype(ml_dtypes.bfloat16)
            dtype('float32')
            >>> dtypes.int8.result_dtype(np.float16)
            dtype('float32')
        """
        return _codec.result_dtype(self, np.dtype(dtype), scaling)

    def data_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of the data array an encoding of logical `shape` holds.

        Packed codes take whole bytes along the last axis (a scalar takes the
        bytes of one code: one, or two for a 9- to 16-bit layout).

        Examples:
            >>> import dtypes
            >>> dtypes.int4.data_shape((3, 5)), dtypes.int8.data_shape((3, 5))
            ((3, 3), (3, 5))
        """
        shape = tuple(int(n) for n in shape)
        if not self.packed:
            return shape
        if not shape:
            return ((self.code_bits + 7) // 8,)
        return (*shape[:-1], (shape[-1] * self.code_bits + 7) // 8)

    def nbytes(self, shape: tuple[int, ...], scaling: Scaling | None = None) -> int:
        """Exact bytes an encoding of `shape` holds, scales included.

        Computed with Python integers, so any shape gives the exact count.

        Raises:
            ShapeError: `shape` holds something other than non-negative ints
                (a `ValueError`).

        Examples:
            >>> import dtypes
            >>> dtypes.int8.nbytes((2**32, 2**32)) == 2**64 + 4
            True
        """
        return _codec.nbytes(self, shape, scaling)


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

    def __post_init__(self):
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
        native = _NATIVE.get(self._layout())
        return np.dtype(native[1]) if native else None

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
        return Grid(
            self.mantissa_bits, self.emin, self.max, self.has_inf, bool(self.nan), self.saturate
        )

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


@dataclasses.dataclass(frozen=True)
class IntFormat(Format):
    """A symmetric integer format with a float32 scale per group.

    Codes lie in `[-qmax, qmax]` with `qmax = 2**(bits-1) - 1`; a value is
    `code * scale`. 4-, 2- and 1-bit codes are packed into bytes.

    `bits=1` is a *binary* format: codes are ±1 (`sign(x)`, with 0 mapping to
    +1) and the scale is `mean(|x|)` of the group, as in XNOR-style binary
    networks. This is not ml_dtypes' `int1`, whose two values are {-1, 0}.

    Examples:
        >>> IntFormat(4).qmax, IntFormat(4).nbytes((1024, 1024))
        (7, 524292)
    """

    bits: int
    scaling: Scaling | None = dataclasses.field(default=None, kw_only=True)
    name: str = dataclasses.field(default="", kw_only=True, compare=False)

    kind: ClassVar[str] = "int"

    def __post_init__(self):
        if (
            not isinstance(self.bits, int)
            or isinstance(self.bits, bool)
            or self.bits not in (1, 2, 4, 8)
        ):
            raise FormatError(
                f"IntFormat({self.bits!r}) is not supported: bits must be 8, 4, 2 or 1; "
                "pass e.g. IntFormat(8)"
            )
        if not self.name:
            object.__setattr__(self, "name", f"int{self.bits}")

    @property
    def qmax(self) -> int:
        """Largest code magnitude (1 for the binary int1)."""
        return 1 if self.bits == 1 else (1 << (self.bits - 1)) - 1

    @property
    def binary(self) -> bool:
        """True for the ±1 `int1` format."""
        return self.bits == 1

    @property
    def max(self) -> float:
        """Largest code (values are `code * scale`)."""
        return float(self.qmax)

    @property
    def container(self) -> np.dtype:
        return np.dtype(np.int8) if self.bits == 8 else np.dtype(np.uint8)

    @property
    def code_bits(self) -> int:
        return self.bits

    def default_scaling(self) -> Scaling:
        if self.scaling is not None:
            return self.scaling
        from ._scaling import PerTensor

        return PerTensor()

    def __repr__(self) -> str:
        scaling = f", scaling={self.scaling!r}" if self.scaling is not None else ""
        return f"IntFormat({self.bits}{scaling}, name={self.name!r})"
