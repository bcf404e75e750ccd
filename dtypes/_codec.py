"""encode / decode / quantize-dequantize for every format, in pure jnp.

Everything here runs eagerly and under `jit`, `vmap` and `grad`. The only
host-side work is the eager check that a scaled encoding gets finite input.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import TYPE_CHECKING, Any, TypeGuard

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from . import _float_codes, _packing, _scale_format
from ._encoded import Encoded
from ._errors import (
    FormatError,
    NonFiniteError,
    PrecisionTypeError,
    ScalingError,
    ShapeError,
)
from ._rounding import check_rounding, round_float, round_integer
from ._scaling import Scaling, group_sizes

if TYPE_CHECKING:
    from ._formats import FloatFormat, Format, IntFormat

__all__ = ["as_float_array", "decode", "encode", "fake_quantize", "nbytes"]


def as_float_array(x: Any) -> jax.Array:
    """`x` as a floating jax array; integers and bools become float32."""
    arr: jax.Array | np.ndarray
    if isinstance(x, jax.Array):
        arr = x
    else:
        arr = np.asarray(x)
    dtype = np.dtype(arr.dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        raise PrecisionTypeError(
            f"cannot encode complex values (dtype {dtype}); encode the real and imaginary "
            "parts separately (jnp.real(x), jnp.imag(x))"
        )
    if jnp.issubdtype(dtype, jnp.floating):  # ml_dtypes floats included
        return jnp.asarray(arr)
    if jnp.issubdtype(dtype, jnp.integer) or dtype == np.bool_:
        return jnp.asarray(arr, jnp.float32)
    raise PrecisionTypeError(
        f"cannot encode an array of dtype {dtype} (from {type(x).__name__}); "
        "pass numbers: a float, int or bool array"
    )


def _is_tracer(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def _is_float(fmt: Format) -> TypeGuard[FloatFormat]:
    """Whether `fmt` is a float format (kind "float": a `FloatFormat`)."""
    return fmt.kind == "float"


def _is_int(fmt: Format) -> TypeGuard[IntFormat]:
    """Whether `fmt` is a symmetric integer format (kind "int": an `IntFormat`)."""
    return fmt.kind == "int"


def _check_finite(x: jax.Array, fmt: Format) -> None:
    """Eagerly refuse NaN/inf in a scaled encoding: they would poison a whole group."""
    if _is_tracer(x):
        return
    # Concrete values may still meet an enclosing trace (constants closed over
    # by a jitted function): evaluate the check now, not into the trace.
    with jax.ensure_compile_time_eval():
        if bool(jnp.all(jnp.isfinite(x))):
            return
    bad = ~np.isfinite(np.asarray(x, np.float64))
    first = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape))
    value = np.asarray(x, np.float64)[first] if bad.ndim else float(np.asarray(x))
    raise NonFiniteError(
        f"cannot encode {int(bad.sum())} non-finite value(s) into scaled {fmt.name}: the first "
        f"is {value} at index {first}. A scale computed over them would be NaN; replace them "
        "first (e.g. jnp.nan_to_num(x)) or encode into an unscaled float format"
    )


def _any_nan_now(x: jax.Array) -> bool:
    with jax.ensure_compile_time_eval():
        return bool(jnp.any(jnp.isnan(x)))


def _floor_log2(a: jax.Array) -> jax.Array:
    """floor(log2(a)) of positive finite float32 values, exactly, from their bits."""
    u = lax.bitcast_convert_type(a.astype(jnp.float32), jnp.uint32)
    biased = ((u >> 23) & 0xFF).astype(jnp.int32)
    mant = u & jnp.uint32(0x7FFFFF)
    sub = (31 - lax.clz(mant).astype(jnp.int32)) - 149
    return jnp.where(biased > 0, biased - 127, sub)


def _pow2(k: jax.Array) -> jax.Array:
    """2**k as float32 built from bits (no arithmetic to flush); k clamped to normals."""
    k = jnp.clip(k, -126, 127)
    return lax.bitcast_convert_type(((k + 127).astype(jnp.uint32)) << 23, jnp.float32)


def _opaque(like: jax.Array, divisor) -> jax.Array:
    """`divisor` shaped like `like`, in a form XLA cannot treat as a constant.

    The scales are specified as correctly rounded quotients (`absmax / qmax`),
    but XLA turns a division by a constant into a multiplication by its
    rounded reciprocal, one ulp off for many inputs. `like * 0 + divisor` is
    data-dependent (IEEE forbids folding `x * 0`: x may be inf or NaN, and
    then so is the scale, as it should be), unlike an optimization barrier,
    which `vmap` sees through. Scale arrays hold one value per group, so the
    real division costs nothing.
    """
    return like * jnp.float32(0) + divisor


def _group_absmax(x: jax.Array, scaling: Scaling) -> jax.Array:
    # Scales are treated as constants by autodiff (straight-through): the
    # gradient of decode(encode(x)) is 1, not the sensitivity of the
    # rounding error to the group's absmax.
    x = lax.stop_gradient(x)
    # `initial=0` gives an empty group absmax 0, hence scale 1 like an all-zero group.
    absmax = scaling.group_reduce(
        jnp.abs(x), lambda a, axes: jnp.max(a, axis=axes, keepdims=True, initial=0.0)
    )
    # XLA:CPU's vectorised max (under `jit`, from about 4096 elements) drops
    # NaN, so whether a group holds NaN (or inf) is a reduction of its own: a
    # boolean `any`, which XLA keeps vectorised. (Reading NaN as inf inside the
    # max, or adding a sum of x * 0, stops XLA from vectorising the max: 5-8x
    # slower encodes; this costs about one more pass over x.) Such a group's
    # absmax is NaN, hence its scale.
    poison = scaling.group_reduce(
        ~jnp.isfinite(x), lambda a, axes: jnp.any(a, axis=axes, keepdims=True)
    )
    return jnp.where(poison, jnp.float32(jnp.nan).astype(absmax.dtype), absmax)


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


def _mean_abs(x: jax.Array, scaling: Scaling) -> jax.Array:
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
    absmax = _group_absmax(x, scaling).astype(jnp.float32)
    finite = jnp.isfinite(absmax)
    positive = finite & (absmax > 0)
    k = jnp.minimum(_floor_log2(jnp.where(positive, absmax, jnp.float32(1))), 126)
    terms = jnp.abs(x) * scaling.broadcast(_pow2(-k), x.shape)
    total = scaling.group_reduce(terms, _pairwise_sum)
    counts = group_sizes(scaling, x.shape)
    mean = (total / jnp.maximum(counts, jnp.float32(1))) * _pow2(k)
    # The exact mean never exceeds absmax; this keeps rounding at float32's top finite.
    mean = jnp.minimum(mean, absmax)
    # a mean below the smallest normal would be flushed to zero on CPU
    mean = jnp.where((total > 0) & (mean < TINY), TINY, mean)
    return jnp.where(finite & ~jnp.isnan(total), mean, jnp.float32(jnp.nan))


TINY = np.float32(2.0**-126)  # float32's smallest normal


def flush_subnormals(x: jax.Array) -> jax.Array:
    """`x` with float32 subnormals replaced by (signed) zero, on every backend.

    XLA on CPU reads subnormal inputs of arithmetic as zero, GPUs need not:
    scaled encodings flush them explicitly so every backend gives the same
    codes (the comparison is exact: a subnormal compares below the smallest
    normal whether or not the hardware flushes it).
    """
    # Two comparisons, not abs(x) < TINY: an abs shared with an absmax
    # reduction makes XLA materialize a full-size copy of x.
    return jnp.where((x < TINY) & (x > -TINY), x * jnp.float32(0), x)


def _scales(
    x: jax.Array, fmt: Format, scaling: Scaling, top: float, top_exponent: int
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
    absmax = _group_absmax(x, scaling).astype(jnp.float32)
    absmax = jnp.where(absmax < TINY, jnp.float32(0), absmax)  # NaN stays NaN
    pre = jnp.ones_like(absmax)
    if scaling.power_of_two:
        k = jnp.maximum(_floor_log2(absmax) - top_exponent, -126)
        # for k > 64 the reciprocal 2**-k is taken in two exact steps (2**-64 first)
        big = k > 64
        pre = jnp.where(big, jnp.float32(2.0**-64), pre)
        scale, inv = _pow2(k), _pow2(jnp.where(big, 64 - k, -k))
    else:
        top32 = np.float32(top)
        scale = absmax / _opaque(absmax, top32)
        # Near float32's top, qmax * fl(absmax / qmax) can round past max:
        # take the scale one ulp lower there, so every code decodes finite.
        over = jnp.isinf(scale * top32) & jnp.isfinite(absmax)
        scale = jnp.where(over, jnp.nextafter(scale, jnp.float32(0)), scale)
        # For absmax beyond 2**100 the reciprocal top / absmax would be a
        # subnormal, which XLA on CPU flushes to zero: divide x and absmax by
        # 2**64 first (exact), which gives the very same codes.
        big = absmax > np.float32(2.0**100)
        pre = jnp.where(big, jnp.float32(2.0**-64), pre)
        inv = top32 / (absmax * pre)
        # absmax / top below the smallest normal (the comparison is exact)
        tiny = absmax < np.float32(top) * TINY
        scale = jnp.where(tiny, TINY, scale)
        inv = jnp.where(tiny, jnp.float32(2.0**126), inv)
    zero = absmax == 0
    finite = jnp.isfinite(absmax)
    scale = jnp.where(zero, jnp.float32(1), jnp.where(finite, scale, jnp.float32(jnp.nan)))
    inv = jnp.where(zero | ~finite, jnp.float32(0), inv)
    return scale, inv, pre


def _times_reciprocal(x: jax.Array, scaling: Scaling, inv: jax.Array, pre: jax.Array):
    """x * (top / absmax) per group, as `(x * pre) * inv` (see `_scales`).

    A product below float32's smallest normal is flushed to zero by XLA on
    CPU, which would make `up` round a positive value to code 0 (and `down` a
    negative one). Such a product is replaced by ±2**-126: it has the sign and
    the non-zeroness of the exact product and, like it, lies far below half of
    every scaled format's smallest step, so every rounding mode decides as it
    would on the exact value.
    """
    inv_b = scaling.broadcast(inv, x.shape)
    y = (x * scaling.broadcast(pre, x.shape)) * inv_b
    lost = (y == 0) & (x != 0) & (inv_b > 0)
    return jnp.where(lost, jnp.where(x > 0, TINY, -TINY), y)


def _round_values(fmt: FloatFormat, x: jax.Array, rounding: str, key, *, saturate=None):
    """Round onto fmt's grid in float32/float64 (narrower floats go through float32)."""
    grid = fmt.grid if saturate is None else fmt.grid._replace(saturate=saturate)
    dtype = np.dtype(x.dtype)
    if dtype.itemsize < 4:
        x = x.astype(jnp.float32)
    if fmt.exponent_bits == 11:
        # Every float32/float64 value is on the float64 grid; a saturating
        # float64 format still clamps ±inf, to float64's max (see result_dtype).
        if not grid.saturate:
            return x
        x = x.astype(jnp.float64)
        top = jnp.asarray(np.finfo(np.float64).max, jnp.float64)
        return jnp.where(jnp.isinf(x), jnp.where(x > 0, top, -top), x)
    if fmt.is_full_precision and np.dtype(x.dtype) == np.float32:
        return x  # every float32 value is on the float32 grid
    if (
        rounding == "nearest_even"
        and fmt.exponent_bits == 8
        and grid.has_inf
        and not grid.saturate
        and np.dtype(x.dtype) == np.float32
    ):
        # bfloat16 and tf32 share float32's exponent range, where XLA's
        # reduce_precision gives the same bits as the integer path (checked
        # against ml_dtypes in the tests) and is one fused op. It is not used
        # for narrower exponents: there it flushes the target's subnormals.
        return lax.reduce_precision(x, exponent_bits=8, mantissa_bits=fmt.mantissa_bits)
    return _round_float_ste(grid, rounding, x, key)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _round_float_ste(grid, rounding: str, x, key):
    """`round_float` with derivative 1: integer bit operations have none of their own."""
    return round_float(x, grid, rounding, key)


@_round_float_ste.defjvp
def _round_float_ste_jvp(grid, rounding, primals, tangents):
    x, key = primals
    return round_float(x, grid, rounding, key), tangents[0]


def _resolve_scaling(fmt: Format, scaling: Scaling | None) -> Scaling | None:
    if scaling is None:
        return fmt.default_scaling()
    if not isinstance(scaling, Scaling):
        raise PrecisionTypeError(
            f"scaling must be PerTensor(), PerAxis(axis) or PerBlock(size), got {scaling!r}"
        )
    return scaling


def _validate(fmt: Format, x: jax.Array, scaling: Scaling | None) -> None:
    """Every check that can be made before computing: shapes, and eager values."""
    if scaling is not None and _is_float(fmt) and fmt.emax >= 127:
        raise ScalingError(
            f"{fmt.name} already has float32's exponent range, so scaling cannot help it and "
            f"its scales would be float32 subnormals (flushed to zero by XLA on CPU); encode "
            f"without scaling, or scale into a narrower format such as float8_e4m3fn"
        )
    if scaling is not None and scaling.power_of_two and _is_int(fmt) and fmt.binary:
        raise ScalingError(
            "int1 scales are mean(|x|) per group and have no power-of-two variant; "
            f"pass {type(scaling).__name__} without power_of_two=True"
        )
    _scale_format.check(fmt, scaling)
    if scaling is not None and x.ndim:
        scaling.validate(x.shape)
    if scaling is not None:
        _check_finite(x, fmt)
    elif _is_float(fmt) and fmt.finite and not fmt.nan:
        if not _is_tracer(x) and _any_nan_now(x):
            raise NonFiniteError(
                f"cannot encode NaN into {fmt.name}, which has no NaN code; use a scaled "
                "encoding (the group's scale becomes NaN) or a format with NaN"
            )
    if _is_float(fmt) and fmt.exponent_bits == 11 and not jax.config.read("jax_enable_x64"):
        raise FormatError(
            "encoding into float64 needs 64-bit JAX: set jax.config.update('jax_enable_x64', "
            "True) first, or keep the values in float32"
        )


def check(fmt: Format, x: Any, scaling: Scaling | None) -> None:
    """Raise what `encode` would raise for `x` (shapes, eager values), encoding nothing."""
    x = as_float_array(x)
    _validate(fmt, x, _resolve_scaling(fmt, scaling))


def encode(fmt: Format, x: Any, scaling: Scaling | None, rounding: str, key) -> Encoded:
    check_rounding(rounding, key)
    x = as_float_array(x)
    scaling = _resolve_scaling(fmt, scaling)
    _validate(fmt, x, scaling)
    return _encode_jit(fmt, scaling, rounding, x, key)


# One compiled kernel per (format, scaling, mode, shape): an eager call is a
# single dispatch instead of dozens, and under an outer `jit` it is inlined.
@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _encode_jit(fmt: Format, scaling, rounding: str, x: jax.Array, key) -> Encoded:
    if _is_float(fmt):
        return _encode_float(fmt, x, scaling, rounding, key)
    assert _is_int(fmt)  # the other kinds encode in their own modules
    return _encode_int(fmt, x, scaling, rounding, key)


def _encode_float(fmt: FloatFormat, x, scaling, rounding, key) -> Encoded:
    if scaling is None:
        if rounding == "nearest_even" and fmt.native_dtype is not None and not fmt.saturate:
            # A convert *into* the container is a real rounding (only round
            # trips can be elided), and XLA's matches ml_dtypes bit for bit.
            return Encoded(x.astype(fmt.container), None, fmt, None)
        if rounding == "nearest_even" and fmt.container == np.uint8:
            codes = _float_codes.nearest_codes(fmt, x)
            if codes is not None:
                return (
                    _pack(codes, None, fmt, None) if fmt.packed else Encoded(codes, None, fmt, None)
                )
        return _store_float(fmt, _round_values(fmt, x, rounding, key), None, None)
    x = x.astype(jnp.float32)
    scale, inv, pre = _scales(x, fmt, scaling, fmt.max, fmt.emax)
    # scales as stored in the scaling's scale format (float32, E8M0, e4m3 + tensor scale…)
    scale, tensor_scale, inv, pre = _scale_format.narrow(
        flush_subnormals(x), scaling, scale, inv, pre, fmt.max, 0
    )
    y = _times_reciprocal(flush_subnormals(x), scaling, inv, pre)
    # The scale is chosen so values fit; saturating keeps float fuzz at the
    # top of a group (and OCP's power-of-two overshoot) from becoming inf/NaN.
    native = fmt.native_dtype
    if rounding == "nearest_even" and native is not None and native.itemsize == 1:
        # fp8: XLA's convert into the container rounds to nearest-even exactly as
        # the bit rounding does (subnormals included; checked against it in the
        # tests), and the clip is the saturation: one fused op instead of dozens.
        top = np.float32(fmt.max)
        enc = Encoded(jnp.clip(y, -top, top).astype(native), scale, fmt, scaling)
        enc.tensor_scale = tensor_scale
        return enc
    enc = _store_float(fmt, _round_values(fmt, y, rounding, key, saturate=True), scale, scaling)
    enc.tensor_scale = tensor_scale
    return enc


def _store_float(fmt: FloatFormat, values: jax.Array, scale, scaling) -> Encoded:
    """Put on-grid float values into the format's container (codes if no native type)."""
    if fmt.container != np.uint8:
        return Encoded(values.astype(fmt.container), scale, fmt, scaling)
    codes = _float_codes.to_codes(fmt, values)
    if not fmt.packed:
        return Encoded(codes, scale, fmt, scaling)
    return _pack(codes, scale, fmt, scaling)


def _pack(codes: jax.Array, scale, fmt: Format, scaling) -> Encoded:
    if codes.ndim == 0:
        return Encoded(_packing.pack(codes.reshape(1), fmt.code_bits), scale, fmt, scaling, None)
    return Encoded(_packing.pack(codes, fmt.code_bits), scale, fmt, scaling, codes.shape[-1])


def _int_codes(fmt: IntFormat, x: jax.Array, scaling: Scaling, rounding: str, key):
    """(codes as float32, stored scale, reciprocal, unclipped rounded codes, tensor scale)."""
    if fmt.binary:
        x = flush_subnormals(x)
        # A group holding NaN or ±inf gets a NaN scale, like every scale.
        scale = _mean_abs(x, scaling)
        # sign(x) with 0 mapping to +1; NaN input gives a NaN scale above.
        codes = jnp.where(x >= 0, jnp.float32(1), jnp.float32(-1))
        scale, _, _, _ = _scale_format.narrow(x, scaling, scale, scale, scale, 1.0, 0)
        return codes, scale, None, codes, None
    top_exponent = math.floor(math.log2(fmt.qmax))
    scale, inv, pre = _scales(x, fmt, scaling, fmt.qmax, top_exponent)
    scale, tensor_scale, inv, pre = _scale_format.narrow(
        flush_subnormals(x), scaling, scale, inv, pre, fmt.qmax, top_exponent
    )
    y = _times_reciprocal(flush_subnormals(x), scaling, inv, pre)
    rounded = round_integer(y, rounding, key)
    codes = jnp.clip(rounded, -fmt.qmax, fmt.qmax)
    return codes, scale, inv, rounded, tensor_scale


def _encode_int(fmt: IntFormat, x, scaling: Scaling, rounding, key) -> Encoded:
    scalar = x.ndim == 0
    if scalar:
        x = x.reshape(1)
    x = x.astype(jnp.float32)
    codes, scale, _, _, tensor_scale = _int_codes(fmt, x, scaling, rounding, key)
    codes = codes.astype(jnp.int8)
    if scalar:
        scale = scale.reshape(())
    if scalar:
        codes = codes.reshape(())
    if not fmt.packed:
        return Encoded(codes, scale, fmt, scaling, tensor_scale=tensor_scale)
    enc = _pack(codes, scale, fmt, scaling)
    enc.tensor_scale = tensor_scale
    return enc


def _codes(fmt: Format, enc: Encoded) -> jax.Array:
    """Codes (int formats) or values (float formats) of `enc`, unpacked, logical shape."""
    data = enc.data
    if fmt.packed:
        n = enc.shape[-1] if enc.shape else 1
        data = _packing.unpack(data, fmt.code_bits, n, signed=fmt.kind == "int")
        data = data.reshape(enc.shape)
    if _is_float(fmt) and fmt.container == np.uint8:
        return _float_codes.from_codes(fmt, data)
    return data


def decode(fmt: Format, enc: Encoded, dtype: Any = np.float32) -> jax.Array:
    if not isinstance(enc, Encoded):
        raise PrecisionTypeError(
            f"decode expects an Encoded, got {type(enc).__name__}; build one with "
            f"{fmt.name}.encode(x)"
        )
    if enc.format != fmt:
        raise FormatError(
            f"cannot decode a {enc.format.name} encoding as {fmt.name}; "
            f"call enc.decode() or {enc.format.name}.decode(enc)"
        )
    if np.dtype(enc.data.dtype) != fmt.container:
        raise PrecisionTypeError(
            f"a {fmt.name} encoding holds {fmt.container} data, got {enc.data.dtype}; "
            f"build it with {fmt.name}.encode(x)"
        )
    return _decode_jit(fmt, enc, jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnums=(0, 2))
def _decode_jit(fmt: Format, enc: Encoded, dtype) -> jax.Array:
    codes = _codes(fmt, enc)
    if enc.scale is None:
        return codes.astype(dtype)
    assert enc.scaling is not None  # a scale comes with its scaling
    shape = enc.shape
    scale = _scale_format.widen(enc.scale, enc.tensor_scale, enc.scaling, _scale_format.offset(fmt))
    scale = scale if shape else scale.reshape(())
    if shape:
        scale = enc.scaling.broadcast(scale, shape)
    return (codes.astype(jnp.float32) * scale).astype(dtype)


def _qdq(fmt: Format, scaling, rounding: str, x: jax.Array, key):
    """(quantize-dequantized x in `result_dtype`, straight-through gradient mask)."""
    dtype = result_dtype(fmt, np.dtype(x.dtype), scaling)
    if _is_float(fmt) and scaling is None:
        y = _round_values(fmt, x, rounding, key).astype(dtype)
        xw = x.astype(jnp.float32) if np.dtype(x.dtype).itemsize < 4 else x
        if fmt.max <= float(np.finfo(xw.dtype).max):
            mask = jnp.abs(xw) <= fmt.max
        else:  # every finite input is in range (float64 formats)
            mask = jnp.isfinite(xw)
        return y, mask
    if scaling is None:
        scaling = fmt.default_scaling()
    scalar = x.ndim == 0
    xf = (x.reshape(1) if scalar else x).astype(jnp.float32)
    if _is_float(fmt):
        scale, inv, pre = _scales(xf, fmt, scaling, fmt.max, fmt.emax)
        stored, tensor_scale, inv, pre = _scale_format.narrow(
            flush_subnormals(xf), scaling, scale, inv, pre, fmt.max, 0
        )
        scale = _scale_format.widen(stored, tensor_scale, scaling, 0)
        y = _times_reciprocal(flush_subnormals(xf), scaling, inv, pre)
        q = _round_values(fmt, y, rounding, key, saturate=True)
        out = q * scaling.broadcast(scale, xf.shape)
        mask = (jnp.abs(y) <= fmt.max) if scaling.power_of_two else jnp.ones(xf.shape, bool)
    else:
        assert _is_int(fmt)  # the other kinds quantize in their own modules
        codes, stored, _, rounded, tensor_scale = _int_codes(fmt, xf, scaling, rounding, key)
        scale = _scale_format.widen(stored, tensor_scale, scaling, _scale_format.offset(fmt))
        out = codes * scaling.broadcast(scale, xf.shape)
        if scaling.power_of_two and not fmt.binary:
            # Only power-of-two scales can push a code out of range: those
            # elements were clipped and pass no gradient (clipped STE).
            mask = jnp.abs(jnp.round(rounded)) <= fmt.qmax
        else:
            mask = jnp.ones(xf.shape, bool)
    if scalar:
        out, mask = out.reshape(()), mask.reshape(())
    return out.astype(dtype), mask


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2))
def _fake_quantize(fmt, scaling, rounding, x, key):
    return _qdq(fmt, scaling, rounding, x, key)[0]


@_fake_quantize.defjvp
def _fake_quantize_jvp(fmt, scaling, rounding, primals, tangents):
    x, key = primals
    tx = tangents[0]
    y, mask = _qdq(fmt, scaling, rounding, x, key)
    return y, jnp.where(mask, tx, jnp.zeros_like(tx)).astype(y.dtype)


_fake_quantize_jit = jax.jit(_fake_quantize, static_argnums=(0, 1, 2))


def fake_quantize(fmt: Format, x: Any, scaling: Scaling | None, rounding: str, key) -> jax.Array:
    check_rounding(rounding, key)
    x = as_float_array(x)
    scaling = _resolve_scaling(fmt, scaling)
    _validate(fmt, x, scaling)
    return _fake_quantize_jit(fmt, scaling, rounding, x, key)


def _params_of_dtype(dtype: np.dtype) -> tuple[int, int, float, bool, bool]:
    fi = ml_dtypes.finfo(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        specials = np.array([np.inf, np.nan], np.float32).astype(dtype).astype(np.float32)
    return (
        int(fi.nmant),
        int(fi.minexp),
        float(fi.max),
        bool(np.isinf(specials[0])),
        bool(np.isnan(specials[1])),
    )


def _holds(outer: tuple, inner: tuple) -> bool:
    """Whether every value (finite, inf, NaN) of the `inner` grid is one of `outer`'s."""
    m_o, emin_o, max_o, inf_o, nan_o = outer
    m_i, emin_i, max_i, inf_i, nan_i = inner
    return (
        m_o >= m_i
        and emin_o - m_o <= emin_i - m_i  # smallest subnormals
        and max_o >= max_i
        and (inf_o or not inf_i)
        and (nan_o or not nan_i)
    )


def result_dtype(fmt: Format, dtype: np.dtype, scaling: Scaling | None) -> np.dtype:
    """The dtype `fmt.round` returns for `dtype` input (see `Format.round`).

    `dtype` itself when it holds every value the rounding can produce: then
    casting the result to it is exact. Otherwise float32 (float64 for float64
    input or a float64 format): a narrow input dtype would round the result a
    second time (float16 input 65504 rounded onto bfloat16 is 65536, which
    float16 holds only as inf).
    """
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return dtype
    if not _is_float(fmt) or scaling is not None or fmt.default_scaling() is not None:
        # values are float32 codes times float32 scales
        return dtype if dtype == np.float32 else np.dtype(np.float32)
    wide = np.dtype(np.float64 if fmt.exponent_bits == 11 else np.float32)
    d = _params_of_dtype(dtype)
    f = (fmt.mantissa_bits, fmt.emin, fmt.max, fmt.has_inf, bool(fmt.nan))
    if _holds(d, f):
        return dtype
    if _holds((*f[:3], True, True), (*d[:3], False, False)):
        # The format holds every finite value of `dtype`: rounding is the
        # identity on them, and only ±inf can leave `dtype` (a saturating or
        # inf-less format without NaN puts its own max there).
        if not d[3] or (fmt.has_inf and not fmt.saturate) or (fmt.nan and not fmt.saturate):
            return dtype
        return dtype if fmt.max <= d[2] else wide
    return wide


def _shape_of(shape: Any) -> tuple[int, ...]:
    """`shape` as a tuple of Python ints, or a `ShapeError` saying what is wrong."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise ShapeError(
            f"a shape is a tuple of non-negative ints, got {type(shape).__name__} {shape!r}"
        ) from None
    for d in dims:
        if isinstance(d, bool | np.bool_) or not isinstance(d, numbers.Integral) or d < 0:
            raise ShapeError(
                f"a shape is a tuple of non-negative ints, got {dims!r} (the dimension {d!r} "
                "is not); pass e.g. (1024, 1024)"
            )
    return tuple(int(d) for d in dims)


def nbytes(fmt: Format, shape: tuple[int, ...], scaling: Scaling | None) -> int:
    # Python ints throughout: a numpy int64 product wraps past 2**63.
    shape = _shape_of(shape)
    if scaling is None:
        scaling = fmt.default_scaling()
    if fmt.packed:
        lead = math.prod(shape[:-1]) if shape else 1
        last = shape[-1] if shape else 1
        data = lead * _packing.packed_length(last, fmt.code_bits)
    else:
        data = math.prod(shape) * fmt.container.itemsize
    if scaling is None:
        return data
    return data + _scale_format.scale_nbytes(scaling, shape)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2))
def storage_round(fmt: Format, scaling: Scaling | None, rounding: str, x: jax.Array, key):
    """`fmt.decode(fmt.encode(x))` with the straight-through derivative.

    Code books, asymmetric integers and E8M0 hold codes that carry no gradient
    of their own; without this rule `round` would pass a zero gradient silently.
    """
    enc = fmt.encode(x, scaling=scaling, rounding=rounding, key=key)
    return fmt.decode(enc, np.float32)


@storage_round.defjvp
def _storage_round_jvp(fmt, scaling, rounding, primals, tangents):
    x, key = primals
    y = storage_round(fmt, scaling, rounding, x, key)
    return y, tangents[0].astype(y.dtype)
