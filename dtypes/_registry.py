"""The one registry: every built-in format and named encoding, its aliases, and `get`.

Each built-in format is one row of `_ENTRIES`: the format, the public table
that lists it (`FORMATS`, the element formats, or `ENCODINGS`, the named
encodings) and the other spellings people type for it. Every table `dtypes`
publishes is a read-only view of those rows: `REGISTRY` (all of them),
`FORMATS`, `ENCODINGS`, `ALIASES` and `ENCODING_ALIASES`. A new built-in
format is one new row.

`get` is the one resolver of format names: `precision` calls it wherever a
format may be given by name (a Tensor's conversion, `apply(compute=)`,
`Policy`, `Contract`), so a bad name or a value of the wrong type raises the
same error, with the same message, everywhere.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from . import _named_encodings
from ._asymmetric import uint4, uint8
from ._codebook import nf4
from ._e8m0 import float8_e8m0fnu
from ._errors import FormatError, FormatTypeError
from ._float import FloatFormat
from ._format import Format
from ._int import IntFormat

__all__ = [
    "ALIASES",
    "ENCODINGS",
    "ENCODING_ALIASES",
    "FORMATS",
    "REGISTRY",
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


class _Entry(NamedTuple):
    """One row of the registry."""

    format: Format
    table: Literal["FORMATS", "ENCODINGS"]  # the public view that lists it
    aliases: tuple[str, ...] = ()  # other spellings, lower case


_ENTRIES = (
    _Entry(float64, "FORMATS", ("f64", "fp64", "double")),
    _Entry(float32, "FORMATS", ("f32", "fp32", "single")),
    _Entry(bfloat16, "FORMATS", ("bf16",)),
    _Entry(float16, "FORMATS", ("f16", "fp16", "half")),
    _Entry(tf32, "FORMATS", ("tensorfloat32",)),
    _Entry(float8_e4m3fn, "FORMATS", ("e4m3", "e4m3fn", "fp8", "fp8_e4m3")),
    _Entry(float8_e5m2, "FORMATS", ("e5m2", "fp8_e5m2")),
    _Entry(int8, "FORMATS"),
    _Entry(int4, "FORMATS"),
    _Entry(int2, "FORMATS"),
    _Entry(int1, "FORMATS", ("binary",)),
    _Entry(_named_encodings.float4_e2m1fn, "ENCODINGS", ("e2m1",)),
    _Entry(_named_encodings.float6_e2m3fn, "ENCODINGS"),
    _Entry(_named_encodings.float6_e3m2fn, "ENCODINGS"),
    _Entry(_named_encodings.float8_e4m3, "ENCODINGS"),
    _Entry(_named_encodings.float8_e3m4, "ENCODINGS"),
    _Entry(float8_e8m0fnu, "ENCODINGS", ("e8m0",)),
    _Entry(_named_encodings.mxfp8_e4m3, "ENCODINGS", ("mxfp8",)),
    _Entry(_named_encodings.mxfp8_e5m2, "ENCODINGS"),
    _Entry(_named_encodings.mxfp6_e3m2, "ENCODINGS"),
    _Entry(_named_encodings.mxfp6_e2m3, "ENCODINGS"),
    _Entry(_named_encodings.mxfp4, "ENCODINGS"),
    _Entry(_named_encodings.mxint8, "ENCODINGS"),
    _Entry(_named_encodings.nvfp4, "ENCODINGS"),
    _Entry(nf4, "ENCODINGS"),
    _Entry(uint8, "ENCODINGS"),
    _Entry(uint4, "ENCODINGS"),
)

REGISTRY: Mapping[str, Format] = MappingProxyType({e.format.name: e.format for e in _ENTRIES})
"""Every built-in format and named encoding by canonical name, `FORMATS` first, then
`ENCODINGS`, in table order (a read-only view). `get` resolves each name here."""

_ALIASES: Mapping[str, str] = MappingProxyType(
    {alias: e.format.name for e in _ENTRIES for alias in e.aliases}
)

FORMATS: Mapping[str, Format] = MappingProxyType(
    {e.format.name: e.format for e in _ENTRIES if e.table == "FORMATS"}
)
"""Every built-in element format, by canonical name, in table order (a read-only view).

The rows of `REGISTRY` that are not named encodings (`ENCODINGS`)."""

ENCODINGS: Mapping[str, Format] = MappingProxyType(
    {e.format.name: e.format for e in _ENTRIES if e.table == "ENCODINGS"}
)
"""Named encodings beyond `FORMATS`: ml_dtypes layouts, E8M0, MX/NVFP4, NF4, uint8/uint4.

The rows of `REGISTRY` that `FORMATS` does not list (a read-only view); see `_named_encodings`
for what each is."""

ALIASES: Mapping[str, str] = MappingProxyType(
    {alias: name for alias, name in _ALIASES.items() if name in FORMATS}
)
"""Other spellings people type for `FORMATS`, mapped to canonical names (matched
case-insensitively; a read-only view of the registry's one alias table)."""

ENCODING_ALIASES: Mapping[str, str] = MappingProxyType(
    {alias: name for alias, name in _ALIASES.items() if name in ENCODINGS}
)
"""Other spellings of `ENCODINGS` names (matched case-insensitively; a read-only view
of the registry's one alias table)."""


def get(name: str | Format) -> Format:
    """The format called `name` (canonical name or alias, any case).

    A `Format` is returned as it is, so APIs can accept either. Every name of
    `REGISTRY` resolves, with every alias of `ALIASES` and
    `ENCODING_ALIASES`; so does every format's own `.name`: the layout names
    `float{bits}_e{e}m{m}` with the suffixes `fn` / `fn_nan` / `fn_nonan` and
    `_sat` (see `FloatFormat`), and `_sat` after any unscaled float format's
    name. This is the one resolver: `precision` resolves every format
    argument through it, so each bad argument gets the same error everywhere.

    Raises:
        FormatError: `name` is not a known format; the message lists them
            (a `ValueError`).
        PrecisionTypeError: `name` is neither a string nor a Format (a
            `TypeError`; also a `FormatError`, as every bad format argument is).

    Examples:
        >>> get("bf16") is bfloat16
        True
        >>> get("e4m3").max
        448.0
        >>> get("float8_e4m3") == FloatFormat(4, 3), get("float6_e3m2fn").max
        (True, 28.0)
        >>> get("bfloat16_sat") == FloatFormat(8, 7, saturate=True)
        True
        >>> get("MXFP4") is REGISTRY["mxfp4"]
        True
    """
    if isinstance(name, Format):
        return name
    if not isinstance(name, str):
        raise FormatTypeError(
            f"a format is a name like 'bfloat16' or a dtypes.Format, got {type(name).__name__} "
            f"{name!r:.80}"
        )
    key = name.strip().lower().replace("-", "_")
    fmt = REGISTRY.get(_ALIASES.get(key, key)) or _from_layout_name(key)
    if fmt is not None:
        return fmt
    known = ", ".join(REGISTRY)
    aliases = ", ".join(_ALIASES)
    close = difflib.get_close_matches(key, [*REGISTRY, *_ALIASES], n=3, cutoff=0.6)
    guess = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
    rule = f"unknown format {name!r}{guess}; known formats: {known} (aliases: {aliases})"
    raise FormatError(
        f"{rule}, or build one with dtypes.FloatFormat(exponent_bits, mantissa_bits)", rule=rule
    )


_LAYOUT_NAME = re.compile(r"float(\d+)_e(\d+)m(\d+)(fn|fn_nan|fn_nonan)?")


def _from_layout_name(key: str) -> Format | None:
    """The float format a derived name such as `float6_e3m2fn_sat` describes, or None."""
    if key.endswith("_sat"):
        base: Any = REGISTRY.get(_ALIASES.get(key[:-4], key[:-4])) or _from_layout_name(key[:-4])
        if isinstance(base, FloatFormat) and not base.saturate and base.scaling is None:
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
