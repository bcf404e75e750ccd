"""Asymmetric unsigned integers (uint8, uint4 with zero points) against a numpy reference.

The reference follows the rules stated in `dtypes._asymmetric` with numpy
float32 operations, one per group for the scale, zero point and reciprocal.
"""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dtypes
from dtypes import AsymmetricIntFormat, PerBlock, PerTensor
from dtypes._format import packed_length
from dtypes._packing import unpack

UINT8, UINT4 = dtypes.get("uint8"), dtypes.get("uint4")
F32 = np.float32


def reference(x: np.ndarray, bits: int, block: int | None, calibration: str, scale_dtype=F32):
    """(codes, stored scales, zero points, decoded) by the asymmetric rules, in numpy."""
    qmax = (1 << bits) - 1
    n = x.shape[-1]
    size = n if block is None else block
    rows = x.reshape(-1, n) if block is not None else x.reshape(1, -1)
    if block is None:
        size = rows.shape[-1]
    nb = -(-rows.shape[-1] // size)
    padded = np.zeros((rows.shape[0], nb * size), F32)
    padded[:, : rows.shape[-1]] = rows
    g = padded.reshape(rows.shape[0], nb, size)
    if calibration == "minmax":
        hi, lo = np.maximum(g.max(-1), 0), np.minimum(g.min(-1), 0)
    else:
        hi = np.abs(g).max(-1)
        lo = -hi
    span = (hi - lo).astype(F32)
    scale = np.where(span == 0, F32(1), np.maximum((span / F32(qmax)).astype(F32), F32(2.0**-126)))
    stored = scale.astype(scale_dtype)
    s32 = stored.astype(F32)
    inv = (F32(1) / s32).astype(F32)
    zp = np.clip(np.round((-lo * inv).astype(F32)), 0, qmax)
    y = (g * inv[..., None]).astype(F32)
    codes = np.clip(np.round(y) + zp[..., None], 0, qmax)
    values = ((codes - zp[..., None]) * s32[..., None]).astype(F32)
    cut = rows.shape[-1]
    codes = codes.reshape(rows.shape[0], -1)[:, :cut].reshape(x.shape)
    values = values.reshape(rows.shape[0], -1)[:, :cut].reshape(x.shape)
    return codes.astype(np.uint8), stored, zp.astype(np.uint8), values


CASES = [
    pytest.param(UINT8, None, "minmax", F32, id="uint8-tensor"),
    pytest.param(UINT8, 64, "minmax", F32, id="uint8-block64"),
    pytest.param(UINT4, 32, "minmax", F32, id="uint4-block32"),
    pytest.param(UINT4, 128, "minmax", ml_dtypes.bfloat16, id="uint4-block128-bf16"),
    pytest.param(
        AsymmetricIntFormat(4, calibration="absmax"), 32, "absmax", F32, id="uint4-absmax"
    ),
    pytest.param(
        AsymmetricIntFormat(8, calibration="absmax"),
        64,
        "absmax",
        np.float16,
        id="uint8-absmax-f16",
    ),
]


@pytest.mark.parametrize(("fmt", "block", "calibration", "scale_dtype"), CASES)
def test_codes_scales_and_zero_points_match_numpy(
    fmt, block, calibration, scale_dtype, eager_and_jit
):
    rng = np.random.default_rng(fmt.bits + (block or 0))
    x = (rng.standard_normal((3, 200)) + rng.uniform(-2, 2, (3, 1))).astype(F32)
    x[1, :64] = np.abs(x[1, :64])  # a non-negative region: zero point 0
    x[2, :32] = 0.0
    name = {F32: "float32", ml_dtypes.bfloat16: "bfloat16", np.float16: "float16"}[scale_dtype]
    scaling = PerTensor(scale_format=name) if block is None else PerBlock(block, scale_format=name)
    enc = eager_and_jit(lambda v: fmt.encode(v, scaling=scaling))(x)
    codes, stored, zp, values = reference(x, fmt.bits, block, calibration, scale_dtype)
    got = enc.data if fmt.bits == 8 else unpack(enc.data, fmt.bits, x.shape[-1], signed=False)
    np.testing.assert_array_equal(np.asarray(got), codes)
    np.testing.assert_array_equal(
        np.asarray(enc.scale).astype(F32).reshape(stored.shape), stored.astype(F32)
    )
    np.testing.assert_array_equal(np.asarray(enc.zero_point).reshape(zp.shape), zp)
    np.testing.assert_array_equal(np.asarray(enc.decode()), values)
    assert enc.nbytes == fmt.nbytes(x.shape, scaling)
    groups = 1 if block is None else 3 * -(-200 // block)
    assert enc.nbytes == 3 * packed_length(200, fmt.bits) + groups * (
        np.dtype(scale_dtype).itemsize + 1
    )


def test_minmax_stores_zero_exactly():
    x = np.array([[-1.3, 0.0, 0.7, 2.9, 0.0]], F32)
    for fmt in (UINT8, UINT4):
        out = np.asarray(fmt.round(x))
        assert out[0, 1] == 0.0
        assert out[0, 4] == 0.0
        assert np.abs(out - x).max() <= (2.9 + 1.3) / fmt.qmax / 2 * 1.0001


@given(
    st.lists(st.floats(-1e4, 1e4, width=32), min_size=1, max_size=48),
    st.sampled_from([4, 8]),
)
def test_error_is_at_most_one_step(values, bits):
    fmt = UINT8 if bits == 8 else UINT4
    x = np.asarray(values, F32)
    enc = fmt.encode(x)
    step = float(np.asarray(enc.scale).reshape(()))
    err = np.abs(np.asarray(enc.decode(), np.float64) - x)
    # half a step from rounding, plus the zero point's own rounding at the range ends
    assert err.max() <= step * 1.0 + 1e-6 * np.abs(x).max()


def test_directed_and_stochastic_modes():
    x = np.random.default_rng(0).uniform(-1, 3, (2, 64)).astype(F32)
    ref = UINT8.round(x)
    down = UINT8.round(x, rounding="down")
    up = UINT8.round(x, rounding="up")
    assert (np.asarray(down) <= np.asarray(ref) + 1e-6).all()
    assert (np.asarray(up) >= np.asarray(ref) - 1e-6).all()
    s = UINT8.round(x, rounding="stochastic", key=jax.random.key(1))
    assert (
        np.abs(np.asarray(s) - x).max() <= float(np.asarray(UINT8.encode(x).scale).max()) * 1.0001
    )


def test_errors_are_precise():
    with pytest.raises(dtypes.FormatError, match="2 to 8"):
        AsymmetricIntFormat(9)
    with pytest.raises(dtypes.FormatError, match="minmax"):
        AsymmetricIntFormat(4, calibration="mse")
    with pytest.raises(dtypes.NonFiniteError):
        UINT4.encode(np.array([1.0, np.inf], F32))
    with pytest.raises(dtypes.ScalingError, match="float8_e4m3fn"):
        UINT4.encode(np.ones(16, F32), scaling=PerBlock(16, scale_format="float8_e4m3fn"))
