"""`Format`: what every storage format is, as numbers, and the operations it offers.

A format says how a number is represented; it never holds data. This module
holds the base class alone: the numbers every format has (`bits`,
`container`, `code_bits`, `packed`, `kind`, the bytes an encoding takes) and
the operations (`encode`, `decode`, `round`, `check`, `result_dtype`). Each
format class names its codec module in `_codec` (`FloatFormat`:
`_float_codec`, `IntFormat`: `_int_codec`, and so on), and the four
operations here hand their arguments to that module's `encode`, `decode`,
`round` and `check`, after checking the rounding mode and its key, which is
the same for every format. The codec is imported on the first operation, by
name: nothing here imports JAX or any codec, so describing a format is cheap
and `import dtypes` stays JAX-free.
"""

from __future__ import annotations

import functools
import importlib
import math
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

import numpy as np

from ._argument_checks import as_dtype, resolve_scaling
from ._rounding_modes import check_rounding
from ._scaling import Scaling, scale_nbytes, shape_of

if TYPE_CHECKING:
    import jax

    from ._encoded import Encoded

__all__ = ["Codec", "Format", "packed_length", "packed_nbytes"]


class Codec(Protocol):
    """What a codec module defines: the four operations of its format class.

    Each takes the format first; `Format`'s methods call them with the
    arguments they were given, unchanged.
    """

    def encode(self, fmt: Any, x: Any, scaling: Any, rounding: str, key: Any) -> Encoded: ...

    def decode(self, fmt: Any, encoded: Any, dtype: Any) -> jax.Array: ...

    def round(self, fmt: Any, x: Any, scaling: Any, rounding: str, key: Any) -> jax.Array: ...

    def check(self, fmt: Any, x: Any, scaling: Any) -> None: ...


@functools.cache
def _codec_module(name: str) -> Codec:
    """The codec module `dtypes.<name>`, imported on first use (codecs import JAX)."""
    return cast(Codec, importlib.import_module(f".{name}", __package__))


def packed_length(n: int, bits: int) -> int:
    """Bytes needed along the last axis for `n` codes of `bits` bits.

    Examples:
        >>> packed_length(5, 6), packed_length(3, 4), packed_length(4, 10)
        (4, 2, 5)
    """
    return math.ceil(n * bits / 8)


def packed_nbytes(shape: tuple[int, ...], bits: int) -> int:
    """Bytes of `bits`-wide codes of logical `shape`, packed along the last axis."""
    lead = math.prod(shape[:-1]) if shape else 1
    return lead * packed_length(shape[-1] if shape else 1, bits)


class Format:
    """Common interface of every storage format.

    Subclasses are frozen dataclasses; see `FloatFormat` and `IntFormat`.
    """

    kind: ClassVar[str]
    name: str
    _codec: ClassVar[str]
    """The module of `dtypes` that encodes, decodes, rounds and checks for this class."""

    if TYPE_CHECKING:  # a dataclass field in some subclasses, a property in others

        @property
        def bits(self) -> int:
            """Storage bits per value, scales excluded."""
            ...

        @property
        def max(self) -> float:
            """Largest value (scaled formats: the largest code, which a group's absmax maps to)."""
            ...

    # -- numbers ---------------------------------------------------------
    @property
    def container(self) -> np.dtype[Any]:
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
        scaling: Scaling | None = getattr(self, "scaling", None)
        return scaling

    # -- operations: computed by the class's codec ------------------------
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
            NonFiniteError: given eagerly, NaN/inf to a scaled encoding, NaN to
                a format without a NaN code, or ±inf to one with neither inf nor
                NaN that does not saturate (a `ValueError`).
            ScalingError: a scaling that does not fit `x` (a `ValueError`).
            PrecisionTypeError: complex, string or object input (a `TypeError`).
        """
        check_rounding(rounding, key)
        return _codec_module(self._codec).encode(self, x, scaling, rounding, key)

    def check(self, x: Any, *, scaling: Scaling | None = None) -> None:
        """Raise the error `encode(x, scaling=scaling)` would raise, encoding nothing.

        Shapes and (for concrete arrays) values are checked: NaN or inf given
        to a scaled encoding or to a format without NaN, a scaling that does
        not fit `x`. Traced values pass (their group scales become NaN).
        """
        _codec_module(self._codec).check(self, x, scaling)

    def decode(self, encoded: Encoded, dtype: Any = np.float32) -> jax.Array:
        """Logical values of `encoded` as a `dtype` array."""
        return _codec_module(self._codec).decode(self, encoded, dtype)

    def round(
        self,
        x: Any,
        *,
        scaling: Scaling | None = None,
        rounding: str = "nearest_even",
        key: jax.Array | None = None,
    ) -> jax.Array:
        """Snap `x` onto this format's grid (quantize-dequantize).

        Equals `decode(encode(x))` but where `encode` has no code to store: ±inf
        into a format with neither inf nor NaN gives ±max (`encode` refuses it
        eagerly), and NaN into a format without a NaN code stays NaN under `jit`
        (`encode` stores code 0 there; eagerly both refuse it). The result has
        `x`'s dtype whenever that dtype holds every value the rounding can
        produce, so it is exact; an input dtype that cannot (bfloat16 or float16
        input to a format whose grid it does not contain, any narrow input to a
        scaled or integer encoding, float32 input to a saturating float64
        format) is computed and returned in float32 (float64 for float64
        formats) instead of being rounded a second time. See `result_dtype`. The
        gradient is straight-through: 1 where the value is representable, 0
        where it was clipped to the format's range.

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
        check_rounding(rounding, key)
        return _codec_module(self._codec).round(self, x, scaling, rounding, key)

    def result_dtype(self, dtype: Any, scaling: Scaling | None = None) -> np.dtype[Any]:
        """The dtype `round` returns for input of `dtype` (and `scaling`).

        `dtype` itself when it holds every value the rounding can produce;
        otherwise float32, or float64 for float64 input and float64 formats.
        Values of a scaled encoding are float32 codes times float32 scales.

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
        given = as_dtype(dtype, f"{self.name}.result_dtype")
        resolve_scaling(self, scaling)
        if given == np.float64:
            return given
        return given if given == np.float32 else np.dtype(np.float32)

    def data_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of the data array an encoding of logical `shape` holds.

        Packed codes take whole bytes along the last axis (a scalar takes the
        bytes of one code: one, or two for a 9- to 16-bit layout).

        Examples:
            >>> import dtypes
            >>> dtypes.int4.data_shape((3, 5)), dtypes.int8.data_shape((3, 5))
            ((3, 3), (3, 5))
        """
        shape = shape_of(shape)
        if not self.packed:
            return shape
        if not shape:
            return (packed_length(1, self.code_bits),)
        return (*shape[:-1], packed_length(shape[-1], self.code_bits))

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
        # Python ints throughout: a numpy int64 product wraps past 2**63.
        shape = shape_of(shape)
        scaling = resolve_scaling(self, scaling)
        if self.packed:
            data = packed_nbytes(shape, self.code_bits)
        else:
            data = math.prod(shape) * self.container.itemsize
        if scaling is None:
            return data
        return data + scale_nbytes(scaling, shape)
