"""Op semantics through `precision.apply`: each result is F.round(op(decoded inputs)).

Expected values never come from the code under test: the op runs in numpy or
in plain `jnp` on the decoded float32 inputs, and the rounding onto the format
is ml_dtypes' cast (or an integer bit-manipulation reference for tf32).
"""

from __future__ import annotations

import functools
import itertools
import operator

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from jax import lax
from op_reference import assert_same_bits, emulate, reference_round
from sampling import HUNT

import dtypes
import precision
import precision.numpy as pnp
from precision import Tensor
from precision import _jax_compat as compat
from precision.testing._plugin import selected_formats

# The registry's formats in their roles (docs/design.md §4): compute formats are the
# unscaled floats, each op's result rounded onto them (float32 and float64 round
# nothing, so they are left out); storage encodings are every other entry, decoded
# into float32 where used (float64 only with 64-bit JAX, as the `fmt` fixture chooses).
REGISTERED = selected_formats()
FLOAT_FORMATS = [
    f.name
    for f in REGISTERED
    if f.kind == "float" and f.default_scaling() is None and not f.is_full_precision
]
STORAGE_FORMATS = [
    f.name for f in REGISTERED if not (f.kind == "float" and f.default_scaling() is None)
]
MODES = ["eager", "jit"]
# A named encoding (dtypes.ENCODINGS) is an element layout the formats above already
# have, or a scaling of one: each runs in one mode (in turn) with a tenth of the
# profile's examples, as each adds compiles; all of both under the hunt profile.
ENCODING_EXAMPLES = max(5, settings.default.max_examples // 10)


def cases(names: list[str]) -> list:
    """(name, mode) for each format: both modes for an element format, one in turn for
    a named encoding (both under the hunt profile)."""
    out = []
    for i, name in enumerate(names):
        modes = MODES if HUNT or name not in dtypes.ENCODINGS else [MODES[i % 2]]
        out += [pytest.param(name, mode, id=f"{name}-{mode}") for mode in modes]
    return out


def examples(name: str, mode: str) -> settings:
    """The profile's examples, or a tenth: for a named encoding (above), and in CI for the
    jit mode. `apply` runs each call in a `jax.jit` of its own, so under an outer jit the
    ops are the same interpreter's rules, traced once more into one program: a tenth of
    the examples proves that program, the eager run's full count probes the values (all
    of both under the hunt profile)."""
    if HUNT or (name not in dtypes.ENCODINGS and mode == "eager"):
        return settings()
    return settings(max_examples=ENCODING_EXAMPLES)


def test_the_lists_cover_the_registry():
    x64 = jax.config.read("jax_enable_x64")
    every = {n for n, f in dtypes.REGISTRY.items() if x64 or f.bits <= 32}
    assert set(FLOAT_FORMATS) | set(STORAGE_FORMATS) | {"float32", "float64"} >= every
    for names in (FLOAT_FORMATS, STORAGE_FORMATS):
        assert {p.values[0] for p in cases(names)} == set(names)


@functools.cache
def run(mode: str, f):
    """`f` itself or its jitted version, for the hypothesis tests (the suite's
    `eager_and_jit` fixture is function-scoped, which hypothesis refuses; this
    keeps one jitted function per test, so examples reuse compiled code)."""
    return jax.jit(f) if mode == "jit" else f


# Shapes are fixed so each test compiles once; hypothesis varies the values.
N = 16


def arrays(name, shape, *, allow_nan=True, allow_infinity=True, allow_subnormal=False):
    """float32 arrays mixing general values with values at the format's scale."""
    fmt = dtypes.get(name)
    if fmt.kind == "scale":  # E8M0 holds positive powers of two only
        return hnp.arrays(np.float32, shape, elements=st.floats(2.0**-10, 2.0**10, width=32))
    if fmt.kind == "float" and not fmt.nan:
        # no NaN code (float4_e2m1fn, float6_*): NaN and inf inputs are refused
        allow_nan = allow_infinity = False
    general = st.floats(
        width=32, allow_nan=allow_nan, allow_infinity=allow_infinity, allow_subnormal=False
    )
    top = min(2 * fmt.max, float(np.finfo(np.float32).max)) if fmt.kind == "float" else 1e3
    low = fmt.min_normal if fmt.kind == "float" else 1e-3
    at_scale = st.floats(
        min_value=-top, max_value=top, width=32, allow_subnormal=allow_subnormal
    ).filter(lambda v: v == 0 or abs(v) >= low)
    elements = st.one_of(general, at_scale) if fmt.kind == "float" else at_scale
    return hnp.arrays(np.float32, shape, elements=elements)


def _draw_pair(data, name):
    a = data.draw(arrays(name, (N,), allow_subnormal=False), label="a")
    b = data.draw(arrays(name, (N,), allow_subnormal=False), label="b")
    return a, b


BINARY = {
    "add": (operator.add, np.add),
    "sub": (operator.sub, np.subtract),
    "mul": (operator.mul, np.multiply),
    "div": (operator.truediv, np.divide),
}


def _all_binary(a, b):
    # one function for the four ops: one compilation per format and mode
    return tuple(fn(a, b) for fn, _ in BINARY.values())


def _chain(a, b, c):
    t = a + b
    t = t * c
    t = t - a
    t = t / c
    return jnp.maximum(t, -b) + c


@pytest.mark.parametrize(("name", "mode"), cases(FLOAT_FORMATS))
def test_every_intermediate_of_a_chain_is_rounded(name, mode):
    # A single op's result is rounded again when it is stored in the format's
    # container, which hides a missing rounding; a chain inside one `apply` does
    # not: each intermediate must be on the grid before the next op uses it.
    rng = np.random.default_rng(7)
    a, b = (rng.uniform(-4, 4, 4096).astype(np.float32) for _ in range(2))
    c = (rng.uniform(0.25, 4, 4096) * rng.choice([-1, 1], 4096)).astype(np.float32)
    ta, tb, tc = (Tensor(v).to_reduced_precision(name) for v in (a, b, c))
    out = run(mode, precision.apply(_chain))(ta, tb, tc)
    ra, rb, rc = (reference_round(v, name) for v in (a, b, c))
    with np.errstate(divide="ignore", invalid="ignore"):  # c rounds to 0 in float4
        t = reference_round(ra + rb, name)
        t = reference_round(t * rc, name)
        t = reference_round(t - ra, name)
        t = reference_round(t / rc, name)
        want = reference_round(np.maximum(t, -rb) + rc, name)
    assert_same_bits(np.asarray(out), want, f"{name} chain")


@pytest.mark.parametrize(("name", "mode"), cases(FLOAT_FORMATS))
def test_binary_ops_round_exact_result(name, mode):
    examples(name, mode)(given(data=st.data())(_binary_ops_round_exact_result))(name, mode)


def _binary_ops_round_exact_result(name, mode, data):
    a, b = _draw_pair(data, name)
    ta = Tensor(a).to_reduced_precision(name)
    tb = Tensor(b).to_reduced_precision(name)
    outs = run(mode, _all_binary)(ta, tb)
    da, db = np.asarray(ta, np.float64), np.asarray(tb, np.float64)
    for out, (op, (_, ref)) in zip(outs, BINARY.items(), strict=True):
        assert isinstance(out, Tensor)
        assert out.format == dtypes.get(name)
        with np.errstate(all="ignore"):
            exact = ref(da, db).astype(np.float32)
        expected = reference_round(exact, name)
        # XLA on CPU flushes float32 subnormal results to zero: compare elsewhere.
        normal = ~(np.abs(exact) < np.finfo(np.float32).tiny) | (exact == 0)
        assert_same_bits(np.asarray(out)[normal], expected[normal], op)


@pytest.mark.parametrize("name", ["bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"])
def test_a_result_is_rounded_once_on_its_way_to_storage(name, monkeypatch):
    """Each op's rule rounds its result onto the format's grid, so storing the result
    is a cast: rounding it again gives the same bits, but XLA does not see that and
    computes the rounding twice (a second pass over the result for float8 or float16
    on a CPU)."""
    import precision._compute._rules as rules
    import precision._storage as storage

    x = jnp.linspace(-3.0, 3.0, 3 * 41, dtype=jnp.float32).reshape(3, 41)
    ta = Tensor(x).to_reduced_precision(name)
    tb = Tensor(x[::-1] * 0.3).to_reduced_precision(name)
    rounded: list[str] = []
    real = storage.round_nearest

    def counted(fmt, v):
        rounded.append(fmt.name)
        return real(fmt, v)

    monkeypatch.setattr(rules, "round_nearest", counted)
    monkeypatch.setattr(storage, "round_nearest", counted)
    out = precision.apply(lambda a, b: a * b + a)(ta, tb)
    assert rounded == [name, name]  # the product and the sum; not the stored result
    want = reference_round(
        reference_round(np.asarray(ta, np.float32) * np.asarray(tb, np.float32), name)
        + np.asarray(ta, np.float32),
        name,
    )
    assert_same_bits(np.asarray(out), want, name)


UNARY = {"sqrt": jnp.sqrt, "exp": jnp.exp, "tanh": jnp.tanh}


def _all_unary(a):
    return (pnp.sqrt(a), pnp.exp(a), pnp.tanh(a))


@pytest.mark.parametrize(("name", "mode"), cases(FLOAT_FORMATS))
def test_unary_ops_round_the_logical_result(name, mode):
    examples(name, mode)(given(data=st.data())(_unary_ops_round_the_logical_result))(name, mode)


def _unary_ops_round_the_logical_result(name, mode, data):
    a = data.draw(arrays(name, (N,), allow_subnormal=False), label="a")
    ta = Tensor(a).to_reduced_precision(name)
    outs = run(mode, _all_unary)(ta)
    decoded = jnp.asarray(np.asarray(ta))
    for out, (op, fn) in zip(outs, UNARY.items(), strict=True):
        assert out.format == dtypes.get(name)
        # op computed by plain jnp on the decoded float32 values (the logical
        # dtype), then rounded by ml_dtypes: the interpreter must add nothing else.
        exact = np.asarray(fn(decoded))
        assert_same_bits(np.asarray(out), reference_round(exact, name), op)


@pytest.mark.parametrize(("name", "mode"), cases(FLOAT_FORMATS))
def test_matmul_within_accumulation_tolerance(name, mode):
    examples(name, mode)(given(data=st.data())(_matmul_within_accumulation_tolerance))(name, mode)


def _matmul_within_accumulation_tolerance(name, mode, data):
    k = 5
    finite = {"allow_nan": False, "allow_infinity": False, "allow_subnormal": False}
    a = data.draw(arrays(name, (3, k), **finite), label="a")
    b = data.draw(arrays(name, (k, 2), **finite), label="b")
    fmt = dtypes.get(name)
    # keep products finite in float32, the sum away from the format's overflow and
    # the inputs in its range (float8_e3m4's max is 15.5, float4_e2m1fn's 6)
    top = min(16.0, fmt.max)
    a = np.clip(a, -top, top)
    b = np.clip(b, -top, top)
    ta, tb = Tensor(a).to_reduced_precision(name), Tensor(b).to_reduced_precision(name)
    out = run(mode, operator.matmul)(ta, tb)
    assert out.format == fmt
    exact = np.asarray(ta, np.float64) @ np.asarray(tb, np.float64)
    if not fmt.has_inf and not fmt.nan:  # no inf, no NaN: overflow saturates to ±max
        exact = np.clip(exact, -fmt.max, fmt.max)
    # float32 accumulation error plus one rounding onto the format
    acc = (
        k
        * np.finfo(np.float32).eps
        * (np.abs(np.asarray(ta, np.float64)) @ np.abs(np.asarray(tb, np.float64)))
    )
    got = np.asarray(out, np.float64)
    finite = np.isfinite(got)
    bound = acc + np.abs(exact) * fmt.eps / 2 + fmt.smallest_subnormal + np.finfo(np.float32).tiny
    assert (np.abs(got - exact)[finite] <= bound[finite] * 1.0001).all()
    assert (np.abs(exact[~finite]) >= fmt.max).all()


@pytest.mark.parametrize(("name", "mode"), cases(STORAGE_FORMATS))
def test_storage_ops_compute_exactly_in_float32(name, mode):
    examples(name, mode)(given(data=st.data())(_storage_ops_compute_exactly_in_float32))(name, mode)


def _storage_ops_compute_exactly_in_float32(name, mode, data):
    # Storage is decoded at use and never re-quantized: the sum of two storage
    # Tensors is the float32 sum of their decoded values (XLA may fuse a decode's
    # multiply and the add into one fused multiply-add: one rounding, not two, so
    # the result is within one float32 rounding of the operands' magnitudes).
    a = data.draw(arrays(name, (N,), allow_nan=False, allow_infinity=False), label="a")
    b = data.draw(arrays(name, (N,), allow_nan=False, allow_infinity=False), label="b")
    ta, tb = Tensor(a).to_reduced_precision(name), Tensor(b).to_reduced_precision(name)
    out = run(mode, operator.add)(ta, tb)
    assert out.format == dtypes.float32
    assert out.scaling is None
    expected = np.asarray(ta) + np.asarray(tb)  # numpy float32 on the decoded values
    bound = np.finfo(np.float32).eps * (np.abs(np.asarray(ta)) + np.abs(np.asarray(tb)))
    assert np.all(np.abs(np.asarray(out) - expected) <= bound)


def test_int8_matmul_close_to_float_reference(eager_and_jit):
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(5, 7)).astype(np.float32), rng.normal(size=(7, 3)).astype(np.float32)
    ta, tb = Tensor(a).to_reduced_precision("int8"), Tensor(b).to_reduced_precision("int8")
    out = eager_and_jit(operator.matmul)(ta, tb)
    assert out.format == dtypes.float32  # not re-quantized
    da, db = np.asarray(ta, np.float64), np.asarray(tb, np.float64)
    # exact int32 accumulation of the codes, then a float32 rescale: within a
    # few float32 roundings of the terms' magnitudes of the decoded product
    bound = 4 * np.finfo(np.float32).eps * (np.abs(da) @ np.abs(db))
    assert np.all(np.abs(np.asarray(out) - da @ db) <= bound)


def test_weak_scalar_adopts_format():
    t = Tensor([1.0, 3.0]).to_reduced_precision("bfloat16")
    out = t + 0.1
    assert out.format == dtypes.bfloat16
    point_one = np.float32(ml_dtypes.bfloat16(0.1))
    expected = reference_round(np.asarray(t) + point_one, "bfloat16")
    assert_same_bits(out, expected)
    assert (2.0 * t).format == dtypes.bfloat16
    assert (1.0 - t).numpy().tolist() == [0.0, -2.0]


def test_repeated_eager_calls_do_not_retrace():
    traces = []

    def f(x, y):
        traces.append(1)
        return jnp.tanh(x) * y

    g = precision.apply(f)
    a = Tensor(np.ones(4, np.float32)).to_reduced_precision()
    for v in (1.0, 2.0, 3.0):
        g(a, Tensor(np.full(4, v, np.float32)).to_reduced_precision())
    assert len(traces) == 1
    g(a.to_reduced_precision("float16"), a.to_reduced_precision("float16"))
    assert len(traces) == 2


# -- operators and methods, eager and jit ---------------------------------------------
X = np.array([[0.5, -1.25, 3.0], [2.0, 0.0, -0.75]], np.float32)

OPS = {
    "neg": (lambda t: -t, lambda x: -x),
    "abs": (abs, np.abs),
    "pow": (lambda t: t**2, lambda x: x**2),
    "rpow": (lambda t: 2.0**t, lambda x: 2.0**x),
    "radd": (lambda t: 1.5 + t, lambda x: 1.5 + x),
    "rsub": (lambda t: 1.5 - t, lambda x: 1.5 - x),
    "rmul": (lambda t: 3.0 * t, lambda x: 3.0 * x),
    "rdiv": (lambda t: 1.0 / (t + 2.0), lambda x: 1.0 / (x + 2.0)),
    "getitem": (lambda t: t[1, 1:], lambda x: x[1, 1:]),
    "getitem_ellipsis": (lambda t: t[..., None, 0], lambda x: x[..., None, 0]),
    "reshape": (lambda t: t.reshape(3, 2), lambda x: x.reshape(3, 2)),
    "reshape_tuple": (lambda t: t.reshape((6,)), lambda x: x.reshape((6,))),
    "transpose": (lambda t: t.transpose(), lambda x: x.T),
    "T": (lambda t: t.T, lambda x: x.T),
    "sum": (lambda t: t.sum(), lambda x: x.sum()),
    "sum_axis": (lambda t: t.sum(axis=0), lambda x: x.sum(axis=0)),
    "mean": (lambda t: t.mean(axis=1), lambda x: x.mean(axis=1)),
    "max": (lambda t: t.max(), lambda x: x.max()),
    "min": (lambda t: t.min(axis=0), lambda x: x.min(axis=0)),
    "matmul": (lambda t: t @ t.T, lambda x: x @ x.T),
    "tanh": (pnp.tanh, np.tanh),
}


@pytest.mark.parametrize("op", list(OPS))
def test_operator(op, eager_and_jit):
    fn, ref = OPS[op]
    t = Tensor(X).to_reduced_precision("bfloat16")
    out = eager_and_jit(fn)(t)
    assert isinstance(out, Tensor)
    assert out.format == dtypes.bfloat16
    expected = reference_round(ref(np.asarray(t).astype(np.float64)).astype(np.float32), "bfloat16")
    np.testing.assert_array_equal(np.asarray(out), expected)


COMPARISONS = {
    "lt": (lambda a, b: a < b, np.less),
    "le": (lambda a, b: a <= b, np.less_equal),
    "gt": (lambda a, b: a > b, np.greater),
    "ge": (lambda a, b: a >= b, np.greater_equal),
    "eq": (lambda a, b: a == b, np.equal),
    "ne": (lambda a, b: a != b, np.not_equal),
}


@pytest.mark.parametrize("op", list(COMPARISONS))
def test_comparisons_return_plain_bool_arrays(op, eager_and_jit):
    fn, ref = COMPARISONS[op]
    a = Tensor(X).to_reduced_precision()
    b = Tensor(np.full_like(X, 0.5)).to_reduced_precision()
    out = eager_and_jit(fn)(a, b)
    assert isinstance(out, jax.Array)
    assert out.dtype == jnp.bool_
    np.testing.assert_array_equal(np.asarray(out), ref(np.asarray(a), np.asarray(b)))


def test_argmax_is_plain_int(eager_and_jit):
    t = Tensor(X).to_reduced_precision()
    out = eager_and_jit(lambda t: t.argmax(axis=1))(t)
    assert isinstance(out, jax.Array)
    assert jnp.issubdtype(out.dtype, jnp.integer)
    np.testing.assert_array_equal(np.asarray(out), X.argmax(axis=1))


def test_full_precision_tensors_give_full_precision_results():
    t = Tensor(X)
    out = t * t + 1.0
    assert out.format == dtypes.float32
    assert not out.is_reduced_precision
    np.testing.assert_array_equal(np.asarray(out), X * X + 1)


def test_raw_arrays_only_give_arrays():
    out = precision.apply(lambda a: a * 2)(jnp.asarray(X))
    assert isinstance(out, jax.Array)


# -- models through apply: every op rounded, bit for bit ------------------------------
# The expected values come from `op_reference.emulate`: the model's jaxpr run one
# primitive at a time in plain JAX on the decoded float32 values, each result of an
# op on a bfloat16 input rounded by ml_dtypes (docs/design.md §5). A model whose
# ops were not rounded stays within 1e-2 of float32 and passed the old tolerance
# checks; here it differs in most of its thousands of outputs. `_near_float32`
# checks the emulation itself: the rounded model is still the float32 model.
def _mlp(params, x):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b[None, :])
    w, b = params[-1]
    return jax.nn.log_softmax(x @ w + b[None, :])


def _init(key, sizes):
    params = []
    for i, (m, n) in enumerate(itertools.pairwise(sizes)):
        k = jax.random.fold_in(key, i)
        # biases that are not zero: `x @ w + 0` would be on the grid with or without a rounding
        b = jax.random.normal(jax.random.fold_in(k, 1), (n,)) * 0.1
        params.append((jax.random.normal(k, (m, n)) / np.sqrt(m), b))
    return params


def _bf16(tree):
    return jax.tree.map(lambda a: Tensor(a).to_reduced_precision("bfloat16"), tree)


def _near_float32(a, b, rtol):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    err = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)
    assert err < rtol, err


def _same_as_emulated(f, out, *args):
    """`out` (a Tensor or a tuple of them) equals `f` emulated under bfloat16, bit for bit."""
    want = emulate(f, "bfloat16")(*args)
    outs = out if isinstance(out, tuple) else (out,)
    wants = want if isinstance(want, tuple) else (want,)
    for i, (o, w) in enumerate(zip(outs, wants, strict=True)):
        assert o.format == dtypes.bfloat16
        assert np.asarray(w).size >= 1000  # thousands of values, not a handful
        assert_same_bits(np.asarray(o), w, f"output {i}")


def test_mlp_rounds_every_op(eager_and_jit):
    key = jax.random.key(0)
    params = _init(key, [16, 32, 32, 10])
    x = jax.random.normal(jax.random.key(1), (256, 16))
    out = eager_and_jit(precision.apply(_mlp))(_bf16(params), _bf16(x))
    _same_as_emulated(_mlp, out, _bf16(params), _bf16(x))
    _near_float32(out, _mlp(params, x), 2e-2)


def _cnn(params, x):
    w1, w2, wd = params
    dn = ("NHWC", "HWIO", "NHWC")
    x = jax.nn.relu(lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dn))
    x = jax.nn.relu(lax.conv_general_dilated(x, w2, (1, 1), "SAME", dimension_numbers=dn))
    x = lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    return x.reshape(x.shape[0], -1) @ wd


def test_cnn_rounds_every_op(eager_and_jit):
    ks = jax.random.split(jax.random.key(2), 4)
    params = (
        jax.random.normal(ks[0], (3, 3, 1, 4)) / 3,
        jax.random.normal(ks[1], (3, 3, 4, 4)) / 6,
        jax.random.normal(ks[2], (4 * 4 * 4, 10)) / 8,
    )
    x = jax.random.normal(ks[3], (128, 8, 8, 1))
    out = eager_and_jit(precision.apply(_cnn))(_bf16(params), _bf16(x))
    _same_as_emulated(_cnn, out, _bf16(params), _bf16(x))
    _near_float32(out, _cnn(params, x), 2e-2)


def _layer_norm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-5) * g[None, :] + b[None, :]


def test_layer_norm_and_softmax_round_every_op(eager_and_jit):
    x = jax.random.normal(jax.random.key(3), (64, 64)) * 3 + 1
    g, b = jnp.ones(64) * 1.5, jnp.full(64, 0.25)
    out = eager_and_jit(precision.apply(_layer_norm))(*_bf16((x, g, b)))
    _same_as_emulated(_layer_norm, out, *_bf16((x, g, b)))
    _near_float32(out, _layer_norm(x, g, b), 1e-2)
    sm = eager_and_jit(precision.apply(jax.nn.softmax))(_bf16(x))
    _same_as_emulated(jax.nn.softmax, sm, _bf16(x))
    _near_float32(sm, jax.nn.softmax(x), 1e-2)


def _rnn(w, u, xs):
    def step(h, x):
        h = jnp.tanh(h @ w + x @ u)  # (batch, 16)
        return h, h.sum(-1)

    h, ys = lax.scan(step, jnp.zeros((xs.shape[1], w.shape[0])), xs)
    return h, ys


def test_scan_rnn_rounds_every_op(eager_and_jit):
    ks = jax.random.split(jax.random.key(4), 3)
    w = jax.random.normal(ks[0], (16, 16)) / 4
    u = jax.random.normal(ks[1], (8, 16)) / 3
    xs = jax.random.normal(ks[2], (12, 128, 8))
    h, ys = eager_and_jit(precision.apply(_rnn))(*_bf16((w, u, xs)))
    _same_as_emulated(_rnn, (h, ys), *_bf16((w, u, xs)))
    h32, ys32 = _rnn(w, u, xs)
    _near_float32(h, h32, 3e-2)
    _near_float32(ys, ys32, 3e-2)


def test_scan_carry_stays_on_format_grid():
    w = Tensor(np.eye(3, dtype=np.float32) * 0.3).to_reduced_precision("float8_e4m3fn")

    def f(w):
        def step(h, _):
            h = jnp.tanh(h @ w + 1.0)
            return h, h

        return lax.scan(step, jnp.zeros(3), None, length=4)[1]

    ys = precision.apply(f)(w)
    assert ys.format == dtypes.float8_e4m3fn
    v = np.asarray(ys)
    np.testing.assert_array_equal(v, reference_round(v, "float8_e4m3fn"))


def test_cond_and_while_keep_format():
    t = Tensor(X).to_reduced_precision("float16")

    def f(x):
        y = lax.cond(x.sum() > 0, lambda a: a * 3.0, lambda a: a - 1.0, x)
        _n, z = lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 1.1), (0, y))
        return z

    out = precision.apply(f)(t)
    assert out.format == dtypes.float16
    assert X.sum() > 0  # the cond takes its first branch
    ref = reference_round(np.asarray(t) * 3.0, "float16")
    for _ in range(3):
        ref = reference_round(ref * np.float32(np.float16(1.1)), "float16")
    np.testing.assert_array_equal(np.asarray(out), ref)


def test_precision_numpy_wraps_jax_numpy():
    t = Tensor(X).to_reduced_precision()
    out = pnp.concatenate([t, t], axis=0)
    assert out.shape == (4, 3)
    assert out.format == dtypes.bfloat16
    assert pnp.pi == np.pi
    with pytest.raises(AttributeError, match="no_such_function"):
        pnp.no_such_function


def test_flax_and_equinox_models_run_unchanged():
    nn = pytest.importorskip("flax.linen")
    eqx = pytest.importorskip("equinox")

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(3)(nn.LayerNorm()(nn.relu(nn.Dense(16)(x))))

    x = jax.random.normal(jax.random.key(5), (512, 8))
    net = Net()
    params = net.init(jax.random.key(0), x)
    out = precision.apply(net.apply)(_bf16(params), _bf16(x))
    _same_as_emulated(net.apply, out, _bf16(params), _bf16(x))
    _near_float32(out, net.apply(params, x), 2e-2)

    model = eqx.nn.MLP(8, 3, 16, 2, key=jax.random.key(1))
    converted = jax.tree.map(
        lambda a: Tensor(a).to_reduced_precision() if eqx.is_array(a) else a, model
    )
    batched = lambda m, x: jax.vmap(m)(x)
    out = precision.apply(batched)(converted, _bf16(x))
    _same_as_emulated(batched, out, converted, _bf16(x))
    _near_float32(out, jax.vmap(model)(x), 2e-2)


def test_equinox_attention_with_its_dropout_runs_inside_apply():
    # Dropout(p=0.0) is a float field: Equinox's filters keep it static, and so does apply
    # (traced, Dropout asked for a key)
    eqx = pytest.importorskip("equinox")
    attn = eqx.nn.MultiheadAttention(2, 8, dropout_p=0.0, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (5, 8))
    stored = precision.to_reduced_precision(attn, "int8")
    out = precision.apply(lambda m, q: m(q, q, q))(stored, x)
    decoded = jax.tree.map(
        lambda leaf: jnp.asarray(np.asarray(leaf)) if isinstance(leaf, Tensor) else leaf,
        stored,
        is_leaf=lambda leaf: isinstance(leaf, Tensor),
    )
    reference = decoded(x, x, x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(reference), rtol=1e-5, atol=1e-6)
    assert precision.apply(lambda d, v: d(v, key=None))(eqx.nn.Dropout(0.0), x).shape == x.shape


def test_floats_passed_as_arguments_stay_traced_and_nested_ones_are_static():
    traces = []

    def f(a, s, opts):
        traces.append(1)
        return a * s * opts["k"]

    g = precision.apply(f)
    t = Tensor(np.ones(3, np.float32)).to_reduced_precision("bfloat16")
    for s in (2.0, 3.0, 4.0):  # a new argument value: no new trace
        g(t, s, {"k": 1.0})
    assert len(traces) == 1
    out = g(t, 2.0, {"k": 5.0})  # a nested float is static: traced again, used as Python
    assert len(traces) == 2
    assert out.numpy().tolist() == [10.0, 10.0, 10.0]


@pytest.mark.parametrize("loop", ["scan", "fori_loop", "unrolled"])
def test_a_float32_carry_adopts_the_declared_compute_format(loop, eager_and_jit):
    """Under `compute="bfloat16"`, a float32 argument carried through a loop of bfloat16
    layers is rounded into bfloat16 before the loop, as the first op would round it
    unrolled; it was refused as a mix of formats. Reference: plain JAX rounding every
    result with `reduce_precision`."""
    ks = jax.random.split(jax.random.key(7), 2)
    x = jax.random.normal(ks[0], (4, 16))
    ws = jax.random.normal(ks[1], (3, 16, 16)) / 4

    def layer(h, w):
        return jnp.tanh(h @ w)

    def f(x, ws):
        if loop == "scan":
            return lax.scan(lambda h, w: (layer(h, w), None), x, ws)[0]
        if loop == "fori_loop":
            return lax.fori_loop(0, 3, lambda i, h: layer(h, ws[i]), x)
        for i in range(3):
            x = layer(x, ws[i])
        return x

    got = eager_and_jit(precision.apply(f, compute="bfloat16"))(x, ws)

    def r(v):
        return lax.reduce_precision(v, exponent_bits=8, mantissa_bits=7)

    h = r(x)
    for i in range(3):
        h = r(jnp.tanh(r(jnp.dot(h, r(ws[i]), precision=lax.Precision.HIGHEST))))
    np.testing.assert_array_equal(np.asarray(precision.to_full_precision(got)), np.asarray(h))


def test_a_cond_branch_of_float32_adopts_the_declared_compute_format():
    x = jax.random.normal(jax.random.key(8), (8,))

    def f(x, flag):
        return lax.cond(flag, lambda: x, lambda: jnp.sin(x))

    out = precision.apply(f, compute="bfloat16")(x, True)
    v = np.asarray(precision.to_full_precision(out))
    np.testing.assert_array_equal(v, np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float32))


def test_the_evaluator_is_one_call_in_every_jaxpr_and_lowered_into_its_caller_where_jax_can():
    """An applied function's evaluation stays one compiled call wherever a jaxpr is
    evaluated eagerly (an eager `grad`, `checkpoint`), not op by op; where this JAX
    lowers a call into its caller while keeping it in the jaxpr
    (`compat.INLINED_AT_LOWERING`), the caller's compiled program holds its operations
    (XLA:CPU then schedules them as it would the caller's own)."""
    applied = precision.apply(lambda x, w: jnp.tanh(x @ w), contract="int8")
    x, w = jnp.linspace(-1.0, 1.0, 32).reshape(4, 8), jnp.ones((8, 2))

    def calls(jaxpr):
        return [e for e in jaxpr.eqns if e.primitive in compat.CALLS]

    _, linear = jax.linearize(lambda x: applied(x, w).sum(), x)
    assert len(calls(jax.make_jaxpr(linear)(x))) == 1
    (remat,) = jax.make_jaxpr(jax.checkpoint(applied))(x, w).eqns
    assert remat.primitive is compat.REMAT
    assert len(calls(remat.params["jaxpr"])) == 1
    module = jax.jit(applied).lower(x, w).as_text()
    main = module[module.index("func.func public @main") :].split("func.func private")[0]
    assert ("stablehlo.tanh" in main) == bool(compat.INLINED_AT_LOWERING), module
    # and the same numbers both ways
    np.testing.assert_array_equal(jax.jit(applied)(x, w), applied(x, w))
