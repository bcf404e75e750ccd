"""A float32 value stored in a one-byte float's container: one conversion, not two.

`_storage.encode_values` stores an unscaled float8 value with `dtypes.astype(x)` where
it once rounded (`fmt.round`) and then cast the rounded value: the conversion is the
same rounding, so the bytes must be those of the rounding, for every float32 (all 2**32
patterns under the hunt profile; ml_dtypes' conversion on the ties, every code and random
patterns by default), in and out of `jit`, with the straight-through gradient kept.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from sampling import HUNT

import dtypes
import precision

NAMES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3", "float8_e3m4")


def _values(dtype: np.dtype) -> np.ndarray:
    """Every code's value and every tie between neighbouring codes, with their float32
    neighbours, random finite patterns and ±inf, both signs."""
    codes = np.arange(0x80, dtype=np.uint8).view(dtype).astype(np.float64)
    finite = np.sort(codes[np.isfinite(codes)])
    centres = np.concatenate([finite, (finite[1:] + finite[:-1]) / 2]).astype(np.float32)
    bits = centres.view(np.uint32).astype(np.int64)[:, None] + np.arange(-1, 2)
    rng = np.random.default_rng(9).integers(0, 0x7F800000, 1 << 14, dtype=np.int64)
    mags = np.concatenate([bits.ravel(), rng, [0x7F800000]]).astype(np.uint32)
    return np.concatenate([mags, mags | np.uint32(0x80000000)]).view(np.float32)


@pytest.mark.parametrize("name", NAMES)
def test_stored_bytes_are_ml_dtypes_conversion(name):
    dtype = np.dtype(getattr(ml_dtypes, name))
    x = _values(dtype)
    x = x[np.isfinite(x)] if not dtypes.get(name).has_inf else x
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(dtype).view(np.uint8)
    store = lambda v: precision.Tensor(v).to_reduced_precision(name).encoded.data
    for run in (jax.jit(store), store):
        got = np.asarray(run(jnp.asarray(x)))
        assert got.dtype == dtype
        np.testing.assert_array_equal(got.view(np.uint8), want)


@pytest.mark.parametrize("name", NAMES)
def test_storing_takes_one_conversion_from_the_bits_on_a_cpu(name):
    """No rounding pass before the conversion, and no conversion of XLA's into the byte
    (`dtypes.astype` writes it from the bits): the compiled program holds neither."""
    fmt = dtypes.get(name)
    store = jax.jit(lambda v: precision.Tensor(v).to_reduced_precision(name).encoded.data)
    hlo = store.lower(jax.ShapeDtypeStruct((64, 32), jnp.float32)).compile().as_text()
    native = np.dtype(fmt.container).name.replace("float8_", "f8")
    assert not [line for line in hlo.splitlines() if f"= {native}[" in line and " convert(" in line]
    assert hlo.count(" fusion(") <= 1, hlo  # (one pass over the values)


@pytest.mark.parametrize("name", NAMES)
def test_the_stored_value_keeps_the_straight_through_gradient(name):
    x = jnp.array([0.3, -1.7, 2.5, 7.0], jnp.float32)
    stored = lambda v: precision.Tensor(v).to_reduced_precision(name)
    loss = lambda v: (precision.to_full_precision(stored(v)) * jnp.arange(4.0)).sum()
    assert jax.grad(loss)(x).tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.skipif(not HUNT, reason="all 2**32 float32 patterns: minutes; hunt profile")
def test_the_conversion_is_the_rounding_for_every_float32():
    chunk = 1 << 24
    fmts = [dtypes.get(n) for n in NAMES]

    @jax.jit
    def wrong(start):
        y = lax.bitcast_convert_type(start + lax.iota(jnp.uint32, chunk), jnp.float32)
        counts = []
        for f in fmts:
            a = lax.bitcast_convert_type(f.round(y).astype(f.container), jnp.uint8)
            b = lax.bitcast_convert_type(dtypes.astype(y, f.container), jnp.uint8)
            counts.append(jnp.sum(a != b))
        return jnp.stack(counts)

    total = sum(np.asarray(wrong(jnp.uint32(c * chunk))) for c in range(1 << 8))
    assert not np.any(total), dict(zip(NAMES, total.tolist(), strict=True))
