"""Tree conversion over dicts, Flax params, Equinox modules and Optax states."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import dtypes
import precision
from precision import (
    Tensor,
    is_reduced_precision,
    to_full_precision,
    to_reduced_precision,
    tree_nbytes,
)


def _params():
    k = jax.random.split(jax.random.key(0), 3)
    return {
        "dense": {"kernel": jax.random.normal(k[0], (8, 4)), "bias": jnp.zeros(4)},
        "norm": {"scale": jnp.ones(4)},
        "out": {"kernel": jax.random.normal(k[1], (4, 2)), "bias": jnp.zeros(2)},
        "step": jnp.int32(5),
        "labels": np.arange(3, dtype=np.int64),
    }


def _formats(tree):
    """{keystr: format name or dtype name} for an at-a-glance comparison."""
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, Tensor))[0]
    return {
        jax.tree_util.keystr(p): (
            x.format.name if isinstance(x, Tensor) else str(getattr(x, "dtype", type(x)))
        )
        for p, x in flat
    }


def test_converts_every_floating_leaf_and_leaves_the_rest():
    params = _params()
    out = to_reduced_precision(params, "bfloat16")
    assert _formats(out) == {
        "['dense']['bias']": "bfloat16",
        "['dense']['kernel']": "bfloat16",
        "['labels']": "int64",
        "['norm']['scale']": "bfloat16",
        "['out']['bias']": "bfloat16",
        "['out']['kernel']": "bfloat16",
        "['step']": "int32",
    }
    expected = np.asarray(params["dense"]["kernel"]).astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(out["dense"]["kernel"]), expected)
    assert out["labels"] is params["labels"]


def test_default_format_follows_the_context():
    with precision.default_format("float16"):
        out = to_reduced_precision({"w": jnp.ones(2)})
    assert out["w"].format is dtypes.float16


def test_regex_where_and_exclude_select_by_key_path():
    params = _params()
    kernels = to_reduced_precision(params, "int8", where=r"kernel")
    assert {k for k, v in _formats(kernels).items() if v == "int8"} == {
        "['dense']['kernel']",
        "['out']['kernel']",
    }
    no_norm_no_bias = to_reduced_precision(params, "bf16", exclude="bias|norm")
    assert {k for k, v in _formats(no_norm_no_bias).items() if v == "bfloat16"} == {
        "['dense']['kernel']",
        "['out']['kernel']",
    }
    # A negative lookahead in `where` does the same in one pattern.
    same = to_reduced_precision(params, "bf16", where=r"^(?!.*(bias|norm)).*kernel")
    assert _formats(same) == _formats(no_norm_no_bias)


def test_predicate_where_sees_path_and_leaf():
    params = _params()
    seen = []

    def where(path, leaf):
        seen.append(jax.tree_util.keystr(path))
        return leaf.ndim > 1

    out = to_reduced_precision(params, "float16", where=where)
    assert {k for k, v in _formats(out).items() if v == "float16"} == {
        "['dense']['kernel']",
        "['out']['kernel']",
    }
    # The predicate is only asked about floating leaves.
    assert "['step']" not in seen
    assert "['labels']" not in seen


def test_scaling_and_errors_name_every_offending_path():
    params = _params()
    ok = to_reduced_precision(params, "int8", scaling=dtypes.PerAxis(1), where="kernel")
    assert ok["dense"]["kernel"].scaling == dtypes.PerAxis(1)
    with pytest.raises(ValueError, match="PerAxis") as info:
        to_reduced_precision(params, "int8", scaling=dtypes.PerAxis(1))
    message = str(info.value)
    for path in ("['dense']['bias']", "['norm']['scale']", "['out']['bias']"):
        assert path in message
    assert "['dense']['kernel']" not in message
    assert message.startswith("3 leaves could not be converted to int8")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"format": "bf17"}, precision.FormatError, "bf17"),
        ({"rounding": "nearest"}, ValueError, "nearest_even"),
        ({"rounding": "stochastic"}, ValueError, "key"),
        ({"where": 3}, TypeError, "predicate"),
        ({"where": "("}, ValueError, "regular expression"),
        ({"exclude": "[a"}, ValueError, "regular expression"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        to_reduced_precision(_params(), **kwargs)


def test_stochastic_rounding_splits_the_key_per_leaf():
    # Two leaves holding the same values must not draw the same bits.
    x = jnp.full((4096,), 1.0 + 2.0**-9, jnp.float32)  # a quarter of a bfloat16 ulp above 1
    out = to_reduced_precision({"a": x, "b": x}, rounding="stochastic", key=jax.random.key(0))
    a, b = np.asarray(out["a"]), np.asarray(out["b"])
    assert set(np.unique(a)) <= {1.0, 1.0 + 2.0**-7}
    assert not np.array_equal(a, b)
    # Unbiased: a quarter of them go up (binomial, 5 sigma).
    up = np.mean(a > 1.0)
    assert abs(up - 0.25) < 5 * np.sqrt(0.25 * 0.75 / a.size)


def test_full_precision_round_trip_gives_plain_arrays():
    params = _params()
    small = to_reduced_precision(params, "float16")
    assert is_reduced_precision(small)
    back = to_full_precision(small)
    assert not is_reduced_precision(back)
    assert isinstance(back["dense"]["kernel"], jax.Array)
    expected = np.asarray(params["dense"]["kernel"]).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(back["dense"]["kernel"]), expected)
    assert back["step"] is params["step"]


def test_is_reduced_precision_means_any_leaf():
    params = _params()
    assert not is_reduced_precision(params)
    assert is_reduced_precision(to_reduced_precision(params, where="out.*kernel"))
    full_tensors = jax.tree_util.tree_map(Tensor, {"w": jnp.ones(2)})
    assert not is_reduced_precision(full_tensors)


def test_tree_nbytes_counts_storage_exactly():
    params = _params()
    # Independent count: 4 bytes per float32 element, 4 per int32, 8 per int64.
    floats = 8 * 4 + 4 + 4 + 4 * 2 + 2
    assert tree_nbytes(params) == 4 * floats + 4 + 8 * 3
    small = to_reduced_precision(params, "int4", where="kernel", scaling=dtypes.PerAxis(1))
    # int4 kernels: rows of 4 and 2 values pack into 2 and 1 bytes; one float32 scale
    # per column (PerAxis(1)).
    kernels = (8 * 2 + 4 * 4) + (4 * 1 + 2 * 4)
    rest = 4 * (4 + 4 + 2) + 4 + 8 * 3
    assert tree_nbytes(small) == kernels + rest
    assert tree_nbytes({"n": 3.0, "s": "text"}) == 0


def test_works_under_jit_and_grad():
    params = {"w": jnp.linspace(-2, 2, 4096)}

    @jax.jit
    def loss(p):
        small = to_reduced_precision(p, "bfloat16")
        return jnp.sum(to_full_precision(small["w"]) ** 2)

    g = jax.grad(loss)(params)["w"]
    # straight through the conversion: d(w16**2)/dw is 2 * w16 exactly, not 2 * w
    w16 = np.asarray(params["w"]).astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(g), 2 * w16)


# -- real model libraries ---------------------------------------------------------------


def test_flax_params():
    nn = pytest.importorskip("flax.linen")

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Dense(16)(x))
            x = nn.LayerNorm()(x)
            return nn.Dense(3)(x)

    model = MLP()
    x = jnp.ones((2, 5))
    variables = model.init(jax.random.key(0), x)
    small = to_reduced_precision(variables, "bf16", exclude="bias|LayerNorm")
    names = {k for k, v in _formats(small).items() if v == "bfloat16"}
    assert names == {"['params']['Dense_0']['kernel']", "['params']['Dense_1']['kernel']"}
    assert tree_nbytes(small) == 2 * (5 * 16 + 16 * 3) + 4 * (16 + 3 + 16 + 16)
    # The whole model in bfloat16 runs through apply unchanged.
    everything = to_reduced_precision(variables, "bf16")
    out = precision.apply(model.apply)(everything, Tensor(x).to_reduced_precision("bf16"))
    ref = model.apply(variables, x)
    assert out.format is dtypes.bfloat16
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=0.1)


def test_equinox_module():
    eqx = pytest.importorskip("equinox")
    mlp = eqx.nn.MLP(4, 2, 8, depth=2, key=jax.random.key(0))
    small = to_reduced_precision(mlp, "float16", where="weight")
    kinds = _formats(small)
    assert kinds[".layers[0].weight"] == "float16"
    assert kinds[".layers[0].bias"] == "float32"
    assert isinstance(small, eqx.nn.MLP)
    assert small.activation is mlp.activation  # static fields untouched
    back = to_full_precision(small)
    np.testing.assert_array_equal(
        np.asarray(back.layers[1].weight),
        np.asarray(mlp.layers[1].weight).astype(np.float16).astype(np.float32),
    )


def test_optax_state():
    optax = pytest.importorskip("optax")
    params = {"w": jnp.ones((3, 3)), "b": jnp.zeros(3)}
    state = optax.adam(1e-3).init(params)
    small = to_reduced_precision(state, "bf16")
    adam = small[0]
    assert adam.count.dtype == jnp.int32  # the step counter is left alone
    assert adam.mu["w"].format is dtypes.bfloat16
    assert adam.nu["b"].format is dtypes.bfloat16
    assert tree_nbytes(small) == 4 + 2 * 2 * (9 + 3)
    assert tree_nbytes(state) == 4 + 4 * 2 * (9 + 3)
    restored = to_full_precision(small)
    assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(state)


def test_stochastic_tree_conversion_draws_independent_bits_per_leaf():
    # One key given to two same-shaped arrays makes identical decisions; the tree
    # functions split it per leaf, so equal leaves round independently.
    x = jnp.full((4096,), 1.0 + 2.0**-9)  # a quarter of the way from 1 to the next bf16
    tree = {"a": x, "b": x}
    key = jax.random.key(3)
    out = precision.to_reduced_precision(tree, "bfloat16", rounding="stochastic", key=key)
    a, b = np.asarray(out["a"]), np.asarray(out["b"])
    assert 0 < np.count_nonzero(a != b) < a.size  # independent, not identical
    updated = precision.apply_updates(
        precision.to_reduced_precision({"a": jnp.ones(4096), "b": jnp.ones(4096)}, "bfloat16"),
        {"a": jnp.full(4096, 2.0**-9), "b": jnp.full(4096, 2.0**-9)},
        rounding="stochastic",
        key=key,
    )
    ua, ub = np.asarray(updated["a"]), np.asarray(updated["b"])
    assert 0 < np.count_nonzero(ua != ub) < ua.size


def test_a_selection_that_matches_nothing_warns_with_the_paths():
    params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)}}
    with pytest.warns(UserWarning, match=r"where='kernal' selected none of the 2 floating"):
        out = precision.to_reduced_precision(params, "int8", where="kernal")
    assert not precision.is_reduced_precision(out)
    # a selection that matches converts without a word
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        precision.to_reduced_precision(params, "int8", where="kernel")
