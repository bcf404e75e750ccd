"""`convert --to int8 --scaling per-tensor` in numpy gives the library's codes.

The command encodes per-tensor int8 with numpy when the tensor's absmax lies
in `_NUMPY_ABSMAX` (`_convert_engine._numpy_int` says why that is exact);
these tests hold it to the library's compiled encode, the specification, over
the inputs where the two could part: exact halves, subnormals, values at the
absmax, scales at both ends of the range, and absmaxes just outside it
(which go to the compiled encode). That it imports no JAX is checked with the
other numpy paths in test_cli.py.
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from hypothesis import assume, given
from hypothesis import strategies as st

import dtypes
import precision
from precision._cli import _convert as _cli_convert
from precision._cli import _convert_engine as _cli_engine
from precision._cli import _convert_modes as _cli_modes
from precision._cli import _convert_stats as _cli_stats
from precision._cli import _main as _cli

N = 5003  # past XLA:CPU's vectorisation threshold, and odd
LOW, HIGH = _cli_modes._NUMPY_ABSMAX


def library(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    enc = dtypes.int8.encode(jnp.asarray(x), scaling=dtypes.PerTensor())
    return np.asarray(enc.data), np.asarray(enc.scale, np.float32).reshape(-1)


def values(seed: int, e: int, kind: str) -> np.ndarray:
    """float32 values around 2**e: random, exact halves of a step, or the edges."""
    rng = np.random.default_rng(seed)
    step = np.float32(2.0**e)
    if kind == "halves":  # absmax 127 * 2**e: x * (127 / absmax) = k + 0.5 exactly
        x = ((rng.integers(-127, 127, N) + np.float32(0.5)) * step).astype(np.float32)
        x[0] = np.float32(127) * step
    else:
        x = (rng.standard_normal(N) * step).astype(np.float32)
    if kind == "edges":
        top = np.float32(np.max(np.abs(x)))
        edge = [-top, np.nextafter(top, np.float32(0)), 1e-40, -1e-45, 0.0, -0.0]
        edge += [np.float32(2.0**-126), top / np.float32(254), -top / np.float32(254)]
        x[: len(edge)] = np.asarray(edge, np.float32)
    return x


@given(
    seed=st.integers(0, 2**32 - 1),
    e=st.integers(-106, 97),
    kind=st.sampled_from(["random", "halves", "edges"]),
)
def test_numpy_codes_are_the_library_codes(seed, e, kind):
    x = values(seed, e, kind)
    absmax = np.float32(np.max(np.abs(x)))
    assume(LOW <= absmax <= HIGH)
    codes = _cli_modes._int_codes(x, absmax, np.float32(127)).astype(np.int8)
    want_codes, want_scale = library(x)
    np.testing.assert_array_equal(codes, want_codes)
    assert (absmax / np.float32(127)).tobytes() == want_scale.tobytes()


BELOW = np.nextafter(np.float32(LOW), np.float32(0))
ABOVE = np.nextafter(np.float32(HIGH), np.float32(np.inf))


@pytest.mark.parametrize(
    "absmax",
    [LOW, HIGH, BELOW, ABOVE, 2.0**-126, 3e38],
    ids=["low", "high", "below", "above", "tiny", "near-max"],
)
def test_each_absmax_gives_the_library_bytes(tmp_path, monkeypatch, absmax):
    # In the range: numpy, each block in three uneven parts on worker threads;
    # outside it (and all zeros): the compiled encode.
    monkeypatch.setattr(_cli_stats, "_PART", 64)
    monkeypatch.setattr(_cli_stats, "_WORKERS", 3)
    numpy_path = []
    run = _cli_engine._Converter._int_blocks
    monkeypatch.setattr(
        _cli_engine._Converter,
        "_int_blocks",
        lambda self, plan, *a: numpy_path.append(plan.leaf.name) or run(self, plan, *a),
    )
    sqnr = {}
    monkeypatch.setattr(_cli_convert, "_report_sqnr", lambda s, args: sqnr.update(s))
    rng = np.random.default_rng(5)
    x = np.clip(rng.standard_normal((61, 83)), -1, 1).astype(np.float32) * np.float32(absmax)
    x[0, 0] = np.float32(absmax)
    x[1, :4] = [1e-40, -1e-40, -0.0, 2.0**-126]
    tensors = {"w": x, "h": x[:8].astype(ml_dtypes.bfloat16), "v": x.reshape(-1)[:999].copy()}
    tensors["z"] = np.zeros(40, np.float32)  # absmax 0: scale 1, codes 0
    if absmax <= 65504:
        tensors["f"] = x[:5].astype(np.float16)
    src, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    safetensors.numpy.save_file(tensors, str(src))
    argv = ["convert", str(src), "-o", str(out), "--to", "int8", "--scaling", "per-tensor"]
    assert _cli.main([*argv, "--keep", "none", "-q"]) == 0
    in_range = {n for n, v in tensors.items() if LOW <= np.max(np.abs(np.float32(v))) <= HIGH}
    assert set(numpy_path) == in_range
    assert ("w" in in_range) == (LOW <= absmax <= HIGH)
    loaded = precision.load(out)
    for name, value in tensors.items():
        enc = loaded[name].encoded
        want_codes, want_scale = library(np.asarray(value, np.float32))
        np.testing.assert_array_equal(np.asarray(enc.data), want_codes)
        assert np.asarray(enc.scale, np.float32).reshape(-1).tobytes() == want_scale.tobytes()
        x64, y64 = np.float64(value), np.asarray(loaded[name].numpy(), np.float64)
        # (not for all zeros, nor for values around float32's subnormals, which the
        # compiled statistics read as 0 on XLA:CPU)
        if np.max(np.abs(x64)) >= BELOW:
            expected = 10 * np.log10(np.sum(x64 * x64) / np.sum((x64 - y64) ** 2))
            assert sqnr[name] == pytest.approx(expected, abs=1e-3), name
