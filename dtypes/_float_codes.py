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
from jax import lax

from ._rounding import _SOURCES, compose_bits

if TYPE_CHECKING:
    from ._formats import FloatFormat

__all__ = ["from_codes", "to_codes"]

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
    sign = (u >> 31).astype(jnp.uint32)
    mag = u & jnp.uint32(0x7FFFFFFF)
    biased = (mag >> 23).astype(jnp.int32)
    frac = mag & jnp.uint32(0x7FFFFF)
    sig = frac | jnp.where(biased > 0, jnp.uint32(1 << 23), jnp.uint32(0))
    ev = jnp.maximum(biased, 1) - 127
    normal = ev >= fmt.emin
    ef = jnp.where(normal, ev + fmt.bias, 0).astype(jnp.uint32)
    mf_normal = frac >> (23 - m)
    # A target subnormal is sig * 2**(ev - 23) = k * 2**(emin - m).
    shift = jnp.clip(23 + fmt.emin - m - ev, 0, 31).astype(jnp.uint32)
    mf_sub = sig >> shift
    mf = jnp.where(normal, mf_normal, mf_sub)
    code = (ef << m) | mf
    code = jnp.where(mag == 0, jnp.uint32(0), code)
    if fmt.has_inf:
        code = jnp.where(mag == 0x7F800000, jnp.uint32(((1 << e) - 1) << m), code)
    code = jnp.where(mag > 0x7F800000, jnp.uint32(_nan_code(fmt)), code)
    code = code | (sign << (e + m))
    if fmt.finite and not fmt.nan:
        code = jnp.where(mag > 0x7F800000, jnp.uint32(0), code)
    return code.astype(jnp.uint8)


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
