"""encode / decode / round / check of `IntFormat`s (symmetric integer codes), in jnp.

Codes are `round(x / scale)` clipped to `[-qmax, qmax]`, with the group's
scale from the absmax or power-of-two rule (`_scale_rules.scales`); the
binary int1 stores sign(x) with the group's mean |x| as its scale. Packed
into bytes below 8 bits. `Format`'s methods import this module on first use.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _codec, _scale_storage
from ._argument_checks import refuse_scaling
from ._bit_rounding import round_integer
from ._encode_input_checks import (
    as_float_array,
    check_finite,
    is_tracer,
    resolve_scaling,
    special_values_now,
)
from ._encoded import Encoded
from ._ieee import times_scale, unsigned_zero
from ._rounding_modes import NEAREST_MODES
from ._scale_rules import (
    flush_subnormals,
    mean_abs,
    nearest_steps_cpu,
    scales,
    times_reciprocal,
)
from ._scaling import Scaling

if TYPE_CHECKING:
    from ._int import IntFormat

__all__ = ["check", "decode", "encode", "round"]


def _validate(fmt: IntFormat, x: jax.Array, scaling: Scaling) -> None:
    """Every check that can be made before computing: scalings, shapes, eager values."""
    refuse_scaling(fmt, scaling, x.shape)
    check_finite(x, fmt)


def _resolve(fmt: IntFormat, scaling: Scaling | None) -> Scaling:
    resolved = resolve_scaling(fmt, scaling)
    assert resolved is not None  # an integer format always has a default scaling
    return resolved


def check(fmt: IntFormat, x: Any, scaling: Scaling | None) -> None:
    """Raise what `encode` would raise for `x` (scalings, shapes, eager values)."""
    x = as_float_array(x)
    _validate(fmt, x, _resolve(fmt, scaling))


def encode(fmt: IntFormat, x: Any, scaling: Scaling | None, rounding: str, key: Any) -> Encoded:
    """`fmt.encode(x, ...)`: validated, one compiled kernel, then its scales read.

    NaN and ±inf are refused eagerly, as `check` refuses them, but found after the
    encode rather than by a pass of their own over `x`: a group holding one gets
    a NaN scale, so the scales (one value per group) say whether to look, and only
    then is `x` searched for the message. The encode reads `x` once more than it
    must only when it is about to be refused.
    """
    x = as_float_array(x)
    resolved = _resolve(fmt, scaling)
    refuse_scaling(fmt, resolved, x.shape)
    encoded: Encoded = _encode_jit(fmt, resolved, rounding, x, key)
    if not is_tracer(x) and encoded.scale is not None and special_values_now(encoded.scale)[0]:
        check_finite(x, fmt)  # raises, naming the values and where the first is
    return encoded


def _int_codes(
    fmt: IntFormat, x: jax.Array, scaling: Scaling, rounding: str, key: Any, *, stored: bool
) -> tuple[jax.Array, jax.Array, jax.Array | None, jax.Array | None, jax.Array | None]:
    """(codes, stored scale, reciprocal, unclipped rounded codes, tensor scale).

    `stored`: the codes as int8, to be stored (`encode`), computed in the CPU's
    form there (`_nearest_codes_cpu`), which gives no rounded values (None);
    else as float32 (`round`), and the rounded values alongside (read by a
    power-of-two scaling's gradient mask; where int2 takes the CPU form in the
    nearest modes, the codes themselves)."""
    if fmt.binary:
        x = flush_subnormals(x)
        # A group holding NaN or ±inf gets a NaN scale, like every scale.
        scale = mean_abs(x, scaling)
        # sign(x) with 0 mapping to +1; NaN input gives a NaN scale above.
        codes = jnp.where(x >= 0, jnp.float32(1), jnp.float32(-1))
        scale, _, _, _ = _scale_storage.narrow(x, scaling, scale, scale, scale, 1.0, 0)
        return (codes.astype(jnp.int8) if stored else codes), scale, None, codes, None
    top_exponent = fmt.top_exponent
    # int2's `round` takes the CPU form too (comparisons, no rounding) where no gradient
    # mask reads the rounded values (only power-of-two scales clip codes): per tensor
    # 0.72x, per row 0.86x the exact form's time; wider grids' rounds gained nothing
    # there (int8 per tensor 0.91x, per row 1.04x, per block of 32 1.08x)
    cpu_form = stored or (fmt.qmax == 1 and not scaling.power_of_two)
    cpu_form = cpu_form and rounding in NEAREST_MODES and x.dtype == jnp.float32
    # The CPU form's mask (0 where a group's reciprocal is 0) is made with the scales,
    # where the stored scale keeps their reciprocal (`narrow` passes it on): one
    # conditional an encode instead of two
    with_keep = cpu_form and fmt.qmax > 1 and scaling.scale_format in _KEEPS_RECIPROCAL
    scale, inv, pre, keep = scales(x, scaling, fmt.qmax, top_exponent, keep=with_keep)
    scale, tensor_scale, inv, pre = _scale_storage.narrow(
        x, scaling, scale, inv, pre, fmt.qmax, top_exponent
    )
    if cpu_form:
        as_codes = jnp.int8 if stored else jnp.float32
        Arg = jax.Array | None

        def exact(x: jax.Array, inv: jax.Array, pre: Arg, _: Arg) -> jax.Array:
            return _exact_codes(fmt.qmax, scaling, rounding, None, x, inv, pre)[0].astype(as_codes)

        def cpu(x: jax.Array, inv: jax.Array, pre: Arg, keep: Arg) -> jax.Array:
            codes = _nearest_codes_cpu(
                fmt.qmax, scaling, rounding, x, inv, pre, packed=stored, keep=keep
            )
            return codes.astype(as_codes)

        # (a None argument is an empty pytree: the branches receive it as None)
        codes = lax.platform_dependent(x, inv, pre, keep, cpu=cpu, default=exact)
        return codes, scale, inv, None if stored else codes, tensor_scale
    codes, rounded = _exact_codes(fmt.qmax, scaling, rounding, key, x, inv, pre)
    return (codes.astype(jnp.int8) if stored else codes), scale, inv, rounded, tensor_scale


def _exact_codes(
    qmax: int,
    scaling: Scaling,
    rounding: str,
    key: Any,
    x: jax.Array,
    inv: jax.Array,
    pre: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(codes as float32, unclipped rounded codes) on any backend: subnormals flushed
    and NaN and inf made +0 on the bits before the product, the product rounded,
    no -0 code (`unsigned_zero`)."""
    y = times_reciprocal(x, scaling, inv, pre, rounding=rounding, signed_zero=False)
    rounded = round_integer(y, rounding, key)
    # (no -0 code, even held as a float: see `unsigned_zero`)
    return unsigned_zero(jnp.clip(rounded, -qmax, qmax)), rounded


def _nearest_codes_cpu(
    qmax: int,
    scaling: Scaling,
    rounding: str,
    x: jax.Array,
    inv: jax.Array,
    pre: jax.Array | None = None,
    *,
    packed: bool = True,
    keep: jax.Array | None = None,
) -> jax.Array:
    """The int8 codes of `_exact_codes` in the nearest modes, as XLA:CPU computes them
    fastest, with the same bits there (`nearest_steps_cpu`: every code of a group
    whose reciprocal is 0 is 0, as the exact form gives it; an integer has no -0).
    `tests/dtypes/test_backend_forms.py` checks both forms against each other on
    adversarial input."""
    steps = nearest_steps_cpu(
        x, scaling, inv, pre, rounding=rounding, qmax=qmax, packed=packed, keep=keep
    )
    return steps.astype(jnp.int8)


# Scale formats whose stored scales keep the reciprocal `scales` made (`narrow`)
_KEEPS_RECIPROCAL = ("float32", "float8_e8m0fnu")


# One compiled kernel per (format, scaling, mode, shape): an eager call is a
# single dispatch instead of dozens, and under an outer `jit` it is inlined.
@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _encode_jit(fmt: IntFormat, scaling: Scaling, rounding: str, x: jax.Array, key: Any) -> Encoded:
    scalar = x.ndim == 0
    if scalar:
        x = x.reshape(1)
    x = x.astype(jnp.float32)
    codes, scale, _, _, tensor_scale = _int_codes(fmt, x, scaling, rounding, key, stored=True)
    if scalar:
        scale = scale.reshape(())
    if scalar:
        codes = codes.reshape(())
    if not fmt.packed:
        return Encoded(codes, scale, fmt, scaling, tensor_scale=tensor_scale)
    enc = _codec.pack_encoded(codes, scale, fmt, scaling)
    enc.tensor_scale = tensor_scale
    return enc


def decode(fmt: IntFormat, enc: Encoded, dtype: Any = np.float32) -> jax.Array:
    """`fmt.decode(enc, dtype)`: the argument checks, then one compiled kernel."""
    _codec.check_decodable(fmt, enc, dtype)
    values: jax.Array = _decode_jit(fmt, enc, jnp.dtype(dtype))
    return values


@functools.partial(jax.jit, static_argnums=(0, 2))
def _decode_jit(fmt: IntFormat, enc: Encoded, dtype: Any) -> jax.Array:
    codes = _codec.unpack_codes(fmt, enc, signed=True)
    return _codec.dequantize(codes, enc, fmt.top_exponent, dtype)


def _round_with_mask(
    fmt: IntFormat, scaling: Scaling, rounding: str, x: jax.Array, key: Any
) -> tuple[jax.Array, jax.Array]:
    """(quantize-dequantized x in `result_dtype`, straight-through gradient mask)."""
    dtype = fmt.result_dtype(np.dtype(x.dtype), scaling)
    scalar = x.ndim == 0
    xf = (x.reshape(1) if scalar else x).astype(jnp.float32)
    codes, stored, _, rounded, tensor_scale = _int_codes(
        fmt, xf, scaling, rounding, key, stored=False
    )
    scale = _scale_storage.widen(stored, tensor_scale, scaling, fmt.top_exponent)
    # An integer code times a normal scale is never subnormal (|code| >= 1 or 0).
    out = times_scale(codes, scaling.broadcast(scale, xf.shape), flush=False)
    assert rounded is not None  # (`stored=False` always gives them)
    if scaling.power_of_two and not fmt.binary:
        # Only power-of-two scales can push a code out of range: those
        # elements were clipped and pass no gradient (clipped STE).
        mask = jnp.abs(jnp.round(rounded)) <= fmt.qmax
    else:
        mask = jnp.ones(xf.shape, bool)
    if scalar:
        out, mask = out.reshape(()), mask.reshape(())
    return out.astype(dtype), mask


_round_jit = _codec.straight_through_round(_round_with_mask)


def round(fmt: IntFormat, x: Any, scaling: Scaling | None, rounding: str, key: Any) -> jax.Array:
    """`fmt.round(x, ...)`: validated once, then one compiled kernel."""
    x = as_float_array(x)
    resolved = _resolve(fmt, scaling)
    _validate(fmt, x, resolved)
    return _round_jit(fmt, resolved, rounding, x, key)
