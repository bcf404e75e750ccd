"""Float formats, bit for bit: ml_dtypes where it exists, the enumerated grid everywhere.

The input set of a format holds every representable value, every exact
midpoint between neighbours and the float32 values either side of both, the
overflow and underflow edges, ±0, ±inf, NaN and 10^5 random bit patterns.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from checks import (
    ALL_FLOATS,
    ML_DTYPES,
    REGISTRY_FLOATS,
    assert_covers,
    assert_same_floats,
    bits32,
    cached_input_set,
    cached_reference,
    encodable_inputs,
    fid,
    fills_its_bytes,
    reduced_float,
    registry,
    same_named_type,
)
from reference import MODES, code_values, grid, layout_of, max_value, pack, round_float

import dtypes
from dtypes import Encoded, FloatFormat

NATIVE = list(ML_DTYPES)


def _uint(nbits: int):
    return {8: np.uint8, 16: np.uint16, 32: np.uint32}[nbits]


@pytest.mark.parametrize("fmt", NATIVE, ids=fid)
def test_encode_is_bit_identical_to_ml_dtypes(fmt, eager_and_jit):
    x = cached_input_set(fmt)
    native = ML_DTYPES[fmt]
    with np.errstate(all="ignore"):
        expected = x.astype(native)
    got = np.asarray(eager_and_jit(lambda v: fmt.encode(v).data)(jnp.asarray(x)))
    assert got.dtype == np.dtype(native)
    u = _uint(np.dtype(native).itemsize * 8)
    want = expected.view(u)
    # numpy keeps a signaling NaN signaling; XLA quiets it (sets the top mantissa
    # bit). Only there may the bits differ, and only by that bit.
    xb = bits32(x)
    signaling = ((xb & 0x7F800000) == 0x7F800000) & ((xb & 0x7FFFFF) != 0) & ((xb & 0x400000) == 0)
    quiet = u(1 << (fmt.mantissa_bits - 1))
    want = np.where(signaling, want | quiet, want)
    bad = got.view(u) != want
    if bad.any():
        i = np.flatnonzero(bad)[:8]
        pytest.fail(
            f"{fmt.name}: {int(bad.sum())} codes differ from ml_dtypes; x bits "
            f"{[hex(b) for b in bits32(x[i])]}: expected {[hex(b) for b in want[i]]}"
            f", got {[hex(b) for b in got.view(u)[i]]}"
        )


@pytest.mark.parametrize("fmt", NATIVE, ids=fid)
def test_decode_of_every_code_equals_ml_dtypes(fmt, eager_and_jit):
    native = np.dtype(ML_DTYPES[fmt])
    codes = np.arange(2 ** (8 * native.itemsize), dtype=np.int64).astype(_uint(8 * native.itemsize))
    enc = Encoded(jnp.asarray(codes.view(native)), None, fmt, None)
    got = np.asarray(eager_and_jit(lambda e: e.format.decode(e))(enc))
    expected = bits32(codes.view(native).astype(np.float32))
    got = bits32(got)
    # Every bit, NaN payloads included, except the quiet bit of a signaling NaN:
    # numpy and XLA disagree on quieting one (each way, depending on the type).
    nan = ((expected & 0x7F800000) == 0x7F800000) & ((expected & 0x7FFFFF) != 0)
    quiet = np.uint32(0x400000)
    expected = np.where(nan, expected | quiet, expected)
    assert np.isnan(got.view(np.float32)[nan]).all(), "a NaN code did not decode to NaN"
    got = np.where(nan, got | quiet, got)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("fmt", ALL_FLOATS, ids=fid)
def test_decode_of_every_code_equals_the_bit_field_definition(fmt, eager_and_jit):
    """Every code in storage (native type, float32 container or packed uint8 codes)."""
    layout = layout_of(fmt)
    values = code_values(layout)  # value of each code, sign bit on top
    if fmt.container == np.dtype(np.float32):
        # no own codes: stored as float32 values on the grid
        finite = np.isfinite(values)
        data = jnp.asarray(values[finite].astype(np.float32))
        got = np.asarray(
            eager_and_jit(lambda e: e.format.decode(e))(Encoded(data, None, fmt, None))
        )
        assert_same_floats(got, values[finite], values[finite], fmt.name)
        return
    codes = np.arange(len(values), dtype=np.int64)
    if fmt.native_dtype is not None:
        data = codes.astype(_uint(8 * fmt.container.itemsize)).view(fmt.container)
        enc = Encoded(jnp.asarray(data), None, fmt, None)
    elif fmt.packed:
        data = pack(codes, fmt.code_bits)  # unsigned fields: codes are >= 0
        enc = Encoded(jnp.asarray(data), None, fmt, None, len(codes))
    else:
        enc = Encoded(jnp.asarray(codes.astype(np.uint8)), None, fmt, None)
    assert enc.shape == (len(codes),)
    got = np.asarray(eager_and_jit(lambda e: e.format.decode(e))(enc))
    assert_same_floats(got, values, codes.astype(np.float32), f"{fmt.name} decode", nan_sign=False)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ALL_FLOATS, ids=fid)
def test_round_matches_grid_search_reference(fmt, mode, eager_and_jit):
    x = encodable_inputs(fmt)
    expected = cached_reference(fmt, mode)
    got = eager_and_jit(lambda v: fmt.round(v, rounding=mode))(jnp.asarray(x))
    assert got.dtype == jnp.float32
    assert_same_floats(got, expected, x, f"{fmt.name} {mode}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ALL_FLOATS, ids=fid)
def test_encode_decode_matches_grid_search_reference(fmt, mode):
    """Storage holds exactly the rounded value (NaN excluded where the format has no NaN)."""
    x = encodable_inputs(fmt)
    expected = cached_reference(fmt, mode)
    # jit only: the eager path is the same code, checked by the round test above
    got = jax.jit(lambda v: fmt.encode(v, rounding=mode).decode())(jnp.asarray(x))
    assert_same_floats(got, expected, x, f"{fmt.name} {mode} encode/decode")


def test_tf32_grid_is_float32_with_13_low_bits_zero():
    g = grid(layout_of(dtypes.tf32), signed=True).astype(np.float32)
    assert g.size == 2**19 - 2 * 2**10 - 1  # 2**19 codes minus ±inf/NaN codes, one zero
    assert np.all(bits32(g) & 0x1FFF == 0)
    got = np.asarray(dtypes.tf32.round(jnp.asarray(g)))
    np.testing.assert_array_equal(bits32(got), bits32(g))


@pytest.mark.parametrize("fmt", [dtypes.float32], ids=fid)
def test_float32_round_is_identity(fmt, eager_and_jit):
    x = cached_input_set(dtypes.bfloat16)
    for mode in MODES:
        got = eager_and_jit(lambda v, mode=mode: fmt.round(v, rounding=mode))(jnp.asarray(x))
        finite = ~np.isnan(x)
        np.testing.assert_array_equal(bits32(got)[finite], bits32(x)[finite])
        assert np.isnan(np.asarray(got)[~finite]).all()


@pytest.mark.parametrize(
    ("custom", "builtin"),
    [
        (FloatFormat(5, 10), dtypes.float16),
        (FloatFormat(8, 7), dtypes.bfloat16),
        (FloatFormat(4, 3, finite=True), dtypes.float8_e4m3fn),
        (FloatFormat(5, 2), dtypes.float8_e5m2),
        (FloatFormat(8, 10), dtypes.tf32),
    ],
    ids=lambda f: f.name,
)
def test_layout_equals_builtin_and_agrees_bit_for_bit(custom, builtin):
    assert custom == builtin
    assert hash(custom) == hash(builtin)
    assert dataclasses.replace(custom, name="x") == builtin
    assert custom != dataclasses.replace(custom, saturate=True)
    x = jnp.asarray(cached_input_set(builtin))
    for mode in MODES:
        a = np.asarray(custom.round(x, rounding=mode))
        b = np.asarray(builtin.round(x, rounding=mode))
        np.testing.assert_array_equal(bits32(a), bits32(b))
    a, b = custom.encode(x).data, builtin.encode(x).data
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(
        np.asarray(a).view(_uint(a.dtype.itemsize * 8)),
        np.asarray(b).view(_uint(b.dtype.itemsize * 8)),
    )


# -- finfo-style attributes -------------------------------------------------


@pytest.mark.parametrize("fmt", ALL_FLOATS, ids=fid)
def test_finfo_attributes_match_the_enumerated_grid(fmt):
    layout = layout_of(fmt)
    g = grid(layout)
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    assert fmt.bits == 1 + e + m
    assert fmt.kind == "float"
    assert fmt.max == max_value(layout) == g[-1]
    assert fmt.smallest_subnormal == g[1]
    assert fmt.min_normal == 2.0 ** (1 - (2 ** (e - 1) - 1))
    if fmt.min_normal <= g[-1]:
        assert fmt.min_normal in set(g.tolist())
    one = np.searchsorted(g, 1.0)
    if one < len(g) - 1 and g[one] == 1.0:
        assert fmt.eps == g[one + 1] - 1.0
    assert fmt.has_inf == (not fmt.finite)
    # the largest value really is representable: rounding it is the identity
    assert float(fmt.round(jnp.float32(fmt.max))) == fmt.max
    assert float(fmt.round(jnp.float32(-fmt.max))) == -fmt.max


@pytest.mark.parametrize("fmt", NATIVE, ids=fid)
def test_finfo_attributes_match_ml_dtypes(fmt):
    fi = ml_dtypes.finfo(ML_DTYPES[fmt])
    assert fmt.max == float(fi.max)
    assert fmt.min_normal == float(fi.smallest_normal)
    assert fmt.smallest_subnormal == float(fi.smallest_subnormal)
    assert fmt.eps == float(fi.eps)
    assert fmt.bits == fi.bits
    assert fmt.mantissa_bits == fi.nmant
    assert fmt.exponent_bits == fi.nexp
    assert fmt.native_dtype == np.dtype(ML_DTYPES[fmt])
    assert fmt.container == np.dtype(ML_DTYPES[fmt])


@pytest.mark.parametrize("fmt", REGISTRY_FLOATS, ids=fid)
def test_registry_float_containers(fmt):
    """Storage: the numpy/ml_dtypes type of the format's name where that type fills its
    bytes; below 8 bits, codes packed into uint8; otherwise float32 values (tf32)."""
    if fills_its_bytes(fmt):
        expected, packed = np.dtype(same_named_type(fmt)), False
    elif fmt.bits < 8:
        expected, packed = np.dtype(np.uint8), True
    else:
        expected, packed = np.dtype(np.float32), False
    assert fmt.container == expected
    assert fmt.packed == packed
    assert not fmt.is_full_precision


@pytest.mark.parametrize("fmt", [f for f in ALL_FLOATS if not f.nan], ids=fid)
def test_nan_into_a_format_without_nan_is_refused_eagerly(fmt):
    x = jnp.asarray([1.0, 2.0, np.nan, 0.5], jnp.float32)
    with pytest.raises(ValueError, match=f"cannot encode NaN into {fmt.name}"):
        fmt.encode(x)


def test_full_precision_formats():
    assert dtypes.float32.is_full_precision
    assert dtypes.float64.is_full_precision
    assert dtypes.float32.max == float(np.finfo(np.float32).max)
    assert dtypes.float64.max == float(np.finfo(np.float64).max)
    assert dtypes.float32.eps == float(np.finfo(np.float32).eps)
    assert dtypes.float32.smallest_subnormal == float(np.finfo(np.float32).smallest_subnormal)


# -- stochastic rounding ------------------------------------------------------

# every reduced float of the registry, and an IEEE-style custom layout
STOCHASTIC_FORMATS = [*REGISTRY_FLOATS, FloatFormat(3, 2)]


def _between_neighbours(fmt, n: int, seed: int) -> np.ndarray:
    """Finite in-range float32 values strictly between grid neighbours, normals and subnormals."""
    rng = np.random.default_rng(seed)
    g = grid(layout_of(fmt))
    tiny = float(np.finfo(np.float32).tiny)
    # neighbour pairs whose gap holds normal float32 values (XLA flushes the rest)
    lo_idx = rng.integers(0, len(g) - 1, n)
    lo, hi = g[lo_idx], g[lo_idx + 1]
    frac = rng.choice([1 / 3, 0.5, 0.1, 0.9, 1 / 64, 0.75], n)
    x = (lo + frac * (hi - lo)).astype(np.float32)
    x = x[(x > lo) & (x < hi) & (x >= tiny)]
    sign = rng.choice([-1.0, 1.0], x.size).astype(np.float32)
    return x * sign


@pytest.mark.parametrize("fmt", STOCHASTIC_FORMATS, ids=fid)
def test_stochastic_is_a_neighbour_with_the_right_frequency(fmt, eager_and_jit):
    layout = layout_of(fmt)
    x = _between_neighbours(fmt, 48, seed=fmt.bits)
    down, up = round_float(x, layout, "down"), round_float(x, layout, "up")
    p_up = (x.astype(np.float64) - down) / (up - down)  # exact probability of rounding up
    n_draws = 2000
    keys = jax.random.split(jax.random.key(1234), n_draws)
    draws = eager_and_jit(
        lambda ks, v: jax.vmap(lambda k: fmt.round(v, rounding="stochastic", key=k))(ks)
    )(keys, jnp.asarray(x))
    draws = np.asarray(draws, np.float64)
    is_down, is_up = draws == down, draws == up
    assert np.all(is_down | is_up), "stochastic rounding returned a value that is not a neighbour"
    freq = is_up.mean(axis=0)
    sigma = np.sqrt(p_up * (1 - p_up) / n_draws)
    z = np.abs(freq - p_up) / sigma
    assert z.max() <= 5, f"worst x={x[z.argmax()]}: p={p_up[z.argmax()]}, freq={freq[z.argmax()]}"


@pytest.mark.parametrize("fmt", STOCHASTIC_FORMATS, ids=fid)
def test_stochastic_frequency_within_one_tensor(fmt):
    """One key, many elements: the per-element bits are independent draws too."""
    x = _between_neighbours(fmt, 16, seed=7)
    layout = layout_of(fmt)
    down, up = round_float(x, layout, "down"), round_float(x, layout, "up")
    p_up = (x.astype(np.float64) - down) / (up - down)
    n = 4096
    tiled = jnp.asarray(np.repeat(x[:, None], n, axis=1))
    out = np.asarray(fmt.round(tiled, rounding="stochastic", key=jax.random.key(5)), np.float64)
    assert np.all((out == down[:, None]) | (out == up[:, None]))
    freq = (out == up[:, None]).mean(axis=1)
    sigma = np.sqrt(p_up * (1 - p_up) / n)
    assert np.all(np.abs(freq - p_up) <= 5 * sigma), (x, p_up, freq)


@pytest.mark.parametrize("fmt", STOCHASTIC_FORMATS, ids=fid)
def test_stochastic_is_deterministic_per_key_and_exact_values_stay(fmt, eager_and_jit):
    pool = encodable_inputs(fmt)
    x = jnp.asarray(pool[np.random.default_rng(0).choice(pool.size, 20000, replace=False)])
    f = eager_and_jit(lambda v, k: fmt.round(v, rounding="stochastic", key=k))
    a, b = np.asarray(f(x, jax.random.key(3))), np.asarray(f(x, jax.random.key(3)))
    c = np.asarray(f(x, jax.random.key(4)))
    np.testing.assert_array_equal(bits32(a), bits32(b))
    assert np.any(bits32(a) != bits32(c)), "a different key changed nothing"
    # exactly representable inputs (and ±0, ±inf, NaN) never move
    layout = layout_of(fmt)
    xs = np.asarray(x)
    exact = round_float(xs, layout, "down") == round_float(xs, layout, "up")
    exact &= np.abs(xs) <= fmt.max
    assert_same_floats(a[exact], xs[exact], xs[exact], f"{fmt.name} stochastic on grid values")


def takes_stochastic(f) -> bool:
    """Every entry but E8M0, which rounds to nearest only (a scale format), and float64,
    which encodes only with 64-bit JAX."""
    return f.kind != "scale" and f.bits <= 32


@pytest.mark.parametrize("fmt", registry(takes_stochastic), ids=fid)
def test_stochastic_without_key_is_refused(fmt):
    with pytest.raises(ValueError, match="key"):
        fmt.encode(jnp.ones(64), rounding="stochastic")
    with pytest.raises(ValueError, match="key"):
        fmt.round(jnp.ones(64), rounding="stochastic")


def test_the_per_format_tests_run_over_every_registry_entry_their_rule_admits():
    for test in (
        test_decode_of_every_code_equals_the_bit_field_definition,
        test_round_matches_grid_search_reference,
        test_encode_decode_matches_grid_search_reference,
        test_finfo_attributes_match_the_enumerated_grid,
        test_registry_float_containers,
        test_stochastic_is_a_neighbour_with_the_right_frequency,
        test_stochastic_frequency_within_one_tensor,
        test_stochastic_is_deterministic_per_key_and_exact_values_stay,
    ):
        assert_covers(test, reduced_float)
    for test in (
        test_encode_is_bit_identical_to_ml_dtypes,
        test_decode_of_every_code_equals_ml_dtypes,
        test_finfo_attributes_match_ml_dtypes,
    ):
        assert_covers(test, fills_its_bytes)
    assert_covers(test_stochastic_without_key_is_refused, takes_stochastic)


def test_unknown_rounding_mode_lists_the_modes():
    with pytest.raises(ValueError, match="nearest_even") as info:
        dtypes.bfloat16.round(jnp.ones(2), rounding="nearest")
    for mode in dtypes.ROUNDING_MODES:
        assert mode in str(info.value)
    assert "'nearest'" in str(info.value)
