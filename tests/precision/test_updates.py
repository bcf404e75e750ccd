"""apply_updates: formats kept, stochastic rounding unbiased, nearest rounding stalls."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import dtypes
import precision
from precision import Tensor, apply_updates, to_reduced_precision

BF16_ULP_AT_1 = 2.0**-7


def _bf16(x):
    """Independent reference: round-to-nearest-even through ml_dtypes."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def test_reduced_tensor_params_stay_in_their_format_and_round_to_nearest():
    w = np.linspace(-3, 3, 64, dtype=np.float32)
    u = np.linspace(-0.05, 0.07, 64, dtype=np.float32)
    params = to_reduced_precision({"w": w}, "bfloat16")
    new = apply_updates(params, {"w": jnp.asarray(u)})
    assert new["w"].format is dtypes.bfloat16
    # Exact sum in float64 of the stored value and the update, rounded once by ml_dtypes.
    exact = _bf16(w).astype(np.float64) + u.astype(np.float64)
    np.testing.assert_array_equal(np.asarray(new["w"]), _bf16(exact.astype(np.float32)))


def test_plain_arrays_update_normally_and_native_bf16_arrays_round():
    params = {"f32": jnp.ones(3), "bf16": jnp.ones(3, jnp.bfloat16), "n": jnp.int32(1)}
    updates = {"f32": jnp.full(3, 1e-3), "bf16": jnp.full(3, 1e-3), "n": jnp.int32(5)}
    new = apply_updates(params, updates)
    np.testing.assert_array_equal(np.asarray(new["f32"]), np.float32(1) + np.float32(1e-3))
    assert new["bf16"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(new["bf16"], np.float32), 1.0)  # swallowed
    assert int(new["n"]) == 1  # non-floating parameters are not updated


def test_scaled_integer_params_keep_format_and_scaling():
    w = jnp.linspace(-1, 1, 16).reshape(4, 4)
    params = {"w": Tensor(w).to_reduced_precision("int8", scaling=dtypes.PerAxis(0))}
    new = apply_updates(params, {"w": jnp.full((4, 4), 0.25)})["w"]
    assert new.format is dtypes.int8
    assert new.scaling == dtypes.PerAxis(0)
    np.testing.assert_allclose(np.asarray(new), np.asarray(params["w"]) + 0.25, atol=1.3 / 127)


def test_works_with_optax_updates_under_jit():
    optax = pytest.importorskip("optax")
    params = to_reduced_precision({"w": jnp.linspace(0.5, 1.5, 8)}, "bfloat16")
    opt = optax.sgd(0.5)
    state = opt.init(precision.to_full_precision(params))

    @jax.jit
    def step(params, state, key):
        full = precision.to_full_precision(params)
        grads = jax.grad(lambda p: jnp.sum(p["w"] ** 2))(full)
        updates, state = opt.update(grads, state, full)
        return apply_updates(params, updates, rounding="stochastic", key=key), state

    for i in range(5):
        params, state = step(params, state, jax.random.key(i))
    assert params["w"].format is dtypes.bfloat16
    # w <- w - 0.5 * 2w = 0 after one exact step; rounding of 0 is 0.
    np.testing.assert_array_equal(np.asarray(params["w"]), 0.0)


def test_stochastic_rounding_is_unbiased():
    # One parameter at 1.0, an update of 0.3 ulp: round to nearest never moves it;
    # stochastic rounding moves it one ulp with probability 0.3, i.e. by 0.3 ulp on average.
    n = 20_000
    params = {"w": Tensor(jnp.ones(n)).to_reduced_precision("bfloat16")}
    update = np.float32(0.3 * BF16_ULP_AT_1)
    new = apply_updates(
        params, {"w": jnp.full(n, update)}, rounding="stochastic", key=jax.random.key(7)
    )
    values = np.asarray(new["w"]).astype(np.float64)
    assert set(np.unique(values)) == {1.0, 1.0 + BF16_ULP_AT_1}
    exact = 1.0 + float(update)
    # Each element is 1 + ulp * Bernoulli(0.3): the mean's standard error is known exactly.
    sigma = BF16_ULP_AT_1 * np.sqrt(0.3 * 0.7 / n)
    assert abs(values.mean() - exact) < 5 * sigma


def test_stochastic_rounding_unbiased_over_many_keys_for_varied_values():
    rng = np.random.default_rng(0)
    w = rng.uniform(-4, 4, 256).astype(np.float32)
    u = rng.uniform(-1e-2, 1e-2, 256).astype(np.float32)
    params = to_reduced_precision({"w": w}, "bfloat16")
    step = jax.jit(lambda k: apply_updates(params, {"w": u}, rounding="stochastic", key=k)["w"])
    draws = np.stack([np.asarray(step(jax.random.key(i))) for i in range(400)]).astype(np.float64)
    exact = _bf16(w).astype(np.float64) + u.astype(np.float64)
    # The two bfloat16 neighbours of each exact sum, from ml_dtypes.
    near = exact.astype(np.float32).astype(ml_dtypes.bfloat16)
    up = np.nextafter(near, np.array(np.inf, ml_dtypes.bfloat16))
    down = np.nextafter(near, np.array(-np.inf, ml_dtypes.bfloat16))
    lo = np.where(near.astype(np.float64) <= exact, near, down).astype(np.float64)
    hi = np.where(near.astype(np.float64) <= exact, up, near).astype(np.float64)
    assert np.all((draws == lo) | (draws == hi))  # always one of the two neighbours
    gap = hi - lo
    p = (exact - lo) / gap  # probability of rounding up
    sigma = gap * np.sqrt(p * (1 - p) / draws.shape[0])
    assert np.all(np.abs(draws.mean(0) - exact) <= 5 * sigma + 1e-12)


def test_nearest_stalls_tiny_updates_while_stochastic_keeps_them():
    n = 4096
    params = {"w": Tensor(jnp.ones(n)).to_reduced_precision("bfloat16")}
    tiny = {"w": jnp.full(n, 0.1 * BF16_ULP_AT_1)}  # a tenth of an ulp, 100 times
    nearest, stochastic = params, params
    for i in range(100):
        nearest = apply_updates(nearest, tiny)
        stochastic = apply_updates(stochastic, tiny, rounding="stochastic", key=jax.random.key(i))
    np.testing.assert_array_equal(np.asarray(nearest["w"]), 1.0)  # every update lost
    # Exact total: 100 * 0.1 ulp = 10 ulp = 0.078125, plus 1. The spacing doubles at 2.0,
    # far away, so the per-element sum is 1 + ulp * Binomial(100, 0.1) on average.
    mean = float(np.asarray(stochastic["w"]).mean())
    sigma = BF16_ULP_AT_1 * np.sqrt(100 * 0.1 * 0.9 / n)
    assert abs(mean - (1 + 10 * BF16_ULP_AT_1)) < 5 * sigma


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rounding": "nearest"}, "nearest_even"),
        ({"rounding": "stochastic"}, "key"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        apply_updates({"w": jnp.ones(2)}, {"w": jnp.ones(2)}, **kwargs)


def test_structure_mismatch_names_both_structures():
    with pytest.raises(ValueError, match="structure of params"):
        apply_updates({"w": jnp.ones(2)}, {"v": jnp.ones(2)})
