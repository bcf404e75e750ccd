"""The same bits on every backend, checked without a GPU.

A GPU divides float32 inexactly, may canonicalize a NaN's sign in a
conversion, keeps subnormal products that XLA:CPU flushes, and XLA removes
convert round trips where excess precision is allowed. XLA:CPU under its
fast-math flags does all of that and more (it also assumes there is no NaN or
inf, and reassociates), so an encoding whose bits survive those flags is
built without any floating-point operation whose rounding a backend chooses.

`backend_bits.py` (beside this file) encodes, decodes and rounds an
adversarial array in every format, encoding, scaling, scale format and
rounding mode of its CI subset (`cases(ci=True)`); this test runs it in two fresh processes,
with and without the flags, and compares every digest. The full case list
runs under `HYPOTHESIS_PROFILE=hunt` (see `tests/conftest.py`) and on accelerators
(`benchmarks/accelerator.py`).

Known exception: int1's mean-absolute scales (its pairwise sum) reassociate
under the fast-math flags (one ulp in a few groups); XLA:GPU does not
reassociate, so they are compared on a GPU only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from backend_bits import FAST_MATH_FLAGS, REASSOCIATED  # noqa: E402


def _start(tmp: Path, name: str, flags: str, ci: bool) -> tuple[subprocess.Popen, Path]:
    """Run backend_bits.py in a fresh process under `flags` (both runs go at once)."""
    out = tmp / f"{name}.json"
    env = dict(os.environ, XLA_FLAGS=flags, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    args = [sys.executable, str(HERE / "backend_bits.py"), str(out)]
    args += ["--ci"] if ci else []
    return subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True), out


def test_encodings_are_bit_identical_under_fast_math(tmp_path):
    ci = os.environ.get("HYPOTHESIS_PROFILE") != "hunt"  # the full list when hunting
    plain, plain_out = _start(tmp_path, "plain", "", ci)
    fast, fast_out = _start(tmp_path, "fast", FAST_MATH_FLAGS, ci)
    for proc in (plain, fast):
        _, err = proc.communicate(timeout=1500)
        assert proc.returncode == 0, err[-4000:]
    a = json.loads(plain_out.read_text())
    b = json.loads(fast_out.read_text())
    assert a.keys() == b.keys()
    parts = ("codes", "scales", "tensor scale", "zero points", "decoded", "rounded")
    diffs = []
    for case in a:
        if case.startswith(REASSOCIATED) or a[case] == b[case]:
            continue
        if isinstance(a[case], str) or isinstance(b[case], str):
            diffs.append(f"{case}: {a[case]} / {b[case]}")
            continue
        which = [p for p, x, y in zip(parts, a[case], b[case], strict=True) if x != y]
        diffs.append(f"{case}: {', '.join(which)} differ")
    assert not diffs, "\n".join(diffs)
    assert len(a) > 100  # the case list did run


@pytest.mark.parametrize("flags", ["", FAST_MATH_FLAGS], ids=["default", "fast-math"])
def test_divide_is_correctly_rounded_under_any_flags(flags, tmp_path):
    """`_ieee.divide` against numpy's IEEE division on 1M random bit patterns of its
    domain and the quotients the scales use (numpy is the independent reference)."""
    script = tmp_path / "div.py"
    script.write_text(
        "import numpy as np, jax\n"
        "from dtypes._ieee import divide\n"
        "rng = np.random.default_rng(1)\n"
        "a, b = rng.integers(0, 2**32, (2, 1 << 20), dtype=np.uint64).astype(np.uint32)"
        ".view(np.float32)\n"
        "b[:1000] = np.float32([127, 7, 1, 448, 57344, 6, 28, 7.5, 255, 15] * 100)\n"
        "tiny = np.float32(2.0**-126)\n"
        "# divide's domain: finite a, finite normal nonzero b (what every scale needs)\n"
        "keep = np.isfinite(a) & np.isfinite(b) & (np.abs(b) >= tiny)\n"
        "a, b = a[keep], b[keep]\n"
        "flush = lambda v: np.where(np.abs(v) < tiny, v * 0, v)\n"
        "with np.errstate(all='ignore'):\n"
        "    want = flush(flush(a) / flush(b)).astype(np.float32)\n"
        "got = np.asarray(jax.jit(divide)(a, b))\n"
        "same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))\n"
        "assert same.all(), (a[~same][:5], b[~same][:5], got[~same][:5], want[~same][:5])\n"
    )
    env = dict(os.environ, XLA_FLAGS=flags, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("flags", ["", FAST_MATH_FLAGS], ids=["default", "fast-math"])
def test_prescaled_quotients_are_numpys_under_any_flags(flags, tmp_path):
    """`_ieee.quotient_times_pow2(a, b, shift)` (a reciprocal as numpy rounds it, on
    float32's subnormal grid below 2**-126, times 2**shift: 64 past 2**100) against
    numpy, which keeps subnormals: every float32 `b` whose `1 / b` is subnormal (int2's
    and the code books' top, 2**24 values), 2**20 others across the range of each top."""
    _passes_under(
        flags,
        tmp_path / "below.py",
        "import numpy as np, jax\n"
        "from dtypes._ieee import quotient_times_pow2\n"
        "f = jax.jit(quotient_times_pow2, static_argnums=0)\n"
        "rng = np.random.default_rng(5)\n"
        "top_bits = int(np.float32(np.finfo(np.float32).max).view(np.uint32))\n"
        "for a in np.float32([1, 0.5, 1.75, 3.5, 7, 127]):\n"
        "    low = int(np.float32(max(a, 1) * np.float32(2.0**-126)).view(np.uint32))\n"
        "    u = rng.integers(low, top_bits + 1, 1 << 20)\n"
        "    if a == 1:\n"
        "        u = np.concatenate([u, np.arange(0x7E800001, top_bits + 1)])\n"
        "    b = np.concatenate([u.astype(np.uint32).view(np.float32), np.float32([2.0**100])])\n"
        "    shift = np.where(b > np.float32(2.0**100), 64, 0).astype(np.int32)\n"
        "    with np.errstate(under='ignore'):\n"
        "        want = (np.float64(a) / b.astype(np.float64)).astype(np.float32)\n"
        "    got = np.asarray(f(a, b, shift)).astype(np.float64)\n"
        "    same = got == want.astype(np.float64) * np.exp2(shift)\n"
        "    assert same.all(), (a, b[~same][:5], got[~same][:5], want[~same][:5])\n",
    )


@pytest.mark.parametrize("flags", ["", FAST_MATH_FLAGS], ids=["default", "fast-math"])
def test_wide_group_scales_under_any_flags(flags, tmp_path):
    """int8 scales of rows and columns wider than the 32 lanes the absmax is staged in (the
    lanes finished as floats, `absmax_made_once`), against numpy, with NaN, inf, zero,
    subnormal-only and subnormal-beside-normal groups: the same under fast-math flags,
    which flush subnormals in comparisons (the adversarial digests above hold rows of 32)."""
    _passes_under(
        flags,
        tmp_path / "wide.py",
        "import numpy as np, jax, dtypes\n"
        "rng = np.random.default_rng(7)\n"
        "tiny = np.float32(2.0**-126)\n"
        "for shape in [(256, 1024), (300, 1500), (4, 70000)]:\n"
        "    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-60, 60, shape)))"
        ".astype(np.float32)\n"
        "    x[0, 5] = np.nan; x[1, 7] = np.inf; x[2, 9] = -np.inf\n"
        "    if shape[0] > 6:\n"
        "        x[3] = 0.0; x[4] = np.float32(3e-39); x[4, ::7] = -np.float32(1e-40)\n"
        "        x[5] = np.float32(1e-39); x[5, -1] = np.float32(2.0**-120)\n"
        "    for axis in (0, 1, None):\n"
        "        sc = dtypes.PerTensor() if axis is None else dtypes.PerAxis(axis)\n"
        "        got = np.asarray(jax.jit(lambda v: dtypes.int8.encode(v, scaling=sc).scale)(x))\n"
        "        flushed = np.where(np.abs(x) < tiny, np.float32(0), x)\n"
        "        red = None if axis is None else 1 - axis\n"
        "        with np.errstate(invalid='ignore'):\n"
        "            amax = np.max(np.abs(flushed), axis=red, keepdims=True)\n"
        "            bad = ~np.isfinite(flushed).all(axis=red, keepdims=True)\n"
        "        # (a scale below the smallest normal is raised to it, its reciprocal 2**126)\n"
        "        scale = np.where(amax < np.float32(127) * tiny, tiny, amax / np.float32(127))\n"
        "        want = np.where(bad, np.nan, np.where(amax == 0, np.float32(1), scale))"
        ".astype(np.float32).reshape(got.shape)\n"
        "        same = (got.view(np.uint32) == want.view(np.uint32)) | "
        "(np.isnan(got) & np.isnan(want))\n"
        "        assert same.all(), (shape, axis, np.argwhere(~same)[:5], got[~same][:5])\n",
    )


@pytest.mark.parametrize("flags", ["", FAST_MATH_FLAGS], ids=["default", "fast-math"])
def test_scaled_fp8_codes_under_any_flags(flags, tmp_path):
    """fp8 codes under float32 absmax scales, per row, per column and per tensor, against
    numpy and ml_dtypes, with NaN, inf, negative NaN, zero and subnormal groups. The CPU
    form (`_float_codec._byte_codes`) makes NaN and inf +0 on the bits and leaves the clip
    out; under fast-math flags, which assume no NaN or inf, a finite element of such a
    group must still give the zero of its sign and a NaN or inf +0. (The digests above
    take these encodes in other rounding modes only.)"""
    _passes_under(
        flags,
        tmp_path / "fp8.py",
        "import ml_dtypes, numpy as np, jax, dtypes\n"
        "rng = np.random.default_rng(11)\n"
        "tiny = np.float32(2.0**-126)\n"
        "x = (rng.standard_normal((96, 160)) * np.exp2(rng.integers(-30, 30, (96, 160))))"
        ".astype(np.float32)\n"
        "x[0, 5] = np.nan; x[1, 7] = np.inf; x[2, 9] = -np.inf\n"
        "x[3, 11] = np.array(0xFFC00000, np.uint32).view(np.float32)  # (a negative NaN)\n"
        "x[4, ::3] = -np.inf; x[5] = 0.0; x[6] = np.float32(-3e-39)\n"
        "x[7] = np.float32(2.0**-120) * np.float32(rng.standard_normal(160))\n"
        "for name in ('float8_e4m3fn', 'float8_e5m2', 'float8_e4m3', 'float8_e3m4'):\n"
        "    fmt = dtypes.get(name)\n"
        "    native, top = np.dtype(getattr(ml_dtypes, name)), np.float32(fmt.max)\n"
        "    for axis in (0, 1, None):\n"
        "        sc = dtypes.PerTensor() if axis is None else dtypes.PerAxis(axis)\n"
        "        v = np.where(np.isfinite(x), x, np.float32(1)) if axis is None else x\n"
        "        got = np.asarray(jax.jit(lambda u: fmt.encode(u, scaling=sc).data)(v))"
        ".view(np.uint8)\n"
        "        flushed = np.where(np.abs(v) < tiny, np.float32(0) * np.sign(v), v)\n"
        "        red = None if axis is None else 1 - axis\n"
        "        with np.errstate(invalid='ignore', divide='ignore', over='ignore'):\n"
        "            amax = np.max(np.abs(flushed), axis=red, keepdims=True)\n"
        "            bad = ~np.isfinite(flushed).all(axis=red, keepdims=True)\n"
        "            inv = np.where(amax < top * tiny, np.float32(2.0**126), top / amax)\n"
        "            inv = np.where(bad | (amax == 0), np.float32(0), inv).astype(np.float32)\n"
        "            y = np.where(np.isfinite(flushed), flushed * inv, np.float32(0))\n"
        "        want = y.astype(np.float32).astype(native).view(np.uint8)\n"
        "        same = got == want\n"
        "        assert same.all(), (name, axis, np.argwhere(~same)[:5], got[~same][:5], "
        "want[~same][:5])\n",
    )


def _passes_under(flags: str, script: Path, code: str) -> None:
    """Run `code` as `script` in a fresh process under XLA `flags`; it must exit cleanly."""
    script.write_text(code)
    env = dict(os.environ, XLA_FLAGS=flags, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
