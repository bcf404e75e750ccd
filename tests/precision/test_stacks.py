"""Stacks with shared scales, mapped from outside `apply` after `scales_per_layer`.

References are independent of the code under test: each layer's values are the
stack's codes times its scales computed here in numpy (ml_dtypes for float8),
and each mapped layer's output is plain JAX on those decoded weights.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import dtypes
import precision

RNG = np.random.default_rng(11)
LAYERS, N_IN, N_OUT = 6, 32, 24

SHARED = [
    ("int8", dtypes.PerTensor()),
    ("int8", dtypes.PerAxis(-1)),
    ("int4", dtypes.PerTensor()),
    ("float8_e4m3fn", dtypes.PerTensor()),
    ("uint8", dtypes.PerTensor()),
]


def numpy_values(enc: dtypes.Encoded) -> np.ndarray:
    """The stack's values from its codes, scales and zero points, in numpy."""
    data = np.asarray(enc.data)
    if enc.format.name == "int4":  # two codes a byte, low nibble first, sign-extended
        lo, hi = (data & 0xF).astype(np.int8), (data >> 4).astype(np.int8)
        codes = np.stack([lo, hi], axis=-1).reshape(*data.shape[:-1], -1)[..., : enc.shape[-1]]
        codes = np.where(codes > 7, codes - 16, codes).astype(np.float32)
    elif enc.format.name == "float8_e4m3fn":
        codes = data.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    else:
        codes = data.astype(np.float32)
    if enc.zero_point is not None:
        codes = codes - np.asarray(enc.zero_point).astype(np.float32)
    return codes * np.asarray(enc.scale, np.float32)


@pytest.mark.parametrize(("fmt", "scaling"), SHARED, ids=lambda v: str(v))
def test_shared_scales_repeated_decode_the_same_and_map(fmt, scaling):
    w = RNG.standard_normal((LAYERS, N_IN, N_OUT)).astype(np.float32)
    stack = precision.Tensor(w).to_reduced_precision(fmt, scaling=scaling)
    layer = precision.apply(lambda w, x: x @ w)
    x = jnp.asarray(RNG.standard_normal((3, N_IN)).astype(np.float32))
    with pytest.raises(ValueError, match="inconsistent sizes"):  # why it exists
        jax.vmap(layer, in_axes=(0, None))(stack, x)

    layered = precision.scales_per_layer(stack)
    enc = layered.encoded
    assert enc.scale.shape[0] == LAYERS
    np.testing.assert_array_equal(np.asarray(enc.data), np.asarray(stack.encoded.data))
    expected = numpy_values(stack.encoded)  # the shared scale, broadcast by numpy
    assert np.array_equal(numpy_values(enc), expected)
    assert np.array_equal(layered.numpy().view(np.uint32), expected.view(np.uint32))
    assert layered.nbytes == stack.nbytes + (LAYERS - 1) * (
        stack.encoded.scale.nbytes + (0 if enc.zero_point is None else enc.zero_point[0].nbytes)
    )

    reference = np.stack([np.asarray(x @ jnp.asarray(expected[i])) for i in range(LAYERS)])
    mapped = jax.vmap(layer, in_axes=(0, None))(layered, x)
    np.testing.assert_allclose(np.asarray(mapped), reference, rtol=1e-5, atol=1e-5)

    square = RNG.standard_normal((LAYERS, N_IN, N_IN)).astype(np.float32) * 0.2
    square = precision.Tensor(square).to_reduced_precision(fmt, scaling=scaling)
    square = precision.scales_per_layer(square)
    step = lambda h, w: (jnp.tanh(jnp.asarray(layer(w, h))), None)
    got = jax.jit(lambda h, s: jax.lax.scan(step, h, s)[0])(x, square)
    h = x
    values = numpy_values(square.encoded)
    for i in range(LAYERS):
        h = jnp.tanh(h @ jnp.asarray(values[i]))
    np.testing.assert_allclose(np.asarray(got), np.asarray(h), rtol=1e-5, atol=1e-5)


def test_a_tree_is_walked_and_what_maps_already_passes_through():
    w = RNG.standard_normal((LAYERS, 8, 8)).astype(np.float32)
    per_layer = precision.Tensor(w).to_reduced_precision("int8", scaling=dtypes.PerAxis(0))
    shared = precision.Tensor(w).to_reduced_precision("int8", scaling=dtypes.PerTensor())
    tree = {"a": per_layer, "b": shared, "c": jnp.ones(3), "d": None}
    out = jax.jit(precision.scales_per_layer)(tree)
    assert out["a"].encoded.scale.shape == per_layer.encoded.scale.shape
    assert out["b"].encoded.scaling == dtypes.PerAxis(0)
    assert out["d"] is None
    np.testing.assert_array_equal(np.asarray(out["c"]), np.ones(3))
    bf16 = precision.Tensor(w).to_reduced_precision("bfloat16")
    assert precision.scales_per_layer(bf16) is bf16  # no scales to repeat


def test_stacks_no_repetition_can_make_per_layer_are_refused():
    w = RNG.standard_normal((4, 8, 32)).astype(np.float32)
    nvfp4 = precision.Tensor(w).to_reduced_precision("nvfp4")
    with pytest.raises(dtypes.ScalingError, match="one float32 tensor scale"):
        precision.scales_per_layer(nvfp4)
    blocks = precision.Tensor(w).to_reduced_precision("int8", scaling=dtypes.PerBlock(2, axis=0))
    with pytest.raises(dtypes.ScalingError, match="stacking axis"):
        precision.scales_per_layer(blocks)
    shared = precision.Tensor(w).to_reduced_precision("int8")
    with pytest.raises(dtypes.ShapeError, match="axis 3 is not an axis of a 3-d stack"):
        precision.scales_per_layer(shared, axis=3)
