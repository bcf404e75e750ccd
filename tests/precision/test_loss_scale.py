"""Loss scaling: growth, halving, skipping, the floor, pytree round trips, no promotion."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import precision
from precision import DynamicLossScale, NoOpLossScale, StaticLossScale, all_finite, select_tree
from precision._errors import LossScaleError, LossScaleTypeError

FINITE = jnp.bool_(True)
OVERFLOW = jnp.bool_(False)


def _adjust_many(ls, flags, *, jit: bool):
    adjust = jax.jit(lambda ls, f: ls.adjust(f)) if jit else (lambda ls, f: ls.adjust(f))
    history = []
    for f in flags:
        ls = adjust(ls, jnp.bool_(f))
        history.append((float(ls.loss_scale), int(ls.counter)))
    return ls, history


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_grows_by_factor_after_period_finite_steps(jit):
    ls = DynamicLossScale(jnp.float32(8.0), period=3, factor=2)
    _, history = _adjust_many(ls, [True] * 7, jit=jit)
    # Reference worked out by hand: the scale doubles on every 3rd finite step.
    assert history == [(8, 1), (8, 2), (16, 0), (16, 1), (16, 2), (32, 0), (32, 1)]


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_halves_and_restarts_count_on_overflow_and_floors_at_min(jit):
    ls = DynamicLossScale(jnp.float32(16.0), period=3, factor=2, min_loss_scale=4.0)
    _, history = _adjust_many(ls, [True, True, False, False, False, False, True], jit=jit)
    assert history == [(16, 1), (16, 2), (8, 0), (4, 0), (4, 0), (4, 0), (4, 1)]


def test_factor_other_than_two():
    ls = DynamicLossScale(jnp.float32(81.0), period=1, factor=3, min_loss_scale=1.0)
    assert float(ls.adjust(FINITE).loss_scale) == 243.0
    assert float(ls.adjust(OVERFLOW).loss_scale) == 27.0


def test_every_field_survives_flatten_unflatten_and_jit():
    ls = DynamicLossScale(jnp.float32(2.0**10), counter=5, period=17, factor=4, min_loss_scale=8.0)
    leaves, treedef = jax.tree_util.tree_flatten(ls)
    back = jax.tree_util.tree_unflatten(treedef, leaves)
    through_jit = jax.jit(lambda x: x)(ls)
    mapped = jax.tree_util.tree_map(lambda x: x, ls)
    for other in (back, through_jit, mapped):
        assert type(other) is DynamicLossScale
        assert float(other.loss_scale) == 1024.0
        assert int(other.counter) == 5
        assert (other.period, other.factor, other.min_loss_scale) == (17, 4, 8.0)
    # The settings are static: they are not leaves that a tree_map could turn into arrays.
    assert len(leaves) == 2
    # adjust under jit keeps the settings too (the bug where min_loss_scale was lost).
    low = DynamicLossScale(jnp.float32(2.0), period=17, factor=4, min_loss_scale=1.5)
    assert float(jax.jit(lambda x: x.adjust(OVERFLOW))(low).loss_scale) == 1.5


def test_static_and_noop_round_trip():
    s = StaticLossScale(128.0)
    s2 = jax.tree_util.tree_unflatten(*reversed(jax.tree_util.tree_flatten(s)))
    assert float(s2.loss_scale) == 128.0
    assert s.adjust(OVERFLOW) is s
    n = NoOpLossScale()
    assert jax.tree_util.tree_leaves(n) == []
    assert float(n.loss_scale) == 1.0
    assert n.adjust(OVERFLOW) is n


@pytest.mark.parametrize(
    "ls",
    [StaticLossScale(2.0**15), DynamicLossScale(jnp.float32(2.0**15)), NoOpLossScale()],
    ids=["static", "dynamic", "noop"],
)
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
def test_scale_never_promotes_the_loss(ls, dtype):
    loss = jnp.asarray(0.5, dtype)
    scaled = ls.scale(loss)
    assert scaled.dtype == dtype
    assert ls.unscale(scaled).dtype == dtype
    # Under jit and inside lax.cond, whose branches must agree in dtype.
    out = jax.jit(lambda x: jax.lax.cond(x > 0, ls.scale, lambda y: y, x))(loss)
    assert out.dtype == dtype
    assert float(ls.unscale(scaled)) == 0.5


def test_scale_leaves_non_floating_leaves_alone():
    ls = StaticLossScale(4.0)
    out = ls.scale({"loss": jnp.float32(1.5), "n": jnp.int32(3)})
    assert float(out["loss"]) == 6.0
    assert out["n"].dtype == jnp.int32
    assert int(out["n"]) == 3


def test_scaling_a_tensor_leaf_is_refused_with_the_fix_that_works():
    t = precision.Tensor([1.0]).to_reduced_precision("bfloat16")
    for leaf in (t, t.to_full_precision()):
        with pytest.raises(TypeError, match=r"precision\.to_full_precision\(tree\)"):
            StaticLossScale(2.0).scale({"t": leaf})
    scaled = StaticLossScale(2.0).scale(precision.to_full_precision({"t": t}))
    assert scaled["t"].tolist() == [2.0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"loss_scale": 0.0}, "positive finite"),
        ({"loss_scale": float("inf")}, "positive finite"),
        ({"loss_scale": [1.0, 2.0]}, "scalar"),
        ({"loss_scale": 2.0, "period": 0}, "period"),
        ({"loss_scale": 2.0, "factor": 1}, "factor"),
        ({"loss_scale": 2.0, "min_loss_scale": 0.0}, "min_loss_scale"),
    ],
)
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DynamicLossScale(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"factor": float("inf")}, LossScaleError, "finite"),
        ({"factor": float("nan")}, LossScaleError, "finite"),
        ({"factor": True}, LossScaleTypeError, "number"),
        ({"min_loss_scale": float("inf")}, LossScaleError, "finite"),
        ({"min_loss_scale": -1.0}, LossScaleError, "positive"),
        ({"min_loss_scale": "1"}, LossScaleTypeError, "number"),
        ({"counter": -1}, LossScaleError, "non-negative"),
        ({"counter": 1.5}, LossScaleError, "integer"),
        ({"counter": [0, 1]}, LossScaleError, "scalar"),
        ({"period": 2.0}, LossScaleError, "period"),
        ({"loss_scale": float("nan")}, LossScaleError, "positive finite"),
    ],
)
def test_more_bad_settings_are_refused_in_the_hierarchy(kwargs, error, match):
    kwargs = {"loss_scale": 2.0, **kwargs}
    with pytest.raises(error, match=match) as info:
        DynamicLossScale(**kwargs)
    assert isinstance(info.value, precision.PrecisionError)


def test_static_loss_scale_of_nan_is_a_precision_error():
    with pytest.raises(LossScaleError, match="positive finite"):
        StaticLossScale(float("nan"))


def test_settings_accept_numpy_and_jax_scalars():
    # jmp users pass min_loss_scale as a JAX scalar.
    ls = DynamicLossScale(
        jnp.float32(8.0),
        period=np.int64(2),
        factor=np.float32(2.0),
        min_loss_scale=jnp.float32(1.0),
    )
    assert (ls.period, ls.factor, ls.min_loss_scale) == (2, 2.0, 1.0)
    assert all(type(v) in (int, float) for v in (ls.period, ls.factor, ls.min_loss_scale))
    hash(jax.tree_util.tree_structure(ls))  # static aux data stays hashable


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("factor", [2, 3, 1.5])
def test_growth_stops_at_the_largest_float32_power_of_two(jit, factor):
    top = 2.0**127  # float32's largest power of two; factor * top overflows to inf
    ls = DynamicLossScale(jnp.float32(2.0**120), period=1, factor=factor)
    history = _adjust_many(ls, [True] * 40, jit=jit)[1]
    scales = [s for s, _ in history]
    assert all(np.isfinite(scales))
    assert max(scales) <= top
    # from an exact reference: min(s * factor, 2**127), in float32 steps
    expected, s = [], np.float32(2.0**120)
    for _ in range(40):
        s = np.float32(min(float(s) * factor, top))
        expected.append(float(s))
    assert scales == expected
    # and it still halves after an overflow at the cap
    ls = DynamicLossScale(jnp.float32(top), period=1)
    assert float(ls.adjust(OVERFLOW).loss_scale) == 2.0**126


def test_a_scale_above_the_cap_is_kept_not_lowered_by_growth():
    big = np.float32(3e38)
    ls = DynamicLossScale(jnp.float32(big), period=1).adjust(FINITE)
    assert float(ls.loss_scale) == float(big)


def test_a_counter_past_the_period_still_grows():
    ls = DynamicLossScale(jnp.float32(4.0), counter=10, period=3).adjust(FINITE)
    assert (float(ls.loss_scale), int(ls.counter)) == (8.0, 0)


@pytest.mark.parametrize(
    ("flag", "error", "match"),
    [
        (float("nan"), LossScaleTypeError, "boolean flag"),
        (jnp.float32(1.0), LossScaleTypeError, "boolean flag"),
        (jnp.array([True, False]), LossScaleError, "scalar"),
        ("yes", LossScaleTypeError, "boolean flag"),
    ],
)
def test_adjust_needs_one_boolean_flag(flag, error, match):
    ls = DynamicLossScale(jnp.float32(8.0))
    with pytest.raises(error, match=match):
        ls.adjust(flag)
    with pytest.raises(error, match=match):
        jax.jit(lambda f: ls.adjust(f))(flag) if not isinstance(flag, str) else ls.adjust(flag)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize(
    "finite",
    [True, np.bool_(True), np.array(True), jnp.bool_(True), jnp.array(True)],
    ids=["python", "numpy-scalar", "numpy-0d", "jax-scalar", "jax-0d"],
)
def test_adjust_takes_every_kind_of_boolean_flag(jit, finite):
    ls = DynamicLossScale(jnp.float32(8.0), period=1)
    adjust = jax.jit(lambda ls, f: ls.adjust(f)) if jit else (lambda ls, f: ls.adjust(f))
    assert float(adjust(ls, finite).loss_scale) == 16.0
    assert float(adjust(ls, not finite if isinstance(finite, bool) else ~finite).loss_scale) == 4.0


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize(
    "flag",
    [1, 0, np.int32(1), np.uint8(1), jnp.int32(1), jnp.sum(jnp.isfinite(jnp.array([1.0, np.nan])))],
    ids=["python-1", "python-0", "numpy-int32", "numpy-uint8", "jax-int32", "count-of-finite"],
)
@pytest.mark.parametrize("scale", [DynamicLossScale(8.0), StaticLossScale(8.0), NoOpLossScale()])
def test_adjust_refuses_integer_flags(jit, flag, scale):
    # a count of finite values (here 1 of 2) would have read as True: "all finite"
    adjust = jax.jit(lambda ls, f: ls.adjust(f)) if jit else (lambda ls, f: ls.adjust(f))
    with pytest.raises(LossScaleTypeError, match="needs a boolean flag"):
        adjust(scale, flag)


@pytest.mark.parametrize("pred", [float("nan"), 0.0, jnp.float32(1.0), 1, jnp.int32(0)])
def test_select_tree_refuses_a_float_or_integer_predicate(pred):
    with pytest.raises(LossScaleTypeError, match="boolean flag"):
        select_tree(pred, {"w": jnp.ones(2)}, {"w": jnp.zeros(2)})


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("n", [4095, 4096, 4097, 65537])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_all_finite_sees_one_bad_value_at_every_size(jit, n, where, bad):
    # XLA:CPU's vectorised max drops NaN above ~4096 elements under jit; the
    # reference is numpy on the same data.
    x = np.ones(n, np.float32)
    x[{"first": 0, "middle": n // 2, "last": n - 1}[where]] = bad
    f = jax.jit(all_finite) if jit else all_finite
    tree = {"a": x, "b": x.astype(np.float16).reshape(1, n), "c": jnp.ones(3)}
    assert bool(f(tree)) is bool(np.all(np.isfinite(x))) is False
    assert bool(f({"a": np.ones(n, np.float32)})) is True


def test_all_finite_sees_nan_in_a_large_tensor_leaf():
    x = np.ones(65537, np.float32)
    x[-1] = np.nan
    t = precision.Tensor(x).to_reduced_precision("bfloat16")
    assert bool(jax.jit(all_finite)({"t": t})) is False


def test_all_finite():
    assert bool(all_finite({})) is True
    assert bool(all_finite({"a": jnp.ones(3), "i": jnp.int32(1)})) is True
    assert bool(all_finite([jnp.ones(2), jnp.array([1.0, jnp.nan])])) is False
    assert bool(all_finite({"x": jnp.array([-jnp.inf], jnp.float16)})) is False
    assert bool(jax.jit(all_finite)([jnp.ones(2), jnp.array([jnp.inf])])) is False
    t = precision.Tensor([1.0, 2.0]).to_reduced_precision("float16")
    assert bool(all_finite({"t": t})) is True
    big = precision.Tensor([1e6]).to_reduced_precision("float16")  # overflows float16 to inf
    assert bool(all_finite({"t": big})) is False


def test_select_tree():
    a = {"w": jnp.ones(2), "n": jnp.int32(1)}
    b = {"w": jnp.zeros(2), "n": jnp.int32(2)}
    picked = jax.jit(select_tree)(jnp.bool_(True), a, b)
    assert picked["w"].tolist() == [1.0, 1.0]
    assert int(picked["n"]) == 1
    picked = select_tree(jnp.bool_(False), a, b)
    assert picked["w"].tolist() == [0.0, 0.0]
    assert int(picked["n"]) == 2


def test_select_tree_on_tensors_of_one_format():
    a = precision.Tensor([1.0, 2.0]).to_reduced_precision("int8")
    b = precision.Tensor([3.0, -4.0]).to_reduced_precision("int8")
    out = select_tree(jnp.bool_(False), {"t": a}, {"t": b})["t"]
    assert out.format.name == "int8"
    np.testing.assert_array_equal(np.asarray(out), np.asarray(b))


def test_select_tree_errors():
    with pytest.raises(ValueError, match="one structure"):
        select_tree(jnp.bool_(True), {"a": jnp.ones(1)}, {"b": jnp.ones(1)})
    with pytest.raises(TypeError, match=r"\['a'\].*float16.*float32"):
        select_tree(jnp.bool_(True), {"a": jnp.ones(1, jnp.float16)}, {"a": jnp.ones(1)})
    with pytest.raises(ValueError, match="scalar"):
        select_tree(jnp.ones(2, bool), {"a": jnp.ones(2)}, {"a": jnp.ones(2)})


# -- the reason loss scaling exists ------------------------------------------------------

X = np.float32(1e-4)  # a normal float16 number
TINY = np.float32(1e-4)  # the loss weight; the gradient is X * TINY = 1e-8 < 2**-24


def _native_fp16_grad(w, loss_scale):
    """Gradient of TINY * sum(w * X) with the forward and backward pass in float16."""

    def loss(w32):
        w16 = w32.astype(jnp.float16)
        value = jnp.sum(w16 * jnp.float16(X)) * jnp.float16(TINY)
        return loss_scale.scale(value)

    return loss_scale.unscale(jax.grad(loss)(w).astype(jnp.float32))


_DOT = precision.apply(lambda w, x: jnp.sum(w * x))


def _tensor_fp16_grad(w, loss_scale):
    """The same through precision Tensors: parameters stored in float16 inside the loss."""

    def loss(w32):
        w16 = precision.Tensor(w32).to_reduced_precision("float16")
        x16 = precision.Tensor(jnp.full(w32.shape, X)).to_reduced_precision("float16")
        value = precision.to_full_precision(_DOT(w16, x16)) * TINY
        return loss_scale.scale(value)

    return loss_scale.unscale(jax.grad(loss)(w))


@pytest.mark.parametrize(
    "grad_fn", [_native_fp16_grad, _tensor_fp16_grad], ids=["native", "tensor"]
)
def test_float16_gradients_underflow_without_scaling_and_are_recovered_with_it(grad_fn):
    w = jnp.ones(4, jnp.float32)
    exact = float(X) * float(TINY)  # d/dw of TINY * sum(w * X), computed in float64
    assert exact < 2.0**-25  # below half the smallest float16 subnormal: it must flush
    lost = grad_fn(w, NoOpLossScale())
    assert np.all(np.asarray(lost) == 0.0)

    # Dynamic scaling: start too high on purpose; overflowing steps halve the scale
    # until the scaled gradient is finite, then it is right to float16 precision.
    ls = DynamicLossScale(jnp.float32(2.0**40), period=2000)
    for _ in range(40):
        g = grad_fn(w, ls)
        finite = all_finite(g)
        ls = ls.adjust(finite)
        if bool(finite) and np.all(np.asarray(g) != 0):
            break
    np.testing.assert_allclose(np.asarray(g), exact, rtol=2.0**-10)
    assert float(ls.loss_scale) < 2.0**40
