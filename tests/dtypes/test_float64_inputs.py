"""float64 values beyond float32's range: refused eagerly, never inf or a NaN group."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import dtypes
import precision

SCALED = ["int8", "int4", "int2", "mxfp4", "mxint8", "nvfp4", "uint8", "nf4"]


@pytest.mark.parametrize("name", SCALED)
@pytest.mark.parametrize("big", [1e300, -1e39, 3.5e38])
def test_scaled_encodings_refuse_float64_values_past_float32_under_x64(x64, name, big):
    x = np.array([1.0, big, 2.0, 3.0] * 8, np.float64)
    fmt = dtypes.get(name)
    for call in (fmt.encode, fmt.check):
        with pytest.raises(dtypes.NonFiniteError):
            call(x)


@pytest.mark.parametrize("name", SCALED)
def test_float64_values_inside_float32_range_encode_as_their_float32_values(x64, name):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(64) * 1e30
    fmt = dtypes.get(name)
    got = np.asarray(fmt.decode(fmt.encode(x), np.float32))
    want = np.asarray(fmt.decode(fmt.encode(x.astype(np.float32)), np.float32))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("values", [[1e300], [1.0, -1e39], [[3.5e38, 0.0]]])
def test_a_float32_tensor_refuses_float64_values_it_would_hold_as_inf(values):
    with pytest.raises(precision.PrecisionError, match="beyond float32's range"):
        precision.Tensor(np.array(values))
    with pytest.raises(ValueError, match="jax_enable_x64"):
        precision.Tensor(values)


def test_float64_infinities_stay_infinities_in_a_float32_tensor():
    t = precision.Tensor(np.array([np.inf, -np.inf, 1.0]))
    assert t.numpy().tolist() == [np.inf, -np.inf, 1.0]


@pytest.mark.parametrize("name", SCALED)
def test_without_x64_the_refusal_is_ours_not_numpys_overflow_warning(name):
    # JAX narrows float64 to float32 (1e300 becomes inf, which scaled encodings refuse);
    # numpy's "overflow encountered in cast" warning used to come first, and under
    # warnings-as-errors (this suite's setting) it replaced the refusal.
    assert not jax.config.read("jax_enable_x64")
    x = np.array([1.0, 1e300, 2.0, 3.0] * 8, np.float64)
    with pytest.raises(dtypes.NonFiniteError):
        dtypes.get(name).encode(x)


def test_without_x64_an_unscaled_format_rounds_the_narrowed_value():
    x = np.array([1e300, -1e300, 3.0, 1e-300], np.float64)
    got = np.asarray(dtypes.bfloat16.encode(x).decode())
    np.testing.assert_array_equal(got, np.array([np.inf, -np.inf, 3.0, 0.0], np.float32))
