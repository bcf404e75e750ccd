"""Every float encoding refuses NaN and inf eagerly, wherever they sit in a large input.

The eager encode finds them in the kernel that encodes (flags beside the codes, or
the NaN scale of the group holding one), not in a pass of its own: these tests pin
that no input slips through, for every format without NaN, every scaled encoding
and scale format, at every position class (first, inside a group, last) and in
inputs of the storage types a user passes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import dtypes
from dtypes import FloatFormat, PerAxis, PerBlock, PerTensor, _float_codec

N = 8192
POSITIONS = (0, 4097, N - 1)

# formats without NaN, unscaled: NaN refused, inf refused unless saturating
UNSCALED = {
    "float4_e2m1fn": dtypes.ENCODINGS["float4_e2m1fn"],
    "float6_e2m3fn": dtypes.ENCODINGS["float6_e2m3fn"],
    "float6_e3m2fn": dtypes.ENCODINGS["float6_e3m2fn"],
    "e3m2 finite": FloatFormat(3, 2, finite=True),
}
# scaled float encodings: a group holding NaN or inf is refused
SCALED = {
    name: (fmt, None)
    for name, fmt in dtypes.ENCODINGS.items()
    if getattr(fmt, "scaling", None) is not None
}
SCALED |= {
    "e4m3fn per tensor": (dtypes.float8_e4m3fn, PerTensor()),
    "e4m3fn per row": (dtypes.float8_e4m3fn, PerAxis(0)),
    "e5m2 blocks of 32": (dtypes.float8_e5m2, PerBlock(32)),
    "e4m3fn blocks, e4m3 scales": (
        dtypes.float8_e4m3fn,
        PerBlock(16, scale_format="float8_e4m3fn"),
    ),
    "bfloat16-scaled e2m1": (FloatFormat(2, 1, finite=True), PerBlock(32, scale_format="bfloat16")),
}


def _input(pos: int, value: float, dtype=np.float32) -> np.ndarray:
    x = np.random.default_rng(pos).standard_normal(N).astype(np.float32)
    x[pos] = value
    return x.reshape(64, 128).astype(dtype)


@pytest.mark.parametrize("pos", POSITIONS)
@pytest.mark.parametrize("name", list(UNSCALED))
def test_a_format_without_nan_refuses_nan_and_inf_eagerly(name, pos):
    fmt = UNSCALED[name]
    for value, what in ((np.nan, "NaN"), (-np.inf, "inf"), (np.inf, "inf")):
        with pytest.raises(dtypes.NonFiniteError, match=f"cannot encode {what} into"):
            fmt.encode(_input(pos, value))
    # from a narrower storage type too, and through jnp arrays
    with pytest.raises(dtypes.NonFiniteError, match="NaN"):
        fmt.encode(jnp.asarray(_input(pos, np.nan, ml_dtypes.bfloat16)))
    # clean input encodes as before: every value, no refusal
    x = _input(pos, 1.5)
    assert fmt.encode(x).decode().shape == x.shape


def test_a_saturating_format_without_nan_still_refuses_nan_but_clamps_inf():
    fmt = FloatFormat(2, 1, finite=True, saturate=True)
    got = np.asarray(fmt.encode(_input(5, np.inf)).decode())
    assert got.reshape(-1)[5] == fmt.max
    with pytest.raises(dtypes.NonFiniteError, match="NaN"):
        fmt.encode(_input(5, np.nan))


@pytest.mark.parametrize("pos", POSITIONS)
@pytest.mark.parametrize("name", list(SCALED))
def test_a_scaled_encoding_refuses_nan_and_inf_eagerly(name, pos):
    fmt, scaling = SCALED[name]
    row, col = divmod(pos, 128)
    for value in (np.nan, np.inf, -np.inf):
        with pytest.raises(dtypes.NonFiniteError, match=rf"at index \({row}, {col}\)"):
            fmt.encode(_input(pos, value), scaling=scaling)
    assert fmt.encode(_input(pos, 2.0), scaling=scaling).decode().shape == (64, 128)


@pytest.mark.parametrize("name", list(UNSCALED))
def test_the_accelerators_in_kernel_search_refuses_the_same(name, monkeypatch):
    # off a CPU the search rides in the encode's kernel; run that path here too
    monkeypatch.setattr(_float_codec, "_flags_in_kernel", lambda x: True)
    fmt = UNSCALED[name]
    for pos in POSITIONS:
        for value, what in ((np.nan, "NaN"), (np.inf, "inf"), (-np.inf, "inf")):
            with pytest.raises(dtypes.NonFiniteError, match=f"cannot encode {what} into"):
                fmt.encode(_input(pos, value))
    # NaN beside inf is refused as NaN, the first of the two questions
    x = _input(7, np.inf)
    x[0, 0] = np.nan
    with pytest.raises(dtypes.NonFiniteError, match="cannot encode NaN"):
        fmt.encode(x)
    x = _input(3, 0.75)
    np.testing.assert_array_equal(
        np.asarray(fmt.encode(x).data), np.asarray(jax.jit(fmt.encode)(x).data)
    )
