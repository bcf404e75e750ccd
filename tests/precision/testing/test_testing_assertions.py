"""`ulp_distance` and the assertions, against grids enumerated independently.

Every value of the small formats is listed from its bit pattern (ml_dtypes for
the native ones, exact Python arithmetic for a custom layout); a value's index
in the sorted list of distinct values is its position on the grid, so the
distance between two grid values is the difference of their indices.
"""

from __future__ import annotations

import re
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dtypes
from dtypes import FloatFormat
from precision.testing import (
    arrays,
    assert_representable,
    assert_ulp_close,
    representable,
    ulp_distance,
)


def _native_grid(native) -> np.ndarray:
    """Sorted distinct finite values of an 8/16-bit ml_dtypes type, from every bit pattern."""
    width = np.dtype(native).itemsize
    patterns = np.arange(2 ** (8 * width), dtype=np.uint32).astype(f"u{width}")
    with np.errstate(invalid="ignore"):  # NaN patterns
        values = patterns.view(native).astype(np.float64)
    return np.unique(values[np.isfinite(values)])  # +0 and -0 collapse to one point


def _custom_grid(e: int, m: int, finite: bool) -> np.ndarray:
    """All finite values of FloatFormat(e, m) from the bit-pattern formula, exactly."""
    bias = 2 ** (e - 1) - 1
    out = set()
    for sign in (1, -1):
        for field in range(2**e):
            if field == 2**e - 1 and not finite:
                continue  # inf / NaN
            for mant in range(2**m):
                if field == 0:
                    v = Fraction(mant, 2**m) * Fraction(2) ** (1 - bias)
                else:
                    v = (1 + Fraction(mant, 2**m)) * Fraction(2) ** (field - bias)
                out.add(sign * v)
    return np.array(sorted(float(v) for v in out))


GRIDS = {
    "float8_e4m3fn": (dtypes.float8_e4m3fn, _native_grid(ml_dtypes.float8_e4m3fn)),
    "float8_e5m2": (dtypes.float8_e5m2, _native_grid(ml_dtypes.float8_e5m2)),
    "e3m2": (FloatFormat(3, 2), _custom_grid(3, 2, finite=False)),
    "e3m2fn": (FloatFormat(3, 2, finite=True), _custom_grid(3, 2, finite=True)),
}


@pytest.mark.parametrize("name", GRIDS)
def test_distance_between_grid_values_counts_grid_points(name):
    fmt, grid = GRIDS[name]
    rank = np.arange(grid.size)
    d = ulp_distance(grid[:, None], grid[None, :], fmt)
    np.testing.assert_array_equal(d, np.abs(rank[:, None] - rank[None, :]))


@pytest.mark.parametrize("name", GRIDS)
def test_midpoints_are_half_a_step_from_both_neighbours(name):
    fmt, grid = GRIDS[name]
    mid = (grid[:-1] + grid[1:]) / 2  # exact in float64
    np.testing.assert_array_equal(ulp_distance(grid[:-1], mid, fmt), 0.5)
    np.testing.assert_array_equal(ulp_distance(mid, grid[1:], fmt), 0.5)


@pytest.mark.parametrize(
    ("fmt", "native"),
    [(dtypes.bfloat16, ml_dtypes.bfloat16), (dtypes.float16, np.float16)],
    ids=["bfloat16", "float16"],
)
def test_16_bit_grids_step_by_one(fmt, native):
    grid = _native_grid(native)
    zero = np.searchsorted(grid, 0.0)
    np.testing.assert_array_equal(ulp_distance(grid[:-1], grid[1:], fmt), 1.0)
    np.testing.assert_array_equal(ulp_distance(0.0, grid, fmt), np.abs(np.arange(grid.size) - zero))


def test_float32_steps_across_zero_and_the_subnormal_boundary():
    tiny = np.float32(2.0**-149)
    normal = np.float32(2.0**-126)
    below = np.nextafter(normal, np.float32(0))
    assert ulp_distance(-tiny, tiny, dtypes.float32) == 2
    assert ulp_distance(below, normal, dtypes.float32) == 1
    assert ulp_distance(0.0, normal, dtypes.float32) == 2**23
    big = np.float32(3.0e38)
    assert ulp_distance(big, np.nextafter(big, np.float32(np.inf)), dtypes.float32) == 1


def test_non_finite_rules():
    inf, nan = np.inf, np.nan
    fmt = dtypes.bfloat16
    d = ulp_distance([nan, nan, inf, inf, -inf, 1.0], [nan, 1.0, inf, -inf, 1.0, inf], fmt)
    np.testing.assert_array_equal(d, [0, np.inf, 0, np.inf, np.inf, np.inf])


def test_int_formats_count_steps_of_the_scale():
    expected = np.float32([127.0, 63.5, 0.0])  # per-tensor scale 1.0
    assert ulp_distance(expected, expected, dtypes.int8).tolist() == [0, 0, 0]
    np.testing.assert_array_equal(
        ulp_distance([126.0, 62.0, 0.5], expected, dtypes.int8), [1.0, 1.5, 0.5]
    )
    np.testing.assert_array_equal(ulp_distance(1.0, 2.0, dtypes.int4, scale=0.25), 4.0)


@given(st.data())
def test_distance_is_symmetric_and_zero_on_itself(data):
    fmt = dtypes.float8_e5m2
    a = data.draw(arrays(fmt, 16))
    b = data.draw(arrays(fmt, 16))
    np.testing.assert_array_equal(ulp_distance(a, b, fmt), ulp_distance(b, a, fmt))
    np.testing.assert_array_equal(ulp_distance(a, a, fmt), 0)


# -- assert_ulp_close ----------------------------------------------------------


def test_assert_ulp_close_passes_within_tolerance():
    assert_ulp_close([1.0, 2.0, np.nan], [1.0078125, 2.0, np.nan], dtypes.bfloat16, max_ulps=1)
    assert_ulp_close(1.0, 1.0, "bfloat16", max_ulps=0)


def test_assert_ulp_close_names_the_worst_element():
    actual = np.float32([[1.0, 2.0], [4.0, 8.0]])
    expected = np.float32([[1.0, 4.03125], [4.0, 8.125]])
    with pytest.raises(AssertionError) as info:
        assert_ulp_close(actual, expected, dtypes.bfloat16, max_ulps=1)
    message = str(info.value)
    assert message.startswith("2 of 4 elements differ by more than 1 ulp of bfloat16")
    # The worst is (0, 1): 2.0 to 4.0 is a binade of 128 steps, plus one; (1, 1) is 2.
    assert "worst at index (0, 1): distance 129 ulps" in message
    assert "actual   = 2.0 (float32 bits 0x40000000, bfloat16 bits 0x4000)" in message
    assert "expected = 4.03125 (float32 bits 0x40810000, bfloat16 bits 0x4081)" in message


def test_assert_ulp_close_shows_off_grid_expected_values():
    with pytest.raises(AssertionError, match=re.escape("between bfloat16 bits 0x3F80 and 0x3F81")):
        assert_ulp_close(np.float32(2.0), 1.001, dtypes.bfloat16)


def test_assert_ulp_close_nan_only_matches_nan():
    with pytest.raises(AssertionError, match="distance inf"):
        assert_ulp_close(np.float32(np.nan), np.float32(1.0), dtypes.float16)


def test_assert_ulp_close_int_format_message_and_prefix():
    with pytest.raises(AssertionError, match=r"(?s)^kernel x\n.*steps of the scale"):
        assert_ulp_close([125.0, 0.0], [127.0, 0.0], dtypes.int8, max_ulps=1, err_msg="kernel x")


# -- assert_representable -------------------------------------------------------


@given(st.data())
def test_assert_representable_accepts_grid_values(data):
    fmt = data.draw(st.sampled_from([dtypes.bfloat16, dtypes.float8_e4m3fn, FloatFormat(3, 2)]))
    x = np.float32([data.draw(representable(fmt)) for _ in range(8)])
    assert_representable(x, fmt)


def test_assert_representable_lists_the_offenders():
    x = np.float32([1.0, 1.1, 2.0, 2.2])
    with pytest.raises(AssertionError) as info:
        assert_representable(x, dtypes.bfloat16, limit=1)
    lines = str(info.value).splitlines()
    assert lines[0] == "2 of 4 values are not on the bfloat16 grid:"
    assert lines[1].startswith("  at (1,): 1.100000023841858 (float32 bits 0x3F8CCCCD)")
    assert lines[2] == "  … and 1 more"


def test_assert_representable_keeps_the_sign_of_zero_and_accepts_nan():
    assert_representable(np.float32([-0.0, 0.0, np.nan]), dtypes.float8_e5m2)


def test_assert_representable_int_formats_use_the_scale():
    assert_representable(np.float32([127.0, -64.0, 0.0]), dtypes.int8)
    with pytest.raises(AssertionError, match="not on the int8 grid"):
        assert_representable(np.float32([127.0, 0.25]), dtypes.int8)


@given(st.floats(), st.floats(), st.sampled_from([dtypes.bfloat16, dtypes.float8_e4m3fn]))
def test_any_float64_pair_gets_a_symmetric_non_negative_distance(a, b, fmt):
    d = ulp_distance(a, b, fmt)
    assert d >= 0
    assert d == ulp_distance(b, a, fmt)
    if a == b or (np.isnan(a) and np.isnan(b)):
        assert d == 0
