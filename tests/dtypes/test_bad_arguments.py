"""Wrong calls into `dtypes`, each refused by its own error class with a message naming
what was given and the fix; and what float64 input gives under x64, checked against
numpy and exact arithmetic (never the code under test)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dtypes

X = np.linspace(-1.0, 1.0, 64, dtype=np.float32).reshape(2, 32)
E8M0 = dtypes.get("float8_e8m0fnu")
NF4 = dtypes.get("nf4")
UINT8, UINT4 = dtypes.get("uint8"), dtypes.get("uint4")


def _int8_encoding():
    return dtypes.int8.encode(X)


def _with_code(fmt, index, byte):
    """A hand-built encoding of `fmt` whose packed byte at `index` is `byte`."""
    enc = fmt.encode(X)
    data = enc.data.at[index].set(byte)
    return dtypes.Encoded(data, enc.scale, fmt, enc.scaling, enc.packed_last)


BAD_CALLS = [
    # 1. a format's bool flags and name
    pytest.param(
        lambda: dtypes.FloatFormat(4, 3, finite="no"),
        dtypes.PrecisionTypeError,
        ["finite", "str 'no'", "FloatFormat(4, 3, finite=True)"],
        id="float-finite-str",
    ),
    pytest.param(
        lambda: dtypes.FloatFormat(4, 3, finite={}),
        dtypes.PrecisionTypeError,
        ["finite", "dict {}"],
        id="float-finite-unhashable",
    ),
    pytest.param(
        lambda: dtypes.FloatFormat(5, 2, saturate="yes"),
        dtypes.PrecisionTypeError,
        ["saturate", "str 'yes'", "FloatFormat(5, 2, saturate=True)"],
        id="float-saturate-str",
    ),
    pytest.param(
        lambda: dtypes.FloatFormat(2, 1, finite=True, nan=1),
        dtypes.PrecisionTypeError,
        ["nan", "int 1", "None"],
        id="float-nan-int",
    ),
    pytest.param(
        lambda: dtypes.IntFormat(8, name=5),
        dtypes.PrecisionTypeError,
        ["int 5", "IntFormat(8, name="],
        id="int-name-int",
    ),
    pytest.param(
        lambda: dtypes.AsymmetricIntFormat(4, name=b"u4"),
        dtypes.PrecisionTypeError,
        ["bytes b'u4'", "AsymmetricIntFormat(4, name="],
        id="uint-name-bytes",
    ),
    pytest.param(
        lambda: dtypes.CodebookFormat([-1.0, 1.0], name=3.0),
        dtypes.PrecisionTypeError,
        ["float 3.0", "name="],
        id="codebook-name-float",
    ),
    pytest.param(
        lambda: dtypes.E8M0Format(name=1),
        dtypes.PrecisionTypeError,
        ["int 1", "E8M0Format(name="],
        id="e8m0-name-int",
    ),
    # 4. a key given is a JAX random key, whatever the rounding
    pytest.param(
        lambda: dtypes.bfloat16.round(X, key="abc"),
        dtypes.RoundingError,
        ["str 'abc'", "jax.random.key(0)", "no key"],
        id="round-key-str",
    ),
    pytest.param(
        lambda: dtypes.int8.round(X, key=2**63),
        dtypes.RoundingError,
        ["9223372036854775808", "jax.random.key(0)"],
        id="round-key-huge-int",
    ),
    pytest.param(
        lambda: dtypes.bfloat16.encode(X, key="abc"),
        dtypes.RoundingError,
        ["str 'abc'", "jax.random.key(0)"],
        id="encode-key-str",
    ),
    pytest.param(
        lambda: NF4.encode(X, rounding="stochastic", key=1.5),
        dtypes.RoundingError,
        ["float 1.5", "not a seed"],
        id="stochastic-key-float",
    ),
    # 5. scaling= of nbytes and result_dtype is checked as encode checks it
    pytest.param(
        lambda: dtypes.int8.nbytes((2, 32), scaling="per-tensor"),
        dtypes.PrecisionTypeError,
        ["str 'per-tensor'", "int8", "dtypes.PerTensor()"],
        id="nbytes-scaling-str",
    ),
    *[
        pytest.param(
            lambda fmt=fmt: fmt.nbytes((2, 32), scaling="per-tensor"),
            dtypes.PrecisionTypeError,
            ["str 'per-tensor'", fmt.name],
            id=f"nbytes-scaling-str-{fmt.name}",
        )
        for fmt in (UINT8, NF4)
    ],
    *[
        pytest.param(
            lambda fmt=fmt: fmt.result_dtype(np.float32, scaling="abc"),
            dtypes.PrecisionTypeError,
            ["str 'abc'", fmt.name, "dtypes.PerTensor()"],
            id=f"result-dtype-scaling-str-{fmt.name}",
        )
        for fmt in (dtypes.int8, dtypes.bfloat16, UINT8)
    ],
    # 6. the base class groups nothing
    pytest.param(
        lambda: dtypes.Scaling(),
        dtypes.ScalingError,
        ["base class", "PerTensor()", "PerAxis(0)", "PerBlock(32)"],
        id="scaling-base",
    ),
    pytest.param(
        lambda: dtypes.Scaling(power_of_two=True),
        dtypes.ScalingError,
        ["PerTensor()"],
        id="scaling-base-options",
    ),
    # 7. the public methods of a scaling check their arguments
    pytest.param(
        lambda: dtypes.PerAxis(0).scale_shape("abc"),
        dtypes.ShapeError,
        ["str 'abc'", "(1024, 1024)"],
        id="scale-shape-str",
    ),
    pytest.param(
        lambda: dtypes.PerAxis(0).scale_shape((-1,)),
        dtypes.ShapeError,
        ["(-1,)", "-1"],
        id="scale-shape-negative",
    ),
    pytest.param(
        lambda: dtypes.PerTensor().scale_shape(5),
        dtypes.ShapeError,
        ["int 5"],
        id="scale-shape-int",
    ),
    pytest.param(
        lambda: dtypes.PerTensor().validate(object()),
        dtypes.ShapeError,
        ["object"],
        id="validate-object",
    ),
    pytest.param(
        lambda: dtypes.PerBlock(32).validate((4, 2.5)),
        dtypes.ShapeError,
        ["2.5"],
        id="validate-float-dim",
    ),
    pytest.param(
        lambda: dtypes.PerAxis(0).kept(0),
        dtypes.ScalingError,
        ["PerAxis(axis=0)", "0-d", "PerTensor()"],
        id="kept-zero-dims",
    ),
    pytest.param(
        lambda: dtypes.PerAxis(5).kept(2),
        dtypes.ScalingError,
        ["PerAxis(axis=5)", "[-2, 1]"],
        id="kept-axis-out-of-range",
    ),
    pytest.param(
        lambda: dtypes.PerAxis(0).kept("2"),
        dtypes.ScalingError,
        ["str '2'"],
        id="kept-str",
    ),
    pytest.param(
        lambda: dtypes.PerTensor().refit((2, 32), None),
        dtypes.ShapeError,
        ["NoneType None"],
        id="refit-none",
    ),
    pytest.param(
        lambda: dtypes.PerTensor().tensor_scale_fits(5, (2, 32)),
        dtypes.ShapeError,
        ["int 5"],
        id="tensor-scale-fits-int",
    ),
    pytest.param(
        lambda: dtypes.PerTensor().group_reduce("abc", jnp.max),
        dtypes.PrecisionTypeError,
        ["group_reduce", "str 'abc'"],
        id="group-reduce-str",
    ),
    pytest.param(
        lambda: dtypes.PerBlock(16).group_reduce([1.0, 2.0], jnp.max),
        dtypes.PrecisionTypeError,
        ["group_reduce", "list"],
        id="group-reduce-list",
    ),
    pytest.param(
        lambda: dtypes.PerAxis(0).broadcast(jnp.ones((2, 1)), (3, 5)),
        dtypes.ScalingError,
        ["(3, 1)", "(2, 1)", "scale_shape"],
        id="broadcast-wrong-scales",
    ),
    pytest.param(
        lambda: dtypes.PerBlock(4).broadcast(jnp.ones((3, 3)), (3, 5)),
        dtypes.ScalingError,
        ["scales of shape (3, 2)", "got scales of shape (3, 3)"],
        id="broadcast-wrong-blocks",
    ),
    pytest.param(
        lambda: dtypes.PerTensor().broadcast(jnp.ones((1, 1)), (2**47, 2**47)),
        dtypes.ShapeError,
        ["(140737488355328, 140737488355328)", "2**60"],
        id="broadcast-past-xla",  # used to abort the interpreter inside XLA
    ),
    pytest.param(
        lambda: dtypes.PerTensor().broadcast("abc", (2, 3)),
        dtypes.PrecisionTypeError,
        ["broadcast", "str 'abc'"],
        id="broadcast-str-scale",
    ),
    # 8. hand-built encodings and from_codes
    pytest.param(
        lambda: dtypes.Encoded("abc", None, dtypes.bfloat16, None).decode(),
        dtypes.PrecisionTypeError,
        ["str 'abc'", "data", "bfloat16.encode(x)"],
        id="encoded-data-str",
    ),
    pytest.param(
        lambda: dtypes.Encoded(None, None, dtypes.bfloat16, None).decode(),
        dtypes.PrecisionTypeError,
        ["NoneType", "data"],
        id="encoded-data-none",
    ),
    pytest.param(
        lambda: (
            (e := _int8_encoding())
            and dtypes.int8.decode(dtypes.Encoded(e.data, e.scale, "int8", e.scaling))
        ),
        dtypes.FormatTypeError,
        ["str 'int8'"],
        id="format-decode-encoded-format-str",
    ),
    pytest.param(
        lambda: (
            (e := _int8_encoding()) and dtypes.Encoded(e.data, e.scale, "int8", e.scaling).decode()
        ),
        dtypes.FormatTypeError,
        ["str 'int8'", "dtypes.get('int8')"],
        id="encoded-format-str",
    ),
    pytest.param(
        lambda: (
            (e := _int8_encoding()) and dtypes.Encoded(e.data, e.scale, dtypes.int8, "x").decode()
        ),
        dtypes.PrecisionTypeError,
        ["str 'x'", "int8.encode(x)"],
        id="encoded-scaling-str",
    ),
    pytest.param(
        lambda: (
            (e := _int8_encoding()) and dtypes.Encoded(e.data, "s", dtypes.int8, e.scaling).decode()
        ),
        dtypes.PrecisionTypeError,
        ["str 's'", "scale"],
        id="encoded-scale-str",
    ),
    pytest.param(
        lambda: dtypes.Encoded(
            dtypes.bfloat16.encode(X).data, jnp.ones((1, 1)), dtypes.bfloat16, None
        ).decode(),
        dtypes.FormatError,
        ["unscaled bfloat16", "(1, 1)", "bfloat16.encode(x)"],
        id="unscaled-with-scales",
    ),
    pytest.param(
        lambda: _with_code(dtypes.int4, (0, 0), 0x80).decode(),
        dtypes.FormatError,
        ["int4", "code -8", "±7"],
        id="int4-code-minus-8-high-nibble",
    ),
    pytest.param(
        lambda: _with_code(dtypes.int4, (1, 15), 0x18).decode(),
        dtypes.FormatError,
        ["int4", "code -8"],
        id="int4-code-minus-8-low-nibble",
    ),
    pytest.param(
        lambda: _with_code(dtypes.int2, (1, 7), 0x20).decode(),
        dtypes.FormatError,
        ["int2", "code -2", "±1"],
        id="int2-code-minus-2",
    ),
    pytest.param(
        lambda: dtypes.from_codes("abc", 1.0, "int8", dtypes.PerTensor()),
        dtypes.PrecisionTypeError,
        ["int8 codes", "str 'abc'", "[-127, 127]"],
        id="from-codes-str",
    ),
    pytest.param(
        lambda: dtypes.from_codes(2**63, 1.0, "int8", dtypes.PerTensor()),
        dtypes.PrecisionTypeError,
        ["int8 codes", "9223372036854775808"],
        id="from-codes-huge-int",
    ),
    pytest.param(
        lambda: dtypes.from_codes(np.array([1, 2]), "abc", "int8", dtypes.PerTensor()),
        dtypes.PrecisionTypeError,
        ["int8 scales", "str 'abc'"],
        id="from-codes-scale-str",
    ),
    pytest.param(
        lambda: dtypes.from_codes(
            np.array([1, 2]), np.ones(1, np.float32), "uint8", dtypes.PerTensor(), zero_point="abc"
        ),
        dtypes.PrecisionTypeError,
        ["uint8 zero points", "str 'abc'", "[0, 255]"],
        id="from-codes-zero-point-str",
    ),
]


@pytest.mark.parametrize(("call", "error", "words"), BAD_CALLS)
def test_bad_argument_is_refused_with_its_class_and_the_fix(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert type(info.value) is error, f"{type(info.value).__name__}: {info.value}"
    message = str(info.value)
    missing = [w for w in words if w not in message]
    assert not missing, f"{missing} not in: {message}"


def test_good_arguments_next_to_the_bad_ones_still_work():
    fmt = dtypes.FloatFormat(4, 3, finite=np.bool_(True), saturate=np.bool_(False), name=None)
    assert fmt == dtypes.float8_e4m3fn
    assert (fmt.finite, fmt.saturate) == (True, False)
    assert type(fmt.finite) is bool
    assert dtypes.IntFormat(8, name=None).name == "int8"
    # a key where rounding does not read it, typed or raw
    for key in (jax.random.key(0), jax.random.PRNGKey(0)):
        np.testing.assert_array_equal(dtypes.int8.round(X, key=key), dtypes.int8.round(X))
    assert dtypes.PerAxis(-1).kept(2) == (1,)
    assert dtypes.PerTensor().refit((2, 32), (1, 1)) == dtypes.PerTensor()
    scale = jnp.arange(1.0, 4.0).reshape(3, 1)
    assert dtypes.PerAxis(0).broadcast(scale, (3, 5)).shape == (3, 5)
    assert dtypes.PerTensor().broadcast(jnp.ones(()), (2, 3)).shape == (2, 3)  # one scale, 0-d
    enc = dtypes.from_codes(np.array([[3, -7]]), 0.5, "int4", dtypes.PerTensor())
    assert enc.decode().tolist() == [[1.5, -3.5]]


def test_repr_of_a_hand_built_encoding_does_not_raise():
    assert repr(dtypes.Encoded(None, None, dtypes.bfloat16, None)).startswith(
        "Encoded(data=NoneType"
    )
    assert "format='int8'" in repr(dtypes.Encoded("abc", None, "int8", None))
    assert (
        repr(_int8_encoding())
        == "Encoded(shape=(2, 32), format=int8, scaling=per-tensor, nbytes=68)"
    )


# -- float64 input under x64 ----------------------------------------------------------


def _e8m0_exact(v: float) -> float:
    """The nearest power of two to `v` > 0, a tie (1.5 * 2**k) going up, within
    2**-127..2**127 (exact: frexp is exact on float64)."""
    m, e = math.frexp(v)  # v = m * 2**e, 0.5 <= m < 1
    k = e if m >= 0.75 else e - 1
    return math.ldexp(1.0, min(max(k, -127), 127))


def test_e8m0_float64_follows_the_float32_rule(x64):
    x32 = np.array(
        [1e-45, 1e-39, 2.0**-127, np.nextafter(2.0**-127, 1), 1.2 * 2.0**-127, 2.0**-126, 0.3, 1.0,
         3.0, 1.4 * 2.0**127, np.nan],
        np.float32,
    )  # fmt: skip
    got = np.asarray(E8M0.encode(x32.astype(np.float64)).data).view(np.uint8)
    np.testing.assert_array_equal(got, np.asarray(E8M0.encode(x32).data).view(np.uint8))
    exact = [math.log2(_e8m0_exact(float(v))) + 127 for v in x32[:-1]]
    np.testing.assert_array_equal(got, [*exact, 255])  # (1.2 * 2**-127: 2**-127)
    # below float32's subnormals: 2**-127, as every positive float32 below it gives
    tiny = np.array([5e-324, 1e-300, 1e-50, 1e-39], np.float64)
    assert np.asarray(E8M0.encode(tiny).data).view(np.uint8).tolist() == [0, 0, 0, 0]
    E8M0.check(tiny)
    r = E8M0.round(np.array([1e-39, 1.0]))
    assert r.dtype == np.float64
    assert r.tolist() == [2.0**-127, 1.0]


def test_e8m0_rounds_the_float64_value_itself(x64):
    # just below a tie: a float64 narrowed to float32 first would reach the tie and go up
    k = np.arange(-126, 127)
    x = np.concatenate(
        [np.nextafter(np.ldexp(1.5, k), 0), np.ldexp(1.5, k), np.ldexp(1.0 + 1e-12, k)]
    )
    rng = np.random.default_rng(0)
    x = np.concatenate([x, rng.uniform(1, 2, 500) * np.exp2(rng.integers(-126, 127, 500))])
    got = np.asarray(E8M0.round(x))
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, [_e8m0_exact(float(v)) for v in x])


def _nearest(values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    return grid[np.argmin(np.abs(values[..., None] - grid), axis=-1)]


def _storage_cases():
    rng = np.random.default_rng(1)
    # zero-point integers: a range [0, qmax * step] makes the scale `step` exactly, zero
    # point 0; in-between values are float64 off float32 (narrowing keeps their code)
    for fmt, step in ((UINT8, 0.5), (UINT4, 0.25)):
        grid = np.arange(fmt.qmax + 1) * step
        x = np.concatenate([[0.0, grid[-1]], rng.uniform(0, grid[-1], 62) + 1e-13])
        yield pytest.param(fmt, x, _nearest(x, grid), id=fmt.name)
    # nf4: absmax 2 per block of 64, so values are twice the table's
    table = 2.0 * np.asarray(NF4.values, np.float64)
    x = np.concatenate([[2.0], rng.uniform(-2.0, 2.0, 63) + 1e-13])
    yield pytest.param(NF4, x, _nearest(x, table), id="nf4")


@pytest.mark.parametrize(("fmt", "x", "expected"), list(_storage_cases()))
def test_storage_round_of_float64_is_float64_as_result_dtype_says(x64, fmt, x, expected):
    got = fmt.round(x)
    assert got.dtype == fmt.result_dtype(np.float64) == np.float64
    np.testing.assert_array_equal(np.asarray(got), expected)
    # float32 input keeps float32, with the same values
    got32 = fmt.round(x.astype(np.float32))
    assert got32.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(got32), expected.astype(np.float32))
