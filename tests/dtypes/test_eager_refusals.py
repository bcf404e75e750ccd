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
from checks import reduced_float, registry

import dtypes
from dtypes import FloatFormat, PerAxis, PerBlock, PerTensor, _float_codec

N = 8192
POSITIONS = (0, 4097, N - 1)


def without_nan(f) -> bool:
    """An unscaled float layout with no NaN code that does not saturate: NaN and inf have
    no code to go to (a saturating one clamps inf, tested below)."""
    return reduced_float(f) and not f.nan and not f.saturate


def always_scaled(f) -> bool:
    """An entry that scales every group unasked: every kind but the float layouts (which
    scale only when asked: the cases added below) and the E8M0 scale format (which stores
    NaN itself), and a float layout carrying a scaling of its own (MX, NVFP4)."""
    if f.kind == "float":
        return f.scaling is not None
    return f.kind != "scale"


# formats without NaN, unscaled: NaN refused, inf refused unless saturating
UNSCALED = {f.name: f for f in registry(without_nan)}
# scaled encodings: a group holding NaN or inf is refused
SCALED = {f.name: (f, None) for f in registry(always_scaled)}
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


def test_the_per_format_tests_run_over_every_registry_entry_their_rule_admits():
    ran = [dtypes.get(n) for n in UNSCALED]
    assert ran == registry(without_nan)
    ran = [fmt for fmt, scaling in SCALED.values() if scaling is None]
    assert ran == registry(always_scaled)
