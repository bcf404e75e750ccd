"""encode / decode / quantize-dequantize for every format, in pure jnp.

Everything here runs eagerly and under `jit`, `vmap` and `grad`. The only
host-side work is the eager check that a scaled encoding gets finite input.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _float_codes, _packing
from ._encoded import Encoded
from ._rounding import check_rounding, round_float, round_integer
from ._scaling import Scaling, group_sizes

if TYPE_CHECKING:
    from ._formats import FloatFormat, Format, IntFormat

__all__ = ["as_float_array", "decode", "encode", "fake_quantize", "nbytes"]


def as_float_array(x: Any) -> jax.Array:
    """`x` as a floating jax array; integers and bools become float32."""
    if isinstance(x, jax.Array):
        arr = x
    else:
        arr = np.asarray(x)
    dtype = np.dtype(arr.dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        raise TypeError(
            f"cannot encode complex values (dtype {dtype}); encode the real and imaginary "
            "parts separately (jnp.real(x), jnp.imag(x))"
        )
    if jnp.issubdtype(dtype, jnp.floating):  # ml_dtypes floats included
        return jnp.asarray(arr)
    if jnp.issubdtype(dtype, jnp.integer) or dtype == np.bool_:
        return jnp.asarray(arr, jnp.float32)
    raise TypeError(
        f"cannot encode an array of dtype {dtype} (from {type(x).__name__}); "
        "pass numbers: a float, int or bool array"
    )


def _is_tracer(x) -> bool:
    return isinstance(x, jax.core.Tracer)


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
    raise ValueError(
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
    return scaling.group_reduce(
        jnp.abs(x), lambda a, axes: jnp.max(a, axis=axes, keepdims=True, initial=0.0)
    )


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
    """x * (top / absmax) per group, as `(x * pre) * inv` (see `_scales`)."""
    return (x * scaling.broadcast(pre, x.shape)) * scaling.broadcast(inv, x.shape)


def _round_values(fmt: FloatFormat, x: jax.Array, rounding: str, key, *, saturate=None):
    """Round onto fmt's grid in float32/float64 (narrower floats go through float32)."""
    grid = fmt.grid if saturate is None else fmt.grid._replace(saturate=saturate)
    dtype = np.dtype(x.dtype)
    if dtype.itemsize < 4:
        x = x.astype(jnp.float32)
    if fmt.exponent_bits == 11 or (fmt.is_full_precision and np.dtype(x.dtype) == np.float32):
        return x  # every float32 value is on the float32 and float64 grids
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
        raise TypeError(
            f"scaling must be PerTensor(), PerAxis(axis) or PerBlock(size), got {scaling!r}"
        )
    return scaling


def _validate(fmt: Format, x: jax.Array, scaling: Scaling | None) -> None:
    """Every check that can be made before computing: shapes, and eager values."""
    if scaling is not None and fmt.kind == "float" and fmt.emax >= 127:
        raise ValueError(
            f"{fmt.name} already has float32's exponent range, so scaling cannot help it and "
            f"its scales would be float32 subnormals (flushed to zero by XLA on CPU); encode "
            f"without scaling, or scale into a narrower format such as float8_e4m3fn"
        )
    if scaling is not None and scaling.power_of_two and fmt.kind == "int" and fmt.binary:
        raise ValueError(
            "int1 scales are mean(|x|) per group and have no power-of-two variant; "
            f"pass {type(scaling).__name__} without power_of_two=True"
        )
    if scaling is not None and x.ndim:
        scaling.validate(x.shape)
    if scaling is not None:
        _check_finite(x, fmt)
    elif fmt.kind == "float" and fmt.finite and not fmt.nan:
        if not _is_tracer(x) and _any_nan_now(x):
            raise ValueError(
                f"cannot encode NaN into {fmt.name}, which has no NaN code; use a scaled "
                "encoding (the group's scale becomes NaN) or a format with NaN"
            )
    if fmt.kind == "float" and fmt.exponent_bits == 11 and not jax.config.read("jax_enable_x64"):
        raise ValueError(
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
    if fmt.kind == "float":
        return _encode_float(fmt, x, scaling, rounding, key)
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
    y = _times_reciprocal(flush_subnormals(x), scaling, inv, pre)
    # The scale is chosen so values fit; saturating keeps float fuzz at the
    # top of a group (and OCP's power-of-two overshoot) from becoming inf/NaN.
    return _store_float(fmt, _round_values(fmt, y, rounding, key, saturate=True), scale, scaling)


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
    """(codes as float32, scale, reciprocal, unclipped rounded codes)."""
    if fmt.binary:
        x = flush_subnormals(x)
        total = scaling.group_reduce(
            jnp.abs(lax.stop_gradient(x)), lambda a, axes: jnp.sum(a, axis=axes, keepdims=True)
        )
        scale = total / _opaque(total, group_sizes(scaling, x.shape))
        # a mean below the smallest normal would be flushed to zero on CPU
        scale = jnp.where((total > 0) & (scale < TINY), TINY, scale)
        # A group holding ±inf has an infinite mean: make it NaN like every scale.
        scale = jnp.where(jnp.isfinite(scale), scale, jnp.float32(jnp.nan))
        # sign(x) with 0 mapping to +1; NaN input gives a NaN scale above.
        codes = jnp.where(x >= 0, jnp.float32(1), jnp.float32(-1))
        return codes, scale, None, codes
    top_exponent = math.floor(math.log2(fmt.qmax))
    scale, inv, pre = _scales(x, fmt, scaling, fmt.qmax, top_exponent)
    y = _times_reciprocal(flush_subnormals(x), scaling, inv, pre)
    rounded = round_integer(y, rounding, key)
    codes = jnp.clip(rounded, -fmt.qmax, fmt.qmax)
    return codes, scale, inv, rounded


def _encode_int(fmt: IntFormat, x, scaling: Scaling, rounding, key) -> Encoded:
    scalar = x.ndim == 0
    if scalar:
        x = x.reshape(1)
    x = x.astype(jnp.float32)
    codes, scale, _, _ = _int_codes(fmt, x, scaling, rounding, key)
    codes = codes.astype(jnp.int8)
    if scalar:
        scale = scale.reshape(())
    if scalar:
        codes = codes.reshape(())
    if not fmt.packed:
        return Encoded(codes, scale, fmt, scaling)
    return _pack(codes, scale, fmt, scaling)


def _codes(fmt: Format, enc: Encoded) -> jax.Array:
    """Codes (int formats) or values (float formats) of `enc`, unpacked, logical shape."""
    data = enc.data
    if fmt.packed:
        n = enc.shape[-1] if enc.shape else 1
        data = _packing.unpack(data, fmt.code_bits, n, signed=fmt.kind == "int")
        data = data.reshape(enc.shape)
    if fmt.kind == "float" and fmt.container == np.uint8:
        return _float_codes.from_codes(fmt, data)
    return data


def decode(fmt: Format, enc: Encoded, dtype: Any = np.float32) -> jax.Array:
    if not isinstance(enc, Encoded):
        raise TypeError(f"decode expects an Encoded, got {type(enc).__name__}")
    if enc.format != fmt:
        raise ValueError(
            f"cannot decode a {enc.format.name} encoding as {fmt.name}; "
            f"call enc.decode() or {enc.format.name}.decode(enc)"
        )
    if np.dtype(enc.data.dtype) != fmt.container:
        raise TypeError(
            f"a {fmt.name} encoding holds {fmt.container} data, got {enc.data.dtype}; "
            f"build it with {fmt.name}.encode(x)"
        )
    return _decode_jit(fmt, enc, jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnums=(0, 2))
def _decode_jit(fmt: Format, enc: Encoded, dtype) -> jax.Array:
    codes = _codes(fmt, enc)
    if enc.scale is None:
        return codes.astype(dtype)
    shape = enc.shape
    scale = enc.scale if shape else enc.scale.reshape(())
    if shape:
        scale = enc.scaling.broadcast(scale, shape)
    return (codes.astype(jnp.float32) * scale).astype(dtype)


def _qdq(fmt: Format, scaling, rounding: str, x: jax.Array, key):
    """(quantize-dequantized x in x's dtype, straight-through gradient mask)."""
    dtype = x.dtype
    if fmt.kind == "float" and scaling is None:
        y = _round_values(fmt, x, rounding, key).astype(dtype)
        mask = jnp.abs(x) <= fmt.max
        return y, mask
    if scaling is None:
        scaling = fmt.default_scaling()
    scalar = x.ndim == 0
    xf = (x.reshape(1) if scalar else x).astype(jnp.float32)
    if fmt.kind == "float":
        scale, inv, pre = _scales(xf, fmt, scaling, fmt.max, fmt.emax)
        y = _times_reciprocal(flush_subnormals(xf), scaling, inv, pre)
        q = _round_values(fmt, y, rounding, key, saturate=True)
        out = q * scaling.broadcast(scale, xf.shape)
        mask = (jnp.abs(y) <= fmt.max) if scaling.power_of_two else jnp.ones(xf.shape, bool)
    else:
        codes, scale, _, rounded = _int_codes(fmt, xf, scaling, rounding, key)
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
    return y, jnp.where(mask, tx, jnp.zeros_like(tx))


_fake_quantize_jit = jax.jit(_fake_quantize, static_argnums=(0, 1, 2))


def fake_quantize(fmt: Format, x: Any, scaling: Scaling | None, rounding: str, key) -> jax.Array:
    check_rounding(rounding, key)
    x = as_float_array(x)
    scaling = _resolve_scaling(fmt, scaling)
    _validate(fmt, x, scaling)
    return _fake_quantize_jit(fmt, scaling, rounding, x, key)


def nbytes(fmt: Format, shape: tuple[int, ...], scaling: Scaling | None) -> int:
    if scaling is None:
        scaling = fmt.default_scaling()
    if fmt.packed:
        lead = int(np.prod(shape[:-1], dtype=np.int64)) if shape else 1
        last = shape[-1] if shape else 1
        data = lead * _packing.packed_length(last, fmt.code_bits)
    else:
        data = int(np.prod(shape, dtype=np.int64)) * fmt.container.itemsize
    if scaling is None:
        return data
    scale_shape = scaling.scale_shape(shape) if shape else ()
    return data + 4 * int(np.prod(scale_shape, dtype=np.int64))
