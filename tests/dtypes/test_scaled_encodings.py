"""Scaled float encodings, the OCP MX compositions, and non-finite input to a scaled encoding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from checks import assert_same_floats, fid
from reference import float_scaled, int_quantize, layout_of

import dtypes
from dtypes import Encoded, FloatFormat, PerAxis, PerBlock, PerTensor

MXFP4_ELEMENT = FloatFormat(2, 1, finite=True)


def _blocks(shape=(4, 100), seed=0) -> np.ndarray:
    """Values whose magnitude changes from block to block, with an all-zero block."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    nblk = -(-shape[-1] // 32)
    k = np.repeat(rng.integers(-12, 12, (shape[0], nblk)), 32, axis=1)[:, : shape[-1]]
    x *= np.float32(2.0) ** k.astype(np.float32)
    x[-1, 32:64] = 0.0
    return x


def _elements(enc: Encoded) -> np.ndarray:
    """The stored element values (scale 1), whatever the container."""
    ones = Encoded(
        enc.data,
        jnp.ones_like(enc.scale),
        enc.format,
        enc.scaling,
        enc.shape[-1] if enc.format.packed else None,
    )
    return np.asarray(ones.decode())


def _scale(enc: Encoded) -> np.ndarray:
    return np.asarray(enc.scaling.broadcast(enc.scale, enc.shape))


MX = [
    pytest.param(dtypes.float8_e4m3fn, id="MXFP8"),
    pytest.param(MXFP4_ELEMENT, id="MXFP4"),
    pytest.param(FloatFormat(3, 2, finite=True), id="MXFP6_e3m2"),
    pytest.param(FloatFormat(2, 3, finite=True), id="MXFP6_e2m3"),
]


@pytest.mark.parametrize("fmt", MX)
def test_mx_float_composition(fmt, eager_and_jit):
    """OCP MX: scale 2**(floor(log2 absmax) - emax) per 32-block, elements saturate."""
    x = _blocks()
    scaling = PerBlock(32, power_of_two=True)
    enc = eager_and_jit(lambda v: fmt.encode(v, scaling=scaling))(jnp.asarray(x))
    assert enc.scale.shape == (4, 4)
    ref_elems, ref_scale = float_scaled(
        x, layout_of(fmt), kind="block", axis=-1, size=32, power_of_two=True
    )
    np.testing.assert_array_equal(_scale(enc), ref_scale)
    s = _scale(enc)
    assert np.all(np.log2(s) == np.round(np.log2(s))), "MX scales are powers of two"
    assert_same_floats(_elements(enc), ref_elems, x, f"{fmt.name} MX elements")
    assert_same_floats(enc.decode(), ref_elems * ref_scale, x, f"{fmt.name} MX decode")
    assert enc.nbytes == fmt.nbytes(x.shape, scaling)


def test_mxfp4_takes_four_bits_a_value():
    x = _blocks((2, 64))
    enc = MXFP4_ELEMENT.encode(x, scaling=PerBlock(32, power_of_two=True))
    assert enc.data.dtype == jnp.uint8
    assert enc.data.shape == (2, 32)
    assert enc.nbytes == 2 * 32 + 4 * 2 * 2


def test_mx_int8_composition(eager_and_jit):
    fmt = dtypes.int8
    x = _blocks(seed=1)
    scaling = PerBlock(32, power_of_two=True)
    enc = eager_and_jit(lambda v: fmt.encode(v, scaling=scaling))(jnp.asarray(x))
    codes, scale = int_quantize(x, 127, kind="block", axis=-1, size=32, power_of_two=True)
    np.testing.assert_array_equal(_elements(enc), codes)
    np.testing.assert_array_equal(_scale(enc), scale)


SCALED_FLOATS = [
    pytest.param(f, s, id=f"{f.name}-{s}")
    for f in (dtypes.float8_e4m3fn, dtypes.float8_e5m2, MXFP4_ELEMENT, dtypes.float16)
    for s in (PerTensor(), PerAxis(0), PerBlock(32), PerBlock(3, axis=0))
]


@pytest.mark.parametrize(("fmt", "scaling"), SCALED_FLOATS)
def test_absmax_scaled_float_elements(fmt, scaling, eager_and_jit):
    """scale = absmax / max; elements x * (max / absmax), rounded nearest-even, saturated."""
    x = _blocks(seed=2)
    kw = {
        PerTensor: {"kind": "tensor"},
        PerAxis: {"kind": "axis", "axis": getattr(scaling, "axis", 0)},
        PerBlock: {
            "kind": "block",
            "axis": getattr(scaling, "axis", -1),
            "size": getattr(scaling, "size", 32),
        },
    }[type(scaling)]
    enc = eager_and_jit(lambda v: fmt.encode(v, scaling=scaling))(jnp.asarray(x))
    ref_elems, ref_scale = float_scaled(x, layout_of(fmt), **kw)
    assert_same_floats(_elements(enc), ref_elems, x, f"{fmt.name} {scaling} elements")
    np.testing.assert_allclose(_scale(enc), ref_scale, rtol=1.2e-7, atol=0)
    # the group's absmax lands on ±max (up to the float32 rounding of max/absmax)
    e = np.abs(_elements(enc))
    assert e.max() == fmt.max


@pytest.mark.parametrize(("fmt", "scaling"), SCALED_FLOATS)
def test_float_scaled_when_asked_only(fmt, scaling):
    x = _blocks(seed=3)
    assert fmt.encode(x).scale is None
    assert fmt.encode(x, scaling=scaling).scale is not None


@pytest.mark.parametrize("fmt", [dtypes.bfloat16, dtypes.tf32], ids=fid)
def test_scaling_a_format_with_float32_range_is_refused(fmt):
    with pytest.raises(ValueError, match=f"{fmt.name} already has float32's exponent range"):
        fmt.encode(np.ones((2, 4), np.float32), scaling=PerTensor())


# -- non-finite input ---------------------------------------------------------

NONFINITE_CASES = [
    pytest.param(dtypes.int8, PerAxis(0), id="int8-axis0"),
    pytest.param(dtypes.int4, PerBlock(4), id="int4-block4"),
    pytest.param(dtypes.int1, PerAxis(0), id="int1-axis0"),
    pytest.param(dtypes.float8_e4m3fn, PerBlock(4), id="e4m3fn-block4"),
    pytest.param(MXFP4_ELEMENT, PerBlock(4, power_of_two=True), id="mxfp4-block4"),
]


def _poisoned() -> np.ndarray:
    x = np.arange(1, 49, dtype=np.float32).reshape(6, 8) / 7
    x[1, 2] = np.nan
    x[3, 0] = np.inf
    x[3, 5] = -np.inf
    return x


@pytest.mark.parametrize(("fmt", "scaling"), NONFINITE_CASES)
def test_non_finite_input_is_refused_eagerly_with_count_and_place(fmt, scaling):
    x = _poisoned()
    with pytest.raises(ValueError, match=r"3 non-finite") as info:
        fmt.encode(x, scaling=scaling)
    assert "(1, 2)" in str(info.value)
    assert fmt.name in str(info.value)
    with pytest.raises(ValueError, match=r"3 non-finite"):
        fmt.round(x, scaling=scaling)


@pytest.mark.parametrize(("fmt", "scaling"), NONFINITE_CASES)
def test_non_finite_input_under_jit_poisons_only_its_groups_scale(fmt, scaling):
    x = _poisoned()
    enc = jax.jit(lambda v: fmt.encode(v, scaling=scaling))(jnp.asarray(x))
    scale = np.asarray(enc.scale)
    bad = np.zeros(scale.shape, bool)
    if isinstance(scaling, PerAxis):
        bad[[1, 3]] = True
    else:  # blocks of 4 along the last axis
        bad[1, 0] = bad[3, 0] = bad[3, 1] = True
    assert np.isnan(scale[bad]).all()
    assert np.isfinite(scale[~bad]).all()
    assert (scale[~bad] > 0).all()


# -- vmap -------------------------------------------------------------------------

VMAP_CASES = [
    pytest.param(dtypes.bfloat16, None, id="bfloat16"),
    pytest.param(dtypes.float8_e5m2, None, id="e5m2"),
    pytest.param(MXFP4_ELEMENT, PerBlock(32, power_of_two=True), id="mxfp4"),
    pytest.param(dtypes.int8, None, id="int8-tensor"),
    pytest.param(dtypes.int4, PerAxis(0), id="int4-axis0"),
    pytest.param(dtypes.int2, PerBlock(8), id="int2-block8"),
    pytest.param(dtypes.int1, None, id="int1"),
]


@pytest.mark.parametrize(("fmt", "scaling"), VMAP_CASES)
def test_vmap_matches_unbatched(fmt, scaling):
    xs = np.random.default_rng(5).standard_normal((5, 3, 40)).astype(np.float32)
    batched = jax.vmap(lambda v: fmt.encode(v, scaling=scaling))(jnp.asarray(xs))
    decoded = np.asarray(jax.vmap(lambda e: e.decode())(batched))
    rounded = np.asarray(jax.vmap(lambda v: fmt.round(v, scaling=scaling))(jnp.asarray(xs)))
    for b in range(xs.shape[0]):
        one = fmt.encode(xs[b], scaling=scaling)
        np.testing.assert_array_equal(
            np.asarray(batched.data[b]).view(np.uint8), np.asarray(one.data).view(np.uint8)
        )
        if one.scale is not None:
            np.testing.assert_array_equal(np.asarray(batched.scale[b]), np.asarray(one.scale))
        np.testing.assert_array_equal(decoded[b], np.asarray(one.decode()))
        np.testing.assert_array_equal(rounded[b], np.asarray(fmt.round(xs[b], scaling=scaling)))
