"""Dense packing of codes of any width from 1 to 16 bits into bytes.

Layout (the same for every width): the codes of the last axis form one
little-endian bit stream. Code `i` occupies stream bits `i * bits` up to
`(i + 1) * bits - 1`, least significant bit first, and stream bit `k` is
bit `k % 8` of byte `k // 8`. So int4 puts two codes in a byte, low nibble
first; int2 four (bits 0-1 first); int1 eight (bit 0 first); a 6-bit code
(fp6) takes 4 values in 3 bytes, a 3-bit one 8 values in 3 bytes and a
10-bit one 4 values in 5 bytes. The last axis is padded with zero codes to a
whole number of bytes (`_format.packed_length`). Signed int codes are stored in
two's complement; int1 stores one bit per value, 1 for +1 and 0 for -1.

Everything is vectorised jnp: the codes are cut into groups of
`lcm(bits, 8) / bits` codes that fill `lcm(bits, 8) / 8` bytes exactly, and
each byte of a group (widths dividing 8) or each 32-bit word of it (other
widths; each code, when unpacking) is a reduction over the group of fixed
shifts, unrolled over the at most 15 bytes of a group and never over the data.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._format import packed_length

__all__ = ["group_shape", "pack", "unpack"]


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
    out: jax.Array = shifts.reshape((1,) * (ndim - 1) + (per_byte,))
    return out


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
    """Widths that do not divide a byte: groups as uint32 words, then bytes.

    Each 32-bit word of a group's bit stream is one reduction over the group's
    codes, each shifted into place (the fields are disjoint, so the sum is an
    OR). The codes are read by as many reductions as a group has words (one
    for fp6), so whatever computed them is not repeated per output byte when
    XLA fuses it in; reductions over a short last axis vectorise on XLA:CPU,
    where strided slices do not. The bytes of a group are then whole words
    bitcast into bytes, and of a last word only the bytes the group uses.
    """
    per_group, group_bytes = group_shape(bits)
    n_words = -(-group_bytes // 4)
    groups = math.ceil(n / per_group)
    lead = codes.shape[:-1]
    field = _pad_last(codes, groups * per_group).astype(jnp.uint32)
    field = field.reshape((*lead, groups, per_group)) & jnp.uint32((1 << bits) - 1)
    at = (1,) * (field.ndim - 1) + (per_group,)
    words = []
    for w in range(n_words):  # a fixed layout, unrolled over <= 4 words
        left = np.full(per_group, 32, np.uint32)  # shifting out every bit: no part
        right = np.zeros(per_group, np.uint32)
        for i in range(per_group):
            s = i * bits - 32 * w  # where code i starts relative to word w
            if -bits < s < 32:
                left[i], right[i] = max(s, 0), max(-s, 0)
        parts = (field << left.reshape(at)) >> right.reshape(at)
        words.append(jnp.sum(parts, axis=-1, dtype=jnp.uint32))
    # Whole words are bitcast into four bytes each; a last word partly used
    # gives its low two bytes by a bitcast of its low half, and its third as a
    # byte of its own: no byte is computed only to be sliced off.
    pieces = [lax.bitcast_convert_type(w, jnp.uint8) for w in words[: group_bytes // 4]]
    rest = group_bytes % 4
    if rest >= 2:
        pieces.append(lax.bitcast_convert_type(words[-1].astype(jnp.uint16), jnp.uint8))
    if rest % 2:
        pieces.append((words[-1] >> np.uint32(8 * (rest - 1))).astype(jnp.uint8)[..., None])
    as_bytes = jnp.concatenate(pieces, axis=-1)
    out: jax.Array = as_bytes.reshape((*lead, groups * group_bytes))[..., : packed_length(n, bits)]
    return out


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
        pm1: jax.Array = field.astype(jnp.int8) * 2 - 1
        return pm1
    # Sign-extend a `bits`-wide two's complement field.
    sign = jnp.int8(1 << (bits - 1)) if bits < 8 else jnp.int8(-128)
    extended: jax.Array = (field.astype(jnp.int8) ^ sign) - sign
    return extended


def _unpack_sub_byte(data: jax.Array, bits: int, n: int) -> jax.Array:
    per_byte = 8 // bits
    shifts = _shifts(per_byte, bits, data.ndim + 1)
    field = (data[..., None] >> shifts) & jnp.uint8((1 << bits) - 1)
    out: jax.Array = field.reshape((*data.shape[:-1], data.shape[-1] * per_byte))[..., :n]
    return out


def _unpack_dense(data: jax.Array, bits: int, n: int) -> jax.Array:
    """Inverse of `_pack_dense` (and of the 8- and 16-bit layouts)."""
    lead = data.shape[:-1]
    if bits == 8:
        return data[..., :n]
    if bits == 16:
        pairs = data[..., : 2 * n].reshape((*lead, n, 2))
        return lax.bitcast_convert_type(pairs, jnp.uint16)
    per_group, group_bytes = group_shape(bits)
    n_words = -(-group_bytes // 4)
    groups = math.ceil(n / per_group)
    b = _pad_last(data[..., : groups * group_bytes], groups * group_bytes).astype(jnp.uint32)
    b = b.reshape((*lead, groups, 1, group_bytes))
    # The group's 32-bit words, each a reduction over its bytes (shifting by
    # 32 gives 0: a byte of another word is no part).
    place = np.full((n_words, group_bytes), 32, np.uint32)
    for j in range(group_bytes):
        place[j // 4, j] = 8 * (j % 4)
    place = place.reshape((1,) * (b.ndim - 2) + place.shape)
    words = jnp.sum(b << place, axis=-1, dtype=jnp.uint32)  # (..., groups, n_words)
    # Code i is the bits of the stream from i * bits, taken from the words it
    # lies in: its first word shifted right, the next one shifted left (the
    # ranges are disjoint, so the sum is an OR), then masked.
    right = np.full((per_group, n_words), 32, np.uint32)
    left = np.full((per_group, n_words), 32, np.uint32)
    for i in range(per_group):
        for w in range(n_words):
            s = i * bits - 32 * w  # where code i starts relative to word w
            if 0 <= s < 32:
                right[i, w], left[i, w] = s, 0
            elif -bits < s < 0:
                right[i, w], left[i, w] = 0, -s
    at = (1,) * (words.ndim - 1) + (per_group, n_words)
    parts = (words[..., None, :] >> right.reshape(at)) << left.reshape(at)
    mask = jnp.uint32((1 << bits) - 1)
    codes = jnp.sum(parts, axis=-1, dtype=jnp.uint32) & mask
    codes = codes.astype(jnp.uint8 if bits <= 8 else jnp.uint16)
    out: jax.Array = codes.reshape((*lead, groups * per_group))[..., :n]
    return out
