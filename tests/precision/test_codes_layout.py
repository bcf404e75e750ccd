"""`layout="transposed"`: a kernel's codes held with the last two axes swapped.

The claim is that nothing but the held arrays changes: the same codes and scales as
the conversion without the layout (whose bits the oracle tests pin), the same logical
values, shape, scaling and bytes, the same outputs bit for bit from a Flax model under
`apply` (eager, jitted, under `vmap` and `scan`; its input gradient the same products
summed in the order the dot takes them), and a
GPU program that reads the held codes with the summed dim last on both operands
(`test_gpu_programs.py`). Every refusal names the value, the format and the fix.
"""

from __future__ import annotations

import copy
import pickle

import flax.linen as nn
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dtypes
import precision
from precision import Tensor

K, N = 48, 24

CASES = [
    ("int8", dtypes.PerAxis(-1), "int8"),
    ("int8", dtypes.PerTensor(), "int8"),
    ("float8_e4m3fn", dtypes.PerTensor(), precision.Contract("float8_e4m3fn")),
    (
        "float8_e4m3fn",
        dtypes.PerAxis(1),
        precision.Contract("float8_e4m3fn", scaling="rowwise"),
    ),
    ("float8_e5m2", dtypes.PerAxis(-1), None),
]
IDS = ["int8-per-channel", "int8-per-tensor", "e4m3-per-tensor", "e4m3-per-channel", "e5m2"]


def _weights(seed: int = 1) -> np.ndarray:
    w = np.array(jax.random.normal(jax.random.key(seed), (K, N)), np.float32)
    w[3, 5], w[7, 0] = 40.0, -0.0  # an outlier and a negative zero
    return w


@pytest.mark.parametrize(("name", "scaling", "contract"), CASES, ids=IDS)
def test_the_held_codes_are_the_plain_codes_swapped(name, scaling, contract):
    w = _weights()
    plain = Tensor(w).to_reduced_precision(name, scaling=scaling)
    held = Tensor(w).to_reduced_precision(name, scaling=scaling, layout="transposed")
    assert held.layout == "transposed"
    assert plain.layout is None
    assert held.shape == plain.shape == (K, N)
    assert held.scaling == plain.scaling  # as given (PerAxis(-1) stays -1)
    assert held.format == plain.format
    assert held.nbytes == plain.nbytes
    codes = np.asarray(held.encoded.data).view(np.uint8)
    assert codes.shape == (N, K)
    np.testing.assert_array_equal(codes, np.asarray(plain.encoded.data).view(np.uint8).T)
    np.testing.assert_array_equal(
        np.asarray(held.encoded.scale).reshape(-1), np.asarray(plain.encoded.scale).reshape(-1)
    )
    # the logical values, eagerly and inside jit, bit for bit (negative zero included)
    for values in (np.asarray(held), np.asarray(jax.jit(lambda t: t.to_full_precision())(held))):
        np.testing.assert_array_equal(values.view(np.uint32), np.asarray(plain).view(np.uint32))
    assert "layout=transposed" in repr(held)


@given(
    data=st.data(),
    shape=st.sampled_from([(3, 5), (2, 4, 6), (17, 33)]),
    name=st.sampled_from(["int8", "float8_e4m3fn", "float8_e5m2"]),
    axis=st.sampled_from([None, -1, -2, 0]),
)
def test_any_values_hold_the_same_codes(data, shape, name, axis):
    """Finite float32 values of every size (zeros, subnormals, float32's extremes)."""
    values = data.draw(
        hnp.arrays(
            np.float32, shape, elements=st.floats(width=32, allow_nan=False, allow_infinity=False)
        )
    )
    scaling = dtypes.PerTensor() if axis is None else dtypes.PerAxis(axis)
    plain = Tensor(values).to_reduced_precision(name, scaling=scaling)
    held = Tensor(values).to_reduced_precision(name, scaling=scaling, layout="transposed")
    bits = np.asarray(plain.encoded.data).view(np.uint8)
    np.testing.assert_array_equal(
        np.asarray(held.encoded.data).view(np.uint8), bits.swapaxes(-1, -2)
    )
    np.testing.assert_array_equal(
        np.asarray(held).view(np.uint32), np.asarray(plain).view(np.uint32)
    )


def test_converting_inside_jit_gives_the_same_tensor():
    w = _weights()
    eager = Tensor(w).to_reduced_precision("int8", scaling=dtypes.PerAxis(-1), layout="transposed")

    @jax.jit
    def convert(w):
        return Tensor(w).to_reduced_precision(
            "int8", scaling=dtypes.PerAxis(-1), layout="transposed"
        )

    jitted = convert(w)
    assert jitted.layout == "transposed"
    np.testing.assert_array_equal(np.asarray(jitted.encoded.data), np.asarray(eager.encoded.data))


class _MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.LayerNorm()(x)
        x = nn.gelu(nn.Dense(N)(x))
        return nn.Dense(10)(x)


def _model():
    x = jax.random.normal(jax.random.key(0), (16, K))
    params = _MLP().init(jax.random.key(2), x)
    return x, params


@pytest.mark.parametrize(("name", "scaling", "contract"), CASES, ids=IDS)
def test_a_flax_model_gives_the_same_bits(name, scaling, contract):
    x, params = _model()
    plain = precision.to_reduced_precision(params, name, scaling=scaling, where="kernel")
    held = precision.to_reduced_precision(
        params, name, scaling=scaling, where="kernel", layout="transposed"
    )
    f = precision.apply(_MLP().apply, contract=contract)
    want = np.asarray(f(plain, x))
    np.testing.assert_array_equal(np.asarray(f(held, x)), want)
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(held, x)), want)
    # differentiated in the input (the weights at rest): the same float32 products, summed
    # in the order each layout's dot takes them
    grad = jax.grad(lambda p, x: precision.to_full_precision(f(p, x)).sum(), argnums=1)
    np.testing.assert_allclose(grad(held, x), grad(plain, x), rtol=3e-5, atol=1e-6)


def test_a_stack_maps_under_vmap_and_scan():
    x = jax.random.normal(jax.random.key(0), (8, K))
    ws = np.stack([_weights(s) for s in (1, 2, 3)])
    scaling = dtypes.PerAxis((0, -1))  # a scale per layer and output channel
    plain = Tensor(ws).to_reduced_precision("int8", scaling=scaling)
    held = Tensor(ws).to_reduced_precision("int8", scaling=scaling, layout="transposed")
    assert held.encoded.data.shape == (3, N, K)
    assert held.shape == (3, K, N)
    f = precision.apply(lambda w, x: x @ w, contract="int8")
    want = np.asarray(jax.vmap(lambda w: f(w, x))(plain))
    np.testing.assert_array_equal(np.asarray(jax.vmap(lambda w: f(w, x))(held)), want)
    _, scanned = jax.lax.scan(lambda c, w: (c, f(w, x)), 0, held)
    np.testing.assert_array_equal(np.asarray(scanned), want)
    layered = precision.scales_per_layer(
        Tensor(ws).to_reduced_precision("int8", scaling=dtypes.PerAxis(-1), layout="transposed")
    )
    assert layered.layout == "transposed"
    assert layered.encoded.scale.shape == (3, N, 1)
    np.testing.assert_array_equal(
        np.asarray(layered),
        np.asarray(Tensor(ws).to_reduced_precision("int8", scaling=dtypes.PerAxis(-1))),
    )


def test_moves_and_operations_see_the_logical_tensor():
    w = _weights()
    held = Tensor(w).to_reduced_precision("int8", scaling=dtypes.PerAxis(-1), layout="transposed")
    values = np.asarray(held)
    # .T is the codes as held, without the layout: nothing is copied
    flipped = held.T
    assert flipped.layout is None
    assert flipped.shape == (N, K)
    assert flipped.encoded.data is held.encoded.data
    np.testing.assert_array_equal(np.asarray(flipped), values.T)
    assert held.transpose(1, 0).encoded.data is held.encoded.data
    # a row keeps its codes (results are held in the logical layout)
    row = held[3]
    assert row.format.name == "int8"
    assert row.layout is None
    np.testing.assert_array_equal(np.asarray(row), values[3])
    np.testing.assert_array_equal(np.asarray(held * 2.0), values * 2.0)
    np.testing.assert_array_equal(np.asarray(held.sum(axis=0)), np.asarray(Tensor(values).sum(0)))
    # pickled and copied, it keeps its layout
    for twin in (pickle.loads(pickle.dumps(held)), copy.deepcopy(held)):
        assert twin.layout == "transposed"
        np.testing.assert_array_equal(np.asarray(twin.encoded.data), np.asarray(held.encoded.data))
    # converting again starts from the logical values
    again = held.to_reduced_precision("int8", scaling=dtypes.PerAxis(-1))
    assert again.layout is None
    np.testing.assert_array_equal(np.asarray(again), values)


def test_a_tensor_already_so_encoded_moves_its_codes_without_re_encoding():
    """Codes that do not reach the grid's top (a calibrated clip, a loaded file) would get
    another scale if encoded again from their values; a change of layout moves them."""
    rng = np.random.default_rng(0)
    codes = rng.integers(-100, 101, (K, N)).astype(np.int8)
    scale = rng.uniform(0.001, 0.01, (1, N)).astype(np.float32)
    enc = dtypes.Encoded(jnp.asarray(codes), jnp.asarray(scale), dtypes.int8, dtypes.PerAxis(-1))
    plain = Tensor.from_encoded(enc)
    reencoded = Tensor(np.asarray(plain)).to_reduced_precision("int8", scaling=dtypes.PerAxis(-1))
    assert not np.array_equal(np.asarray(reencoded.encoded.data), codes)  # (the premise)
    held = plain.to_reduced_precision("int8", scaling=dtypes.PerAxis(1), layout="transposed")
    np.testing.assert_array_equal(np.asarray(held.encoded.data), codes.T)
    np.testing.assert_array_equal(np.asarray(held.encoded.scale), scale.T)
    back = held.to_reduced_precision("int8", scaling=dtypes.PerAxis(-1))
    assert back.layout is None
    np.testing.assert_array_equal(np.asarray(back.encoded.data), codes)
    np.testing.assert_array_equal(np.asarray(back.encoded.scale), scale)
    assert (
        held.to_reduced_precision("int8", scaling=dtypes.PerAxis(-1), layout="transposed").encoded
        is held.encoded
    )
    # another scaling (or format) is an encode of the logical values, held transposed
    other = plain.to_reduced_precision("int8", scaling=dtypes.PerTensor(), layout="transposed")
    want = Tensor(np.asarray(plain)).to_reduced_precision("int8", scaling=dtypes.PerTensor())
    np.testing.assert_array_equal(np.asarray(other.encoded.data), np.asarray(want.encoded.data).T)


def test_an_update_keeps_the_layout_inside_and_outside_jit():
    w = _weights()
    u = np.full((K, N), 0.25, np.float32)
    plain = Tensor(w).to_reduced_precision("int8", scaling=dtypes.PerAxis(-1))
    held = Tensor(w).to_reduced_precision("int8", scaling=dtypes.PerAxis(-1), layout="transposed")
    want = precision.apply_updates({"w": plain}, {"w": u})["w"]
    for update in (precision.apply_updates, jax.jit(precision.apply_updates)):
        got = update({"w": held}, {"w": u})["w"]
        assert got.layout == "transposed"
        np.testing.assert_array_equal(np.asarray(got.encoded.data), np.asarray(want.encoded.data).T)
    # a loop carrying the weight keeps one structure
    steps = jax.lax.fori_loop(0, 3, lambda i, p: precision.apply_updates(p, {"w": u}), {"w": held})
    assert steps["w"].layout == "transposed"


def test_saved_in_the_logical_layout(tmp_path):
    w = _weights()
    held = Tensor(w).to_reduced_precision(
        "float8_e4m3fn", scaling=dtypes.PerAxis(-1), layout="transposed"
    )
    path = tmp_path / "w.precision"
    precision.save(path, {"w": held})
    back = precision.load(path)["w"]
    assert back.layout is None
    assert back.shape == (K, N)
    assert back.format == held.format
    np.testing.assert_array_equal(
        np.asarray(back).view(np.uint32), np.asarray(held).view(np.uint32)
    )
    again = back.to_reduced_precision(back.format, scaling=back.scaling, layout="transposed")
    assert again.layout == "transposed"  # its codes moved back, as saved
    np.testing.assert_array_equal(
        np.asarray(again.encoded.data).view(np.uint8), np.asarray(held.encoded.data).view(np.uint8)
    )


def test_explain_names_no_transpose_for_a_held_kernel():
    x, params = _model()
    for layout, transposes in ((None, True), ("transposed", False)):
        q8 = precision.to_reduced_precision(params, "int8", where="kernel", layout=layout)
        rows = precision.explain(_MLP().apply, q8, x, contract="int8").rows
        assert [row.gpu is not None for row in rows] == [transposes] * 2


@pytest.mark.parametrize(
    ("shape", "name", "scaling", "error", "words"),
    [
        ((K,), "int8", dtypes.PerTensor(), dtypes.ShapeError, ["shape (48,)", "layout=None"]),
        ((K, N), "int4", dtypes.PerAxis(-1), dtypes.FormatError, ["int4", "int8"]),
        ((K, N), "bfloat16", None, dtypes.FormatError, ["bfloat16", "float8_e4m3fn"]),
        ((K, N), "uint8", dtypes.PerAxis(-1), dtypes.FormatError, ["uint8"]),
        ((K, N), "int8", dtypes.PerBlock(8), dtypes.ScalingError, ["per-block", "PerAxis"]),
        ((K, N), "float8_e4m3fn", None, dtypes.ScalingError, ["no scale", "PerTensor"]),
    ],
)
def test_what_cannot_be_held_transposed_is_refused_by_name(shape, name, scaling, error, words):
    t = Tensor(np.ones(shape, np.float32))
    with pytest.raises(error) as info:
        t.to_reduced_precision(name, scaling=scaling, layout="transposed")
    assert isinstance(info.value, ValueError | TypeError)
    for word in words:
        assert word in str(info.value)


def test_a_non_finite_value_is_refused_where_it_lies_logically():
    w = np.ones((6, 4), np.float32)
    w[5, 3] = np.nan
    with pytest.raises(dtypes.NonFiniteError, match=r"nan at index \(5, 3\)"):
        Tensor(w).to_reduced_precision("int8", scaling=dtypes.PerAxis(-1), layout="transposed")


def test_an_axis_the_tensor_lacks_is_refused_even_where_codes_would_move():
    held = Tensor(_weights()).to_reduced_precision("int8", scaling=dtypes.PerAxis(-1))
    for axis in (5, -3):
        with pytest.raises(dtypes.PrecisionError, match=str(axis)):
            held.to_reduced_precision("int8", scaling=dtypes.PerAxis(axis), layout="transposed")


def test_a_bad_layout_and_a_differentiated_conversion_are_refused():
    t = Tensor(_weights())
    with pytest.raises(precision.PrecisionTypeError, match="layout='transposed'"):
        t.to_reduced_precision("int8", layout="columns")

    def loss(w):
        held = Tensor(w).to_reduced_precision("int8", layout="transposed")
        return held.to_full_precision()._values().sum()

    with pytest.raises(precision.PrecisionTypeError, match=r"outside of jax\.grad"):
        jax.grad(loss)(jnp.asarray(_weights()))


def test_the_tree_conversion_names_every_leaf_it_cannot_hold():
    _x, params = _model()
    with pytest.raises(ValueError, match="layout='transposed'") as info:  # 1-d biases, norm
        precision.to_reduced_precision(params, "int8", layout="transposed")
    message = str(info.value)
    assert "bias" in message
    assert "LayerNorm" in message
    assert "kernel" not in message
