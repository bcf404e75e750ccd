"""The strategies of `precision.testing`, checked against independent arithmetic.

Expected values come from ml_dtypes casts and from exact float64/`fractions`
arithmetic written out here, never from the strategies' own helpers.
"""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

import dtypes
from dtypes import FloatFormat, IntFormat
from precision import Tensor
from precision.testing import (
    arrays,
    formats,
    keys,
    representable,
    roundings,
    scalings,
    tensors,
    values,
)
from precision.testing._plugin import selected_formats

CUSTOM = [
    FloatFormat(3, 2),
    FloatFormat(2, 1, finite=True),
    FloatFormat(6, 5, saturate=True),
    FloatFormat(4, 0, finite=True, nan=False),
    FloatFormat(7, 0, finite=True, nan=False),
]
# The registry's integer and float formats, named encodings included (float64 rounds
# without 64-bit JAX only as the identity on float32 data; encode needs x64).
INT_FORMATS = selected_formats(kinds="int")
FLOATS_32 = selected_formats(kinds="float", max_bits=32)

DETERMINISTIC = settings(database=None, derandomize=True, deadline=None)

# The properties below take the plugin's `fmt`: every entry of dtypes.REGISTRY that the
# strategies draw from (float and integer formats; `arrays`/`values` have no model of a
# code book, zero-point integers or E8M0, whose own tests are tests/dtypes/). A named
# encoding (dtypes.ENCODINGS) runs each with a fifth of the profile's examples: its
# element grid is one of the formats' or a plain layout, and each adds compiles.
STRATEGY_KINDS = ("float", "int")
ENCODING_EXAMPLES = max(10, settings.default.max_examples // 5)


def _examples(fmt) -> settings:
    """The settings of a per-format property: the profile's, fewer for a named encoding."""
    if fmt.name in dtypes.ENCODINGS:
        return settings(max_examples=ENCODING_EXAMPLES)
    return settings()


def _skip_scaled_floats(fmt) -> None:
    """`representable=True` draws a float format's element grid, which a scaled float
    encoding does not keep: its scale moves a block onto the grid by the block's absmax."""
    if fmt.kind == "float" and fmt.default_scaling() is not None:
        pytest.skip(
            f"{fmt.name} scales each block onto its element grid by the block's absmax (MX: "
            "a power of two, clipping a scaled absmax past the element max, as e4m3's "
            "1.875*2**8; NVFP4: absmax/6 under a tensor scale), so arrays drawn on the "
            "element grid need not round to themselves; tests/dtypes/test_mx_nvfp4.py "
            "checks its rounding against the OCP MX and NVFP4 rules"
        )


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


def _round(fmt, x, mode, key):
    return np.asarray(fmt.round(x, rounding=mode, key=key if mode == "stochastic" else None))


# -- representable ------------------------------------------------------------


# One shape per test keeps XLA compiling once per (format, mode), not per example.
@pytest.mark.formats(kinds=STRATEGY_KINDS)
def test_representable_arrays_round_to_themselves_in_every_mode(fmt):
    _skip_scaled_floats(fmt)

    @_examples(fmt)
    @given(data=st.data(), mode=roundings(), key=keys())
    def check(data, mode, key):
        x = data.draw(arrays(fmt, (4, 8), representable=True))
        np.testing.assert_array_equal(_bits(_round(fmt, x, mode, key)), _bits(x))

    check()


@pytest.mark.formats(kinds="int")
def test_representable_int_scalars_round_to_themselves_in_every_mode(fmt):
    # A lone value is its own scaling group: only 0 and ±qmax·2**k survive.
    @_examples(fmt)
    @given(data=st.data(), mode=roundings(), key=keys())
    def check(data, mode, key):
        x = data.draw(representable(fmt))
        assert _bits(_round(fmt, x, mode, key)) == _bits(x)

    check()


@pytest.mark.formats(kinds="float")  # integer grids depend on a scale: the test above
@given(data=st.data())
def test_representable_float_scalars_are_grid_values(fmt, data):
    # Checked by exact arithmetic: an integer multiple of the spacing, within max.
    # A scaled float encoding's scalars are drawn from its element grid.
    x = float(data.draw(representable(fmt)))
    grid = fmt if fmt.bits <= 32 else dtypes.float32
    assert abs(x) <= grid.max
    assert x == 0 or (Fraction(abs(x)) / _spacing(grid, abs(x))).denominator == 1


@pytest.mark.parametrize("fmt", CUSTOM, ids=repr)
@given(data=st.data(), mode=roundings(), key=keys())
def test_representable_custom_formats_round_to_themselves(fmt, data, mode, key):
    x = data.draw(arrays(fmt, (4, 8), representable=True))
    np.testing.assert_array_equal(_bits(_round(fmt, x, mode, key)), _bits(x))


@pytest.mark.formats(kinds="float", max_bits=16)
def test_representable_values_survive_the_ml_dtypes_cast(fmt):
    # An independent reference: a value is on the grid iff the native cast keeps it.
    @_examples(fmt)
    @given(data=st.data())
    def check(data):
        x = data.draw(arrays(fmt, 16, representable=True))
        native = fmt.native_dtype or np.float32
        back = x.astype(native).astype(np.float32)
        if fmt.name == "tf32":  # float32 container: the low 13 mantissa bits must be zero
            assert np.all(_bits(x) & 0x1FFF == 0)
        np.testing.assert_array_equal(_bits(back), _bits(x))

    check()


@given(st.data())
def test_representable_without_subnormals_has_none(data):
    fmt = data.draw(formats(kinds="float", max_bits=32, include_custom=True))
    x = data.draw(representable(fmt, allow_subnormal=False))
    assert x == 0 or abs(float(x)) >= fmt.min_normal


# -- values: every hard-case class, with a measurable frequency -------------------


def _spacing(fmt: FloatFormat, a: float) -> Fraction:
    """The grid spacing at |a| (>0), as an exact power of two."""
    _, e = math.frexp(a)  # a = f * 2**e, f in [0.5, 1)
    return Fraction(2) ** (max(e - 1, fmt.emin) - fmt.mantissa_bits)


def _is_tie(fmt: FloatFormat, a: float) -> bool:
    if a == 0 or not math.isfinite(a) or a >= fmt.max:
        return False
    units = Fraction(a) / _spacing(fmt, a)
    return units.denominator == 2


def classify_float(fmt: FloatFormat, v: float) -> str:
    """The hard-case class of a value, by exact arithmetic on the format's parameters."""
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf"
    a = abs(v)
    if a == 0:
        return "zero"
    if a == fmt.min_normal:
        return "min_normal"
    if a == fmt.max:
        return "max"
    if a > fmt.max:
        return "beyond_max"
    if a < fmt.min_normal and (Fraction(a) / Fraction(fmt.smallest_subnormal)).denominator == 1:
        return "subnormal"
    if _is_tie(fmt, a):
        return "tie"
    f32 = np.float32(a)
    neighbours = (np.nextafter(f32, np.float32(0)), np.nextafter(f32, np.float32(np.inf)))
    if any(_is_tie(fmt, float(n)) for n in neighbours):
        return "beside_tie"
    if (Fraction(a) / _spacing(fmt, a)).denominator == 1:
        return "grid"
    return "other"


FLOAT_CLASSES = [
    "zero",
    "subnormal",
    "min_normal",
    "max",
    "beyond_max",
    "tie",
    "beside_tie",
    "grid",
    "nan",
    "inf",
    "other",
]


def _collect(strategy, n_examples: int) -> list:
    """`n_examples` draws of `strategy`, through `@given` (no `.example()`)."""
    seen: list = []

    @settings(
        DETERMINISTIC,
        max_examples=n_examples,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(strategy)
    def draw(x):
        seen.append(x)

    draw()
    return seen


N_ARRAYS = 100


def _n_arrays(fmt) -> int:
    """How many arrays the float frequency test draws: half as many for a named encoding
    (its element grid is a plain layout's; each array costs exact arithmetic per element)."""
    return N_ARRAYS // 2 if fmt.name in dtypes.ENCODINGS else N_ARRAYS


@pytest.mark.parametrize("fmt", [*FLOATS_32, FloatFormat(3, 2)], ids=lambda f: f.name)
def test_values_hit_every_hard_case_class(fmt):
    n = _n_arrays(fmt)
    drawn = _collect(arrays(fmt, 32), n)
    per_array = [Counter(classify_float(fmt, float(v)) for v in x.ravel()) for x in drawn]
    expected = set(FLOAT_CLASSES)
    if fmt.mantissa_bits == 23:
        expected -= {"tie", "beside_tie"}  # float32 has no midpoints in float32
    if fmt == dtypes.float32:
        expected -= {"beyond_max", "other"}  # every finite float32 is on its own grid
    # Each class turns up in at least 3% of the arrays ...
    present = Counter(c for counts in per_array for c in counts)
    rare = {c: present[c] for c in expected if present[c] < 0.03 * n}
    assert not rare, f"{fmt.name}: classes in too few of {n} arrays: {rare} ({present})"
    # ... and hard cases are most of the elements.
    total = sum(per_array, Counter())
    assert total["other"] <= 0.5 * sum(total.values()), total


def _int_class(fmt: IntFormat, v: float, s: float) -> str:
    """The class of `v` in an array whose scale is `s` (its absmax is qmax·s)."""
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf"
    if v == 0:
        return "zero"
    units = Fraction(v) / Fraction(s)
    if abs(units) == fmt.qmax:
        return "anchor"
    if abs(units) < fmt.qmax and units.denominator == 1:
        return "code"
    if abs(units) < fmt.qmax and units.denominator == 2:
        return "tie"
    f32 = np.float32(v)
    with np.errstate(over="ignore"):
        beside = (np.nextafter(f32, np.float32(-np.inf)), np.nextafter(f32, np.float32(np.inf)))
    for n in beside:
        if not np.isfinite(n):
            continue
        u = Fraction(float(n)) / Fraction(s)
        if abs(u) < fmt.qmax and u.denominator == 2:
            return "beside_tie"
    return "other"


def _anchor_scale(fmt: IntFormat, x: np.ndarray) -> float | None:
    """The power-of-two scale s of an array holding ±qmax·s (2**-8 <= s <= 2**8), if any."""
    for v in x.ravel():
        if np.isfinite(v) and v != 0:
            s = Fraction(abs(float(v))) / fmt.qmax
            if s.numerator == 1 or s.denominator == 1:
                k = math.log2(s)
                if k == int(k) and -8 <= k <= 8:
                    return float(s)
    return None


@pytest.mark.parametrize("fmt", INT_FORMATS, ids=lambda f: f.name)
def test_int_values_hit_every_hard_case_class(fmt):
    drawn = _collect(arrays(fmt, 32), N_ARRAYS)
    present: Counter = Counter()
    anchored = 0
    for x in drawn:
        s = _anchor_scale(fmt, x)
        if s is None:
            continue
        anchored += 1
        present.update({_int_class(fmt, float(v), s) for v in x.ravel()})
    expected = {"zero", "anchor", "tie", "beside_tie", "nan", "inf", "other"}
    if fmt.qmax > 1:
        expected.add("code")
    assert anchored >= N_ARRAYS // 4, anchored
    rare = {c: present[c] for c in expected if present[c] < 0.03 * anchored}
    assert not rare, f"{fmt.name}: classes in too few of {anchored} arrays: {rare} ({present})"


# -- values: flags and bounds -------------------------------------------------


@pytest.mark.formats(kinds=STRATEGY_KINDS)
def test_flags_and_bounds_are_respected(fmt):
    _examples(fmt)(given(data=st.data())(_flags_and_bounds_are_respected))(fmt)


def _flags_and_bounds_are_respected(fmt, data):
    bound = st.none() | st.floats(-1e6, 1e6, width=32, allow_subnormal=False)
    lo, hi = data.draw(bound), data.draw(bound)
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    tiny = fmt.min_normal if fmt.kind == "float" and fmt.bits <= 32 else 2.0**-126
    kwargs = dict(min_value=lo, max_value=hi, allow_nan=False, allow_infinity=False)
    a, b = (-math.inf if lo is None else lo), (math.inf if hi is None else hi)
    if fmt.kind == "float" and not (a <= 0 <= b or b >= tiny or a <= -tiny):
        with pytest.raises(ValueError, match="only subnormal values"):
            arrays(fmt, 16, allow_subnormal=False, **kwargs)
        return
    strategy = arrays(fmt, 16, allow_subnormal=False, **kwargs)
    x = data.draw(strategy).astype(np.float64)
    assert x.dtype == np.float64
    assert np.all(np.isfinite(x))
    assert np.all((x == 0) | (np.abs(x) >= tiny)), x
    if lo is not None:
        assert np.all(x >= lo), (lo, x)
    if hi is not None:
        assert np.all(x <= hi), (hi, x)


@pytest.mark.parametrize("fmt", CUSTOM, ids=repr)
@given(data=st.data())
def test_custom_format_values_without_nan_inf(fmt, data):
    x = data.draw(values(fmt, allow_nan=False, allow_infinity=False))
    assert isinstance(x, np.float32)
    assert np.isfinite(x)


# Four bounds for every format: a quarter of the profile's examples each (ci 25, hunt 250).
@pytest.mark.formats(kinds=STRATEGY_KINDS)
@pytest.mark.parametrize(("lo", "hi"), [(1.0, 1024.0), (-6.0, -0.5), (0.0, 0.0), (-3.0, 2.0)])
def test_representable_arrays_respect_their_bounds(fmt, lo, hi):
    _skip_scaled_floats(fmt)
    examples = max(10, settings.default.max_examples // 4)
    if fmt.name in dtypes.ENCODINGS:
        examples = max(5, ENCODING_EXAMPLES // 4)
    check = given(data=st.data())(_representable_arrays_respect_their_bounds)
    settings(max_examples=examples)(check)(fmt, lo=lo, hi=hi)


def _representable_arrays_respect_their_bounds(fmt, data, lo, hi):
    # 300 of 300 draws fell outside [1, 1024] before: representable=True ignored them
    refused = None
    try:
        strategy = arrays(fmt, (4, 8), representable=True, min_value=lo, max_value=hi)
    except ValueError as err:  # a format with no grid value (or absmax) inside: said so
        refused = str(err)
    if refused is not None:
        assert "widen the bounds" in refused
        return
    x = data.draw(strategy)
    assert np.all((x >= lo) & (x <= hi)), (lo, hi, x)
    np.testing.assert_array_equal(np.asarray(fmt.round(x)), x)


def test_bounds_that_hold_no_value_are_refused():
    with pytest.raises(ValueError, match="bound no value"):
        values(dtypes.bfloat16, min_value=2.0, max_value=1.0)


# -- shrinking ----------------------------------------------------------------

FIND = settings(database=None, derandomize=True, max_examples=500)


@pytest.mark.parametrize("fmt", [dtypes.bfloat16, dtypes.float8_e5m2, dtypes.int4], ids=str)
def test_values_shrink_to_zero(fmt):
    assert find(values(fmt), lambda x: True, settings=FIND) == 0


def test_values_shrink_to_a_small_simple_counterexample():
    # Any value of at least 1 falsifies "x < 1"; the shrunk one is 1.0 itself or close.
    x = find(values(dtypes.bfloat16), lambda x: x >= 1, settings=FIND)
    assert 1 <= x <= 2


@pytest.mark.parametrize("fmt", [dtypes.bfloat16, dtypes.float8_e4m3fn], ids=str)
def test_arrays_shrink_to_small_simple_arrays(fmt):
    # "Two elements of magnitude >= 1": the shrunk array holds nothing bigger than
    # needed, in at most two distinct values (zeros and ones, or one repeated value).
    x = find(arrays(fmt, 8), lambda a: np.sum(np.abs(a) >= 1) >= 2, settings=FIND)
    assert np.all(np.abs(x) <= 2), x
    assert len(set(np.abs(x).tolist())) <= 2, x


# -- formats, roundings, scalings, keys ---------------------------------------


@given(data=st.data())
def test_formats_respect_kinds_and_bits(data):
    kinds = data.draw(st.sampled_from([("float",), ("int",), ("float", "int")]))
    lo = data.draw(st.integers(1, 40))
    hi = data.draw(st.integers(lo, 64))
    custom = data.draw(st.booleans())
    x64 = jax.config.read("jax_enable_x64")  # float64 is drawn only with 64-bit JAX
    registry = [
        f
        for f in dtypes.FORMATS.values()
        if f.kind in kinds and lo <= f.bits <= hi and (x64 or f.name != "float64")
    ]
    custom_fits = custom and "float" in kinds and lo <= 32 and hi >= 3
    if not registry and not custom_fits:
        with pytest.raises(ValueError, match="no format has kind"):
            formats(kinds, lo, hi, include_custom=custom)
        return
    fmt = data.draw(formats(kinds, lo, hi, include_custom=custom))
    assert fmt.kind in kinds
    assert lo <= fmt.bits <= hi
    if not custom:
        assert fmt in registry


@settings(max_examples=10)
@given(formats(kinds="float", include_custom=True, max_bits=32))
def test_custom_formats_are_supported_layouts(fmt):
    assert 2 <= fmt.exponent_bits <= 8
    assert 0 <= fmt.mantissa_bits <= 23
    assert fmt.bits == 1 + fmt.exponent_bits + fmt.mantissa_bits
    # The layout works end to end: its largest value encodes and decodes to itself.
    top = np.float32(fmt.max)
    assert np.asarray(fmt.encode(top).decode()) == top


def test_formats_refuses_unknown_kinds():
    with pytest.raises(ValueError, match="'float' or 'int'"):
        formats("complex")


def test_roundings_cover_the_modes():
    seen = set(_collect(roundings(), 60))
    assert seen == set(dtypes.ROUNDING_MODES)
    seen = set(_collect(roundings(deterministic_only=True), 60))
    assert seen == set(dtypes.ROUNDING_MODES) - {"stochastic"}


def test_scalings_fit_the_rank_and_the_format(fmt):
    _examples(fmt)(given(data=st.data())(_scalings_fit_the_rank_and_the_format))(fmt)


def _scalings_fit_the_rank_and_the_format(fmt, data):
    ndim = data.draw(st.integers(0, 3))
    scaling = data.draw(scalings(fmt, ndim=ndim))
    if fmt.kind in ("int", "uint", "codebook"):
        assert scaling is not None  # they always scale
    if fmt.kind in ("uint", "codebook"):  # absmax scales only, held at float32 or 16 bits
        assert not scaling.power_of_two
        assert scaling.scale_format in ("float32", "bfloat16", "float16")
    if fmt.kind == "scale":
        assert scaling is None  # E8M0 takes no scaling of its own
    shape = data.draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim).map(tuple))
    if scaling is not None and ndim:
        scaling.validate(shape)  # raises ValueError when the scaling does not fit
        assert len(scaling.scale_shape(shape)) == ndim


@settings(max_examples=12)
@given(data=st.data())
def test_scalings_encode(data):
    fmt = data.draw(formats(max_bits=32))
    scaling = data.draw(scalings(fmt, ndim=2))
    x = data.draw(arrays(fmt, (4, 8), allow_nan=False, allow_infinity=False))
    enc = fmt.encode(x, scaling=scaling)
    assert enc.scaling == (scaling if scaling is not None else fmt.default_scaling())


@given(keys())
def test_keys_are_jax_keys(key):
    assert jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)


# -- tensors ------------------------------------------------------------------


@settings(max_examples=6)
@given(data=st.data())
def test_tensors_are_stored_in_the_format(data):
    fmt = data.draw(formats(max_bits=32))
    scaling = data.draw(scalings(fmt, ndim=2))
    t = data.draw(tensors(fmt, shape=(3, 4), scaling=scaling))
    assert isinstance(t, Tensor)
    assert t.format == fmt
    assert t.shape == (3, 4)
    logical = np.asarray(t)
    assert logical.dtype == np.float32
    if fmt.kind == "float" and scaling is None and fmt.native_dtype is not None:
        # Unscaled storage holds grid values: the native cast keeps every one.
        back = logical.astype(fmt.native_dtype).astype(np.float32)
        np.testing.assert_array_equal(_bits(back), _bits(logical))


@settings(max_examples=5)
@given(tensors(shape=(2, 3)))
def test_tensors_default_to_every_format_but_float64(t):
    assert isinstance(t, Tensor)
    assert t.format.bits <= 32
