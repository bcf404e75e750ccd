"""Statistics of stochastic rounding: unbiased per position, independent, fine-grained.

Every check uses fixed keys, so it is deterministic; the thresholds are set so
that a correct implementation fails with probability below about 1e-5 for a
random key (stated at each check), while the defects they guard against
(biased positions, correlated neighbours or keys, probabilities resolved only
to 2**-24) fail them with certainty or near it.

Expected probabilities come from exact arithmetic on the inputs (distance
from the lower neighbour over the spacing, both powers of two here), never
from the code under test.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dtypes
from dtypes import FloatFormat, PerTensor

M = 4096  # positions
K = 64  # independent draws (split keys) per position
Z = 5.0  # |z| above 5 has probability 6e-7 under a normal law


@functools.cache
def _draws(fmt, rounding_key_count: int = K):
    """jit(x, key) -> K stochastic roundings of x with split keys, shape (K, M)."""

    def f(x, key):
        keys = jax.random.split(key, rounding_key_count)
        return jax.vmap(lambda k: fmt.round(x, rounding="stochastic", key=k))(keys)

    return jax.jit(f)


def _bf16_inputs():
    """x in [1, 2) with exact probabilities of rounding up onto bfloat16 (spacing 2**-7)."""
    rng = np.random.default_rng(0)
    # distance from 1.0 in units of 2**-23 (float32's spacing there): p = j / 2**16
    j = rng.integers(1, 2**16, M)
    x = (1 + j * 2.0**-23).astype(np.float32)
    p = j / 2.0**16
    return x, p, np.float32(1.0), np.float32(1 + 2.0**-7)


def _int8_inputs():
    """x = code + fraction under an int8 scale of exactly 1 (absmax 127)."""
    rng = np.random.default_rng(1)
    j = rng.integers(1, 2**16, M)
    codes = rng.integers(-100, 100, M)
    x = (codes + j / 2.0**16).astype(np.float32)
    x[0] = 127.0  # absmax 127: scale 1, so x * (127 / absmax) is x exactly
    p = j / 2.0**16
    p[0] = 0.0
    return x, p, np.floor(x), np.floor(x) + 1


CASES = {"bfloat16": (dtypes.bfloat16, _bf16_inputs), "int8": (dtypes.int8, _int8_inputs)}


@pytest.mark.parametrize("case", list(CASES))
def test_every_position_is_unbiased(case):
    """Per-position chi-square: each position rounds up with its own probability p_i."""
    fmt, make = CASES[case]
    x, p, low, high = make()
    r = np.asarray(_draws(fmt)(jnp.asarray(x), jax.random.key(7)), np.float64)
    assert np.all((r == low) | (r == high)), "a result that is not a neighbour"
    up = (r == high).sum(axis=0)
    keep = p > 0
    expected = K * p[keep]
    chi2 = float((((up[keep] - expected) ** 2) / (expected * (1 - p[keep]))).sum())
    dof = int(keep.sum())
    # chi-square with `dof` degrees of freedom: mean dof, sd sqrt(2 dof)
    z = (chi2 - dof) / math.sqrt(2 * dof)
    assert abs(z) < Z, f"{case}: chi-square {chi2:.0f} for {dof} positions (z = {z:.1f})"
    # and the overall rate: binomial z over all K * M decisions
    total_z = (up[keep].sum() - expected.sum()) / math.sqrt((expected * (1 - p[keep])).sum())
    assert abs(total_z) < Z, f"{case}: overall rate off by z = {total_z:.1f}"


def _decisions(fmt, key, n=M * K):
    """Up/down decisions of n elements exactly halfway (p = 1/2), as +-1."""
    if fmt.kind == "int":
        x = np.full(n, 0.5, np.float32)
        x[0] = 127.0
    else:
        x = np.full(n, 1 + 2.0**-8, np.float32)  # halfway between bfloat16 1 and 1 + 2**-7
    r = np.asarray(fmt.round(jnp.asarray(x), rounding="stochastic", key=key), np.float64)
    up = r > (0.75 if fmt.kind == "int" else 1 + 2.0**-9)
    return np.where(up, 1.0, -1.0)[1:]


@pytest.mark.parametrize("fmt", [dtypes.bfloat16, dtypes.int8], ids=lambda f: f.name)
def test_neighbouring_elements_are_independent(fmt):
    """Lag-1..3 correlation of +-1 decisions at p = 1/2: |r| sqrt(n) < 5 (normal z)."""
    d = _decisions(fmt, jax.random.key(11))
    for lag in (1, 2, 3):
        r = float(np.mean(d[lag:] * d[:-lag]))
        z = r * math.sqrt(d.size - lag)
        assert abs(z) < Z, f"{fmt.name}: lag-{lag} correlation {r:.2e} (z = {z:.1f})"
    # and across rows of a 2-D array (elements one row apart)
    rows = d[: (d.size // 1024) * 1024].reshape(-1, 1024)
    r = float(np.mean(rows[1:] * rows[:-1]))
    assert abs(r * math.sqrt(rows[1:].size)) < Z


@pytest.mark.parametrize("fmt", [dtypes.bfloat16, dtypes.int8], ids=lambda f: f.name)
def test_split_and_fold_in_keys_give_independent_decisions(fmt):
    """Decisions under keys derived from one key are uncorrelated: |r| sqrt(n) < 5."""
    key = jax.random.key(3)
    a, b = jax.random.split(key)
    derived = {
        "key": key,
        "split[0]": a,
        "split[1]": b,
        # (JAX's fold_in(key, i) equals split(key)[i]: other data are folded in here)
        "fold_in 7": jax.random.fold_in(key, 7),
        "fold_in 8": jax.random.fold_in(key, 8),
        "split(split[0])[0]": jax.random.split(a)[0],
    }
    n = 2**18
    d = {name: _decisions(fmt, k, n) for name, k in derived.items()}
    names = list(d)
    for i, p in enumerate(names):
        for q in names[i + 1 :]:
            r = float(np.mean(d[p] * d[q]))
            assert abs(r * math.sqrt(n)) < Z, f"{fmt.name}: {p} vs {q} correlate ({r:.3f})"


def test_one_key_on_two_arrays_of_one_shape_gives_identical_decisions():
    # Documented behaviour (formats.md): the bits depend on the key and the
    # element index only. Code rounding several arrays must split its key.
    key = jax.random.key(5)
    x = jnp.full(1000, 1 + 2.0**-8, jnp.float32)
    y = jnp.full(1000, 2 * (1 + 2.0**-8), jnp.float32)  # also halfway, one binade up
    rx = dtypes.bfloat16.round(x, rounding="stochastic", key=key) > 1.0
    ry = dtypes.bfloat16.round(y, rounding="stochastic", key=key) > 2.0
    assert bool(jnp.all(rx == ry))
    assert 400 < int(rx.sum()) < 600


@functools.cache
def _count_up(fmt):
    return jax.jit(lambda x, key: (fmt.round(x, rounding="stochastic", key=key) > x[1]).sum())


def _rounds_up(fmt, x, key, chunks):
    f = _count_up(fmt)
    return sum(int(f(x, jax.random.fold_in(key, i))) for i in range(chunks))


def test_integer_probabilities_resolve_far_below_2_to_the_minus_24():
    """An element 2**-30 above a code (scale 1): rounds up with probability 2**-30.

    2**28 draws: the expected count is 0.25; a count of 5 or more has probability
    6e-6. With 24 random bits (the old floor) the expected count was 16.
    """
    chunk = 2**24
    x = jnp.full(chunk, 2.0**-30, jnp.float32).at[0].set(127.0)
    # element 0 (127) never counts: it rounds to itself, not above x[1]
    up = _rounds_up(dtypes.int8, x, jax.random.key(2), 16) - 16
    assert up <= 4, f"{up} of 2**28 rounded up; expected 0.25"


def test_integer_probability_2_to_the_minus_20_is_calibrated():
    """p = 2**-20 over 2**24 draws: expected 16, Poisson sd 4; accepted 16 +- 5 sd."""
    chunk = 2**24
    x = jnp.full(chunk, 2.0**-20, jnp.float32).at[0].set(127.0)
    up = _rounds_up(dtypes.int8, x, jax.random.key(4), 1) - 1
    assert abs(up - 16) <= 20, up


def test_negative_values_round_with_the_exact_probability():
    """-2**-30 (scale 1) rounds to -1 with probability 2**-30, not via 1 - 2**-30 -> 1."""
    chunk = 2**24
    x = jnp.full(chunk, -(2.0**-30), jnp.float32).at[0].set(127.0)
    f = jax.jit(lambda v, k: (dtypes.int8.round(v, rounding="stochastic", key=k) < 0).sum())
    down = sum(int(f(x, jax.random.fold_in(jax.random.key(9), i))) for i in range(4))
    assert down <= 3, f"{down} of 2**26 rounded to -1; expected 0.06"


def test_bfloat16_resolves_float32s_last_bit():
    """1 + 2**-23 (one float32 ulp) rounds up onto bfloat16 with probability 2**-16.

    2**24 draws: expected 256, sd 16; accepted within 5 sd.
    """
    x = jnp.full(2**24, 1 + 2.0**-23, jnp.float32)
    up = int((dtypes.bfloat16.round(x, rounding="stochastic", key=jax.random.key(8)) > 1).sum())
    assert abs(up - 256) < 80, up


def test_stochastic_overflow_has_the_probability_of_the_distance():
    """Just above float16's max (65504, spacing 32 there): 65512 overflows to inf with p = 1/4.

    A saturating format never overflows; it returns max (formats.md).
    """
    n = 2**16
    x = jnp.full(n, 65512.0, jnp.float32)
    key = jax.random.key(12)
    r = np.asarray(dtypes.float16.round(x, rounding="stochastic", key=key))
    assert set(np.unique(r).tolist()) <= {65504.0, np.inf}
    frac = float(np.isinf(r).mean())
    sd = math.sqrt(0.25 * 0.75 / n)
    assert abs(frac - 0.25) < Z * sd, frac
    sat = FloatFormat(5, 10, saturate=True)
    assert set(np.unique(np.asarray(sat.round(x, rounding="stochastic", key=key))).tolist()) == {
        65504.0
    }
    # a scaled int encoding never overflows at all: absmax scaling keeps codes in range
    y = np.asarray(dtypes.int8.round(x, rounding="stochastic", key=key, scaling=PerTensor()))
    assert np.isfinite(y).all()
