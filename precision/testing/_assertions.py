"""Distances in units of a format's spacing, and assertions built on them.

These run on the host with numpy (float64 and int64), on concrete values:
call them on results, not inside `jit`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import dtypes
from dtypes import FloatFormat, Format, IntFormat, PrecisionTypeError

from .._errors import KitError
from ._grid import max_code, ordinals

__all__ = ["assert_representable", "assert_ulp_close", "ulp_distance"]


def _as_float_array(x: Any, name: str) -> np.ndarray:
    """`x` (numpy, jax, Tensor, scalar) as a float32 or float64 numpy array."""
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError):  # ragged lists and the like
        arr = np.asarray(None)
    if arr.dtype.kind not in "fiub":
        raise PrecisionTypeError(
            f"`{name}` must hold real numbers, got {type(x).__name__} {x!r:.60} (dtype "
            f"{arr.dtype}); pass a float or int array"
        )
    if arr.dtype in (np.float32, np.float64):
        return arr
    return arr.astype(np.float32)  # narrower floats and ints widen exactly enough


def _broadcast(a: np.ndarray, b: np.ndarray, a_name: str, b_name: str) -> list[np.ndarray]:
    try:
        return list(np.broadcast_arrays(a, b))
    except ValueError:
        raise KitError(
            f"`{a_name}` and `{b_name}` must have broadcastable shapes, got {a.shape} and "
            f"{b.shape}; compare arrays of one shape"
        ) from None


def _default_scale(fmt: IntFormat, b: np.ndarray) -> np.float64:
    """The per-tensor scale `fmt` would give `b`: absmax / qmax (int1: mean |b|)."""
    finite = np.abs(b[np.isfinite(b)].astype(np.float64))
    if finite.size == 0:
        return np.float64(1.0)
    scale = finite.mean() if fmt.binary else finite.max() / fmt.qmax
    return np.float64(scale) if scale > 0 else np.float64(1.0)


def _check_scale(scale: Any) -> None:
    """A scale is one grid step: finite and positive, or every distance is meaningless."""
    try:
        s = np.asarray(scale, np.float64)
    except (TypeError, ValueError):
        raise KitError(f"scale must be a positive number or array of them, got {scale!r}") from None
    if not np.all(np.isfinite(s)) or not np.all(s > 0):
        raise KitError(
            f"scale must be finite and positive (one step of the integer grid), got {scale!r}; "
            "pass the scales the encoding used, e.g. enc.scale"
        )


def _check_tolerance(max_ulps: Any) -> None:
    """`max_ulps` is a non-negative real number (NaN would pass every comparison)."""
    if isinstance(max_ulps, bool) or not isinstance(max_ulps, int | float | np.number):
        raise KitError(
            f"max_ulps must be a number of steps, got {type(max_ulps).__name__} {max_ulps!r:.60}; "
            "pass e.g. max_ulps=1"
        )
    if not 0 <= max_ulps < np.inf:  # also NaN
        raise KitError(
            f"max_ulps must be a finite non-negative number of steps (NaN or inf would pass "
            f"anything, even NaN against a number), got {max_ulps!r}; pass e.g. max_ulps=1"
        )


def ulp_distance(a: Any, b: Any, fmt: Format | str, *, scale: Any = None) -> np.ndarray:
    """Distance from `a` to `b` counted in steps of `fmt`'s grid.

    For a float format each value is placed on the grid by its bit pattern:
    a grid value at index `i` (its magnitude code; ±0 are both index 0) is
    `i` steps from zero, and a value between two grid neighbours sits the
    matching fraction of the way between them. The distance counts grid
    steps between the two positions, so it is exact for subnormals, across
    zero (`-s` to `+s` for the smallest subnormal `s` is 2) and over binade
    boundaries, and whole-numbered when both values are on the grid. Past
    `fmt.max` the grid continues as if the exponent were unbounded.

    For an integer format one step is the scale: `|a - b| / scale`.

    Non-finite values: NaN against NaN is distance 0, NaN against anything
    else is inf; ±inf against the same infinity is 0, against anything else
    inf.

    Args:
        a: values (array-like, a jax array or a `precision.Tensor`).
        b: values of a shape broadcastable with `a`.
        fmt: the format whose grid counts the steps (a Format or a name).
        scale: for scaled data, the scale of each element (broadcastable):
            the values are divided by it before measuring. Integer formats
            default to the per-tensor scale `fmt` would give `b`.

    Returns:
        A float64 array of the broadcast shape.

    Examples:
        >>> import dtypes
        >>> tiny = dtypes.bfloat16.smallest_subnormal
        >>> ulp_distance(-tiny, tiny, dtypes.bfloat16)
        array(2.)
        >>> ulp_distance([1.0, 1.0], [1.0078125, 1.001953125], dtypes.bfloat16)
        array([1.  , 0.25])
        >>> ulp_distance(1.0, 2.0, "float8_e4m3fn")
        array(8.)
    """
    fmt = dtypes.get(fmt)
    a_arr = _as_float_array(a, "a").astype(np.float64)
    b_arr = _as_float_array(b, "b").astype(np.float64)
    a_arr, b_arr = _broadcast(a_arr, b_arr, "a", "b")
    if isinstance(fmt, IntFormat) and scale is None:
        scale = _default_scale(fmt, b_arr)
    elif scale is not None:
        _check_scale(scale)
        _broadcast(a_arr, np.asarray(scale, np.float64), "values", "scale")
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if scale is not None:
            s = np.asarray(scale, np.float64)
            a_arr, b_arr = a_arr / s, b_arr / s
        if isinstance(fmt, IntFormat):
            dist = np.abs(a_arr - b_arr)
        elif isinstance(fmt, FloatFormat):
            dist = _grid_steps(a_arr, b_arr, fmt)
        else:
            raise PrecisionTypeError(
                f"ulp_distance: {fmt.name} is a {fmt.kind} format, which has no grid of steps; "
                "pass a float format (steps of its grid) or an integer format (steps of the scale)"
            )
    nan_a, nan_b = np.isnan(a_arr), np.isnan(b_arr)
    inf_a, inf_b = np.isinf(a_arr), np.isinf(b_arr)
    dist = np.where(inf_a | inf_b, np.where(a_arr == b_arr, 0.0, np.inf), dist)
    dist = np.where(nan_a | nan_b, np.where(nan_a & nan_b, 0.0, np.inf), dist)
    return np.asarray(dist, np.float64)


def _grid_steps(a: np.ndarray, b: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    neg_a, idx_a, frac_a = ordinals(a, fmt)
    neg_b, idx_b, frac_b = ordinals(b, fmt)
    same_side = neg_a == neg_b
    # Same sign: subtract indices in int64 (exact), then the fractions.
    within = np.abs((idx_b - idx_a).astype(np.float64) + (frac_b - frac_a))
    # Opposite signs: the two distances to zero add up.
    across = (idx_a.astype(np.float64) + frac_a) + (idx_b.astype(np.float64) + frac_b)
    steps: np.ndarray = np.where(same_side, within, across)
    return steps


def _bits(value: np.ndarray) -> str:
    """Hex bit pattern of a float32/float64 scalar."""
    uint = np.uint32 if value.dtype == np.float32 else np.uint64
    width = 8 if value.dtype == np.float32 else 16
    return f"0x{int(value.reshape(()).view(uint)):0{width}X}"


def _code(value: float, fmt: Format | None) -> str:
    """The value's bit pattern in `fmt`, or where it falls between two."""
    if not isinstance(fmt, FloatFormat):
        return ""
    digits = -(-fmt.bits // 4)
    if np.isnan(value):
        return f", {fmt.name}: NaN"
    neg, idx, frac = (np.asarray(t).item() for t in ordinals(np.asarray(value), fmt))
    sign = (1 << (fmt.bits - 1)) if neg else 0
    if np.isinf(value) or idx > max_code(fmt) or (idx == max_code(fmt) and frac):
        return f", outside the finite range of {fmt.name}"
    if frac == 0:
        return f", {fmt.name} bits 0x{sign | idx:0{digits}X}"
    return (
        f", between {fmt.name} bits 0x{sign | idx:0{digits}X} and 0x{sign | (idx + 1):0{digits}X}"
    )


def _describe(x: np.ndarray, index: tuple[int, ...], fmt: Format | None) -> str:
    v = x[index] if x.ndim else x
    v = np.asarray(v)
    return f"{v.item()!r} ({v.dtype} bits {_bits(v)}{_code(float(v), fmt)})"


def assert_ulp_close(
    actual: Any,
    expected: Any,
    fmt: Format | str,
    *,
    max_ulps: float = 1,
    scale: Any = None,
    err_msg: str = "",
) -> None:
    """Assert every element of `actual` is within `max_ulps` grid steps of `expected`.

    Distances are `ulp_distance(actual, expected, fmt, scale=scale)`: NaN
    matches only NaN and an infinity only the same infinity. The failure
    message names the worst element: its index, both values with their bit
    patterns (in their own dtype and in `fmt`) and the distance.

    Args:
        actual: the values under test.
        expected: reference values (broadcastable with `actual`); they need not
            lie on the grid, e.g. a float64 exact result.
        fmt: the format whose grid measures the distance.
        max_ulps: largest distance allowed.
        scale: as in `ulp_distance`.
        err_msg: text put in front of the failure message.

    Raises:
        AssertionError: some element is farther than `max_ulps`.

    Examples:
        >>> import dtypes
        >>> assert_ulp_close([1.0, 2.0], [1.0078125, 2.0], dtypes.bfloat16, max_ulps=1)
        >>> assert_ulp_close([1.0], [1.015625], "bfloat16", max_ulps=1)
        Traceback (most recent call last):
        ...
        AssertionError: 1 of 1 elements differ by more than 1 ulp of bfloat16
          worst at index (0,): distance 2 ulps
          actual   = 1.0 (float64 bits 0x3FF0000000000000, bfloat16 bits 0x3F80)
          expected = 1.015625 (float64 bits 0x3FF0400000000000, bfloat16 bits 0x3F82)
    """
    fmt = dtypes.get(fmt)
    if not isinstance(err_msg, str):
        raise PrecisionTypeError(
            f"assert_ulp_close: err_msg must be a str, got {type(err_msg).__name__} "
            f"{err_msg!r:.60}; pass e.g. err_msg=f'step {{i}}'"
        )
    act = _as_float_array(actual, "actual")
    exp = _as_float_array(expected, "expected")
    _check_tolerance(max_ulps)
    dist = ulp_distance(act, exp, fmt, scale=scale)
    bad = dist > max_ulps
    if not bad.any():
        return
    act_b, exp_b = np.broadcast_arrays(act, exp)
    flat = int(np.argmax(dist))
    index = tuple(int(i) for i in np.unravel_index(flat, dist.shape)) if dist.ndim else ()
    worst = float(dist.reshape(-1)[flat])
    shown = f"{int(worst)}" if np.isfinite(worst) and worst == int(worst) else f"{worst:.6g}"
    unit = "ulps" if isinstance(fmt, FloatFormat) else "steps of the scale"
    code = fmt if scale is None else None  # a scaled value's own bits say nothing of its code
    if dist.ndim:
        head = f"{int(bad.sum())} of {bad.size} elements differ"
        where = f"  worst at index {index}: distance {shown} {unit}"
    else:
        head, where = "the value differs", f"  distance {shown} {unit}"
    lines = [
        f"{head} by more than {max_ulps:g} ulp of {fmt.name}",
        where,
        f"  actual   = {_describe(act_b, index, code)}",
        f"  expected = {_describe(exp_b, index, code)}",
    ]
    raise AssertionError((err_msg + "\n" if err_msg else "") + "\n".join(lines))


def assert_representable(
    x: Any, fmt: Format | str, *, scaling: dtypes.Scaling | None = None, limit: int = 5
) -> None:
    """Assert `x` lies exactly on `fmt`'s grid: `fmt.round(x)` gives `x` back bit for bit.

    NaN counts as representable (rounding keeps it NaN); ±0 must keep their
    sign. Integer formats are checked under their scaling (default
    per-tensor), as a whole array.

    Args:
        x: values (array-like, jax array or `precision.Tensor`).
        fmt: the format (a Format or a name).
        scaling: the scaling to check under (None: the format's default).
        limit: how many offending values the message lists.

    Raises:
        AssertionError: listing how many values are off the grid and the
            first `limit` of them with their nearest grid value.

    Examples:
        >>> import numpy as np
        >>> import dtypes
        >>> assert_representable(np.float32([1.0, 0.5, -448.0]), dtypes.float8_e4m3fn)
        >>> assert_representable(np.float32([1.0, 1.1]), "bfloat16")
        Traceback (most recent call last):
        ...
        AssertionError: 1 of 2 values are not on the bfloat16 grid:
          at (1,): 1.100000023841858 (float32 bits 0x3F8CCCCD) rounds to 1.1015625 (0x3F8D0000)
          round them onto the grid first: dtypes.get('bfloat16').round(x)
    """
    fmt = dtypes.get(fmt)
    if isinstance(limit, bool | np.bool_) or not isinstance(limit, int | np.integer):
        raise PrecisionTypeError(
            f"assert_representable: limit must be an int, got {type(limit).__name__} "
            f"{limit!r:.60}; pass e.g. limit=5"
        )
    if limit < 0:
        raise KitError(
            f"assert_representable: limit is how many values to list, got {limit}; pass e.g. "
            "limit=5 (or 0 to list none)"
        )
    arr = _as_float_array(x, "x")
    rounded = np.asarray(fmt.round(arr, scaling=scaling), arr.dtype)
    uint = np.uint32 if arr.dtype == np.float32 else np.uint64
    same = (arr.view(uint) == rounded.view(uint)) | (np.isnan(arr) & np.isnan(rounded))
    if same.all():
        return
    bad = np.argwhere(~same) if arr.ndim else np.zeros((1, 0), int)
    lines = [f"{int((~same).sum())} of {same.size} values are not on the {fmt.name} grid:"]
    for row in bad[:limit]:
        i = tuple(int(k) for k in row)
        v, r = np.asarray(arr[i]), np.asarray(rounded[i])
        lines.append(
            f"  at {i}: {v.item()!r} ({v.dtype} bits {_bits(v)}) rounds to "
            f"{r.item()!r} ({_bits(r)})"
        )
    if len(bad) > limit:
        lines.append(f"  … and {len(bad) - limit} more")
    lines.append(f"  round them onto the grid first: dtypes.get({fmt.name!r}).round(x)")
    raise AssertionError("\n".join(lines))
