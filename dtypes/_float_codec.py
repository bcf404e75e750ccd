"""encode / decode / round / check of `FloatFormat`s, in pure jnp.

Everything here runs eagerly and under `jit`, `vmap` and `grad`. The only
host-side work is validation: the eager check that a scaled encoding gets
finite input, and that a format without NaN gets no NaN. `Format`'s methods
import this module on first use.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from . import _codec, _custom_float_bits, _scale_storage
from ._bit_rounding import Grid, round_float
from ._encode_input_checks import (
    as_float_array,
    check_finite,
    is_tracer,
    resolve_scaling,
    special_values_now,
)
from ._encoded import Encoded
from ._errors import FormatError, NonFiniteError, ScalingError
from ._ieee import converted_on_cpu, from_float32, times_scale
from ._scale_rules import scales, times_reciprocal
from ._scaling import Scaling

if TYPE_CHECKING:
    from ._float import FloatFormat

__all__ = ["check", "decode", "encode", "round", "round_values"]


def round_values(
    fmt: FloatFormat, x: jax.Array, rounding: str, key: Any, *, saturate: bool | None = None
) -> jax.Array:
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
    if (
        rounding == "nearest_even"
        and grid.has_inf
        and not grid.saturate
        and fmt.exponent_bits < 8
        and np.dtype(x.dtype) == np.float32
    ):
        if grid == _FLOAT16_GRID:
            rounded: jax.Array = lax.platform_dependent(
                x, cpu=_round_float16_cpu, default=functools.partial(_round_ieee_nearest, grid)
            )
            return rounded
        return _round_ieee_nearest(grid, x)
    return _round_float_ste(grid, rounding, x, key)


_FLOAT16_GRID = Grid(10, -14, 65504.0, True, True, False)


def _round_float16_cpu(x: jax.Array) -> jax.Array:
    """`_round_ieee_nearest` onto float16's grid as XLA:CPU computes it fastest: its
    conversion of |x| into float16 (the same conversion every encode into float16 makes)
    and back, NaN written on the bits (float32's quiet NaN, sign kept, as the bit
    rounding writes it), so flags that assume no NaN change nothing. Between the two
    conversions the half gets x's sign bit with an integer OR, which no simplifier can
    read as a no-op: XLA, which deletes a bare round trip where excess precision is
    allowed, and LLVM under the fast-math flags (which saw through a select between
    two conversions on an AVX2 processor) see none to delete. The widening is
    exact: every half, subnormals included, is a normal float32. Subnormal float32
    inputs, which the CPU reads as zeros, lie far below float16's smallest subnormal and
    round to zeros of their sign either way. `tests/dtypes/test_backend_forms.py`
    compares the two forms; the fast-math bit-identity test runs this one."""
    u = lax.bitcast_convert_type(x, jnp.uint32)
    mag = u & jnp.uint32(0x7FFFFFFF)
    a = lax.bitcast_convert_type(mag, jnp.float32)  # |x|: the half has no sign bit
    sign = ((u >> 16) & jnp.uint32(0x8000)).astype(jnp.uint16)
    half = lax.bitcast_convert_type(a.astype(jnp.float16), jnp.uint16) | sign
    wide = lax.bitcast_convert_type(
        lax.bitcast_convert_type(half, jnp.float16).astype(jnp.float32), jnp.uint32
    )
    nan = (u & jnp.uint32(0x80000000)) | jnp.uint32(0x7FC00000)
    out: jax.Array = lax.bitcast_convert_type(
        jnp.where(mag > jnp.uint32(0x7F800000), nan, wide), jnp.float32
    )
    return out


def _round_ieee_nearest(grid: Grid, x: jax.Array) -> jax.Array:
    """Nearest-even rounding of float32 onto an IEEE-style grid narrower than float32's
    exponent range (float16, float8_e5m2), the same bits as the bit rounding.

    `reduce_precision` rounds the target's normal range in one fused op (overflow to
    inf included) but flushes its subnormals; below the target's smallest normal the
    grid is the multiples of its smallest subnormal `s`, where `round(|x| / s) * s` is
    exact in float32 (both products are by powers of two, between normal floats; a
    float32 subnormal reads as zero either way). The sign is put back on the bits and
    NaN written as the bit rounding writes it (float32's quiet NaN, sign kept), so
    flags that ignore signed zeros or assume no NaN change nothing.
    """
    u = lax.bitcast_convert_type(x, jnp.uint32)
    sign = u & jnp.uint32(0x80000000)
    mag = u & jnp.uint32(0x7FFFFFFF)
    tiny = 2.0**grid.emin  # the smallest normal
    step = np.float32(tiny * 2.0**-grid.mantissa_bits)  # the smallest subnormal
    small = mag < jnp.uint32(np.float32(tiny).view(np.uint32))
    a = lax.bitcast_convert_type(mag, jnp.float32)
    sub = jnp.round(a * np.float32(1 / step)) * step
    exponent_bits = (1 - grid.emin).bit_length() + 1  # emin = 2 - 2**(exponent_bits - 1)
    normal = lax.reduce_precision(x, exponent_bits=exponent_bits, mantissa_bits=grid.mantissa_bits)
    bits = jnp.where(small, lax.bitcast_convert_type(sub, jnp.uint32) | sign, _bits_of(normal))
    bits = jnp.where(mag > jnp.uint32(0x7F800000), sign | jnp.uint32(0x7FC00000), bits)
    out: jax.Array = lax.bitcast_convert_type(bits, jnp.float32)
    return out


def _bits_of(x: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(x, jnp.uint32)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _round_float_ste(grid: Grid, rounding: str, x: jax.Array, key: Any) -> jax.Array:
    """`round_float` with derivative 1: integer bit operations have none of their own."""
    return round_float(x, grid, rounding, key)


@_round_float_ste.defjvp
def _round_float_ste_jvp(
    grid: Grid, rounding: str, primals: Any, tangents: Any
) -> tuple[jax.Array, jax.Array]:
    x, key = primals
    return round_float(x, grid, rounding, key), tangents[0]


def _validate(
    fmt: FloatFormat,
    x: jax.Array,
    scaling: Scaling | None,
    *,
    storing: bool = True,
    values: bool = True,
) -> None:
    """Every check that can be made before computing: shapes, and eager values.

    An unscaled format with neither NaN nor inf refuses NaN; storing into it
    (`encode`, `check`) refuses ±inf too, which would become ±max silently;
    `round`, an emulation, keeps snapping ±inf to ±max. `values=False` leaves
    the values to the caller (`encode` finds them in its own kernel).
    """
    if scaling is not None and fmt.emax >= 127:
        raise ScalingError(
            f"{fmt.name} already has float32's exponent range, so scaling cannot help it and "
            f"its scales would be float32 subnormals (flushed to zero by XLA on CPU); encode "
            f"without scaling, or scale into a narrower format such as float8_e4m3fn"
        )
    if scaling is not None and x.ndim:
        scaling.validate(x.shape)
    if scaling is not None and values:
        check_finite(x, fmt)
    elif _refuses_special(fmt, scaling) and values and not is_tracer(x):
        _refuse_special(fmt, *special_values_now(x), storing=storing)  # one pass for both

    if fmt.exponent_bits == 11 and not jax.config.read("jax_enable_x64"):
        raise FormatError(
            "encoding into float64 needs 64-bit JAX: set jax.config.update('jax_enable_x64', "
            "True) first, or keep the values in float32"
        )


def _refuses_special(fmt: FloatFormat, scaling: Scaling | None) -> bool:
    """Whether unscaled input must be searched for NaN and inf: a format without NaN."""
    return scaling is None and fmt.finite and not fmt.nan


def _refuse_special(fmt: FloatFormat, has_nan: bool, has_inf: bool, *, storing: bool) -> None:
    if has_nan:
        raise NonFiniteError(
            f"cannot encode NaN into {fmt.name}, which has no NaN code; use a scaled "
            "encoding (the group's scale becomes NaN) or a format with NaN"
        )
    if has_inf and storing and not fmt.saturate:
        raise NonFiniteError(
            f"cannot encode inf into {fmt.name}, which has neither inf nor NaN (it would "
            f"become ±{fmt.max:g} silently); build the format with saturate=True to clamp, "
            "or use a scaled encoding"
        )


def check(fmt: FloatFormat, x: Any, scaling: Scaling | None) -> None:
    """Raise what `encode` would raise for `x` (shapes, eager values), encoding nothing."""
    x = as_float_array(x)
    resolved = resolve_scaling(fmt, scaling)
    _validate(fmt, x, resolved)


def encode(fmt: FloatFormat, x: Any, scaling: Scaling | None, rounding: str, key: Any) -> Encoded:
    """`fmt.encode(x, ...)`: validated, then one compiled kernel.

    An eager call searches its input for NaN and inf in the kernel that encodes
    it, not in a pass of its own: a scaled encoding's scales say it (a group
    holding NaN or inf has a NaN scale), and on an accelerator a format without
    NaN gets the answer as an extra output (on a CPU numpy reads the input in
    place faster); only then is `x` searched again, for the message.
    """
    x = as_float_array(x)
    scaling = resolve_scaling(fmt, scaling)
    # (float64 input is checked on the host first: a finite value past float32's
    # range is refused there, before its scale could become inf)
    in_kernel = not is_tracer(x) and x.dtype != np.float64
    _validate(fmt, x, scaling, values=not in_kernel)
    encoded: Encoded
    if in_kernel and _refuses_special(fmt, scaling):
        if not _flags_in_kernel(x):
            _refuse_special(fmt, *special_values_now(x), storing=True)
            encoded = _encode_jit(fmt, scaling, rounding, x, key)
            return encoded
        encoded, top_bits = _encode_flagged_jit(fmt, scaling, rounding, x, key)
        top = int(top_bits)
        _refuse_special(fmt, top > 0x7F800000, top == 0x7F800000, storing=True)
        return encoded
    encoded = _encode_jit(fmt, scaling, rounding, x, key)
    if in_kernel and scaling is not None and _has_nan_scale(encoded):
        check_finite(x, fmt)  # raises, naming the values and where the first is
    return encoded


def _has_nan_scale(encoded: Encoded) -> bool:
    return any(
        s is not None and special_values_now(s)[0] for s in (encoded.scale, encoded.tensor_scale)
    )


def _flags_in_kernel(x: jax.Array) -> bool:
    """Whether an eager encode searches `x` for NaN and inf in its own kernel: off a
    CPU (XLA:CPU does not vectorise the integer max; numpy reads host memory faster)."""
    return not all(d.platform == "cpu" for d in x.devices())


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _encode_flagged_jit(
    fmt: FloatFormat, scaling: Scaling | None, rounding: str, x: jax.Array, key: Any
) -> tuple[Encoded, jax.Array]:
    """`_encode_jit`, and the largest magnitude bits of `x`, from one read of `x`:
    above 0x7F800000 it holds NaN, equal to it ±inf and no NaN."""
    mag = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32) & jnp.uint32(0x7FFFFFFF)
    top = jnp.max(mag, initial=jnp.uint32(0))
    return _encode_jit(fmt, scaling, rounding, x, key), top


# One compiled kernel per (format, scaling, mode, shape): an eager call is a
# single dispatch instead of dozens, and under an outer `jit` it is inlined.
@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _encode_jit(
    fmt: FloatFormat, scaling: Scaling | None, rounding: str, x: jax.Array, key: Any
) -> Encoded:
    if scaling is None:
        if rounding == "nearest_even" and fmt.native_dtype is not None and not fmt.saturate:
            # A convert *into* the container is a real rounding (only round
            # trips can be elided), and XLA's matches ml_dtypes bit for bit;
            # NaN and inf are written as bits, with their sign (`_ieee`).
            if x.dtype != jnp.float32:
                return Encoded(x.astype(fmt.container), None, fmt, None)
            return Encoded(from_float32(x, fmt.container), None, fmt, None)
        if rounding == "nearest_even" and fmt.container == np.uint8:
            codes = _custom_float_bits.nearest_codes(fmt, x)
            if codes is not None:
                return (
                    _codec.pack_encoded(codes, None, fmt, None)
                    if fmt.packed
                    else Encoded(codes, None, fmt, None)
                )
        return _store(fmt, round_values(fmt, x, rounding, key), None, None)
    # a 0-d value is one group of one (as the integer encodings take it)
    scalar = x.ndim == 0
    x = (x.reshape(1) if scalar else x).astype(jnp.float32)
    scale, inv, pre, _ = scales(x, scaling, fmt.max, fmt.emax)
    # scales as stored in the scaling's scale format (float32, E8M0, e4m3 + tensor scale…)
    scale, tensor_scale, inv, pre = _scale_storage.narrow(x, scaling, scale, inv, pre, fmt.max, 0)
    if scalar:
        scale = scale.reshape(())
    native = fmt.native_dtype
    if rounding == "nearest_even" and native is not None and native.itemsize == 1:
        codes = _byte_codes(fmt, native, scaling, x, inv, pre)
        enc = Encoded(codes.reshape(()) if scalar else codes, scale, fmt, scaling)
        enc.tensor_scale = tensor_scale
        return enc
    y = times_reciprocal(x, scaling, inv, pre, rounding=rounding)
    if scalar:
        y = y.reshape(())
    # The scale is chosen so values fit; saturating keeps float fuzz at the
    # top of a group (and OCP's power-of-two overshoot) from becoming inf/NaN.
    enc = _store(fmt, round_values(fmt, y, rounding, key, saturate=True), scale, scaling)
    enc.tensor_scale = tensor_scale
    return enc


def _byte_codes(
    fmt: FloatFormat,
    native: Any,
    scaling: Scaling,
    x: jax.Array,
    inv: jax.Array,
    pre: jax.Array | None,
) -> jax.Array:
    """fp8 codes of float32 `x` times its group's reciprocal, nearest-even, saturating.

    XLA's convert into the container rounds to nearest-even exactly as the bit
    rounding does (subnormals included; checked against it in the tests), and a clip
    at the format's largest value is the saturation. The exact form, every backend's
    but XLA:CPU's, makes NaN and inf elements +0 and flushes subnormals on the bits
    first (`times_reciprocal`), so the product is finite and the same everywhere.

    On XLA:CPU (`lax.platform_dependent`) the same codes take fewer operations. The
    CPU flushes subnormal operands itself, and with float32 scales of the absmax rule
    the clip is left out, because no product can need it: `|x| <= absmax` and
    `inv = fl(top / absmax)` (or 2**126 where `absmax < top * 2**-126`), so
    `fl(x * inv) <= top * (1 + 2**-24)**2`, far below the midpoint between `top` and
    the next float of any 8-bit format, and the conversion itself gives `top`. NaN and
    inf are then left to the conversion: they sit only in groups whose reciprocal is 0,
    so their products are NaN, and the codes above the top one (NaN's and inf's, never
    a finite product's) are made +0 afterwards, a test of one byte. The conversion
    there is `byte_float_codes` (the byte XLA's conversion writes, from integer
    operations on the bits: 0.5x the encode's time), which reaches NaN's code through
    its integer rounding too (an exponent past the format's overflows to it), so
    fast-math flags that assume no NaN change nothing
    (`tests/dtypes/test_backend_bits.py` runs these codes under those flags).
    Testing the float32 input's exponent field before the product instead took 1.2x
    the fusion's time. Power-of-two scales (OCP MX overshoots by design) and narrowed
    scales (a float16 scale clipped at 65504) keep the clip, which may turn a NaN into
    `top` under those flags, so they make NaN and inf +0 on the input's bits first, as
    do the formats without a code of their own for -0 (fnuz).
    `tests/dtypes/test_backend_forms.py` compares the CPU form with the exact one.
    """
    top = np.float32(fmt.max)

    def exact(v: jax.Array, r: jax.Array) -> jax.Array:
        y = times_reciprocal(v, scaling, r, pre, rounding="nearest_even")
        return jnp.clip(y, -top, top).astype(native)

    def cpu(v: jax.Array, r: jax.Array) -> jax.Array:
        clipped = scaling.power_of_two or scaling.scale_format != "float32"
        above = _codes_above_top(native)
        if not clipped and above is not None:
            # NaN and inf sit only in groups whose reciprocal is 0: their products are
            # NaN, converted to codes above the top one, which become +0
            y = v * scaling.broadcast(r, v.shape)
            codes = lax.bitcast_convert_type(converted_on_cpu(y, native), jnp.uint8)
            special = (codes & jnp.uint8(0x7F)) >= jnp.uint8(above)
            return lax.bitcast_convert_type(jnp.where(special, jnp.uint8(0), codes), native)
        u = lax.bitcast_convert_type(v, jnp.uint32)
        special = (u & jnp.uint32(0x7F800000)) == jnp.uint32(0x7F800000)
        finite = lax.bitcast_convert_type(jnp.where(special, jnp.uint32(0), u), jnp.float32)
        y = finite * scaling.broadcast(r, v.shape)
        if clipped:
            y = jnp.clip(y, -top, top)
        return converted_on_cpu(y, native)

    if pre is not None:  # (no 8-bit float's top needs a prescale: see `needs_prescale`)
        return exact(x, inv)
    codes: jax.Array = lax.platform_dependent(x, inv, cpu=cpu, default=exact)
    return codes


@functools.cache
def _codes_above_top(native: Any) -> int | None:
    """The smallest magnitude code (sign bit clear) above the largest finite one of the
    one-byte float `native`, when every NaN and inf code lies at or above it and -0 has a
    code of its own (0x80); else None (the fnuz formats, whose NaN is 0x80)."""
    t = np.dtype(native)
    top = int(np.array(ml_dtypes.finfo(t).max, np.float32).astype(t).view(np.uint8))
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf], np.float32).astype(t).view(np.uint8)
    negative_zero = int(np.array(-0.0, np.float32).astype(t).view(np.uint8))
    if negative_zero != 0x80 or int((specials & 0x7F).min()) <= top:
        return None
    return top + 1


def _store(
    fmt: FloatFormat, values: jax.Array, scale: jax.Array | None, scaling: Scaling | None
) -> Encoded:
    """Put on-grid float values into the format's container (codes if no native type)."""
    if fmt.container != np.uint8:
        if values.dtype == jnp.float32:
            return Encoded(from_float32(values, fmt.container), scale, fmt, scaling)
        return Encoded(values.astype(fmt.container), scale, fmt, scaling)
    codes = _custom_float_bits.to_codes(fmt, values)
    if not fmt.packed:
        return Encoded(codes, scale, fmt, scaling)
    return _codec.pack_encoded(codes, scale, fmt, scaling)


def decode(fmt: FloatFormat, enc: Encoded, dtype: Any = np.float32) -> jax.Array:
    """`fmt.decode(enc, dtype)`: the argument checks, then one compiled kernel."""
    _codec.check_decodable(fmt, enc, dtype)
    values: jax.Array = _decode_jit(fmt, enc, jnp.dtype(dtype))
    return values


@functools.partial(jax.jit, static_argnums=(0, 2))
def _decode_jit(fmt: FloatFormat, enc: Encoded, dtype: Any) -> jax.Array:
    values = _codec.unpack_codes(fmt, enc, signed=False)
    if fmt.container == np.uint8:
        values = _custom_float_bits.from_codes(fmt, values)
    return _codec.dequantize(values, enc, 0, dtype)


def _round_with_mask(
    fmt: FloatFormat, scaling: Scaling | None, rounding: str, x: jax.Array, key: Any
) -> tuple[jax.Array, jax.Array]:
    """(quantize-dequantized x in `result_dtype`, straight-through gradient mask)."""
    dtype = fmt.result_dtype(np.dtype(x.dtype), scaling)
    if scaling is None:
        y = round_values(fmt, x, rounding, key).astype(dtype)
        xw = x.astype(jnp.float32) if np.dtype(x.dtype).itemsize < 4 else x
        if fmt.max <= float(np.finfo(xw.dtype).max):
            mask = jnp.abs(xw) <= fmt.max
        else:  # every finite input is in range (float64 formats)
            mask = jnp.isfinite(xw)
        return y, mask
    scalar = x.ndim == 0
    xf = (x.reshape(1) if scalar else x).astype(jnp.float32)
    scale, inv, pre, _ = scales(xf, scaling, fmt.max, fmt.emax)
    stored, tensor_scale, inv, pre = _scale_storage.narrow(xf, scaling, scale, inv, pre, fmt.max, 0)
    scale = _scale_storage.widen(stored, tensor_scale, scaling, 0)
    y = times_reciprocal(xf, scaling, inv, pre, rounding=rounding)
    q = round_values(fmt, y, rounding, key, saturate=True)
    out = times_scale(q, scaling.broadcast(scale, xf.shape))
    mask = (jnp.abs(y) <= fmt.max) if scaling.power_of_two else jnp.ones(xf.shape, bool)
    if scalar:
        out, mask = out.reshape(()), mask.reshape(())
    return out.astype(dtype), mask


_round_jit = _codec.straight_through_round(_round_with_mask)


def round(fmt: FloatFormat, x: Any, scaling: Scaling | None, rounding: str, key: Any) -> jax.Array:
    """`fmt.round(x, ...)`: validated once, then one compiled kernel."""
    x = as_float_array(x)
    scaling = resolve_scaling(fmt, scaling)
    _validate(fmt, x, scaling, storing=False)
    return _round_jit(fmt, scaling, rounding, x, key)
