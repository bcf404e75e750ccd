"""What a Tensor accepts: its input, its logical dtype, a new shape, a static index.

Each check refuses what it cannot take before anything is computed, saying what
was given and the call that fixes it. `Tensor(x, dtype)`, `Tensor.from_encoded`,
`astype`, `reshape` and indexing run them.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import dtypes
from dtypes import NonFiniteError, PrecisionTypeError, ShapeError

from ._errors import TensorIndexError
from ._jax_compat import is_tracer

__all__ = [
    "LOGICAL_DTYPES",
    "as_array",
    "astype_dtype",
    "check_new_shape",
    "check_static_index",
    "logical_dtype",
    "refuse_float32_overflow",
]

LOGICAL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # what a Tensor's values are


def _x64() -> bool:
    return bool(jax.config.read("jax_enable_x64"))


def logical_dtype(dtype: Any, given: Any) -> np.dtype[Any]:
    """The logical dtype asked for (`dtype`), or by default the one values of dtype
    `given` get: float64 for float64 values under 64-bit JAX, float32 otherwise."""
    if dtype is None:
        return np.dtype(np.float64 if given == np.float64 and _x64() else np.float32)
    if isinstance(dtype, np.generic | np.ndarray | int | float):  # a value, not a dtype
        raise PrecisionTypeError(
            f"dtype must be float32 or float64, got the value {dtype!r:.60}; pass "
            "dtype=np.float32 (or 'float32')"
        )
    try:
        dt: np.dtype[Any] = np.dtype(dtype)
    except TypeError:
        raise PrecisionTypeError(f"dtype must be float32 or float64, got {dtype!r}") from None
    if dt not in LOGICAL_DTYPES:
        raise PrecisionTypeError(
            f"a Tensor's logical dtype must be float32 or float64, got {dt.name}; to store "
            f"values in {dt.name}, keep dtype=float32 and call "
            f".to_reduced_precision({dt.name!r})"
        )
    if dt == np.float64 and not _x64():
        raise PrecisionTypeError(
            "a float64 Tensor needs 64-bit JAX: set jax.config.update('jax_enable_x64', True) "
            "first, or use dtype=float32"
        )
    return dt


def as_array(x: Any) -> tuple[Any, np.dtype]:
    """(array-like, its dtype) after refusing non-numeric input with a precise message."""
    if isinstance(x, jax.Array | np.ndarray) or is_tracer(x):
        dt = np.dtype(x.dtype)
    else:
        try:
            arr = np.asarray(x)
        except (ValueError, TypeError) as err:
            raise PrecisionTypeError(
                f"cannot make a Tensor from {type(x).__name__}: {err}"
            ) from None
        x, dt = arr, arr.dtype
    if jnp.issubdtype(dt, jnp.floating):  # ml_dtypes floats have numpy kind "V"
        return x, dt
    if dt.kind == "c":
        raise PrecisionTypeError(
            f"cannot make a Tensor from complex values (dtype {dt}): the logical dtype is a "
            "real float; make two Tensors from jnp.real(x) and jnp.imag(x)"
        )
    if dt.kind not in "iub":
        raise PrecisionTypeError(
            f"cannot make a Tensor from {type(x).__name__} of dtype {dt}: a Tensor holds "
            "numbers; pass a float, int or bool array (e.g. np.asarray(values, np.float32))"
        )
    return x, dt


def refuse_float32_overflow(values: np.ndarray) -> None:
    """Refuse finite float64 values that a float32 Tensor would hold as ±inf."""
    past = np.isfinite(values) & (np.abs(values) > np.finfo(np.float32).max)
    if past.any():
        first = tuple(int(i) for i in np.unravel_index(int(np.argmax(past)), past.shape))
        raise NonFiniteError(
            f"{int(past.sum())} float64 value(s) lie beyond float32's range (±3.4e38): the "
            f"first, {float(values[first])!r} at index {first}, would become inf in a float32 "
            "Tensor; rescale the values, or enable 64-bit JAX "
            "(jax.config.update('jax_enable_x64', True)) for a float64 Tensor"
        )


def check_new_shape(new: tuple[Any, ...], shape: tuple[int, ...]) -> None:
    """Refuse a reshape to something that is not a shape of this many values."""
    ints = all(isinstance(d, int | np.integer) and not isinstance(d, bool) for d in new)
    size = math.prod(shape)
    known = math.prod(int(d) for d in new if ints and d != -1)
    fits = ints and (
        sum(1 for d in new if d == -1) <= 1
        and all(d >= -1 for d in new)
        and (known == size if -1 not in new else known != 0 and size % known == 0)
    )
    if not fits:
        raise ShapeError(
            f"cannot reshape a Tensor of shape {shape} ({size} values) into {new!r}: a shape "
            "is ints (one of them may be -1) whose product is the number of values"
        )


def check_static_index(key: Any, shape: tuple[int, ...]) -> None:
    """Raise `IndexError` for an integer index (Python, numpy, or a concrete integer
    array) outside its dimension."""
    parts = key if isinstance(key, tuple) else (key,)
    if any(p is Ellipsis for p in parts):
        at = next(i for i, p in enumerate(parts) if p is Ellipsis)
        explicit = sum(1 for p in parts if p is not None and p is not Ellipsis)
        parts = (*parts[:at], *([slice(None)] * (len(shape) - explicit)), *parts[at + 1 :])
    dim = 0
    for p in parts:
        if p is None:
            continue
        if dim < len(shape):
            _check_in_bounds(p, dim, shape)
        dim += 1


def _check_in_bounds(p: Any, dim: int, shape: tuple[int, ...]) -> None:
    """An integer index, or a concrete integer index array, within axis `dim`."""
    n = shape[dim]
    if isinstance(p, int | np.integer) and not isinstance(p, bool):
        bad = None if -n <= int(p) < n else int(p)
    elif isinstance(p, np.ndarray | jax.Array) and not is_tracer(p):
        if not np.issubdtype(p.dtype, np.integer) or p.size == 0:
            return
        values = np.asarray(p)
        outside = (values < -n) | (values >= n)
        bad = int(values[outside].reshape(-1)[0]) if outside.any() else None
    else:
        return
    if bad is not None:
        raise TensorIndexError(
            f"index {bad} is out of bounds for axis {dim} with size {n} (a Tensor of "
            f"shape {shape}); JAX would clamp it silently, so it is refused"
        )


def astype_dtype(dtype: Any) -> np.dtype[Any]:
    """The logical dtype `Tensor.astype(dtype)` asks for, or a `PrecisionTypeError`
    naming the call that stores values in a format (a format is not a dtype)."""
    try:
        logical: np.dtype[Any] | None = np.dtype(dtype)
    except TypeError:
        logical = None
    if logical is not None and logical in LOGICAL_DTYPES:
        return logical
    # (a dtype names its format as the registry does: jnp.bfloat16 is "bfloat16")
    name = logical.name if logical is not None else str(dtype)
    call = f"t.to_reduced_precision({name!r})"
    try:
        dtypes.get(name)
    except (KeyError, ValueError, TypeError):
        call = "t.to_reduced_precision(name) with a format of dtypes.REGISTRY"
    raise PrecisionTypeError(
        f"Tensor.astype changes the logical dtype (float32 or float64), got {dtype!r}; "
        f"to store the values in a format, call {call}"
    )
