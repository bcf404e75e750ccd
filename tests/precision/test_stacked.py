"""Stacked layers outside `apply`: a stack scaled per layer maps under `vmap` and `scan`.

A `(layers, in, out)` stack whose scales have a leading axis per layer
(`PerAxis(0)`, `PerAxis((0, -1))`, blocks along another axis) is mapped by
JAX like any array: each slice is one layer's codes and scales, and its
scaling follows (`Scaling.refit`). Each result is compared with plain JAX on
the decoded weights.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import dtypes
import precision
from precision import CheckpointError, Tensor
from precision._checkpoint._layout import scaling_from_json

rng = np.random.default_rng(0)
W = rng.standard_normal((3, 8, 5)).astype(np.float32)
X = jnp.asarray(rng.standard_normal((2, 8)).astype(np.float32))

PER_LAYER = [dtypes.PerAxis(0), dtypes.PerAxis((0, -1)), dtypes.PerBlock(4, axis=1)]
# int2 packs as int4 does (more codes to a byte): under the hunt profile only.
FORMATS = ["int8", "int4", "uint4", "nf4", "float8_e4m3fn"]
if os.environ.get("HYPOTHESIS_PROFILE") == "hunt":
    FORMATS.append("int2")


def _layer(w, x):
    return jnp.tanh(x @ w)


def _reference(t: Tensor) -> np.ndarray:
    decoded = jnp.asarray(np.asarray(t))  # the decoded weights, then plain JAX
    return np.asarray(jnp.stack([_layer(decoded[i], X) for i in range(decoded.shape[0])]))


def _scanned(t: Tensor):
    step = precision.apply(_layer)
    return lax.scan(lambda c, w: (c, step(w, X)), 0, t)[1]


def _vmapped(t: Tensor):
    return jax.vmap(precision.apply(_layer), in_axes=(0, None))(t, X)


@pytest.mark.parametrize("scaling", PER_LAYER, ids=str)
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("mapped", [_vmapped, _scanned], ids=["vmap", "scan"])
def test_a_stack_scaled_per_layer_maps_from_outside_apply(name, scaling, mapped):
    t = Tensor(W).to_reduced_precision(name, scaling=scaling)
    ref = _reference(t)
    for run in (jax.jit(mapped), mapped):
        np.testing.assert_allclose(np.asarray(run(t)), ref, rtol=2e-6, atol=2e-7)


def test_one_layer_of_the_stack_has_its_own_scaling():
    seen = {}

    def grab(w):
        seen["scaling"] = w.encoded.scaling
        return jnp.zeros(())

    for scaling, one_layer in [
        (dtypes.PerAxis(0), dtypes.PerTensor()),
        (dtypes.PerAxis((0, -1)), dtypes.PerAxis(1)),
        (dtypes.PerAxis((0, 2), power_of_two=True), dtypes.PerAxis(1, power_of_two=True)),
        (dtypes.PerBlock(4, axis=1), dtypes.PerBlock(4, axis=0)),
        (dtypes.PerBlock(4, axis=-1), dtypes.PerBlock(4, axis=-1)),
    ]:
        t = Tensor(W).to_reduced_precision("int8", scaling=scaling)
        jax.vmap(grab)(t)
        assert seen["scaling"] == one_layer, scaling


@pytest.mark.parametrize("name", ["int8", "int4", "float8_e4m3fn"])
def test_encodings_made_under_vmap_come_out_scaled_per_example(name):
    """Per-tensor encodings of each slice, made under `vmap`, are `PerAxis(0)` of the stack."""
    per_tensor = dtypes.PerTensor()
    encode = jax.vmap(lambda w: Tensor(w).to_reduced_precision(name, scaling=per_tensor))
    made = jax.jit(encode)(jnp.asarray(W))
    assert made.encoded.scaling == dtypes.PerAxis(0)
    assert made.format.name == name
    for i in range(W.shape[0]):  # each slice as it would be encoded alone
        alone = Tensor(W[i]).to_reduced_precision(name, scaling=per_tensor)
        np.testing.assert_array_equal(np.asarray(made)[i], np.asarray(alone))
    # a consistent Tensor: it indexes, saves and loads like one made directly
    direct = Tensor(W).to_reduced_precision(name, scaling=dtypes.PerAxis(0))
    np.testing.assert_array_equal(np.asarray(made), np.asarray(direct))
    assert made.nbytes == direct.nbytes


def test_several_axes_round_trip_through_a_checkpoint(tmp_path):
    t = Tensor(W).to_reduced_precision("int4", scaling=dtypes.PerAxis((0, -1)))
    path = tmp_path / "stack.safetensors"
    precision.save(path, {"w": t})
    back = precision.load(path)["w"]
    assert back.encoded.scaling == dtypes.PerAxis((0, -1))
    np.testing.assert_array_equal(np.asarray(back), np.asarray(t))


@pytest.mark.parametrize("axis", [[0], [0, 0], [0, "1"], [0, 2**40], [], [0, True]])
def test_the_reader_refuses_axis_lists_no_writer_writes(axis):
    spec = {"type": "per-axis", "axis": axis, "power_of_two": False, "scale_format": "float32"}
    with pytest.raises(CheckpointError):
        scaling_from_json(spec)
