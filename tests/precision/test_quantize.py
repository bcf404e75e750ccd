"""`precision.quantize`: one call from a model's parameters to what `apply` runs.

Scales are checked against numpy (absmax per output channel or per block of inputs,
divided by the format's largest code); the model's output against plain JAX on the
decoded weights.
"""

from __future__ import annotations

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dtypes
import precision


class Block(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        h = nn.Embed(50, 64)(tokens)
        h = nn.LayerNorm()(h)
        h = nn.gelu(nn.Dense(96)(h))
        return nn.Dense(64, name="out")(h)


def _variables():
    tokens = jnp.arange(12).reshape(2, 6) % 50
    return Block().init(jax.random.key(0), tokens), tokens


def _kinds(tree):
    return {
        jax.tree_util.keystr(path): (leaf.format.name if isinstance(leaf, precision.Tensor) else "")
        for path, leaf in jax.tree_util.tree_leaves_with_path(
            tree, is_leaf=lambda x: isinstance(x, precision.Tensor)
        )
    }


@pytest.mark.parametrize("order", ["jit-first", "eager-first"])
def test_int8_matrices_per_output_channel_the_rest_kept(order):
    variables, tokens = _variables()
    quantize = jax.jit(lambda v: precision.quantize(v, "int8"))
    first, second = (quantize, precision.quantize) if order == "jit-first" else (
        precision.quantize, quantize)  # fmt: skip
    q = first(variables) if order == "jit-first" else first(variables, "int8")
    again = second(variables, "int8") if order == "jit-first" else second(variables)
    kinds = _kinds(q)
    assert {k: v for k, v in kinds.items() if v} == {
        "['params']['Dense_0']['kernel']": "int8",
        "['params']['out']['kernel']": "int8",
    }
    kernel = np.asarray(variables["params"]["Dense_0"]["kernel"])
    t = q["params"]["Dense_0"]["kernel"]
    want = np.abs(kernel).max(axis=0, keepdims=True) / 127  # per output channel
    np.testing.assert_allclose(np.asarray(t.encoded.scale), want, rtol=2e-7)
    for a, b in zip(jax.tree_util.tree_leaves(q), jax.tree_util.tree_leaves(again), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # what apply runs: the model on the decoded weights, nothing else changed
    got = precision.apply(Block().apply)(q, tokens)
    decoded = precision.to_full_precision(q)
    np.testing.assert_allclose(
        np.asarray(got), np.asarray(Block().apply(decoded, tokens)), rtol=1e-5, atol=1e-6
    )


def test_int4_blocks_run_along_the_inputs_of_each_output_channel():
    kernel = np.random.default_rng(0).standard_normal((80, 6)).astype(np.float32)  # 80 = 32+32+16
    q = precision.quantize({"dense": {"kernel": kernel}}, "int4")["dense"]["kernel"]
    assert str(q.scaling) == "per-block 32 on axis -2"
    blocks = [kernel[0:32], kernel[32:64], kernel[64:80]]
    want = np.stack([np.abs(b).max(axis=0) for b in blocks]) / 7
    np.testing.assert_allclose(np.asarray(q.encoded.scale), want, rtol=2e-7)
    wide = precision.quantize({"k": kernel}, "int4", block=128)["k"]
    np.testing.assert_allclose(
        np.asarray(wide.encoded.scale), np.abs(kernel).max(axis=0, keepdims=True) / 7, rtol=2e-7
    )


def test_equinox_weights_are_scaled_along_their_first_axis():
    model = eqx.nn.MLP(16, 4, 32, depth=2, key=jax.random.key(1))
    q = precision.quantize(model, "int8", out_axis=0)
    w = np.asarray(model.layers[0].weight)  # (out, in)
    t = q.layers[0].weight
    assert t.format.name == "int8"
    np.testing.assert_allclose(
        np.asarray(t.encoded.scale), np.abs(w).max(axis=1, keepdims=True) / 127, rtol=2e-7
    )
    assert not isinstance(q.layers[0].bias, precision.Tensor)
    x = jnp.ones(16)
    got = precision.apply(lambda m, x: m(x))(q, x)
    want = precision.to_full_precision(q)(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_formats_with_their_own_scaling_and_unscaled_floats():
    params = {"w": jnp.ones((64, 32)), "ln": {"scale": jnp.ones((2, 32))}}
    assert str(precision.quantize(params, "mxfp4")["w"].scaling) == str(
        dtypes.ENCODINGS["mxfp4"].scaling
    )
    assert precision.quantize(params, "bfloat16")["w"].scaling is None
    assert str(precision.quantize(params, "float8_e4m3fn")["w"].scaling) == str(dtypes.PerAxis(-1))
    assert _kinds(precision.quantize(params, "int8", keep=None))["['ln']['scale']"] == "int8"
    assert _kinds(precision.quantize(params, "int8", keep=r"^\['w'\]"))["['w']"] == ""


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"block": 0}, dtypes.ScalingError, "block must be a positive int"),
        ({"block": 32.0}, dtypes.ScalingError, "block must be a positive int"),
        ({"out_axis": 1}, dtypes.ScalingError, "out_axis must be -1"),
        ({"keep": 3}, dtypes.PrecisionTypeError, "keep must be a regex"),
        ({"format": "int9"}, dtypes.FormatError, "int9"),
    ],
)
def test_bad_arguments_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        precision.quantize({"w": jnp.ones((4, 4))}, **kwargs)
