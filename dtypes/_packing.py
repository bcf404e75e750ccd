"""Dense packing of codes of any width from 1 to 16 bits into bytes.

Layout (the same for every width): the codes of the last axis form one
little-endian bit stream. Code `i` occupies stream bits `i * bits` up to
`(i + 1) * bits - 1`, least significant bit first, and stream bit `k` is
bit `k % 8` of byte `k // 8`. So int4 puts two codes in a byte, low nibble
first; int2 four (bits 0-1 first); int1 eight (bit 0 first); a 6-bit code
(fp6) takes 4 values in 3 bytes, a 3-bit one 8 values in 3 bytes and a
10-bit one 4 values in 5 bytes. The last axis is padded with zero codes to a
whole number of bytes (`packed_length`). Signed int codes are stored in
two's complement; int1 stores one bit per value, 1 for +1 and 0 for -1.

Everything is vectorised jnp: the codes are cut into groups of
`lcm(bits, 8) / bits` codes that fill `lcm(bits, 8) / 8` bytes exactly, read
as uint32 words by a bitcast, and each output word of a group is a fixed OR
of shifted fields, unrolled over the at most 8 codes of a group and never
over the data.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["group_shape", "pack", "packed_length", "unpack"]


def packed_length(n: int, bits: int) -> int:
    """Bytes needed along the last axis for `n` codes of `bits` bits.

    Examples:
        >>> packed_length(5, 6), packed_length(3, 4), packed_length(4, 10)
        (4, 2, 5)
    """
    return math.ceil(n * bits / 8)


def group_shape(bits: int) -> tuple[int, int]:
    """(codes, bytes) of the smallest group of `bits`-wide codes that fills whole bytes.

    Examples:
        >>> group_shape(6), group_shape(4), group_shape(3), group_shape(12)
        ((4, 3), (2, 1), (8, 3), (2, 3))
    """
    _check_bits(bits)
    codes = 8 // math.gcd(bits, 8)
    return codes, codes * bits // 8


def _check_bits(bits: int) -> None:
    if not isinstance(bits, int) or isinstance(bits, bool) or not 1 <= bits <= 16:
        raise ValueError(f"codes can be packed at 1 to 16 bits each, got bits={bits!r}")


def _shifts(per_byte: int, bits: int, ndim: int) -> jax.Array:
    """Bit offsets of the fields of one byte, shaped to broadcast on the last axis."""
    shifts = jnp.arange(per_byte, dtype=jnp.uint8) * jnp.uint8(bits)
    return shifts.reshape((1,) * (ndim - 1) + (per_byte,))


def _pad_last(x: jax.Array, length: int) -> jax.Array:
    pad = length - x.shape[-1]
    if pad <= 0:
        return x
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])


def pack(codes: jax.Array, bits: int) -> jax.Array:
    """Pack codes (last axis) into uint8 bytes, `bits` bits each.

    `codes` are int8 two's complement values (int4/int2; with `bits=1`, ±1
    codes stored as 1/0) or unsigned uint8/uint16 codes (float and code-book
    formats); only their low `bits` bits are kept.

    Examples:
        >>> import jax.numpy as jnp
        >>> pack(jnp.array([1, -1, 7], jnp.int8), 4).tolist()
        [241, 7]
        >>> pack(jnp.array([1, 2, 3, 63], jnp.uint8), 6).tolist()
        [129, 48, 252]
    """
    _check_bits(bits)
    n = codes.shape[-1]
    if bits == 1:
        codes = (codes > 0).astype(jnp.uint8)
    if 8 % bits == 0 and bits < 8:
        return _pack_sub_byte(codes, bits, n)
    if bits == 8:
        return codes.astype(jnp.uint8)
    if bits == 16:  # two little-endian bytes per code
        pairs = lax.bitcast_convert_type(codes.astype(jnp.uint16), jnp.uint8)
        return pairs.reshape((*codes.shape[:-1], 2 * n))
    return _pack_dense(codes, bits, n)


def _pack_dense(codes: jax.Array, bits: int, n: int) -> jax.Array:
    """Widths that do not divide a byte: whole groups as uint32 words, by shifts.

    The codes of a group sit one per container (uint8, or uint16 past 8 bits),
    so a bitcast reads them as uint32 words for free; each code's field moves
    to its stream position with a shift, the output words are bitcast back to
    bytes and the group's last unused bytes dropped. Everything is elementwise
    on arrays of one word per group, which vectorises; no strided gathers.
    """
    per_group, group_bytes = group_shape(bits)
    cb = 1 if bits <= 8 else 2  # container bytes per code
    container = jnp.uint8 if cb == 1 else jnp.uint16
    in_words, out_words = per_group * cb // 4, -(-group_bytes // 4)
    groups = math.ceil(n / per_group)
    lead = codes.shape[:-1]
    field = _pad_last(codes, groups * per_group).astype(container)
    words = lax.bitcast_convert_type(field.reshape((*lead, groups, in_words, 4 // cb)), jnp.uint32)
    mask = jnp.uint32((1 << bits) - 1)
    out: list[jax.Array | None] = [None] * out_words
    for i in range(per_group):  # a fixed layout, unrolled over <= 8 codes
        src = 8 * cb * i
        v = (words[..., src // 32] >> jnp.uint32(src % 32)) & mask
        pos = i * bits
        w, d = pos // 32, pos % 32
        out[w] = _or(out[w], v << jnp.uint32(d))
        if d + bits > 32:
            out[w + 1] = _or(out[w + 1], v >> jnp.uint32(32 - d))
    packed = jnp.stack(out, axis=-1)
    as_bytes = lax.bitcast_convert_type(packed, jnp.uint8).reshape((*lead, groups, 4 * out_words))
    data = as_bytes[..., :group_bytes].reshape((*lead, groups * group_bytes))
    return data[..., : packed_length(n, bits)]


def _or(acc: jax.Array | None, part: jax.Array) -> jax.Array:
    return part if acc is None else acc | part


def _pack_sub_byte(codes: jax.Array, bits: int, n: int) -> jax.Array:
    per_byte = 8 // bits
    field = codes.astype(jnp.uint8) & jnp.uint8((1 << bits) - 1)
    field = _pad_last(field, packed_length(n, bits) * per_byte)
    field = field.reshape((*codes.shape[:-1], packed_length(n, bits), per_byte))
    shifts = _shifts(per_byte, bits, field.ndim)
    # Fields occupy disjoint bits, so a sum is an OR.
    return jnp.sum(field << shifts, axis=-1, dtype=jnp.uint8)


def unpack(data: jax.Array, bits: int, n: int, *, signed: bool = True) -> jax.Array:
    """Inverse of `pack`: uint8 bytes to `n` codes of `bits` bits along the last axis.

    Signed fields come back as int8 (two's complement; `bits=1` as ±1), unsigned
    ones (float and code-book codes) as uint8, or uint16 when wider than 8 bits.

    Examples:
        >>> import jax.numpy as jnp
        >>> unpack(jnp.array([129, 48, 252], jnp.uint8), 6, 4, signed=False).tolist()
        [1, 2, 3, 63]
    """
    _check_bits(bits)
    if signed and bits > 8:
        raise ValueError(f"signed codes are at most 8 bits wide, got bits={bits}")
    if 8 % bits == 0 and bits < 8:
        field = _unpack_sub_byte(data, bits, n)
    else:
        field = _unpack_dense(data, bits, n)
    if not signed:
        return field
    if bits == 1:
        return field.astype(jnp.int8) * 2 - 1
    # Sign-extend a `bits`-wide two's complement field.
    sign = jnp.int8(1 << (bits - 1)) if bits < 8 else jnp.int8(-128)
    return (field.astype(jnp.int8) ^ sign) - sign


def _unpack_sub_byte(data: jax.Array, bits: int, n: int) -> jax.Array:
    per_byte = 8 // bits
    shifts = _shifts(per_byte, bits, data.ndim + 1)
    field = (data[..., None] >> shifts) & jnp.uint8((1 << bits) - 1)
    return field.reshape((*data.shape[:-1], data.shape[-1] * per_byte))[..., :n]


def _unpack_dense(data: jax.Array, bits: int, n: int) -> jax.Array:
    """Inverse of `_pack_dense` (and of the 16-bit byte pairs)."""
    lead = data.shape[:-1]
    if bits == 8:
        return data[..., :n]
    if bits == 16:
        pairs = data[..., : 2 * n].reshape((*lead, n, 2))
        return lax.bitcast_convert_type(pairs, jnp.uint16)
    per_group, group_bytes = group_shape(bits)
    cb = 1 if bits <= 8 else 2
    container = jnp.uint8 if cb == 1 else jnp.uint16
    in_words, out_words = per_group * cb // 4, -(-group_bytes // 4)
    groups = math.ceil(n / per_group)
    b = _pad_last(data[..., : groups * group_bytes], groups * group_bytes)
    b = b.reshape((*lead, groups, group_bytes))
    b = _pad_last(b, 4 * out_words).reshape((*lead, groups, out_words, 4))
    words = lax.bitcast_convert_type(b, jnp.uint32)
    mask = jnp.uint32((1 << bits) - 1)
    out: list[jax.Array | None] = [None] * in_words
    for i in range(per_group):  # a fixed layout, unrolled over <= 8 codes
        pos = i * bits
        w, d = pos // 32, pos % 32
        v = words[..., w] >> jnp.uint32(d)
        if d + bits > 32:
            v = v | (words[..., w + 1] << jnp.uint32(32 - d))
        dst = 8 * cb * i
        out[dst // 32] = _or(out[dst // 32], (v & mask) << jnp.uint32(dst % 32))
    codes = lax.bitcast_convert_type(jnp.stack(out, axis=-1), container)
    return codes.reshape((*lead, groups * per_group))[..., :n]
