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


def _nearest_power_of_two_byte(x: np.ndarray) -> np.ndarray:
    """The E8M0 byte of each positive float32: the nearest power of two, a tie (1.5 * 2**k)
    going up, at least 2**-127; 0xFF past 2**127's ties. Exact: float64 holds every
    float32, and frexp is exact."""
    m, e = np.frexp(x.astype(np.float64))  # x = m * 2**e, 0.5 <= m < 1
    k = np.where(m >= 0.75, e, e - 1)
    byte = np.maximum(k, -127) + 127
    return np.where(byte > 254, 255, byte).astype(np.uint8)


def test_every_float32_subnormal_rounds_to_the_nearest_power_of_two():
    """All 2**23 - 1 positive float32 subnormals and the first normals, jitted and
    eagerly: in the binade of 2**-127 the tie is 1.5 * 2**-127, as in every other (the
    conversion of XLA, and of ml_dtypes before 0.7, sends the whole binade up)."""
    bits = np.arange(1, (1 << 23) + (1 << 16), dtype=np.uint32)
    x = bits.view(np.float32)
    want = _nearest_power_of_two_byte(x)
    assert want[0] == 0  # 2**-149
    assert want[(3 << 21) - 2] == 0  # just below 1.5 * 2**-127
    assert want[(3 << 21) - 1] == 1  # 1.5 * 2**-127
    for encode in (E8M0.encode, jax.jit(E8M0.encode)):
        np.testing.assert_array_equal(np.asarray(encode(x).data).view(np.uint8), want)
    if tuple(int(p) for p in ml_dtypes.__version__.split(".")[:2]) >= (0, 7):
        np.testing.assert_array_equal(x.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8), want)


def test_each_binade_s_tie_and_its_neighbours_round_to_the_nearest_power_of_two():
    k = np.arange(-126, 128, dtype=np.float64)
    ties = (1.5 * 2.0**k).astype(np.float32)
    ties = ties[np.isfinite(ties)]
    x = np.concatenate([ties, np.nextafter(ties, 0), (2.0**k).astype(np.float32)])
    x = x[x < 1.5 * 2.0**127]
    want = _nearest_power_of_two_byte(x)
    np.testing.assert_array_equal(np.asarray(E8M0.encode(x).data).view(np.uint8), want)
