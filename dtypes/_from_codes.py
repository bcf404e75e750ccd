"""`from_codes`: an integer encoding from codes an algorithm chose itself."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from ._codec import check_decodable, pack_encoded
from ._encode_input_checks import is_tracer
from ._encoded import Encoded
from ._errors import FormatError, PrecisionTypeError
from ._format import Format
from ._packing import pack
from ._registry import get
from ._scaling import Scaling, scale_dtype

__all__ = ["from_codes"]


def from_codes(
    codes: Any, scale: Any, format: Any, scaling: Scaling, *, zero_point: Any = None
) -> Encoded:
    """An `Encoded` of an integer `format` built from codes you computed.

    For algorithms that choose codes themselves (GPTQ's error-compensated
    rounding) rather than rounding each value to its nearest code: `codes` are
    integers in the tensor's logical shape, within `±format.qmax` for a
    symmetric format (int8, int4, int2) and within `[0, format.qmax]` for an
    asymmetric one (uint8, uint4), which also takes its `zero_point`s (one per
    group, within the same range); `scale` holds the per-group scales shaped
    `scaling.scale_shape(codes.shape)` in the scale format's dtype (float32
    unless `scaling.scale_format` says otherwise). The result decodes to
    `codes * scale` (or `(codes - zero_point) * scale`), is packed at the
    format's width and is checked as `decode` checks a hand-built encoding.

    Examples:
        >>> import numpy as np
        >>> import dtypes
        >>> enc = dtypes.from_codes(np.array([[3, -7, 0]]), np.array([[0.5]], np.float32),
        ...                         "int4", dtypes.PerAxis(0))
        >>> enc.decode().tolist(), enc.data.dtype.name
        ([[1.5, -3.5, 0.0]], 'uint8')
        >>> enc = dtypes.from_codes(np.array([[0, 4, 15]]), np.array([[0.5]], np.float32),
        ...                         "uint4", dtypes.PerAxis(0), zero_point=np.array([[4]]))
        >>> enc.decode().tolist()
        [[-2.0, 0.0, 5.5]]
    """
    fmt = get(format) if isinstance(format, str) else format
    asymmetric = isinstance(fmt, Format) and fmt.kind == "uint"
    symmetric = isinstance(fmt, Format) and fmt.kind == "int" and not getattr(fmt, "binary", False)
    if not (symmetric or asymmetric):
        raise FormatError(
            "from_codes builds integer encodings (int8, int4, int2; uint8, uint4 with zero "
            f"points), got {format!r}"
        )
    if not isinstance(scaling, Scaling):
        raise PrecisionTypeError(
            f"from_codes needs a Scaling (e.g. dtypes.PerAxis(0)), got {type(scaling).__name__}"
        )
    if asymmetric == (zero_point is None):
        raise FormatError(
            f"{fmt.name} "
            + ("needs its zero points: pass zero_point=" if asymmetric else "has no zero points")
        )
    qmax = int(getattr(fmt, "qmax", 0))
    low, high = (0, qmax) if asymmetric else (-qmax, qmax)
    codes = _array(codes, f"{fmt.name} codes", f"integers within [{low}, {high}]")
    scale = _array(scale, f"{fmt.name} scales", "numbers, e.g. np.array([[0.5]], np.float32)")
    want = np.dtype(scale_dtype(scaling))
    if np.dtype(scale.dtype) != want:
        raise PrecisionTypeError(
            f"{fmt.name} scales under {scaling} are held as {want}, got {scale.dtype}"
        )
    codes = _checked_ints(codes, low, high, f"{fmt.name} codes")
    if not asymmetric:
        codes = codes.astype(jnp.int8)
        enc = (
            pack_encoded(codes, scale, fmt, scaling)
            if fmt.packed
            else Encoded(codes, scale, fmt, scaling)
        )
    else:
        what = f"{fmt.name} zero points"
        zp = _checked_ints(
            _array(zero_point, what, f"integers within [{low}, {high}]"), low, high, what
        )
        codes = codes.astype(jnp.uint8)
        bits = fmt.code_bits
        data = codes if bits == 8 else pack(codes.reshape(codes.shape or (1,)), bits)
        last = None if (not codes.shape or bits == 8) else codes.shape[-1]
        enc = Encoded(data, scale, fmt, scaling, last, zero_point=zp.astype(jnp.uint8))
    check_decodable(fmt, enc)
    return enc


def _array(values: Any, what: str, expected: str) -> Any:
    """`values` as a JAX array, or a `PrecisionTypeError` naming what was given."""
    try:
        return jnp.asarray(values)
    except (TypeError, ValueError, OverflowError):  # a string, a ragged list, 2**63
        raise PrecisionTypeError(
            f"from_codes takes {what} as an array of {expected}, got {type(values).__name__} "
            f"{values!r:.60}"
        ) from None


def _checked_ints(values: Any, low: int, high: int, what: str) -> Any:
    if not jnp.issubdtype(values.dtype, jnp.integer):
        raise PrecisionTypeError(
            f"{what} must be integers, got dtype {values.dtype}; round them first"
        )
    if not is_tracer(values) and values.size:
        lo, hi = int(jnp.min(values)), int(jnp.max(values))
        if lo < low or hi > high:
            raise FormatError(f"{what} lie within [{low}, {high}], got {lo if lo < low else hi}")
    return values
