"""`precision.optax.loss_scaling`: the five manual loss-scaling calls as one transformation.

The reference is written here by hand: optax's own optimizer on the unscaled
gradients, and the dynamic rule (halve on overflow, double after `period`
finite steps) as plain Python numbers.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dtypes
import precision
from precision.optax import LossScalingState, loss_scaling, scale_loss

# Optax itself relies on standard dtype promotion (the suite is strict elsewhere).
pytestmark = pytest.mark.usefixtures("standard_promotion")


@pytest.fixture
def standard_promotion():
    with jax.numpy_dtype_promotion("standard"):
        yield


def _close(got, ref):
    # jit fuses optax's moment updates differently: a few float32 roundings apart
    ref = np.asarray(ref)
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def _grads(step: int) -> dict[str, jnp.ndarray]:
    rng = np.random.default_rng(step)
    return {
        "w": jnp.asarray(rng.standard_normal((3, 4)), jnp.float32),
        "b": jnp.asarray(rng.standard_normal(4), jnp.float32) * 1e-3,
    }


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_steps_match_a_hand_written_loop_with_an_overflow(jit):
    adam = optax.adam(1e-2)
    tx = loss_scaling(adam, precision.DynamicLossScale(jnp.float32(2.0**10), period=2))
    update = jax.jit(tx.update) if jit else tx.update
    params = {"w": jnp.ones((3, 4)), "b": jnp.zeros(4)}
    state = tx.init(params)
    ref_state, scale, counter = adam.init(params), 2.0**10, 0
    for step in range(6):
        grads = _grads(step)
        overflow = step in (2, 3)
        if overflow:  # one leaf's scaled gradient overflowed in float16
            grads["b"] = grads["b"].at[1].set(jnp.inf if step == 2 else jnp.nan)
        scaled = jax.tree_util.tree_map(lambda g: g * np.float32(scale), grads)  # noqa: B023
        updates, state = update(scaled, state, params)
        if overflow:
            for u in jax.tree_util.tree_leaves(updates):
                np.testing.assert_array_equal(np.asarray(u), 0.0)
            scale, counter = max(scale / 2, 1.0), 0
        else:
            want, ref_state = adam.update(grads, ref_state, params)
            for got, ref in zip(
                jax.tree_util.tree_leaves(updates), jax.tree_util.tree_leaves(want), strict=True
            ):
                _close(got, ref)
            counter += 1
            if counter == 2:
                scale, counter = scale * 2, 0
        params = optax.apply_updates(params, updates)
        assert float(state.loss_scale.loss_scale) == scale, step
        assert int(state.loss_scale.counter) == counter, step
        # the wrapped state is the reference's: skipped steps left it as it was
        for got, ref in zip(
            jax.tree_util.tree_leaves(state.inner),
            jax.tree_util.tree_leaves(ref_state),
            strict=True,
        ):
            _close(got, ref)


def test_a_float16_model_trains_in_one_jitted_step():
    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(1)(nn.tanh(nn.Dense(16)(x)))

    model = MLP()
    x = jax.random.normal(jax.random.key(0), (64, 8))
    y = jnp.sum(x[:, :2], axis=1, keepdims=True) * 1e-3  # small targets: small gradients
    params = model.init(jax.random.key(1), x)
    run = precision.apply(model.apply, compute="float16")
    tx = loss_scaling(optax.adam(3e-3))

    def loss_of(p):
        out = precision.to_full_precision(run(p, x))
        return jnp.mean((out - y) ** 2)

    @jax.jit
    def step(params, state):
        loss, grads = jax.value_and_grad(lambda p: scale_loss(state, loss_of(p)))(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    state = tx.init(params)
    first = float(loss_of(params))
    for _ in range(30):
        params, state, _ = step(params, state)
    assert float(loss_of(params)) < 0.5 * first
    assert float(state.loss_scale.loss_scale) >= 2.0**15  # no overflow at these sizes


def test_scale_loss_finds_the_state_inside_a_chain_and_uses_the_loss_dtype():
    tx = optax.chain(optax.identity(), loss_scaling(optax.sgd(1.0), precision.StaticLossScale(8.0)))
    state = tx.init(jnp.ones(2))
    got = scale_loss(state, jnp.float16(3.0))
    assert got.dtype == jnp.float16
    assert float(got) == 24.0


def test_no_op_scaling_still_skips_a_step_that_is_not_finite():
    tx = loss_scaling(optax.sgd(1.0), precision.NoOpLossScale())
    state = tx.init(jnp.ones(2))
    updates, state = tx.update(jnp.array([1.0, jnp.nan]), state)
    np.testing.assert_array_equal(np.asarray(updates), [0.0, 0.0])
    updates, _ = tx.update(jnp.array([1.0, 2.0]), state)
    np.testing.assert_array_equal(np.asarray(updates), [-1.0, -2.0])


def test_bad_arguments_are_refused_with_the_fix():
    with pytest.raises(dtypes.PrecisionTypeError, match="loss_scaling wraps an optax"):
        loss_scaling(lambda g: g)
    with pytest.raises(precision.LossScaleTypeError, match="DynamicLossScale"):
        loss_scaling(optax.sgd(1.0), 1024.0)
    tx = loss_scaling(optax.sgd(1.0))
    with pytest.raises(dtypes.PrecisionTypeError, match="LossScalingState"):
        tx.update(jnp.ones(2), optax.sgd(1.0).init(jnp.ones(2)))
    with pytest.raises(dtypes.PrecisionTypeError, match="found none"):
        scale_loss(optax.sgd(1.0).init(jnp.ones(2)), jnp.float32(1.0))
    both = (tx.init(jnp.ones(2)), tx.init(jnp.ones(2)))
    with pytest.raises(dtypes.PrecisionTypeError, match="found 2"):
        scale_loss(both, jnp.float32(1.0))
    assert isinstance(both[0], LossScalingState)
