"""Autodiff and transforms over Tensors: straight-through conversions, grads close to f32."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from op_reference import assert_same_bits, reference_round

import dtypes
import precision
from precision import Tensor, to_full_precision


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("name", ["bfloat16", "float16", "tf32", "float8_e4m3fn"])
def test_conversion_is_straight_through(name):
    x = jnp.array([0.3, -1.7, 2.2])

    def f(x):
        return jnp.sum(
            to_full_precision(Tensor(x).to_reduced_precision(name)) * jnp.arange(1.0, 4.0)
        )

    g = jax.grad(f)(x)
    # d decode(encode(x))/dx = 1 inside the range; the weights 1, 2, 3 are exact in
    # every format here, so the gradient is exactly them.
    np.testing.assert_array_equal(np.asarray(g), [1.0, 2.0, 3.0])


def test_value_and_grad_of_a_loss_through_apply():
    w = jnp.array([[0.5, -0.25], [1.5, 2.0]])
    x = jnp.array([[1.0, 2.0], [3.0, -1.0]])

    def loss(w):
        wt = Tensor(w).to_reduced_precision()
        y = precision.apply(lambda a, b: jnp.tanh(a @ b))(Tensor(x).to_reduced_precision(), wt)
        return jnp.mean(to_full_precision(y) ** 2)

    value, grad = jax.value_and_grad(loss)(w)
    ref_value, ref_grad = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    assert abs(float(value) - float(ref_value)) < 2e-2 * abs(float(ref_value))
    assert _rel(grad, ref_grad) < 3e-2


def test_a_gradient_of_stored_integer_codes_says_what_to_differentiate():
    """`allow_int=True` makes float0 gradients for int8 codes, a Tensor of no values:
    reading it names the cause and what to differentiate, not a dtype mismatch."""
    params = precision.to_reduced_precision({"w": jnp.ones((4, 2))}, "int8")

    def loss(p):
        y = precision.apply(lambda p, x: x @ p["w"])(p, jnp.ones((3, 4)))
        return jnp.sum(to_full_precision(y) ** 2)

    grads = jax.grad(loss, allow_int=True)(params)
    with pytest.raises(TypeError, match=r"gradient that jax\.grad.*Differentiate float32"):
        np.asarray(grads["w"])


# Smooth activations: with ReLU a bf16 forward pass flips a few units near their
# kink, and the f32 gradients of those units differ by far more than rounding
# (an emulation with lax.reduce_precision after every op shows the same gap);
# that case is compared against the emulation instead, below.
def _mlp(params, x, act=jnp.tanh):
    (w1, b1), (w2, b2), (w3, b3) = params
    h = act(x @ w1 + b1[None, :])
    h = act(h @ w2 + b2[None, :])
    return jax.nn.log_softmax(h @ w3 + b3[None, :])


def _params(key, sizes):
    out = []
    for i in range(len(sizes) - 1):
        k = jax.random.fold_in(key, i)
        out.append(
            (
                jax.random.normal(k, (sizes[i], sizes[i + 1])) / np.sqrt(sizes[i]),
                jnp.full(sizes[i + 1], 0.01),
            )
        )
    return out


def _loss_f32(params, x, labels, mlp=_mlp):
    logits = mlp(params, x)
    return -jnp.mean(jnp.take_along_axis(logits, labels[:, None], axis=1))


def _loss_bf16(params, x, labels, mlp=_mlp):
    p = jax.tree.map(lambda a: Tensor(a).to_reduced_precision("bfloat16"), params)
    logits = precision.apply(mlp)(p, Tensor(x).to_reduced_precision("bfloat16"))
    logits = to_full_precision(logits)
    return -jnp.mean(jnp.take_along_axis(logits, labels[:, None], axis=1))


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_mlp_grads_agree_with_float32(mode):
    params = _params(jax.random.key(0), [20, 32, 32, 5])
    x = jax.random.normal(jax.random.key(1), (16, 20))
    labels = jax.random.randint(jax.random.key(2), (16,), 0, 5)
    grad = jax.grad(_loss_bf16)
    if mode == "jit":
        grad = jax.jit(grad)
    g = grad(params, x, labels)
    g32 = jax.grad(_loss_f32)(params, x, labels)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g32), strict=True):
        assert _rel(a, b) < 2e-2


def _bf16_round(a):
    return lax.reduce_precision(a, exponent_bits=8, mantissa_bits=7)


def _relu_mlp_emulated(params, x):
    """The same bf16 computation written by hand: round every op's result."""
    params, x = jax.tree.map(_bf16_round, params), _bf16_round(x)
    for w, b in params[:-1]:
        x = _bf16_round(jax.nn.relu(_bf16_round(_bf16_round(x @ w) + b[None, :])))
    w, b = params[-1]
    return _bf16_round(jax.nn.log_softmax(_bf16_round(_bf16_round(x @ w) + b[None, :])))


def test_relu_mlp_grads_agree_with_hand_emulation():
    params = _params(jax.random.key(0), [20, 32, 32, 5])
    x = jax.random.normal(jax.random.key(1), (16, 20))
    labels = jax.random.randint(jax.random.key(2), (16,), 0, 5)
    relu_mlp = lambda p, x: _mlp(p, x, act=jax.nn.relu)
    g = jax.grad(_loss_bf16)(params, x, labels, relu_mlp)
    ge = jax.grad(_loss_f32)(params, x, labels, _relu_mlp_emulated)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(ge), strict=True):
        assert _rel(a, b) < 1e-2


def _cnn(params, x, pool=lax.max, init=-jnp.inf, r=lambda a: a):
    """Two 3x3 convolutions, a 2x2 pooling, a dense layer; `r` rounds each result."""
    w1, w2, wd = jax.tree.map(r, params)
    dn = ("NHWC", "HWIO", "NHWC")
    conv = lambda x, w: r(lax.conv_general_dilated(r(x), w, (1, 1), "SAME", dimension_numbers=dn))
    x = r(jnp.tanh(conv(x, w1)))
    x = r(jnp.tanh(conv(x, w2)))
    x = r(lax.reduce_window(x, init, pool, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"))
    return r(jnp.sum(r(jnp.tanh(r(x.reshape(x.shape[0], -1) @ wd)))))


def _cnn_setup():
    ks = jax.random.split(jax.random.key(3), 4)
    params = (
        jax.random.normal(ks[0], (3, 3, 1, 4)) / 3,
        jax.random.normal(ks[1], (3, 3, 4, 4)) / 6,
        jax.random.normal(ks[2], (64, 3)) / 8,
    )
    return params, jax.random.normal(ks[3], (2, 8, 8, 1))


def _cnn_grad_bf16(params, x, **kw):
    def loss(params):
        p = jax.tree.map(lambda a: Tensor(a).to_reduced_precision(), params)
        f = lambda p, x: _cnn(p, x, **kw)
        return to_full_precision(precision.apply(f)(p, Tensor(x).to_reduced_precision()))

    return jax.grad(loss)(params)


def test_cnn_maxpool_grads_agree_with_hand_emulation():
    # Max-pooling over bf16 values meets ties that f32 values do not have, so
    # the reference is the same computation rounded by hand after every op.
    params, x = _cnn_setup()
    g = _cnn_grad_bf16(params, x)
    ge = jax.grad(lambda p: _cnn(p, x, r=_bf16_round))(params)
    for a, b in zip(g, ge, strict=True):
        assert _rel(a, b) < 1e-2


def test_cnn_grads_agree_with_float32():
    params, x = _cnn_setup()
    g = _cnn_grad_bf16(params, x, pool=lax.add, init=0.0)
    g32 = jax.grad(lambda p: _cnn(p, x, pool=lax.add, init=0.0))(params)
    for a, b in zip(g, g32, strict=True):
        assert _rel(a, b) < 3e-2


def test_scan_rnn_grads_agree_with_float32():
    ks = jax.random.split(jax.random.key(4), 2)
    w = jax.random.normal(ks[0], (8, 8)) / 3
    xs = jax.random.normal(ks[1], (6, 8))

    def rnn(w, xs):
        def step(h, x):
            h = jnp.tanh(h @ w + x)
            return h, h

        return jnp.sum(lax.scan(step, jnp.zeros(8), xs)[1] ** 2)

    def loss(w):
        t = Tensor(w).to_reduced_precision()
        return to_full_precision(precision.apply(rnn)(t, Tensor(xs).to_reduced_precision()))

    assert _rel(jax.grad(loss)(w), jax.grad(rnn)(w, xs)) < 5e-2


def test_custom_jvp_rule_is_kept():
    @jax.custom_jvp
    def f(x):
        return jnp.sin(x)

    # a deliberately wrong derivative: proves the custom rule, not autodiff of sin, is used
    f.defjvp(lambda p, t: (f(p[0]), 10.0 * t[0]))

    def loss(x):
        return jnp.sum(to_full_precision(precision.apply(f)(Tensor(x).to_reduced_precision())))

    x = jnp.array([0.5, 1.0])
    np.testing.assert_allclose(np.asarray(jax.grad(loss)(x)), [10.0, 10.0])
    # and the primal is rounded to the format
    out = precision.apply(f)(Tensor(x).to_reduced_precision("float16"))
    expected = np.sin(np.asarray(x, np.float32)).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(out), expected)


def test_custom_vjp_rule_is_kept():
    @jax.custom_vjp
    def clip_gradient(x):
        return x * 1.0

    clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.5, 0.5),))

    def loss(x):
        y = precision.apply(lambda a: clip_gradient(a) * 4.0)(Tensor(x).to_reduced_precision())
        return jnp.sum(to_full_precision(y))

    np.testing.assert_array_equal(np.asarray(jax.grad(loss)(jnp.ones(3))), [0.5, 0.5, 0.5])


def test_jax_nn_custom_rules_inside_apply():
    x = jnp.array([-1.0, 0.0, 2.0])

    def loss(x):
        return jnp.sum(
            to_full_precision(precision.apply(jax.nn.relu)(Tensor(x).to_reduced_precision()))
        )

    # relu's own rule gives 0 at 0
    np.testing.assert_array_equal(np.asarray(jax.grad(loss)(x)), [0.0, 0.0, 1.0])


def test_vmap_of_apply():
    # Each op of each row rounded onto bfloat16, bit for bit: exp by plain jnp on the
    # decoded float32 values, each result rounded by ml_dtypes. Inputs in [0, 2) make
    # the exp values 1..7.4 with 8 significant bits, so a float32 sum of 64 of them is
    # exact in any order and the reference sum is the float64 one.
    x = np.random.default_rng(3).uniform(0, 2, (64, 64)).astype(np.float32)
    x = Tensor(x).to_reduced_precision()
    out = jax.vmap(precision.apply(lambda r: jnp.exp(r) / jnp.sum(jnp.exp(r))))(x)
    assert out.format == dtypes.bfloat16
    assert out.shape == (64, 64)
    e = reference_round(jnp.exp(jnp.asarray(np.asarray(x))), "bfloat16")
    s = reference_round(e.astype(np.float64).sum(-1, keepdims=True), "bfloat16")
    assert_same_bits(np.asarray(out), reference_round(e / s, "bfloat16"))


def test_jit_of_grad_of_vmap():
    w = jnp.array([0.5, -1.5, 2.0])
    xs = jnp.array([[1.0, 2.0, 3.0], [0.5, 0.25, -1.0]])

    def per_example(w, x):
        return to_full_precision(precision.apply(lambda a, b: jnp.sum(a * b))(w, x))

    def loss(w):
        wt = Tensor(w).to_reduced_precision()
        xt = Tensor(xs).to_reduced_precision()
        return jnp.sum(jax.vmap(per_example, in_axes=(None, 0))(wt, xt))

    g = jax.jit(jax.grad(loss))(w)
    expected = np.asarray(xs, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32).sum(0)
    np.testing.assert_array_equal(np.asarray(g), expected)


def test_integer_format_rounding_inside_rules_is_straight_through():
    # int8 Tensors hold integer codes (no gradient flows through their storage);
    # values computed from full-precision inputs inside apply are rounded with
    # straight-through gradients.
    x = jnp.array([0.5, -1.0, 2.0])
    t = Tensor(jnp.array([1.0, 2.0, 3.0])).to_reduced_precision("int8")

    def loss(x):
        return jnp.sum(jnp.asarray(precision.apply(lambda a, b: a * b)(t.to_full_precision(), x)))

    np.testing.assert_allclose(np.asarray(jax.grad(loss)(x)), np.asarray(t), rtol=1e-6)


STORAGE_WITHOUT_GRADIENT = [
    pytest.param("int8", None, id="int8"),
    pytest.param("int4", dtypes.PerAxis(0), id="int4-per-axis"),
    pytest.param("int2", dtypes.PerBlock(2), id="int2-per-block"),
    pytest.param("int1", None, id="int1"),
    pytest.param("float8_e4m3fn", dtypes.PerTensor(), id="e4m3-scaled"),
    pytest.param(dtypes.FloatFormat(2, 1, finite=True), None, id="e2m1-codes"),
]


@pytest.mark.parametrize(("fmt", "scaling"), STORAGE_WITHOUT_GRADIENT)
def test_conversion_into_code_storage_is_straight_through(fmt, scaling):
    # Integer codes cannot carry a gradient; a Tensor converted from a traced
    # value keeps its straight-through values, so the gradient reaches x and
    # is exactly the weights (the clipped estimator passes 1 everywhere here).
    x = jnp.array([[0.3, -1.7], [2.2, 0.9]])
    weights = jnp.array([[1.0, 2.0], [3.0, 4.0]])

    def f(x):
        t = Tensor(x).to_reduced_precision(fmt, scaling=scaling)
        return jnp.sum(to_full_precision(t) * weights)

    for grad in (jax.grad(f), jax.jit(jax.grad(f))):
        np.testing.assert_array_equal(np.asarray(grad(x)), np.asarray(weights))


@pytest.mark.parametrize(("fmt", "scaling"), STORAGE_WITHOUT_GRADIENT)
def test_straight_through_values_equal_the_stored_values(fmt, scaling):
    x = jnp.array([[0.3, -1.7], [2.2, 0.9]])
    eager = Tensor(x).to_reduced_precision(fmt, scaling=scaling)
    traced = jax.jit(lambda v: Tensor(v).to_reduced_precision(fmt, scaling=scaling))(x)
    # Concrete conversions and conversions under `jit` alone hold storage only:
    # exactly the arrays `nbytes` counts, and the same pytree either way.
    for t in (eager, traced):
        assert t._straight_through is None
        leaves = jax.tree_util.tree_leaves(t)
        assert sum(leaf.nbytes for leaf in leaves) == t.nbytes
    assert jax.tree_util.tree_structure(eager) == jax.tree_util.tree_structure(traced)
    expected = np.asarray(eager.format.decode(eager.encoded))
    np.testing.assert_array_equal(np.asarray(traced), expected)
    np.testing.assert_array_equal(np.asarray(traced.format.decode(traced.encoded)), expected)


def test_power_of_two_clipping_passes_no_gradient():
    # absmax 15.5 in int4 with a power-of-two scale: scale 2, 15.5 / 2 = 7.75
    # rounds to code 8, outside [-7, 7]; that element is clipped (gradient 0).
    x = jnp.array([15.5, 1.0, -3.0, 0.25])
    scaling = dtypes.PerTensor(power_of_two=True)

    def f(x):
        return jnp.sum(jnp.asarray(Tensor(x).to_reduced_precision("int4", scaling=scaling)))

    np.testing.assert_array_equal(np.asarray(jax.grad(f)(x)), [0.0, 1.0, 1.0, 1.0])


def test_int8_mlp_grads_through_apply_agree_with_float32():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((16, 8)), jnp.float32)
    w1 = jnp.asarray(rng.standard_normal((8, 16)) / 3, jnp.float32)
    w2 = jnp.asarray(rng.standard_normal((16, 4)) / 4, jnp.float32)

    def mlp(x, w1, w2):
        return jnp.mean(jnp.tanh(x @ w1) @ w2)

    def qat_loss(ws):
        q = [Tensor(w).to_reduced_precision("int8", scaling=dtypes.PerAxis(1)) for w in ws]
        return jnp.asarray(precision.apply(mlp)(Tensor(x).to_reduced_precision("int8"), *q))

    g = jax.grad(qat_loss)((w1, w2))
    ref = jax.grad(lambda ws: mlp(x, *ws))((w1, w2))
    for a, b in zip(g, ref, strict=True):
        assert _rel(a, b) < 0.05


@pytest.mark.parametrize(("fmt", "scaling"), STORAGE_WITHOUT_GRADIENT)
def test_differentiating_a_conversion_from_outside_its_trace_is_refused(fmt, scaling):
    # jax.grad(jax.jit(loss)): the conversion was traced without a tangent, so
    # its codes would pass a zero gradient silently; the derivative rule refuses.
    x = jnp.array([[0.3, -1.7], [2.2, 0.9]])

    def loss(v):
        return jnp.sum(to_full_precision(Tensor(v).to_reduced_precision(fmt, scaling=scaling)))

    with pytest.raises(precision.PrecisionError, match=r"jax\.jit\(jax\.grad"):
        jax.grad(jax.jit(loss))(x)
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.grad(loss))(x)), np.ones((2, 2)))


E8M0_BLOCKS = dtypes.PerBlock(32, power_of_two=True, scale_format="float8_e8m0fnu")


@pytest.mark.parametrize(
    ("name", "scaling"),
    [
        ("mxfp4", None),
        ("mxfp8_e4m3", None),
        ("mxint8", None),
        ("mxfp6_e2m3", None),
        ("int8", E8M0_BLOCKS),
        ("float8_e4m3fn", E8M0_BLOCKS),
    ],
)
def test_grad_through_mx_conversions_is_the_clipped_straight_through(name, scaling):
    """E8M0 scales once made the straight-through derivative multiply float32 by
    float8_e8m0fnu (a TypePromotionError in every MX QAT step, and with any E8M0
    `PerBlock` of the caller's). The derivative must equal `Format.round`'s, which
    masks the clipped codes by its own path."""
    fmt = dtypes.get(name)
    x = jnp.asarray(np.random.default_rng(3).normal(size=(6, 64)).astype(np.float32) * 3)
    w = jnp.broadcast_to(jnp.arange(64.0), (6, 64))

    def via_tensor(v):
        t = Tensor(v).to_reduced_precision(name, scaling=scaling)
        return jnp.sum(jnp.asarray(t.to_full_precision()) * w)

    got = jax.jit(jax.grad(via_tensor))(x)
    want = jax.grad(lambda v: jnp.sum(fmt.round(v, scaling=scaling) * w))(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert np.any(np.asarray(got) != 0)


@pytest.mark.parametrize("fmt", ["int8", "int4", "bfloat16", "float8_e4m3fn", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_tensor_out_of_grad_holds_only_its_storage(fmt, jit):
    # converted inside `grad` (QAT) and returned as aux: its straight-through float32
    # copy is gone once it leaves the trace, so nbytes counts what the leaves hold
    w = jnp.asarray(np.linspace(-1, 1, 16 * 64, dtype=np.float32).reshape(16, 64))

    def loss(w):
        q = Tensor(w).to_reduced_precision(fmt)
        return to_full_precision(precision.apply(lambda a: jnp.sum(a * a))(q)), q

    step = jax.grad(loss, has_aux=True)
    g, q = (jax.jit(step) if jit else step)(w)
    held = sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(q))
    assert q.nbytes == held
    assert held < w.nbytes
    # the gradient still flowed (straight through; MX masks values clipped at its top)
    g, q = np.asarray(g), np.asarray(q)
    kept = g != 0
    assert kept.mean() > 0.5
    np.testing.assert_allclose(g[kept], 2 * q[kept], rtol=1e-6)
