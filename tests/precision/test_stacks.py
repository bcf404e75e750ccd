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


def nvfp4_values(enc: dtypes.Encoded) -> np.ndarray:
    """An NVFP4 stack's values in numpy: e2m1 codes (two a byte, low nibble first) times
    (e4m3 block scale times float32 tensor scale, that product first)."""
    data = np.asarray(enc.data)
    nibbles = np.stack([data & 0xF, data >> 4], axis=-1).reshape(*data.shape[:-1], -1)
    codes = nibbles[..., : enc.shape[-1]].astype(np.uint8).view(ml_dtypes.float4_e2m1fn)
    block = np.asarray(enc.scale).astype(np.float32)
    group = block * np.asarray(enc.tensor_scale, np.float32)  # () or (layers, 1, 1)
    return codes.astype(np.float32) * np.repeat(group, 16, axis=-1)[..., : enc.shape[-1]]


def _mapped_match(stack: precision.Tensor, values: np.ndarray) -> None:
    """`stack` under vmap and scan from outside `apply`, and scanned inside it, agrees
    with plain JAX on `values`."""
    layer = precision.apply(lambda w, x: jnp.tanh(x @ w))
    x = jnp.asarray(RNG.standard_normal((3, N_IN)).astype(np.float32))
    reference = np.stack([np.asarray(jnp.tanh(x @ jnp.asarray(v))) for v in values])
    step = lambda c, w: (c, layer(w, x))
    inside = lambda s, x: jax.lax.scan(lambda c, w: (c, jnp.tanh(x @ w)), 0, s)[1]
    for run in (
        jax.jit(jax.vmap(layer, in_axes=(0, None))),
        lambda s, x: jax.lax.scan(step, 0, s)[1],
        precision.apply(inside),  # one layer's codes and tensor scale per iteration
    ):
        np.testing.assert_allclose(np.asarray(run(stack, x)), reference, rtol=2e-6, atol=2e-6)


def test_an_nvfp4_stack_gets_a_tensor_scale_per_layer_and_maps(tmp_path):
    w = RNG.standard_normal((LAYERS, N_IN, N_OUT)).astype(np.float32)
    stack = precision.Tensor(w).to_reduced_precision("nvfp4")  # one tensor scale for all
    layer = precision.apply(lambda w, x: x @ w)
    with pytest.raises(ValueError, match="rank"):  # why it exists: JAX cannot slice ()
        jax.vmap(layer, in_axes=(0, None))(stack, jnp.ones((3, N_IN)))
    layered = precision.scales_per_layer(stack)
    enc = layered.encoded
    assert enc.tensor_scale.shape == (LAYERS, 1, 1)
    assert np.all(np.asarray(enc.tensor_scale) == np.asarray(stack.encoded.tensor_scale))
    np.testing.assert_array_equal(np.asarray(enc.data), np.asarray(stack.encoded.data))
    expected = nvfp4_values(stack.encoded)
    assert np.array_equal(layered.numpy().view(np.uint32), expected.view(np.uint32))
    assert layered.nbytes == stack.nbytes + 4 * (LAYERS - 1)
    _mapped_match(layered, expected)
    path = tmp_path / "stack.safetensors"  # layout 3 keeps the tensor scale's shape
    precision.save(path, {"w": layered})
    back = precision.load(path)["w"]
    assert back.encoded.tensor_scale.shape == (LAYERS, 1, 1)
    assert np.array_equal(back.numpy().view(np.uint32), expected.view(np.uint32))


def test_an_nvfp4_stack_encoded_layer_by_layer_under_vmap_is_whole(tmp_path):
    w = RNG.standard_normal((LAYERS, N_IN, N_OUT)).astype(np.float32)
    w *= np.logspace(-3, 2, LAYERS, dtype=np.float32)[:, None, None]  # tensor scales differ
    encode = lambda v: precision.Tensor(v).to_reduced_precision("nvfp4")
    made = jax.jit(jax.vmap(encode))(jnp.asarray(w))
    enc = made.encoded
    assert enc.tensor_scale.shape == (LAYERS, 1, 1)
    assert len(set(np.asarray(enc.tensor_scale).reshape(-1).tolist())) == LAYERS
    values = nvfp4_values(enc)
    assert np.array_equal(made.numpy().view(np.uint32), values.view(np.uint32))
    for i in range(LAYERS):  # each layer as it would be encoded alone
        alone = encode(w[i]).encoded
        np.testing.assert_array_equal(np.asarray(enc.data[i]), np.asarray(alone.data))
        assert np.array_equal(values[i].view(np.uint32), nvfp4_values(alone).view(np.uint32))
    one, some = made[2], made[1:4]  # cut with its tensor scale
    assert one.encoded.tensor_scale.shape == (1, 1)
    assert np.array_equal(one.numpy().view(np.uint32), values[2].view(np.uint32))
    assert np.array_equal(some.numpy().view(np.uint32), values[1:4].view(np.uint32))
    _mapped_match(made, values)
    path = tmp_path / "made.safetensors"
    precision.save(path, {"w": made})
    assert np.array_equal(precision.load(path)["w"].numpy().view(np.uint32), values.view(np.uint32))


def test_stacks_no_repetition_can_make_per_layer_are_refused():
    w = RNG.standard_normal((4, 8, 32)).astype(np.float32)
    nvfp4 = precision.Tensor(w).to_reduced_precision("nvfp4")
    with pytest.raises(dtypes.ScalingError, match="stacking axis"):
        precision.scales_per_layer(nvfp4, axis=-1)  # its blocks run along the last axis
    blocks = precision.Tensor(w).to_reduced_precision("int8", scaling=dtypes.PerBlock(2, axis=0))
    with pytest.raises(dtypes.ScalingError, match="stacking axis"):
        precision.scales_per_layer(blocks)
    shared = precision.Tensor(w).to_reduced_precision("int8")
    with pytest.raises(dtypes.ShapeError, match="axis 3 is not an axis of a 3-d stack"):
        precision.scales_per_layer(shared, axis=3)
