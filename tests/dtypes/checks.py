"""Shared format lists and comparison helpers for the tests of `dtypes`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import settings

import dtypes
from dtypes import FloatFormat


def registry(keep: Callable[[Any], bool]) -> list[Any]:
    """The entries of `dtypes.REGISTRY` that the rule `keep` admits, in registry order.

    Every per-format list of these tests is such a rule (on `kind`, `bits`,
    `scaling`, ...), never a list of names: a format added to the registry runs
    every test whose rule admits it. Each rule's docstring says why the other
    entries cannot take the test.
    """
    chosen = [f for f in dtypes.REGISTRY.values() if keep(f)]
    if not chosen:
        raise AssertionError(f"{keep.__name__} admits no entry of dtypes.REGISTRY")
    return chosen


def reduced_float(f) -> bool:
    """An unscaled float layout narrower than float32: float32 rounds as the identity
    (tested apart) and float64's grid cannot be enumerated; a scaled encoding rounds a
    block by its scale (test_mx_nvfp4.py, test_oracle_rounding.py)."""
    return f.kind == "float" and f.scaling is None and not f.is_full_precision


def same_named_type(f):
    """numpy's or ml_dtypes' scalar type of the name `f` has, or None (the reference)."""
    return getattr(ml_dtypes, f.name, None) or getattr(np, f.name, None)


def fills_its_bytes(f) -> bool:
    """A reduced float that numpy/ml_dtypes implements in whole bytes (so it is stored as
    that type); ml_dtypes' 4- and 6-bit types hold one code per byte, which the formats
    pack, and are compared with it in test_mx_nvfp4.py."""
    t = same_named_type(f)
    return reduced_float(f) and t is not None and 8 * np.dtype(t).itemsize == f.bits


#: Reduced float formats of the registry (float32/float64 are tested apart).
REGISTRY_FLOATS = registry(reduced_float)

#: Custom layouts: odd widths, finite/saturating variants (the registry's own layouts,
#: the OCP fp4/fp6 and IEEE-style e4m3/e3m4 among them, come from REGISTRY_FLOATS).
CUSTOM_FLOATS = [
    FloatFormat(3, 2),
    FloatFormat(4, 3, finite=True, saturate=True),
    FloatFormat(5, 2, saturate=True),
    FloatFormat(4, 0, finite=True, nan=False),
    FloatFormat(1, 2, finite=True),
    FloatFormat(6, 9),
    FloatFormat(8, 4),
]

# (a custom layout the registry gains later runs once, as the registry's)
ALL_FLOATS = REGISTRY_FLOATS + [f for f in CUSTOM_FLOATS if f not in REGISTRY_FLOATS]

#: Formats that numpy or ml_dtypes implements under the same name, one code per type.
ML_DTYPES = {f: same_named_type(f) for f in registry(fills_its_bytes)}


def examples(fmt, share: int = 1) -> settings:
    """Hypothesis settings for one format: the profile's examples divided by `share`, and a
    fifth of those (at least 10) for a named encoding (`dtypes.ENCODINGS`), as the
    plugin's own strategy tests do: each adds compiles, and its elements are a grid that
    other entries' draws share."""
    n = max(10, settings.default.max_examples // share)
    if fmt.name in dtypes.ENCODINGS:
        n = max(10, n // 5)
    return settings(max_examples=n)


_PARAM = type(pytest.param(None))


def params_of(test, argname: str = "fmt") -> list[Any]:
    """The values a test function is parametrized with for `argname` (its own marks)."""
    out: list[Any] = []
    for mark in getattr(test, "pytestmark", []):
        if mark.name == "formats":
            from precision.testing._plugin import selected_formats

            out += selected_formats(*mark.args, **mark.kwargs)
        if mark.name != "parametrize":
            continue
        names = mark.args[0]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        if argname not in names:
            continue
        i = names.index(argname)
        for v in mark.args[1]:
            if isinstance(v, _PARAM):  # pytest.param(...)
                v = v.values if len(names) > 1 else v.values[0]
            out.append(v[i] if len(names) > 1 else v)
    return out


def assert_covers(test, keep: Callable[[Any], bool], argname: str = "fmt") -> None:
    """`test` runs over exactly the registry entries that `keep` admits (customs aside).

    So a rule cannot be narrowed by a list kept beside it, and an entry the registry
    gains is run or stated out by the rule, never silently skipped.
    """
    params = params_of(test, argname)
    if params and isinstance(params[0], str):
        params = [dtypes.get(n) for n in params]
    ran = [f.name for f in dtypes.REGISTRY.values() if f in params]
    want = [f.name for f in registry(keep)]
    assert ran == want, (
        f"{test.__name__} runs over {ran}; {keep.__name__} admits {want}"
        f" (missing {sorted(set(want) - set(ran))}, not admitted {sorted(set(ran) - set(want))})"
    )


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
