"""The rule table: structural ops keep values, contractions, weak values, fast rounding."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from sampling import sample

import dtypes
import precision
from precision import Tensor
from precision._compute import _contractions
from precision._compute._rules import GRID_PRESERVING, MOVES
from precision._compute._state import State, join
from precision._storage import round_nearest

rng = np.random.default_rng(0)
X = rng.normal(size=(4, 6)).astype(np.float32) * 3

STRUCTURAL_OPS = {
    "reshape": lambda t: t.reshape(3, 8),
    "transpose": lambda t: t.T,
    "slice": lambda t: t[1:3, ::2],
    "index": lambda t: t[jnp.array([2, 0])],
    "concatenate": lambda t: jnp.concatenate([t, -t], axis=1),
    "broadcast": lambda t: jnp.broadcast_to(t[None], (2, 4, 6)),
    "flip": lambda t: jnp.flip(t, 0),
    "pad": lambda t: jnp.pad(t, 1),
    "max": lambda t: jnp.max(t, axis=0),
    "where": lambda t: jnp.where(t > 0, t, -t),
    "sort": lambda t: jnp.sort(t, axis=1),
}


@pytest.mark.parametrize("name", ["bfloat16", "float8_e5m2", "int8", "int4"])
@pytest.mark.parametrize("op", list(STRUCTURAL_OPS))
def test_structural_ops_move_values_exactly(op, name):
    fn = STRUCTURAL_OPS[op]
    t = Tensor(X).to_reduced_precision(name)
    if t.format.kind == "int":
        # values that any per-tensor scale holds exactly: codes times one scale
        # whose absmax survives every op below, so re-storing keeps them
        t = Tensor(np.round(X) * 0.25 + 0.0).to_reduced_precision(name)
        t = Tensor(np.asarray(t)).to_reduced_precision(name)
    out = precision.apply(fn)(t)
    # Values move exactly, in every role: storage is never re-quantized.
    expected = np.asarray(fn(jnp.asarray(np.asarray(t))))
    np.testing.assert_array_equal(np.asarray(out), expected)
    codes_move = op in {"reshape", "transpose", "slice", "broadcast", "flip"}
    if t.format.kind != "int":
        assert out.format == t.format  # a compute format: the grid is kept
    elif codes_move and not t.format.packed:
        assert out.format == t.format  # the codes moved, with their one scale
        assert out.nbytes == out.size + 4
    else:
        assert out.format == dtypes.float32  # decoded exactly, not re-encoded


def test_rule_sets_are_disjoint():
    assert not MOVES & GRID_PRESERVING


def test_join():
    bf = State(dtypes.bfloat16, True)
    raw = State(dtypes.float32, False)
    assert join("add", None, bf) == bf
    assert join("add", bf, None) == bf
    assert join("add", raw, State(dtypes.float32, True)).tensor
    with pytest.raises(precision.PrecisionMismatchError):
        join("add", bf, raw)


def test_weak_values_adopt_the_compute_format():
    t = Tensor([1.0]).to_reduced_precision("bfloat16")
    out = precision.apply(lambda a: a * 0 + 0.1)(t)
    assert float(np.asarray(out)[0]) == float(np.float32(ml_dtypes.bfloat16(0.1)))


def test_tf32_contraction_is_emulated_exactly():
    a = Tensor(X).to_reduced_precision("tf32")
    b = Tensor(X.T).to_reduced_precision("tf32")
    out = a @ b
    assert out.format == dtypes.tf32
    da, db = np.asarray(a, np.float64), np.asarray(b, np.float64)
    exact = da @ db
    got = np.asarray(out, np.float64)
    # float32 accumulation of exact tf32 products, then one tf32 rounding
    bound = 6 * np.finfo(np.float32).eps * (np.abs(da) @ np.abs(db)) + np.abs(exact) * 2.0**-11
    assert np.all(np.abs(got - exact) <= bound)
    assert np.all(np.asarray(out).view(np.uint32) & 0x1FFF == 0)


def test_conv_output_is_rounded_to_format():
    x = Tensor(rng.normal(size=(1, 6, 6, 2)).astype(np.float32)).to_reduced_precision("float16")
    w = Tensor(rng.normal(size=(3, 3, 2, 3)).astype(np.float32)).to_reduced_precision("float16")

    def conv(x, w):
        return lax.conv_general_dilated(
            x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    out = precision.apply(conv)(x, w)
    assert out.format == dtypes.float16
    ref = np.asarray(conv(precision.to_full_precision(x), precision.to_full_precision(w)))
    np.testing.assert_array_equal(np.asarray(out), ref.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("mantissa", [7, 10, 3])
def test_fast_rounding_matches_reference_bits(mantissa):
    fmt = dtypes.FloatFormat(8, mantissa)
    bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    small = rng.integers(0, 2**24, size=50_000, dtype=np.uint64).astype(np.uint32)  # subnormals
    top = np.array([0x7F7FFFFF, 0xFF7FFFFF, 0x7F7FF000, 0x7F7FEFFF, 0x7F800000], np.uint32)
    x = np.concatenate([bits, small, small | 0x80000000, top]).view(np.float32)
    got = np.asarray(jax.jit(lambda v: round_nearest(fmt, v))(x))
    # reference: round-half-even on the float32 bit pattern, in numpy integers
    drop = 23 - mantissa
    b = x.view(np.uint32).astype(np.uint64)
    half = (1 << (drop - 1)) - 1
    ref = ((b + half + ((b >> drop) & 1)) >> drop << drop).astype(np.uint32).view(np.float32)
    ref = np.where(np.isnan(x), x, ref)
    same = (got.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(got) & np.isnan(ref))
    assert same.all(), x[~same][:5]
    if mantissa == 7:
        np.testing.assert_array_equal(
            got[~np.isnan(x)], x[~np.isnan(x)].astype(ml_dtypes.bfloat16).astype(np.float32)
        )


def test_fast_rounding_gradient_is_straight_through():
    g = jax.grad(lambda v: jnp.sum(round_nearest(dtypes.bfloat16, v) * 3.0))(
        jnp.array([0.1, 1e38, 3.4e38, -5.0])
    )
    # 3.4e38 rounds past bfloat16's max: clipped, no gradient
    np.testing.assert_array_equal(np.asarray(g), [3.0, 3.0, 0.0, 3.0])


def test_weak_branch_of_cond_adopts_format():
    t = Tensor(X).to_reduced_precision("float16")

    def f(x, flag):
        return lax.cond(flag, lambda: x[0], lambda: jnp.full(6, 0.1))

    out = precision.apply(f)(t, jnp.array(False))
    assert out.format == dtypes.float16
    np.testing.assert_array_equal(np.asarray(out), np.full(6, np.float16(0.1), np.float32))


def test_while_carry_starting_weak_adopts_format():
    t = Tensor(X[0]).to_reduced_precision("float8_e4m3fn")

    def f(x):
        return lax.fori_loop(0, 3, lambda i, c: c + x * 0.5, jnp.zeros(6))

    out = precision.apply(f)(t)
    assert out.format == dtypes.float8_e4m3fn
    ref = np.zeros(6, np.float32)
    half = np.asarray(t) * np.float32(0.5)
    step = half.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    for _ in range(3):
        ref = (ref + step).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(out), ref)


def test_nested_jit_and_checkpoint_are_interpreted():
    t = Tensor(X).to_reduced_precision("float16")
    inner = jax.jit(lambda a: jnp.exp(a / 8.0))
    out = precision.apply(lambda a: jax.checkpoint(inner)(a) * 3.0)(t)
    assert out.format == dtypes.float16
    step1 = (np.asarray(t) / np.float32(8.0)).astype(np.float16).astype(np.float32)
    step2 = np.asarray(jnp.exp(step1)).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(
        np.asarray(out), (step2 * 3).astype(np.float16).astype(np.float32)
    )


def test_static_and_keyword_arguments():
    t = Tensor(X).to_reduced_precision()
    f = precision.apply(lambda x, axis, keepdims=False: jnp.sum(x, axis=axis, keepdims=keepdims))
    assert f(t, 1).shape == (4,)
    assert f(t, 0, keepdims=True).shape == (1, 6)
    with pytest.raises(TypeError, match="hashable"):
        precision.apply(lambda x, d: x)(t, bytearray(b"options"))


@pytest.mark.parametrize(
    ("name", "scaling_a", "scaling_b"),
    [
        ("int8", dtypes.PerTensor(), dtypes.PerTensor()),
        ("int8", dtypes.PerAxis(0), dtypes.PerAxis(1)),
        ("int4", dtypes.PerTensor(), dtypes.PerAxis(1)),
        ("int2", dtypes.PerAxis(0), dtypes.PerTensor()),
    ],
)
def test_integer_matmul_accumulates_codes_exactly(name, scaling_a, scaling_b):
    a = Tensor(rng.normal(size=(6, 40)).astype(np.float32)).to_reduced_precision(
        name, scaling=scaling_a
    )
    b = Tensor(rng.normal(size=(40, 5)).astype(np.float32)).to_reduced_precision(
        name, scaling=scaling_b
    )
    f = precision.apply(jnp.matmul)
    assert "preferred_element_type=int32" in str(jax.make_jaxpr(f)(a, b))
    out = f(a, b)
    assert out.format == dtypes.float32  # storage in, float32 out: never re-quantized
    # reference: codes recovered in numpy, summed exactly in int64, rescaled
    fmt = dtypes.get(name)
    sa = np.broadcast_to(np.asarray(a.encoded.scale), a.shape)
    sb = np.broadcast_to(np.asarray(b.encoded.scale), b.shape)
    ca = np.rint(np.asarray(a) / sa).astype(np.int64)
    cb = np.rint(np.asarray(b) / sb).astype(np.int64)
    assert np.abs(ca).max() <= fmt.qmax
    expected = (ca @ cb).astype(np.float32) * sa[:, :1] * sb[:1, :]
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6, atol=0)


def test_integer_matmul_with_contracted_axis_scales_falls_back_to_float():
    a = Tensor(rng.normal(size=(3, 8)).astype(np.float32)).to_reduced_precision(
        "int8", scaling=dtypes.PerAxis(1)
    )
    b = Tensor(rng.normal(size=(8, 2)).astype(np.float32)).to_reduced_precision("int8")
    f = precision.apply(jnp.matmul)
    assert "preferred_element_type=int32" not in str(jax.make_jaxpr(f)(a, b))  # no int dot
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    quantum = np.abs(exact).max() / 127
    assert np.abs(np.asarray(f(a, b)) - exact).max() <= quantum / 2 * 1.0001


def test_scan_over_stacked_storage_decodes_one_row_per_step():
    xs = Tensor(rng.normal(size=(5, 4)).astype(np.float32)).to_reduced_precision(
        "int8", scaling=dtypes.PerAxis(0)
    )

    def f(xs):
        return lax.scan(lambda c, x: (c + x, c), jnp.zeros(4), xs)[0]

    out = precision.apply(f)(xs)
    assert out.format == dtypes.float32  # a computed value: not re-quantized
    rows = np.asarray(xs)
    ref = np.zeros(4, np.float32)
    for row in rows:  # float32 sums of the decoded rows, in order
        ref = ref + row
    bound = 5 * np.finfo(np.float32).eps * np.abs(rows).sum(0)  # decode + add may fuse
    assert np.all(np.abs(np.asarray(out) - ref) <= bound)
    # the loop carries the int8 codes, and no float32 copy of the stack exists
    hlo = jax.jit(precision.apply(f)).lower(xs).compile().as_text()
    assert "s8[5,4]" in hlo
    assert "f32[5,4]" not in hlo


def test_int8_moves_keep_codes_and_scale():
    t = Tensor(X).to_reduced_precision("int8")
    for moved in (t[1:3, ::2], t.T, t.reshape(24), -t[0], precision.apply(lambda a: a)(t)):
        assert moved.format == dtypes.int8
        np.testing.assert_array_equal(
            np.asarray(moved.encoded.scale).reshape(()), np.asarray(t.encoded.scale).reshape(())
        )
    np.testing.assert_array_equal(np.asarray(t[1:3, ::2]), np.asarray(t)[1:3, ::2])
    # the int32 path also takes moved operands
    assert "preferred_element_type=int32" in str(
        jax.make_jaxpr(precision.apply(lambda a: a @ a.T))(t)
    )


LAYER_CUTS = ("layer", "last layer (traced index)", "every other layer", "rows of a layer")
STACKS = [  # (format, scaling, the cuts that split its scale groups: decoded values move)
    ("int4", None, ()),
    ("int4", dtypes.PerAxis(-1), ()),
    ("int4", dtypes.PerBlock(4, axis=1), ("rows of a layer", "a row of each layer")),
    ("int2", dtypes.PerAxis(0), ()),
    ("uint4", dtypes.PerAxis(1), ()),
    ("nvfp4", None, ()),
    ("mxfp4", None, ()),
    ("nf4", None, ()),
    ("int8", dtypes.PerBlock(2, axis=0), LAYER_CUTS),
    ("float8_e4m3fn", dtypes.PerAxis(2), ()),
]
CUTS = {
    "layer": lambda w: w[1],
    "last layer (traced index)": lambda w: lax.dynamic_index_in_dim(w, jnp.int32(-1), 0, False),
    "every other layer": lambda w: w[::2],
    "a row of each layer": lambda w: w[:, 3],
    "rows of a layer": lambda w: w[2, 1:6],
    "columns": lambda w: w[..., 1:5],
}


# `apply` runs each call inside its own `jax.jit` (one per static signature), so an
# outer `jax.jit` compiles the same interpreter's program again, over traced Tensor
# leaves. Every stack runs eagerly; in CI the stacks whose cuts split scale groups and
# the first (a plain per-tensor int4) also run under an outer jit; all under hunt.
_OUTER_JIT = sample(STACKS, lambda stack: stack[2] != () or stack is STACKS[0])


@pytest.mark.parametrize(("name", "scaling", "splitting"), STACKS)
def test_slices_of_stacked_storage_keep_their_codes(name, scaling, splitting):
    """A slice that splits no scaling group (nor the packed last axis) is storage."""
    w = rng.standard_normal((4, 8, 6)).astype(np.float32)
    t = Tensor(w).to_reduced_precision(name, **({} if scaling is None else {"scaling": scaling}))
    whole = np.asarray(t)  # decoded once, then cut by numpy
    shape = t.encoded.scaling.scale_shape(t.shape)
    outer_jit = (name, scaling, splitting) in _OUTER_JIT
    for what, cut in CUTS.items():
        runs = [precision.apply(cut)]
        if outer_jit:
            runs.append(jax.jit(precision.apply(cut)))
        for f in runs:
            out = f(t)
            np.testing.assert_array_equal(np.asarray(out), cut(whole), err_msg=what)
            # a block axis cut part-way (its groups would split), or the packed last axis cut
            if what in splitting or (t.format.packed and what == "columns"):
                assert out.format == dtypes.float32, what  # decoded values moved
                continue
            assert out.format == t.format, what  # the codes moved, not decoded values
            data = np.asarray(out.encoded.data).nbytes
            assert data <= np.asarray(t.encoded.data).nbytes * np.prod(out.shape) / np.prod(
                t.shape
            ) + np.prod(out.shape[:-1]), what  # only the cut's codes are held
            if shape != (1, 1, 1):
                assert np.asarray(out.encoded.scale).size <= np.asarray(t.encoded.scale).size


def test_indexing_a_stacked_int4_stack_decodes_one_layer_at_a_time():
    layers, d = 8, 512
    w = Tensor((rng.standard_normal((layers, d, d)) / 16).astype(np.float32))
    t = w.to_reduced_precision("int4")

    def mlp(w, x):
        for i in range(layers):
            x = jnp.tanh(x @ w[i])
        return x

    x = jnp.ones((4, d))
    compiled = jax.jit(precision.apply(mlp)).lower(t, x).compile()
    layer = d * d * 4
    # every layer decoded up front would be 8 layers of float32 temporaries
    assert compiled.memory_analysis().temp_size_in_bytes <= 3 * layer
    ref = mlp(jnp.asarray(np.asarray(t)), x)
    np.testing.assert_array_equal(np.asarray(compiled(t, x)), np.asarray(ref))


NARROW_FLOATS = ["bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"]


@pytest.fixture(params=["float32-dot", "native-dot"])
def dot_path(request, monkeypatch):
    """Run a test on both CPU contraction paths, whatever this processor has."""
    if request.param == "float32-dot" and jax.default_backend() != "cpu":
        pytest.skip("the float32 dot is a CPU choice: other backends always take the native one")
    native = frozenset() if request.param == "float32-dot" else frozenset(NARROW_FLOATS)
    monkeypatch.setattr(_contractions, "_cpu_native_formats", lambda: native)
    return request.param


@pytest.mark.parametrize("name", NARROW_FLOATS)
def test_both_contraction_paths_compile_their_dot_and_agree(name, dot_path):
    a = rng.standard_normal((16, 64)).astype(np.float32)
    b = rng.standard_normal((64, 8)).astype(np.float32)
    ta, tb = Tensor(a).to_reduced_precision(name), Tensor(b).to_reduced_precision(name)
    matmul = jax.jit(precision.apply(jnp.matmul))  # a fresh wrapper: a fresh cache
    dots = [line for line in matmul.lower(ta, tb).as_text().splitlines() if "dot_general" in line]
    mlir = {"bfloat16": "bf16", "float16": "f16"}
    mlir |= {"float8_e4m3fn": "f8E4M3FN", "float8_e5m2": "f8E5M2"}
    operand = mlir[name] if dot_path == "native-dot" else "f32"
    assert len(dots) == 1
    assert f"tensor<16x64x{operand}>" in dots[0]
    assert dots[0].endswith("-> tensor<16x8xf32>")
    # exact products, float32 accumulation, one rounding into the format
    da, db = np.asarray(ta, np.float64), np.asarray(tb, np.float64)
    exact = da @ db
    got = np.asarray(matmul(ta, tb), np.float64)
    fmt = dtypes.get(name)
    acc = 64 * np.finfo(np.float32).eps * (np.abs(da) @ np.abs(db))
    bound = acc + np.abs(exact) * fmt.eps / 2 + fmt.smallest_subnormal
    assert (np.abs(got - exact) <= bound).all()
    rounded = np.asarray(Tensor(exact.astype(np.float32)).to_reduced_precision(name), np.float64)
    assert np.mean(got == rounded) >= 0.95


def _grads_on_both_dot_paths(monkeypatch, loss_of, a, b):
    """Gradients of `loss_of(matmul)` through apply's float32 dot and through the native one."""

    def grads(native):
        monkeypatch.setattr(_contractions, "_cpu_native_formats", lambda: native)
        return jax.grad(loss_of, argnums=(0, 1))(a, b)

    return grads(frozenset()), grads(frozenset(NARROW_FLOATS))


@pytest.mark.parametrize("name", NARROW_FLOATS)
def test_both_contraction_paths_give_the_same_gradients(name, monkeypatch):
    a = rng.standard_normal((8, 32)).astype(np.float32)
    b = rng.standard_normal((32, 4)).astype(np.float32)

    def loss(a, b):
        ta, tb = Tensor(a).to_reduced_precision(name), Tensor(b).to_reduced_precision(name)
        return jnp.sum(jnp.asarray(precision.apply(jnp.matmul)(ta, tb).to_full_precision()) ** 2)

    slow, fast = _grads_on_both_dot_paths(monkeypatch, loss, a, b)
    for s, f in zip(slow, fast, strict=True):
        # both round the input cotangents into the container; only the order of
        # the float32 sums may differ, by at most one step of the format
        np.testing.assert_allclose(np.asarray(f), np.asarray(s), rtol=dtypes.get(name).eps)


def _reductions(compiled) -> int:
    return len(re.findall(r" reduce\(", compiled.as_text()))


@pytest.mark.parametrize(
    ("name", "scaling"),
    [
        ("int8", None),
        ("int4", dtypes.PerBlock(8)),
        ("int1", None),
        ("float8_e4m3fn", dtypes.PerAxis(0)),
        (dtypes.FloatFormat(2, 1, finite=True), dtypes.PerBlock(8, power_of_two=True)),
    ],
    ids=str,
)
def test_a_storage_result_is_never_re_quantized(name, scaling):
    """Storage in, float32 out: the compiled op holds no absmax or mean reduction
    (no fresh scale), and its values are the float32 sum of the decoded inputs."""
    fmt = dtypes.get(name)
    gen = np.random.default_rng(3)
    ta = Tensor(gen.standard_normal((4, 16)).astype(np.float32)).to_reduced_precision(
        fmt, scaling=scaling
    )
    tb = Tensor(gen.standard_normal((4, 16)).astype(np.float32)).to_reduced_precision(
        fmt, scaling=scaling
    )
    add = jax.jit(precision.apply(lambda x, y: x + y)).lower(ta, tb).compile()
    assert _reductions(add) == 0
    out = add(ta, tb)  # the program just read, not a second compile of it
    assert out.format == dtypes.float32
    da, db = np.asarray(ta), np.asarray(tb)
    assert np.all(
        np.abs(np.asarray(out) - (da + db)) <= np.finfo(np.float32).eps * (abs(da) + abs(db))
    )


@pytest.mark.parametrize(("setting", "expected"), [("", set()), ("0", set()), ("1", {"bfloat16"})])
def test_native_cpu_dots_are_opt_in(monkeypatch, setting, expected):
    monkeypatch.setenv("PRECISION_CPU_BF16_DOTS", setting)
    assert _contractions._cpu_native_formats.__wrapped__() == expected


def _compiled(fn, *args):
    """`fn` compiled for `args`: the tests below read its temporaries' size, then run this
    same program for their values (rather than compiling it a second time)."""
    return jax.jit(fn).lower(*args).compile()


def _temp_bytes(compiled) -> int:
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("layout", ["unrolled", "scan"])
def test_weight_only_layers_are_decoded_one_at_a_time(layout):
    # 8 int4 layers of 256 x 256: one decoded layer is 256 KiB, all eight 2 MiB.
    depth, width = 8, 256
    gen = np.random.default_rng(5)
    stack = gen.normal(size=(depth, width, width)).astype(np.float32) / 16
    x = jnp.ones((4, width))
    block = dtypes.PerBlock(32)
    if layout == "scan":
        weights = Tensor(stack).to_reduced_precision("int4", scaling=block)

        def mlp(w, x):
            return lax.scan(lambda h, wi: (jnp.tanh(h @ wi), None), x, w)[0]
    else:
        weights = [Tensor(w).to_reduced_precision("int4", scaling=block) for w in stack]

        def mlp(ws, x):
            for w in ws:
                x = jnp.tanh(x @ w)
            return x

    layer = width * width * 4
    compiled = _compiled(precision.apply(mlp), weights, x)
    assert _temp_bytes(compiled) <= 2 * layer + 64 * 1024
    # and the values are those of plain JAX on the decoded weights
    decoded = jax.tree_util.tree_map(np.asarray, weights, is_leaf=lambda t: isinstance(t, Tensor))
    ref = np.asarray(mlp(decoded, x))
    np.testing.assert_allclose(np.asarray(compiled(weights, x)), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("weights", ["float32", "bfloat16", "int8"])
def test_weights_meet_the_compute_format_one_layer_at_a_time(weights):
    # Under compute="bfloat16" a float32 weight is rounded, a bfloat16 Tensor widened and
    # int8 storage decoded next to its matmul: 8 unrolled layers of 256 x 256 keep at
    # most two float32 layers (256 KiB each) of temporaries, not all eight (2 MiB).
    depth, width = 8, 256
    gen = np.random.default_rng(6)
    stack = gen.normal(size=(depth, width, width)).astype(np.float32) / 16
    x = jnp.asarray(gen.normal(size=(4, width)).astype(np.float32))
    if weights == "float32":
        ws = [jnp.asarray(w) for w in stack]
    elif weights == "bfloat16":
        ws = [Tensor(w).to_reduced_precision("bfloat16") for w in stack]
    else:
        ws = [Tensor(w).to_reduced_precision("int8", scaling=dtypes.PerAxis(-1)) for w in stack]

    def mlp(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return x

    run = _compiled(precision.apply(mlp, compute="bfloat16"), ws, x)
    assert _temp_bytes(run) <= 2 * width * width * 4 + 64 * 1024
    # float64 layers on the weights as stored, bfloat16-rounded operands: within a few
    # bfloat16 steps of what the compute format gives
    h = np.asarray(x, np.float64)
    for w in ws:
        stored = np.asarray(w, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
        h = np.tanh(h.astype(ml_dtypes.bfloat16).astype(np.float64) @ stored)
    np.testing.assert_allclose(np.asarray(run(ws, x), np.float64), h, rtol=0, atol=2**-5)


@pytest.mark.parametrize("name", NARROW_FLOATS)
def test_float32_weights_rounded_at_use_give_the_same_gradients_on_both_paths(name, monkeypatch):
    # float32 operands under a declared compute format are rounded inside the contraction's
    # conditional, their derivative outside it: both dot paths agree, and for bfloat16 with
    # plain JAX rounding the same values by lax.reduce_precision, straight through (the
    # derivative of a rounding is 1 where the value did not overflow), and contracting
    # them in a bfloat16 dot, whose derivative takes the cotangent in bfloat16 and
    # writes the gradients in bfloat16 (run op by op: each bfloat16 array is held)
    a = rng.standard_normal((8, 32)).astype(np.float32)
    b = rng.standard_normal((32, 4)).astype(np.float32)

    def loss(a, b):
        return jnp.sum(
            precision.to_full_precision(precision.apply(jnp.matmul, compute=name)(a, b)) ** 2
        )

    slow, fast = _grads_on_both_dot_paths(monkeypatch, loss, a, b)
    for s, f in zip(slow, fast, strict=True):
        np.testing.assert_allclose(np.asarray(f), np.asarray(s), rtol=dtypes.get(name).eps)
    if name == "bfloat16":

        def plain(a, b):
            def r(v):
                return v + lax.stop_gradient(lax.reduce_precision(v, 8, 7) - v)

            bf16 = jnp.bfloat16
            out = jnp.matmul(r(a).astype(bf16), r(b).astype(bf16), preferred_element_type=bf16)
            return jnp.sum(r(out.astype(jnp.float32)) ** 2)

        for s, p in zip(slow, jax.grad(plain, (0, 1))(a, b), strict=True):
            np.testing.assert_allclose(np.asarray(s), np.asarray(p), rtol=1e-6)


def test_vmap_of_apply_places_each_weight_once_for_the_batch():
    # Under an outer vmap only the predicate of a weight's conditional is batched: the
    # weight is rounded once, not copied per batch element (16 x 4 layers x 256 KiB).
    gen = np.random.default_rng(8)
    ws = [jnp.asarray(gen.normal(size=(256, 256)).astype(np.float32) / 16) for _ in range(4)]
    x = jnp.asarray(gen.normal(size=(16, 8, 256)).astype(np.float32))

    def mlp(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return x

    run = precision.apply(mlp, compute="bfloat16")
    batched = _compiled(jax.vmap(run, in_axes=(None, 0)), ws, x)
    # (a copy per batch element would be 16 MiB; a GPU program keeps a little more)
    assert _temp_bytes(batched) <= 4 * 256 * 256 * 4 + 4 * x.size * 4
    looped = np.stack([np.asarray(run(ws, x[i])) for i in range(x.shape[0])])
    # the batched matmul sums in another order: at most one bfloat16 step apart
    np.testing.assert_allclose(np.asarray(batched(ws, x)), looped, rtol=0, atol=2**-7)


def _ordered_codes(x, dtype):
    """Values of `dtype` as integers in the order of the values (adjacent values differ
    by one; both zeros are 0)."""
    bits = np.asarray(x).astype(dtype)
    width = {1: np.uint8, 2: np.uint16}[bits.dtype.itemsize]
    i = bits.view(width).astype(np.int64)
    sign = 1 << (8 * bits.dtype.itemsize - 1)
    return np.where(i & sign, -(i & (sign - 1)), i)


# (compute format, its numpy dtype, the cotangent's scale): float16's 1e-6 and e5m2's
# 1e-4 put the cotangents and gradients among the format's subnormals
_NARROW = [
    ("bfloat16", ml_dtypes.bfloat16, 1.0),
    ("float16", np.float16, 1e-6),
    ("float8_e5m2", ml_dtypes.float8_e5m2, 1e-4),
    ("float8_e4m3fn", ml_dtypes.float8_e4m3fn, 1.0),
]


@pytest.mark.parametrize("where", ["cpu-program", "gpu-program"])
@pytest.mark.parametrize(("name", "dtype", "scale"), _NARROW, ids=[n for n, *_ in _NARROW])
def test_narrow_contraction_gradients_are_those_of_the_formats_dot(
    where, name, dtype, scale, monkeypatch
):
    """Under a narrow compute format a GPU's dot takes the cotangent in that format and
    writes the gradients in it; the float32 dot that stands for it on XLA:CPU rounds the
    same two values (exactly: float16's subnormals kept), so a training step has the
    same gradients on every platform. The reference is numpy's: the cotangent
    `scale * cos(a @ b)` rounded to the format (`scale` rounded first), contracted in
    float64, rounded once (within one step of it: float32 sums in another order may fall
    on the other side of a midpoint). `gpu-program` runs the GPU's branch here."""
    if where == "gpu-program":
        monkeypatch.setattr(_contractions, "_per_platform", lambda cpu, default: default())
    jax.clear_caches()

    def rnd(x):
        return np.asarray(x, np.float64).astype(dtype).astype(np.float64)

    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 64)).astype(np.float32)
    b = rng.standard_normal((64, 8)).astype(np.float32)
    f = precision.apply(lambda a, b: jnp.sum(jnp.sin(a @ b)) * scale, compute=name)
    da, db = (np.asarray(v, np.float64) for v in jax.jit(jax.grad(f, argnums=(0, 1)))(a, b))
    ar, br = rnd(a), rnd(b)
    out = rnd(ar @ br)
    g = rnd(np.cos(out) * rnd(scale))  # the constant is rounded into the format too
    want_a, want_b = rnd(g @ br.T), rnd(ar.T @ g)
    for got, want in ((da, want_a), (db, want_b)):
        assert np.array_equal(rnd(got), got)  # on the format's grid
        steps = np.abs(_ordered_codes(got, dtype) - _ordered_codes(want, dtype))
        assert steps.max() <= 1
        assert np.mean(steps == 0) > 0.98
    jax.clear_caches()
