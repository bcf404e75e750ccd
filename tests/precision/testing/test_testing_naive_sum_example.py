"""Acceptance: the documented naive-summation example finds, shrinks and fixes a real bug.

The example lives in examples/naive_sum_property_test.py (and docs/testing.md);
this test runs that file's own properties and checks what hypothesis reports.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings

from precision.testing import ulp_distance

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "naive_sum_property_test.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("naive_sum_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example = _load_example()


def test_the_fixed_kernel_passes():
    example.test_fixed_sum_is_within_one_ulp()


def test_the_example_catches_the_naive_kernel():
    example.test_hypothesis_catches_the_naive_sum()


def test_hypothesis_shrinks_the_counterexample():
    failing: list[np.ndarray] = []

    @settings(
        max_examples=300, deadline=None, database=None, derandomize=True, report_multiple_bugs=False
    )
    @given(example.data)
    def naive_property(x):
        try:
            example.check(example.naive_sum, x)
        except AssertionError:
            failing.append(x)
            raise

    with pytest.raises(AssertionError, match="differ") as info:
        naive_property()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "Falsifying example" in notes or "Failing test case" in notes

    shrunk = failing[-1]  # hypothesis replays the minimal example last
    exact = math.fsum(shrunk.astype(np.float64))
    # A real bug: the naive result is more than one ULP off the exact sum ...
    assert ulp_distance(example.naive_sum(shrunk), exact, example.bf16) > 1
    # ... on data the fixed kernel handles, and the example is small and simple:
    assert ulp_distance(example.fixed_sum(shrunk), exact, example.bf16) <= 1
    assert len(set(shrunk.tolist())) <= 4, shrunk
    assert len(failing) > 1  # it was shrunk, not just found
    first = failing[0]
    assert len(set(shrunk.tolist())) <= len(set(first.tolist()))
