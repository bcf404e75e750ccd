"""Packing of sub-byte integer codes into bytes.

Layout: codes are packed along the last axis, little end first (int4: two per
byte, low nibble first; int2: four per byte, bits 0-1 first; int1: eight per
byte, bit 0 first). The last axis is padded with zero codes to a whole number
of bytes. int4/int2 codes are stored in two's complement; int1 stores one bit
per value, 1 for +1 and 0 for -1.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

__all__ = ["pack", "packed_length", "unpack"]


def packed_length(n: int, bits: int) -> int:
    """Bytes needed along the last axis for `n` codes of `bits` bits."""
    return math.ceil(n * bits / 8)


def _shifts(per_byte: int, bits: int, ndim: int) -> jax.Array:
    """Bit offsets of the fields of one byte, shaped to broadcast on the last axis."""
    shifts = jnp.arange(per_byte, dtype=jnp.uint8) * jnp.uint8(bits)
    return shifts.reshape((1,) * (ndim - 1) + (per_byte,))


def pack(codes: jax.Array, bits: int) -> jax.Array:
    """Pack codes (last axis) into uint8 bytes.

    `codes` are int8 two's complement values (int4/int2; with `bits=1`, ±1
    codes stored as 1/0) or unsigned uint8 float codes.

    Examples:
        >>> import jax.numpy as jnp
        >>> pack(jnp.array([1, -1, 7], jnp.int8), 4).tolist()
        [241, 7]
    """
    per_byte = 8 // bits
    n = codes.shape[-1]
    pad = packed_length(n, bits) * per_byte - n
    if bits == 1:
        field = (codes > 0).astype(jnp.uint8)
    else:
        field = codes.astype(jnp.uint8) & jnp.uint8((1 << bits) - 1)
    if pad:
        field = jnp.pad(field, [(0, 0)] * (codes.ndim - 1) + [(0, pad)])
    field = field.reshape((*codes.shape[:-1], packed_length(n, bits), per_byte))
    shifts = _shifts(per_byte, bits, field.ndim)
    # Fields occupy disjoint bits, so a sum is an OR.
    return jnp.sum(field << shifts, axis=-1, dtype=jnp.uint8)


def unpack(data: jax.Array, bits: int, n: int, *, signed: bool = True) -> jax.Array:
    """Inverse of `pack`: uint8 bytes to `n` codes along the last axis.

    Signed fields come back as int8 (two's complement; `bits=1` as ±1), unsigned
    ones (float codes) as uint8.
    """
    per_byte = 8 // bits
    shifts = _shifts(per_byte, bits, data.ndim + 1)
    field = (data[..., None] >> shifts) & jnp.uint8((1 << bits) - 1)
    field = field.reshape((*data.shape[:-1], data.shape[-1] * per_byte))[..., :n]
    if not signed:
        return field
    if bits == 1:
        return field.astype(jnp.int8) * 2 - 1
    # Sign-extend a `bits`-wide two's complement field.
    sign = jnp.int8(1 << (bits - 1))
    return (field.astype(jnp.int8) ^ sign) - sign
