"""Hypothesis properties of rounding, on data from `precision.testing` strategies.

Each format gets one jitted function that rounds a 64-element draw in every
mode, so a test compiles once per format, not once per example.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from checks import REGISTRY_FLOATS, assert_same_floats, fid
from hypothesis import given
from hypothesis import strategies as st

import dtypes
from dtypes import FloatFormat
from precision.testing import arrays, keys

MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down")
SYMMETRIC = ("nearest_even", "nearest_away", "toward_zero")
# the registry's reduced floats, plus an IEEE-style, a no-NaN and a saturating custom layout
FLOATS = [
    *REGISTRY_FLOATS,
    FloatFormat(3, 2),
    FloatFormat(2, 1, finite=True),
    FloatFormat(4, 3, finite=True, saturate=True),
]
INTS = [f for f in dtypes.FORMATS.values() if f.kind == "int"]
N = 32


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
@given(data=st.data())
def test_rounding_properties(fmt, data):
    """Idempotence, monotonicity, bracketing, sign symmetry and decode(encode(x)) == round(x)."""
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


@pytest.mark.parametrize("fmt", INTS, ids=fid)
@given(data=st.data())
def test_int_decode_of_encode_is_round(fmt, data):
    x = data.draw(arrays(fmt, shape=N, allow_nan=False, allow_infinity=False))
    key = data.draw(keys())
    out = _np(rounder(fmt)(x, key))
    for mode in (*MODES, "stochastic"):
        np.testing.assert_array_equal(out["e:" + mode], out[mode], err_msg=mode)


@pytest.mark.parametrize("fmt", INTS, ids=fid)
@given(data=st.data())
def test_int_rounding_twice_changes_nothing(fmt, data):
    """A rounded tensor is on its own grid: its absmax is ±qmax * scale."""
    x = data.draw(arrays(fmt, shape=N, allow_nan=False, allow_infinity=False))
    once = _np(rounder(fmt)(x, jax.random.key(0)))
    # (directed modes are not idempotent here: the re-derived scale may differ by an
    # ulp, and truncating 2.9999998 gives 2)
    for mode in ("nearest_even", "nearest_away"):
        twice = np.asarray(rounder(fmt)(once[mode], jax.random.key(0))[mode])
        # int1's scale is a float32 mean of |x|: its sum may move by a few ulps
        rtol = 1e-6 if fmt.binary else 2e-7
        np.testing.assert_allclose(twice, once[mode], rtol=rtol, atol=0, err_msg=mode)


def test_strategies_come_from_precision_testing():
    """The property tests above draw from the public kit, not a local copy."""
    import precision.testing

    assert arrays is precision.testing.arrays
    assert jnp.asarray(np.zeros(N, np.float32)).shape == (N,)
