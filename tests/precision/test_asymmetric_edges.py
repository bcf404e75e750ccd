"""Asymmetric (zero-point) encodings at the edges: a span past float32, empty arrays."""

from __future__ import annotations

import numpy as np
import pytest

import dtypes
import precision


@pytest.mark.parametrize("name", ["uint8", "uint4"])
@pytest.mark.parametrize("top", [3e38, 3.4028235e38])
def test_a_group_spanning_all_of_float32_decodes_finite_and_saves(name, top, tmp_path):
    """max - min overflowed float32: the scale became inf and both values NaN, and
    `convert` wrote a file `load` refused. The span is taken in halves now."""
    x = np.array([top, -top, 1.0, 0.0], np.float32)
    t = precision.Tensor(x).to_reduced_precision(name)
    got = t.numpy()
    assert np.all(np.isfinite(got))
    step = np.float64(2 * top) / dtypes.get(name).qmax
    assert np.all(np.abs(got.astype(np.float64) - x) <= step)  # within one step
    precision.save(tmp_path / "t.safetensors", {"t": t})
    np.testing.assert_array_equal(precision.load(tmp_path / "t.safetensors")["t"].numpy(), got)


@pytest.mark.parametrize("name", ["uint8", "uint4"])
def test_convert_of_a_span_past_float32_writes_a_file_load_reads(name, tmp_path, capsys):
    """The command line wrote such a file with exit status 0 and `load` refused it."""
    import safetensors.numpy

    from precision._cli import main

    x = np.tile(np.array([3e38, -3e38, 1.0, 2.0], np.float32), (4, 8))
    src, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    safetensors.numpy.save_file({"w": x}, str(src))
    assert main(["convert", str(src), "-o", str(out), "--to", name, "-q"]) == 0
    got = precision.load(out)["w"].numpy()
    step = np.float64(6e38) / dtypes.get(name).qmax
    assert np.all(np.isfinite(got))
    assert np.all(np.abs(got.astype(np.float64) - x) <= step)


@pytest.mark.parametrize("name", ["uint8", "uint4"])
@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 4)])
def test_empty_arrays_encode(name, shape):
    t = precision.Tensor(np.zeros(shape, np.float32)).to_reduced_precision(name)
    assert t.numpy().shape == shape
