"""The one-byte float codes XLA:CPU takes from the bits (`_ieee.byte_float_codes`).

XLA:CPU converts float32 into a one-byte float with a long integer sequence of its
own; `byte_float_codes` writes the same byte in fewer operations, and every fp8
encode on a CPU uses it (`_ieee.from_float32`, `_float_codec._byte_codes`). Here
its bytes are compared with ml_dtypes' conversion (the independent reference) at every
code's value, at every midpoint between neighbouring codes and one and two float32
steps either side, at the subnormal, overflow and special patterns, and on random bit
patterns, under the default and the fast-math XLA flags; under the hunt profile, with
XLA's own conversion on all 2**32 float32 patterns.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from backend_bits import FAST_MATH_FLAGS, run_under_flags
from jax import lax
from sampling import HUNT

import dtypes
from dtypes import _ieee

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3", "float8_e3m4")


def boundary_patterns(dtype: np.dtype) -> np.ndarray:
    """float32 inputs where a rounding to `dtype` can go wrong: every code's value and
    the midpoints between neighbouring codes (ties), each with its float32 neighbours
    two steps either side, both signs; float32's own edges; random bit patterns."""
    codes = np.arange(0x80, dtype=np.uint8).view(dtype).astype(np.float64)
    finite = np.sort(codes[np.isfinite(codes)])
    mids = (finite[1:] + finite[:-1]) / 2
    top = finite[-1]
    past = [top + (top - finite[-2]) / 2, top * 2, 2.0**127]  # (the tie above the top)
    centres = np.concatenate([finite, mids, past]).astype(np.float32).view(np.uint32)
    steps = np.arange(-2, 3, dtype=np.int64)
    near = (centres[:, None].astype(np.int64) + steps).clip(0, 0x7F7FFFFF).astype(np.uint32)
    edges = np.uint32(
        [0x00000000, 0x00000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0x7F800000,
         0x7F800001, 0x7FC00000, 0x7FFFFFFF]
    )  # fmt: skip
    random = np.random.default_rng(3).integers(0, 2**31, 1 << 18, dtype=np.uint64)
    mags = np.concatenate([near.ravel(), edges, random.astype(np.uint32)])
    return np.concatenate([mags, mags | np.uint32(0x80000000)]).view(np.float32)


def _reference(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(dtype).view(np.uint8)


@pytest.mark.parametrize("name", NAMES)
def test_codes_are_ml_dtypes_conversion(name):
    dtype = np.dtype(getattr(ml_dtypes, name))
    x = boundary_patterns(dtype)
    got = np.asarray(jax.jit(lambda v: _ieee.byte_float_codes(v, dtype))(x)).view(np.uint8)
    want = _reference(x, dtype)
    wrong = np.flatnonzero(got != want)
    assert not wrong.size, [(hex(int(x.view(np.uint32)[i])), got[i], want[i]) for i in wrong[:8]]


@pytest.mark.parametrize("flags", ["", FAST_MATH_FLAGS], ids=["default", "fast-math"])
def test_codes_are_ml_dtypes_conversion_under_any_flags(flags):
    """The same comparison in a fresh process under XLA's flags: the fast-math ones assume
    no NaN or inf and flush subnormals, and the codes must not move."""
    code = (
        "import jax, ml_dtypes, numpy as np\n"
        "from test_byte_float_codes import NAMES, boundary_patterns, _reference\n"
        "from dtypes import _ieee\n"
        "for name in NAMES:\n"
        "    dtype = np.dtype(getattr(ml_dtypes, name))\n"
        "    x = boundary_patterns(dtype)\n"
        "    got = np.asarray(jax.jit(lambda v: _ieee.byte_float_codes(v, dtype))(x))"
        ".view(np.uint8)\n"
        "    assert (got == _reference(x, dtype)).all(), name\n"
    )
    here = Path(__file__).resolve()
    run_under_flags(code, flags, [here.parent, here.parents[1]])


@pytest.mark.parametrize("name", NAMES)
def test_encodes_take_the_codes_on_a_cpu_and_the_conversion_elsewhere(name):
    """The program lowered for a CPU holds no conversion into the one-byte float; the one
    lowered for a GPU (on this machine, `jax.export`) holds XLA's conversion."""
    fmt = dtypes.get(name)
    x = jax.ShapeDtypeStruct((64, 32), jnp.float32)
    f = jax.jit(lambda v: fmt.encode(v).data)
    mlir = {"float8_e4m3fn": "f8E4M3FN", "float8_e5m2": "f8E5M2", "float8_e4m3": "f8E4M3",
            "float8_e3m4": "f8E3M4"}[name]  # fmt: skip
    gpu = jax.export.export(f, platforms=("cuda",))(x).mlir_module()
    assert f"(tensor<64x32xf32>) -> tensor<64x32x{mlir}>" in gpu  # XLA's conversion
    hlo = np.dtype(fmt.container).name.replace("float8_", "f8")
    cpu = f.lower(x).compile().as_text()
    assert not [line for line in cpu.splitlines() if f"= {hlo}[" in line and " convert(" in line]


def test_other_dtypes_are_refused_with_the_conversion_to_use():
    with pytest.raises(dtypes.FormatError, match=r"x.astype\(float8_e4m3fnuz\)"):
        _ieee.byte_float_codes(jnp.ones(3), ml_dtypes.float8_e4m3fnuz)


@pytest.mark.skipif(not HUNT, reason="all 2**32 float32 patterns: minutes; hunt profile")
def test_codes_are_xlas_conversion_for_every_float32():
    chunk = 1 << 24
    dts = [np.dtype(getattr(ml_dtypes, n)) for n in NAMES]

    @jax.jit
    def wrong(start):
        u = start + lax.iota(jnp.uint32, chunk)
        y = lax.bitcast_convert_type(u, jnp.float32)
        counts = []
        for dt in dts:
            a = lax.bitcast_convert_type(y.astype(dt), jnp.uint8)  # (XLA's conversion)
            b = lax.bitcast_convert_type(_ieee.byte_float_codes(y, dt), jnp.uint8)
            counts.append(jnp.sum(a != b))
        return jnp.stack(counts)

    total = sum(np.asarray(wrong(jnp.uint32(c * chunk))) for c in range(1 << 8))
    assert not np.any(total), dict(zip(NAMES, total.tolist(), strict=True))
