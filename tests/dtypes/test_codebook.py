"""Code-book formats (NF4 built in) against numpy references.

The NF4 table is checked against its construction in the QLoRA paper
(quantiles of a standard normal, computed here with the standard library's
`statistics.NormalDist`); codes against a numpy argmin over exact float64
distances, ties to the even index.
"""

from __future__ import annotations

import itertools
import statistics
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import dtypes
from dtypes import CodebookFormat, PerBlock, PerTensor, _codebook_codec
from dtypes._format import packed_length
from dtypes._packing import unpack

NF4 = dtypes.get("nf4")


def test_nf4_table_is_the_normal_quantile_construction():
    # 8 positive levels: quantiles at evenly spaced probabilities from 0.5 to
    # offset = (1 - 1/(2*15) + 1 - 1/(2*16)) / 2; 7 negative ones likewise; then 0.
    offset = 0.5 * (1 / 32 + 1 / 30)
    hi = 1 - offset
    norm = statistics.NormalDist()
    pos = [norm.inv_cdf(p) for p in np.linspace(hi, 0.5, 9)[:-1]]
    neg = [-norm.inv_cdf(p) for p in np.linspace(hi, 0.5, 8)[:-1]]
    table = np.sort(np.array([*pos, 0.0, *neg]))
    table = table / np.abs(table).max()
    np.testing.assert_allclose(np.asarray(NF4.values), table, rtol=0, atol=2e-7)
    assert NF4.bits == 4
    assert len(NF4.values) == 16
    assert NF4.default_scaling() == PerBlock(64)


def reference_codes(y: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Nearest entry by exact rational distance, ties to the even index."""
    entries = [Fraction(float(v)) for v in table]
    out = np.zeros(y.shape, np.int64)
    for i, yi in np.ndenumerate(y):
        d = [abs(Fraction(float(yi)) - e) for e in entries]
        best = min(d)
        ties = [k for k, dk in enumerate(d) if dk == best]
        out[i] = ties[0] if len(ties) == 1 or ties[0] % 2 == 0 else ties[1]
    return out


def reference_encode(fmt, x: np.ndarray, block: int):
    """(codes, float32 scales, decoded) for absmax scaling onto max|table| per block."""
    table = np.asarray(fmt.values, np.float32)
    top = np.float32(np.abs(table).max())
    rows = x.reshape(-1, x.shape[-1])
    nb = -(-x.shape[-1] // block)
    pad = np.zeros((rows.shape[0], nb * block), np.float32)
    pad[:, : x.shape[-1]] = rows
    blocks = pad.reshape(rows.shape[0], nb, block)
    amax = np.abs(blocks).max(-1)
    scale = np.where(amax > 0, (amax / top).astype(np.float32), np.float32(1))
    inv = np.where(amax > 0, (top / amax).astype(np.float32), np.float32(0))
    y = (blocks * inv[..., None]).astype(np.float32)
    codes = reference_codes(y, table)
    values = (table[codes] * scale[..., None]).astype(np.float32)
    n = x.shape[-1]
    return (
        codes.reshape(rows.shape[0], -1)[:, :n].reshape(x.shape),
        scale.reshape((*x.shape[:-1], nb)),
        values.reshape(rows.shape[0], -1)[:, :n].reshape(x.shape),
    )


@pytest.mark.parametrize("shape", [(4, 128), (3, 100), (130,)])
def test_nf4_codes_and_scales_match_numpy(shape, eager_and_jit):
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    enc = eager_and_jit(NF4.encode)(x)
    codes, scale, values = reference_encode(NF4, x, 64)
    assert enc.data.shape == (*shape[:-1], packed_length(shape[-1], 4))
    got = np.asarray(unpack(enc.data, 4, shape[-1], signed=False))
    np.testing.assert_array_equal(got, codes)
    np.testing.assert_array_equal(np.asarray(enc.scale), scale)
    np.testing.assert_array_equal(np.asarray(enc.decode()), values)
    np.testing.assert_array_equal(np.asarray(eager_and_jit(NF4.round)(x)), values)
    assert enc.nbytes == NF4.nbytes(shape)


def test_exact_midpoints_go_to_the_even_index():
    table = [-1.0, -0.25, 0.0, 0.5, 1.0]  # max 1: per-tensor scale 1 with a 1.0 present
    fmt = CodebookFormat(table, name="t5")
    mids = [(a + b) / 2 for a, b in itertools.pairwise(table)]
    x = np.array(
        [1.0, *mids, *np.nextafter(np.float32(mids), 2), *np.nextafter(np.float32(mids), -2)],
        np.float32,
    )
    enc = fmt.encode(x)
    got = np.asarray(unpack(enc.data, 3, x.size, signed=False))
    np.testing.assert_array_equal(got, reference_codes(x, np.asarray(table, np.float32)))
    assert got[1:5].tolist() == [0, 2, 2, 4]  # ties: (0,1)->0, (1,2)->2, (2,3)->2, (3,4)->4


@given(
    st.lists(
        st.floats(-1e3, 1e3, width=32).filter(lambda v: v == 0 or abs(v) >= 2.0**-100),
        min_size=2,
        max_size=40,
        unique=True,
    ),
    st.integers(0, 2**32 - 1),
)
# a tie at 0 whose upper entry is even: the threshold was the subnormal -2**-149, which
# XLA:CPU reads as zero (0 went to index 1)
@example([0.3333333432674408, -1.0, -0.3333333432674408], 0)
def test_any_table_rounds_to_the_nearest_entry(values, seed):
    # the index rule itself, eagerly (a format per example would compile a kernel each);
    # the encode path around it is checked against the same reference above
    if max(abs(v) for v in values) == 0:
        return
    fmt = CodebookFormat(values)
    table = np.asarray(fmt.values, np.float32)
    assert np.all(np.diff(table) > 0)
    assert fmt.bits == max(1, int(np.ceil(np.log2(table.size))))
    y = np.random.default_rng(seed).uniform(-1.2, 1.2, 37).astype(np.float32) * np.abs(table).max()
    y[: table.size - 1] = ((table[1:].astype(np.float64) + table[:-1]) / 2).astype(np.float32)[:37]
    got = np.asarray(_codebook_codec.nearest_index(fmt, jnp.asarray(y)))
    np.testing.assert_array_equal(got, reference_codes(y, table))


def test_stochastic_rounding_picks_a_neighbour_and_is_unbiased():
    x = np.full((20000,), 0.3, np.float32)
    x[0] = 1.0  # scale 1
    keys = jax.random.split(jax.random.key(0), 2)
    enc = NF4.encode(x, scaling=PerTensor(), rounding="stochastic", key=keys[0])
    out = np.asarray(enc.decode())[1:]
    table = np.asarray(NF4.values, np.float32)
    lo, hi = table[table <= 0.3].max(), table[table >= 0.3].min()
    assert set(np.unique(out).tolist()) <= {float(lo), float(hi)}
    p = (0.3 - lo) / (hi - lo)
    frac = float(np.mean(out == hi))
    assert abs(frac - p) < 4 * np.sqrt(p * (1 - p) / out.size)
    again = NF4.encode(x, scaling=PerTensor(), rounding="stochastic", key=keys[0])
    np.testing.assert_array_equal(np.asarray(again.data), np.asarray(enc.data))


@pytest.mark.parametrize(
    "fmt",
    [
        NF4,
        CodebookFormat([-1.0, 0.25, 1.0], name="odd3"),
        CodebookFormat([-1, -0.5, 0, 0.1, 1], name="five"),
    ],
)
def test_the_unrolled_stochastic_index_is_the_searched_one(fmt):
    """`stochastic_index` unrolls its search over small tables: the same indices as the
    search with gathers, at every entry, one float32 step either side of it, past both
    ends of the table, zeros of both signs, and random values, for the same uniforms."""
    v = np.asarray(fmt._table(), np.float32)
    near = np.concatenate([v, np.nextafter(v, np.float32(-2)), np.nextafter(v, np.float32(2))])
    rng = np.random.default_rng(4)
    y = np.concatenate([near, [-1.5, 1.5, 0.0, -0.0], rng.uniform(-1.1, 1.1, 1 << 14)])
    y = jnp.asarray(y.astype(np.float32))
    u = jax.random.uniform(jax.random.key(5), y.shape, jnp.float32)
    got = jax.jit(lambda y: _codebook_codec.stochastic_index(fmt, y, u))(y)
    want = jax.jit(lambda y: _codebook_codec._stochastic_index_searched(v, y, u))(y)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_codebook_errors_are_precise():
    with pytest.raises(dtypes.FormatError, match="2 to 65536"):
        CodebookFormat([1.0])
    with pytest.raises(dtypes.FormatError, match="finite"):
        CodebookFormat([0.0, np.inf])
    with pytest.raises(dtypes.FormatError, match="subnormal"):
        CodebookFormat([0.0, 1e-40, 1.0])
    with pytest.raises(dtypes.RoundingError, match="nearest_even or stochastic"):
        NF4.encode(np.ones(4, np.float32), rounding="toward_zero")
    with pytest.raises(dtypes.NonFiniteError):
        NF4.encode(np.array([1.0, np.nan], np.float32))
    with pytest.raises(dtypes.ScalingError, match="float8_e8m0fnu"):
        NF4.encode(
            np.ones(4, np.float32), scaling=PerBlock(2, power_of_two=True, scale_format="e8m0")
        )


def test_codebook_with_bf16_scales_and_wide_tables():
    x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    enc = NF4.encode(x, scaling=PerBlock(64, scale_format="bfloat16"))
    assert enc.nbytes == 2 * 32 + 2 * 2
    big = CodebookFormat(np.linspace(-1, 1, 300), name="lin300")
    assert big.bits == 9
    e = jax.jit(big.encode)(x)
    assert e.data.shape == (2, packed_length(64, 9))
    y = np.asarray(e.decode())
    assert np.abs(y - x).max() <= np.abs(x).max() / 299 + 1e-6
    assert jnp.asarray(y).dtype == jnp.float32
