"""`convert --to int8` in numpy gives the library's bytes.

The command encodes int8 with one scale per tensor or per row in numpy when the
absmaxes are ones `dtypes`' own rule on the host takes (`IntFormat.host_rule`,
`host_absmax`, `host_codes`: tests/dtypes/test_int_host.py holds them to the
compiled encode); these tests hold the command's blocks, parts and worker threads
to the library's encode of the whole tensor, with absmaxes at both ends of the
range and just outside it (which go to the compiled encode). That it imports no
JAX is checked with the other numpy paths in test_cli.py.
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
from precision._cli import _convert_command as _cli_convert
from precision._cli import _convert_engine as _cli_engine
from precision._cli import _convert_modes as _cli_modes
from precision._cli import _convert_stats as _cli_stats
from precision._cli import _main as _cli

LOW, HIGH = dtypes.int8.HOST_ABSMAX


def library(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    enc = dtypes.int8.encode(jnp.asarray(x), scaling=dtypes.PerTensor())
    return np.asarray(enc.data), np.asarray(enc.scale, np.float32).reshape(-1)


def values(seed: int, e: int, kind: str, n: int = 5003) -> np.ndarray:
    """float32 values around 2**e: random, exact halves of a step, or the edges."""
    rng = np.random.default_rng(seed)
    step = np.float32(2.0**e)
    if kind == "halves":  # absmax 127 * 2**e: x * (127 / absmax) = k + 0.5 exactly
        x = ((rng.integers(-127, 127, n) + np.float32(0.5)) * step).astype(np.float32)
        x[0] = np.float32(127) * step
    else:
        x = (rng.standard_normal(n) * step).astype(np.float32)
    if kind == "edges":
        top = np.float32(np.max(np.abs(x)))
        edge = [-top, np.nextafter(top, np.float32(0)), 1e-40, -1e-45, 0.0, -0.0]
        edge += [np.float32(2.0**-126), top / np.float32(254), -top / np.float32(254)]
        x[: len(edge)] = np.asarray(edge, np.float32)
    return x


BELOW = np.nextafter(np.float32(LOW), np.float32(0))
ABOVE = np.nextafter(np.float32(HIGH), np.float32(np.inf))


@pytest.mark.parametrize(
    "absmax",
    [LOW, HIGH, BELOW, ABOVE, 2.0**-126, 3e38],
    ids=["low", "high", "below", "above", "tiny", "near-max"],
)
def test_each_absmax_gives_the_library_bytes(tmp_path, monkeypatch, absmax):
    # In the range (and all zeros): numpy, each block in three uneven parts on worker
    # threads; outside it: the compiled encode.
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
    in_range = {n for n, v in tensors.items() if dtypes.int8.host_absmax(np.max(np.abs(v)))}
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


# --------------------------------------------------------------------------
# one scale per row (`--to int8`'s default `per-axis:0`): the introws mode

ROWS, COLS = 16, 301
ROW_KINDS = ["random", "halves", "edges", "zero"]


def library_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    enc = dtypes.int8.encode(jnp.asarray(x), scaling=dtypes.PerAxis(0))
    return np.asarray(enc.data), np.asarray(enc.scale, np.float32).reshape(-1)


def row_block(seed: int, exponents: list[int], kinds: list[str]) -> np.ndarray:
    """Rows of `values`, row i around 2**exponents[i] of kinds[i] (or all zeros)."""
    rows = [
        np.zeros(COLS, np.float32) if kind == "zero" else values(seed + i, e, kind)[:COLS]
        for i, (e, kind) in enumerate(zip(exponents, kinds, strict=True))
    ]
    return np.stack(rows)


@given(
    seed=st.integers(0, 2**31),
    exponents=st.lists(st.integers(-99, 93), min_size=ROWS, max_size=ROWS),
    kinds=st.lists(st.sampled_from(ROW_KINDS), min_size=ROWS, max_size=ROWS),
    parts=st.integers(1, 4),
)
def test_numpy_row_codes_are_the_library_codes(seed, exponents, kinds, parts):
    # The numpy part of a block of rows (`_int_rows_part`, in `parts` parts of whole
    # rows as the workers run it): each row's absmax, codes and scale, bit for bit.
    x = row_block(seed, exponents, kinds)
    top = np.empty(ROWS, np.float32)
    codes = np.empty(x.size, np.int8)
    scratch = (np.empty(x.size, np.float32), np.empty(x.size, np.float32))
    int8 = dtypes.int8
    step = -(-ROWS // parts) * COLS
    for start in range(0, x.size, step):
        p = slice(start, min(start + step, x.size))
        _cli_stats._int_rows_part((int8, top, COLS), x.reshape(-1), codes, scratch, False, p)
    assume(int8.host_absmax(top))  # (rows whose absmax left the range: below)
    want_codes, want_scale = library_rows(x)
    np.testing.assert_array_equal(codes.reshape(ROWS, COLS), want_codes)
    assert int8.host_scales(top).tobytes() == want_scale.tobytes()


def test_a_row_outside_the_range_leaves_its_part_to_the_caller():
    x = row_block(1, [0] * ROWS, ["random"] * ROWS)
    x[5] *= np.float32(2.0**-110)  # absmax below the range: nonzero, not numpy's
    top = np.empty(ROWS, np.float32)
    codes = np.zeros(x.size, np.int8)
    scratch = (np.empty(x.size, np.float32), np.empty(x.size, np.float32))
    part = (dtypes.int8, top, COLS)
    whole = slice(0, x.size)
    assert _cli_stats._int_rows_part(part, x.reshape(-1), codes, scratch, True, whole) is None
    assert top.tobytes() == np.max(np.abs(x), axis=1).tobytes()
    assert not dtypes.int8.host_absmax(top)
    assert not np.any(codes)  # nothing written: the block is the compiled encode's


def per_row_tensors() -> dict[str, np.ndarray]:
    """Tensors for `convert --to int8` in blocks of 12 rows of 83 (3 parts of 4 rows)."""
    rng = np.random.default_rng(7)
    shift = np.float32(2.0) ** rng.integers(-98, 95, (61, 1)).astype(np.float32)
    w = np.clip(rng.standard_normal((61, 83)), -4, 4).astype(np.float32) * shift
    w[0] = np.clip(w[0], -1, 1) / np.max(np.abs(w[0])) * np.float32(LOW)  # the range's ends
    w[0, 0], w[1, 0] = np.float32(LOW), np.float32(HIGH)
    w[1, 1:] = np.clip(w[1, 1:], -HIGH, HIGH)
    w[2] = (rng.integers(-127, 127, 83) + np.float32(0.5)) * np.float32(2.0**-3)  # halves
    w[2, 0] = np.float32(127 * 2.0**-3)
    w[3], w[4] = 0.0, -0.0  # all-zero rows: scale 1, codes 0
    w[5, :6] = [1e-40, -1e-40, -0.0, 2.0**-126, 7e-39, -1e-45]  # subnormals in a row
    w[6] = values(3, -20, "edges")[:83]  # the row's absmax, its halves of a step
    # rows whose absmax is just outside the range (or subnormal, or near float32's
    # max) among normal rows: blocks 1 and 2 of four are the compiled encode's
    mixed = rng.standard_normal((40, 83)).astype(np.float32)
    mixed[13] = np.clip(mixed[13], -1, 1) * BELOW
    mixed[14, :] = 0
    mixed[14, 9] = -1e-40
    mixed[30] = np.clip(mixed[30], -1, 1) * ABOVE
    mixed[31] = np.clip(mixed[31], -1, 1) * np.float32(3e38)
    return {
        "w": w,
        "mixed": mixed,
        "h": (rng.standard_normal((16, 83)) * 2.0 ** rng.integers(-60, 60, (16, 1))).astype(
            ml_dtypes.bfloat16
        ),
        "f": (rng.standard_normal((9, 83)) * 2.0 ** rng.integers(-16, 14, (9, 1))).astype(
            np.float16
        ),
        "t": (rng.standard_normal((14, 5, 17)) * 2.0 ** rng.integers(-9, 9, (14, 1, 1))).astype(
            np.float32
        ),
    }


def test_per_row_int8_gives_the_library_bytes(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(_cli_modes, "_BLOCK", 1024)  # 12 rows of 83 a block
    monkeypatch.setattr(_cli_stats, "_PART", 64)
    monkeypatch.setattr(_cli_stats, "_WORKERS", 3)
    compiled = []  # the blocks given to the compiled encode
    block = _cli_engine._Engine.block
    monkeypatch.setattr(
        _cli_engine._Engine,
        "block",
        lambda self, x, *a, **k: compiled.append(x.shape) or block(self, x, *a, **k),
    )
    sqnr = {}
    monkeypatch.setattr(_cli_convert, "_report_sqnr", lambda s, args: sqnr.update(s))
    tensors = per_row_tensors()
    src, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    safetensors.numpy.save_file(tensors, str(src))
    assert _cli.main(["convert", str(src), "--to", "int8", "--dry-run"]) == 0
    how = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    assert all(how[n].endswith("numpy blocks of rows") for n in tensors)
    assert _cli.main(["convert", str(src), "-o", str(out), "--to", "int8", "--keep", "none"]) == 0
    assert compiled == [(12, 83), (12, 83)]  # mixed's blocks 1 and 2, nothing else
    loaded = precision.load(out)
    for name, value in tensors.items():
        x = np.asarray(value, np.float32)
        enc = loaded[name].encoded
        assert enc.scaling == dtypes.PerAxis(0)
        want_codes, want_scale = library_rows(x)
        np.testing.assert_array_equal(np.asarray(enc.data), want_codes, err_msg=name)
        got_scale = np.asarray(enc.scale, np.float32).reshape(-1)
        assert got_scale.tobytes() == want_scale.tobytes(), name
        # the statistic the compiled path reports: SQNR of the decoded tensor
        x64, y64 = x.astype(np.float64), np.asarray(loaded[name].numpy(), np.float64)
        expected = 10 * np.log10(np.sum(x64 * x64) / np.sum((x64 - y64) ** 2))
        assert sqnr[name] == pytest.approx(expected, abs=1e-3), name


@pytest.mark.parametrize("bad", [np.nan, -np.inf])  # (NaN: the maximum; -inf: the minimum)
def test_per_row_int8_refuses_nan_and_inf_as_the_rows_mode(tmp_path, monkeypatch, capsys, bad):
    monkeypatch.setattr(_cli_modes, "_BLOCK", 1024)
    x = np.random.default_rng(2).standard_normal((40, 83)).astype(np.float32)
    x[27, 5] = bad  # in the third block
    src, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    safetensors.numpy.save_file({"w": x}, str(src))
    argv = ["convert", str(src), "-o", str(out), "--to", "int8", "-q"]
    assert _cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "holds NaN or inf, which a scaled int8 encoding cannot hold" in err
    assert not out.exists()
    monkeypatch.setattr(_cli_modes, "_numpy_int", lambda *a: False)  # the rows mode
    assert _cli.main(argv) == 1
    assert capsys.readouterr().err == err


# --------------------------------------------------------------------------
# one scale per column (`per-axis:1`, a Conv1D weight's default): the intcols mode


def test_per_column_int8_gives_the_library_bytes(tmp_path, monkeypatch, capsys):
    # Each matrix of the per-row case transposed: numpy blocks of 12 rows in parts on
    # worker threads with every column's absmax read first; `mixed`, whose columns
    # hold absmaxes outside the host rule's range, is the compiled columns mode's.
    monkeypatch.setattr(_cli_modes, "_BLOCK", 1024)
    monkeypatch.setattr(_cli_stats, "_PART", 64)
    monkeypatch.setattr(_cli_stats, "_WORKERS", 3)
    compiled = []
    block = _cli_engine._Engine.block
    monkeypatch.setattr(
        _cli_engine._Engine,
        "block",
        lambda self, x, *a, **k: compiled.append(x.shape) or block(self, x, *a, **k),
    )
    sqnr = {}
    monkeypatch.setattr(_cli_convert, "_report_sqnr", lambda s, args: sqnr.update(s))
    tensors = {n: np.ascontiguousarray(v.T) for n, v in per_row_tensors().items() if v.ndim == 2}
    src, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    safetensors.numpy.save_file(tensors, str(src))
    argv = ["convert", str(src), "--to", "int8", "--scaling", "per-axis:1"]
    assert _cli.main([*argv, "--dry-run"]) == 0
    how = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    assert all(how[n].endswith("column absmax pass, then numpy blocks of rows") for n in tensors)
    assert _cli.main([*argv, "-o", str(out), "--keep", "none"]) == 0
    assert compiled
    assert set(compiled) == {(1024 // 40, 40)}  # mixed's blocks alone
    loaded = precision.load(out)
    for name, value in tensors.items():
        x = np.asarray(value, np.float32)
        enc = loaded[name].encoded
        assert enc.scaling == dtypes.PerAxis(1)
        want = dtypes.int8.encode(jnp.asarray(x), scaling=dtypes.PerAxis(1))
        np.testing.assert_array_equal(np.asarray(enc.data), np.asarray(want.data), err_msg=name)
        got_scale = np.asarray(enc.scale, np.float32).reshape(-1)
        assert got_scale.tobytes() == np.asarray(want.scale, np.float32).reshape(-1).tobytes()
        x64, y64 = x.astype(np.float64), np.asarray(loaded[name].numpy(), np.float64)
        expected = 10 * np.log10(np.sum(x64 * x64) / np.sum((x64 - y64) ** 2))
        assert sqnr[name] == pytest.approx(expected, abs=1e-3), name


@pytest.mark.parametrize("bad", [np.nan, -np.inf])
def test_per_column_int8_refuses_nan_and_inf(tmp_path, capsys, bad):
    x = np.random.default_rng(2).standard_normal((40, 83)).astype(np.float32)
    x[27, 5] = bad
    src, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    safetensors.numpy.save_file({"w": x}, str(src))
    argv = ["convert", str(src), "-o", str(out), "--to", "int8", "--scaling", "per-axis:1"]
    assert _cli.main([*argv, "-q"]) == 1
    assert "holds NaN or inf, which a scaled int8 encoding cannot hold" in capsys.readouterr().err
    assert not out.exists()
