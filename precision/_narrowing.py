"""Concrete 64-bit values that JAX would change into other numbers, found before it does.

With `jax_enable_x64` off (JAX's default), JAX turns a numpy int64/float64
array or a Python number into its 32-bit counterpart wherever it meets one.
Inside float32's range that is a rounding: the precision of every 32-bit JAX
program, accepted here as JAX accepts it. Past the range it is another
number: an int64 past int32 wraps without a word (2**40 becomes 0), and a
finite float64 past float32's largest becomes inf, which a finiteness check
then reports and a loss scale halves on. A Python int past the integer JAX
holds it in (int32, or int64 under x64) raises a bare `OverflowError`.

Only concrete leaves reach these checks: inside `jit` an argument is already
a 32-bit tracer (JAX narrowed it at the call), and a `jax.Array` holds what
JAX made of it already.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

__all__ = ["X64_FIX", "narrowing"]

X64_FIX = (
    "enable 64-bit JAX (jax.config.update('jax_enable_x64', True)), or bring the values "
    "into the 32-bit range first"
)

_NARROW: dict[np.dtype[Any], np.dtype[Any]] = {
    np.dtype(np.int64): np.dtype(np.int32),
    np.dtype(np.uint64): np.dtype(np.uint32),
    np.dtype(np.float64): np.dtype(np.float32),
    np.dtype(np.complex128): np.dtype(np.complex64),
}


def narrowing(x: Any) -> str | None:
    """What JAX would do to concrete `x` beyond rounding it, or None.

    None for values JAX keeps (up to float32 rounding), for tracers and JAX
    arrays, and for anything that is not a number (the caller judges those).
    """
    x64 = bool(jax.config.read("jax_enable_x64"))
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        bits = 64 if x64 else 32
        if -(2 ** (bits - 1)) <= x < 2 ** (bits - 1):
            return None
        return (
            f"is the Python int {x}, beyond int{bits}'s range (the integer {bits}-bit JAX "
            "holds it in): JAX cannot convert it"
        )
    if isinstance(x, float | complex) and not x64:
        return _past_float32(np.asarray(x), "Python " + type(x).__name__)
    if isinstance(x, np.ndarray | np.generic) and not x64:
        arr = np.asarray(x)
        target = _NARROW.get(arr.dtype)
        if target is None:
            return None
        if target.kind in "iu":
            info = np.iinfo(target)
            past = (arr < info.min) | (arr > info.max)
            if past.any():
                first = _first(past)
                return (
                    f"{_which(arr, past, str(arr.dtype))} beyond {target}'s range: 32-bit JAX "
                    f"would wrap it to {arr[first].astype(target).item()!r}"
                )
            return None
        return _past_float32(arr, str(arr.dtype))
    return None


def _past_float32(arr: np.ndarray, shown: str) -> str | None:
    """Finite values (real or imaginary parts) that float32 would hold as ±inf."""
    parts = np.stack([arr.real, arr.imag]) if arr.dtype.kind == "c" else arr[None]
    past = (np.isfinite(parts) & (np.abs(parts) > np.finfo(np.float32).max)).any(axis=0)
    if not past.any():
        return None
    return (
        f"{_which(arr, past, shown)} beyond float32's range (±3.4e38): 32-bit JAX would make it inf"
    )


def _which(arr: np.ndarray, past: np.ndarray, shown: str) -> str:
    """`is the float64 1e+300` for a scalar, `holds 2 float64 values ..., the first ...`."""
    first = _first(past)
    if arr.ndim == 0:
        return f"is the {shown} {arr.item()!r},"
    return (
        f"holds {int(past.sum())} {shown} value(s), the first {arr[first].item()!r} at index "
        f"{first},"
    )


def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(mask)), mask.shape))
