"""E8M0 used as a value format: what has no code is refused eagerly, never NaN silently."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest

import dtypes
import precision

E8M0 = dtypes.get("float8_e8m0fnu")


@pytest.mark.parametrize("bad", [0.0, -0.0, -1.0, -1e-30, np.inf, -np.inf, 1.5 * 2.0**127, 3e38])
def test_values_without_a_code_are_refused_by_encode_check_and_tensor(bad):
    x = np.array([1.0, bad, 4.0], np.float32)
    for call in (E8M0.encode, E8M0.check):
        with pytest.raises(dtypes.FormatError, match=r"1 of 3 values would become NaN"):
            call(x)
    with pytest.raises(precision.PrecisionError, match="positive powers of two"):
        precision.Tensor(x).to_reduced_precision("float8_e8m0fnu")


def test_positive_values_and_nan_encode_as_ml_dtypes_does():
    x = np.array([1.0, 0.3, 2.0**-127, 1e-40, 1.4 * 2.0**127, np.nan, 7.0], np.float32)
    enc = E8M0.encode(x)
    expected = x.astype(ml_dtypes.float8_e8m0fnu)
    np.testing.assert_array_equal(np.asarray(enc.data).view(np.uint8), expected.view(np.uint8))


def test_traced_values_become_nan_as_documented():
    x = np.array([0.0, -2.0, 2.0], np.float32)
    data = jax.jit(lambda v: E8M0.encode(v).data)(x)
    assert np.asarray(data).view(np.uint8).tolist() == [0xFF, 0xFF, 128]
