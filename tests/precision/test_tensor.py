"""precision.Tensor: construction, properties, conversions, pytree, devices, errors."""

from __future__ import annotations

import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import dtypes
import precision
from precision import Tensor
from precision.testing._plugin import selected_formats

X = np.array([[0.1, -2.5, 3.14159], [1e-3, 65504.0, -7.0]], np.float32)

NATIVE = {
    "bfloat16": ml_dtypes.bfloat16,
    "float16": np.float16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
}


# -- construction ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "value",
    [
        [1.0, 2.0],
        np.array([1.0, 2.0], np.float64),
        jnp.array([1.0, 2.0]),
        (1, 2),
        np.array([1, 2], np.int32),
        np.array([True, False]),
    ],
    ids=["list", "numpy-f64", "jax", "tuple-int", "numpy-int", "bool"],
)
def test_numbers_become_float32_full_precision(value):
    t = Tensor(value)
    assert t.dtype == np.float32
    assert t.format == dtypes.float32
    assert not t.is_reduced_precision
    np.testing.assert_array_equal(np.asarray(t), np.asarray(value, np.float32))


def test_scalar_tensor():
    t = Tensor(2.5)
    assert t.shape == ()
    assert t.ndim == 0
    assert t.size == 1
    assert float(t) == 2.5


def test_narrow_float_input_is_kept_as_storage():
    t = Tensor(X.astype(ml_dtypes.bfloat16))
    assert t.dtype == np.float32
    assert t.format == dtypes.bfloat16
    assert t.is_reduced_precision
    np.testing.assert_array_equal(np.asarray(t), X.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_tensor_of_tracer_inside_jit():
    out = jax.jit(lambda x: Tensor(x).to_reduced_precision().encoded.data)(X)
    np.testing.assert_array_equal(np.asarray(out), X.astype(ml_dtypes.bfloat16))


BAD_INPUTS = [
    ("abc", TypeError, "dtype <U3.*pass a float, int or bool array"),
    (np.array(["a", "b"]), TypeError, "holds numbers"),
    (np.array([1 + 2j]), TypeError, r"complex values \(dtype complex128\).*jnp.real"),
    (1j, TypeError, "complex"),
    (np.array([object()]), TypeError, "dtype object"),
    ([[1.0], [2.0, 3.0]], TypeError, "cannot make a Tensor from list"),
]


@pytest.mark.parametrize(("value", "error", "message"), BAD_INPUTS)
def test_bad_inputs_raise_precise_errors(value, error, message):
    with pytest.raises(error, match=message):
        Tensor(value)


BAD_CALLS = [
    (lambda: Tensor(X, dtype="int32"), TypeError, "logical dtype must be float32 or float64"),
    (lambda: Tensor(X, dtype=jnp.bfloat16), TypeError, r"to_reduced_precision\('bfloat16'\)"),
    (lambda: Tensor(X, dtype="float64"), TypeError, "jax_enable_x64"),
    (
        lambda: Tensor(X).to_reduced_precision("bfloat17"),
        precision.FormatError,
        "bfloat17.*bfloat16",
    ),
    (lambda: Tensor(X).to_reduced_precision(3), precision.FormatError, "got int 3"),
    (
        lambda: Tensor(X).to_reduced_precision(rounding="stochastic"),
        ValueError,
        "needs a random key",
    ),
    (lambda: Tensor(X).to_reduced_precision(rounding="sideways"), ValueError, "'sideways'"),
    (
        lambda: Tensor([1.0, np.inf, np.nan]).to_reduced_precision("int8"),
        ValueError,
        r"2 non-finite value\(s\) into scaled int8: the first is inf at index \(1,\)",
    ),
    (
        lambda: Tensor([1.0, np.nan]).to_reduced_precision("int4"),
        ValueError,
        "non-finite.*int4",
    ),
    (
        lambda: Tensor(X).to_reduced_precision("int8", scaling="per-axis"),
        TypeError,
        "scaling must be",
    ),
    (
        lambda: Tensor(X).to_reduced_precision("int8", scaling=dtypes.PerAxis(5)),
        ValueError,
        "PerAxis",
    ),
    (lambda: Tensor.from_encoded(np.ones(3)), TypeError, "dtypes.Encoded"),
]


@pytest.mark.parametrize(("call", "error", "message"), BAD_CALLS)
def test_bad_calls_raise_precise_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_errors_inherit_builtins():
    assert issubclass(precision.PrecisionMismatchError, TypeError)
    assert issubclass(precision.DeviceMismatchError, ValueError)
    assert issubclass(precision.FormatError, ValueError)
    for cls in (
        precision.PrecisionMismatchError,
        precision.DeviceMismatchError,
        precision.FormatError,
    ):
        assert issubclass(cls, precision.PrecisionError)


# -- conversions ------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(NATIVE))
def test_to_reduced_precision_matches_ml_dtypes(name):
    with np.errstate(over="ignore"):
        expected = X.astype(NATIVE[name]).astype(np.float32)
    r = Tensor(X).to_reduced_precision(name)
    assert r.format == dtypes.get(name)
    assert r.dtype == np.float32
    assert r.encoded.data.dtype == np.dtype(NATIVE[name])
    np.testing.assert_array_equal(np.asarray(r), expected)


def test_default_format_and_context():
    assert precision.get_default_format() == dtypes.bfloat16
    assert Tensor(X).to_reduced_precision().format == dtypes.bfloat16
    with precision.default_format("fp16") as fmt:
        assert fmt == dtypes.float16
        assert precision.get_default_format() == dtypes.float16
        assert Tensor(X).to_reduced_precision().format == dtypes.float16
        with precision.default_format(dtypes.float8_e5m2):
            assert Tensor(X).to_reduced_precision().format == dtypes.float8_e5m2
        assert Tensor(X).to_reduced_precision().format == dtypes.float16
    assert Tensor(X).to_reduced_precision().format == dtypes.bfloat16


def test_the_default_format_is_read_for_each_trace_not_kept_from_the_first():
    # a jitted conversion traced under bfloat16 converts to float16 under the context
    convert = jax.jit(lambda x: Tensor(x).to_reduced_precision())
    tree = jax.jit(lambda p: precision.to_reduced_precision(p))
    x = jnp.asarray(X)
    assert convert(x).format == dtypes.bfloat16
    assert tree({"w": x})["w"].format == dtypes.bfloat16
    with precision.default_format("float16"):
        assert convert(x).format == dtypes.float16
        assert tree({"w": x})["w"].format == dtypes.float16
        with precision.default_format("int8"):
            assert convert(x).format == dtypes.int8
        assert convert(x).format == dtypes.float16
    assert convert(x).format == dtypes.bfloat16


def test_importing_precision_leaves_jax_without_a_user_context():
    code = (
        "import jax, precision; from precision import _context; "
        "precision.get_default_format(); assert _context._CONTEXT is None; print('ok')"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.stdout.strip() == "ok", run.stderr


def test_to_full_precision_keeps_rounded_values():
    r = Tensor(X).to_reduced_precision("float16")
    f = r.to_full_precision()
    assert f.format == dtypes.float32
    assert not f.is_reduced_precision
    np.testing.assert_array_equal(np.asarray(f), X.astype(np.float16).astype(np.float32))
    assert f.to_full_precision() is f


def test_reencoding_goes_through_logical_values():
    r = Tensor(X).to_reduced_precision("float16").to_reduced_precision("float8_e5m2")
    expected = X.astype(np.float16).astype(np.float32).astype(ml_dtypes.float8_e5m2)
    np.testing.assert_array_equal(np.asarray(r), expected.astype(np.float32))


def test_swift_aliases():
    t = Tensor(X)
    r = t.toReducedPrecision("float16")
    assert r.isReducedPrecision
    assert not r.toFullPrecision().isReducedPrecision


def test_astype_changes_the_logical_dtype_only():
    r = Tensor(X).to_reduced_precision("float16")
    same = r.astype(np.float32)
    assert same.format == dtypes.float16
    assert same.dtype == np.float32
    with pytest.raises(TypeError, match=r"to_reduced_precision\('bf16'\)"):
        r.astype("bf16")  # a storage format is not a dtype: the error names the call
    with pytest.raises(TypeError, match=r"to_reduced_precision\('bfloat16'\)"):
        r.astype(jnp.bfloat16)  # (a dtype is named as the registry names its format)
    with pytest.raises(TypeError, match=r"with a format of dtypes\.REGISTRY"):
        r.astype(jnp.int32)  # (no format of that name: no call that would fail again)


@pytest.mark.parametrize(
    ("name", "scaling"),
    [("int8", None), ("int4", dtypes.PerAxis(0)), ("int2", dtypes.PerBlock(2)), ("int1", None)],
)
def test_integer_formats_store_codes_and_scales(name, scaling):
    r = Tensor(X[:, :2]).to_reduced_precision(name, scaling=scaling)
    fmt = dtypes.get(name)
    assert r.format == fmt
    assert r.scaling == (scaling or dtypes.PerTensor())
    assert r.shape == (2, 2)
    # independent reference: numpy absmax quantization of the same groups
    if name != "int1":
        ref = _numpy_quantize(X[:, :2], fmt.qmax, scaling)
        np.testing.assert_allclose(np.asarray(r), ref, rtol=1e-6)


def _numpy_quantize(x, qmax, scaling):
    x = x.astype(np.float32)
    if scaling is None:
        absmax = np.abs(x).max(keepdims=True)
    elif isinstance(scaling, dtypes.PerAxis):
        absmax = np.abs(x).max(axis=1, keepdims=True)
    else:  # PerBlock(2) on the last axis of a width-2 array: one block per row
        absmax = np.abs(x).max(axis=1, keepdims=True)
    inv = np.float32(qmax) / absmax.astype(np.float32)
    codes = np.clip(np.round(x * inv), -qmax, qmax)
    return codes * (absmax / np.float32(qmax))


def test_from_encoded_and_encoded_view():
    enc = dtypes.int4.encode(X)
    t = Tensor.from_encoded(enc)
    assert t.format == dtypes.int4
    assert t.shape == X.shape
    np.testing.assert_array_equal(np.asarray(t), np.asarray(enc.decode()))
    view = t.encoded
    assert view.format == dtypes.int4
    assert view.shape == X.shape
    full = Tensor(X).encoded
    assert full.scale is None
    assert full.format == dtypes.float32


# -- properties --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "shape", "nbytes"),
    [
        ("float32", (3, 5), 60),
        ("bfloat16", (3, 5), 30),
        ("tf32", (3, 5), 60),  # lives in a float32 container
        ("float8_e4m3fn", (3, 5), 15),
        ("int8", (3, 5), 15 + 4),
        ("int4", (3, 5), 3 * 3 + 4),  # 5 codes -> 3 bytes per row
        ("int2", (3, 5), 3 * 2 + 4),
        ("int1", (3, 5), 3 * 1 + 4),
        ("int4", (7,), 4 + 4),
    ],
)
def test_nbytes_is_real_storage(name, shape, nbytes):
    t = Tensor(np.ones(shape, np.float32)).to_reduced_precision(name)
    assert t.nbytes == nbytes
    assert t.shape == shape
    assert t.size == int(np.prod(shape))
    assert t.ndim == len(shape)


def test_values_via_numpy_jax_and_method():
    r = Tensor(X).to_reduced_precision("float16")
    expected = X.astype(np.float16).astype(np.float32)
    full = precision.to_full_precision(r)
    for values in (np.asarray(r), full, r.numpy(), np.array(r, dtype=np.float64)):
        np.testing.assert_array_equal(np.asarray(values, np.float32), expected)
    assert full.dtype == jnp.float32


def test_repr_shows_shape_dtype_format_device_values():
    text = repr(Tensor(X[:1] * 0.5).to_reduced_precision("int8"))
    assert "shape=(1, 3)" in text
    assert "dtype=float32" in text
    assert "format=int8, scaling=per-tensor" in text
    assert f"device={jax.devices()[0]}" in text
    assert re.search(r"-1\.249", text)
    traced = []
    jax.jit(lambda t: traced.append(repr(t)) or t)(Tensor(X))
    assert "traced" in traced[0]


def test_immutable():
    t = Tensor(X)
    with pytest.raises(AttributeError):
        t.dtype = np.float64
    with pytest.raises(AttributeError):
        t.anything = 1


# -- pytree ------------------------------------------------------------------------------
def test_pytree_children_are_storage_arrays():
    r = Tensor(X).to_reduced_precision("int4", scaling=dtypes.PerAxis(0))
    leaves, treedef = jax.tree_util.tree_flatten(r)
    assert [leaf.dtype for leaf in leaves] == [np.dtype(np.uint8), np.dtype(np.float32)]
    back = jax.tree_util.tree_unflatten(treedef, leaves)
    np.testing.assert_array_equal(np.asarray(back), np.asarray(r))
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(r)[0]]
    assert paths == [".data", ".scale"]
    assert len(jax.tree_util.tree_leaves(Tensor(X).to_reduced_precision())) == 1


def test_jit_retraces_on_format_not_on_values():
    traces = []

    @jax.jit
    def f(t):
        traces.append(t.format)
        return t

    f(Tensor(X).to_reduced_precision())
    f(Tensor(X * 2).to_reduced_precision())
    assert len(traces) == 1
    f(Tensor(X).to_reduced_precision("float16"))
    assert len(traces) == 2


def test_vmap_sees_logical_shape_per_example():
    r = Tensor(np.ones((4, 5), np.float32)).to_reduced_precision("int4", scaling=dtypes.PerAxis(0))
    shapes = []

    def f(t):
        shapes.append(t.shape)
        return t

    out = jax.vmap(f)(r)
    assert shapes == [(5,)]
    assert out.shape == (4, 5)


# -- devices --------------------------------------------------------------------------------
def test_device_and_to_device():
    dev = jax.devices()[0]
    t = Tensor(X).to_reduced_precision("int8")
    assert t.device == dev
    moved = t.to_device(dev)
    assert moved.device == dev
    assert moved.format == dtypes.int8
    np.testing.assert_array_equal(np.asarray(moved), np.asarray(t))


def test_device_put_moves_tensors_and_arrays_in_a_tree():
    dev = jax.devices()[0]
    tree = {"w": Tensor(X).to_reduced_precision(), "b": np.zeros(3), "n": 7}
    out = precision.device_put(tree, dev)
    assert out["w"].device == dev
    assert isinstance(out["b"], jax.Array)
    assert out["n"] == 7


def test_iteration_and_len():
    t = Tensor(X).to_reduced_precision()
    rows = list(t)
    assert len(rows) == len(t) == 2
    assert all(r.format == dtypes.bfloat16 and r.shape == (3,) for r in rows)
    with pytest.raises(TypeError, match="0-d"):
        len(Tensor(1.0))


def test_plain_jax_numpy_refuses_a_tensor_and_explicit_conversions_give_its_values():
    # outside `apply`, JAX would compute on the float32 values and drop the format: a jnp
    # function and jnp.asarray alike are refused with the rule's teaching error (JAX asks
    # the same way for both); the Tensor's own conversions give the values
    t = Tensor(X).to_reduced_precision("float16")
    refused = r"float16 Tensor of shape \(2, 3\) does not become a JAX array implicitly"
    for implicit in (jnp.tanh, jnp.asarray, jnp.array, jax.jit(lambda a: jnp.asarray(a))):
        with pytest.raises(precision.PrecisionMismatchError, match=refused):
            implicit(t)
    logical = np.asarray(t)
    np.testing.assert_array_equal(t.numpy(), logical)
    np.testing.assert_array_equal(np.asarray(precision.to_full_precision(t)), logical)
    np.testing.assert_array_equal(np.asarray(jnp.asarray(t.to_full_precision())), logical)


def test_every_encoding_round_trips_through_tensor_and_apply(fmt):
    # Every registry entry (the `fmt` fixture): Tensors hold every array of an
    # encoding (NVFP4's tensor scale, zero points), so values, bytes and results
    # equal the dtypes encoding's.
    name = fmt.name
    x = np.linspace(-3, 3, 128, dtype=np.float32).reshape(2, 64)
    if fmt.kind == "scale":  # E8M0 holds positive powers of two only
        x = np.abs(x) + 0.25
    enc = fmt.encode(x)
    ref = np.asarray(enc.decode())
    t = Tensor(x).to_reduced_precision(name)
    np.testing.assert_array_equal(np.asarray(t), ref)
    assert t.nbytes == enc.nbytes == sum(a.nbytes for a in jax.tree_util.tree_leaves(t))
    same = precision.apply(lambda a: a)(t)
    assert same.format == t.format
    np.testing.assert_array_equal(np.asarray(same), ref)
    np.testing.assert_array_equal(np.asarray(precision.apply(lambda a: a * 2.0)(t)), 2 * ref)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda a: a)(t)), ref)


@pytest.mark.parametrize("key", [100, -5, (0, 7), (Ellipsis, 3), (None, 2, 0)])
def test_a_static_index_out_of_range_raises_like_numpy(key):
    t = Tensor(np.arange(6.0).reshape(2, 3))
    with pytest.raises(IndexError, match="out of bounds"):
        t[key]
    with pytest.raises(IndexError):
        np.arange(6.0).reshape(2, 3)[key]  # the same keys numpy refuses


def test_in_range_indices_still_index():
    t = Tensor(np.arange(6.0).reshape(2, 3))
    assert t[-1, -1].numpy() == 5.0
    assert t[..., 2].numpy().tolist() == [2.0, 5.0]
    assert [float(r.sum().numpy()) for r in t] == [3.0, 12.0]


@pytest.mark.parametrize(
    "leaf",
    [lambda x: x.shape, lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), lambda x: None],
    ids=["shape", "ShapeDtypeStruct", "None"],
)
def test_a_tree_map_to_other_leaves_prints_and_flattens(leaf):
    """`print(jax.tree.map(lambda x: x.shape, params))` crashed in Tensor.__repr__."""
    params = {"w": Tensor(np.ones((2, 3), np.float32)).to_reduced_precision("int8")}
    mapped = jax.tree.map(leaf, params)
    text = repr(mapped)
    assert "format=int8" in text
    again = jax.tree.unflatten(jax.tree.structure(mapped), jax.tree.leaves(mapped))
    assert repr(again) == text


def _unscaled_floats() -> list[dtypes.Format]:
    return [f for f in selected_formats(kinds="float") if f.default_scaling() is None]


# The unscaled float formats with neither inf nor NaN (a scaled encoding refuses every
# non-finite value: its scale would be NaN).
NO_INF_NOR_NAN = [f.name for f in _unscaled_floats() if not f.has_inf and not f.nan]


def test_the_formats_refusing_inf_are_those_without_inf_or_nan():
    refused = set()
    for fmt in _unscaled_floats():
        try:
            Tensor(np.array([np.inf, 1.0], np.float32)).to_reduced_precision(fmt)
        except dtypes.NonFiniteError:
            refused.add(fmt.name)
    assert refused == set(NO_INF_NOR_NAN)


@pytest.mark.parametrize("name", NO_INF_NOR_NAN)
def test_inf_into_a_format_without_inf_or_nan_is_refused_eagerly(name):
    """+inf became ±6 / ±28 silently through to_reduced_precision and trees."""
    x = np.array([np.inf, 1.0], np.float32)
    with pytest.raises(dtypes.NonFiniteError, match="saturate=True"):
        Tensor(x).to_reduced_precision(name)
    with pytest.raises(ValueError, match=r"\['w'\]"):
        precision.to_reduced_precision({"w": x}, name)
    fmt = dtypes.get(name)
    clamped = dtypes.FloatFormat(fmt.exponent_bits, fmt.mantissa_bits, finite=True, saturate=True)
    assert Tensor(x).to_reduced_precision(clamped).numpy().tolist() == [fmt.max, 1.0]
