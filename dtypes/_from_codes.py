"""`from_codes`: an integer encoding from codes an algorithm chose itself."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from ._codec import check_decodable, pack_encoded
from ._encoded import Encoded
from ._errors import FormatError, PrecisionTypeError
from ._format import Format
from ._inputs import is_tracer
from ._registry import get
from ._scaling import Scaling, scale_dtype

__all__ = ["from_codes"]


def from_codes(codes: Any, scale: Any, format: Any, scaling: Scaling) -> Encoded:
    """An `Encoded` of a symmetric integer `format` built from codes you computed.

    For algorithms that choose codes themselves (GPTQ's error-compensated
    rounding) rather than rounding each value to its nearest code: `codes` are
    integers within `±format.qmax` in the tensor's logical shape, `scale` the
    per-group scales shaped `scaling.scale_shape(codes.shape)` in the scale
    format's dtype (float32 unless `scaling.scale_format` says otherwise). The
    result decodes to `codes * scale`, is packed at the format's width and is
    checked as `decode` checks a hand-built encoding.

    Examples:
        >>> import numpy as np
        >>> import dtypes
        >>> enc = dtypes.from_codes(np.array([[3, -7, 0]]), np.array([[0.5]], np.float32),
        ...                         "int4", dtypes.PerAxis(0))
        >>> enc.decode().tolist(), enc.data.dtype.name
        ([[1.5, -3.5, 0.0]], 'uint8')
    """
    fmt = get(format) if isinstance(format, str) else format
    if not isinstance(fmt, Format) or fmt.kind != "int" or getattr(fmt, "binary", False):
        raise FormatError(
            f"from_codes builds symmetric integer encodings (int8, int4, int2), got {format!r}"
        )
    if not isinstance(scaling, Scaling):
        raise PrecisionTypeError(
            f"from_codes needs a Scaling (e.g. dtypes.PerAxis(0)), got {type(scaling).__name__}"
        )
    codes, scale = jnp.asarray(codes), jnp.asarray(scale)
    if not jnp.issubdtype(codes.dtype, jnp.integer):
        raise PrecisionTypeError(
            f"{fmt.name} codes must be integers, got dtype {codes.dtype}; round them first"
        )
    want = np.dtype(scale_dtype(scaling))
    if np.dtype(scale.dtype) != want:
        raise PrecisionTypeError(
            f"{fmt.name} scales under {scaling} are held as {want}, got {scale.dtype}"
        )
    qmax = int(getattr(fmt, "qmax", 0))
    if not is_tracer(codes) and codes.size:
        low, high = int(jnp.min(codes)), int(jnp.max(codes))
        if low < -qmax or high > qmax:
            raise FormatError(
                f"{fmt.name} codes lie within ±{qmax}, got {low if low < -qmax else high}"
            )
    codes = codes.astype(jnp.int8)
    enc = (
        pack_encoded(codes, scale, fmt, scaling)
        if fmt.packed
        else Encoded(codes, scale, fmt, scaling)
    )
    check_decodable(fmt, enc)
    return enc
