"""Custom float layouts without a numpy type are stored as their own bit codes.

The reference is ml_dtypes, which implements the OCP float6/float4 element
types; our formats of the same layout must decode every code identically and
encode finite float32 values to the same codes (both round to nearest even
and saturate, having no infinity).
"""

import functools

import jax
import numpy as np
import pytest
from checks import assert_covers, reduced_float, registry, same_named_type
from hypothesis import given
from hypothesis import strategies as st

import dtypes
from dtypes import FloatFormat


def packed_ml_layout(f) -> bool:
    """A reduced float narrower than a byte that ml_dtypes implements under its name (the
    OCP fp4/fp6 element types): wider ones are compared in test_float_rounding.py."""
    return reduced_float(f) and f.bits < 8 and same_named_type(f) is not None


OCP_SMALL = [pytest.param(f, same_named_type(f), id=f.name) for f in registry(packed_ml_layout)]


@pytest.mark.parametrize(("fmt", "native"), OCP_SMALL)
def test_every_code_decodes_like_ml_dtypes(fmt, native):
    codes = np.arange(2**fmt.bits, dtype=np.uint8)
    expected = codes.view(native).astype(np.float32)
    packed = fmt.packed
    # Build the encoding from the codes through encode itself: the decoded
    # values must come back as the same codes and the same values.
    enc = fmt.encode(expected)
    assert enc.data.dtype == np.uint8
    # packed densely: 4-bit codes two a byte, 6-bit ones four in three bytes
    assert enc.data.size == (len(codes) * fmt.bits + 7) // 8 if packed else len(codes)
    got = np.asarray(enc.decode())
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize(("fmt", "native"), OCP_SMALL)
def test_encode_matches_ml_dtypes_on_midpoints_and_beyond(fmt, native):
    grid = np.unique(np.arange(2**fmt.bits, dtype=np.uint8).view(native).astype(np.float64))
    mids = (grid[1:] + grid[:-1]) / 2
    x = np.concatenate(
        [
            grid,
            mids,
            np.nextafter(mids.astype(np.float32), np.float32(np.inf)),
            np.nextafter(mids.astype(np.float32), np.float32(-np.inf)),
            [fmt.max * 1.5, -fmt.max * 3, 1e30, -1e30, np.inf, -np.inf, 0.0, -0.0],
        ]
    ).astype(np.float32)
    expected = x.astype(native).astype(np.float32)
    # under jit, as ml_dtypes: ±inf saturates to ±max (these formats have neither)
    got = np.asarray(jax.jit(lambda a: fmt.encode(a).decode())(x))
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
    # eagerly every finite value too, and ±inf is refused rather than changed
    finite = np.isfinite(x)
    got = np.asarray(fmt.encode(x[finite]).decode())
    np.testing.assert_array_equal(got.view(np.uint32), expected[finite].view(np.uint32))
    with pytest.raises(dtypes.NonFiniteError, match="saturate=True"):
        fmt.encode(x)


@pytest.mark.parametrize(("fmt", "native"), OCP_SMALL)
@given(st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=33))
def test_encode_matches_ml_dtypes_on_random_floats(fmt, native, values):
    x = np.resize(np.array(values, np.float32), 33)  # one shape: one compilation
    expected = x.astype(native).astype(np.float32)
    got = np.asarray(_jitted_round_trip(fmt)(x))
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


@functools.cache
def _jitted_round_trip(fmt):
    return jax.jit(lambda a: fmt.encode(a).decode())


def test_the_per_format_tests_run_over_every_registry_entry_their_rule_admits():
    for test in (
        test_every_code_decodes_like_ml_dtypes,
        test_encode_matches_ml_dtypes_on_midpoints_and_beyond,
        test_encode_matches_ml_dtypes_on_random_floats,
    ):
        assert_covers(test, packed_ml_layout)


@pytest.mark.parametrize("n", [1, 2, 3, 31, 32, 33])
def test_four_bit_codes_take_half_a_byte(n):
    fmt = FloatFormat(2, 1, finite=True)
    x = np.linspace(-6, 6, n, dtype=np.float32).reshape(1, n)
    enc = fmt.encode(x)
    assert enc.nbytes == fmt.nbytes(x.shape) == (n + 1) // 2
    assert enc.shape == x.shape


def test_mxfp4_block_storage_is_four_bits_plus_one_scale_per_32():
    fmt = FloatFormat(2, 1, finite=True)
    scaling = dtypes.PerBlock(32, power_of_two=True)
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    enc = fmt.encode(x, scaling=scaling)
    assert enc.nbytes == 64 * 256 // 2 + 4 * 64 * 256 // 32


def test_nan_is_refused_by_a_format_without_a_nan_code():
    fmt = FloatFormat(2, 1, finite=True)
    with pytest.raises(ValueError, match="no NaN code"):
        fmt.encode(np.array([1.0, np.nan], np.float32))


@pytest.mark.parametrize(
    "fmt",
    [
        FloatFormat(3, 4),
        FloatFormat(4, 3),
        FloatFormat(1, 1, finite=True),
        FloatFormat(3, 0, finite=True, nan=False),
    ],
    ids=str,
)
def test_round_trip_of_every_code_for_other_small_layouts(fmt):
    # Decode every code to float32 exactly (python arithmetic), encode it
    # back, and expect the same value (NaN codes stay NaN).
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    values = []
    for code in range(2**fmt.bits):
        sign = -1.0 if code >> (e + m) else 1.0
        ef, mf = (code >> m) & ((1 << e) - 1), code & ((1 << m) - 1)
        if not fmt.finite and ef == (1 << e) - 1:
            values.append(sign * np.inf if mf == 0 else np.nan)
        elif fmt.finite and fmt.nan and ef == (1 << e) - 1 and mf == (1 << m) - 1:
            values.append(np.nan)
        elif ef == 0:
            values.append(sign * mf * 2.0 ** (fmt.emin - m))
        else:
            values.append(sign * (1 + mf / 2**m) * 2.0 ** (ef - fmt.bias))
    x = np.array(values, np.float32)
    got = np.asarray(fmt.encode(x).decode())
    np.testing.assert_array_equal(np.isnan(got), np.isnan(x))
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(got[finite].view(np.uint32), x[finite].view(np.uint32))
