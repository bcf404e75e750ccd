"""Scale formats: the width scales are stored at (E8M0 itself is in `_e8m0`).

A scaling names the format its scales are kept in (`Scaling.scale_format`):

- `float32` (the default): the scale rules of `_scale_rules.scales`, unchanged.
- `float8_e8m0fnu` (E8M0, OCP MX): an unsigned 8-bit exponent, byte
  `k + 127` for `2**k`, 0xFF for NaN. Needs `power_of_two=True`, whose rule
  is the OCP MX v1.0 one: `scale = 2**(floor(log2(amax)) - emax_elem)`, so
  the bytes stored change nothing in the codes. For integer elements the
  byte is the spec's: the element's implicit scale is folded in (MXINT8's
  elements are `code / 64`, so the byte holds `log2(scale) + 6 + 127`).
  An all-zero block (where the spec's `log2(0)` is undefined) keeps the
  code scale 1: byte 127 for float elements, 133 for MXINT8.
- `bfloat16`, `float16`: the float32 scale rounded to nearest-even in that
  format (clamped to its finite range, and float16 to at least its smallest
  subnormal); the codes are then computed against the scale as stored,
  `x * (1 / stored)`, so that `code * stored` is what decodes.
- `float8_e4m3fn`: two-level NVFP4 scaling. With `top` the element format's
  largest value (6 for e2m1) and `amax` the tensor's absmax, the tensor
  encoding scale is `g = (448 * top) / amax` (1 for an all-zero tensor) and
  the stored float32 tensor scale is `1 / g`. Each block's e4m3 scale is
  `e4m3((block_amax / top) * g)` (nearest-even, at most 448), and its
  elements are `x * (g / e4m3_scale)` rounded onto the element grid,
  saturating (0 for a block whose scale rounds to 0). Decoding is
  `code * (e4m3_scale * (1 / g))`. Two refinements keep every scale a normal
  float32, as everywhere else in `dtypes` (XLA on CPU flushes subnormals, and
  a tensor whose absmax is below about 3e-35 would otherwise decode as
  zeros): `g` is at most 2**126, so the tensor scale is at least 2**-126; a
  nonzero block scale whose product with the tensor scale would fall below
  2**-126 is raised to the smallest e4m3 value that keeps it normal; and
  `block_amax / top` keeps 24 significant bits where it is below 2**-126
  (computed 2**24 times larger, with g 2**24 times smaller). None of them
  touches a tensor whose absmax is above 2688 * 2**-117 (about 1.6e-32) or a
  block whose absmax is above 6 * 2**-126.

All scale arithmetic is float32, one operation per group, so a numpy
reference doing the same operations gets the same bits. Which element formats
may use which scale format is each format's own check (`_int_codec` refuses
the narrow ones for int1, and e4m3 for every integer format); the bytes the
scales take are `_scaling.scale_nbytes`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from ._ieee import divide, from_float32, is_finite, is_nan, nan_where, select, to_float32
from ._per_group import group_absmax, per_group
from ._scale_rules import prescaled_reciprocal
from ._scaling import Scaling, scale_dtype

__all__ = ["narrow", "widen"]

_E4M3_MAX = 448.0
_TINY = np.float32(2.0**-126)


def narrow(
    x: jax.Array,
    scaling: Scaling,
    scale: jax.Array,
    inv: jax.Array,
    pre: jax.Array | None,
    top: float,
    offset: int,
) -> tuple[jax.Array, jax.Array | None, jax.Array, jax.Array | None]:
    """Scales as stored, and the reciprocal the codes are computed with.

    Args:
        x: the float32 input (used by two-level scaling only; need not be flushed).
        scaling: the scaling, naming the scale format.
        scale, inv, pre: the float32 scale rule's output (`_scale_rules.scales`; `pre`
            is None where no reciprocal can need one).
        top: the element format's largest value (`qmax` for integers).
        offset: log2 of the element's implicit scale folded into an E8M0 byte.

    Returns:
        (stored scales, float32 tensor scale or None, reciprocal, prescale or None).
    """
    fmt = scaling.scale_format
    if fmt == "float32":
        return scale, None, inv, pre
    if fmt == "float8_e8m0fnu":
        # `scale` is a power of two in [2**-126, 2**127] or NaN: its E8M0 byte is
        # its float32 biased exponent (NaN's is 0xFF, E8M0's NaN), taken from the bits.
        bits = lax.bitcast_convert_type(scale * np.float32(2.0**offset), jnp.uint32)
        byte = ((bits >> 23) & jnp.uint32(0xFF)).astype(jnp.uint8)
        stored: jax.Array = lax.bitcast_convert_type(byte, jnp.float8_e8m0fnu)
        return stored, None, inv, pre
    if fmt == "float8_e4m3fn":
        return _two_level(x, scaling, top)
    dtype = scale_dtype(scaling)
    info = ml_dtypes.finfo(dtype)
    lo = np.float32(info.smallest_subnormal if fmt == "float16" else _TINY)
    prescale = pre is not None

    def made(scale: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array | None]:
        # A NaN group's scale is written as bits (a GPU's conversion writes another
        # NaN), set aside while clipping (flags that assume no NaN clip it to the top).
        nan = is_nan(scale)
        clipped = jnp.clip(select(nan, jnp.float32(1), scale), lo, np.float32(info.max))
        stored = from_float32(nan_where(nan, clipped), dtype)
        s32 = to_float32(stored)
        finite = is_finite(s32)
        s32 = select(finite, s32, jnp.float32(1))  # no NaN enters the arithmetic
        pre = None
        if prescale:  # (the reciprocal kept a normal float32, `prescaled_reciprocal`)
            pre, inv = prescaled_reciprocal(np.float32(1), s32)
        else:  # (without a prescale the stored scale is below 2**126: its reciprocal is normal)
            inv = divide(jnp.float32(1), s32)
        return stored, select(finite, inv, jnp.float32(0)), pre

    stored, inv, pre = per_group(made, scale)
    return stored, None, inv, pre


def _two_level(
    x: jax.Array, scaling: Scaling, top: float
) -> tuple[jax.Array, jax.Array, jax.Array, None]:
    amax_b = group_absmax(x, scaling)
    # NaN and inf blocks poison the tensor scale; the arithmetic
    # below sees 0 in their place, and the NaN is selected at the end (`_ieee`).
    block_nan = is_nan(amax_b)
    amax_b = select(block_nan, jnp.float32(0), amax_b)
    amax_t = jnp.max(amax_b, initial=0.0)
    poisoned = jnp.any(block_nan) | ~is_finite(amax_t)
    amax_t = select(poisoned, jnp.float32(0), amax_t)
    top32 = np.float32(top)
    g = divide(np.float32(_E4M3_MAX * top), select(amax_t == 0, jnp.float32(1), amax_t))
    # at most 2**126: the tensor scale 1/g is never a float32 subnormal
    g = jnp.where(amax_t == 0, jnp.float32(1), jnp.minimum(g, np.float32(2.0**126)))
    # Below top * 2**-126 the quotient by `top` would be a float32 subnormal,
    # which XLA on CPU flushes: there it is taken 2**24 times larger, and g 2**24
    # times smaller (the product, rounded once, is the same number where both
    # are exact). Divisions are `divide`'s: the same bits on every backend.
    tiny = amax_b < np.float32(top * 2.0**-126)
    shift = jnp.where(tiny, jnp.float32(2.0**24), jnp.float32(1))

    def quotients(amax_b: jax.Array, shift: jax.Array, g: jax.Array) -> jax.Array:
        per_block = divide(amax_b * shift, top32)
        return jnp.minimum(per_block * divide(g, shift), np.float32(_E4M3_MAX))

    def scales(q: jax.Array, g: jax.Array, bad: jax.Array) -> tuple[jax.Array, jax.Array]:
        s32, byte = _e4m3_of(q)
        # A nonzero block scale times the tensor scale stays >= 2**-126: at most one
        # e4m3 step above `lo` (<= 1), reached from its rounding by one code up.
        lo = _TINY * g
        floor = lo.astype(jnp.float8_e4m3fn)
        floor_bits = lax.bitcast_convert_type(floor, jnp.uint8)
        short = to_float32(floor) < lo
        floor = lax.bitcast_convert_type(floor_bits + short.astype(jnp.uint8), jnp.float8_e4m3fn)
        raise_ = (s32 > 0) & (s32 < lo)
        byte = jnp.where(raise_, lax.bitcast_convert_type(floor, jnp.uint8), byte)
        s32 = jnp.where(raise_, to_float32(floor), s32)
        # (a zero scale gives a zero reciprocal: so do NaN blocks and a poisoned tensor)
        s32 = select(~bad, s32, jnp.float32(0))
        e4m3 = lax.bitcast_convert_type(byte, jnp.float8_e4m3fn)
        return _nan_e4m3_where(bad, e4m3), _divided_by_e4m3(g, s32)

    # (the quotients made once: read three times in `scales`, XLA:CPU would call their
    # making as a function per block and vectorise nothing)
    q = per_group(quotients, amax_b, shift, g)
    stored, inv = per_group(scales, q, g, block_nan | poisoned)
    tensor_scale = nan_where(poisoned, divide(jnp.float32(1), g)).reshape(())
    return stored, tensor_scale, inv, None


_E4M3_SUBNORMAL = np.float32(2.0**-6)  # e4m3's smallest normal value


def _e4m3_of(q: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(float32 value, e4m3 byte) of `q` in [0, 448] rounded to e4m3, nearest even.

    Arithmetic rather than a conversion (on XLA:CPU 109 us against 140 for 131,072
    block scales, in the same kernel): above e4m3's smallest normal value the rounding
    is of the mantissa alone, `reduce_precision` to 3 bits (float32's exponent range,
    so nothing it flushes); below, onto multiples of 2**-9, the product by 2**9 (exact)
    rounded to an integer, which is then the code itself (8 is 2**-6's code).
    """
    small = q < _E4M3_SUBNORMAL
    k = jnp.round(q * np.float32(2.0**9))
    normal = lax.reduce_precision(q, exponent_bits=8, mantissa_bits=3)
    value = jnp.where(small, k * np.float32(2.0**-9), normal)
    bits = lax.bitcast_convert_type(normal, jnp.uint32)
    exponent = ((bits >> 23) & jnp.uint32(0xFF)) - jnp.uint32(127 - 7)
    normal_byte = (exponent << 3) | ((bits >> 20) & jnp.uint32(7))
    byte = jnp.where(small, k.astype(jnp.int32).astype(jnp.uint32), normal_byte).astype(jnp.uint8)
    return value, byte


def _divided_by_e4m3(g: jax.Array, s: jax.Array) -> jax.Array:
    """`divide(g, s)` for a scalar `g` and block scales `s` that are e4m3 values (0 where
    `s` is 0).

    On XLA:CPU (`lax.platform_dependent`) by a table: each `s` is `(1 + k/8) * 2**e`,
    so the quotient is one of eight correctly rounded quotients `(g * 2**c) / (1 + k/8)`
    (`c` = ±32 keeps them normal), chosen by `k` and multiplied by `2**(-e - c)`: exact
    in float32's normal range; a product past it is inf, as `divide` gives, and one
    below it 0. Eight divisions in all instead of one per block, chosen by a tree of
    selects (a gather by the scale's byte was 4-7x slower than the division). Elsewhere
    one division per block.
    """

    def table(g: jax.Array, s: jax.Array) -> jax.Array:
        # g taken 2**32 times larger below 1 and smaller above (exact), so that no
        # quotient of the table leaves float32's normal range; the power gives it back
        c = jnp.where(g < 1, jnp.int32(32), jnp.int32(-32))
        scaled = g * lax.bitcast_convert_type((c + 127) << 23, jnp.float32)
        # (made once: fused into the blocks' kernel, XLA:CPU would divide eight times
        # a block)
        eighths = np.arange(8, 16, dtype=np.float32) / np.float32(8)
        quotients = per_group(lambda scaled: divide(scaled, eighths), scaled)
        bits = lax.bitcast_convert_type(s, jnp.uint32)
        k = (bits >> 20) & jnp.uint32(7)
        pick = [quotients[i] for i in range(8)]
        while len(pick) > 1:  # a tree of selects on k's bits, low bit first
            bit = (k & jnp.uint32(1)) == 1
            pairs = zip(pick[::2], pick[1::2], strict=True)
            pick = [jnp.where(bit, hi, lo) for lo, hi in pairs]
            k = k >> 1
        # 2**(-e - c) from the bits: e is in [-9, 8] for a nonzero e4m3 value
        exponent = lax.bitcast_convert_type(bits & jnp.uint32(0x7F800000), jnp.int32)
        power = lax.bitcast_convert_type(jnp.int32(254 << 23) - exponent - (c << 23), jnp.float32)
        quotient = pick[0] * power
        return jnp.where((s > 0) & (quotient >= _TINY), quotient, jnp.float32(0))

    def each(g: jax.Array, s: jax.Array) -> jax.Array:
        return jnp.where(s > 0, divide(g, jnp.where(s > 0, s, jnp.float32(1))), jnp.float32(0))

    out: jax.Array = lax.platform_dependent(g, s, cpu=table, default=each)
    return out


def _nan_e4m3_where(cond: jax.Array, stored: jax.Array) -> jax.Array:
    """e4m3 block scales with e4m3's NaN (0x7F) where `cond`, written as bits."""
    byte = lax.bitcast_convert_type(stored, jnp.uint8)
    return lax.bitcast_convert_type(jnp.where(cond, jnp.uint8(0x7F), byte), jnp.float8_e4m3fn)


def widen(
    stored: jax.Array, tensor_scale: jax.Array | None, scaling: Scaling, offset: int
) -> jax.Array:
    """float32 per-group scales that decode multiplies codes by."""
    if scaling.scale_format == "float8_e8m0fnu":
        # byte b is 2**(b - 127), built from bits; 0xFF is NaN (byte 0, 2**-127, a
        # float32 subnormal, is never written by an encoder and reads as 0 here)
        byte = lax.bitcast_convert_type(stored, jnp.uint8).astype(jnp.uint32)
        nan = byte == 0xFF
        s = lax.bitcast_convert_type(jnp.where(nan, jnp.uint32(127 << 23), byte << 23), jnp.float32)
        if offset:
            s = s * np.float32(2.0**-offset)
    else:
        s = to_float32(stored)
        nan = is_nan(s)
    # NaN scales are set aside while multiplying and selected back as bits (`_ieee`)
    if tensor_scale is not None:
        t = tensor_scale.astype(jnp.float32)
        nan = nan | is_nan(t)
        s = select(nan, jnp.float32(1), s) * select(is_nan(t), jnp.float32(1), t)
    return nan_where(nan, s)
