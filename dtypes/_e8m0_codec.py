"""encode / decode / round / check of `E8M0Format` (`float8_e8m0fnu`), the MX scale bytes.

Encoding is one conversion, done by XLA (bit-identical to ml_dtypes); decoding
into float32 builds the values from their bits. See `_e8m0` for the rules.
`Format`'s methods import this module on first use.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _codec
from ._argument_checks import refuse_scale_format_arguments
from ._encode_input_checks import as_float_array, is_tracer
from ._encoded import Encoded
from ._errors import FormatError
from ._scaling import Scaling

if TYPE_CHECKING:
    from ._e8m0 import E8M0Format

__all__ = ["check", "decode", "encode", "round"]


def encode(fmt: E8M0Format, x: Any, scaling: Scaling | None, rounding: str, key: Any) -> Encoded:
    """Encode `x` into E8M0 bytes (see `E8M0Format` for the rounding)."""
    refuse_scale_format_arguments(fmt, scaling, rounding)
    x = as_float_array(x)
    _refuse_unrepresentable(x)
    return Encoded(_to_e8m0()(x), None, fmt, None)


def decode(fmt: E8M0Format, enc: Encoded, dtype: Any = np.float32) -> jax.Array:
    """Values of E8M0 bytes: byte b is 2**(b - 127), 0xFF is NaN.

    Into float32 the values are built from their bits (byte 0, 2**-127, is a
    float32 subnormal, which a conversion may flush on one backend and keep
    on another); other dtypes convert.
    """
    _codec.check_decodable(fmt, enc, dtype)
    if jnp.dtype(dtype) != jnp.float32:
        return enc.data.astype(jnp.dtype(dtype))
    byte = lax.bitcast_convert_type(enc.data, jnp.uint8).astype(jnp.uint32)
    bits = jnp.where(byte == 0, jnp.uint32(0x00400000), byte << 23)
    bits = jnp.where(byte == 0xFF, jnp.uint32(0x7FC00000), bits)
    return lax.bitcast_convert_type(bits, jnp.float32)


def check(fmt: E8M0Format, x: Any, scaling: Scaling | None) -> None:
    """Raise what `encode` would raise for `x`: a scaling, or (eagerly) a value that
    is not NaN and would become NaN (zero, negative, inf, from 1.5 * 2**127)."""
    refuse_scale_format_arguments(fmt, scaling, "nearest_even")
    _refuse_unrepresentable(as_float_array(x))


# decode(encode(x)) in float32 with the straight-through derivative, as for every
# storage encoding
round = _codec.storage_round


@functools.cache
def _to_e8m0() -> Callable[[jax.Array], jax.Array]:
    """The jitted conversion into E8M0 bytes."""

    def convert(x: jax.Array) -> jax.Array:
        if x.dtype == jnp.float64:
            return _from_float64(x)
        return _from_float32(x.astype(jnp.float32))  # (float16, bfloat16: widened exactly)

    return jax.jit(convert)


def _from_float32(x: jax.Array) -> jax.Array:
    """E8M0 bytes of float32 `x`, computed on the bits: the nearest power of two, a tie
    (a mantissa of exactly 1.5) going up; anything positive below 2**-127 is 2**-127.

    In the binade of 2**-127, float32's subnormals, the tie is 1.5 * 2**-127 as in
    every other binade (ml_dtypes 0.7 rounds so). XLA's own conversion, and ml_dtypes
    before 0.7, send every value above 2**-127 there up to 2**-126, and a backend that
    flushes subnormals would read them as zero: so the bits decide. Zero, negative
    values, inf and values from 1.5 * 2**127 have no code and become NaN.
    """
    bits = lax.bitcast_convert_type(x, jnp.uint32)
    field = ((bits >> 23) & 0xFF).astype(jnp.int32)  # the biased exponent; 0: subnormal
    mantissa = bits & jnp.uint32((1 << 23) - 1)
    # a subnormal is mantissa * 2**-149: 1.5 * 2**-127 is 0x600000 of them
    up = jnp.where(field == 0, mantissa >= jnp.uint32(0x600000), mantissa >= jnp.uint32(1 << 22))
    byte = jnp.minimum(field + up.astype(jnp.int32), 255)  # (2**-127: byte 0, field 0)
    return _bytes(byte, (field == 255) | ((bits << 1) == 0) | ((bits >> 31) != 0))


def _from_float64(x: jax.Array) -> jax.Array:
    """E8M0 bytes of float64 `x` by the float32 rule (`_from_float32`), computed on the
    float64 value's own bits: narrowed to float32 first, a value just below a tie
    could round up onto it. (XLA's own float64 conversion turns a positive value below
    2**-127 into NaN, where every positive float32 below it becomes 2**-127.)"""
    bits = lax.bitcast_convert_type(x, jnp.uint64)
    exponent = ((bits >> 52) & 0x7FF).astype(jnp.int32) - 1023  # unbiased; -1023: subnormal
    mantissa = bits & jnp.uint64((1 << 52) - 1)
    up = mantissa >= jnp.uint64(1 << 51)
    byte = jnp.clip(exponent + 127 + up.astype(jnp.int32), 0, 255)
    return _bytes(byte, (exponent == 1024) | ((bits << 1) == 0) | ((bits >> 63) != 0))


def _bytes(byte: jax.Array, nan: jax.Array) -> jax.Array:
    """`byte` as E8M0, NaN (0xFF) where `nan`: NaN, inf, zero and negative values, told
    from the bits (a comparison may read a subnormal as zero: XLA:CPU)."""
    out = jnp.where(nan, 255, byte).astype(jnp.uint8)
    return lax.bitcast_convert_type(out, jnp.float8_e8m0fnu)


def _refuse_unrepresentable(x: jax.Array) -> None:
    """Refuse, eagerly, values E8M0 would turn into NaN: it holds positive powers of two
    only (NaN itself has a code and stays NaN). Traced values encode as documented."""
    if is_tracer(x):
        return
    v = np.asarray(x, np.float64)
    bad = ~np.isnan(v) & ~((v > 0) & (v < 1.5 * 2.0**127))
    if bad.any():
        first = np.unravel_index(int(np.argmax(bad)), v.shape) if v.ndim else ()
        raise FormatError(
            f"float8_e8m0fnu holds only positive powers of two (2**-127 to 2**127), so "
            f"{int(bad.sum())} of {v.size} values would become NaN silently (the first, "
            f"{float(v[first])!r}, at index {tuple(int(i) for i in first)}); it is a scale "
            "format: use it as a scaling's scale_format (e.g. PerBlock(32, "
            "power_of_two=True, scale_format='float8_e8m0fnu')), or encode these values "
            "in a value format such as 'float8_e4m3fn'"
        )
