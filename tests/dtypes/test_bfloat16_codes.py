"""The bfloat16 codes XLA:CPU takes from the bits (`_ieee.bfloat16_codes`).

On a CPU `dtypes.astype(x, bfloat16)`, every bfloat16 encode and every bfloat16 `Tensor`
store round float32 to bfloat16 on the bits, in integer operations XLA fuses into any
consumer: its own conversion is one it will not copy into a second consumer, so an
operand that an op also probes was written twice. Here the codes are compared with
ml_dtypes' conversion (the independent reference) at every bfloat16 value, at every
midpoint between neighbouring values and two float32 steps either side, at the
subnormal, overflow and special patterns and on random bit patterns, under the default
and the fast-math XLA flags, and the other platforms' form (XLA's conversion) forced here
is compared too; the programs for a CPU and for a GPU are read; under the hunt profile all
2**32 float32 patterns are compared with XLA's conversion.
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
import precision
from dtypes import _ieee

BF16 = np.dtype(ml_dtypes.bfloat16)


def boundary_patterns() -> np.ndarray:
    """float32 inputs where a rounding to bfloat16 can go wrong: every finite bfloat16
    value and the midpoints between neighbours (ties, both parities), each with its
    float32 neighbours two steps either side, both signs; the tie above the largest
    value; float32's edges and NaNs; random bit patterns."""
    codes = np.arange(0x7F80, dtype=np.uint32) << 16  # every finite magnitude, 0 included
    mids = codes[:-1] + np.uint32(0x8000)
    past = np.uint32([0x7F7F8000, 0x7F7FFFFF])  # (the tie above the top, the top float32)
    centres = np.concatenate([codes, mids, past]).astype(np.int64)
    near = (centres[:, None] + np.arange(-2, 3)).clip(0, 0x7F7FFFFF).astype(np.uint32)
    edges = np.uint32(
        [0x00000001, 0x00007FFF, 0x00008000, 0x00018000, 0x007FFFFF, 0x00800000,
         0x7F800000, 0x7F800001, 0x7F808000, 0x7FBFFFFF, 0x7FC00000, 0x7FFF8000, 0x7FFFFFFF]
    )  # fmt: skip
    random = np.random.default_rng(5).integers(0, 2**31, 1 << 18, dtype=np.uint64)
    mags = np.concatenate([near.ravel(), edges, random.astype(np.uint32)])
    return np.concatenate([mags, mags | np.uint32(0x80000000)]).view(np.float32)


def _reference(x: np.ndarray) -> np.ndarray:
    """ml_dtypes' bits (its NaN: the quiet NaN with the input's sign)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(BF16).view(np.uint16)


def _ours(x: np.ndarray) -> list[np.ndarray]:
    """The codes, the public conversion's bits and a stored Tensor's bits, jitted."""
    bits = lambda a: np.asarray(a).view(np.uint16)
    store = lambda v: precision.Tensor(v).to_reduced_precision("bfloat16").encoded.data
    return [
        bits(jax.jit(_ieee.bfloat16_codes)(x)),
        bits(jax.jit(lambda v: dtypes.astype(v, BF16))(x)),
        bits(jax.jit(store)(x)),
    ]


def test_codes_are_ml_dtypes_conversion():
    x = boundary_patterns()
    want = _reference(x)
    for got in _ours(x):
        wrong = np.flatnonzero(got != want)
        assert not wrong.size, [
            (hex(int(x.view(np.uint32)[i])), hex(got[i]), hex(want[i])) for i in wrong[:8]
        ]


@pytest.mark.parametrize("flags", ["", FAST_MATH_FLAGS], ids=["default", "fast-math"])
def test_codes_are_ml_dtypes_conversion_under_any_flags(flags):
    """The same comparison in a fresh process under XLA's flags: the fast-math ones assume
    no NaN or inf and flush subnormals, and the codes must not move."""
    code = (
        "from test_bfloat16_codes import boundary_patterns, _ours, _reference\n"
        "x = boundary_patterns()\n"
        "for got in _ours(x):\n"
        "    assert (got == _reference(x)).all()\n"
    )
    here = Path(__file__).resolve()
    run_under_flags(code, flags, [here.parent, here.parents[1]])


def test_the_other_platforms_form_writes_the_same_codes(monkeypatch):
    """The form a GPU takes (XLA's conversion, NaN and inf then written on the bits),
    forced on this CPU: ml_dtypes' bits too."""

    def default_form(*args, **branches):
        return branches["default"](*args)

    monkeypatch.setattr(_ieee.lax, "platform_dependent", default_form)
    x = boundary_patterns()
    got = np.asarray(jax.jit(lambda v: _ieee.from_float32(v, BF16))(x)).view(np.uint16)
    np.testing.assert_array_equal(got, _reference(x))


def test_encodes_take_the_codes_on_a_cpu_and_the_conversion_elsewhere():
    """The program lowered for a CPU holds no conversion into bfloat16; the one lowered
    for a GPU (on this machine, `jax.export`) holds XLA's conversion (an instruction
    there)."""
    x = jax.ShapeDtypeStruct((64, 32), jnp.float32)
    f = jax.jit(lambda v: dtypes.get("bfloat16").encode(v).data)
    gpu = jax.export.export(f, platforms=("cuda",))(x).mlir_module()
    assert "(tensor<64x32xf32>) -> tensor<64x32xbf16>" in gpu
    cpu = f.lower(x).compile().as_text()
    assert not [line for line in cpu.splitlines() if "= bf16[" in line and " convert(" in line]


def test_a_probed_operand_is_written_in_one_pass():
    """`Tensor @ Tensor` of two fresh bfloat16 Tensors: each operand is read by its
    conditional and, one element of it, by the other's probe (`_rules.computed_at_use`).
    Each operand's float32 input is read by two fusions, the encode and the other's probe,
    not by a standalone conversion whose output the NaN/inf fix-up reads again."""
    fmt = dtypes.get("bfloat16")

    def mm(a, b):
        ta = precision.Tensor(a).to_reduced_precision(fmt)
        tb = precision.Tensor(b).to_reduced_precision(fmt)
        return (ta @ tb).encoded.data

    spec = jax.ShapeDtypeStruct((64, 128), jnp.float32)
    hlo = jax.jit(mm).lower(spec, spec.update(shape=(128, 32))).compile().as_text()
    entry = hlo[hlo.index("\nENTRY") :]
    for name in ("a", "b"):
        readers = [ln for ln in entry.splitlines() if " fusion(" in ln and f"%{name}." in ln]
        assert len(readers) == 2, readers


@pytest.mark.skipif(not HUNT, reason="all 2**32 float32 patterns: minutes; hunt profile")
def test_codes_are_xlas_conversion_for_every_float32():
    """Against XLA's conversion with NaN and inf then written on the bits (the path a GPU
    takes, and a CPU's before the codes)."""
    chunk = 1 << 24

    @jax.jit
    def wrong(start):
        y = lax.bitcast_convert_type(start + lax.iota(jnp.uint32, chunk), jnp.float32)
        a = lax.bitcast_convert_type(_ieee._converted(y, BF16), jnp.uint16)
        b = lax.bitcast_convert_type(_ieee.bfloat16_codes(y), jnp.uint16)
        return jnp.sum(a != b)

    total = sum(int(wrong(jnp.uint32(c * chunk))) for c in range(1 << 8))
    assert total == 0
