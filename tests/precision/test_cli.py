"""The `precision` command line, run as a subprocess and in-process.

Inputs are written with the `safetensors` package (an independent writer);
converted values are compared with the library's own `Format.encode`, report
numbers with `precision.testing.error_report`, plots with matplotlib's reader.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import jax.numpy as jnp
import matplotlib.image
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from safetensors import safe_open

import dtypes
import precision
from precision import Tensor
from precision._cli import _arguments as _cli_arguments
from precision._cli import _convert_command as _cli_convert
from precision._cli import _convert_modes as _cli_modes
from precision._cli import _convert_stats as _cli_stats
from precision._cli import _main as _cli
from precision.testing._metrics import error_report, sqnr_db

RNG = np.random.default_rng(11)
INPUT = {
    "encoder.weight": RNG.standard_normal((6, 40)).astype(np.float32),
    "encoder.bias": RNG.standard_normal(40).astype(np.float32) * 0.1,
    "head.weight": RNG.standard_normal((4, 32)).astype(ml_dtypes.bfloat16),
    "position_ids": np.arange(7, dtype=np.int64),
}
FLOATS = ["encoder.weight", "encoder.bias", "head.weight"]
PYTHON = [sys.executable, "-m", "precision"]
HUNT = os.environ.get("HYPOTHESIS_PROFILE") == "hunt"
SCRIPT = os.path.join(os.path.dirname(sys.executable), "precision")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "model.safetensors"
    safetensors.numpy.save_file(INPUT, str(path))
    return path


def run(*args: str, cmd=PYTHON) -> subprocess.CompletedProcess:
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)


def raw_arrays(path) -> dict[str, np.ndarray]:
    with safe_open(str(path), framework="numpy") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def assert_encoded_like_library(t: Tensor, x: np.ndarray, fmt: dtypes.Format, scaling=None):
    """`t` holds exactly the storage `fmt.encode` produces for the float32 values `x`."""
    if fmt.is_full_precision and scaling is None:
        assert t.format == dtypes.float32
        np.testing.assert_array_equal(np.asarray(t.encoded.data), x)
        return
    expected = fmt.encode(jnp.asarray(x), scaling=scaling)
    got = t.encoded
    assert (got.format, got.scaling, got.shape) == (fmt, expected.scaling, expected.shape)
    np.testing.assert_array_equal(
        np.asarray(got.data).reshape(-1).view(np.uint8),
        np.asarray(expected.data).reshape(-1).view(np.uint8),
    )
    for part in ("scale", "tensor_scale", "zero_point"):
        want, have = getattr(expected, part), getattr(got, part)
        if want is None:
            assert have is None, part
        else:
            want, have = np.asarray(want), np.asarray(have)
            assert (have.dtype, have.shape, have.tobytes()) == (
                want.dtype,
                want.shape,
                want.tobytes(),
            ), part


# --------------------------------------------------------------------------
# entry points and help


def test_console_script_and_module_print_the_format_table():
    by_script, by_module = run("formats", cmd=[SCRIPT]), run("formats")
    assert by_script.returncode == by_module.returncode == 0
    assert by_script.stdout == by_module.stdout
    rows = {line.split()[0]: line for line in by_script.stdout.splitlines()[2:] if line.strip()}
    for name, fmt in dtypes.FORMATS.items():
        assert name in rows
        assert f"{fmt.max:.6g}" in rows[name].split()
    assert "bf16" in rows["bfloat16"]


def test_formats_json(capsys):
    assert _cli.main(["formats", "--json"]) == 0
    every = json.loads(capsys.readouterr().out)
    rows = [r for r in every if r["registry"] == "FORMATS"]
    assert [r["name"] for r in rows] == list(dtypes.FORMATS)
    assert {r["name"]: r["bits"] for r in rows} == {n: f.bits for n, f in dtypes.FORMATS.items()}
    encodings = [r["name"] for r in every if r["registry"] == "ENCODINGS"]
    assert encodings == list(dtypes.ENCODINGS)
    assert len(every) == len(rows) + len(encodings)


# True storage per value of a large tensor, from the specifications: element bits plus
# the scale's bits shared by its block (OCP MX: 8-bit E8M0 per 32; NVFP4: 8-bit e4m3 per
# 16 and a float32 per tensor; NF4: float32 per 64); per-tensor scales and zero points
# are bytes per tensor.
TRUE_BITS = {
    "float4_e2m1fn": (4, 0),
    "float6_e2m3fn": (6, 0),
    "float6_e3m2fn": (6, 0),
    "float8_e4m3": (8, 0),
    "float8_e3m4": (8, 0),
    "float8_e8m0fnu": (8, 0),
    "mxfp8_e4m3": (8 + 8 / 32, 0),
    "mxfp8_e5m2": (8 + 8 / 32, 0),
    "mxfp6_e3m2": (6 + 8 / 32, 0),
    "mxfp6_e2m3": (6 + 8 / 32, 0),
    "mxfp4": (4 + 8 / 32, 0),
    "mxint8": (8 + 8 / 32, 0),
    "nvfp4": (4 + 8 / 16, 4),
    "nf4": (4 + 32 / 64, 0),
    "uint8": (8, 4 + 1),
    "uint4": (4, 4 + 1),
}


def test_formats_lists_named_encodings_at_their_true_bits(capsys):
    assert _cli.main(["formats", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(TRUE_BITS) <= set(rows)
    for name, (bits, per_tensor) in TRUE_BITS.items():
        assert (rows[name]["bits_per_value"], rows[name]["bytes_per_tensor"]) == (
            bits,
            per_tensor,
        ), name
    assert (rows["int4"]["bits_per_value"], rows["int4"]["bytes_per_tensor"]) == (4, 4)
    assert _cli.main(["formats"]) == 0
    table = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line}
    assert table["mxfp4"][-2:] == ["4.25", "-"]
    assert table["nvfp4"][-2:] == ["4.5", "4"]


@pytest.mark.parametrize("command", [[], ["formats"], ["convert"], ["report"]])
def test_help_on_every_subcommand(capsys, command):
    assert _cli.main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: precision {' '.join(command)}".rstrip())


def test_demo_help_is_the_demos_own(capsys):
    assert _cli.main(["demo", "--help"]) == 0
    assert "usage:" in capsys.readouterr().out


def test_demo_forwards_its_arguments(monkeypatch):
    import precision._cli._demo

    seen = []
    monkeypatch.setattr(precision._cli._demo, "main", lambda argv: seen.append(argv) or 3)
    assert _cli.main(["demo", "--modes", "fp32", "--epochs", "1"]) == 3
    assert seen == [["--modes", "fp32", "--epochs", "1"]]


def test_demo_missing_is_a_one_line_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "precision._cli._demo", None)  # import now fails
    monkeypatch.delattr(precision._cli, "_demo", raising=False)
    assert _cli.main(["demo"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("precision: error: the demo is not available")
    assert err.count("\n") == 1


# --------------------------------------------------------------------------
# convert


def preset_scaling(fmt: dtypes.Format, shape: tuple[int, ...]):
    """The documented default of --scaling: a named encoding's own block scaling (MX,
    NVFP4, NF4); else per-block 32 for integers of 4 bits or fewer, per output channel
    (axis 0) for int8 and uint8 but per tensor for one axis."""
    if isinstance(fmt.default_scaling(), dtypes.PerBlock):
        return fmt.default_scaling()
    if fmt.kind in ("int", "uint") and fmt.bits <= 4:
        return dtypes.PerBlock(32)
    if fmt.kind in ("int", "uint"):
        return dtypes.PerAxis(0) if len(shape) >= 2 else dtypes.PerTensor()
    return fmt.default_scaling()


def check_converted(out, fmt: dtypes.Format, given=INPUT, converted=FLOATS) -> None:
    loaded = precision.load(out)
    for tensor in FLOATS:
        x = np.asarray(given[tensor], np.float32)
        if tensor in converted:
            assert_encoded_like_library(loaded[tensor], x, fmt, preset_scaling(fmt, x.shape))
        else:  # kept: the input's values
            np.testing.assert_array_equal(np.asarray(loaded[tensor]), x)
    np.testing.assert_array_equal(loaded["position_ids"], given["position_ids"])


def test_convert_in_subprocesses(checkpoint, tmp_path):
    runs = {"int4": [SCRIPT], "float8_e5m2": PYTHON, "tf32": PYTHON}
    procs = {}
    for name, cmd in runs.items():  # side by side: each pays for starting Python and JAX
        out = tmp_path / f"{name}.safetensors"
        args = [*cmd, "convert", str(checkpoint), "-o", str(out), "--to", name, "--keep", "none"]
        procs[name] = (out, subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    for name, (out, proc) in procs.items():
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, stderr.decode()
        assert f"converted 3 tensor(s) to {name}" in stdout.decode()
        assert stderr == b""  # no progress bar when stderr is not a terminal
        check_converted(out, dtypes.get(name))


# Every registry entry the command line writes: all but those wider than float32 (a
# checkpoint holds float32 values at most; refused, test below).
CONVERTIBLE = [name for name, f in dtypes.REGISTRY.items() if f.bits <= 32]
WIDER = [name for name, f in dtypes.REGISTRY.items() if f.bits > 32]


def test_convert_lists_cover_the_registry():
    assert sorted(CONVERTIBLE + WIDER) == sorted(dtypes.REGISTRY)
    assert all(dtypes.get(n).bits <= 32 for n in CONVERTIBLE)


@pytest.mark.parametrize("name", CONVERTIBLE)
def test_convert_to_every_format(checkpoint, tmp_path, capsys, name):
    fmt, given, src = dtypes.get(name), INPUT, checkpoint
    if fmt.kind == "scale":
        # E8M0 holds positive powers of two only: it converts magnitudes (signed
        # values are refused, test_data_errors_exit_1_with_one_line)
        given = {k: np.abs(v) + v.dtype.type(2**-8) if k in FLOATS else v for k, v in INPUT.items()}
        src = tmp_path / "positive.safetensors"
        safetensors.numpy.save_file(given, str(src))
    # A named encoding (dtypes.ENCODINGS) converts the 2-D float32 tensor (partial
    # blocks, padded rows) and keeps the 1-D and bfloat16 ones: each tensor compiles
    # programs of its own. All three under the hunt profile.
    converted = FLOATS if name in dtypes.FORMATS or HUNT else FLOATS[:1]
    out = tmp_path / "out.safetensors"
    keep = "|".join(re.escape(t) for t in FLOATS if t not in converted) or "none"
    argv = ["convert", str(src), "-o", str(out), "--to", name, "-q", "--keep", keep]
    assert _cli.main(argv) == 0
    assert f"converted {len(converted)} tensor(s) to {name}" in capsys.readouterr().out
    check_converted(out, fmt, given, converted)


@pytest.mark.parametrize("name", WIDER)
def test_convert_refuses_formats_wider_than_float32(checkpoint, tmp_path, capsys, name):
    argv = ["convert", str(checkpoint), "-o", str(tmp_path / "out"), "--to", name]
    assert _cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"--to {name}: {name} is wider than the float32 values a checkpoint holds" in err
    assert err.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("fmt", "flag", "scaling"),
    [
        ("int4", "per-axis:0", dtypes.PerAxis(0)),
        ("int8", "per-block:16:pow2", dtypes.PerBlock(16, power_of_two=True)),
        ("e4m3", "per-tensor", dtypes.PerTensor()),
        ("int1", "per-axis:-1", dtypes.PerAxis(-1)),
    ],
)
def test_convert_with_scaling(checkpoint, tmp_path, capsys, fmt, flag, scaling):
    out = tmp_path / "out.safetensors"
    args = ["convert", str(checkpoint), "-o", str(out), "--to", fmt, "--scaling", flag]
    assert _cli.main([*args, "--exclude", "bias"]) == 0
    loaded = precision.load(out)
    for tensor in ["encoder.weight", "head.weight"]:
        x = np.asarray(INPUT[tensor], np.float32)
        assert_encoded_like_library(loaded[tensor], x, dtypes.get(fmt), scaling)
    assert "kept 1: excluded (--exclude)" in capsys.readouterr().out


def test_int4_group_128_with_bfloat16_scales(tmp_path):
    # the layout of GPTQ/AWQ-style int4 checkpoints: 4 bits a value plus one
    # bfloat16 scale per 128 values, 4.125 bits a value
    x = RNG.standard_normal((16, 512)).astype(np.float32)
    src, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    safetensors.numpy.save_file({"w": x}, str(src))
    argv = ["convert", str(src), "-o", str(out), "--to", "int4", "--scaling", "per-block:128:bf16"]
    assert _cli.main([*argv, "-q", "--keep", "none"]) == 0
    t = precision.load(out)["w"]
    scaling = dtypes.PerBlock(128, scale_format="bfloat16")
    assert t.scaling == scaling
    assert raw_arrays(out)["w:scale"].dtype == ml_dtypes.bfloat16
    expected = Tensor(x).to_reduced_precision("int4", scaling=scaling)
    assert t.numpy().tobytes() == expected.numpy().tobytes()
    assert_encoded_like_library(t, x, dtypes.get("int4"), scaling)
    header = 8 + int.from_bytes(out.read_bytes()[:8], "little")
    assert (out.stat().st_size - header) * 8 == x.size * 4.125


def test_scale_format_names(capsys):
    assert set(_cli_arguments._SCALE_SHORT) == set(dtypes.SCALE_FORMATS)
    assert set(_cli_arguments._SCALE_ORDER) == set(dtypes.SCALE_FORMATS)
    for name, short in _cli_arguments._SCALE_SHORT.items():
        assert dtypes.get(short).name == name
        pow2 = ":pow2" if name == "float8_e8m0fnu" else ""
        for word in (name, short, short.upper()):
            text = _cli._scaling_text(f"per-block:32{pow2}:{word}")
            scaling = _cli_arguments._scaling(text, dtypes.get("e4m3"))
            assert scaling == dtypes.PerBlock(32, power_of_two=bool(pow2), scale_format=name)
    per_tensor = _cli_arguments._scaling("per-tensor:fp16", dtypes.get("int8"))
    assert per_tensor == dtypes.PerTensor(scale_format="float16")
    # a named encoding keeps its scale format unless the text names one
    mxfp4 = dtypes.get("mxfp4")
    assert _cli_arguments._scaling("per-block:64:pow2", mxfp4).scale_format == "float8_e8m0fnu"
    assert _cli_arguments._scaling("per-block:64:bf16", mxfp4).scale_format == "bfloat16"
    assert _cli.main(["convert", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "per-block:128:bf16" in help_text
    assert "f32 (default), bf16, fp16, e4m3 or e8m0" in help_text


# Shapes that exercise every streamed path with tiny blocks (_BLOCK = 64
# values): a ragged last block, odd last axes (packed rows with padding), a
# long 1-D tensor, bfloat16 and float16 input, a scalar, an empty tensor.
STREAM_INPUT = {
    "a": RNG.standard_normal((9, 48)).astype(np.float32),
    "b": (RNG.standard_normal((5, 7)) * 1e-3).astype(np.float32),
    "c": RNG.standard_normal(1000).astype(np.float32),
    "d": RNG.standard_normal((6, 32)).astype(ml_dtypes.bfloat16),
    "e": RNG.standard_normal((3, 4, 16)).astype(np.float16),
    "f": np.array(2.5, np.float32),
    "g": np.zeros((0, 16), np.float32),
    "h": np.array([1e-40, -1e-40, 0.0, 3.0, -2.0, 7e-39, 1.5, -0.5], np.float32),
}

STREAM_CASES = [
    ("bfloat16", "none"),
    ("e4m3", "none"),
    ("float16", "none"),
    ("int4", "per-block:16"),
    ("int2", "per-block:8"),
    ("int8", "per-tensor"),
    ("e5m2", "per-tensor"),
    ("int4", "per-axis:0"),
    ("int8", "per-axis:-1"),
    ("int1", "per-tensor"),
    ("int4", "per-block:16:bf16"),
    ("int8", "per-axis:0:fp16"),
    ("int8", "per-block:16:pow2:e8m0"),
]
# Power-of-two float32 scales of each kind stream as their float32 ones do (the
# library computes the scale; pow2 with e8m0 bytes is above): under the hunt profile.
if os.environ.get("HYPOTHESIS_PROFILE") == "hunt":
    STREAM_CASES += [
        ("int8", "per-block:16:pow2"),
        ("int4", "per-tensor:pow2"),
        ("int8", "per-axis:0:pow2"),
    ]


@pytest.fixture(scope="module")
def stream_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("stream") / "s.safetensors"
    safetensors.numpy.save_file(STREAM_INPUT, str(path))
    return path


@pytest.mark.parametrize(("fmt", "flag"), STREAM_CASES, ids=["-".join(c) for c in STREAM_CASES])
def test_block_conversion_gives_the_library_bytes(
    stream_checkpoint, tmp_path, monkeypatch, fmt, flag
):
    monkeypatch.setattr(_cli_modes, "_BLOCK", 64)
    monkeypatch.setattr(_cli_stats, "_PART", 16)  # numpy paths: blocks in 3 uneven parts
    monkeypatch.setattr(_cli_stats, "_WORKERS", 3)
    blocks = []
    read = _cli_convert._Blocks.blocks
    monkeypatch.setattr(
        _cli_convert._Blocks,
        "blocks",
        lambda self, n, pad=False: blocks.append(self.name) or read(self, n, pad),
    )
    out = tmp_path / "out.safetensors"
    argv = ["convert", str(stream_checkpoint), "-o", str(out), "--to", fmt, "--scaling", flag]
    assert _cli.main([*argv, "-q", "--keep", "none"]) == 0
    streamed = fmt != "int1"  # int1's mean scales: the whole tensor at once
    assert ("a" in blocks) == streamed  # the block paths really ran
    scaling = _cli_arguments._scaling(flag, dtypes.get(fmt))
    loaded = precision.load(out)
    for name, value in STREAM_INPUT.items():
        x = np.asarray(value, np.float32)
        t = loaded[name]
        if t.format == dtypes.get(fmt):
            assert_encoded_like_library(t, x, dtypes.get(fmt), scaling)
        else:  # kept: the scaling does not fit (a scalar per axis, an empty tensor)
            assert t.format.name in ("float32", "bfloat16", "float16"), name


SPECIALS = np.array(
    [np.nan, np.inf, -np.inf, -0.0, 1e30, -1e30, 1e-45, 3e-39, 500, 65504, 7e4, 1.0], np.float32
)
# The registry's unscaled float formats narrower than float32: those with a NaN code
# convert NaN and ±inf; those with neither inf nor NaN (float4_e2m1fn, float6_*) refuse
# them, exit status 1.
UNSCALED = [
    f
    for f in dtypes.REGISTRY.values()
    if f.kind == "float" and f.default_scaling() is None and f.bits < 32
]
SPECIALS_KEPT = [f.name for f in UNSCALED if f.nan]
SPECIALS_REFUSED = [f.name for f in UNSCALED if not f.nan]


@pytest.mark.parametrize("fmt", SPECIALS_KEPT)
def test_unscaled_conversion_of_special_values(tmp_path, capsys, fmt):
    x = SPECIALS
    src, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    safetensors.numpy.save_file({"w": x}, str(src))
    assert _cli.main(["convert", str(src), "-o", str(out), "--to", fmt, "-q"]) == 0
    err = capsys.readouterr().err
    assert "RuntimeWarning" not in err  # numpy's overflow is the format's business
    if dtypes.get(fmt).max < 1e30:  # 1e30 overflows: the value is lost, SQNR says so
        assert "w -inf dB" in err
    t = precision.load(out)["w"]
    assert_encoded_like_library(t, x, dtypes.get(fmt))


@pytest.mark.parametrize("fmt", SPECIALS_REFUSED)
def test_unscaled_conversion_refuses_specials_a_format_cannot_hold(tmp_path, capsys, fmt):
    src, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    for special in (np.nan, np.inf):
        safetensors.numpy.save_file({"w": np.array([special, 1.0], np.float32)}, str(src))
        assert _cli.main(["convert", str(src), "-o", str(out), "--to", fmt, "-q"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("precision: error: tensor 'w'"), err
        assert "neither inf nor NaN" in err
        assert err.count("\n") == 1
        assert not out.exists()


def test_special_value_lists_cover_the_registry():
    assert set(SPECIALS_KEPT) | set(SPECIALS_REFUSED) == {
        n
        for n, f in dtypes.REGISTRY.items()
        if f.kind == "float" and f.default_scaling() is None and f.bits < 32
    }


def test_block_conversion_checks_the_crc(tmp_path, monkeypatch, capsys):
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    precision.save(src, {"w": RNG.standard_normal((8, 64)).astype(np.float32)})
    raw = bytearray(src.read_bytes())
    raw[-10] ^= 1  # in the last block
    src.write_bytes(bytes(raw))
    monkeypatch.setattr(_cli_modes, "_BLOCK", 64)
    assert _cli.main(["convert", str(src), "-o", str(dst), "--to", "bf16", "-q"]) == 1
    assert "do not match the CRC-32" in capsys.readouterr().err
    assert not dst.exists()


def test_scaling_that_does_not_fit_keeps_the_tensor(checkpoint, tmp_path, capsys):
    out = tmp_path / "out.safetensors"
    args = ["convert", str(checkpoint), "-o", str(out), "--to", "int8", "--keep", "none"]
    assert _cli.main([*args, "--scaling", "per-axis:1"]) == 0
    assert "kept 1: per-axis 1 does not fit shape [40]" in capsys.readouterr().out
    assert precision.load(out)["encoder.bias"].format == dtypes.float32


def test_include_and_exclude_copy_other_tensors_byte_for_byte(checkpoint, tmp_path, capsys):
    out = tmp_path / "out.safetensors"
    args = ["convert", str(checkpoint), "-o", str(out), "--to", "int2"]
    assert _cli.main([*args, "--include", r"^encoder\.", "--exclude", "bias$"]) == 0
    stdout = capsys.readouterr().out
    assert "converted 1 tensor(s) to int2" in stdout
    assert "kept 1: excluded" in stdout
    assert "kept 2: not included" in stdout  # head.weight and position_ids
    before, after = raw_arrays(checkpoint), raw_arrays(out)
    for name in ["encoder.bias", "head.weight", "position_ids"]:
        assert after[name].dtype == before[name].dtype
        assert after[name].tobytes() == before[name].tobytes()
    assert precision.load(out)["encoder.weight"].format == dtypes.int2


def test_summary_reports_bytes_and_worst_sqnr(checkpoint, tmp_path, capsys):
    out = tmp_path / "out.safetensors"
    assert _cli.main(["convert", str(checkpoint), "-o", str(out), "--to", "int4"]) == 0
    stdout = capsys.readouterr().out
    size_in, size_out = os.path.getsize(checkpoint), os.path.getsize(out)
    assert f"({size_out / size_in:.1%})" in stdout
    loaded = precision.load(out, as_arrays=True)
    expected = min(
        (sqnr_db(np.asarray(INPUT[n], np.float32), np.asarray(loaded[n])), n) for n in FLOATS
    )
    db, name = re.search(r"worst SQNR: (\S+) dB \((\S+)\)", stdout).groups()
    assert name == expected[1]
    assert float(db) == pytest.approx(expected[0], abs=0.01)


def test_stochastic_rounding_is_seeded(checkpoint, tmp_path):
    outs = [tmp_path / f"{i}.safetensors" for i in range(3)]
    for out, seed in zip(outs, ["1", "1", "2"], strict=True):
        args = ["convert", str(checkpoint), "-o", str(out), "--to", "int4"]
        assert _cli.main([*args, "--rounding", "stochastic", "--seed", seed, "-q"]) == 0
    a, b, c = (raw_arrays(o)["encoder.weight"] for o in outs)
    assert a.tobytes() == b.tobytes()
    assert a.tobytes() != c.tobytes()


def test_convert_onto_itself_needs_overwrite(checkpoint, tmp_path, capsys):
    path = tmp_path / "m.safetensors"
    path.write_bytes(checkpoint.read_bytes())
    assert _cli.main(["convert", str(path), "-o", str(path), "--to", "bf16"]) == 1
    assert "refusing to convert" in capsys.readouterr().err
    assert path.read_bytes() == checkpoint.read_bytes()
    assert _cli.main(["convert", str(path), "-o", str(path), "--to", "bf16", "--overwrite"]) == 0
    assert precision.load(path)["encoder.weight"].format == dtypes.bfloat16
    assert os.listdir(tmp_path) == ["m.safetensors"]


# --------------------------------------------------------------------------
# named encodings: MX, NVFP4, NF4, zero points


@pytest.mark.parametrize("name", ["mxfp4", "nvfp4", "nf4", "uint8"])
def test_convert_and_report_named_encodings(checkpoint, tmp_path, capsys, name):
    out = tmp_path / f"{name}.safetensors"
    argv = ["convert", str(checkpoint), "-o", str(out), "--to", name, "-q", "--keep", "none"]
    assert _cli.main(argv) == 0
    assert f"converted 3 tensor(s) to {name}" in capsys.readouterr().out
    fmt = dtypes.get(name)
    loaded = precision.load(out)
    for tensor in FLOATS:
        x = np.asarray(INPUT[tensor], np.float32)
        assert_encoded_like_library(loaded[tensor], x, fmt, preset_scaling(fmt, x.shape))
        in_memory = Tensor(x).to_reduced_precision(name, scaling=preset_scaling(fmt, x.shape))
        assert loaded[tensor].numpy().tobytes() == in_memory.numpy().tobytes()
    assert _cli.main(["report", str(checkpoint), str(out), "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    approx = precision.load(out, as_arrays=True)
    for tensor in FLOATS:
        x = np.asarray(INPUT[tensor], np.float32)
        rep = error_report(x, np.asarray(approx[tensor]))
        assert rows[tensor]["format"] == name
        assert rows[tensor]["sqnr_db"] == pytest.approx(rep.sqnr_db, rel=1e-12)
        scaling = preset_scaling(fmt, x.shape)
        assert rows[tensor]["bytes"] == fmt.nbytes(x.shape, scaling=scaling)  # codes, scales, zps


ENCODING_STREAMS = [  # (--to, --scaling, a tensor that streams)
    ("mxfp4", None, "d"),
    ("nvfp4", None, "a"),
    ("nf4", "per-block:16", "a"),
    ("uint4", None, "d"),
    ("uint8", "per-axis:0", "a"),
    ("uint4", "per-block:32:bf16", "d"),
]
# the inputs of STREAM_INPUT these need: streamed in several blocks, rows with a packed
# tail byte (whole), a scalar (kept)
ENCODING_STREAM_INPUT = {k: STREAM_INPUT[k] for k in ("a", "b", "d", "f")}


@pytest.fixture(scope="module")
def encoding_stream_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("stream") / "e.safetensors"
    safetensors.numpy.save_file(ENCODING_STREAM_INPUT, str(path))
    return path


@pytest.mark.parametrize(
    ("fmt", "flag", "streamed"), ENCODING_STREAMS, ids=[c[0] for c in ENCODING_STREAMS]
)
def test_named_encodings_stream_the_library_bytes(
    encoding_stream_checkpoint, tmp_path, monkeypatch, fmt, flag, streamed
):
    monkeypatch.setattr(_cli_modes, "_BLOCK", 64)
    blocks = []
    read = _cli_convert._Blocks.blocks
    monkeypatch.setattr(
        _cli_convert._Blocks,
        "blocks",
        lambda self, n, pad=False: blocks.append(self.name) or read(self, n, pad),
    )
    out = tmp_path / "out.safetensors"
    argv = ["convert", str(encoding_stream_checkpoint), "-o", str(out), "--to", fmt, "-q"]
    argv += ["--keep", "none", "--no-stats", *(["--scaling", flag] if flag else [])]
    assert _cli.main(argv) == 0
    assert streamed in blocks  # the block path really ran
    scaling = _cli_arguments._scaling(flag, dtypes.get(fmt))
    loaded = precision.load(out)
    for name, value in ENCODING_STREAM_INPUT.items():
        t = loaded[name]
        if t.format == dtypes.get(fmt):
            assert_encoded_like_library(t, np.asarray(value, np.float32), t.format, scaling)
        else:  # kept: the scaling does not fit (a scalar per block)
            assert t.format.name in ("float32", "bfloat16", "float16"), name


def test_dry_run_says_how_each_tensor_is_converted(checkpoint, capsys):
    assert _cli.main(["convert", str(checkpoint), "--to", "nvfp4", "--dry-run"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line}
    assert lines["head.weight"].endswith("absmax pass, then blocks")  # 32 values a row
    assert lines["encoder.weight"].endswith("whole tensor (blocks do not tile the rows)")
    argv = ["convert", str(checkpoint), "--to", "uint8", "--scaling", "per-tensor", "--dry-run"]
    assert _cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "whole tensor (one min/max scale for the tensor)" in out
    assert re.search(r"encoder\.bias .* kept \(--keep default\) +copied", out)


def _file_bytes(path) -> dict[str, bytes]:
    """Each array's bytes, located by the header (F8 dtypes included)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__")
    return {
        k: raw[8 + n + v["data_offsets"][0] : 8 + n + v["data_offsets"][1]]
        for k, v in header.items()
    }


def test_a_checkpoint_of_named_encodings_converts_and_copies(tmp_path, capsys):
    x = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)
    tree = {n: Tensor(x).to_reduced_precision(n) for n in ("mxfp4", "nvfp4", "uint4", "nf4")}
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    precision.save(src, tree)
    argv = ["convert", str(src), "-o", str(dst), "--to", "bf16", "--exclude", "^uint4$", "-q"]
    assert _cli.main(argv) == 0
    assert "converted 3 tensor(s) to bfloat16, kept 1 unchanged" in capsys.readouterr().out
    before, after = _file_bytes(src), _file_bytes(dst)
    for name in ("uint4", "uint4:scale", "uint4:zero_point"):  # copied byte for byte
        assert after[name] == before[name]
    loaded = precision.load(dst)
    for name in ("mxfp4", "nvfp4", "nf4"):  # decoded, then converted
        expected = Tensor(tree[name].numpy()).to_reduced_precision("bf16")
        assert loaded[name].numpy().tobytes() == expected.numpy().tobytes()
    # a copied tensor is checked as load checks it: a zero point past 15 is refused
    raw = bytearray(src.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    raw[8 + n + header["uint4:zero_point"]["data_offsets"][0]] = 16
    src.write_bytes(bytes(raw))
    argv = ["convert", str(src), "-o", str(dst), "--to", "bf16", "--include", "^mx", "--overwrite"]
    assert _cli.main(argv) == 1
    assert "zero point past the largest code" in capsys.readouterr().err


ENCODING_USAGE_ERRORS = {
    "nf4 rounding up": (["--to", "nf4", "--rounding", "up"], "rounds with nearest_even or"),
    "mx scales not pow2": (
        ["--to", "mxfp4", "--scaling", "per-block:64"],
        "write --scaling per-block:64:pow2 instead",
    ),
    "nf4 unscaled": (["--to", "nf4", "--scaling", "none"], "always needs a scaling"),
    "uint4 pow2": (
        ["--to", "uint4", "--scaling", "per-tensor:pow2"],
        "write --scaling per-tensor instead",
    ),
    "e8m0 scaled": (["--to", "float8_e8m0fnu", "--scaling", "per-tensor"], "scale format"),
    "nvfp4 pow2": (
        ["--to", "nvfp4", "--scaling", "per-block:16:pow2"],
        "not powers of two; write --scaling per-block:16 instead",
    ),
    "e8m0 scales not pow2": (
        ["--to", "int4", "--scaling", "per-block:32:e8m0"],
        "write --scaling per-block:32:pow2:e8m0 instead",
    ),
    "e4m3 scales on int4": (
        ["--to", "int4", "--scaling", "per-block:32:e4m3"],
        "write --scaling per-block:32:bf16 instead",
    ),
    "e8m0 scales on nf4": (
        ["--to", "nf4", "--scaling", "per-block:64:pow2:e8m0"],
        "write --scaling per-block:64:bf16 instead",
    ),
    "int8 is no scale format": (
        ["--to", "int4", "--scaling", "per-block:128:int8"],
        "'int8' names int8, which is not a scale format; end --scaling with a scale format",
    ),
    "unknown scale format": (
        ["--to", "int4", "--scaling", "per-block:128:bf17"],
        "'bf17' is not a format; end --scaling with a scale format: float32 (f32)",
    ),
    "per-axis past every axis": (
        ["--to", "int8", "--scaling", "per-axis:-999"],
        "axis -999 is past every tensor's axes",
    ),
    "scaled bf16 with bf16 scales": (
        ["--to", "bf16", "--scaling", "per-tensor:bf16"],
        "--to bfloat16 with --scaling per-tensor:bf16",
    ),
}


@pytest.mark.parametrize(
    ("argv", "message"), ENCODING_USAGE_ERRORS.values(), ids=ENCODING_USAGE_ERRORS.keys()
)
def test_bad_encoding_combinations_are_usage_errors(capsys, argv, message):
    assert _cli.main(["convert", "IN", "-o", "OUT", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("precision convert: error: --"), err
    assert message in err, err
    assert err.count("\n") == 1
    # hints in the command line's spelling, never the Python API's
    assert not re.search(r"Per(Tensor|Axis|Block)\(|power_of_two=|scale_format=|dtypes\.", err)


# --------------------------------------------------------------------------
# report


def test_report_json_matches_error_report(checkpoint, tmp_path, capsys):
    out = tmp_path / "int8.safetensors"
    argv = ["convert", str(checkpoint), "-o", str(out), "--to", "int8", "-q", "--keep", "none"]
    assert _cli.main(argv) == 0
    capsys.readouterr()
    assert _cli.main(["report", str(checkpoint), str(out), "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == set(FLOATS)
    approx = precision.load(out, as_arrays=True)
    with safe_open(str(out), framework="numpy") as f:
        sizes = {n: f.get_slice(n).get_shape() for n in f.keys()}
    for name in FLOATS:
        rep = error_report(np.asarray(INPUT[name], np.float32), np.asarray(approx[name]))
        row = rows[name]
        assert row["format"] == "int8"
        assert row["max_rel_error"] == rep.max_rel_error
        assert row["mean_rel_error"] == pytest.approx(rep.mean_rel_error, rel=1e-12)
        assert row["max_abs_error"] == rep.max_abs_error
        assert row["sqnr_db"] == pytest.approx(rep.sqnr_db, rel=1e-12)
        ref = np.asarray(INPUT[name], np.float64)
        expected = rep.max_abs_error / np.max(np.abs(ref))
        assert row["max_error_over_absmax"] == pytest.approx(expected, rel=1e-12)
        codes = int(np.prod(sizes[name]))
        assert row["bytes"] == codes + 4 * int(np.prod(sizes[name + ":scale"]))


def test_report_totals_bytes_by_format_as_explain_words_them(checkpoint, tmp_path, capsys):
    out = tmp_path / "int8.safetensors"
    argv = ["convert", str(checkpoint), "-o", str(out), "--to", "int8", "-q", "--keep", "none"]
    assert _cli.main(argv) == 0
    capsys.readouterr()
    assert _cli.main(["report", str(checkpoint), str(out)]) == 0
    stdout = capsys.readouterr().out
    # the bytes read from the file itself: codes plus float32 scales of every float tensor
    with safe_open(str(out), framework="numpy") as f:
        arrays = {n: f.get_tensor(n) for n in f.keys()}
    held = sum(arrays[n].nbytes + arrays[n + ":scale"].nbytes for n in FLOATS)
    values = sum(INPUT[n].size for n in FLOATS)
    assert (
        f"parameters: {held:,} B held (as float32 {4 * values:,} B, as bfloat16 "
        f"{2 * values:,} B): int8 {held:,} B (3 tensors)"
    ) in stdout
    assert f"reads {held / (2 * values):.2f}x the bytes of bfloat16" in stdout
    assert f"predicted {2 * values / held:.2f}x faster" in stdout


def test_report_table_and_plot(checkpoint, tmp_path):
    out = tmp_path / "bf16.safetensors"
    png = tmp_path / "errors.png"
    assert run("convert", str(checkpoint), "-o", str(out), "--to", "bf16", "-q").returncode == 0
    result = run("report", str(checkpoint), str(out), "--plot", str(png))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = "tensor format size SQNR dB max err/absmax mean abs err NaN/inf"
    assert lines[0].split() == header.split()
    table = {line.split()[0]: line.split() for line in lines[2:4]}
    assert set(table) == {"encoder.weight", "encoder.bias"}  # head.weight unchanged: not listed
    assert table["encoder.weight"][1] == "bfloat16"
    assert table["encoder.weight"][2:4] == [str(6 * 40 * 2), "B"]
    assert "1 unchanged tensor(s) not listed" in result.stdout
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(png)[..., :3]
    assert image.shape[0] > 100
    assert image.shape[1] > 100
    _check_plot(image, [float(table[n][4]) for n in ("encoder.weight", "encoder.bias")])


def _pixels(image, rgb):
    """Where `image` has the colour `rgb` (0..255), anti-aliased edges left out."""
    return np.all(np.abs(image - np.array(rgb) / 255) < 0.02, axis=-1)


def _check_plot(image, sqnrs):
    """The plot draws what the table says: left, one bar per changed tensor, worst on
    top, each as long as its SQNR (the bars start at 0 dB, so their lengths are in the
    ratio of the SQNRs); right, each tensor's error histogram and the grey mean."""
    half = image.shape[1] // 2
    left, right = image[:, :half], image[:, half:]
    blue, orange, grey = (31, 119, 180), (255, 127, 14), (217, 217, 217)  # tab10 0, 1; 0.85
    rows = np.flatnonzero(_pixels(left, blue).sum(axis=1) > 20)
    assert rows.size, "no bar drawn"
    bars = np.split(rows, np.flatnonzero(np.diff(rows) > 1) + 1)  # runs of rows
    assert len(bars) == 2, [(b[0], b[-1]) for b in bars]
    lengths = [_pixels(left[bar[len(bar) // 2]], blue).sum() for bar in bars]  # top first
    starts = [np.argmax(_pixels(left[bar[len(bar) // 2]], blue)) for bar in bars]
    assert abs(int(starts[0]) - int(starts[1])) <= 1  # both bars start at 0 dB
    worst_first = sorted(sqnrs)
    assert lengths[0] / lengths[1] == pytest.approx(worst_first[0] / worst_first[1], abs=0.01)
    assert lengths[0] > 0.5 * half  # the longest SQNR spans most of its panel
    # the histogram panel: two step lines (blue, dashed orange) over a grey mean
    assert _pixels(right, blue).sum() > 300
    assert _pixels(right, orange).sum() > 300
    assert _pixels(right, grey).sum() > 5000


def test_report_counts_nan_and_inf_and_a_lost_value_makes_sqnr_minus_inf(tmp_path, capsys):
    ref = np.linspace(-1, 1, 64, dtype=np.float32)
    ref[5] = np.nan  # NaN in both: kept, not an error
    lost = ref.copy()
    lost[[9, 20, 30]] = [np.nan, np.inf, -np.inf]  # finite in REF, not in OTHER
    a, b = tmp_path / "ref.safetensors", tmp_path / "other.safetensors"
    safetensors.numpy.save_file({"kept": ref, "lost": lost}, str(a))
    safetensors.numpy.save_file({"kept": ref, "lost": ref}, str(b))
    assert _cli.main(["report", str(b), str(a), "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert (rows["kept"]["nonfinite"], rows["kept"]["nonfinite_changed"]) == (1, 0)
    assert rows["kept"]["sqnr_db"] == math.inf
    assert (rows["lost"]["nonfinite"], rows["lost"]["nonfinite_changed"]) == (4, 3)
    assert rows["lost"]["sqnr_db"] == -math.inf
    # a lost value is an unbounded error, never "max err 0" or "100% exact"
    for key in ("max_abs_error", "mean_abs_error", "max_rel_error", "max_error_over_absmax"):
        assert rows["lost"][key] == math.inf, key
    assert rows["lost"]["exact_fraction"] == 60 / 63  # 63 compared; 3 lost
    assert rows["kept"]["max_abs_error"] == 0
    assert rows["kept"]["exact_fraction"] == 1.0
    assert _cli.main(["report", str(b), str(a), "--all"]) == 0
    out = capsys.readouterr().out
    table = {line.split()[0]: line for line in out.splitlines()[2:4]}
    assert table["lost"].endswith("4 (3 new)")
    assert table["kept"].rstrip().endswith(" 1")
    assert "3 value(s) in 1 tensor(s) are NaN or inf in OTHER" in out


def test_report_shape_mismatch_is_a_data_error(checkpoint, tmp_path, capsys):
    other = tmp_path / "other.safetensors"
    precision.save(other, {"encoder.weight": np.zeros((40, 6), np.float32)})
    assert _cli.main(["report", str(checkpoint), str(other)]) == 1
    err = capsys.readouterr().err
    assert "'encoder.weight' has shape [6, 40] in REF but [40, 6] in OTHER" in err


# --------------------------------------------------------------------------
# errors: exit codes and one-line messages

USAGE_ERRORS = {
    "no command": [],
    "unknown command": ["frobnicate"],
    "unknown format": ["convert", "IN", "-o", "OUT", "--to", "float7"],
    "bad scaling": ["convert", "IN", "-o", "OUT", "--to", "int8", "--scaling", "per-row"],
    "bad block": ["convert", "IN", "-o", "OUT", "--to", "int8", "--scaling", "per-block:x"],
    "scales before pow2": [
        "convert",
        "IN",
        "-o",
        "OUT",
        "--to",
        "int8",
        "--scaling",
        "per-block:32:e8m0:pow2",
    ],
    "scaled none": ["convert", "IN", "-o", "OUT", "--to", "int8", "--scaling", "none:bf16"],
    "bad regex": ["convert", "IN", "-o", "OUT", "--to", "int8", "--exclude", "("],
    "bad rounding": ["convert", "IN", "-o", "OUT", "--to", "int8", "--rounding", "random"],
    "missing output": ["convert", "IN", "--to", "int8"],
    "int unscaled": ["convert", "IN", "-o", "OUT", "--to", "int8", "--scaling", "none"],
    "bf16 scaled": ["convert", "IN", "-o", "OUT", "--to", "bf16", "--scaling", "per-tensor"],
    "report one file": ["report", "A"],
}


@pytest.mark.parametrize("argv", USAGE_ERRORS.values(), ids=USAGE_ERRORS.keys())
def test_usage_errors_exit_2(capsys, argv):
    assert _cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "error:" in err
    assert "Traceback" not in err


def test_usage_error_in_a_subprocess():
    result = run("convert", "in.safetensors", "-o", "out.safetensors", "--to", "float7")
    assert result.returncode == 2
    assert "unknown format 'float7'" in result.stderr
    assert "Traceback" not in result.stderr


def _data_error_cases(tmp_path, checkpoint):
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(checkpoint.read_bytes()[:100])
    existing = tmp_path / "existing.safetensors"
    existing.write_bytes(b"keep me")
    nan_input = tmp_path / "nan.safetensors"
    safetensors.numpy.save_file({"w": np.array([1.0, np.nan], np.float32)}, str(nan_input))
    inf_input = tmp_path / "inf.safetensors"
    safetensors.numpy.save_file({"w": np.array([np.inf, 1.0], np.float32)}, str(inf_input))
    npz, npy = tmp_path / "arrays.npz", tmp_path / "array.npy"
    np.savez(npz, w=np.ones(3, np.float32))
    np.save(npy, np.ones(3, np.float32))
    ggml = tmp_path / "model.gguf"
    ggml.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(64))
    out = str(tmp_path / "out.safetensors")
    return {
        "missing input": (["convert", str(tmp_path / "absent"), "-o", out, "--to", "int8"],
                          "No such file or directory"),
        "corrupt input": (["convert", str(corrupt), "-o", out, "--to", "int8"], "truncated"),
        "output exists": (["convert", str(checkpoint), "-o", str(existing), "--to", "int8"],
                          "already exists; pass --overwrite"),
        # the missing input is named first, not the existing output
        "missing input, output exists": (
            ["convert", str(tmp_path / "absent"), "-o", str(existing), "--to", "int8"],
            "No such file or directory: '" + str(tmp_path / "absent")),
        "nan in scaled": (["convert", str(nan_input), "-o", out, "--to", "int8"],
                          "tensor 'w' holds NaN or inf"),
        "nan in fp4": (["convert", str(nan_input), "-o", out, "--to", "float4_e2m1fn"],
                       "neither inf nor NaN"),
        "inf in fp6": (["convert", str(inf_input), "-o", out, "--to", "float6_e3m2fn"],
                       "neither inf nor NaN"),
        "zero in e8m0": (["convert", str(checkpoint), "-o", out, "--to", "float8_e8m0fnu"],
                         "positive powers of two"),
        "report corrupt": (["report", str(checkpoint), str(corrupt)], "truncated"),
        "not safetensors": (["report", str(existing), str(checkpoint)], "not a safetensors file"),
        # the formats most often mistaken for it are named, with the conversion to run
        "npz input": (["convert", str(npz), "-o", out, "--to", "bf16"],
                      "not a safetensors file but a zip archive: a numpy .npz"),
        "npy input": (["convert", str(npy), "-o", out, "--to", "bf16"],
                      "but a numpy .npy array. Save it as safetensors first"),
        "gguf input": (["convert", str(ggml), "-o", out, "--to", "bf16"],
                       "a GGUF file (llama.cpp's): precision.load and `precision report` read it"),
    }  # fmt: skip


def test_data_errors_exit_1_with_one_line(tmp_path, checkpoint, capsys):
    for name, (argv, message) in _data_error_cases(tmp_path, checkpoint).items():
        assert _cli.main(argv) == 1, name
        err = capsys.readouterr().err
        assert err.startswith("precision: error: "), name
        assert message in err, (name, err)
        assert err.count("\n") == 1, name
    assert (tmp_path / "existing.safetensors").read_bytes() == b"keep me"
    assert not (tmp_path / "out.safetensors").exists()


def test_data_error_in_a_subprocess(tmp_path):
    result = run("report", str(tmp_path / "a"), str(tmp_path / "b"))
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert "No such file or directory" in result.stderr


def test_a_copied_tensor_with_an_impossible_code_is_refused(tmp_path, capsys):
    # an int8 tensor kept as it is (not selected) is still checked, as load would
    x = np.random.default_rng(4).normal(size=(16, 16)).astype(np.float32)
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    precision.save(src, {"w": Tensor(x).to_reduced_precision("int8"), "b": x[0]})
    raw = bytearray(src.read_bytes())
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    raw[8 + int.from_bytes(raw[:8], "little") + header["w"]["data_offsets"][0]] = 0x80  # -128
    src.write_bytes(bytes(raw))
    assert _cli.main(["convert", str(src), "-o", str(dst), "--to", "bf16", "--include", "^b$"]) == 1
    assert "-128" in capsys.readouterr().err
    assert not dst.exists()


@pytest.mark.parametrize("magnitude", [1e-30, 1e-3, 1.0, 1e25])
def test_cast_sqnr_right_where_float32_squares_underflow_or_overflow(tmp_path, capsys, magnitude):
    """The statistics of a cast are float32 dot products, summed again in float64 where a
    square underflows or overflows: the reported SQNR equals a float64 reference."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((300, 70)) * magnitude).astype(np.float32)
    src, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    safetensors.numpy.save_file({"w": x}, str(src))
    assert _cli.main(["convert", str(src), "-o", str(out), "--to", "bf16", "--keep", "none"]) == 0
    db = float(re.search(r"worst SQNR: (\S+) dB", capsys.readouterr().out).group(1))
    x64 = x.astype(np.float64)
    y64 = x.astype(ml_dtypes.bfloat16).astype(np.float64)
    expected = 10 * np.log10(np.sum(x64 * x64) / np.sum((x64 - y64) ** 2))
    assert db == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize(
    "dtype",
    [np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2],
)
def test_cast_statistics_widen_every_code_exactly(dtype):
    """The statistics widen cast blocks by table lookup: every bit pattern gives the bits
    numpy's or ml_dtypes' own cast gives (NaN payloads included)."""
    itemsize = np.dtype(dtype).itemsize
    codes = np.arange(1 << (8 * itemsize), dtype=f"u{itemsize}").view(dtype)
    with np.errstate(all="ignore"):
        expected = codes.astype(np.float32)
    got = _cli_convert._widened(codes)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize(
    ("to", "loads_jax"),
    [
        ("bf16", False),
        ("fp16", False),
        ("int8:per-tensor", False),
        ("int8", False),
        ("int8:per-axis:0:fp16", True),
        ("int4", True),
    ],
)
def test_numpy_conversions_never_import_jax(checkpoint, tmp_path, to, loads_jax):
    # Casts and int8 per tensor or per channel (the default) run in numpy: no JAX, a
    # fraction of the start. A compiled encode (float16 scales, per-block int4) imports it.
    out = tmp_path / "out.safetensors"
    to, _, scaling = to.partition(":")
    flags = [to, "-q"] + (["--scaling", scaling] if scaling else [])
    code = (
        "import sys\n"
        "from precision._cli._main import main\n"
        f"rc = main(['convert', {str(checkpoint)!r}, '-o', {str(out)!r}, '--to', *{flags!r}])\n"
        "print(rc, 'jax' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-2:] == ["0", str(loads_jax)]
    assert set(raw_arrays(out)) >= set(FLOATS)


def test_every_tensor_holding_nan_is_named_with_the_exclude_that_keeps_them(tmp_path, capsys):
    src = tmp_path / "m.safetensors"
    a = np.ones((4, 64), np.float32)
    bad = {name: a.copy() for name in ("b.weight", "c.weight", "d.weight")}
    bad["b.weight"][1, 2], bad["c.weight"][0, 0], bad["d.weight"][3, 3] = np.nan, np.inf, -np.inf
    safetensors.numpy.save_file({"a.weight": a, **bad}, str(src))
    out = tmp_path / "o.safetensors"
    assert _cli.main(["convert", str(src), "-o", str(out), "--to", "int8"]) == 1
    err = capsys.readouterr().err
    assert "tensor 'b.weight' holds NaN or inf" in err
    assert "so do 'c.weight', 'd.weight'" in err
    pattern = re.search(r"--exclude '([^']*)' keeps all 3", err).group(1)
    assert not out.exists()
    argv = ["convert", str(src), "-o", str(out), "--to", "int8", "--exclude", pattern]
    assert _cli.main(argv) == 0
    assert "kept 3: excluded (--exclude)" in capsys.readouterr().out
