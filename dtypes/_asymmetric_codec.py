"""encode / decode / round / check of `AsymmetricIntFormat`s (zero-point codes), in jnp.

See `_asymmetric` for the rules. `Format`'s methods import this module on
first use. `round` and `check` are those every storage encoding shares
(`_codec.storage_round`, `_codec.check_storage`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _codec, _packing, _scale_storage
from ._bit_rounding import round_integer
from ._encoded import Encoded
from ._ieee import divide, is_finite, is_nan, nan_where, select, times_pow2, times_scale
from ._per_group import group_extreme, per_group
from ._rounding_modes import NEAREST_MODES, ROUNDING_MODES
from ._scale_rules import TINY, flush_subnormals, nearest_steps_cpu, times_reciprocal
from ._scaling import PerBlock, Scaling

if TYPE_CHECKING:
    from ._asymmetric import AsymmetricIntFormat

__all__ = ["check", "decode", "encode", "round"]


def encode(
    fmt: AsymmetricIntFormat, x: Any, scaling: Scaling | None, rounding: str, key: Any
) -> Encoded:
    """`fmt.encode(x, ...)`: the storage encodings' checks, then one compiled kernel."""
    xs, resolved = _codec.prepare_storage(fmt, x, scaling, rounding, key, ROUNDING_MODES)
    encoded: Encoded = _encode_jit(fmt, resolved, rounding, xs, key)
    return encoded


def decode(fmt: AsymmetricIntFormat, enc: Encoded, dtype: Any = np.float32) -> jax.Array:
    """`fmt.decode(enc, dtype)`: the argument checks, then one compiled kernel."""
    _codec.check_decodable(fmt, enc, dtype)
    values: jax.Array = _decode_jit(fmt, enc, jnp.dtype(dtype))
    return values


# decode(encode(x)) with the straight-through derivative, and encode's checks alone:
# what every storage encoding does
round = _codec.storage_round
check = _codec.check_storage


def _extremes(
    fmt: AsymmetricIntFormat, x: jax.Array, scaling: Scaling
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per group (lo, hi, bad): the least and largest of the flushed values with 0 among
    them (minmax; -absmax and absmax otherwise), and whether the group holds NaN or
    ±inf (its lo and hi are then 0).

    Found as integer reductions of an order-preserving key of the bits, in one
    reading of `x` each: a float max may drop NaN on XLA:CPU, and a separate
    search for NaN and inf would read `x` once more. NaN and inf lie beyond the
    keys of every finite value, on the side of their sign. In blocks of up to 32
    along the last axis the key of a float is its magnitude bits, negated where
    negative, with zeros and subnormals 0 (flushed, as everywhere); elsewhere its
    bits with the magnitude's flipped where negative (`-1 - magnitude`), whose
    subnormal extremes are flushed after the reductions (`_short_blocks` says why
    both). (One tail for both forms, and `max_bits` for the absmax range, measured
    5-9% slower: kept apart.)
    """
    inf = jnp.int32(0x7F800000)
    normal = jnp.int32(0x00800000)
    if fmt.calibration == "minmax":
        if _short_blocks(scaling, x.shape):
            # the key of a flushed value: its magnitude bits, negated where negative
            u = lax.bitcast_convert_type(lax.stop_gradient(x), jnp.uint32)
            mag = u & jnp.uint32(0x7FFFFFFF)
            signed = jnp.where(mag < jnp.uint32(0x00800000), jnp.uint32(0), mag).astype(jnp.int32)
            key = jnp.where(u >= jnp.uint32(0x80000000), -signed, signed)
            hi_key = group_extreme(key, scaling, jnp.max)
            lo_key = group_extreme(key, scaling, jnp.min)
        else:
            # the key of a negative value is -1 - its magnitude bits: its bits with the
            # magnitude's flipped, as int32 (three operations instead of seven);
            # subnormal extremes are flushed after the reductions, which changes
            # nothing (0 is among the values)
            i = lax.bitcast_convert_type(lax.stop_gradient(x), jnp.int32)
            key = i ^ ((i >> 31) & jnp.int32(0x7FFFFFFF))
            hi_key = group_extreme(key, scaling, jnp.max)
            lo_mag = ~group_extreme(key, scaling, jnp.min)  # (-0's key -1 gives 0)
            hi_key = jnp.where(hi_key < normal, 0, hi_key)
            lo_key = -jnp.where(lo_mag < normal, 0, lo_mag)
        bad = (hi_key >= inf) | (lo_key <= -inf)
    else:
        u = lax.bitcast_convert_type(lax.stop_gradient(x), jnp.uint32)
        mag = u & jnp.uint32(0x7FFFFFFF)
        mag = jnp.where(mag < jnp.uint32(0x00800000), jnp.uint32(0), mag)
        hi_key = group_extreme(mag, scaling, jnp.max).astype(jnp.int32)
        lo_key = -hi_key
        bad = hi_key >= inf
    hi_key = jnp.where(bad, 0, hi_key)
    lo_key = jnp.where(bad, 0, lo_key)
    hi = lax.bitcast_convert_type(hi_key, jnp.float32)
    lo = -lax.bitcast_convert_type(-lo_key, jnp.float32)
    return lo, hi, bad


def _short_blocks(scaling: Scaling, shape: tuple[int, ...]) -> bool:
    """Whether the groups are blocks of at most 32 along the last axis: there the
    select form of the order key reduces faster on XLA:CPU (uint4 per block of 32:
    0.87x the time of the flipped bits), elsewhere the flipped bits (uint8 per tensor:
    0.52x the select form's time)."""
    if not isinstance(scaling, PerBlock) or not shape:
        return False
    axis = scaling._axis(len(shape))
    return axis == len(shape) - 1 and scaling._block(shape[axis]) <= 32


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _encode_jit(
    fmt: AsymmetricIntFormat, scaling: Scaling, rounding: str, x: jax.Array, key: Any
) -> Encoded:
    scalar = x.ndim == 0
    xs = x.reshape(1) if scalar else x
    # (an empty group spans [0, 0], so it gets scale 1 like an all-zero one)
    lo, hi, bad = _extremes(fmt, xs, scaling)
    # a subnormal span reads as 0 everywhere (XLA:CPU flushes it, GPUs keep it)
    span = flush_subnormals(hi - lo)
    qmax32 = np.float32(fmt.qmax)
    # A span that may pass float32's range (3e38 and -3e38 in one group) is taken in
    # halves: halving is exact there, so the scale is still the correctly rounded
    # span / qmax. Decided by the ends' size, never by an infinity (flags that assume
    # none would make `hi - lo` anything there). One division serves both.
    big = (hi >= np.float32(2.0**126)) | (lo <= np.float32(-(2.0**126)))
    half = np.float32(0.5)
    half_span = times_pow2(hi, half) - times_pow2(lo, half)
    quotient = divide(select(big, half_span, select(is_finite(span), span, 0.0)), qmax32)
    scale = select(big, quotient * 2, quotient)  # correctly rounded
    scale = jnp.where(span == 0, jnp.float32(1), jnp.maximum(scale, TINY))
    scale = nan_where(bad, scale)
    # A scale is below 2**129 / qmax: from 8 codes up its reciprocal is a normal float32;
    # uint2 and uint3 take it in two steps (`_scale_rules.scales`).
    prescale = fmt.qmax < 8
    ones = jnp.ones_like(scale) if prescale else None
    stored, _, inv, pre = _scale_storage.narrow(xs, scaling, scale, scale, ones, fmt.qmax, 0)

    def reciprocal(s32: jax.Array, bad: jax.Array) -> tuple[jax.Array, jax.Array | None]:
        pre = None
        if prescale:
            pre = jnp.where(s32 > np.float32(2.0**100), jnp.float32(2.0**-64), jnp.float32(1))
            s32 = s32 * pre
        inv = divide(jnp.float32(1), s32)
        return select(is_finite(inv) & ~bad, inv, jnp.float32(0)), pre

    if scaling.scale_format == "float32":
        inv, pre = per_group(reciprocal, stored, bad)
    else:  # (the narrowed scale's reciprocal, made by `narrow`)
        inv = per_group(lambda inv, bad: select(is_finite(inv) & ~bad, inv, 0.0), inv, bad)
    pres = () if pre is None else (pre,)

    def zero_point_of(lo: jax.Array, inv: jax.Array, *pre: jax.Array) -> jax.Array:
        low = times_pow2(lo, pre[0]) if pre else lo
        return jnp.clip(jnp.round(-low * inv), 0, fmt.qmax)

    # the zero point reads the reciprocal: made after it, not beside it (made together,
    # each would compute both divisions again: uint4 per block 0.82x the time this way)
    zero_point = per_group(zero_point_of, lo, inv, *pres)
    if rounding in NEAREST_MODES and xs.dtype == jnp.float32:
        codes = lax.platform_dependent(
            xs, inv, zero_point, *(() if pre is None else (pre,)),
            cpu=functools.partial(_nearest_codes_cpu, fmt.qmax, scaling, rounding),
            default=functools.partial(_exact_codes, fmt.qmax, scaling, rounding, None),
        )  # fmt: skip
    else:
        codes = _exact_codes(fmt.qmax, scaling, rounding, key, xs, inv, zero_point, pre)
    zero_point = zero_point.astype(jnp.uint8)
    if scalar:
        codes, stored, zero_point = codes.reshape(()), stored.reshape(()), zero_point.reshape(())
    data = codes if fmt.bits == 8 else _packing.pack(codes.reshape(codes.shape or (1,)), fmt.bits)
    last = None if (scalar or fmt.bits == 8) else x.shape[-1]
    return Encoded(data, stored, fmt, scaling, last, zero_point=zero_point)


def _exact_codes(
    qmax: int,
    scaling: Scaling,
    rounding: str,
    key: Any,
    x: jax.Array,
    inv: jax.Array,
    zero_point: jax.Array,
    pre: jax.Array | None = None,
) -> jax.Array:
    """uint8 codes `clip(round(x * inv) + zero_point, 0, qmax)` on any backend: subnormals
    flushed and NaN and inf made +0 on the bits before the product."""
    y = times_reciprocal(x, scaling, inv, pre, rounding=rounding, signed_zero=False)
    rounded = round_integer(y, rounding, key)
    codes = jnp.clip(rounded + scaling.broadcast(zero_point, x.shape), 0, qmax)
    return codes.astype(jnp.uint8)


def _nearest_codes_cpu(
    qmax: int,
    scaling: Scaling,
    rounding: str,
    x: jax.Array,
    inv: jax.Array,
    zero_point: jax.Array,
    pre: jax.Array | None = None,
) -> jax.Array:
    """`_exact_codes` in the nearest modes as XLA:CPU computes it fastest, with the same
    bits (`nearest_steps_cpu`: a group holding NaN or inf has reciprocal 0 and every
    code its zero point), the zero point added and the codes clipped as integers
    (the steps are clipped first: under a float16 scale, clipped at 65504, a product
    can pass 2**31, and int32 + zero point would wrap)."""
    steps = nearest_steps_cpu(x, scaling, inv, pre, rounding=rounding, qmax=qmax)
    zero_b = scaling.broadcast(zero_point.astype(jnp.int32), x.shape)
    codes = jnp.clip(steps + zero_b, 0, qmax)
    return codes.astype(jnp.uint8)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _decode_jit(fmt: AsymmetricIntFormat, enc: Encoded, dtype: Any) -> jax.Array:
    shape = enc.shape
    if fmt.bits == 8:
        codes = enc.data
    else:
        codes = _packing.unpack(enc.data, fmt.bits, shape[-1] if shape else 1, signed=False)
        codes = codes.reshape(shape)
    assert enc.scale is not None  # asymmetric codes always have scales and zero points
    assert enc.scaling is not None
    assert enc.zero_point is not None
    scale = _scale_storage.widen(enc.scale, None, enc.scaling, 0)
    zp = enc.zero_point.astype(jnp.float32)
    if shape:
        scale = enc.scaling.broadcast(scale, shape)
        zp = enc.scaling.broadcast(zp, shape)
    steps = codes.astype(jnp.float32) - zp
    values = times_scale(steps, scale)
    # A group spanning nearly all of float32 (3.4e38 and -3.4e38) has an end code whose
    # product with the scale rounds past float32's largest value: it decodes to that
    # value, so every code of a finite input decodes finite (NaN groups stay NaN). The
    # overflow is found on half the product, which cannot overflow.
    top = np.float32(np.finfo(np.float32).max)
    half_values = times_scale(steps, times_pow2(scale, np.float32(0.5)))
    over = (half_values > top / 2) | (half_values < -top / 2)
    values = select(over & ~is_nan(values), jnp.where(steps > 0, top, -top), values)
    return values.astype(dtype)
