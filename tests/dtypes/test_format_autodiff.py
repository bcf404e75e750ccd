"""Straight-through gradients of `round` and `encode`/`decode` under `grad`."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from checks import fid

import dtypes
from dtypes import FloatFormat, PerAxis, PerBlock, PerTensor

FLOATS = [
    dtypes.bfloat16,
    dtypes.float16,
    dtypes.tf32,
    dtypes.float8_e4m3fn,
    dtypes.float8_e5m2,
    FloatFormat(2, 1, finite=True),
    FloatFormat(3, 2),
]


def _grad(f):
    return jax.grad(lambda v: jnp.sum(f(v)))


@pytest.mark.parametrize("fmt", FLOATS, ids=fid)
def test_float_round_gradient_is_one_inside_the_range(fmt, eager_and_jit):
    rng = np.random.default_rng(0)
    inside = (rng.uniform(-1, 1, 200) * fmt.max).astype(np.float32)
    inside[:4] = [0.0, fmt.max, -fmt.max, fmt.smallest_subnormal]
    beyond = min(2 * fmt.max, float(np.finfo(np.float32).max))  # bfloat16's max is near float32's
    outside = np.array([beyond, -beyond], np.float32)
    assert np.all(np.abs(outside) > fmt.max)
    x = jnp.asarray(np.concatenate([inside, outside]))
    for mode in ("nearest_even", "toward_zero", "up"):
        g = np.asarray(eager_and_jit(_grad(lambda v, m=mode: fmt.round(v, rounding=m)))(x))
        np.testing.assert_array_equal(g[: inside.size], 1.0, err_msg=mode)
        # documented by Format.round: 0 where the value was clipped to the range
        np.testing.assert_array_equal(g[inside.size :], 0.0, err_msg=mode)


@pytest.mark.parametrize("fmt", FLOATS[:3], ids=fid)
def test_float_round_gradient_with_stochastic_rounding(fmt, eager_and_jit):
    x = jnp.linspace(-3, 3, 50, dtype=jnp.float32)
    g = eager_and_jit(_grad(lambda v: fmt.round(v, rounding="stochastic", key=jax.random.key(0))))(
        x
    )
    np.testing.assert_array_equal(np.asarray(g), 1.0)


@pytest.mark.parametrize(
    "scaling", [PerTensor(), PerAxis(0), PerBlock(8), PerBlock(3, axis=0)], ids=str
)
@pytest.mark.parametrize("fmt", [dtypes.int8, dtypes.int4, dtypes.int2, dtypes.int1], ids=fid)
def test_absmax_scaled_int_gradient_is_exactly_one(fmt, scaling, eager_and_jit):
    x = jnp.asarray(np.random.default_rng(1).standard_normal((6, 20)).astype(np.float32))
    g = eager_and_jit(_grad(lambda v: fmt.round(v, scaling=scaling)))(x)
    np.testing.assert_array_equal(np.asarray(g), 1.0)


@pytest.mark.parametrize("fmt", [dtypes.int8, dtypes.int4, dtypes.int2], ids=fid)
def test_power_of_two_int_gradient_is_zero_where_clipped(fmt, eager_and_jit):
    """scale 2**(floor(log2 absmax) - floor(log2 qmax)): codes above qmax clip, grad 0 there."""
    q = fmt.qmax
    k = math.floor(math.log2(q))  # the scale is 1 for an absmax in [2**k, 2**(k+1))
    top = 2.0 ** (k + 1)
    x = np.array([top * 0.999, -(q + 0.6), q + 0.4, q - 0.5, 0.25, -1.0, 0.0, q], np.float32)
    x = np.clip(x, -top * 0.999, top * 0.999).astype(np.float32)
    scale = 2.0 ** (math.floor(math.log2(float(np.max(np.abs(x))))) - k)
    assert scale == 1.0
    codes = np.rint(x.astype(np.float64) / scale)
    expected = (np.abs(codes) <= q).astype(np.float32)
    assert 0 < expected.sum() < x.size, "the case must clip some values and keep others"
    g = eager_and_jit(_grad(lambda v: fmt.round(v, scaling=PerTensor(power_of_two=True))))(
        jnp.asarray(x)
    )
    np.testing.assert_array_equal(np.asarray(g), expected)


@pytest.mark.parametrize("fmt", [dtypes.bfloat16, dtypes.int8, dtypes.int4], ids=fid)
def test_gradient_through_encode_decode(fmt, eager_and_jit):
    """Encoding is not differentiable as integer codes; round() is the differentiable spelling."""
    x = jnp.asarray(np.random.default_rng(2).standard_normal(16).astype(np.float32))
    g = eager_and_jit(_grad(lambda v: fmt.round(v) * v))(x)
    y = np.asarray(fmt.round(x))
    # d/dx [round(x) * x] = round'(x) * x + round(x) = x + round(x)
    np.testing.assert_allclose(np.asarray(g), np.asarray(x) + y, rtol=1e-6)


@pytest.mark.parametrize("name", ["nf4", "uint8", "uint4", "float8_e8m0fnu"])
def test_storage_formats_round_straight_through(name):
    # code books, asymmetric integers and E8M0 hold codes with no gradient of their
    # own: `round` must still pass the gradient straight through, never a silent zero
    fmt = dtypes.get(name)
    x = jnp.linspace(0.1, 2.0, 64)
    grad = jax.grad(lambda v: jnp.sum(fmt.round(v) * jnp.arange(64.0)))(x)
    np.testing.assert_array_equal(np.asarray(grad), np.arange(64.0))
    np.testing.assert_array_equal(np.asarray(fmt.round(x)), np.asarray(fmt.decode(fmt.encode(x))))
