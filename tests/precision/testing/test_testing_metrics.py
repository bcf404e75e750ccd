"""Error metrics against the plain numpy formulas, written out here."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dtypes
from precision.testing import ErrorReport, arrays, error_report, relative_error, sqnr_db

finite = arrays(dtypes.bfloat16, 16, allow_nan=False, allow_infinity=False)


@given(ref=finite, noise=finite)
def test_sqnr_matches_the_formula(ref, noise):
    # A convex combination cannot overflow float32, whatever the two arrays hold.
    approx = np.float32(1 - 2.0**-10) * ref + np.float32(2.0**-10) * noise
    r, a = ref.astype(np.float64), approx.astype(np.float64)
    signal, err = np.sum(r**2), np.sum((r - a) ** 2)
    got = sqnr_db(ref, approx)
    if not (np.isfinite(signal) and np.isfinite(err)):
        return  # float64 overflow of the squares: nothing to compare
    if err == 0:
        assert got == math.inf
    elif signal == 0:
        assert got == -math.inf
    else:
        assert got == pytest.approx(10 * np.log10(signal / err), rel=1e-12)


def test_sqnr_edge_cases():
    assert sqnr_db([0.0, 0.0], [0.0, 0.0]) == math.inf
    assert sqnr_db([0.0], [1.0]) == -math.inf
    assert math.isnan(sqnr_db([np.nan], [1.0]))
    assert sqnr_db([3.0, 4.0], [3.0, 4.5]) == pytest.approx(10 * math.log10(25 / 0.25))


@given(ref=finite, approx=finite)
def test_relative_error_matches_the_formula(ref, approx):
    r, a = ref.astype(np.float64), approx.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = np.abs(a - r) / np.abs(r)
    expected[(r == 0) & (a == r)] = 0.0
    expected[(r == 0) & (a != r)] = np.inf
    np.testing.assert_array_equal(relative_error(ref, approx), expected)


def test_relative_error_refuses_shapes_that_do_not_broadcast():
    with pytest.raises(ValueError, match=r"broadcastable shapes, got \(2,\) and \(3,\)"):
        relative_error([1.0, 2.0], [1.0, 2.0, 3.0])


@given(ref=finite, approx=finite)
def test_error_report_fields(ref, approx):
    report = error_report(ref, approx, dtypes.bfloat16)
    r, a = ref.astype(np.float64), approx.astype(np.float64)
    keep = np.isfinite(r) & np.isfinite(a) & np.isfinite(a - r)
    assert report.size == ref.size
    if np.all(keep):
        assert report.max_abs_error == np.max(np.abs(a - r))
        assert report.mean_abs_error == pytest.approx(np.mean(np.abs(a - r)), rel=1e-12)
    assert sum(count for _, count in report.ulp_histogram) == ref.size
    assert report.format_name == "bfloat16"


def test_error_report_histogram_and_text():
    ref = np.float32([1.0, 2.0, 4.0, 8.0, 16.0])
    approx = np.float32([1.0, 2.03125, 4.0, 8.0625, 0.0])
    report = error_report(ref, approx, "bfloat16")
    # Distances 0, 2, 0, 1 and (16 against 0) 16768 steps.
    assert report.ulp_histogram == (("0", 2), ("(0, 1]", 1), ("(1, 2]", 1), (">256", 1))
    text = str(report)
    assert text.splitlines()[0] == "error report: 5 values, ULPs of bfloat16"
    assert "  max abs error   16" in text
    assert "    >256    1" in text
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.size = 3  # type: ignore[misc]


def test_error_report_without_format_and_with_non_finite():
    report = error_report([1.0, np.inf, 2.0], [1.5, np.inf, 2.0])
    assert isinstance(report, ErrorReport)
    assert report.ulp_histogram == ()
    assert report.nonfinite == 1
    assert report.max_abs_error == 0.5
    assert report.max_rel_error == 0.5
    assert "non-finite      1" in str(report)


@given(st.floats(-1e30, 1e30), st.floats(-1e30, 1e30))
def test_scalars_work(a, b):
    assert relative_error(a, b).shape == ()
    assert error_report(a, b).size == 1
