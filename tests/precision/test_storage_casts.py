"""A float32 value stored in a narrow float's container: one conversion, not two.

`_storage.encode_values` stores an unscaled bfloat16, float16 or float8 value with
`dtypes.astype(x)` where it once rounded (`fmt.round`) and then cast the rounded value:
the conversion is the same rounding, so the bits must be those of the rounding, for every
float32 (all 2**32 patterns under the hunt profile; ml_dtypes' conversion on the ties,
every code and random patterns by default, under the default and the fast-math XLA
flags), in and out of `jit`, with `Format.round`'s straight-through gradient (zero where
the value overflowed) at every one of those values.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from sampling import HUNT

import dtypes
import precision

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dtypes"))
from backend_bits import FAST_MATH_FLAGS, run_under_flags

BYTES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3", "float8_e3m4")
NAMES = ("bfloat16", "float16", *BYTES)
ROOT = Path(__file__).resolve().parents[2]


def _dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name, None) or name)


def _bits(dtype: np.dtype) -> type:
    return np.uint8 if dtype.itemsize == 1 else np.uint16


def _values(dtype: np.dtype) -> np.ndarray:
    """Every code's value and every tie between neighbouring codes, with their float32
    neighbours, random finite patterns and ±inf, both signs."""
    half = 1 << (dtype.itemsize * 8 - 1)
    with np.errstate(invalid="ignore"):
        codes = np.arange(half, dtype=_bits(dtype)).view(dtype).astype(np.float64)
    finite = np.sort(codes[np.isfinite(codes)])
    centres = np.concatenate([finite, (finite[1:] + finite[:-1]) / 2]).astype(np.float32)
    bits = centres.view(np.uint32).astype(np.int64)[:, None] + np.arange(-1, 2)
    rng = np.random.default_rng(9).integers(0, 0x7F800000, 1 << 14, dtype=np.int64)
    mags = np.concatenate([bits.ravel(), rng, [0x7F800000]]).astype(np.uint32)
    return np.concatenate([mags, mags | np.uint32(0x80000000)]).view(np.float32)


def _stored_bits(name: str, x: np.ndarray) -> list[np.ndarray]:
    """The bits `to_reduced_precision(name)` stores for `x`, jitted and eagerly."""
    store = lambda v: precision.Tensor(v).to_reduced_precision(name).encoded.data
    out = []
    for run in (jax.jit(store), store):
        got = np.asarray(run(jnp.asarray(x)))
        assert got.dtype == _dtype(name)
        out.append(got.view(_bits(got.dtype)))
    return out


def _reference_bits(name: str, x: np.ndarray) -> np.ndarray:
    """ml_dtypes' conversion, NaN written as the quiet NaN of its sign (float16 keeping
    the payload's top bits, as XLA's conversion and `fmt.encode` do; numpy's keeps a
    signaling NaN signaling)."""
    dtype = _dtype(name)
    bits, width = _bits(dtype), dtype.itemsize * 8
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(dtype).view(bits)
    quiet = np.array(np.nan, dtype).view(bits) & bits((1 << (width - 1)) - 1)
    if name == "float16":
        payload = ((x.view(np.uint32) & np.uint32(0x7FFFFF)) >> 13).astype(bits)
        quiet = quiet | payload
    sign = np.signbit(x).astype(bits) << bits(width - 1)
    return np.where(np.isnan(x), quiet | sign, want)


def _inputs(name: str) -> np.ndarray:
    x = _values(_dtype(name))
    nans = np.uint32([0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0x7FC02000, 0xFFA00000])
    x = np.concatenate([x, nans.view(np.float32)])
    return x[np.isfinite(x)] if not dtypes.get(name).has_inf else x


@pytest.mark.parametrize("name", NAMES)
def test_stored_bits_are_ml_dtypes_conversion(name):
    x = _inputs(name)
    for got in _stored_bits(name, x):
        np.testing.assert_array_equal(got, _reference_bits(name, x))


@pytest.mark.parametrize("flags", ["", FAST_MATH_FLAGS], ids=["default", "fast-math"])
def test_stored_bits_are_ml_dtypes_conversion_under_any_flags(flags):
    """The same comparison in a fresh process under XLA's flags: the fast-math ones assume
    no NaN or inf and flush subnormals, and the stored bits must not move."""
    code = (
        "from test_storage_casts import NAMES, _inputs, _reference_bits, _stored_bits\n"
        "for name in NAMES:\n"
        "    x = _inputs(name)\n"
        "    for got in _stored_bits(name, x):\n"
        "        assert (got == _reference_bits(name, x)).all(), name\n"
    )
    here = Path(__file__).resolve()
    run_under_flags(code, flags, [here.parent, here.parents[1]])


@pytest.mark.parametrize("name", NAMES)
def test_storing_takes_one_conversion_on_a_cpu(name):
    """No rounding pass before the conversion, and for the one-byte floats no conversion
    of XLA's into the byte (`dtypes.astype` writes it from the bits): the compiled
    program holds neither."""
    fmt = dtypes.get(name)
    store = jax.jit(lambda v: precision.Tensor(v).to_reduced_precision(name).encoded.data)
    hlo = store.lower(jax.ShapeDtypeStruct((64, 32), jnp.float32)).compile().as_text()
    native = np.dtype(fmt.container).name.replace("float8_", "f8")
    if name in BYTES:
        converts = [
            line for line in hlo.splitlines() if f"= {native}[" in line and " convert(" in line
        ]
        assert not converts
    assert "reduce-precision(" not in hlo
    assert hlo.count(" fusion(") <= 1, hlo  # (one pass over the values)


@pytest.mark.parametrize("name", NAMES)
def test_the_stored_value_has_the_rounding_s_straight_through_gradient(name):
    """`Format.round`'s derivative at every value: 1 where the value is in range, 0 where
    it overflowed (to inf, to NaN, or saturating past the largest value), at inf and NaN."""
    fmt = dtypes.get(name)
    x = jnp.asarray(np.concatenate([_values(_dtype(name)), [np.nan, 3e38, -3.4e38]]))
    stored = lambda v: precision.Tensor(v).to_reduced_precision(name)
    weights = jnp.arange(x.size, dtype=jnp.float32) % 7
    loss = lambda v: (precision.to_full_precision(stored(v)) * weights).sum()
    want = jax.grad(lambda v: (fmt.round(v) * weights).sum())(x)
    assert (want == 0).any()  # (both kinds of value are there)
    assert (want != 0).any()
    for grad in (jax.grad(loss), jax.jit(jax.grad(loss))):
        np.testing.assert_array_equal(np.asarray(grad(x)), np.asarray(want))


@pytest.mark.skipif(not HUNT, reason="all 2**32 float32 patterns: minutes; hunt profile")
def test_the_conversion_is_the_rounding_for_every_float32():
    chunk = 1 << 24
    fmts = [dtypes.get(n) for n in NAMES]

    @jax.jit
    def wrong(start):
        y = lax.bitcast_convert_type(start + lax.iota(jnp.uint32, chunk), jnp.float32)
        counts = []
        for f in fmts:
            bits = jnp.uint8 if f.container.itemsize == 1 else jnp.uint16
            a = lax.bitcast_convert_type(f.round(y).astype(f.container), bits)
            b = lax.bitcast_convert_type(dtypes.astype(y, f.container), bits)
            # (a float16 NaN keeps its payload's top bits in the one conversion)
            nan = jnp.isnan(y) if f.container == np.float16 else jnp.zeros(y.shape, bool)
            counts.append(jnp.sum((a != b) & ~nan))
        return jnp.stack(counts)

    total = sum(np.asarray(wrong(jnp.uint32(c * chunk))) for c in range(1 << 8))
    assert not np.any(total), dict(zip(NAMES, total.tolist(), strict=True))


def _operands(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Two square float32 arrays on `name`'s grid whose sums round (ties among them) and
    overflow; no subnormal sums (XLA:CPU flushes them, numpy does not)."""
    rng = np.random.default_rng(11)
    top = float(dtypes.get(name).max)
    x = (rng.standard_normal((48, 48)) * np.float32(top / 8)).astype(np.float32)
    x[0, :8] = top
    grid = lambda v: v.astype(_dtype(name)).astype(np.float32)
    return grid(x), grid(x[::-1] * np.float32(0.75))


@pytest.mark.parametrize("name", NAMES)
def test_a_result_is_stored_by_one_conversion_of_what_the_walk_rounded(name):
    """`Tensor + Tensor` stores the sum with one conversion (`_compute.Rounded`): the bits
    of ml_dtypes' conversion of numpy's float32 sum, jitted and eagerly; no rounding pass
    of XLA's in the program; and a transposed result (the record kept by the move, the
    value not) the transpose of those bits."""
    x, y = _operands(name)
    a = precision.Tensor(x).to_reduced_precision(name)
    b = precision.Tensor(y).to_reduced_precision(name)
    with np.errstate(over="ignore"):
        want = _reference_bits(name, x + y)
    bits = lambda t: np.asarray(t.encoded.data).view(_bits(_dtype(name)))
    for add in (lambda p, q: p + q, jax.jit(lambda p, q: p + q)):
        np.testing.assert_array_equal(bits(add(a, b)), want)
    moved = precision.apply(lambda p, q: (p + q).T)
    for run in (moved, jax.jit(moved)):
        np.testing.assert_array_equal(bits(run(a, b)), want.T)
    hlo = jax.jit(lambda p, q: p + q).lower(a, b).compile().as_text()
    assert "reduce-precision(" not in hlo


def test_a_rounding_record_serves_its_own_value_alone():
    """A state keeps its `Rounded` record wherever it goes (a rule may hand it to another
    value); a result is converted from the record's raw value only when it is that
    record's very value, else stored as it is."""
    from precision._apply._apply import _storage_of
    from precision._compute._state import Context, Rounded, State

    fmt = dtypes.get("bfloat16")
    raw = jnp.array([1.00390625, 3.0, -2.5], jnp.float32)
    rounded = fmt.round(raw)
    other = jnp.array([5.0, 7.0, 0.5], jnp.float32)
    state = State(fmt, True, rounded=Rounded(rounded, raw))
    store = lambda v: np.asarray(_storage_of(v, state, np.dtype(np.float32), Context()).data)
    assert store(rounded).astype(np.float32).tolist() == np.asarray(rounded).tolist()
    assert store(other).astype(np.float32).tolist() == [5.0, 7.0, 0.5]
