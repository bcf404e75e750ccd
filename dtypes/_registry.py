"""The built-in formats and the one registry that resolves names and aliases.

Formats are data: this table drives `get`, the docs' format table and the
test parameters, so a new format is one new row.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from types import MappingProxyType

from ._errors import FormatError, PrecisionTypeError
from ._float import FloatFormat
from ._format import Format
from ._int import IntFormat

__all__ = [
    "ALIASES",
    "FORMATS",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float16",
    "float32",
    "float64",
    "get",
    "int1",
    "int2",
    "int4",
    "int8",
    "tf32",
]

float64 = FloatFormat(11, 52)
"""float64: IEEE double; a full-precision format (the logical dtype of 64-bit JAX)."""
float32 = FloatFormat(8, 23)
"""float32: IEEE single; the full-precision format of float32 tensors."""
bfloat16 = FloatFormat(8, 7)
"""bfloat16: 8 exponent and 7 mantissa bits; float32's range with about 3 significant digits."""
float16 = FloatFormat(5, 10)
"""float16: IEEE half, 5 exponent and 10 mantissa bits; max 65504."""
tf32 = FloatFormat(8, 10, name="tf32")
"""tf32: 8 exponent and 10 mantissa bits, in a float32 container (low 13 mantissa bits zero)."""
float8_e4m3fn = FloatFormat(4, 3, finite=True)
"""float8_e4m3fn: OCP FP8 E4M3; no infinities, one NaN code, max 448."""
float8_e5m2 = FloatFormat(5, 2)
"""float8_e5m2: OCP FP8 E5M2; IEEE-style with ±inf and NaN, max 57344."""
int8 = IntFormat(8)
"""int8: symmetric 8-bit integer codes in [-127, 127] with float32 scales."""
int4 = IntFormat(4)
"""int4: symmetric 4-bit codes in [-7, 7], two per byte, with float32 scales."""
int2 = IntFormat(2)
"""int2: ternary codes {-1, 0, 1}, four per byte, with float32 scales."""
int1 = IntFormat(1)
"""int1: binary ±1 codes (sign, 0 maps to +1), eight per byte, scale mean(|x|) per group."""

FORMATS: Mapping[str, Format] = MappingProxyType(
    {
        f.name: f
        for f in (
            float64,
            float32,
            bfloat16,
            float16,
            tf32,
            float8_e4m3fn,
            float8_e5m2,
            int8,
            int4,
            int2,
            int1,
        )
    }
)
"""Every built-in format, by canonical name, in table order (a read-only view)."""

ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "f64": "float64",
        "fp64": "float64",
        "double": "float64",
        "f32": "float32",
        "fp32": "float32",
        "single": "float32",
        "bf16": "bfloat16",
        "f16": "float16",
        "fp16": "float16",
        "half": "float16",
        "tensorfloat32": "tf32",
        "e4m3": "float8_e4m3fn",
        "e4m3fn": "float8_e4m3fn",
        "fp8": "float8_e4m3fn",
        "fp8_e4m3": "float8_e4m3fn",
        "e5m2": "float8_e5m2",
        "fp8_e5m2": "float8_e5m2",
        "binary": "int1",
    }
)
"""Other spellings people type, mapped to canonical names (matched case-insensitively;
a read-only view)."""


def get(name: str | Format) -> Format:
    """The format called `name` (canonical name or alias, any case).

    A `Format` is returned as it is, so APIs can accept either. Every
    format's own `.name` resolves to an equal format: the layout names
    `float{bits}_e{e}m{m}` with the suffixes `fn` / `fn_nan` / `fn_nonan`
    and `_sat` (see `FloatFormat`), and `_sat` after any float format's name.

    Raises:
        FormatError: `name` is not a known format; the message lists them
            (a `ValueError`).
        PrecisionTypeError: `name` is neither a string nor a Format (a `TypeError`).

    Examples:
        >>> get("bf16") is bfloat16
        True
        >>> get("e4m3").max
        448.0
        >>> get("float8_e4m3") == FloatFormat(4, 3), get("float6_e3m2fn").max
        (True, 28.0)
        >>> get("bfloat16_sat") == FloatFormat(8, 7, saturate=True)
        True
    """
    if isinstance(name, Format):
        return name
    if not isinstance(name, str):
        raise PrecisionTypeError(
            f"a format is a name like 'bfloat16' or a dtypes.Format, got {type(name).__name__} "
            f"{name!r}"
        )
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key)
    try:
        return FORMATS[key]
    except KeyError:
        pass
    from ._named import ENCODING_ALIASES, ENCODINGS

    encoding = ENCODINGS.get(ENCODING_ALIASES.get(key, key))
    if encoding is not None:
        return encoding
    fmt = _from_layout_name(key)
    if fmt is not None:
        return fmt
    known = ", ".join([*FORMATS, *ENCODINGS])
    aliases = ", ".join(ALIASES)
    names = [*FORMATS, *ENCODINGS, *ALIASES]
    close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
    guess = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
    raise FormatError(
        f"unknown format {name!r}{guess}; known formats: {known} (aliases: {aliases}), or build "
        "one with dtypes.FloatFormat(exponent_bits, mantissa_bits)"
    )


_LAYOUT_NAME = re.compile(r"float(\d+)_e(\d+)m(\d+)(fn|fn_nan|fn_nonan)?")


def _from_layout_name(key: str) -> Format | None:
    """The float format a derived name such as `float6_e3m2fn_sat` describes, or None."""
    if key.endswith("_sat"):
        base = FORMATS.get(ALIASES.get(key[:-4], key[:-4])) or _from_layout_name(key[:-4])
        if isinstance(base, FloatFormat) and not base.saturate:
            return FloatFormat(
                base.exponent_bits,
                base.mantissa_bits,
                finite=base.finite,
                nan=base.nan,
                saturate=True,
            )
        return None
    match = _LAYOUT_NAME.fullmatch(key)
    if match is None:
        return None
    bits, e, m = (int(g) for g in match.groups()[:3])
    suffix = match.group(4)
    if bits != 1 + e + m:
        return None
    finite = suffix is not None
    nan = None if suffix in (None, "fn") else suffix == "fn_nan"
    try:
        fmt = FloatFormat(e, m, finite=finite, nan=nan)
    except ValueError:
        return None
    # only a name the layout would be given itself (no second spelling of one layout)
    return fmt if fmt.name == key else None
