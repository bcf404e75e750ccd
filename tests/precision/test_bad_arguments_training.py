"""The training helpers (`select_tree`, `all_finite`, loss scales, `apply_updates`,
`precision.optax.loss_scaling`) given bad input: a precise error or the right value.

Found by a bad-input hunt: 64-bit leaves that 32-bit JAX turned into other numbers
(2**40 selected as 0, a finite 1e300 reported as not finite), updates dropped for
integer parameters or ignored where the trees did not match, and builtin errors from
deep inside optax. Expected values come from numpy, never from the code under test.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dtypes
import precision
from precision import (
    DynamicLossScale,
    LossScaleError,
    StaticLossScale,
    UpdateError,
    all_finite,
    apply_updates,
    select_tree,
)
from precision.optax import loss_scaling

BIG = 2**70  # past int64 too
W = {"w": jnp.ones(2)}


def _ls() -> Any:
    return loss_scaling(optax.adam(1e-3), DynamicLossScale(2.0))


def _ls_update(grads: Any, params: Any = None, state: Any = None) -> Any:
    tx = _ls()
    return tx.update(grads, tx.init(W) if state is None else state, params)


ROWS = [
    # -- 64-bit leaves that 32-bit JAX would change into other numbers
    pytest.param(
        lambda: select_tree(True, {"a": 2**40}, {"a": 0}),
        LossScaleError,
        ["['a']", "on_true", "1099511627776", "int32", "jax_enable_x64"],
        id="select-python-int-past-int32",
    ),
    pytest.param(
        lambda: select_tree(True, {"a": np.array([2**40])}, {"a": np.array([0])}),
        LossScaleError,
        ["['a']", "int64", "1099511627776", "wrap it to 0", "jax_enable_x64"],
        id="select-int64-past-int32",
    ),
    pytest.param(
        lambda: select_tree(True, {"a": np.array([1e300])}, {"a": np.array([0.0])}),
        LossScaleError,
        ["['a']", "float64", "1e+300", "inf", "jax_enable_x64"],
        id="select-float64-past-float32",
    ),
    pytest.param(
        lambda: select_tree(False, [0.0], [1e300]),
        LossScaleError,
        ["[0]", "on_false", "Python float 1e+300", "inf"],
        id="select-python-float-past-float32",
    ),
    pytest.param(
        lambda: select_tree(True, BIG, 0),
        LossScaleError,
        ["<root>", str(BIG), "cannot convert"],
        id="select-python-int-past-int64",
    ),
    pytest.param(
        lambda: StaticLossScale(2).scale({"a": np.array([1e300])}),
        LossScaleError,
        ["scale", "['a']", "1e+300", "inf", "jax_enable_x64"],
        id="static-scale-float64-past-float32",
    ),
    pytest.param(
        lambda: DynamicLossScale(2.0).unscale({"g": [np.float64(-1e39)]}),
        LossScaleError,
        ["unscale", "['g'][0]", "-1e+39", "inf"],
        id="dynamic-unscale-float64-past-float32",
    ),
    # -- apply_updates: structures, integer parameters, values past 32 bits
    pytest.param(
        lambda: apply_updates("abc", W),
        UpdateError,
        ["structure of params", "PyTreeDef(*)", "PyTreeDef({'w': *})", "one leaf"],
        id="updates-text-params-vs-tree",
    ),
    pytest.param(
        lambda: apply_updates(-1, W),
        UpdateError,
        ["structure of params", "PyTreeDef(*)", "'w'"],
        id="updates-int-params-vs-tree",
    ),
    pytest.param(
        lambda: apply_updates({"w": jnp.ones(2)}, {"w": ()}),
        UpdateError,
        ["structure of params", "updates['w'] is tuple ()"],
        id="updates-empty-subtree",
    ),
    pytest.param(
        lambda: apply_updates(
            {"w": np.array([1, 2], np.int32)}, {"w": np.array([0.5, 0.5], np.float32)}
        ),
        UpdateError,
        ["['w']", "floating update of dtype float32", "dtype int32", "None", "astype"],
        id="updates-float-update-int-param",
    ),
    pytest.param(
        lambda: apply_updates({"n": BIG}, {"n": jnp.float32(1)}),
        UpdateError,
        ["['n']", f"Python int {BIG}", "float0", "astype"],
        id="updates-float-update-python-int-param",
    ),
    pytest.param(
        lambda: apply_updates({"w": jnp.float32(1)}, {"w": BIG}),
        UpdateError,
        ["['w']", f"Python int {BIG}", "dtype float32", "real floating updates"],
        id="updates-python-int-update",
    ),
    pytest.param(
        lambda: apply_updates({"w": "abc"}, W),
        UpdateError,
        ["params['w']", "str 'abc'", "not a number", "None"],
        id="updates-text-param",
    ),
    pytest.param(
        lambda: apply_updates({"n": jnp.int32(1)}, {"n": "abc"}),
        UpdateError,
        ["['n']", "str 'abc'", "dtype int32", "None"],
        id="updates-text-update-int-param",
    ),
    pytest.param(
        lambda: apply_updates({"w": np.array([1e300])}, {"w": np.zeros(1, np.float32)}),
        UpdateError,
        ["params['w']", "1e+300", "inf", "jax_enable_x64"],
        id="updates-float64-param-past-float32",
    ),
    pytest.param(
        lambda: apply_updates({"w": 1.0}, {"w": 1e300}),
        UpdateError,
        ["updates['w']", "Python float 1e+300", "inf", "jax_enable_x64"],
        id="updates-python-float-update-past-float32",
    ),
    # -- loss_scaling: the checks reduced_state makes, before optax fails inside
    pytest.param(
        lambda: _ls().init("abc"),
        dtypes.PrecisionTypeError,
        ["loss_scaling", "<root>", "str 'abc'", "tx.init(params)"],
        id="loss-scaling-init-text",
    ),
    pytest.param(
        lambda: _ls().init(object()),
        dtypes.PrecisionTypeError,
        ["loss_scaling", "<root>", "object", "tx.init(params)"],
        id="loss-scaling-init-object",
    ),
    pytest.param(
        lambda: _ls().init(None),
        dtypes.PrecisionTypeError,
        ["loss_scaling", "None", "tx.init(params)"],
        id="loss-scaling-init-none",
    ),
    pytest.param(
        lambda: _ls().init(precision.to_reduced_precision({"w": jnp.ones(4)}, "bfloat16")),
        dtypes.PrecisionTypeError,
        ["loss_scaling", "['w']", "bfloat16", "precision.to_full_precision(params)"],
        id="loss-scaling-init-tensor",
    ),
    pytest.param(
        lambda: _ls_update(None, W),
        dtypes.PrecisionTypeError,
        ["loss_scaling", "None", "the gradients"],
        id="loss-scaling-update-none",
    ),
    pytest.param(
        lambda: _ls_update(float("nan"), W),
        UpdateError,
        ["loss_scaling", "PyTreeDef(*)", "PyTreeDef({'w': *})", "tx.init(params)"],
        id="loss-scaling-update-nan",
    ),
    pytest.param(
        lambda: _ls_update(float("nan")),
        UpdateError,
        ["loss_scaling", "PyTreeDef(*)", "PyTreeDef({'w': *})", "tx.init(params)"],
        id="loss-scaling-update-nan-without-params",
    ),
    pytest.param(
        lambda: _ls_update({"w": jnp.ones(3)}),
        UpdateError,
        ["loss_scaling", "updates['w']", "(3,)", "(2,)"],
        id="loss-scaling-update-shape",
    ),
    pytest.param(
        lambda: _ls_update({"w": "abc"}),
        dtypes.PrecisionTypeError,
        ["loss_scaling", "updates['w']", "str 'abc'", "gradients"],
        id="loss-scaling-update-text",
    ),
    pytest.param(
        lambda: _ls_update(W, state=loss_scaling(optax.sgd(1.0)).init(W)),
        UpdateError,
        ["loss_scaling", "another optimizer's init", "tx.init(params)"],
        id="loss-scaling-update-another-optimizers-state",
    ),
]


@pytest.mark.parametrize(("call", "error", "says"), ROWS)
def test_a_bad_call_raises_a_precise_error(
    call: Callable[[], Any], error: type[Exception], says: list[str]
) -> None:
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, precision.PrecisionError)
    assert isinstance(info.value, ValueError | TypeError)
    for text in says:
        assert text in str(info.value), (text, str(info.value))


# -- values: the right answer, from numpy


CONCRETE = {
    "float64-in-float32-range": (np.array([1e30, -2.5, 0.1]), np.array([0.0, 1.0, -1e-30])),
    "float64-extremes": (np.array([3.4e38, -3.4e38]), np.array([np.inf, np.nan])),
    "int64-in-int32-range": (np.array([2**31 - 1, -(2**31)]), np.array([0, 1])),
    "python-ints": (2**31 - 1, -(2**31)),
    "python-floats": (1e38, -0.0),
    "float16": (np.array([65504.0], np.float16), np.array([np.inf], np.float16)),
}


NARROW32 = {np.dtype(np.int64): np.dtype(np.int32), np.dtype(np.float64): np.dtype(np.float32)}


@pytest.mark.parametrize("pick", [True, False])
@pytest.mark.parametrize("case", CONCRETE)
def test_select_tree_gives_the_chosen_leaf_as_32_bit_numpy_would(case: str, pick: bool) -> None:
    a, b = CONCRETE[case]
    got = select_tree(pick, {"x": a}, {"x": b})["x"]
    chosen = np.asarray(a if pick else b)
    # what 32-bit JAX holds of it: numpy's own cast, exact inside the 32-bit range
    want = chosen.astype(NARROW32.get(chosen.dtype, chosen.dtype))
    np.testing.assert_array_equal(np.asarray(got), want)


def test_select_tree_under_jit_takes_32_bit_tracers() -> None:
    new, old = {"w": jnp.array([1.0, 2.0])}, {"w": jnp.array([3.0, 4.0])}
    run = jax.jit(lambda p, a, b: select_tree(p, a, b))
    np.testing.assert_array_equal(np.asarray(run(jnp.bool_(False), new, old)["w"]), [3.0, 4.0])


FINITENESS = [
    np.array([1e300, -1e308]),
    np.array([1e300, np.nan]),
    np.array([np.finfo(np.float64).max, np.inf]),
    np.array([1e200 + 1e200j]),
    np.array([1.0, 2.0], np.float32),
    np.array([np.inf], np.float16),
    np.float64(1e300),
    np.array([], np.float64),
]


@pytest.mark.parametrize("leaf", FINITENESS, ids=repr)
def test_all_finite_agrees_with_numpy_on_concrete_leaves(leaf: Any) -> None:
    assert bool(all_finite({"g": leaf, "n": np.int64(2**40)})) == bool(np.isfinite(leaf).all())


@pytest.mark.parametrize("value", [1e300, -1e300, float("inf"), float("nan"), 1e300j])
def test_all_finite_on_python_numbers_agrees_with_math(value: Any) -> None:
    assert bool(all_finite([value])) == bool(np.isfinite(value))


def test_all_finite_under_jit_sees_closed_over_float64_constants_as_numpy_does() -> None:
    big = np.array([1e300])
    assert bool(jax.jit(lambda g: all_finite((g, big)))(jnp.ones(2)))


def test_integer_parameters_keep_their_value_under_float0_and_integer_updates() -> None:
    params = {"w": jnp.ones(2), "n": jnp.int32(3), "flag": np.bool_(True)}
    grads = jax.grad(lambda p: jnp.sum(p["w"] * 2.0), allow_int=True)(params)
    assert grads["n"].dtype == jax.dtypes.float0
    new = apply_updates(params, grads)
    np.testing.assert_array_equal(np.asarray(new["w"]), [3.0, 3.0])
    assert int(new["n"]) == 3
    assert bool(new["flag"])
    # integer updates leave integer parameters as they are (documented)
    assert int(apply_updates({"n": jnp.int32(3)}, {"n": jnp.int32(5)})["n"]) == 3


def test_complex_and_float64_numpy_parameters_are_added_to() -> None:
    got = apply_updates({"z": jnp.array([1 + 1j], jnp.complex64)}, {"z": jnp.float32([0.5])})
    np.testing.assert_array_equal(np.asarray(got["z"]), np.array([1.5 + 1j], np.complex64))
    p, u = np.array([1.0, -2.0]), np.array([1e-6, 3e30], np.float32)
    got = apply_updates({"w": p}, {"w": u})["w"]
    # float32 in 32-bit JAX (not tf32's 10 bits: 1 + 1e-6 is kept)
    np.testing.assert_array_equal(np.asarray(got), p.astype(np.float32) + u)


def test_a_factor_past_int32_still_shrinks_the_scale() -> None:
    ls = DynamicLossScale(2.0**100, factor=2**40, min_loss_scale=1.0)
    assert float(ls.adjust(np.bool_(False)).loss_scale) == 2.0**60


def test_loss_scaling_keeps_the_params_layout_through_jit() -> None:
    tx = loss_scaling(optax.sgd(1.0), StaticLossScale(4.0))
    state = tx.init(W)
    updates, state = jax.jit(tx.update)({"w": jnp.full(2, 8.0)}, state)
    np.testing.assert_array_equal(np.asarray(updates["w"]), [-2.0, -2.0])
    with pytest.raises(UpdateError, match="loss_scaling"):
        tx.update({"v": jnp.ones(2)}, state)


X64_SCRIPT = """
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp, numpy as np, precision
p, u = np.array([1.0, 1e300]), np.array([1e-12, 1e300])
new = precision.apply_updates({"w": p}, {"w": u})["w"]
assert new.dtype == np.float64 and np.array_equal(np.asarray(new), p + u), new
got = precision.select_tree(True, {"a": np.array([1e300]), "i": 2**40}, {"a": np.zeros(1), "i": 0})
assert np.asarray(got["a"]).tolist() == [1e300] and int(got["i"]) == 2**40, got
assert np.asarray(precision.StaticLossScale(2).scale(np.array([1e300]))).tolist() == [2e300]
assert bool(precision.all_finite(jnp.asarray([1e300])))
try:
    precision.select_tree(True, 2**70, 0)
except precision.LossScaleError as err:
    assert "int64" in str(err), err
else:
    raise AssertionError("2**70 selected")
print("ok")
"""


def test_under_x64_float64_leaves_keep_their_values() -> None:
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(X64_SCRIPT)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "ok"
