"""Bit codes of float layouts that no numpy type holds (e.g. e2m1, e3m2).

Such formats of 8 bits or fewer are stored as their own codes in uint8
(packed when 4 bits or fewer), so MXFP4 really takes 4 bits a value. The
conversions are integer bit operations on float32 patterns, for the same
reasons as the rounding: no arithmetic that XLA could flush.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._bit_rounding import _SOURCES, compose_bits

if TYPE_CHECKING:
    from ._float import FloatFormat

__all__ = ["from_codes", "nearest_codes", "to_codes"]

_F32 = _SOURCES[jnp.dtype(jnp.float32)]


def _nan_code(fmt: FloatFormat) -> int:
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    if fmt.finite:
        return (1 << (e + m)) - 1 if fmt.nan else 0  # no NaN code: see to_codes
    return (((1 << e) - 1) << m) | (1 << (m - 1))  # a quiet NaN


def to_codes(fmt: FloatFormat, v: jax.Array) -> jax.Array:
    """uint8 codes of float32 values that already lie on `fmt`'s grid.

    A format with no NaN code (the sub-8-bit finite ones) cannot store NaN;
    NaN becomes code 0 here. `encode` refuses NaN eagerly for those formats,
    and a scaled encoding turns the group's scale into NaN instead.
    """
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    u = lax.bitcast_convert_type(v.astype(jnp.float32), jnp.uint32)
    sign = u >> 31
    mag = u & jnp.uint32(0x7FFFFFFF)
    # Normal values: the float32 pattern shifted to m mantissa bits is the
    # code plus the difference of the exponent biases.
    rebias = jnp.uint32((127 - fmt.bias) << m)
    code_normal = (mag >> (23 - m)) - rebias
    # Subnormal values (below 2**emin, float32 normals or subnormals alike):
    # sig * 2**(ev - 23) = k * 2**(emin - m), so k = sig >> (23 + emin - m - ev).
    biased = (mag >> 23).astype(jnp.int32)
    sig = (mag & jnp.uint32(0x7FFFFF)) | jnp.where(biased > 0, jnp.uint32(1 << 23), jnp.uint32(0))
    shift = jnp.clip(23 + fmt.emin - m - (jnp.maximum(biased, 1) - 127), 0, 31)
    code_sub = sig >> shift.astype(jnp.uint32)
    min_normal = int(np.array(fmt.min_normal, np.float32).view(np.uint32))
    code = jnp.where(mag >= min_normal, code_normal, code_sub)
    if fmt.has_inf:
        code = jnp.where(mag == 0x7F800000, jnp.uint32(((1 << e) - 1) << m), code)
    code = jnp.where(mag > 0x7F800000, jnp.uint32(_nan_code(fmt)), code)
    if fmt.finite and not fmt.nan:
        sign = jnp.where(mag > 0x7F800000, jnp.uint32(0), sign)
    # layouts of 9 to 16 bits (packed densely) have uint16 codes
    return (code | (sign << (e + m))).astype(jnp.uint8 if fmt.bits <= 8 else jnp.uint16)


def from_codes(fmt: FloatFormat, codes: jax.Array) -> jax.Array:
    """float32 values of uint8 codes of `fmt` (exact; subnormals kept)."""
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    c = codes.astype(jnp.uint32)
    sign = (c >> (e + m)) & 1
    ef = ((c >> m) & ((1 << e) - 1)).astype(jnp.int32)
    mf = c & ((1 << m) - 1)
    r = jnp.where(ef > 0, mf | (1 << m), mf)
    qe = jnp.maximum(ef, 1) - fmt.bias - m
    bits = compose_bits(r, qe, _F32)
    top = ef == (1 << e) - 1
    if not fmt.finite:
        bits = jnp.where(
            top, jnp.where(mf == 0, jnp.uint32(0x7F800000), jnp.uint32(0x7FC00000)), bits
        )
    elif fmt.nan:
        bits = jnp.where(top & (mf == (1 << m) - 1), jnp.uint32(0x7FC00000), bits)
    return lax.bitcast_convert_type(bits | (sign << 31), jnp.float32)


def nearest_codes(fmt: FloatFormat, x: jax.Array) -> jax.Array | None:
    """uint8 codes of float32 `x` rounded to nearest-even, for formats of ≤ 5 bits.

    Such a format has at most 15 positive values, so the magnitude code is
    just the number of midpoints between neighbours that |x| lies above
    (at a midpoint itself, above exactly when the upper code is the even
    one). Comparing bit patterns, not floats, keeps the subnormal-flushing
    CPU out of it. Counting stops at the top code, which is saturation, the
    only overflow a format without inf and NaN has. Returns None where the
    direct rounding path applies instead (wider formats, inf or NaN codes).
    """
    if fmt.bits > 5 or not fmt.finite or fmt.nan or fmt.mantissa_bits == 0:
        return None  # (with no mantissa bits "even" is not the code's parity)
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    codes = np.arange(1 << (e + m), dtype=np.uint32)
    ef, mf = codes >> m, codes & ((1 << m) - 1)
    values = np.where(
        ef == 0,
        mf * 2.0 ** (fmt.emin - m),
        (1 + mf / 2.0**m) * 2.0 ** (ef.astype(np.int64) - fmt.bias),
    )
    mids = ((values[1:] + values[:-1]) / 2).astype(np.float32).view(np.uint32)
    u = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    mag = u & jnp.uint32(0x7FFFFFFF)
    count = jnp.zeros(x.shape, jnp.uint32)
    for k, mid in enumerate(mids.tolist()):
        upper_even = (k + 1) % 2 == 0
        above = (mag >= mid) if upper_even else (mag > mid)
        count = count + above.astype(jnp.uint32)
    # NaN (only reachable under tracing: encode refuses it eagerly) takes
    # code 0, as in `to_codes`, instead of counting past every midpoint to ±max.
    nan = mag > jnp.uint32(0x7F800000)
    count = jnp.where(nan, jnp.uint32(0), count)
    sign = jnp.where(nan, jnp.uint32(0), u >> 31)
    return (count | (sign << (e + m))).astype(jnp.uint8)
