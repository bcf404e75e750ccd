"""Edges the audit of issue 11 found, each against an independent expectation.

- Directed rounding of scaled encodings where `x * (qmax / absmax)` is a float32
  subnormal: XLA on CPU flushes the product to zero, yet `up` of a positive
  value must give the code above zero (the exact product is positive). numpy,
  which does not flush, is the reference (`reference.int_quantize`).
- NaN into a format without a NaN code under `jit`: the stored code is the
  same whichever path stores it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import int_quantize

import dtypes
from dtypes import FloatFormat, PerAxis, PerTensor

DIRECTED = ("up", "down", "toward_zero", "nearest_even", "nearest_away")


@pytest.mark.parametrize("fmt", [dtypes.int8, dtypes.int4, dtypes.int2], ids=lambda f: f.name)
@pytest.mark.parametrize("mode", DIRECTED)
def test_directed_rounding_sees_the_sign_of_a_subnormal_product(fmt, mode, eager_and_jit):
    x = np.array([2e-38, -2e-38, 3e-37, -5e-38, 100.0, -1e-30], np.float32)
    codes = eager_and_jit(lambda v: fmt.encode(v, rounding=mode).decode())(x)
    want_codes, want_scale = int_quantize(x, fmt.qmax, mode=mode)
    np.testing.assert_array_equal(np.asarray(codes), want_codes * want_scale)


def test_the_audit_example():
    enc = dtypes.int4.encode(jnp.array([2e-38, 100.0]), rounding="up")
    assert (np.asarray(enc.decode()) / np.asarray(enc.scale)).round().tolist() == [1.0, 7.0]
    enc = dtypes.int4.encode(jnp.array([-2e-38, 100.0]), rounding="down")
    assert (np.asarray(enc.decode()) / np.asarray(enc.scale)).round().tolist() == [-1.0, 7.0]


@pytest.mark.parametrize("mode", ["up", "down"])
def test_scaled_float_directed_rounding_of_a_subnormal_product(mode, eager_and_jit):
    # e4m3fn scaled by 448/100: 2e-38 * 4.48 is a float32 subnormal; up gives the
    # smallest e4m3fn subnormal 2**-9 (times the scale), down gives zero
    fmt = dtypes.float8_e4m3fn
    x = np.array([2e-38, -2e-38, 100.0], np.float32)
    got = np.asarray(eager_and_jit(lambda v: fmt.round(v, scaling=PerTensor(), rounding=mode))(x))
    scale = np.float32(100.0) / np.float32(448.0)
    tiny = np.float32(2.0**-9) * scale
    if mode == "up":
        assert got[:2].tolist() == [tiny, -0.0]
    else:
        assert got[:2].tolist() == [0.0, -tiny]
    assert got[2] == 100.0


def test_per_axis_rows_with_subnormal_products_round_up():
    x = np.array([[1e30, 1e-8], [3.0, -1.0]], np.float32)  # 1e-8 * 127 / 1e30 is subnormal
    got = np.asarray(dtypes.int8.encode(x, scaling=PerAxis(0), rounding="up").data)
    want, _ = int_quantize(x, 127, kind="axis", axis=0, mode="up")
    np.testing.assert_array_equal(got, want)


def test_nan_into_a_format_without_nan_code_under_jit_stores_one_code():
    # eagerly refused; under tracing both storage paths give code 0 (+0), as
    # ml_dtypes' float4_e2m1fn stores NaN with magnitude 0
    fmt = FloatFormat(2, 1, finite=True)
    x = jnp.array([jnp.nan, -jnp.nan, 1.0], jnp.float32)
    near = jax.jit(lambda v: fmt.encode(v).decode())(x)
    up = jax.jit(lambda v: fmt.encode(v, rounding="up").decode())(x)
    assert np.asarray(near).tolist() == [0.0, 0.0, 1.0]
    assert np.asarray(up).tolist() == [0.0, 0.0, 1.0]
    with pytest.raises(dtypes.NonFiniteError, match="no NaN code"):
        fmt.encode(x)
