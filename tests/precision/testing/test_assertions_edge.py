"""Tolerances and scales that would make an assertion pass anything are refused."""

from __future__ import annotations

import math

import pytest

import precision
from precision import testing


@pytest.mark.parametrize("max_ulps", [math.nan, -1, "1", None])
def test_assert_ulp_close_refuses_a_meaningless_tolerance(max_ulps):
    with pytest.raises(precision.PrecisionError, match="max_ulps") as info:
        testing.assert_ulp_close([1.0], [2.0], "bfloat16", max_ulps=max_ulps)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("scale", [math.nan, 0.0, -1.0, math.inf, [1.0, math.nan]])
def test_ulp_distance_refuses_a_meaningless_scale(scale):
    with pytest.raises(precision.PrecisionError, match="scale"):
        testing.ulp_distance([1.0, 1.0], [2.0, 2.0], "int8", scale=scale)


def test_a_real_scale_still_measures_steps():
    assert testing.ulp_distance([1.0], [2.0], "int8", scale=0.5).tolist() == [2.0]
    with pytest.raises(AssertionError):
        testing.assert_ulp_close([1.0], [2.0], "int8", max_ulps=1, scale=0.5)
