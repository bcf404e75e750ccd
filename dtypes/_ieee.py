"""Float32 operations that give the same bits on every backend and under any XLA flags.

XLA leaves the rounding of a floating-point division to the backend: XLA:GPU
divides float32 with an approximate reciprocal (one ulp off for some
inputs), and XLA:CPU does the same under its fast-math flags. Scales and
their reciprocals decide every code of a scaled encoding, so `dtypes`
computes them with `divide`: the quotient of the two significands estimated by
the backend's division and corrected in integers, rounded to nearest even from
the remainder, assembled from bits. Integer arithmetic is exact on every
backend, so the result is the correctly rounded IEEE quotient everywhere.

Subnormal operands read as zero and subnormal results are flushed to (signed)
zero, as XLA:CPU's arithmetic does; a NaN result is the positive quiet NaN,
built from its bits.

The same holds for NaN and infinity: a backend may assume there are none
(XLA:CPU's fast-math flags do, and then fold `isnan` to false, a select of a
NaN constant to its other branch, `x * 0` to +0) or canonicalize a NaN's sign
in a conversion (GPUs do). So whether a value is NaN, infinite or subnormal
is read from its bits (`is_nan`, `is_finite`, `flush_subnormals`), and a
value that must be NaN or inf is selected as bits (`nan_where`, `select`),
never left to arithmetic.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from ._encode_input_checks import numeric_array
from ._errors import FormatError, PrecisionTypeError

__all__ = [
    "BYTE_FLOATS",
    "astype",
    "bfloat16_codes",
    "byte_float_codes",
    "converted_on_cpu",
    "divide",
    "flush_subnormals",
    "from_bits",
    "from_float32",
    "is_finite",
    "is_inf",
    "is_nan",
    "nan_where",
    "pow2",
    "quotient_times_pow2",
    "select",
    "times_pow2",
    "times_pow2_down",
    "times_scale",
    "to_float32",
    "unsigned_zero",
]

_SIGN = 0x80000000
_EXP_ONES = 0x7F800000
_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
_QUIET_NAN = 0x7FC00000
_FRACTION = 0x7FFFFF
_HIDDEN = 0x800000


def from_bits(u: jax.Array) -> jax.Array:
    """The float32 value of uint32 bits."""
    return lax.bitcast_convert_type(u.astype(jnp.uint32), jnp.float32)


def is_nan(x: Any) -> jax.Array:
    """Whether each float32 value is NaN, from its bits."""
    out: jax.Array = (_bits(x) & jnp.uint32(0x7FFFFFFF)) > jnp.uint32(_EXP_ONES)
    return out


def is_inf(x: Any) -> jax.Array:
    """Whether each float32 value is +inf or -inf, from its bits."""
    out: jax.Array = (_bits(x) & jnp.uint32(0x7FFFFFFF)) == jnp.uint32(_EXP_ONES)
    return out


def is_finite(x: Any) -> jax.Array:
    """Whether each float32 value is finite (neither NaN nor ±inf), from its bits."""
    out: jax.Array = (_bits(x) & jnp.uint32(_EXP_ONES)) != jnp.uint32(_EXP_ONES)
    return out


def select(cond: Any, a: Any, b: Any) -> jax.Array:
    """`where(cond, a, b)` for float32 values, chosen as bits: a NaN or inf branch
    survives flags that assume there are none."""
    return from_bits(jnp.where(cond, _bits(a), _bits(b)))


def nan_where(cond: Any, x: Any) -> jax.Array:
    """`x` with the positive quiet NaN where `cond`, chosen as bits."""
    return from_bits(jnp.where(cond, jnp.uint32(_QUIET_NAN), _bits(x)))


def times_scale(values: jax.Array, scale: jax.Array, *, flush: bool = True) -> jax.Array:
    """`values * scale` (float32), NaN exactly where the scale is NaN, selected as bits
    (a product with a NaN that flags assuming none may turn into anything).

    A subnormal product is flushed on the bits (XLA:CPU flushes it, GPUs keep it);
    `flush=False` where none can be: integer values times normal scales.
    """
    nan = is_nan(scale)
    product = values * select(nan, jnp.float32(1), scale)
    return nan_where(nan, flush_subnormals(product) if flush else product)


def unsigned_zero(x: jax.Array) -> jax.Array:
    """float32 `x` with -0 replaced by +0, on the bits: integer codes held as floats
    must not carry a sign of zero, or a compiler that drops their round trip through
    an integer type (allowed for integral values) would change the decoded bits."""
    u = _bits(x)
    return from_bits(jnp.where((u & jnp.uint32(0x7FFFFFFF)) == 0, jnp.uint32(0), u))


def flush_subnormals(x: Any) -> jax.Array:
    """float32 `x` with subnormals replaced by zero of the same sign, from the bits
    (XLA:CPU reads subnormal operands as zero, GPUs need not)."""
    u = _bits(x)
    return from_bits(jnp.where((u & jnp.uint32(_EXP_ONES)) == 0, u & jnp.uint32(_SIGN), u))


def times_pow2(x: jax.Array, p: Any) -> jax.Array:
    """`x * p` for float32 `x` and powers of two `p`, exactly, on the exponent bits.

    A product that would be subnormal is zero of `x`'s sign (as XLA:CPU flushes
    it); the product must not overflow (callers scale into range). Done on the
    bits so that no compiler can reassociate it with the multiplication that
    follows (`(x * 2**-64) * r` into `x * (2**-64 * r)`, whose factor may
    underflow), nor factor it out of a sum: fast-math flags allow both.
    """
    u = _bits(x)
    k = ((_bits(p) >> 23) & 0xFF).astype(jnp.int32) - 127  # p = 2**k
    e = ((u >> 23) & 0xFF).astype(jnp.int32) + k
    keep = (e >= 1) & ((u & jnp.uint32(_EXP_ONES)) != 0)
    moved = (u & jnp.uint32(~_EXP_ONES & 0xFFFFFFFF)) | (
        jnp.clip(e, 1, 254).astype(jnp.uint32) << 23
    )
    return from_bits(jnp.where(keep, moved, u & jnp.uint32(_SIGN)))


def times_pow2_down(x: jax.Array, p: Any) -> jax.Array:
    """`times_pow2(x, p)` for powers of two `p <= 1` (a prescale), in five operations.

    The same bits as `times_pow2` for every finite `x`: with `p = 2**-k`, the product
    is `x` with `k` taken off its exponent field where that field exceeds `k`, and
    zero of `x`'s sign elsewhere (a subnormal product, or `x` zero or subnormal).
    `k << 23` is the difference of the bits of 1 and of `p`. (NaN and inf keep their
    exponent field where `times_pow2` would saturate it; callers set them aside.)
    """
    u = _bits(x)
    drop = jnp.uint32(np.float32(1).view(np.uint32)) - _bits(p)
    return from_bits(jnp.where((u & jnp.uint32(_EXP_ONES)) > drop, u - drop, u & jnp.uint32(_SIGN)))


def _bits(x: Any) -> jax.Array:
    """The float32 bit pattern of `x`; a literal for a Python or numpy scalar (so a
    constant divisor's integer division compiles to a multiply-high)."""
    if isinstance(x, float | int | np.floating | np.integer):
        literal: jax.Array = jnp.uint32(np.float32(x).view(np.uint32))
        return literal
    return lax.bitcast_convert_type(jnp.asarray(x, jnp.float32), jnp.uint32)


def divide(a: Any, b: Any) -> jax.Array:
    """`a / b` in float32, correctly rounded (nearest even), on every backend.

    For finite `a` and finite, normal, nonzero `b` (every scale computation's case:
    callers set NaN groups aside first). A zero or subnormal `a`, or a quotient
    below the smallest normal, gives zero of the quotient's sign (as XLA:CPU
    flushes it); a quotient past float32's largest value gives inf.

    The quotient of the significands is estimated by the backend's own float32
    division (correctly rounded on XLA:CPU by default, a few ulps off on GPUs and
    under fast-math flags), then corrected exactly in integers: with the dividend's
    significand `A` in [B, 2B) and the divisor's `B`, the rounded significand is
    the integer `Q` nearest `A * 2**23 / B`, and the remainder `A * 2**23 - Q * B`,
    a few times `B` at most, is exact in the low 32 bits of both products. Two
    rounds of correction reach the nearest `Q` from any estimate within 4 of it;
    a remainder of exactly half of `B` is a tie, given to the even `Q`. No integer
    division: a group's reciprocal costs a few dozen vectorised operations.

    Examples:
        >>> import numpy as np
        >>> float(divide(np.float32(1), np.float32(3))) == float(np.float32(1) / np.float32(3))
        True
    """
    # (in `lax` with literal operands, the program `jnp`'s operators and `where` would
    # make: traced in 31 ms a shape against their 69; a scale rule traces two a shape)
    ua, ub = jnp.broadcast_arrays(_bits(a), _bits(b))
    u32 = np.uint32
    ea = lax.bitwise_and(lax.shift_right_logical(ua, u32(23)), u32(0xFF))
    eb = lax.bitwise_and(lax.shift_right_logical(ub, u32(23)), u32(0xFF))
    ma = lax.bitwise_or(lax.bitwise_and(ua, u32(_FRACTION)), u32(_HIDDEN))
    mb = lax.bitwise_or(lax.bitwise_and(ub, u32(_FRACTION)), u32(_HIDDEN))
    # Bring the dividend's significand into [mb, 2 mb): the quotient is then in [1, 2).
    short = lax.lt(ma, mb)
    one_if_short = _as(short, jnp.uint32)
    # the biased exponent of the quotient, kept positive in uint32 (+ 256)
    exponent = lax.sub(lax.sub(lax.add(ea, u32(127 + 256)), eb), one_if_short)
    # estimate: (ma / mb) * 2**23, or 2**24 when short; both significands are exact floats
    ratio = lax.div(_as(ma, jnp.float32), _as(mb, jnp.float32))
    scaled = lax.select(short, lax.full_like(ratio, 2.0**24), lax.full_like(ratio, 2.0**23))
    estimate = lax.min(lax.max(lax.mul(ratio, scaled), np.float32(2.0**22)), np.float32(2.0**25))
    q = _as(lax.round(estimate, lax.RoundingMethod.TO_NEAREST_EVEN), jnp.int32)
    # the dividend (ma << (23 + short)), whose low 32 bits the remainder needs
    shifted = lax.shift_left(lax.shift_left(ma, u32(23)), one_if_short)
    mant = _nearest_quotient(shifted, q, mb)
    carry = lax.shift_right_logical(mant, u32(24))  # rounded up to 2**24: one more exponent
    exponent = lax.add(exponent, carry)
    mant = lax.shift_right_logical(mant, carry)
    sign = lax.bitwise_and(lax.bitwise_xor(ua, ub), u32(_SIGN))
    under = lax.bitwise_or(lax.le(exponent, u32(256)), lax.eq(ea, u32(0)))  # (zero or subnormal a)
    over = lax.ge(exponent, u32(256 + 255))
    body = lax.shift_left(lax.sub(exponent, u32(256)), u32(23))
    body = lax.bitwise_or(body, lax.bitwise_and(mant, u32(_FRACTION)))
    zero, inf = lax.full_like(body, 0), lax.full_like(body, _EXP_ONES)
    bits = lax.select(under, zero, lax.select(over, inf, body))
    return lax.bitcast_convert_type(lax.bitwise_or(sign, bits), jnp.float32)


def _nearest_quotient(dividend: jax.Array, q: jax.Array, divisor: jax.Array) -> jax.Array:
    """The integer nearest `n / divisor` (ties to even, uint32), from an estimate `q`
    (int32) within 4 of it: `dividend` holds the low 32 bits of the integer `n`, and
    the remainder `n - q * divisor`, a few times `divisor` at most (below 2**26), is
    exact in wrapping 32-bit arithmetic. Two rounds of correction, each moving `q` by
    `round(rem / divisor)` while `|rem| < 2.5 divisor`, bring `|rem|` to at most half
    the divisor; exactly half is a tie, settled towards the even `q`."""
    i32 = np.int32
    wrapped = lax.sub(dividend, lax.mul(_as(q, jnp.uint32), divisor))
    rem = lax.bitcast_convert_type(wrapped, jnp.int32)
    d = _as(divisor, jnp.int32)
    minus_d = lax.neg(d)
    for _ in range(2):
        twice = lax.mul(rem, i32(2))
        step = lax.add(_one(lax.gt(twice, d)), _one(lax.gt(twice, lax.mul(d, i32(3)))))
        step = lax.sub(step, _one(lax.lt(twice, minus_d)))
        step = lax.sub(step, _one(lax.lt(twice, lax.mul(d, i32(-3)))))
        q = lax.add(q, step)
        rem = lax.sub(rem, lax.mul(step, d))
    twice, odd = lax.mul(rem, i32(2)), lax.eq(lax.bitwise_and(q, i32(1)), i32(1))
    tie_up, tie_down = lax.eq(twice, d), lax.eq(twice, minus_d)
    mant = lax.add(q, _one(lax.bitwise_and(tie_up, odd)))
    return _as(lax.sub(mant, _one(lax.bitwise_and(tie_down, odd))), jnp.uint32)


def quotient_times_pow2(a: np.float32, b: jax.Array, shift: jax.Array) -> jax.Array:
    """`a / b` rounded to nearest even as IEEE arithmetic that keeps subnormals rounds it
    (numpy's: below 2**-126 on the subnormal grid, multiples of 2**-149), times
    `2**shift`, exactly, on every backend. For a positive constant `a`, finite normal
    `b` > 0, and int32 `shift` that makes the result a normal float32.

    A scale rule takes a reciprocal that may be subnormal (int2's `1 / absmax` past
    2**126) times 2**64, since XLA:CPU flushes subnormals: the scaled value must be the
    subnormal's, of fewer significant bits than `divide(a * 2**64, b)` keeps, or the
    products `x * (a / b)` differ from the rule's in their last bit. As `divide`: the
    significands' quotient estimated by the backend's division, then rounded exactly in
    integers (`_nearest_quotient`), at the position a subnormal quotient rounds at.
    """
    ta = int(np.float32(a).view(np.uint32))
    ma, ea = (ta & _FRACTION) | _HIDDEN, (ta >> 23) & 0xFF
    u32, i32 = np.uint32, np.int32
    ub = lax.bitcast_convert_type(jnp.asarray(b, jnp.float32), jnp.uint32)
    mb = lax.bitwise_or(lax.bitwise_and(ub, u32(_FRACTION)), u32(_HIDDEN))
    eb = _as(lax.bitwise_and(lax.shift_right_logical(ub, u32(23)), u32(0xFF)), jnp.int32)
    short = _one(lax.lt(u32(ma), mb))  # 1 where ma < mb: the quotient's significand is below 1
    # the quotient's biased exponent (subnormal below 1, where `below` bits are lost)
    e = lax.sub(lax.sub(i32(ea + 127), eb), short)
    below = lax.clamp(i32(0), lax.sub(i32(1), e), lax.add(short, i32(23)))
    # the significand, rounded at its last place: nearest ma * 2**point / mb
    point = lax.sub(lax.add(short, i32(23)), below)
    ratio = lax.div(np.float32(ma), _as(mb, jnp.float32))
    q = _as(lax.round(lax.mul(ratio, pow2(point)), lax.RoundingMethod.TO_NEAREST_EVEN), jnp.int32)
    dividend = lax.shift_left(lax.full_like(mb, u32(ma)), _as(point, jnp.uint32))
    m = _nearest_quotient(dividend, q, mb)
    # m * 2**(e + below - 150) * 2**shift, the power of two applied on the bits
    k = lax.add(lax.add(e, below), lax.sub(shift, i32(150)))
    return times_pow2(_as(m, jnp.float32), pow2(k))


def pow2(k: jax.Array) -> jax.Array:
    """2**k as float32 built from bits (no arithmetic to flush); k clamped to normals."""
    k = jnp.clip(k, -126, 127)
    return lax.bitcast_convert_type(((k + 127).astype(jnp.uint32)) << 23, jnp.float32)


def _as(x: jax.Array, dtype: Any) -> jax.Array:
    return lax.convert_element_type(x, dtype)


def _one(where: jax.Array) -> jax.Array:
    """int32 1 where `where` holds, else 0."""
    return _as(where, jnp.int32)


def to_float32(x: jax.Array) -> jax.Array:
    """float32 values of a narrower float array (bfloat16, float16, float8), built from
    the codes' bits alone, subnormals, NaN and ±inf included (sign kept).

    Not a conversion: a compiler may drop a convert round trip (`f32 -> f16 -> f32`
    becomes the unrounded value where excess precision is allowed, XLA's default),
    a conversion may canonicalize a NaN's sign or flush subnormals, and flags that
    assume no NaN or inf may turn those into anything.
    """
    if x.dtype == jnp.float32:
        return x
    dtype = np.dtype(x.dtype)
    if dtype == np.dtype(jnp.bfloat16):  # float32's upper half, subnormals included
        u16 = lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
        return from_bits(u16 << 16)
    nan_codes, inf_codes, width = _special_codes(dtype)
    info = ml_dtypes.finfo(dtype)
    m_bits, bias = int(info.nmant), 1 - int(info.minexp)
    u = lax.bitcast_convert_type(x, jnp.uint8 if width == 8 else jnp.uint16).astype(jnp.uint32)
    sign = (u >> (width - 1)) << 31
    mag = u & jnp.uint32((1 << (width - 1)) - 1)
    exp = (mag >> m_bits).astype(jnp.int32)
    mant = mag & jnp.uint32((1 << m_bits) - 1)
    normal = (exp + (127 - bias)).astype(jnp.uint32) << 23 | (mant << (23 - m_bits))
    # a subnormal code: mant * 2**(1 - bias - m_bits), its top bit at position p
    p = 31 - lax.clz(mant).astype(jnp.int32)
    sub_exp = (p + (1 - bias - m_bits) + 127).astype(jnp.uint32)
    shift = jnp.clip(23 - p, 0, 31).astype(jnp.uint32)
    sub = (sub_exp << 23) | ((mant << shift) & jnp.uint32(_FRACTION))
    out = jnp.where(exp > 0, normal, jnp.where(mant > 0, sub, jnp.uint32(0)))
    # float16 NaNs keep their payload, made quiet (as XLA's conversion does); the
    # float8 types' NaNs widen to the quiet NaN (as ml_dtypes' do)
    nan = jnp.uint32(_QUIET_NAN)
    if dtype == np.float16:
        nan = nan | (mant << (23 - m_bits))
    out = jnp.where(_among(mag, nan_codes), nan, out)
    out = jnp.where(_among(mag, inf_codes), jnp.uint32(_EXP_ONES), out)
    return from_bits(sign | out)


def from_float32(x: jax.Array, dtype: Any) -> jax.Array:
    """float32 `x` converted to a narrower float dtype (nearest even), NaN and ±inf
    written as bits with their sign (inf becomes NaN where the dtype has no inf,
    as XLA's and ml_dtypes' conversions do)."""
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return x
    if dtype == _BFLOAT16:
        # XLA:CPU's conversion is one XLA will not copy into a second consumer: a
        # bfloat16 operand that an op also reads elsewhere (the probe of
        # `precision`'s decode at use) is then written twice, once converted and once
        # with NaN and inf fixed (`Tensor @ Tensor` 1.2-1.35x the plain expression).
        # The bits make the same codes in integer operations XLA fuses anywhere.
        bf16: jax.Array = lax.platform_dependent(
            x, cpu=bfloat16_codes, default=lambda v: _converted(v, dtype)
        )
        return bf16
    if dtype not in BYTE_FLOATS:
        return _converted(x, dtype)
    # XLA:CPU converts into the one-byte floats with a long integer sequence of its own
    # (0.56-0.64 ms for 2**21 values), `byte_float_codes` in 0.25, the same byte for each
    # of the 2**32 float32 (`tests/dtypes/test_byte_float_codes.py`), NaN and inf as the
    # bits below write them. So a CPU (`lax.platform_dependent`: the platform lowered
    # for) takes it; elsewhere XLA's conversion (a GPU's is an instruction).
    out: jax.Array = lax.platform_dependent(
        x, cpu=lambda v: byte_float_codes(v, dtype), default=lambda v: _converted(v, dtype)
    )
    return out


def _converted(x: jax.Array, dtype: np.dtype[Any]) -> jax.Array:
    """`from_float32` by XLA's conversion, NaN and inf then written on the bits."""
    nan_codes, inf_codes, width = _special_codes(dtype)
    uint = jnp.uint8 if width == 8 else jnp.uint16
    u = _bits(x)
    sign = (u >> 31) << (width - 1)
    # The codes are chosen in 32-bit lanes, not the narrow ones (half the vectors):
    # XLA moves a conversion through a select of narrow values, and where it may drop
    # convert round trips (GPUs, fast-math flags) a round after it then vanishes
    out = lax.bitcast_convert_type(x.astype(dtype), uint).astype(jnp.uint32)
    if dtype == np.float16:
        # float16 keeps the payload's top bits, made quiet (as XLA:CPU's conversion
        # does; numpy's keeps a signaling NaN signaling)
        payload = (u & jnp.uint32(_FRACTION)) >> 13
        nan_code = jnp.uint32(0x7C00 | 0x200) | payload
    elif isinstance(nan_codes, int):
        # ml_dtypes' bfloat16 and float8 types write their quiet NaN
        m_bits = int(ml_dtypes.finfo(dtype).nmant)
        nan_code = jnp.uint32(nan_codes | (1 << (m_bits - 1)))
    else:
        nan_code = jnp.uint32(nan_codes[0] if nan_codes else 0)
    inf_code = jnp.uint32(inf_codes[0]) if inf_codes else nan_code
    # one select over the values: NaN's or inf's code, chosen between the two codes
    magnitude = u & jnp.uint32(0x7FFFFFFF)
    special = jnp.where(magnitude > jnp.uint32(_EXP_ONES), nan_code, inf_code)
    out = jnp.where(magnitude >= jnp.uint32(_EXP_ONES), sign | special, out)
    narrow: jax.Array = lax.bitcast_convert_type(out.astype(uint), dtype)
    return narrow


def astype(x: Any, dtype: Any) -> jax.Array:
    """`x.astype(dtype)`, with the same bits on every backend and under any XLA flags.

    float32 into bfloat16, float16 or a one-byte float (float8_e4m3fn, float8_e5m2,
    float8_e4m3, float8_e3m4) rounds to nearest even, as XLA's conversion and ml_dtypes
    do, and NaN and ±inf are written as bits with their sign (a GPU's conversion may
    canonicalize a NaN's sign; flags that assume no NaN may drop it). On a CPU the
    one-byte floats are made from the bits, in less than half the time of XLA's
    conversion there. Every other conversion is `x.astype(dtype)` itself.
    Differentiable as `astype` is: the tangent is converted to `dtype`.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import dtypes
        >>> x = jnp.array([1.0, 3.3, -0.0, 500.0])
        >>> dtypes.astype(x, jnp.float8_e4m3fn).tolist()  # (past 464: e4m3fn's NaN)
        [1.0, 3.25, -0.0, nan]
        >>> jax.grad(lambda v: dtypes.astype(v, jnp.bfloat16).sum())(x).tolist()
        [1.0, 1.0, 1.0, 1.0]
    """
    x, dtype = _astype_arguments(x, dtype)
    out: jax.Array
    if x.dtype != jnp.float32 or dtype not in _NARROW_FLOATS:
        out = x.astype(dtype)
    else:
        out = _narrowed_jit(x, dtype)
    return out


def _astype_arguments(x: Any, dtype: Any) -> tuple[jax.Array, np.dtype[Any]]:
    """`astype`'s arguments as an array of numbers and a numeric dtype, or a refusal."""
    try:
        target = np.dtype(dtype)
    except (TypeError, ValueError) as e:
        raise PrecisionTypeError(
            f"astype: {dtype!r:.40} is not a dtype ({e}); pass one such as jnp.float8_e4m3fn"
        ) from None
    narrow = target.kind == "V" and target.names is None and target.itemsize <= 2  # (ml_dtypes)
    if not (target.kind in "biufc" or narrow):
        raise PrecisionTypeError(
            f"astype: {target} is not a dtype of numbers; pass a float or integer dtype such "
            "as jnp.float8_e4m3fn or jnp.int8"
        )
    a = numeric_array(x, "astype: x")
    return a, target


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _narrowed(x: jax.Array, dtype: np.dtype[Any]) -> jax.Array:
    return from_float32(x, dtype)


@_narrowed.defjvp
def _narrowed_jvp(
    dtype: np.dtype[Any], primals: tuple[jax.Array], tangents: tuple[jax.Array]
) -> tuple[jax.Array, jax.Array]:
    return _narrowed(primals[0], dtype), tangents[0].astype(dtype)


# One compiled kernel per (dtype, shape): an eager call is one dispatch, not one per
# operation (2.8 ms against 40 us for 1,000 values); under an outer `jit` it is inlined.
_narrowed_jit = jax.jit(_narrowed, static_argnums=(1,))


BYTE_FLOATS = tuple(
    np.dtype(t)
    for t in (
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e4m3,
        ml_dtypes.float8_e3m4,
    )
)
"""The one-byte floats whose conversion from float32 XLA:CPU takes from `byte_float_codes`:
IEEE-style layouts with a code of their own for -0, NaN's codes above every finite one."""


_NARROW_FLOATS = (_BFLOAT16, np.dtype(np.float16), *BYTE_FLOATS)


def converted_on_cpu(x: jax.Array, dtype: Any) -> jax.Array:
    """`x.astype(dtype)` for float32 `x` as XLA:CPU computes it fastest: from the bits
    for the one-byte floats `byte_float_codes` writes (the same bytes as XLA's
    conversion), else XLA's conversion. For code already on a CPU's branch of
    `lax.platform_dependent`."""
    if np.dtype(dtype) in BYTE_FLOATS:
        return byte_float_codes(x, dtype)
    if np.dtype(dtype) == _BFLOAT16:
        return bfloat16_codes(x)
    return x.astype(dtype)


def bfloat16_codes(x: jax.Array) -> jax.Array:
    """float32 `x` in bfloat16, rounded to nearest even, from the bits: the codes XLA's
    conversion writes, NaN and inf as `from_float32` writes them.

    bfloat16 is float32's upper half, so rounding the lower half away rounds the
    value, subnormals and the overflow to inf included: adding half the dropped unit
    less one, plus the lowest kept bit (a tie goes to the even code), carries where it
    must. A NaN (whose sum could carry into the sign) is the quiet NaN with its sign.
    """
    u = lax.bitcast_convert_type(x, jnp.uint32)
    rounded = (u + jnp.uint32(0x7FFF) + ((u >> 16) & jnp.uint32(1))) >> 16
    nan = (u >> 16) & jnp.uint32(0x8000) | jnp.uint32(_QUIET_NAN >> 16)
    code = jnp.where((u & jnp.uint32(0x7FFFFFFF)) > jnp.uint32(_EXP_ONES), nan, rounded)
    out: jax.Array = lax.bitcast_convert_type(code.astype(jnp.uint16), jnp.bfloat16)
    return out


def byte_float_codes(x: jax.Array, dtype: Any) -> jax.Array:
    """float32 `x` in the one-byte float `dtype` (one of `BYTE_FLOATS`), rounded to
    nearest even, from the bits: the byte XLA's conversion writes, for every float32.

    A magnitude at or above the format's smallest normal rounds on its bits: adding
    half a step less one, plus the lowest kept bit (the tie goes to the even code),
    carries into the exponent where it must, and the shifted bits less the difference
    of the exponent biases are the code. Below it the grid is the multiples of the
    smallest subnormal `s`, and `round(|x| / s)` (a product by a power of two, exact;
    a float32 subnormal reads as zero, and rounds to zero anyway) is the code, the
    smallest normal's included. Past the largest finite code: inf's code, or NaN's in a
    format without inf; NaN: the format's quiet NaN. The sign is the input's bit.
    """
    dtype = np.dtype(dtype)
    m, emin, top, over, nan = _byte_float_layout(dtype)
    u = lax.bitcast_convert_type(x, jnp.uint32)
    mag = u & jnp.uint32(0x7FFFFFFF)
    drop = 23 - m  # float32 fraction bits below the format's
    lowest = (mag >> drop) & jnp.uint32(1)
    rounded = (mag + jnp.uint32((1 << (drop - 1)) - 1) + lowest) >> drop
    normal = rounded - jnp.uint32((127 - (1 - emin)) << m)
    a = lax.bitcast_convert_type(mag, jnp.float32)
    sub = jnp.round(a * np.float32(2.0 ** (m - emin))).astype(jnp.uint32)
    small = mag < jnp.uint32(np.float32(2.0**emin).view(np.uint32))
    code = jnp.where(small, sub, jnp.minimum(normal, jnp.uint32(top + 1)))
    code = jnp.where(code > top, jnp.uint32(over), code)
    code = jnp.where(mag > jnp.uint32(_EXP_ONES), jnp.uint32(nan), code)
    sign = (u >> 24).astype(jnp.uint8) & jnp.uint8(0x80)
    out: jax.Array = lax.bitcast_convert_type(code.astype(jnp.uint8) | sign, dtype)
    return out


@functools.cache
def _byte_float_layout(dtype: np.dtype[Any]) -> tuple[int, int, int, int, int]:
    """(fraction bits, smallest normal exponent, largest finite magnitude code, the code
    past it (inf's, or NaN's), NaN's magnitude code) of a one-byte float, from
    ml_dtypes' own values."""
    if dtype not in BYTE_FLOATS:
        raise FormatError(
            f"byte_float_codes: {dtype} is not one of the one-byte floats it writes "
            f"({', '.join(t.name for t in BYTE_FLOATS)}); convert with x.astype({dtype.name})"
        )
    info = ml_dtypes.finfo(dtype)
    values = np.array([info.max, np.inf, np.nan], np.float32)
    top, over, nan = (int(c) & 0x7F for c in values.astype(dtype).view(np.uint8))
    return int(info.nmant), int(info.minexp), top, over, nan


def _among(mag: jax.Array, codes: tuple[int, ...] | int) -> jax.Array:
    """Whether each magnitude is one of `codes` (an int: every magnitude above it)."""
    if isinstance(codes, int):
        above: jax.Array = mag > jnp.uint32(codes)
        return above
    hit = jnp.zeros(mag.shape, bool)
    for c in codes:
        hit = hit | (mag == jnp.uint32(c))
    return hit


@functools.cache
def _special_codes(dtype: np.dtype[Any]) -> tuple[tuple[int, ...] | int, tuple[int, ...], int]:
    """(NaN magnitudes, or the infinity's magnitude when every code above it is NaN;
    inf magnitudes; width in bits) of a float dtype, read off ml_dtypes' own values."""
    width = dtype.itemsize * 8
    mags = np.arange(1 << (width - 1), dtype=np.uint8 if width == 8 else np.uint16)
    values = mags.view(dtype).astype(np.float32)
    nans = tuple(int(m) for m in mags[np.isnan(values)])
    infs = tuple(int(m) for m in mags[np.isinf(values)])
    if infs and len(nans) > 1:
        return infs[0], infs, width
    return nans, infs, width
