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

from ._errors import NonFiniteError, PrecisionTypeError
from ._scaling import Scaling

if TYPE_CHECKING:
    from ._format import Format

__all__ = ["any_nan_now", "as_float_array", "check_finite", "is_tracer", "resolve_scaling"]


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
        return jnp.asarray(arr)
    if jnp.issubdtype(dtype, jnp.integer) or dtype == np.bool_:
        return jnp.asarray(arr, jnp.float32)
    raise PrecisionTypeError(
        f"cannot encode an array of dtype {dtype} (from {type(x).__name__}); "
        "pass numbers: a float, int or bool array"
    )


def is_tracer(x: Any) -> bool:
    """Whether `x` is being traced (its values are not known yet)."""
    return isinstance(x, jax.core.Tracer)


def resolve_scaling(fmt: Format, scaling: Scaling | None) -> Scaling | None:
    """`scaling`, or the format's default for None; anything else but a `Scaling` is refused."""
    if scaling is None:
        return fmt.default_scaling()
    if not isinstance(scaling, Scaling):
        raise PrecisionTypeError(
            f"scaling must be PerTensor(), PerAxis(axis) or PerBlock(size), got {scaling!r}"
        )
    return scaling


def check_finite(x: jax.Array, fmt: Format) -> None:
    """Eagerly refuse NaN/inf in a scaled encoding: they would poison a whole group."""
    if is_tracer(x):
        return
    if _all_finite_now(x):
        return
    bad = ~np.isfinite(np.asarray(x, np.float64))
    first = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape))
    value = np.asarray(x, np.float64)[first] if bad.ndim else float(np.asarray(x))
    raise NonFiniteError(
        f"cannot encode {int(bad.sum())} non-finite value(s) into scaled {fmt.name}: the first "
        f"is {value} at index {first}. A scale computed over them would be NaN; replace them "
        "first (e.g. jnp.nan_to_num(x)) or encode into an unscaled float format"
    )


def _all_finite_now(x: jax.Array) -> bool:
    """Whether concrete `x` is all finite: read in place by numpy where it is in host
    memory (an eager check compiled per shape costs more than the check), else on its
    device. Computed now, even inside an enclosing trace (a closed-over constant)."""
    if all(d.platform == "cpu" for d in x.devices()):
        return bool(np.isfinite(np.asarray(x)).all())
    with jax.ensure_compile_time_eval():
        return bool(jnp.all(jnp.isfinite(x)))


def any_nan_now(x: jax.Array) -> bool:
    """Whether concrete `x` holds a NaN (computed now, even inside an enclosing trace)."""
    with jax.ensure_compile_time_eval():
        return bool(jnp.any(jnp.isnan(x)))
