"""Shared format lists and comparison helpers for the tests of `dtypes`."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

import dtypes
from dtypes import FloatFormat

#: Reduced float formats of the registry (float32/float64 are tested apart).
REGISTRY_FLOATS = [
    f for f in dtypes.FORMATS.values() if f.kind == "float" and not f.is_full_precision
]

#: Custom layouts: odd widths, finite/saturating variants, the MX element types.
CUSTOM_FLOATS = [
    FloatFormat(3, 2),
    FloatFormat(2, 1, finite=True),  # MXFP4 element (OCP float4_e2m1fn)
    FloatFormat(2, 3, finite=True),  # OCP float6_e2m3fn
    FloatFormat(3, 2, finite=True),  # OCP float6_e3m2fn
    FloatFormat(4, 3, finite=True, saturate=True),
    FloatFormat(4, 3),  # IEEE-style e4m3 (with inf)
    FloatFormat(3, 4),
    FloatFormat(5, 2, saturate=True),
    FloatFormat(4, 0, finite=True, nan=False),
    FloatFormat(1, 2, finite=True),
    FloatFormat(6, 9),
    FloatFormat(8, 4),
]

ALL_FLOATS = REGISTRY_FLOATS + CUSTOM_FLOATS

#: Formats that ml_dtypes implements with the same layout and NaN/inf rules.
ML_DTYPES = {
    dtypes.bfloat16: ml_dtypes.bfloat16,
    dtypes.float16: np.float16,
    dtypes.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
    dtypes.float8_e5m2: ml_dtypes.float8_e5m2,
    FloatFormat(4, 3): ml_dtypes.float8_e4m3,
    FloatFormat(3, 4): ml_dtypes.float8_e3m4,
}


def fid(fmt) -> str:
    """Readable pytest id of a format."""
    return fmt.name


def bits32(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


def _hex(v) -> str:
    return f"{float(v)!r} (0x{int(np.float32(v).view(np.uint32)):08x})"


def assert_same_floats(actual, expected, inputs, what: str = "", *, nan_sign: bool = False):
    """Bitwise equality of float32 results; NaN is compared as NaN-ness.

    With `nan_sign`, a NaN must also keep its sign. The failure message shows
    the first few inputs with expected and actual bits.
    """
    actual = np.asarray(actual, np.float32)
    with np.errstate(invalid="ignore"):
        expected = np.asarray(expected, np.float64).astype(np.float32)
    inputs = np.asarray(inputs, np.float32)
    a_nan, e_nan = np.isnan(actual), np.isnan(expected)
    bad = np.where(e_nan, ~a_nan, bits32(actual) != bits32(expected))
    if nan_sign:
        bad |= e_nan & (np.signbit(actual) != np.signbit(expected))
    if bad.any():
        idx = np.flatnonzero(bad)[:8]
        rows = "\n".join(
            f"  x={_hex(inputs.flat[i])}: expected {_hex(expected.flat[i])}, "
            f"got {_hex(actual.flat[i])}"
            for i in idx
        )
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} differ, e.g.\n{rows}")


@functools.cache
def cached_input_set(fmt) -> np.ndarray:
    """The float32 input set of `fmt` (see `reference.input_set`), built once."""
    from reference import input_set, layout_of

    out = input_set(layout_of(fmt))
    out.setflags(write=False)
    return out


@functools.cache
def encodable_inputs(fmt) -> np.ndarray:
    """The input set without NaN where `fmt` has no NaN code (encode refuses it)."""
    x = cached_input_set(fmt)
    if not fmt.nan:
        x = x[~np.isnan(x)]
        x.setflags(write=False)
    return x


@functools.cache
def cached_reference(fmt, mode: str) -> np.ndarray:
    """Reference rounding of `encodable_inputs(fmt)` under `mode`, computed once."""
    from reference import layout_of, round_float

    out = round_float(encodable_inputs(fmt), layout_of(fmt), mode)
    out.setflags(write=False)
    return out
