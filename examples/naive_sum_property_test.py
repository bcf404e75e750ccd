"""Property-test a summation kernel and let hypothesis find its rounding bug.

`naive_sum` keeps its running total in bfloat16, as a kernel does when it
stores the accumulator in the format of its inputs: every partial sum is
rounded to bfloat16, so terms smaller than half a unit in the last place of
the total are lost, one after another. `fixed_sum` accumulates in float32
and rounds once, at the end.

The property: the kernel's result is within one bfloat16 ULP of the exact
sum. The data are values in [0, 2**16] drawn toward bfloat16's hard cases
(ties between neighbours, grid values, the smallest normal...), without
subnormals: cancellation, overflow and XLA's flushing of float32 subnormals
are separate properties.

    pytest examples/naive_sum_property_test.py   # the fixed kernel passes,
                                                 # and the naive one is caught
    python examples/naive_sum_property_test.py   # watch hypothesis shrink the bug
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import Phase, given, settings
from jax import lax

import dtypes
from precision.testing import arrays, assert_ulp_close

bf16 = dtypes.bfloat16


@jax.jit
def naive_sum(x: jax.Array) -> jax.Array:
    """Sequential sum with a bfloat16 accumulator (the bug)."""
    return lax.fori_loop(0, x.shape[0], lambda i, acc: bf16.round(acc + x[i]), jnp.float32(0))


@jax.jit
def fixed_sum(x: jax.Array) -> jax.Array:
    """Sequential sum with a float32 accumulator, rounded to bfloat16 once."""
    total = lax.fori_loop(0, x.shape[0], lambda i, acc: acc + x[i], jnp.float32(0))
    return bf16.round(total)


def exact_sum(x: np.ndarray) -> float:
    """The exact sum, rounded once to float64 (`math.fsum` is exact until then)."""
    return math.fsum(np.asarray(x, np.float64))


# Sixteen values in [0, 2**16] per example, drawn toward bfloat16's hard cases.
data = arrays(bf16, shape=16, min_value=0, max_value=2**16, allow_subnormal=False)


def check(kernel, x: np.ndarray) -> None:
    assert_ulp_close(kernel(x), exact_sum(x), bf16, max_ulps=1)


@settings(max_examples=200, deadline=None, database=None)
@given(data)
def test_fixed_sum_is_within_one_ulp(x):
    check(fixed_sum, x)


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    report_multiple_bugs=False,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],  # no "explain" pass: quicker
)
@given(data)
def naive_sum_is_within_one_ulp(x):
    """The same property for the naive kernel: hypothesis falsifies it."""
    check(naive_sum, x)


def test_hypothesis_catches_the_naive_sum():
    with pytest.raises(AssertionError, match="more than 1 ulp of bfloat16"):
        naive_sum_is_within_one_ulp()


if __name__ == "__main__":
    naive_sum_is_within_one_ulp()  # raises, after printing the shrunk counterexample
