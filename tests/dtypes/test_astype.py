"""`dtypes.astype`: XLA's conversion, with its bits the same everywhere.

float32 into bfloat16, float16 and the one-byte floats against ml_dtypes' conversion
(the independent reference) on random bit patterns, every code's value and the ties
between neighbouring codes, NaN and inf of both signs; other conversions left to
`astype`; the gradient that of `astype`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import dtypes

NARROW = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3", "float8_e3m4")


def _patterns(dtype: np.dtype) -> np.ndarray:
    """Random float32 bit patterns, every value of `dtype` and every midpoint between
    neighbouring values with their float32 neighbours, the specials; both signs."""
    width = dtype.itemsize * 8
    codes = np.arange(1 << (width - 1), dtype=np.uint8 if width == 8 else np.uint16)
    with np.errstate(invalid="ignore"):
        values = np.sort(codes.view(dtype).astype(np.float64))
    values = values[np.isfinite(values)]
    mids = (values[1:] + values[:-1]) / 2
    centres = np.concatenate([values, mids]).astype(np.float32).view(np.uint32)
    near = (centres[:, None].astype(np.int64) + np.arange(-1, 2)).clip(0, 0x7F7FFFFF)
    specials = np.uint32([0x7F800000, 0x7FC00000, 0x7F800001, 0x00000001, 0x7F7FFFFF])
    rng = np.random.default_rng(5).integers(0, 2**31, 1 << 16, dtype=np.uint64)
    mags = np.concatenate([near.ravel().astype(np.uint32), specials, rng.astype(np.uint32)])
    return np.concatenate([mags, mags | np.uint32(0x80000000)]).view(np.float32)


@pytest.mark.parametrize("name", NARROW)
def test_float32_into_a_narrow_float_is_ml_dtypes_conversion(name):
    dtype = np.dtype(getattr(ml_dtypes, name, None) or name)
    x = _patterns(dtype)
    for run in (jax.jit(lambda v: dtypes.astype(v, dtype)), lambda v: dtypes.astype(v, dtype)):
        got = np.asarray(run(x))
        assert got.dtype == dtype
        with np.errstate(over="ignore", invalid="ignore"):
            want = x.astype(dtype)
        bits = np.uint8 if dtype.itemsize == 1 else np.uint16
        nan = np.isnan(x)
        assert (got.view(bits)[~nan] == want.view(bits)[~nan]).all(), name
        # NaN: a quiet NaN of the input's sign (float16 keeps the payload's top bits, as
        # XLA's conversion does; numpy's keeps a signaling NaN signaling)
        top = np.uint32(1 << (dtype.itemsize * 8 - 1))
        assert np.isnan(got[nan].astype(np.float32)).all()
        assert ((got.view(bits)[nan] & top) != 0).tolist() == np.signbit(x[nan]).tolist()
        m = int(ml_dtypes.finfo(dtype).nmant)
        assert ((got.view(bits)[nan] >> (m - 1)) & 1).all()  # (quiet)


def test_other_conversions_are_astype():
    x = jnp.array([1.5, -2.25, 3.0], jnp.float32)
    assert dtypes.astype(x, jnp.int32).tolist() == x.astype(jnp.int32).tolist()
    h = x.astype(jnp.float16)
    assert dtypes.astype(h, jnp.float8_e4m3fn).dtype == jnp.float8_e4m3fn
    assert dtypes.astype([1.0, 2.0], jnp.float32).tolist() == [1.0, 2.0]


@pytest.mark.parametrize("name", NARROW)
def test_gradient_is_astypes(name):
    dtype = np.dtype(getattr(ml_dtypes, name, None) or name)
    x = jnp.array([0.3, -1.7, 2.5], jnp.float32)
    ours = jax.grad(lambda v: dtypes.astype(v, dtype).astype(jnp.float32).sum())(x)
    plain = jax.grad(lambda v: v.astype(dtype).astype(jnp.float32).sum())(x)
    assert ours.dtype == plain.dtype
    assert ours.tolist() == plain.tolist()
    _, tangent = jax.jvp(lambda v: dtypes.astype(v, dtype), (x,), (jnp.ones(3),))
    assert tangent.dtype == dtype


@pytest.mark.parametrize(
    ("x", "dtype", "match"),
    [
        (np.ones(2, np.float32), "abc", "'abc' is not a dtype"),
        (np.ones(2, np.float32), object, "not a dtype of numbers"),
        ("abc", jnp.float16, "x must be an array of numbers"),
        (np.array(["a"]), jnp.float16, "x must be an array of numbers"),
    ],
)
def test_bad_arguments_are_refused_with_the_fix(x, dtype, match):
    with pytest.raises(dtypes.PrecisionTypeError, match=match) as e:
        dtypes.astype(x, dtype)
    assert isinstance(e.value, TypeError)
