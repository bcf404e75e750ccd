"""precision.optax.reduced_state: moments stay narrow across steps, bytes honest, no divergence."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import precision
from precision import Tensor
from precision.optax import reduced_state

# Optax itself relies on standard dtype promotion (the suite is strict elsewhere).
pytestmark = pytest.mark.usefixtures("standard_promotion")


@pytest.fixture
def standard_promotion():
    with jax.numpy_dtype_promotion("standard"):
        yield


def _problem(seed: int = 0):
    """A least-squares problem whose gradients span several orders of magnitude."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(256, 64)).astype(np.float32) * np.logspace(-3, 1, 64).astype(np.float32)
    x_true = rng.normal(size=(64, 128)).astype(np.float32)
    b = a @ x_true

    def loss(params):
        return jnp.mean((a @ params["w"] - b) ** 2)

    return loss, {"w": jnp.zeros((64, 128), jnp.float32)}


def _train(tx, steps: int = 150):
    loss, params = _problem()
    state = tx.init(params)
    traces = []

    @jax.jit
    def step(params, state):
        traces.append(1)
        value, grads = jax.value_and_grad(loss)(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    losses = []
    for _ in range(steps):
        params, state, value = step(params, state)
        losses.append(float(value))
    return np.array(losses), state, len(traces)


@pytest.mark.parametrize(
    ("mu", "nu"), [("bfloat16", "bfloat16"), ("int8", "int8"), ("bfloat16", "int4")]
)
def test_moments_stay_reduced_with_honest_bytes_and_no_retrace(mu, nu):
    _, state, traces = _train(reduced_state(optax.adam(1e-2), mu=mu, nu=nu), steps=3)
    assert traces == 1  # the state's pytree is the same on every step
    adam = state.inner[0]
    for leaf, name in ((adam.mu["w"], mu), (adam.nu["w"], nu)):
        assert isinstance(leaf, Tensor)
        assert leaf.format.name == name
        # exactly the arrays nbytes counts: no hidden float32 copy
        assert sum(x.nbytes for x in jax.tree_util.tree_leaves(leaf)) == leaf.nbytes
        assert leaf.nbytes <= 64 * 128 * 4 // 2


def test_int8_moments_track_float32_adam_where_bfloat16_does():
    reference, _, _ = _train(optax.adam(1e-2))
    bf16, _, _ = _train(reduced_state(optax.adam(1e-2), mu="bfloat16", nu="bfloat16"))
    int8, _, _ = _train(reduced_state(optax.adam(1e-2), mu="int8", nu="int8"))
    assert np.all(np.isfinite(int8))
    # both reach (nearly) the float32 optimizer's final loss; neither diverges
    assert bf16[-1] <= 1.5 * reference[-1] + 1e-3
    assert int8[-1] <= 1.5 * reference[-1] + 1e-3
    assert int8.max() <= reference[0] * 1.01


def test_sqrt_nu_is_rounded_up_so_steps_never_grow():
    tx = reduced_state(optax.scale_by_adam(), mu=None, nu="int8")
    g = {"w": jnp.asarray(np.logspace(-6, 2, 128, dtype=np.float32).reshape(2, 64))}
    state = tx.init(g)
    _, state = tx.update(g, state)
    stored = np.asarray(state.inner.nu["w"]) ** 2  # the stored sqrt(nu), squared
    exact = (1 - 0.999) * np.asarray(g["w"], np.float64) ** 2
    assert np.all(stored >= exact * (1 - 1e-6))


def test_tree_nbytes_of_the_state_counts_the_narrow_moments():
    params = {"w": jnp.zeros((64, 128))}
    full = optax.adam(1e-3).init(params)
    small = reduced_state(optax.adam(1e-3), mu="bfloat16", nu="int8").init(params)
    assert precision.tree_nbytes(small) < 0.5 * precision.tree_nbytes(full)


def test_update_is_checked_against_the_params_given_to_init_also_inside_jit():
    tx = reduced_state(optax.adam(1e-2), mu="bfloat16", nu="int8")
    params = {"w": jnp.ones((4, 128)), "b": jnp.zeros(128)}
    state = tx.init(params)
    assert repr(state.params_layout) == "ParamsLayout({'b': (128,), 'w': (4, 128)})"
    step = jax.jit(lambda g, s: tx.update(g, s))  # no params: the state knows their layout
    _, state = step(params, state)
    assert state.params_layout.shapes == ((128,), (4, 128))
    with pytest.raises(precision.UpdateError, match=r"updates\['b'\] has shape \(1,\)"):
        step({"w": jnp.ones((4, 128)), "b": jnp.zeros(1)}, state)  # would broadcast silently
    with pytest.raises(precision.UpdateError, match="structure"):
        step({"w": jnp.ones((4, 128))}, state)


def test_states_pass_through_scan_masked_wrappers_and_hand_built_states():
    params = {"w": jnp.ones((4, 128)), "b": jnp.zeros(3)}
    inside = reduced_state(optax.masked(optax.adam(1e-2), {"w": True, "b": False}))
    outside = optax.masked(reduced_state(optax.adam(1e-2)), {"w": True, "b": False})
    for tx in (inside, outside):
        state = tx.init(params)

        def body(s, _, tx=tx):
            return tx.update(params, s, params)[1], None

        state, _ = jax.lax.scan(body, state, None, length=2)
    tx = reduced_state(optax.adam(1e-2))
    by_hand = precision.optax.ReducedState(tx.init(params).inner)  # no layout: params decide
    tx.update(params, by_hand, params)
    with pytest.raises(precision.UpdateError, match=r"params\['b'\] had \(3,\)"):
        tx.update({"w": jnp.ones((4, 128)), "b": jnp.ones(2)}, by_hand, params)


def test_a_state_made_by_another_optimizer_is_refused_before_optax_sees_it():
    # An Adam ReducedState given to an SGD-with-momentum update used to fail inside
    # optax with "AttributeError: 'ScaleByAdamState' object has no attribute 'trace'".
    params = {"w": jnp.ones((4, 128)), "b": jnp.zeros(4)}
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
    adam = reduced_state(optax.adam(1e-2))
    sgd = reduced_state(optax.sgd(1e-2, momentum=0.9))
    for update in (sgd.update, jax.jit(sgd.update)):
        with pytest.raises(precision.UpdateError) as info:
            update(grads, adam.init(params), params)
        said = str(info.value)
        assert "ScaleByAdamState" in said
        assert "TraceState" in said
        assert "tx.init(params)" in said
    # the same optimizer built twice is the same optimizer: its states are interchangeable
    twin = reduced_state(optax.sgd(1e-2, momentum=0.9))
    _, state = twin.update(grads, sgd.init(params), params)
    assert state.inner[0].trace["w"].shape == (4, 128)
