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
    return jax.jit(
        lambda x: _from_float64(x) if x.dtype == jnp.float64 else x.astype(jnp.float8_e8m0fnu)
    )


def _from_float64(x: jax.Array) -> jax.Array:
    """E8M0 bytes of float64 `x` by the float32 rule, computed on the bits.

    XLA's own float64 conversion turns a positive value below 2**-127 into NaN,
    where every positive float32 below it (subnormals included) becomes 2**-127.
    Here: the nearest power of two, a tie (a mantissa of exactly 1.5) going up;
    anything positive below 2**-127 is 2**-127, and in the binade of 2**-127 itself
    any value above it goes up to 2**-126, as ml_dtypes rounds float32's subnormals
    (no mantissa bit of the byte to tie on there). Zero, negative values, inf and
    values from 1.5 * 2**127 have no code and become NaN, as in float32.
    """
    bits = lax.bitcast_convert_type(x, jnp.uint64)
    exponent = ((bits >> 52) & 0x7FF).astype(jnp.int32) - 1023  # unbiased; -1023: subnormal
    mantissa = bits & jnp.uint64((1 << 52) - 1)
    up = jnp.where(exponent == -127, mantissa != 0, mantissa >= jnp.uint64(1 << 51))
    byte = jnp.clip(exponent + 127 + up.astype(jnp.int32), 0, 255)
    # NaN, inf (the top exponent), zero and negative values, told from the bits: a
    # comparison may read a subnormal as zero (XLA:CPU)
    nan = (exponent == 1024) | ((bits << 1) == 0) | ((bits >> 63) != 0)
    byte = jnp.where(nan, 255, byte).astype(jnp.uint8)
    return lax.bitcast_convert_type(byte, jnp.float8_e8m0fnu)


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
