"""Per-group scales: the absmax and power-of-two rules, and applying them.

Shared by every scaled encoding (floats, integers, code books, zero points).
A group's scale maps its absmax onto the element format's largest value
(`scales`), or is the mean of |x| for the binary int1 (`mean_abs`); the
elements are then multiplied by the group's reciprocal (`times_reciprocal`).
Everything is float32 with one operation per group where it matters, and
nothing depends on whether the backend flushes subnormals: the input is
flushed explicitly (`flush_subnormals`) and scales are kept normal.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _ieee
from ._ieee import divide, is_finite, is_nan, nan_where, select
from ._scaling import PerBlock, Scaling

__all__ = [
    "TINY",
    "floor_log2",
    "flush_subnormals",
    "group_absmax",
    "group_sizes",
    "mean_abs",
    "pow2",
    "scales",
    "times_reciprocal",
]

TINY = np.float32(2.0**-126)
"""float32's smallest normal."""


def floor_log2(a: jax.Array) -> jax.Array:
    """floor(log2(a)) of positive finite float32 values, exactly, from their bits."""
    u = lax.bitcast_convert_type(a.astype(jnp.float32), jnp.uint32)
    biased = ((u >> 23) & 0xFF).astype(jnp.int32)
    mant = u & jnp.uint32(0x7FFFFF)
    sub = (31 - lax.clz(mant).astype(jnp.int32)) - 149
    return jnp.where(biased > 0, biased - 127, sub)


def pow2(k: jax.Array) -> jax.Array:
    """2**k as float32 built from bits (no arithmetic to flush); k clamped to normals."""
    k = jnp.clip(k, -126, 127)
    return lax.bitcast_convert_type(((k + 127).astype(jnp.uint32)) << 23, jnp.float32)


def group_absmax(x: jax.Array, scaling: Scaling) -> jax.Array:
    """Per-group max(|x|), NaN for a group that holds NaN or ±inf.

    For float32 one integer max over the magnitude bits does both: finite
    magnitudes order as their bits do, and inf and NaN lie above every finite
    one, so the group's largest magnitude bits are its absmax, or say that it
    holds NaN or inf. An integer max drops nothing (XLA:CPU's vectorised float
    max may drop NaN) and reads the input once (a separate `any(~isfinite)`
    costs another pass over it).
    """
    # Scales are treated as constants by autodiff (straight-through): the
    # gradient of decode(encode(x)) is 1, not the sensitivity of the
    # rounding error to the group's absmax.
    x = lax.stop_gradient(x)
    # `initial=0` gives an empty group absmax 0, hence scale 1 like an all-zero group.
    if x.dtype == jnp.float32 and _integer_max(scaling):
        mag = lax.bitcast_convert_type(x, jnp.uint32) & jnp.uint32(0x7FFFFFFF)
        top = scaling.group_reduce(
            mag, lambda a, axes: jnp.max(a, axis=axes, keepdims=True, initial=jnp.uint32(0))
        )
        # a subnormal absmax reads as 0, as XLA:CPU's float max gives it
        top = jnp.where(top < jnp.uint32(0x00800000), jnp.uint32(0), top)
        return nan_where(top >= jnp.uint32(0x7F800000), _ieee.from_bits(top))
    absmax = scaling.group_reduce(
        jnp.abs(x), lambda a, axes: jnp.max(a, axis=axes, keepdims=True, initial=0.0)
    )
    # (Read from the bits: flags that assume no NaN would fold `isfinite` to true.)
    poison = scaling.group_reduce(
        ~is_finite(x.astype(jnp.float32)), lambda a, axes: jnp.any(a, axis=axes, keepdims=True)
    )
    return nan_where(poison, absmax.astype(jnp.float32)).astype(absmax.dtype)


def _integer_max(scaling: Scaling) -> bool:
    """Whether the integer max of `group_absmax` is the faster of its two (equal) forms.

    XLA:CPU vectorises a long float max but not an integer one (a per-tensor
    max over 2**24 values: 4.8 ms float, 34 ms integer, plus 7 ms for the
    separate `any`); over short groups such as blocks of 32 the single
    integer pass is faster there too. Both give the same bits.
    """
    return jax.default_backend() != "cpu" or isinstance(scaling, PerBlock)


def _pairwise_sum(a: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """Sum over `axes` (dims kept) by pairwise halving, in one fixed order.

    For n non-negative float32 terms the relative error is at most
    ceil(log2 n) * 2**-24 (a plain float32 reduction's bound grows with n),
    and the order, hence the result, is the same on every backend.
    """
    keep = [i for i in range(a.ndim) if i not in axes]
    moved = jnp.transpose(a, keep + list(axes))
    lead = moved.shape[: len(keep)]
    n = math.prod(moved.shape[len(keep) :])
    out_shape = tuple(1 if i in axes else a.shape[i] for i in range(a.ndim))
    if n == 0:
        return jnp.zeros(out_shape, a.dtype)
    flat = moved.reshape((*lead, n))
    while flat.shape[-1] > 1:
        m = flat.shape[-1]
        half = m // 2
        summed = flat[..., :half] + flat[..., half : 2 * half]
        flat = jnp.concatenate([summed, flat[..., 2 * half :]], axis=-1) if m % 2 else summed
    return flat.reshape(out_shape)


def mean_abs(x: jax.Array, scaling: Scaling) -> jax.Array:
    """Per-group mean(|x|) of flushed float32 `x`: no overflow, and accurate.

    Each group is scaled by a power of two 2**-k (k = floor(log2(absmax)), exact)
    so its terms lie in [0, 2) and their sum cannot overflow, summed pairwise,
    divided by the group's element count and scaled back. Relative error at most
    (ceil(log2 n) + 2) * 2**-24 for a group of n elements (pairwise sum, the
    count's rounding to float32, the division); terms below 2**-126 * absmax
    count as zero, as float32 subnormals do everywhere else. A group with NaN
    or inf gets NaN; an all-zero group gets 0.
    """
    x = lax.stop_gradient(x)
    absmax = group_absmax(x, scaling).astype(jnp.float32)
    finite = ~is_nan(absmax)  # a group with NaN or inf has a NaN absmax
    absmax = select(finite, absmax, jnp.float32(0))  # no NaN enters the arithmetic
    positive = finite & (absmax > 0)
    k = jnp.minimum(floor_log2(jnp.where(positive, absmax, jnp.float32(1))), 126)
    # (on the exponent bits: `a * p + b * p` may otherwise become `(a + b) * p`)
    terms = _ieee.times_pow2(jnp.abs(x), scaling.broadcast(pow2(-k), x.shape))
    total = scaling.group_reduce(terms, _pairwise_sum)
    finite = finite & is_finite(total)
    total = select(finite, total, jnp.float32(0))
    counts = group_sizes(scaling, x.shape)
    mean = divide(total, jnp.maximum(counts, jnp.float32(1))) * pow2(k)
    # The exact mean never exceeds absmax; this keeps rounding at float32's top finite.
    mean = jnp.minimum(mean, absmax)
    # a mean below the smallest normal would be flushed to zero on CPU
    mean = jnp.where((total > 0) & (mean < TINY), TINY, mean)
    return nan_where(~finite, mean)


def flush_subnormals(x: jax.Array) -> jax.Array:
    """`x` with float32 subnormals replaced by (signed) zero, on every backend.

    XLA on CPU reads subnormal inputs of arithmetic as zero, GPUs need not:
    scaled encodings flush them explicitly so every backend gives the same
    codes. Read and written as bits (`_ieee.flush_subnormals`): `x * 0` would
    lose the sign of zero under flags that ignore signed zeros.
    """
    if x.dtype != jnp.float32:  # (float64 under x64: its own subnormals are not flushed)
        return jnp.where((x < TINY) & (x > -TINY), x * jnp.float32(0), x)
    return _ieee.flush_subnormals(x)


def scales(
    x: jax.Array, scaling: Scaling, top: float, top_exponent: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-group (scale, reciprocal, prescale) so that `x * reciprocal` fits in [-top, top].

    Absmax scaling: `scale = absmax / top` and the reciprocal `top / absmax` is
    computed once per group, so every element is a multiplication (XLA would
    rewrite a division into that anyway; spelling it out keeps the codes the
    same on every backend and in a numpy reference). Power-of-two scaling
    follows OCP MX: `scale = 2**(floor(log2(absmax)) - top_exponent)`.
    An all-zero group gets scale 1; a group with NaN/inf gets a NaN scale.
    Scales are never subnormal (XLA on CPU would flush them to zero, and the
    decoded values with them): a group whose scale would be is given float32's
    smallest normal, 2**-126, and the reciprocal 2**126. `x` need not be
    flushed: a subnormal absmax is taken as 0, the absmax of the flushed
    group (reducing the raw `x` lets XLA fuse the flush into the encode
    instead of materializing a flushed copy of the whole tensor).
    """
    absmax = group_absmax(x, scaling).astype(jnp.float32)
    # A group holding NaN or inf has a NaN absmax: it gets a NaN scale at the end,
    # and 0 meanwhile, so no NaN enters the arithmetic (see `_ieee`).
    bad = is_nan(absmax)
    absmax = select(bad | (absmax < TINY), jnp.float32(0), absmax)
    pre = jnp.ones_like(absmax)
    if scaling.power_of_two:
        k = jnp.maximum(floor_log2(absmax) - top_exponent, -126)
        # for k > 64 the reciprocal 2**-k is taken in two exact steps (2**-64 first)
        big = k > 64
        pre = jnp.where(big, jnp.float32(2.0**-64), pre)
        scale, inv = pow2(k), pow2(jnp.where(big, 64 - k, -k))
    else:
        top32 = np.float32(top)
        scale = divide(absmax, top32)
        # Near float32's top, qmax * fl(absmax / qmax) can round past max:
        # take the scale one ulp lower there, so every code decodes finite.
        over = scale >= _overflows_times(top32)
        scale = jnp.where(over, jnp.nextafter(scale, jnp.float32(0)), scale)
        # For absmax beyond 2**100 the reciprocal top / absmax would be a
        # subnormal, which XLA on CPU flushes to zero: divide x and absmax by
        # 2**64 first (exact), which gives the very same codes.
        big = absmax > np.float32(2.0**100)
        pre = jnp.where(big, jnp.float32(2.0**-64), pre)
        inv = divide(top32, absmax * pre)
        # absmax / top below the smallest normal (the comparison is exact)
        tiny = absmax < np.float32(top) * TINY
        scale = jnp.where(tiny, TINY, scale)
        inv = jnp.where(tiny, jnp.float32(2.0**126), inv)
    zero = absmax == 0
    scale = nan_where(bad, select(zero, jnp.float32(1), scale))
    inv = select(zero | bad, jnp.float32(0), inv)
    return scale, inv, pre


@functools.cache
def _overflows_times(top: np.float32) -> np.float32:
    """The smallest float32 `s` whose product with `top` rounds to inf (a constant, so
    the test needs no infinity: flags that assume none cannot fold it away)."""
    with np.errstate(over="ignore"):
        s = np.float32(np.finfo(np.float32).max / np.float64(top))
        while np.isinf(s * top):
            s = np.nextafter(s, np.float32(0))
        while not np.isinf(s * top):
            s = np.nextafter(s, np.float32(np.inf))
    return s


def times_reciprocal(x: jax.Array, scaling: Scaling, inv: jax.Array, pre: jax.Array) -> jax.Array:
    """x * (top / absmax) per group, as `(x * pre) * inv` (see `scales`).

    A product below float32's smallest normal is flushed to zero by XLA on
    CPU and kept as a subnormal on GPUs, which would make `up` round a
    positive value to code 0 on one and 1 on the other (and `down` a negative
    one). Every such product is replaced by ±2**-126, on every backend (the
    comparisons are exact whether or not the hardware flushes): it has the
    sign and the non-zeroness of the exact product and, like it, lies far
    below half of every scaled format's smallest step, so every rounding mode
    decides as it would on the exact value.
    """
    inv_b = scaling.broadcast(inv, x.shape)
    # NaN and ±inf elements (their group's scale is NaN, its reciprocal 0) give 0,
    # selected as bits: their codes are then the same on every backend (a NaN's
    # conversion to an integer code is the backend's choice).
    x = _ieee.select(is_finite(x), x, jnp.float32(0)) if x.dtype == jnp.float32 else x
    if x.dtype == jnp.float32:
        y = _ieee.times_pow2(x, scaling.broadcast(pre, x.shape)) * inv_b
    else:
        y = (x * scaling.broadcast(pre, x.shape)) * inv_b
    lost = (y < TINY) & (y > -TINY) & (x != 0) & (inv_b > 0)
    return jnp.where(lost, jnp.where(x > 0, TINY, -TINY), y)


def group_sizes(scaling: Scaling, shape: tuple[int, ...]) -> jnp.ndarray:
    """Number of real (unpadded) elements in each group, shaped like the scale.

    Counted with Python integers from the static shape (a float32 sum of ones
    stops counting at 2**24), then given as float32.
    """
    shape = tuple(shape)
    scale_shape = scaling.scale_shape(shape)
    total = math.prod(shape)
    if isinstance(scaling, PerBlock) and shape:
        a = scaling._axis(len(shape))
        n = shape[a]
        size = scaling._block(n)
        counts = np.full(scale_shape[a], size, np.float64)  # one block is one group
        if counts.size and n % size:
            counts[-1] = n % size
        bshape = [1] * len(shape)
        bshape[a] = scale_shape[a]
        counts = np.broadcast_to(counts.reshape(bshape), scale_shape)
    else:
        groups = math.prod(scale_shape)
        counts = np.full(scale_shape, total // groups if groups else 0, np.float64)
    return jnp.asarray(counts.astype(np.float32))
