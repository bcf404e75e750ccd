"""`IntFormat.host_codes` and `host_scales`: the absmax rule in numpy is `encode`'s, bit for bit.

The command line converts int8 checkpoints with them, without JAX; these tests hold
them to the compiled encode, the specification, over the inputs where the two could
part: exact halves of a step, subnormals, values at the absmax, all-zero groups,
absmaxes at both ends of `HOST_ABSMAX`, and the scalings and roundings `host_rule`
leaves to the compiled encode.
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import dtypes
from dtypes import PerAxis, PerBlock, PerTensor, int4, int8

N = 5003  # past XLA:CPU's vectorisation threshold, and odd
LOW, HIGH = int8.HOST_ABSMAX
Q = np.float32(127)


def values(seed: int, e: int, kind: str, n: int = N) -> np.ndarray:
    """float32 values around 2**e: random, exact halves of a step, or the edges."""
    rng = np.random.default_rng(seed)
    step = np.float32(2.0**e)
    if kind == "halves":  # absmax 127 * 2**e: x * (127 / absmax) = k + 0.5 exactly
        x = ((rng.integers(-127, 127, n) + np.float32(0.5)) * step).astype(np.float32)
        x[0] = Q * step
    else:
        x = (rng.standard_normal(n) * step).astype(np.float32)
    if kind == "edges":
        top = np.float32(np.max(np.abs(x)))
        edge = [-top, np.nextafter(top, np.float32(0)), 1e-40, -1e-45, 0.0, -0.0]
        edge += [np.float32(2.0**-126), top / np.float32(254), -top / np.float32(254)]
        x[: len(edge)] = np.asarray(edge, np.float32)
    return x


def encoded(x: np.ndarray, scaling: dtypes.Scaling) -> tuple[np.ndarray, np.ndarray]:
    enc = int8.encode(jnp.asarray(x), scaling=scaling)
    return np.asarray(enc.data), np.asarray(enc.scale, np.float32).reshape(-1)


@given(
    seed=st.integers(0, 2**32 - 1),
    e=st.integers(-106, 97),
    kind=st.sampled_from(["random", "halves", "edges"]),
)
def test_per_tensor_codes_and_scale_are_encodes(seed, e, kind):
    x = values(seed, e, kind)
    absmax = np.float32(np.max(np.abs(x)))
    assume(int8.host_absmax(absmax))
    codes = int8.host_codes(x, absmax).astype(np.int8)
    want_codes, want_scale = encoded(x, PerTensor())
    np.testing.assert_array_equal(codes, want_codes)
    assert int8.host_scales(absmax).reshape(-1).tobytes() == want_scale.tobytes()


ROWS, COLS = 16, 301


@given(
    seed=st.integers(0, 2**31),
    exponents=st.lists(st.integers(-99, 93), min_size=ROWS, max_size=ROWS),
    kinds=st.lists(
        st.sampled_from(["random", "halves", "edges", "zero"]), min_size=ROWS, max_size=ROWS
    ),
)
def test_per_row_codes_and_scales_are_encodes(seed, exponents, kinds):
    rows = [
        np.zeros(COLS, np.float32) if kind == "zero" else values(seed + i, e, kind, COLS)
        for i, (e, kind) in enumerate(zip(exponents, kinds, strict=True))
    ]
    x = np.stack(rows)
    absmax = np.max(np.abs(x), axis=1, keepdims=True)
    assume(int8.host_absmax(absmax))
    codes = int8.host_codes(x, absmax).astype(np.int8)
    want_codes, want_scales = encoded(x, PerAxis(0))
    np.testing.assert_array_equal(codes, want_codes)
    assert int8.host_scales(absmax).reshape(-1).tobytes() == want_scales.tobytes()


@pytest.mark.parametrize("fmt", [int4, dtypes.int2], ids=["int4", "int2"])
@given(seed=st.integers(0, 2**32 - 1), e=st.integers(-99, 93))
def test_narrower_codes_decode_as_encodes(fmt, seed, e):
    # packed codes: compared through decode, code times scale in float32
    x = values(seed, e, "edges", 2 * COLS).reshape(2, COLS)
    absmax = np.max(np.abs(x), axis=1, keepdims=True)
    assume(fmt.host_absmax(absmax))
    got = fmt.host_codes(x, absmax) * fmt.host_scales(absmax) + np.float32(0)  # (no -0 code)
    want = np.asarray(fmt.decode(fmt.encode(jnp.asarray(x), scaling=PerAxis(0))))
    assert got.tobytes() == want.tobytes()


def test_codes_go_into_the_buffer_given():
    x = values(0, 0, "random", 64)
    out = np.empty_like(x)
    assert int8.host_codes(x, np.float32(np.max(np.abs(x))), out) is out


def test_any_numbers_are_taken_and_anything_else_is_refused_by_name():
    # The absmax of a bfloat16 or float16 tensor is an ml_dtypes or numpy scalar of
    # that dtype: taken as the float32 it widens to exactly.
    half = np.float32([0.5, -1.0, 0.25]).astype(ml_dtypes.bfloat16)
    absmax = np.max(np.abs(half))
    assert int8.host_absmax(absmax)
    assert int8.host_absmax(np.float16(1))
    assert int8.host_absmax(1)
    want = int8.host_codes(np.float32([0.5, -1.0, 0.25]), np.float32(1.0))
    assert int8.host_codes(half, absmax).tobytes() == want.tobytes()
    for bad in ("1.0", [1.0], True, np.array(["1"]), None):
        with pytest.raises(dtypes.PrecisionTypeError, match=r"int8\.host_absmax takes `absmax`"):
            int8.host_absmax(bad)


BELOW = np.nextafter(np.float32(LOW), np.float32(0))
ABOVE = np.nextafter(np.float32(HIGH), np.float32(np.inf))


@pytest.mark.parametrize(
    ("absmax", "taken"),
    [
        (0.0, True),
        (LOW, True),
        (HIGH, True),
        (BELOW, False),
        (ABOVE, False),
        (2.0**-126, False),
        (3e38, False),
        (np.nan, False),
        (np.inf, False),
    ],
    ids=["zero", "low", "high", "below", "above", "tiny", "near-max", "nan", "inf"],
)
def test_host_absmax_is_zero_or_the_range(absmax, taken):
    assert int8.host_absmax(np.float32(absmax)) is taken
    assert int8.host_absmax(np.float32([1.0, absmax, 0.0])) is taken


@pytest.mark.parametrize(
    ("fmt", "scaling", "rounding", "taken"),
    [
        (int8, PerTensor(), "nearest_even", True),
        (int8, PerBlock(32), "nearest_even", True),
        (int4, PerAxis(0), "nearest_even", True),  # the codes' rule; packing is the caller's
        (int8, PerTensor(), "nearest_away", False),
        (int8, PerTensor(power_of_two=True), "nearest_even", False),
        (int8, PerTensor(scale_format="bfloat16"), "nearest_even", False),
        (dtypes.int1, PerTensor(), "nearest_even", False),  # mean scales
    ],
    ids=["int8", "blocks", "int4", "away", "pow2", "bf16-scales", "int1"],
)
def test_host_rule_names_the_plain_absmax_encodes(fmt, scaling, rounding, taken):
    assert fmt.host_rule(scaling, rounding) is taken
