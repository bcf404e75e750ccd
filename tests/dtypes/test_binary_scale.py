"""int1's scale, mean(|x|) per group: never overflows for finite input, and is accurate.

The expected mean is exact (`fractions`) over the float32 inputs with
subnormals counted as zero, the rule of every scaled encoding. The documented
bound (docs/formats.md) is a relative error of at most (ceil(log2 n) + 2) * 2**-24
for a group of n elements.
"""

from __future__ import annotations

import math
from fractions import Fraction

import jax
import numpy as np
import pytest

import dtypes
from dtypes import PerAxis, PerBlock, PerTensor


def _exact_means(x: np.ndarray, groups: list[np.ndarray]) -> list[Fraction]:
    out = []
    for g in groups:
        vals = np.abs(x[g]).astype(np.float64).ravel()
        vals = np.where(vals < 2.0**-126, 0.0, vals)
        out.append(sum((Fraction(float(v)) for v in vals), Fraction(0)) / max(vals.size, 1))
    return out


def _groups(shape, scaling):
    idx = np.arange(math.prod(shape)).reshape(shape)
    if isinstance(scaling, PerTensor):
        return [idx]
    if isinstance(scaling, PerAxis):
        return [np.take(idx, i, axis=scaling.axis) for i in range(shape[scaling.axis])]
    size = scaling.size
    rows = idx.reshape(-1, shape[-1])
    return [r[s : s + size] for r in rows for s in range(0, shape[-1], size)]


def _check(x, scaling):
    enc = dtypes.int1.encode(x, scaling=scaling)
    scales = np.asarray(enc.scale, np.float64).ravel()
    groups = _groups(x.shape, scaling)
    flat = x.ravel()
    for s, g, want in zip(scales, groups, _exact_means(flat, groups), strict=True):
        n = g.size
        bound = (math.ceil(math.log2(max(n, 2))) + 2) * 2.0**-24
        want_f = float(want)
        if want_f < 2.0**-126:  # raised to the smallest normal (formats.md)
            assert s == (2.0**-126 if want > 0 else 0.0)
            continue
        rel = abs(Fraction(s) - want) / want
        assert rel <= bound, f"scale {s!r}, exact mean {want_f!r}: relative error {float(rel):.3g}"


@pytest.mark.parametrize(
    "scaling",
    [PerTensor(), PerAxis(0), PerAxis(1), PerBlock(100), PerBlock(7)],
    ids=str,
)
def test_int1_scale_is_the_accurate_mean_on_cauchy_rows(scaling):
    # heavy tails: a few huge values dominate each sum, many small ones follow
    rng = np.random.default_rng(0)
    x = (rng.standard_cauchy((16, 1000)) * 1e30).astype(np.float32)
    x[3, :] = (rng.standard_cauchy(1000) * 1e-30).astype(np.float32)
    _check(x, scaling)
    # the same scales under jit
    enc = dtypes.int1.encode(x, scaling=scaling)
    jitted = jax.jit(lambda v: dtypes.int1.encode(v, scaling=scaling).scale)(x)
    np.testing.assert_array_equal(np.asarray(jitted), np.asarray(enc.scale))


def test_int1_scale_does_not_overflow_for_finite_input():
    # the float32 sum of |x| overflows; the mean does not
    for x in ([2e38, 2e38], [3.4e38] * 1000, [3.4028235e38, -3.4028235e38, 1.0]):
        x = np.array(x, np.float32)
        scale = np.asarray(dtypes.int1.encode(x).scale)
        assert np.isfinite(scale).all(), (x[:3], scale)
        _check(x, PerTensor())


def test_int1_scale_of_a_large_group_is_accurate():
    # 2**20 + 3 elements: a float32 running sum would drift by ~n ulps
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, 2**20 + 3).astype(np.float32)
    scale = float(np.asarray(dtypes.int1.encode(x).scale)[0])
    exact = math.fsum(np.abs(x).astype(np.float64).tolist()) / x.size  # fsum: exactly rounded
    bound = (math.ceil(math.log2(x.size)) + 2) * 2.0**-24
    assert abs(scale - exact) / exact <= bound


def test_int1_tiny_and_zero_groups():
    x = np.array([[2e-38, -2e-38, 0.0, 1e-39], [0.0, 0.0, 0.0, 0.0]], np.float32)
    enc = dtypes.int1.encode(x, scaling=PerAxis(0))
    # a mean below the smallest normal becomes it; an all-zero group has scale 0
    assert np.asarray(enc.scale).ravel().tolist() == [2.0**-126, 0.0]
