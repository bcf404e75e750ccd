"""What every encoder checks of its input: float arrays, a scaling, finite values.

Shared by all the codecs, and run eagerly before anything is traced, so a
bad argument is refused at the call that passed it, with a message naming
the value, the format and the fix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._argument_checks import refuse_non_finite, resolve_scaling
from ._errors import NonFiniteError, PrecisionTypeError

if TYPE_CHECKING:
    from ._format import Format

__all__ = [
    "any_equal_now",
    "as_float_array",
    "check_finite",
    "is_tracer",
    "numeric_array",
    "resolve_scaling",
    "special_values_now",
]


def numeric_array(x: Any, what: str) -> jax.Array:
    """`x` as a jax array of numbers (bools included), or a refusal naming it as `what`."""
    try:
        a = x if isinstance(x, jax.Array) else jnp.asarray(x)
    except (TypeError, ValueError, OverflowError) as e:
        raise PrecisionTypeError(
            f"{what} must be an array of numbers, got {type(x).__name__} {x!r:.40} ({e}); "
            "pass jax or numpy arrays"
        ) from None
    if not (jnp.issubdtype(a.dtype, jnp.number) or a.dtype == jnp.bool_):
        raise PrecisionTypeError(
            f"{what} must be an array of numbers, got dtype {a.dtype}; pass jax or numpy "
            "arrays of numbers"
        )
    return a


def as_float_array(x: Any) -> jax.Array:
    """`x` as a floating jax array; integers and bools become float32."""
    arr: jax.Array | np.ndarray[Any, Any]
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
        if (
            isinstance(arr, np.ndarray)
            and dtype == np.float64
            and not jax.config.read("jax_enable_x64")
        ):
            # JAX narrows float64 to float32 here, as everywhere: a value beyond float32
            # becomes inf (refused by scaled encodings, inf in an unscaled one, as its own
            # rounding would give). Narrowed quietly, so numpy's overflow warning does not
            # stand in for that refusal where warnings are errors.
            with np.errstate(over="ignore"):
                arr = arr.astype(np.float32)
        return jnp.asarray(arr)
    if jnp.issubdtype(dtype, jnp.integer) or dtype == np.bool_:
        return jnp.asarray(arr, jnp.float32)
    raise PrecisionTypeError(
        f"cannot encode an array of dtype {dtype} (from {type(x).__name__}); "
        "pass numbers: a float, int or bool array"
    )


def is_tracer(x: Any) -> bool:
    """Whether `x` is being traced: a value of `jit`, `grad`, `vmap` or another JAX
    transformation, whose numbers are not known yet.

    The eager checks of every encoder ask it (NaN refused, scales read), and so
    does `precision`, which decides by it whether a value can be looked at now.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import dtypes
        >>> dtypes.is_tracer(jnp.ones(2))
        False
        >>> _ = jax.jit(lambda x: print(dtypes.is_tracer(x)) or x)(jnp.ones(2))
        True
    """
    return isinstance(x, jax.core.Tracer)


def check_finite(x: jax.Array, fmt: Format) -> None:
    """Eagerly refuse NaN/inf in a scaled encoding: they would poison a whole group."""
    if is_tracer(x):
        return
    if x.dtype == np.float64:  # scales are float32: a float64 value past its range is inf
        values = np.asarray(x)
        past = np.isfinite(values) & (np.abs(values) > np.finfo(np.float32).max)
        if past.any():
            first = tuple(int(i) for i in np.unravel_index(int(np.argmax(past)), past.shape))
            raise NonFiniteError(
                f"cannot encode {int(past.sum())} float64 value(s) beyond float32's range "
                f"(±3.4e38) into scaled {fmt.name}: the first is {float(values[first])!r} at index "
                f"{first}. Scales are float32, so its group's scale would be inf and the group "
                "NaN; rescale the values first or keep them in float64"
            )
    if _all_finite_now(x):
        return
    refuse_non_finite(np.asarray(x), fmt)


def _all_finite_now(x: jax.Array) -> bool:
    """Whether concrete `x` is all finite (computed now, even inside an enclosing trace)."""
    has_nan, has_inf = special_values_now(x)
    return not (has_nan or has_inf)


def special_values_now(x: jax.Array) -> tuple[bool, bool]:
    """(whether concrete `x` holds NaN, whether it holds ±inf), in one pass.

    Read in place by numpy where `x` is in host memory (a check compiled per
    shape costs more than the check there), else by one compiled reduction on
    its device: an eager `jnp.isnan` then `jnp.any` would write a boolean array
    as large as `x` and read it back, for each question. Computed now, even
    inside an enclosing trace (a closed-over constant).
    """
    if all(d.platform == "cpu" for d in x.devices()):
        values = np.asarray(x)
        if values.dtype.itemsize < 4:
            values = values.astype(np.float32)
        if np.isfinite(values).all():  # the common case: one pass, no second question
            return False, False
        return bool(np.isnan(values).any()), bool(np.isinf(values).any())
    with jax.ensure_compile_time_eval():
        has_nan, has_inf = _special_values(x)
    return bool(has_nan), bool(has_inf)


@jax.jit
def _special_values(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    if x.dtype.itemsize < 4:  # bfloat16, float16, float8, E8M0 scales: widened exactly
        x = x.astype(jnp.float32)
    if x.dtype != jnp.float32:
        return jnp.any(jnp.isnan(x)), jnp.any(jnp.isinf(x))
    # (from the bits, one integer compare each: a compiler assuming no NaN keeps them)
    mag = lax.bitcast_convert_type(x, jnp.uint32) & jnp.uint32(0x7FFFFFFF)
    return jnp.any(mag > jnp.uint32(0x7F800000)), jnp.any(mag == jnp.uint32(0x7F800000))


def any_equal_now(x: jax.Array, value: int, bits: int = 8) -> bool:
    """Whether concrete `x` holds `value`: read in place where it is in host memory, else
    reduced on its device (no copy of the whole array to the host).

    With `bits` < 8, `x` holds packed uint8 bytes, and each `bits`-wide field of them is
    compared with the signed `value` (as its low `bits` bits: int4's -8 is 0b1000).
    """
    if not isinstance(x, jax.Array) or all(d.platform == "cpu" for d in x.devices()):
        return _any_field_equal(np, np.asarray(x), value, bits)
    with jax.ensure_compile_time_eval():
        return _any_field_equal(jnp, x, value, bits)


def _any_field_equal(xp: Any, data: Any, value: int, bits: int) -> bool:
    if bits >= 8:
        return bool(xp.any(data == value))
    mask = (1 << bits) - 1
    return any(bool(xp.any(((data >> s) & mask) == (value & mask))) for s in range(0, 8, bits))
