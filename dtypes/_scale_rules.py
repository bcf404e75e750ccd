"""Per-group scales: the absmax and power-of-two rules, and applying them.

Shared by every scaled encoding (floats, integers, code books, zero points).
A group's scale maps its absmax onto the element format's largest value
(`scales`), or is the mean of |x| for the binary int1 (`mean_abs`); the
elements are then multiplied by the group's reciprocal (`times_reciprocal`).
Everything is float32 with one operation per group where it matters, and
nothing depends on whether the backend flushes subnormals: the input is
flushed explicitly (`flush_subnormals`) and scales are kept normal. The reductions
over each group, and how per-group values are made once, are in `_per_group`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _ieee
from ._bit_rounding import round_integer
from ._ieee import divide, is_finite, is_nan, nan_where, pow2, quotient_times_pow2, select
from ._per_group import (
    absmax_made_once,
    computed_once,
    group_absmax,
    group_sizes,
    pairwise_sum,
    per_group,
)
from ._scaling import Scaling

__all__ = [
    "TINY",
    "floor_log2",
    "flush_subnormals",
    "mean_abs",
    "nearest_steps_cpu",
    "needs_prescale",
    "pow2",
    "prescaled_reciprocal",
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
    # 2**-k made once, a tensor's one value too: fused into the pairwise sum's first
    # level, XLA:CPU computed it for every element (per tensor of 2**20 values 2.5 ms
    # against 1.3, per block of 32 1.4 against 1.2; the same bits)
    down = computed_once(lambda k: pow2(-k), k)
    # (on the exponent bits: `a * p + b * p` may otherwise become `(a + b) * p`)
    terms = _ieee.times_pow2(jnp.abs(x), scaling.broadcast(down, x.shape))
    total = scaling.group_reduce(terms, pairwise_sum)
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
    x: jax.Array, scaling: Scaling, top: float, top_exponent: int, *, keep: bool = False
) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array | None]:
    """Per-group (scale, reciprocal, prescale, keep) so that `x * reciprocal` fits in
    [-top, top].

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

    The prescale is None where no group can need one (`needs_prescale`): then
    the reciprocal is `top / absmax` itself, and `x * reciprocal` is the same
    number as `(x * 2**-64) * (top / (absmax * 2**-64))` wherever the latter
    is taken.

    With `keep`, also the int32 mask `nearest_steps_cpu` clears codes with: 0 where the
    reciprocal is 0 (a group holding NaN or inf, or nothing but zeros), -1 elsewhere,
    made with the others from the absmax (`absmax_made_once`) rather than in a
    conditional of its own from the reciprocal; else None.
    """
    one_step = top == 1 and not scaling.power_of_two  # (whose reciprocal takes a prescale)

    def made(absmax: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array | None]:
        # A group holding NaN or inf has a NaN absmax: it gets a NaN scale at the end,
        # and 0 meanwhile, so no NaN enters the arithmetic (see `_ieee`).
        bad = is_nan(absmax)
        absmax = select(bad | (absmax < TINY), jnp.float32(0), absmax)
        prescale = needs_prescale(scaling, top, top_exponent)
        scale, inv, pre = _scales(absmax, scaling, np.float32(top), top_exponent, prescale=prescale)
        zero = absmax == 0
        scale = nan_where(bad, select(zero, jnp.float32(1), scale))
        inv = select(zero | bad, jnp.float32(0), inv)
        mask = jnp.where(zero | bad, jnp.int32(0), jnp.int32(-1)) if keep else None
        return scale, inv, None if one_step else pre, mask

    scale, inv, pre, mask = absmax_made_once(x, scaling, made)
    if one_step:
        # On a grid of one step the scale is the absmax, so the prescale is read from it
        # where it is used (a compare and a select a value) instead of made with the
        # others: two values a group made once instead of three (int2 in blocks of 32:
        # `round` 0.93-0.97x the time, the same bits)
        big = scale > np.float32(2.0**100)  # (False for a NaN scale: pre 1, as before)
        pre = jnp.where(big, np.float32(2.0**-64), np.float32(1))
    return scale, inv, pre, mask


def needs_prescale(scaling: Scaling, top: float, top_exponent: int) -> bool:
    """Whether some group's reciprocal could fall below float32's smallest normal.

    Absmax scaling's reciprocal is `top / absmax` with absmax < 2**128: at least
    `top * 2**-128`, normal for every top of 4 or more. The power-of-two rule's
    is `2**-(floor(log2(absmax)) - top_exponent)`, at least `2**-(127 - top_exponent)`,
    normal for every top exponent of 1 or more. Only the narrowest grids (int2,
    code books onto [-1, 1], int1's exponent) take their reciprocal in two steps.
    """
    if scaling.power_of_two:
        return top_exponent < 1
    return top < 4


def _scales(
    absmax: jax.Array, scaling: Scaling, top32: np.float32, top_exponent: int, *, prescale: bool
) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """`scales`' rule on a finite, flushed absmax: (scale, reciprocal, prescale or None)."""
    pre = None
    if scaling.power_of_two:
        k = jnp.maximum(floor_log2(absmax) - top_exponent, -126)
        if not prescale:
            return pow2(k), pow2(-k), None
        # for k > 64 the reciprocal 2**-k is taken in two exact steps (2**-64 first)
        big = k > 64
        pre = jnp.where(big, jnp.float32(2.0**-64), jnp.float32(1))
        scale, inv = pow2(k), pow2(jnp.where(big, 64 - k, -k))
    else:
        if top32 == 1:  # (int2's grid: the scale is the absmax itself)
            scale = absmax
        else:
            scale = divide(absmax, top32)
            # Near float32's top, qmax * fl(absmax / qmax) can round past max:
            # take the scale one ulp lower there, so every code decodes finite.
            over = scale >= _overflows_times(top32)
            scale = jnp.where(over, jnp.nextafter(scale, jnp.float32(0)), scale)
        # For absmax beyond 2**100 the reciprocal top / absmax can be a float32
        # subnormal, which XLA on CPU flushes to zero: it is taken times 2**64, x
        # times 2**-64 (exact), and the codes are the same (`prescaled_reciprocal`).
        if prescale:
            pre, inv = prescaled_reciprocal(top32, absmax)
        else:
            inv = divide(top32, absmax)
        # absmax / top below the smallest normal (the comparison is exact)
        tiny = absmax < top32 * TINY
        scale = jnp.where(tiny, TINY, scale)
        inv = jnp.where(tiny, jnp.float32(2.0**126), inv)
    return scale, inv, pre


def prescaled_reciprocal(top: np.float32, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(prescale, reciprocal) of finite, normal `b` > 0 whose `top / b` may lie below
    float32's normal range (`needs_prescale`): past 2**100 the prescale is 2**-64 and the
    reciprocal `top / b` times 2**64, so that `(x * prescale) * reciprocal` is `x * (top
    / b)` with a normal reciprocal (XLA:CPU flushes subnormals). The reciprocal is
    rounded where numpy rounds `top / b`, a float32 subnormal past `top * 2**126`
    (`quotient_times_pow2`): the products are then the rule's in every rounding mode."""
    big = b > np.float32(2.0**100)
    pre = jnp.where(big, jnp.float32(2.0**-64), jnp.float32(1))
    return pre, quotient_times_pow2(top, b, jnp.where(big, np.int32(64), np.int32(0)))


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


def times_reciprocal(
    x: jax.Array,
    scaling: Scaling,
    inv: jax.Array,
    pre: jax.Array | None,
    *,
    rounding: str,
    signed_zero: bool = True,
) -> jax.Array:
    """x * (top / absmax) per group, as `(x * pre) * inv` (see `scales`).

    `x` is flushed here, in the same pass (its subnormals become zero of their
    sign, or +0 where `signed_zero` is False: integer and code-book codes have
    no sign of zero), and NaN and ±inf elements, whose group's reciprocal is 0,
    give +0, selected as bits: their codes are then the same on every backend
    (a NaN's conversion to an integer code is the backend's choice).

    A product below float32's smallest normal is flushed to zero by XLA on
    CPU and kept as a subnormal on GPUs, which would make `up` round a
    positive value to code 0 on one and 1 on the other (and `down` a negative
    one). Under a rounding mode that can round such a value away from zero,
    every such product is replaced by ±2**-126, on every backend (the
    comparisons are exact whether or not the hardware flushes): it has the
    sign and the non-zeroness of the exact product and, like it, lies far
    below half of every scaled format's smallest step, so every rounding mode
    decides as it would on the exact value. The nearest modes round it to zero
    either way, so they skip the test.

    `inv` and `pre` come from `scales` or `_scale_storage.narrow`, computed once
    per group (`per_group`).
    """
    inv_b = scaling.broadcast(inv, x.shape)
    if x.dtype == jnp.float32:
        x = _finite_normal(x, signed_zero=signed_zero)
        prescaled = x if pre is None else _ieee.times_pow2_down(x, scaling.broadcast(pre, x.shape))
    else:  # float64 under x64
        x = flush_subnormals(x)
        prescaled = x if pre is None else x * scaling.broadcast(pre, x.shape)
    y = prescaled * inv_b
    if rounding in ("nearest_even", "nearest_away"):
        return y
    lost = (y < TINY) & (y > -TINY) & (x != 0) & (inv_b > 0)
    return jnp.where(lost, jnp.where(x > 0, TINY, -TINY), y)


def nearest_steps_cpu(
    x: jax.Array,
    scaling: Scaling,
    inv: jax.Array,
    pre: jax.Array | None,
    *,
    rounding: str,
    qmax: int,
    packed: bool = True,
    keep: jax.Array | None = None,
) -> jax.Array:
    """`clip(round(times_reciprocal(x, ...)), -qmax, qmax)` as int32, as XLA:CPU computes
    it fastest, in a nearest mode, 0 throughout every group whose reciprocal is 0 (a
    group holding NaN or inf, or nothing but zeros): the integer encodes' CPU form
    (`_int_codec._nearest_codes_cpu`), the same integers as the exact pass there.

    XLA:CPU reads subnormal operands as zero and flushes subnormal products, so the
    product flushes `x` as `times_reciprocal` does on the bits, and a product it
    flushes rounds to 0 in a nearest mode either way. NaN and inf elements lie only
    in groups whose reciprocal is 0, whose steps are cleared as integers after the
    conversion by a per-group mask (under flags that assume no NaN, a NaN's
    conversion is anything: the fast-math bit test fails without the mask). The
    mask is ANDed in, not selected: a select on a broadcast per-block value kept
    XLA:CPU from vectorising the packing of int4 codes (2x slower). Other products
    are finite; the conversion saturates and the clip is on integers (int32: as
    wide as the float32 lanes, which XLA:CPU vectorises better than a mix).

    On a grid of one step (int2: -1, 0, 1) there is nothing to round: in groups of
    128 values or more each code is a comparison of `|x|` with the group's threshold
    (`_unit_threshold`), in smaller groups two comparisons of the product with a bound
    per group (1/2, or 2**63 where the prescale is 2**-64): no prescale on the bits,
    no rounding, no clip. Unpacked codes (`round`) take the threshold only for one
    group: for many, its search and the pass holding its thresholds cost more than a
    product per value (int2 per row of 1024, 2048 rows: 0.92x the time, the same bits).
    The per-group values are made once (`per_group`) where the
    codes are `packed` next: read per value, the mask and the bound kept XLA:CPU from
    vectorising the packing of int2 codes (2x slower); unpacked (int2's `round`), the
    bound and the mask are cheaper read per value (0.9x the time). Rounded products
    (`qmax` above 1) take a `keep` mask made with the reciprocal where one is given
    (`scales(..., keep=True)`), else make their own.
    """
    pres = () if pre is None else (pre,)

    def keep_of(inv: jax.Array) -> jax.Array:
        return jnp.where(inv == 0, jnp.int32(0), jnp.int32(-1))

    def bound(*pre: jax.Array) -> Any:
        # 1/2, or 2**63 where the prescale is 2**-64 (see below)
        half = np.float32(0.5)
        return jnp.where(pre[0] < 1, np.float32(2.0**63), half) if pre else half

    if qmax == 1 and x.size >= _UNIT_THRESHOLD_GROUP * inv.size and (packed or inv.size == 1):

        def thresholds(inv: jax.Array, *pre: jax.Array) -> tuple[jax.Array, jax.Array]:
            return keep_of(inv), _unit_threshold(inv, pre[0] if pre else None, rounding)

        keep, threshold = per_group(thresholds, inv, *pres)
        unit = jnp.where(x > 0, jnp.int32(1), jnp.int32(-1))
        steps = jnp.where(jnp.abs(x) >= scaling.broadcast(threshold, x.shape), unit, 0)
    elif qmax == 1:
        # clip(round(y), -1, 1) is sign(y) where |y| passes 1/2 (nearest_away: reaches
        # it), for every y; and with a prescale 2**-64 the product of the prescaled
        # value passes 1/2 exactly when the unscaled one passes 2**63 (exact scaling by
        # a power of two; a prescaled value that would flush lies far below either).
        # So each code is a product and two comparisons with a per-group bound.
        if packed:  # (else a compare and a select a value cost less than one more pass)
            keep, b = per_group(lambda inv, *pre: (keep_of(inv), bound(*pre)), inv, *pres)
        else:
            keep, b = keep_of(inv), bound(*pres)
        if pre is not None:
            b = scaling.broadcast(b, x.shape)
        y = x * scaling.broadcast(inv, x.shape)
        up, down = (y > b, y < -b) if rounding == "nearest_even" else (y >= b, y <= -b)
        steps = jnp.where(up, jnp.int32(1), jnp.where(down, jnp.int32(-1), jnp.int32(0)))
    else:
        inv_b = scaling.broadcast(inv, x.shape)
        prescaled = x if pre is None else _ieee.times_pow2_down(x, scaling.broadcast(pre, x.shape))
        steps = round_integer(prescaled * inv_b, rounding).astype(jnp.int32)
        steps = jnp.clip(steps, -qmax, qmax)
        if keep is None:
            keep = per_group(keep_of, inv)
    return steps & scaling.broadcast(keep, x.shape)


# The group size from which a one-step grid's codes come from a threshold per group
# (`_unit_threshold`: 13 products a group) rather than a product per value: per block
# of 32 the search cost 1.18x the rounded product, per row of 2048 0.85x (int2, 2**21
# values); against the product compared with a bound, per block of 32 it cost 1.02x.
_UNIT_THRESHOLD_GROUP = 128

# How far, in float32 steps, the estimate of a unit threshold may lie from it: the
# threshold lies 0 to 2 steps above a correctly rounded `0.5 / inv` (over 2.6 million
# reciprocals, powers of two and their neighbours included), and the estimate's division
# may be a few steps off under fast-math flags.
_THRESHOLD_SEARCH = 6


def _unit_threshold(inv: jax.Array, pre: jax.Array | None, rounding: str) -> jax.Array:
    """Per group, the smallest float32 magnitude whose code is 1 on a grid of one step
    (int2: codes -1, 0, 1), at least 2**-126; for `nearest_steps_cpu`.

    The code of `x` is 1 when `fl(x * pre * inv)` exceeds 1/2 (nearest_even: the tie
    rounds to the even 0) or reaches it (nearest_away), and `x * pre` is exact (a power
    of two; a product it would make subnormal lies far below any such `x`). So the
    threshold on `w = x * pre` is the smallest float32 `w` with `fl(w * inv) > 1/2`
    (`>=`), found among a few floats around `0.5 / inv`, each tried with the very
    multiplication the exact form makes, and the one on `x` is `w / pre`, exact. A
    threshold below float32's smallest normal is raised to it: the exact form flushes
    subnormal `x` to a code 0. Groups whose reciprocal is 0 get any threshold: their
    codes are cleared afterwards.
    """
    inv = jnp.where(inv == 0, jnp.float32(1), inv)
    estimate = jnp.maximum(jnp.float32(0.5) / inv, TINY)
    base = lax.bitcast_convert_type(estimate, jnp.int32)
    steps = jnp.arange(-_THRESHOLD_SEARCH, _THRESHOLD_SEARCH + 1, dtype=jnp.int32)
    steps = steps.reshape((1,) * base.ndim + steps.shape)
    tried = lax.bitcast_convert_type(base[..., None] + steps, jnp.float32)
    tried = jnp.maximum(tried, TINY)
    product = tried * inv[..., None]
    one = product > 0.5 if rounding == "nearest_even" else product >= 0.5
    # the smallest candidate whose code is 1 (the candidates ascend, and so do codes)
    w = jnp.min(jnp.where(one, tried, jnp.float32(np.finfo(np.float32).max)), axis=-1)
    if pre is None:
        return w
    return _ieee.times_pow2(w, jnp.where(pre < 1, jnp.float32(2.0**64), 1))  # (w >= 2**-126)


def _finite_normal(x: jax.Array, *, signed_zero: bool) -> jax.Array:
    """float32 `x` with subnormals flushed (to zero of their sign, or to +0) and NaN
    and ±inf replaced by +0, from the bits: one test of the exponent field, which
    is in [1, 254] exactly for the normal finite values."""
    u = lax.bitcast_convert_type(x, jnp.uint32)
    exponent = u & jnp.uint32(0x7F800000)
    normal = (exponent - jnp.uint32(0x00800000)) < jnp.uint32(0x7F000000)  # (wraps below)
    other = jnp.uint32(0)
    if signed_zero:
        other = jnp.where(exponent == jnp.uint32(0), u & jnp.uint32(0x80000000), other)
    return _ieee.from_bits(jnp.where(normal, u, other))
