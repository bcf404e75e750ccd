"""Dense packing of every width from 1 to 16 bits, against a numpy bit-stream reference.

The reference writes each code's bits into one little-endian bit stream with
`np.unpackbits`/`np.packbits(bitorder="little")`, a different construction
from the implementation's fixed per-byte shift tables.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sampling import sample

import dtypes
from dtypes import FloatFormat
from dtypes._format import packed_length
from dtypes._packing import pack, unpack

WIDTHS = list(range(1, 17))


def reference_pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Bytes of `codes` (unsigned, last axis) as one little-endian bit stream per row."""
    codes = np.asarray(codes, np.uint64)
    n = codes.shape[-1]
    as_bytes = codes.astype("<u8").view(np.uint8).reshape((*codes.shape, 8))
    stream_bits = np.unpackbits(as_bytes, axis=-1, bitorder="little")[..., :bits]
    stream = stream_bits.reshape((*codes.shape[:-1], n * bits))
    pad = (-stream.shape[-1]) % 8
    stream = np.pad(stream, [(0, 0)] * (stream.ndim - 1) + [(0, pad)])
    return np.packbits(stream, axis=-1, bitorder="little")


def _dtype(bits: int):
    return np.uint16 if bits > 8 else np.uint8


# Every width runs under jit. Run eagerly (op by op: the same code, unfused, each op
# compiled apart, several seconds a width) in CI are one width of each branch of
# pack/unpack: the 1-bit sign map, a sub-byte width (2), whole bytes (8), 16-bit pairs,
# and dense groups of one, two and four 32-bit words whose last word is partly used with
# three and one bytes (3, 5, 13; 13 also unpacks into uint16). Every width under hunt.
_EAGER_WIDTHS = {1, 2, 3, 5, 8, 13, 16}
_WIDTH_RUNS = sample(
    itertools.product(["eager", "jit"], WIDTHS),
    lambda run: run[0] == "jit" or run[1] in _EAGER_WIDTHS,
)


@pytest.mark.parametrize(("how", "bits"), _WIDTH_RUNS)
def test_every_code_of_every_width_round_trips(how, bits):
    eager_and_jit = jax.jit if how == "jit" else (lambda f: f)
    codes = np.arange(1 << bits, dtype=_dtype(bits))
    # one row holding every code, and the same codes as rows of odd length
    rows = np.resize(codes, (3, 1 + (1 << bits) // 3 | 1))
    for arr in (codes, rows):
        data = eager_and_jit(lambda c, b=bits: pack(c, b))(jnp.asarray(arr))
        assert data.dtype == np.uint8
        assert data.shape == (*arr.shape[:-1], packed_length(arr.shape[-1], bits))
        np.testing.assert_array_equal(np.asarray(data), reference_pack(arr, bits))
        back = eager_and_jit(lambda d, b=bits, n=arr.shape[-1]: unpack(d, b, n, signed=False))(data)
        assert back.dtype == _dtype(bits)
        np.testing.assert_array_equal(np.asarray(back), arr)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 7, 8])
def test_signed_codes_sign_extend(bits):
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    codes = np.arange(lo, hi + 1, dtype=np.int8)
    data = pack(jnp.asarray(codes), bits)
    np.testing.assert_array_equal(
        np.asarray(data), reference_pack(codes.astype(np.int64) & ((1 << bits) - 1), bits)
    )
    np.testing.assert_array_equal(np.asarray(unpack(data, bits, codes.size)), codes)


_EXAMPLES = settings().max_examples  # of the loaded profile (tests/conftest.py)
_pack_jit = jax.jit(pack, static_argnums=1)
_unpack_jit = jax.jit(unpack, static_argnums=(1, 2), static_argnames="signed")


@given(
    bits=st.sampled_from(WIDTHS),
    lead=st.lists(st.integers(0, 2), max_size=2),
    last=st.integers(1, 23),
    seed=st.integers(0, 2**32 - 1),
)
# each example compiles its shape's programs: at most 50 in CI (every width and last
# length is still drawn), the whole profile when hunting
@settings(max_examples=_EXAMPLES if _EXAMPLES > 100 else min(_EXAMPLES, 50))
def test_packing_any_shape_matches_the_reference(bits, lead, last, seed):
    # odd last axes included: every length pads to whole bytes its own way
    shape = (*lead, last)
    codes = np.random.default_rng(seed).integers(0, 1 << bits, shape).astype(_dtype(bits))
    data = np.asarray(_pack_jit(jnp.asarray(codes), bits))
    np.testing.assert_array_equal(data, reference_pack(codes, bits))
    back = _unpack_jit(jnp.asarray(data), bits, last, signed=False)
    np.testing.assert_array_equal(np.asarray(back), codes)


def test_fp6_takes_four_values_in_three_bytes():
    assert packed_length(4, 6) == 3
    assert pack(jnp.asarray([1, 2, 3, 63], jnp.uint8), 6).tolist() == [
        1 | (2 << 6) & 0xFF,
        (2 >> 2) | (3 << 4) & 0xFF,
        (3 >> 4) | (63 << 2) & 0xFF,
    ]


def test_bad_width_is_refused():
    with pytest.raises(ValueError, match="1 to 16 bits"):
        pack(jnp.zeros(3, jnp.uint8), 17)
    with pytest.raises(ValueError, match="1 to 16 bits"):
        unpack(jnp.zeros(3, jnp.uint8), 0, 3)


# Custom float layouts of widths no native type holds are stored packed densely.
DENSE_FLOATS = [
    FloatFormat(1, 1, finite=True),  # 3 bits
    FloatFormat(2, 2, finite=True),  # 5 bits
    FloatFormat(3, 2, finite=True),  # 6 bits (OCP float6_e3m2fn)
    FloatFormat(2, 3, finite=True),  # 6 bits (OCP float6_e2m3fn)
    FloatFormat(3, 3),  # 7 bits
    FloatFormat(5, 4),  # 10 bits
    FloatFormat(5, 6),  # 12 bits
    FloatFormat(6, 9),  # 16 bits, no native type
]


@pytest.mark.parametrize("fmt", DENSE_FLOATS, ids=lambda f: f.name)
def test_custom_float_layouts_are_packed_at_their_width(fmt, eager_and_jit):
    assert fmt.code_bits == fmt.bits
    assert fmt.container == np.uint8
    assert fmt.packed
    # every code, decoded through the bit-field definition of the layout
    codes = np.arange(1 << fmt.bits, dtype=np.int64)
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    ef, mf, sign = (codes >> m) & ((1 << e) - 1), codes & ((1 << m) - 1), codes >> (e + m)
    mag = np.where(
        ef == 0,
        mf * 2.0 ** (fmt.emin - m),
        (1 + mf / 2.0**m) * 2.0 ** (ef - fmt.bias),
    )
    values = np.where(sign == 1, -mag, mag)
    special = np.zeros(codes.shape, bool)
    if not fmt.finite:
        special = ef == (1 << e) - 1
    x = values[~special].astype(np.float32)
    x = x[np.abs(x) >= np.float32(2.0**-126)] if fmt.emin - m < -126 else x
    enc = eager_and_jit(fmt.encode)(x)
    assert enc.data.shape == (packed_length(x.size, fmt.bits),)
    assert enc.nbytes == fmt.nbytes(x.shape) == packed_length(x.size, fmt.bits)
    np.testing.assert_array_equal(np.asarray(enc.decode()), x)
    # the stored bytes are the codes, packed as the reference packs them
    kept = codes[~special][np.isin(values[~special].astype(np.float32), x)]
    np.testing.assert_array_equal(np.asarray(enc.data), reference_pack(kept, fmt.bits))


@pytest.mark.parametrize("fmt", [*DENSE_FLOATS[:3], DENSE_FLOATS[5]], ids=lambda f: f.name)
def test_packed_scalars_and_odd_shapes_round_trip(fmt):
    for shape in [(), (1,), (5,), (3, 7), (2, 0)]:
        x = np.asarray(np.random.default_rng(1).uniform(-1, 1, shape), np.float32)
        enc = fmt.encode(x)
        assert enc.shape == shape
        assert enc.data.shape == fmt.data_shape(shape)
        np.testing.assert_array_equal(np.asarray(enc.decode()), np.asarray(fmt.round(x)))
        assert enc.nbytes == fmt.nbytes(shape)


def test_dense_packing_keeps_the_registry_formats_unchanged():
    # int4/int2/int1 keep their layouts: two, four and eight codes a byte.
    for fmt, per_byte in ((dtypes.int4, 2), (dtypes.int2, 4), (dtypes.int1, 8)):
        assert fmt.nbytes((3, 16), dtypes.PerAxis(0)) == 3 * 16 // per_byte + 3 * 4
    assert jax.jit(lambda v: dtypes.int4.encode(v).data)(jnp.arange(4.0)).shape == (2,)
