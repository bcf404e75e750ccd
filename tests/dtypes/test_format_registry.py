"""The registry of names and aliases, and the table of wrong calls with their errors."""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
import pytest

import dtypes
from dtypes import Encoded, FloatFormat, IntFormat, PerAxis, PerBlock, PerTensor

CANONICAL = {
    "float64": dtypes.float64,
    "float32": dtypes.float32,
    "bfloat16": dtypes.bfloat16,
    "float16": dtypes.float16,
    "tf32": dtypes.tf32,
    "float8_e4m3fn": dtypes.float8_e4m3fn,
    "float8_e5m2": dtypes.float8_e5m2,
    "int8": dtypes.int8,
    "int4": dtypes.int4,
    "int2": dtypes.int2,
    "int1": dtypes.int1,
}

# Spellings people type (issue 2 and DESIGN §2), each with the format it must give.
ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "tensorfloat32": "tf32",
    "e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2",
    "binary": "int1",
    "fp32": "float32",
    "f32": "float32",
    "fp64": "float64",
}


def test_registry_holds_exactly_the_builtin_formats():
    assert dict(dtypes.FORMATS) == CANONICAL
    for name, fmt in dtypes.FORMATS.items():
        assert fmt.name == name
        assert getattr(dtypes, name) is fmt


@pytest.mark.parametrize("name", list(CANONICAL))
def test_get_canonical_names_any_case(name):
    fmt = CANONICAL[name]
    for spelling in (name, name.upper(), name.title(), f"  {name} "):
        assert dtypes.get(spelling) is fmt


@pytest.mark.parametrize(("alias", "name"), list(ALIASES.items()))
def test_get_aliases_any_case(alias, name):
    assert dtypes.ALIASES[alias] == name
    for spelling in (alias, alias.upper(), alias.capitalize()):
        assert dtypes.get(spelling) is CANONICAL[name]


def test_every_registered_alias_resolves():
    for alias, name in dtypes.ALIASES.items():
        assert dtypes.get(alias) is dtypes.FORMATS[name]


def test_get_passes_formats_through():
    custom = FloatFormat(3, 2)
    assert dtypes.get(custom) is custom
    assert dtypes.get(dtypes.int4) is dtypes.int4


@pytest.mark.parametrize("name", ["bfloat", "float8", "int3", "", "fp8_e4m3fnuz"])
def test_unknown_name_lists_the_known_ones(name):
    with pytest.raises(ValueError, match=re.escape(repr(name))) as info:
        dtypes.get(name)
    for known in CANONICAL:
        assert known in str(info.value)


@pytest.mark.parametrize("value", [None, 3, 16.0, np.float32])
def test_get_of_a_non_name_is_a_type_error(value):
    with pytest.raises(TypeError, match="format"):
        dtypes.get(value)


def test_int1_is_documented_as_binary_not_ml_dtypes_int1():
    doc = dtypes.IntFormat.__doc__
    assert "binary" in doc
    assert "ml_dtypes" in doc
    assert dtypes.int1.binary
    assert dtypes.int1.qmax == 1


@pytest.mark.parametrize(
    ("fmt", "qmax", "container", "packed"),
    [
        (dtypes.int8, 127, np.int8, False),
        (dtypes.int4, 7, np.uint8, True),
        (dtypes.int2, 1, np.uint8, True),
        (dtypes.int1, 1, np.uint8, True),
    ],
    ids=lambda v: getattr(v, "name", None),
)
def test_int_format_attributes(fmt, qmax, container, packed):
    assert fmt.kind == "int"
    assert fmt.qmax == qmax
    assert fmt.max == float(qmax)
    assert fmt.container == np.dtype(container)
    assert fmt.packed == packed
    assert IntFormat(fmt.bits) == fmt
    assert hash(IntFormat(fmt.bits, name="other")) == hash(fmt)


# -- wrong calls: one table, each with the error type and what the message must say --

X = np.ones((2, 4), np.float32)

WRONG_CALLS = [
    ("FloatFormat(0, 3)", lambda: FloatFormat(0, 3), ValueError, "exponent_bits"),
    ("FloatFormat(9, 3)", lambda: FloatFormat(9, 3), ValueError, "exponent_bits"),
    ("FloatFormat(4, 24)", lambda: FloatFormat(4, 24), ValueError, "mantissa_bits"),
    ("FloatFormat(4, -1)", lambda: FloatFormat(4, -1), ValueError, "mantissa_bits"),
    ("FloatFormat(4.0, 3)", lambda: FloatFormat(4.0, 3), TypeError, "int"),
    ("FloatFormat('4', 3)", lambda: FloatFormat("4", 3), TypeError, "int"),
    ("FloatFormat(4, 3, nan=False)", lambda: FloatFormat(4, 3, nan=False), ValueError, "NaN"),
    ("FloatFormat(4, 0, nan)", lambda: FloatFormat(4, 0, finite=True, nan=True), ValueError, "NaN"),
    ("FloatFormat(7, 0, finite)", lambda: FloatFormat(7, 0, finite=True), ValueError, "NaN"),
    ("FloatFormat(1, 2) IEEE", lambda: FloatFormat(1, 2), ValueError, "finite=True"),
    ("IntFormat(3)", lambda: IntFormat(3), ValueError, "8, 4, 2 or 1"),
    ("IntFormat(16)", lambda: IntFormat(16), ValueError, "8, 4, 2 or 1"),
    ("IntFormat(0)", lambda: IntFormat(0), ValueError, "8, 4, 2 or 1"),
    ("IntFormat(True)", lambda: IntFormat(True), ValueError, "8, 4, 2 or 1"),
    ("IntFormat(8.0)", lambda: IntFormat(8.0), (TypeError, ValueError), "8, 4, 2 or 1"),
    ("PerBlock(0)", lambda: PerBlock(0), ValueError, "positive"),
    ("PerBlock(2.5)", lambda: PerBlock(2.5), ValueError, "positive"),
    (
        "unknown rounding",
        lambda: dtypes.bfloat16.encode(X, rounding="nearest"),
        ValueError,
        "nearest_even",
    ),
    ("stochastic, no key", lambda: dtypes.int8.encode(X, rounding="stochastic"), ValueError, "key"),
    (
        "PerAxis(2) on 2-d",
        lambda: dtypes.int8.encode(X, scaling=PerAxis(2)),
        ValueError,
        "PerAxis(axis=2)",
    ),
    (
        "PerBlock(axis=3) on 2-d",
        lambda: dtypes.int4.encode(X, scaling=PerBlock(2, axis=3)),
        ValueError,
        "axis=3",
    ),
    (
        "scaling as a string",
        lambda: dtypes.int8.encode(X, scaling="per-tensor"),
        TypeError,
        "PerTensor",
    ),
    (
        "complex input",
        lambda: dtypes.bfloat16.encode(np.ones(3, np.complex64)),
        TypeError,
        "complex",
    ),
    ("string input", lambda: dtypes.int8.encode(np.array(["a", "b"])), TypeError, "dtype"),
    (
        "decode with another format",
        lambda: dtypes.float16.decode(dtypes.bfloat16.encode(X)),
        ValueError,
        "bfloat16",
    ),
    ("decode a raw array", lambda: dtypes.bfloat16.decode(jnp.ones(3)), TypeError, "Encoded"),
    (
        "power-of-two int1",
        lambda: dtypes.int1.encode(X, scaling=PerTensor(power_of_two=True)),
        ValueError,
        "power_of_two",
    ),
    (
        "scaled bfloat16",
        lambda: dtypes.bfloat16.encode(X, scaling=PerTensor()),
        ValueError,
        "exponent range",
    ),
]


@pytest.mark.parametrize(
    ("call", "error", "says"), [c[1:] for c in WRONG_CALLS], ids=[c[0] for c in WRONG_CALLS]
)
def test_wrong_call_raises_a_precise_error(call, error, says):
    with pytest.raises(error, match=re.escape(says)):
        call()


def test_encoded_repr_and_shape():
    enc = dtypes.int4.encode(np.ones((3, 5), np.float32))
    assert isinstance(enc, Encoded)
    assert enc.shape == (3, 5)
    assert enc.data.shape == (3, 3)
    assert "int4" in repr(enc)
    assert "(3, 5)" in repr(enc)
