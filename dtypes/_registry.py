"""The built-in formats and the one registry that resolves names and aliases.

Formats are data: this table drives `get`, the docs' format table and the
test parameters, so a new format is one new row.
"""

from __future__ import annotations

from ._formats import FloatFormat, Format, IntFormat

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

FORMATS: dict[str, Format] = {
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
"""Every built-in format, by canonical name, in table order."""

ALIASES: dict[str, str] = {
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
"""Other spellings people type, mapped to canonical names (matched case-insensitively)."""


def get(name: str | Format) -> Format:
    """The format called `name` (canonical name or alias, any case).

    A `Format` is returned as it is, so APIs can accept either.

    Raises:
        ValueError: `name` is not a known format; the message lists them.
        TypeError: `name` is neither a string nor a Format.

    Examples:
        >>> get("bf16") is bfloat16
        True
        >>> get("e4m3").max
        448.0
    """
    if isinstance(name, Format):
        return name
    if not isinstance(name, str):
        raise TypeError(
            f"a format is a name like 'bfloat16' or a dtypes.Format, got {type(name).__name__} "
            f"{name!r}"
        )
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key)
    try:
        return FORMATS[key]
    except KeyError:
        known = ", ".join(FORMATS)
        aliases = ", ".join(ALIASES)
        raise ValueError(
            f"unknown format {name!r}; known formats: {known} (aliases: {aliases}), or build "
            "one with dtypes.FloatFormat(exponent_bits, mantissa_bits)"
        ) from None
