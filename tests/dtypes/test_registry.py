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

# Spellings people type (issue 2 and docs/design.md §2), each with the format it must give.
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


def test_one_registry_holds_the_formats_and_the_named_encodings():
    registry = dtypes.REGISTRY
    assert list(registry) == [*dtypes.FORMATS, *dtypes.ENCODINGS]
    assert dict(registry) == {**dtypes.FORMATS, **dtypes.ENCODINGS}
    assert {"mxfp4", "nvfp4", "nf4", "uint4", "float8_e8m0fnu"} <= set(registry)
    for name, fmt in registry.items():
        assert fmt.name == name
        assert dtypes.get(name) is fmt
    # one alias table: no alias is given twice or shadows a canonical name
    aliases = {**dtypes.ALIASES, **dtypes.ENCODING_ALIASES}
    assert len(aliases) == len(dtypes.ALIASES) + len(dtypes.ENCODING_ALIASES)
    assert not set(aliases) & set(registry)
    for alias, name in dtypes.ENCODING_ALIASES.items():
        assert dtypes.get(alias) is dtypes.ENCODINGS[name]
    with pytest.raises(TypeError):
        registry["bf16x"] = dtypes.bfloat16  # read-only


@pytest.mark.parametrize("name", ["mxfp4_sat", "nvfp4_sat", "nf4_sat", "e8m0_sat"])
def test_sat_names_a_saturating_unscaled_float_only(name):
    with pytest.raises(dtypes.FormatError, match="known formats"):
        dtypes.get(name)
    assert dtypes.get("e2m1_sat") == FloatFormat(2, 1, finite=True, saturate=True)


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


def _all_layouts():
    """Every FloatFormat layout the class accepts up to 8 exponent bits, in every variant."""
    out = []
    for e in range(1, 9):
        for m in range(0, 24):
            for finite in (False, True):
                for nan in (None, True, False):
                    for saturate in (False, True):
                        try:
                            out.append(FloatFormat(e, m, finite=finite, nan=nan, saturate=saturate))
                        except ValueError:
                            pass
    return out


def test_format_names_are_unique_per_layout():
    # one name, one layout: FloatFormat(4, 3, finite=True, nan=False) (max 480)
    # is not float8_e4m3fn (max 448)
    by_name = {}
    for fmt in _all_layouts():
        other = by_name.setdefault(fmt.name, fmt)
        assert other == fmt, f"{other!r} and {fmt!r} share the name {fmt.name!r}"
    assert FloatFormat(4, 3, finite=True, nan=False).name != "float8_e4m3fn"


def test_every_formats_own_name_resolves_to_it():
    formats = [*_all_layouts(), dtypes.float64, *dtypes.FORMATS.values()]
    for fmt in formats:
        got = dtypes.get(fmt.name)
        assert got == fmt, f"get({fmt.name!r}) gave {got!r}, not {fmt!r}"
    assert dtypes.get("float8_e4m3") == FloatFormat(4, 3)
    assert dtypes.get("FLOAT6-E3M2FN").max == 28.0


@pytest.mark.parametrize(
    "name", ["float8_e4m2", "float9_e4m3", "float8_e4m3fn_nan", "float6_e3m2fn_nonan_sat_sat"]
)
def test_layout_names_that_describe_no_format_are_unknown(name):
    # a wrong bit count, or a second spelling of a layout that has a name of its own
    with pytest.raises(dtypes.FormatError, match="known formats"):
        dtypes.get(name)


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

E = dtypes  # the error classes: each a PrecisionError and the builtin it names

WRONG_CALLS = [
    ("FloatFormat(0, 3)", lambda: FloatFormat(0, 3), E.FormatError, "exponent_bits"),
    ("FloatFormat(9, 3)", lambda: FloatFormat(9, 3), E.FormatError, "exponent_bits"),
    ("FloatFormat(4, 24)", lambda: FloatFormat(4, 24), E.FormatError, "mantissa_bits"),
    ("FloatFormat(4, -1)", lambda: FloatFormat(4, -1), E.FormatError, "mantissa_bits"),
    ("FloatFormat(4.0, 3)", lambda: FloatFormat(4.0, 3), E.PrecisionTypeError, "int"),
    ("FloatFormat('4', 3)", lambda: FloatFormat("4", 3), E.PrecisionTypeError, "int"),
    ("FloatFormat(4, 3, nan=False)", lambda: FloatFormat(4, 3, nan=False), E.FormatError, "NaN"),
    (
        "FloatFormat(4, 0, nan)",
        lambda: FloatFormat(4, 0, finite=True, nan=True),
        E.FormatError,
        "NaN",
    ),
    ("FloatFormat(7, 0, finite)", lambda: FloatFormat(7, 0, finite=True), E.FormatError, "NaN"),
    ("FloatFormat(1, 2) IEEE", lambda: FloatFormat(1, 2), E.FormatError, "finite=True"),
    ("IntFormat(3)", lambda: IntFormat(3), E.FormatError, "8, 4, 2 or 1"),
    ("IntFormat(16)", lambda: IntFormat(16), E.FormatError, "8, 4, 2 or 1"),
    ("IntFormat(0)", lambda: IntFormat(0), E.FormatError, "8, 4, 2 or 1"),
    ("IntFormat(True)", lambda: IntFormat(True), E.FormatError, "8, 4, 2 or 1"),
    ("IntFormat(8.0)", lambda: IntFormat(8.0), E.FormatError, "8, 4, 2 or 1"),
    ("get unknown", lambda: dtypes.get("bfloat17"), E.FormatError, "known formats: float64"),
    ("get a number", lambda: dtypes.get(16), E.PrecisionTypeError, "int 16"),
    ("PerBlock(0)", lambda: PerBlock(0), E.ScalingError, "at least 1, got 0"),
    ("PerBlock(2.5)", lambda: PerBlock(2.5), E.ScalingError, "must be an int, got float 2.5"),
    ("PerBlock(True)", lambda: PerBlock(True), E.ScalingError, "must be an int, got bool"),
    ("PerBlock(axis=1.0)", lambda: PerBlock(4, axis=1.0), E.ScalingError, "PerBlock axis"),
    ("PerAxis(1.5)", lambda: PerAxis(1.5), E.ScalingError, "must be an int, got float 1.5"),
    ("PerAxis(True)", lambda: PerAxis(True), E.ScalingError, "must be an int, got bool True"),
    (
        "power_of_two='no'",
        lambda: PerTensor(power_of_two="no"),
        E.ScalingError,
        "power_of_two must be True or False, got str 'no'",
    ),
    ("power_of_two=1", lambda: PerAxis(0, power_of_two=1), E.ScalingError, "got int 1"),
    ("nbytes negative", lambda: dtypes.int4.nbytes((-2, 5)), E.ShapeError, "-2"),
    ("nbytes float dim", lambda: dtypes.int8.nbytes((2.0, 5)), E.ShapeError, "2.0"),
    ("nbytes of a number", lambda: dtypes.int8.nbytes(5), E.ShapeError, "int 5"),
    (
        "unknown rounding",
        lambda: dtypes.bfloat16.encode(X, rounding="nearest"),
        E.RoundingError,
        "nearest_even",
    ),
    ("rounding=None", lambda: dtypes.bfloat16.round(X, rounding=None), E.RoundingError, "None"),
    (
        "stochastic, no key",
        lambda: dtypes.int8.encode(X, rounding="stochastic"),
        E.RoundingError,
        "key",
    ),
    (
        "PerAxis(2) on 2-d",
        lambda: dtypes.int8.encode(X, scaling=PerAxis(2)),
        E.ScalingError,
        "PerAxis(axis=2)",
    ),
    (
        "PerBlock(axis=3) on 2-d",
        lambda: dtypes.int4.encode(X, scaling=PerBlock(2, axis=3)),
        E.ScalingError,
        "axis=3",
    ),
    (
        "scaling as a string",
        lambda: dtypes.int8.encode(X, scaling="per-tensor"),
        E.PrecisionTypeError,
        "PerTensor",
    ),
    (
        "complex input",
        lambda: dtypes.bfloat16.encode(np.ones(3, np.complex64)),
        E.PrecisionTypeError,
        "complex",
    ),
    (
        "string input",
        lambda: dtypes.int8.encode(np.array(["a", "b"])),
        E.PrecisionTypeError,
        "dtype",
    ),
    (
        "NaN into int8",
        lambda: dtypes.int8.encode(np.array([1.0, np.nan], np.float32)),
        E.NonFiniteError,
        "1 non-finite value(s) into scaled int8: the first is nan at index (1,)",
    ),
    (
        "NaN into e2m1 (no NaN code)",
        lambda: FloatFormat(2, 1, finite=True).round(np.array([np.nan], np.float32)),
        E.NonFiniteError,
        "no NaN code",
    ),
    (
        "decode with another format",
        lambda: dtypes.float16.decode(dtypes.bfloat16.encode(X)),
        E.FormatError,
        "bfloat16",
    ),
    (
        "decode a raw array",
        lambda: dtypes.bfloat16.decode(jnp.ones(3)),
        E.PrecisionTypeError,
        "Encoded",
    ),
    (
        "power-of-two int1",
        lambda: dtypes.int1.encode(X, scaling=PerTensor(power_of_two=True)),
        E.ScalingError,
        "power_of_two",
    ),
    (
        "scaled bfloat16",
        lambda: dtypes.bfloat16.encode(X, scaling=PerTensor()),
        E.ScalingError,
        "exponent range",
    ),
]

# Each class also is the builtin code caught before the hierarchy existed.
BUILTIN = {
    E.FormatError: ValueError,
    E.ScalingError: ValueError,
    E.ShapeError: ValueError,
    E.RoundingError: ValueError,
    E.NonFiniteError: ValueError,
    E.PrecisionTypeError: TypeError,
}


@pytest.mark.parametrize(
    ("call", "error", "says"), [c[1:] for c in WRONG_CALLS], ids=[c[0] for c in WRONG_CALLS]
)
def test_wrong_call_raises_a_precise_error(call, error, says):
    with pytest.raises(error, match=re.escape(says)) as info:
        call()
    assert isinstance(info.value, dtypes.PrecisionError)
    assert isinstance(info.value, BUILTIN[error])


def test_error_classes_are_exported_and_share_one_base():
    for cls in BUILTIN:
        assert issubclass(cls, dtypes.PrecisionError)
        assert getattr(dtypes, cls.__name__) is cls


def test_scalings_normalise_numpy_integers_to_python_ints():
    # what `save` writes as JSON and `load` compares: plain ints and bools
    for s in (PerAxis(np.int64(1)), PerBlock(np.int32(16), axis=np.int64(0))):
        for field in ("axis", "size"):
            if hasattr(s, field):
                assert type(getattr(s, field)) is int
    assert PerAxis(np.int64(1)) == PerAxis(1)
    p = PerTensor(power_of_two=np.bool_(True))
    assert p.power_of_two is True
    assert p == PerTensor(power_of_two=True)


def test_nbytes_is_exact_python_integer_arithmetic():
    # a numpy int64 product wraps: (2**32) * (2**32) would be 0
    assert dtypes.int8.nbytes((2**32, 2**32)) == 2**64 + 4
    assert dtypes.int4.nbytes((2**40, 2**40 + 1)) == 2**40 * (2**39 + 1) + 4
    assert dtypes.float16.nbytes((2**62, 4)) == 2**62 * 4 * 2
    assert dtypes.int8.nbytes((3, 0)) == 4
    assert dtypes.int8.nbytes((np.int64(3), 5)) == 15 + 4
    assert dtypes.int8.nbytes((2**40, 3), PerAxis(0)) == 3 * 2**40 + 4 * 2**40
    # block counts are integer ceilings, exact past 2**53
    n = 2**60 + 1
    assert dtypes.int8.nbytes((n,), PerBlock(32)) == n + 4 * (n // 32 + 1)


def test_a_block_longer_than_its_axis_is_one_block():
    x = np.arange(10, dtype=np.float32)
    big = dtypes.int8.encode(x, scaling=PerBlock(2**64))
    whole = dtypes.int8.encode(x, scaling=PerBlock(10))
    np.testing.assert_array_equal(big.data, whole.data)
    np.testing.assert_array_equal(big.scale, whole.scale)
    assert dtypes.int8.nbytes((10,), PerBlock(2**64)) == 10 + 4


def test_encoded_repr_and_shape():
    enc = dtypes.int4.encode(np.ones((3, 5), np.float32))
    assert isinstance(enc, Encoded)
    assert enc.shape == (3, 5)
    assert enc.data.shape == (3, 3)
    assert "int4" in repr(enc)
    assert "(3, 5)" in repr(enc)
