"""Hypothesis properties of rounding, on data from `precision.testing` strategies.

Each format gets one jitted function that rounds a draw in every mode, so a test
compiles once per format, not once per example. The formats are the registry's,
chosen by the rules below (`checks.registry`).
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from checks import (
    REGISTRY_FLOATS,
    assert_covers,
    assert_same_floats,
    examples,
    fid,
    reduced_float,
    registry,
)
from hypothesis import given
from hypothesis import strategies as st

import dtypes
from dtypes import FloatFormat
from precision.testing import arrays, keys

MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down")
SYMMETRIC = ("nearest_even", "nearest_away", "toward_zero")
# the registry's reduced floats (no-NaN fp4/fp6 among them), an IEEE-style and a
# saturating custom layout
FLOATS = [*REGISTRY_FLOATS, FloatFormat(3, 2), FloatFormat(4, 3, finite=True, saturate=True)]
N = 32


def symmetric_int(f) -> bool:
    """Integer codes symmetric about zero under an absmax scale (mxint8's per block of 32):
    the zero-point ("uint") and code-book kinds keep no such grid."""
    return f.kind == "int"


def scaled_storage(f) -> bool:
    """Every entry whose rounding is not an unscaled float grid's (those are FLOATS above,
    where storage is one of the properties): integers, scaled floats, zero-point integers,
    code books, E8M0. float32/float64 store their input as it is."""
    return not reduced_float(f) and not f.is_full_precision


INTS = registry(symmetric_int)
SCALED = registry(scaled_storage)


@functools.cache
def everything(fmt):
    """jit(x, xs, key) -> every rounding the properties need, for one draw, in one call.

    `r:<mode>` = round(x), `rr:<mode>` = round(round(x)), `n:<mode>` = round(-x) (`neg`,
    negated on the host: a GPU's negation of NaN inside a program gives any NaN),
    `s:<mode>` = round(xs) (x sorted), `e:<mode>` = decode(encode(x)); stochastic shares `key`.
    """

    def f(x, xs, neg, key):
        out = {}
        for m in (*MODES, "stochastic"):
            k = key if m == "stochastic" else None
            r = fmt.round(x, rounding=m, key=k)
            out[f"r:{m}"] = r
            out[f"rr:{m}"] = fmt.round(r, rounding=m, key=k)
            out[f"n:{m}"] = fmt.round(neg, rounding=m, key=k)
            out[f"s:{m}"] = fmt.round(xs, rounding=m, key=k)
            out[f"e:{m}"] = fmt.encode(x, rounding=m, key=k).decode()
        return out

    return jax.jit(f)


def _data(fmt):
    # formats without a NaN code cannot store NaN (encode refuses it)
    return arrays(fmt, shape=N, allow_nan=bool(fmt.nan))


@pytest.mark.parametrize("fmt", FLOATS, ids=fid)
def test_rounding_properties(fmt):
    """Idempotence, monotonicity, bracketing, sign symmetry and decode(encode(x)) == round(x)."""
    examples(fmt)(given(data=st.data())(_rounding_properties))(fmt)


def _rounding_properties(fmt, data):
    x = data.draw(_data(fmt))
    key = data.draw(keys())
    # sorted by numpy: XLA's CPU sort compares float32 subnormals as zero
    xs = np.sort(x)  # NaN last
    out = {k: np.asarray(v) for k, v in everything(fmt)(x, xs, -x, key).items()}
    name = fmt.name

    # idempotence: a rounded value is on the grid, so rounding it again changes nothing
    for m in (*MODES, "stochastic"):
        assert_same_floats(out[f"rr:{m}"], out[f"r:{m}"], x, f"{name} {m} twice", nan_sign=True)

    # monotone: x <= y  =>  round(x) <= round(y), for the deterministic modes
    for m in MODES:
        r = out[f"s:{m}"]
        ok = ~np.isnan(r)
        # NaN only for NaN input, or where a format without infinity overflowed
        assert np.all(np.isnan(xs[~ok]) | (np.abs(xs[~ok]) > fmt.max)), f"{name} {m}: NaN"
        r = r[ok]
        assert np.all(r[1:] >= r[:-1]), f"{name} {m} not monotone: {xs[ok]} -> {r}"

    # down(x) <= x <= up(x); |toward_zero(x)| <= |x|; every mode picks a neighbour
    # (beyond ±max a format without infinity, or a saturating one, clamps to ±max)
    down, up, tz = out["r:down"], out["r:up"], out["r:toward_zero"]
    finite = np.isfinite(x)
    in_range = finite & (np.abs(x) <= fmt.max)
    ok = in_range | (finite & fmt.has_inf & (not fmt.saturate))
    with np.errstate(invalid="ignore"):
        assert np.all((down <= x) | ~ok), f"{name} down(x) > x"
        assert np.all((x <= up) | ~ok), f"{name} up(x) < x"
        assert np.all((np.abs(tz) <= np.abs(x)) | ~finite), f"{name} |toward_zero(x)| > |x|"
    for m in ("nearest_even", "nearest_away", "toward_zero", "stochastic"):
        r = out[f"r:{m}"][in_range]
        assert np.all((r == down[in_range]) | (r == up[in_range])), f"{name} {m}: not a neighbour"

    # sign symmetry of the symmetric modes; up and down mirror each other
    for m in SYMMETRIC:
        assert_same_floats(out[f"n:{m}"], -out[f"r:{m}"], x, f"{name} {m}(-x)", nan_sign=True)
    assert_same_floats(out["n:up"], -out["r:down"], x, f"{name} up(-x) vs -down(x)")
    assert_same_floats(out["n:down"], -out["r:up"], x, f"{name} down(-x) vs -up(x)")

    # storage holds exactly the rounded value, in every mode
    for m in (*MODES, "stochastic"):
        assert_same_floats(out[f"e:{m}"], out[f"r:{m}"], x, f"{name} {m} stored", nan_sign=True)


def _np(d):
    return {k: np.asarray(v) for k, v in d.items()}


@functools.cache
def rounder(fmt):
    """jit(x, key) -> {mode: round(x)} and {"e:" + mode: decode(encode(x))}."""

    def f(x, key):
        out = {}
        for m in (*MODES, "stochastic"):
            k = key if m == "stochastic" else None
            out[m] = fmt.round(x, rounding=m, key=k)
            out["e:" + m] = fmt.encode(x, rounding=m, key=k).decode()
        return out

    return jax.jit(f)


# A code book rounds to nearest or stochastically, E8M0 to nearest only (docs/formats.md).
_MODES_OF_KIND = {"codebook": ("nearest_even", "stochastic"), "scale": ("nearest_even",)}
_HUNT = os.environ.get("HYPOTHESIS_PROFILE") == "hunt"


def _modes(fmt) -> tuple[str, ...]:
    """Every mode `fmt` takes; outside the hunt profile only the first, unless `fmt` is a
    symmetric integer format without a scaling of its own. A format's cost here is the
    compile of its program of every mode (a dozen kernels; several seconds for uint8 or
    nvfp4), and the directed modes of the others are checked against references of their
    own (the exact oracle for MX in test_oracle_rounding.py, test_asymmetric.py, ...)."""
    modes = _MODES_OF_KIND.get(fmt.kind, (*MODES, "stochastic"))
    if _HUNT or (symmetric_int(fmt) and fmt.scaling is None):
        return modes
    return modes[:1]


def _keeps_its_scale(fmt) -> bool:
    """Whether a rounded block gets back the scale it had, so rounding twice is exact: a
    power-of-two scale (MX), a code book's absmax (kept by its code ±1), no scale (E8M0).
    A float32 scale re-derived from a rounded block (absmax/qmax, NVFP4's two levels, a
    zero point) may move by an ulp."""
    scaling = fmt.default_scaling()
    return scaling is None or scaling.power_of_two or fmt.kind == "codebook"


def _length(fmt) -> int:
    scaling = fmt.default_scaling()
    return 2 * scaling.size if isinstance(scaling, dtypes.PerBlock) else N  # two whole blocks


@functools.cache
def stored(fmt):
    """jit(x, neg, key) -> round and decode(encode) in `_modes(fmt)`, with round twice where
    the scale is kept and round(-x) for scaled floats."""

    def f(x, neg, key):
        out = {}
        for m in _modes(fmt):
            k = key if m == "stochastic" else None
            out[f"r:{m}"] = r = fmt.round(x, rounding=m, key=k)
            out[f"e:{m}"] = fmt.encode(x, rounding=m, key=k).decode()
            if _keeps_its_scale(fmt):
                out[f"rr:{m}"] = fmt.round(r, rounding=m, key=k)
            if fmt.kind == "float" and m in SYMMETRIC:
                out[f"n:{m}"] = fmt.round(neg, rounding=m, key=k)
        return out

    return jax.jit(f)


@pytest.mark.parametrize("fmt", SCALED, ids=fid)
def test_storage_holds_the_rounded_value(fmt):
    """decode(encode(x)) == round(x) in every mode the format takes; rounding twice changes
    nothing where the scale is kept; scaled floats round -x to -round(x)."""
    examples(fmt)(given(data=st.data())(_storage_holds_the_rounded_value))(fmt)


def _storage_holds_the_rounded_value(fmt, data):
    # `arrays` models float and integer grids; the other kinds take any float32 data
    like = fmt if fmt.kind in ("float", "int") else dtypes.float32
    x = data.draw(arrays(like, shape=_length(fmt), allow_nan=False, allow_infinity=False))
    out = _np(stored(fmt)(x, -x, data.draw(keys())))
    name = fmt.name
    for m in _modes(fmt):
        assert_same_floats(out[f"e:{m}"], out[f"r:{m}"], x, f"{name} {m} stored")
        if f"rr:{m}" in out:
            assert_same_floats(out[f"rr:{m}"], out[f"r:{m}"], x, f"{name} {m} twice")
        if f"n:{m}" in out:  # a block's scale is that of |x|
            assert_same_floats(out[f"n:{m}"], -out[f"r:{m}"], x, f"{name} {m}(-x)")


@pytest.mark.parametrize("fmt", INTS, ids=fid)
def test_int_rounding_twice_changes_nothing(fmt):
    """A rounded tensor is on its own grid: its absmax is ±qmax * scale."""
    examples(fmt)(given(data=st.data())(_int_rounding_twice_changes_nothing))(fmt)


def _int_rounding_twice_changes_nothing(fmt, data):
    x = data.draw(arrays(fmt, shape=N, allow_nan=False, allow_infinity=False))
    once = _np(rounder(fmt)(x, jax.random.key(0)))
    # (directed modes are not idempotent here: the re-derived scale may differ by an
    # ulp, and truncating 2.9999998 gives 2)
    for mode in ("nearest_even", "nearest_away"):
        twice = np.asarray(rounder(fmt)(once[mode], jax.random.key(0))[mode])
        # int1's scale is a float32 mean of |x|: its sum may move by a few ulps
        rtol = 1e-6 if fmt.binary else 2e-7
        np.testing.assert_allclose(twice, once[mode], rtol=rtol, atol=0, err_msg=mode)


def test_the_per_format_tests_run_over_every_registry_entry_their_rule_admits():
    assert_covers(test_rounding_properties, reduced_float)
    assert_covers(test_int_rounding_twice_changes_nothing, symmetric_int)
    assert_covers(test_storage_holds_the_rounded_value, scaled_storage)
    # between them, every entry but float32/float64 (which store their input) is taken
    taken = {f.name for f in [*FLOATS, *SCALED]}
    assert [n for n, f in dtypes.REGISTRY.items() if n not in taken] == [
        n for n, f in dtypes.REGISTRY.items() if f.is_full_precision
    ]


def test_strategies_come_from_precision_testing():
    """The property tests above draw from the public kit, not a local copy."""
    import precision.testing

    assert arrays is precision.testing.arrays
    assert jnp.asarray(np.zeros(N, np.float32)).shape == (N,)
