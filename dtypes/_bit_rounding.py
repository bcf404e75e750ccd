"""Rounding onto a format's grid with integer bit operations.

Why bits and not float arithmetic: XLA on CPU flushes float32 subnormals to
zero in arithmetic, so `x * 2**k` tricks lose exactly the values a small
format must keep; and under `jit` XLA may delete a `convert` round trip
(`x.astype(bf16).astype(f32)`), so a cast is not a guaranteed rounding. Every
step below is an integer operation on the input's bit pattern, which the
compiler can neither flush nor elide.

The scheme: write |x| as `sig * 2**(e - Ms)` (the input's own significand,
`Ms` its mantissa bits), find the quantum `2**qe` of the target grid at that
magnitude, split `sig` into a quotient `q` and a remainder `rem` at that
quantum, decide the increment from the rounding mode, and rebuild the bit
pattern of `(q + inc) * 2**qe` in the input's own format. Overflow is decided
on that unbounded-exponent result, exactly as IEEE-754 specifies.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._errors import RoundingError

__all__ = ["Grid", "compose_bits", "random_bits", "round_float", "round_integer"]


class _Source(NamedTuple):
    """Bit layout of the input float type."""

    uint: type
    width: int
    mantissa_bits: int
    bias: int


_SOURCES = {
    np.dtype(np.float32): _Source(np.uint32, 32, 23, 127),
    np.dtype(np.float64): _Source(np.uint64, 64, 52, 1023),
}


class Grid(NamedTuple):
    """The target grid: what `round_float` needs to know about a float format."""

    mantissa_bits: int
    emin: int  # unbiased exponent of the smallest normal
    max: float  # largest finite value
    has_inf: bool
    has_nan: bool
    saturate: bool


def _mix32(h: jax.Array) -> jax.Array:
    # A 32-bit avalanche mixer (xorshift-multiply, two rounds): every output bit
    # depends on every input bit, which is all stochastic rounding needs.
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x7FEB352D)
    h = h ^ (h >> 15)
    h = h * jnp.uint32(0x846CA68B)
    return h ^ (h >> 16)


def random_bits(key: jax.Array, shape: tuple[int, ...], word: int = 0) -> jax.Array:
    """Uniform uint32 bits for `shape` from a counter-based hash of the element index.

    `jax.random.bits` for a whole tensor costs 12-34x a rounding pass on CPU;
    hashing the element index with two key-derived words fuses into the
    rounding kernel and costs about one extra pass. Only the two seed words
    come from `jax.random`, so any key implementation works. `word=1` gives a
    second, independent word per element (from two more seed words).

    The bits depend only on the key and the element's index: one key applied
    to two arrays of the same shape gives the same bits, hence identical
    rounding decisions wherever the two arrays' remainders agree. Split the
    key (or `fold_in` a leaf index) for every array that must round
    independently.
    """
    # Four seed words drawn from the key itself (not from fold_in(key, 1), which
    # JAX makes equal to split(key)[1], a key the caller may use elsewhere).
    seeds = jax.random.bits(key, (4,), jnp.uint32)
    index = lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)
    h = _mix32(index * jnp.uint32(0x9E3779B9) + seeds[2 * word])
    return _mix32(h ^ seeds[2 * word + 1])


def _float_bits(value: float, src: _Source) -> int:
    ftype = np.float32 if src.width == 32 else np.float64
    return int(np.array(value, ftype).view(src.uint))


def round_float(x: jax.Array, grid: Grid, rounding: str, key: Any = None) -> jax.Array:
    """Round a float32/float64 array onto `grid`; returns the same dtype.

    Every mode returns one of the two grid neighbours of `x`; signed zeros and
    NaN survive; overflow follows IEEE-754 (see `Grid`).
    """
    dtype = np.dtype(x.dtype)
    src = _SOURCES[dtype]
    U = src.uint
    Ms, W = src.mantissa_bits, src.width
    if grid.mantissa_bits == Ms and grid.emin <= 1 - src.bias and grid.max >= np.finfo(dtype).max:
        return _onto_own_grid(x, grid, dtype)

    u = lax.bitcast_convert_type(x, U)
    sign_mask = U(1 << (W - 1))
    exp_mask = U(((1 << (W - 1 - Ms)) - 1) << Ms)
    sign = u & sign_mask
    mag = u & ~sign_mask
    negative = sign != 0

    # The target's ulp at |x| is 2**d ulps of the input: d low bits of the
    # input's own bit pattern fall below it. Within a binade the pattern is a
    # fixed-point number, so rounding is "add an increment, clear d bits"; a
    # carry out of the mantissa moves to the next binade, which is the right
    # value too (and becomes inf past the input's largest finite).
    biased = (mag >> Ms).astype(jnp.int32)
    e = jnp.maximum(biased, 1) - src.bias  # subnormal inputs share the smallest exponent
    d = (Ms - grid.mantissa_bits) + jnp.maximum(grid.emin - e, 0)
    dc = jnp.clip(d, 0, Ms).astype(U)
    low = (U(1) << dc) - U(1)
    half = jnp.where(dc > 0, U(1) << (jnp.maximum(dc, U(1)) - U(1)), U(0))
    # The lowest kept bit; at dc == Ms it is the implicit leading 1, which the
    # pattern holds in the exponent field instead.
    lsb = jnp.where(dc == Ms, (biased > 0).astype(U), (mag >> dc) & U(1))
    zero = jnp.zeros_like(mag)
    bits = None
    if rounding == "stochastic":
        bits = random_bits(key, x.shape).astype(U)
        if W == 64:  # two independent words: 64 random bits, not 32 stretched
            bits = (bits << U(32)) | random_bits(key, x.shape, word=1).astype(U)
    add = _increment(rounding, src, dc, low, half, lsb, negative, zero, bits)
    out = (mag + add) & ~low

    # Below the target's smallest subnormal S (d > Ms) the neighbours are 0
    # and S itself, which is no longer "the same binade": decide directly.
    smallest = grid.emin - grid.mantissa_bits
    s_bits = U(_float_bits(math.ldexp(1.0, smallest), src))
    half_s_bits = U(_float_bits(math.ldexp(1.0, smallest - 1), src))
    up_tiny = _tiny_rounds_up(rounding, src, mag, biased, d, negative, half_s_bits, bits)
    tiny = jnp.where(up_tiny, s_bits, zero)
    out = jnp.where(d > Ms, tiny, out)

    out = _overflow(out, grid, rounding, src, mag, negative, exp_mask)
    return lax.bitcast_convert_type(out | sign, dtype)


def _onto_own_grid(x: jax.Array, grid: Grid, dtype: np.dtype[Any]) -> jax.Array:
    """`x` on a grid that is its own type's: nothing to round. Saturation still applies
    to ±inf (FloatFormat(8, 23, saturate=True) clamps them like every other saturating
    format does)."""
    if not grid.saturate:
        return x
    top = jnp.asarray(np.finfo(dtype).max, dtype)
    return jnp.where(jnp.isinf(x), jnp.where(x > 0, top, -top), x)


def _increment(
    rounding: str,
    src: _Source,
    dc: jax.Array,
    low: jax.Array,
    half: jax.Array,
    lsb: jax.Array,
    negative: jax.Array,
    zero: jax.Array,
    bits: jax.Array | None,
) -> jax.Array:
    """What `rounding` adds to a magnitude's bits before its `dc` low bits are cleared:
    `low` is those bits set, `half` the top one of them, `lsb` the lowest kept bit."""
    U = src.uint
    if rounding == "nearest_even":
        return jnp.where(dc > 0, half - U(1) + lsb, zero)
    if rounding == "nearest_away":
        return half
    if rounding == "toward_zero":
        return zero
    if rounding == "up":
        return jnp.where(negative, zero, low)
    if rounding == "down":
        return jnp.where(negative, low, zero)
    if rounding == "stochastic":
        assert bits is not None
        # Adding dc uniform bits carries past the ulp with probability rem / 2**dc.
        return jnp.where(dc > 0, bits >> (U(src.width) - jnp.maximum(dc, U(1))), zero)
    raise RoundingError(f"unknown rounding mode {rounding!r}")


def _tiny_rounds_up(
    rounding: str,
    src: _Source,
    mag: jax.Array,
    biased: jax.Array,
    d: jax.Array,
    negative: jax.Array,
    half_s_bits: np.unsignedinteger[Any],
    bits: jax.Array | None,
) -> jax.Array:
    """Whether a magnitude below the target's smallest subnormal S rounds up to S rather
    than to 0 (`d`: how many of its low bits lie below the target's ulp; `half_s_bits`:
    the bits of S / 2)."""
    if rounding == "nearest_even":
        return mag > half_s_bits  # the tie goes to 0, the even neighbour
    if rounding == "nearest_away":
        return mag >= half_s_bits
    if rounding == "toward_zero":
        return jnp.zeros_like(negative)
    if rounding == "up":
        return (mag != 0) & ~negative
    if rounding == "down":
        return (mag != 0) & negative
    assert bits is not None  # stochastic
    # Probability |x| / S = sig / 2**d, resolved to multiples of 2**-W.
    U, Ms, W = src.uint, src.mantissa_bits, src.width
    sig = (mag & U((1 << Ms) - 1)) | jnp.where(biased > 0, U(1 << Ms), U(0))
    left = jnp.clip(W - d, 0, W - 1).astype(U)
    right = jnp.clip(d - W, 0, W - 1).astype(U)
    return bits < jnp.where(d <= W, sig << left, sig >> right)


def _overflow(
    out: jax.Array,
    grid: Grid,
    rounding: str,
    src: _Source,
    mag: jax.Array,
    negative: jax.Array,
    exp_mask: Any,
) -> jax.Array:
    """The rounded magnitude bits `out` with overflow, inf and NaN inputs written as the
    target holds them, decided on the unbounded-exponent result as IEEE-754 does."""
    U = src.uint
    Ms = src.mantissa_bits
    max_bits = U(_float_bits(grid.max, src))
    inf_bits = exp_mask
    is_nan = mag > exp_mask
    is_inf = mag == exp_mask
    truncating = {
        "toward_zero": jnp.ones_like(negative),
        "up": negative,
        "down": ~negative,
    }.get(rounding, jnp.zeros_like(negative))
    if grid.saturate:
        over_bits, inf_in_bits = max_bits, max_bits
    elif grid.has_inf:
        over_bits, inf_in_bits = jnp.where(truncating, max_bits, inf_bits), inf_bits
    elif grid.has_nan:
        # No infinity in the format: where IEEE would give inf, give NaN.
        nan_bits = exp_mask | U(1 << (Ms - 1))
        over_bits, inf_in_bits = jnp.where(truncating, max_bits, nan_bits), nan_bits
    else:
        # Neither inf nor NaN (e.g. float4_e2m1fn): the only choice is max.
        over_bits, inf_in_bits = max_bits, max_bits
    out = jnp.where(out > max_bits, over_bits, out)
    out = jnp.where(is_inf, inf_in_bits, out)
    return jnp.where(is_nan, exp_mask | U(1 << (Ms - 1)), out)  # one quiet NaN, sign kept


def compose_bits(r: jax.Array, qe: jax.Array, src: _Source) -> jax.Array:
    """Bit pattern (sign excluded) of the value `r * 2**qe` in the source format.

    `r` has at most Ms + 2 significant bits and the value lies inside the
    source's range (or one binade above its largest finite, which becomes inf).
    """
    U = src.uint
    Ms, W = src.mantissa_bits, src.width
    n = (W - 1) - lax.clz(r).astype(jnp.int32)  # position of the top set bit (-1 for r == 0)
    top = qe + n  # unbiased exponent of the result
    emin = 1 - src.bias
    normal = top >= emin
    up = jnp.clip(Ms - n, 0, W - 1).astype(U)
    down = jnp.clip(n - Ms, 0, W - 1).astype(U)
    frac = jnp.where(n <= Ms, r << up, r >> down) & U((1 << Ms) - 1)
    expo = jnp.clip(top + src.bias, 1, (1 << (W - 1 - Ms)) - 1).astype(U)
    normal_bits = (expo << Ms) | frac
    sub_shift = jnp.clip(qe - (emin - Ms), 0, W - 1).astype(U)
    subnormal_bits = r << sub_shift
    return jnp.where(r == 0, U(0), jnp.where(normal, normal_bits, subnormal_bits))


def round_integer(y: jax.Array, rounding: str, key: Any = None) -> jax.Array:
    """Round float values to integers (still as floats) under `rounding`."""
    if rounding == "nearest_even":
        return jnp.round(y)  # jnp.round rounds halves to even
    if rounding == "toward_zero":
        return jnp.trunc(y)
    if rounding == "up":
        return jnp.ceil(y)
    if rounding == "down":
        return jnp.floor(y)
    if rounding == "nearest_away":
        t = jnp.trunc(y)
        # |y - t| is exact, unlike |y| + 0.5, which can round up across a tie.
        return t + jnp.where(jnp.abs(y - t) >= 0.5, jnp.sign(y), 0.0).astype(y.dtype)
    if rounding == "stochastic":
        # Round the magnitude: |y| - floor(|y|) is exact in float32, whereas
        # y - floor(y) of a small negative y (1 - 2**-30) is not. The
        # magnitude goes up with probability equal to that fraction, resolved
        # exactly by 64 random bits (see `_below`).
        a = jnp.abs(y)
        f = jnp.floor(a)
        r = f + _below(a - f, key).astype(y.dtype)
        return jnp.where(y < 0, -r, r)
    raise RoundingError(f"unknown rounding mode {rounding!r}")


def _below(frac: jax.Array, key: Any) -> jax.Array:
    """True with probability `frac` (float32 in [0, 1)), per element.

    Compares 64 independent random bits, read as a fraction of 2**64, with
    `frac * 2**64`, which is an integer for every `frac >= 2**-41` (a float32
    has 24 significant bits): the probability is then exactly `frac`. Below
    2**-41 it is `floor(frac * 2**64) / 2**64`, short of `frac` by less than
    2**-64. (With 24 random bits, as a float32 uniform draw has, an element
    2**-30 above a code rounded up 2**6 times too often.)
    """
    u = lax.bitcast_convert_type(frac.astype(jnp.float32), jnp.uint32)
    biased = (u >> 23).astype(jnp.int32)
    sig = (u & jnp.uint32(0x7FFFFF)) | jnp.where(biased > 0, jnp.uint32(1 << 23), jnp.uint32(0))
    # frac = sig * 2**(max(biased, 1) - 150), so frac * 2**64 = sig * 2**s:
    s = jnp.maximum(biased, 1) - 86
    left = jnp.clip(s, 0, 31).astype(jnp.uint32)
    right = jnp.clip(-s, 0, 31).astype(jnp.uint32)
    # (hi, lo) = the 64-bit integer sig * 2**s, floored when s < 0 (s <= 40 as frac < 1)
    hi = jnp.where(
        s >= 32,
        sig << jnp.clip(s - 32, 0, 31).astype(jnp.uint32),
        jnp.where(s > 0, sig >> jnp.clip(32 - s, 1, 31).astype(jnp.uint32), jnp.uint32(0)),
    )
    lo = jnp.where(s >= 32, jnp.uint32(0), jnp.where(s >= 0, sig << left, sig >> right))
    rh = random_bits(key, frac.shape)
    rl = random_bits(key, frac.shape, word=1)
    return (rh < hi) | ((rh == hi) & (rl < lo))
