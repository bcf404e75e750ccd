"""`precision convert`'s arguments as a user types them: defaults that survive an
outlier, presets, and mistakes answered with what was meant.

The int8 default is checked against codes computed here in numpy from the
documented recipe (a scale per output channel: `absmax / 127` per row), not
against the library's encode.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import safetensors.numpy

import dtypes
import precision
from precision import _cli
from precision._cli._presets import PRESETS

RNG = np.random.default_rng(7)


@pytest.fixture(scope="module")
def outlier(tmp_path_factory):
    """A (64, 96) weight with one outlier 400x the others, and a bias."""
    w = RNG.standard_normal((64, 96)).astype(np.float32)
    w[5, 17] = 400.0
    b = RNG.standard_normal(96).astype(np.float32)
    path = tmp_path_factory.mktemp("args") / "model.safetensors"
    safetensors.numpy.save_file({"layer.weight": w, "layer.scale_vector": b}, str(path))
    return path, w, b


def sqnr_db(x: np.ndarray, y: np.ndarray) -> float:
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    return float(10 * np.log10(np.sum(x64**2) / np.sum((x64 - y64) ** 2)))


def rowwise_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes and scales of int8 with one scale per row, as documented (nearest even)."""
    absmax = np.max(np.abs(w), axis=1, keepdims=True)
    codes = np.clip(np.rint(w * (np.float32(127) / absmax)), -127, 127).astype(np.int8)
    return codes, absmax / np.float32(127)


def test_int8_defaults_to_a_scale_per_output_channel(outlier, tmp_path, capsys):
    path, w, b = outlier
    out = tmp_path / "int8.safetensors"
    assert _cli.main(["convert", str(path), "-o", str(out), "--to", "int8", "-q"]) == 0
    assert "per-axis 0" in capsys.readouterr().out
    t = precision.load(out)["layer.weight"]
    assert t.encoded.scaling == dtypes.PerAxis(0)
    codes, scales = rowwise_int8(w)
    np.testing.assert_array_equal(np.asarray(t.encoded.data), codes)
    np.testing.assert_array_equal(np.asarray(t.encoded.scale), scales)
    # one outlier costs its own row, not the tensor: per tensor, the other rows would
    # keep almost nothing (most of their codes 0)
    decoded = np.asarray(t.to_full_precision().numpy())
    rest = np.arange(64) != 5
    assert sqnr_db(w[rest], decoded[rest]) > 38
    per_tensor = np.clip(np.rint(w * (127 / np.float32(400))), -127, 127) * (400 / 127)
    assert sqnr_db(w[rest], per_tensor[rest]) < 3
    # a tensor of one axis (a scale per value would outweigh it) is scaled per tensor
    v = precision.load(out)["layer.scale_vector"]
    assert v.encoded.scaling == dtypes.PerTensor()
    assert v.nbytes == b.size + 4


def test_presets_are_their_flags(outlier, tmp_path, capsys):
    path, _, _ = outlier
    for name, preset in PRESETS.items():
        by_name, by_flags = tmp_path / f"{name}.safetensors", tmp_path / f"{name}-f.safetensors"
        assert _cli.main(["convert", str(path), "-o", str(by_name), "--preset", name, "-q"]) == 0
        flags = ["--to", preset.to, "-q"]
        if preset.scaling is not None:  # (a named encoding such as mxfp4 has its own)
            flags += ["--scaling", preset.scaling]
        assert _cli.main(["convert", str(path), "-o", str(by_flags), *flags]) == 0
        a, b = precision.load(by_name), precision.load(by_flags)
        for tensor in a:
            assert a[tensor].format == b[tensor].format == dtypes.get(preset.to)
            assert a[tensor].numpy().tobytes() == b[tensor].numpy().tobytes()
    capsys.readouterr()
    assert _cli.main(["convert", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for name, preset in PRESETS.items():  # --help says what each one is
        scaling = "" if preset.scaling is None else f" --scaling {preset.scaling}"
        assert f"{name} (--to {preset.to}{scaling}:" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preset", "w4-g128", "--to", "int8"], "--preset w4-g128 already sets --to int4"),
        (["--preset", "w8-channel", "--scaling", "per-tensor"], "drop --scaling per-tensor"),
        (["--preset", "w4"], "invalid choice: 'w4'"),
        ([], "required: --to (or --preset: w8-channel, w4-g128, fp8-tensor, q8_0, q4_0, mxfp4)"),
        (["--to", "in8"], "unknown format 'in8' (did you mean 'int8'"),
        (["--to", "floot6"], "or name any float layout as floatBITS_eEmM"),
        (["--to", "int8", "--sclaing", "per-block:32"], "--sclaing: did you mean --scaling?"),
        (["--to", "int8", "--dryrun"], "--dryrun: did you mean --dry-run?"),
    ],
)
def test_mistakes_are_answered_with_what_was_meant(outlier, capsys, argv, message):
    path, _, _ = outlier
    assert _cli.main(["convert", str(path), "-o", "unused.safetensors", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("precision convert: error: "), err
    assert message in err, err
    assert err.count("\n") == 1
    assert "dtypes." not in err  # the command line's words, not Python's


def test_an_unknown_option_of_another_command_names_that_command(capsys):
    assert _cli.main(["report", "a", "b", "--sotr", "name"]) == 2
    err = capsys.readouterr().err
    assert "--sotr: did you mean --sort?" in err
    assert "(see 'precision report --help')" in err


def test_list_keep_needs_nothing_else(capsys):
    assert _cli.main(["convert", "--list-keep"]) == 0
    assert capsys.readouterr().out.strip() == precision.KEEP


def test_a_missing_input_is_a_usage_error(capsys):
    assert _cli.main(["convert", "--to", "int8", "--dry-run"]) == 2
    assert "required: IN" in capsys.readouterr().err


def test_a_reader_that_stops_early_is_no_error(tmp_path):
    # `precision convert IN --dry-run | head -1`: the table is larger than a pipe holds,
    # head leaves after one line, and the command ends quietly with status 0
    path = tmp_path / "many.safetensors"
    tensors = {f"layers.{i}.weight": np.ones((4, 4), np.float32) for i in range(3000)}
    safetensors.numpy.save_file(tensors, str(path))
    argv = [sys.executable, "-m", "precision", "convert", str(path), "--to", "int4", "--dry-run"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline().split()[0] == b"tensor"
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert err == b""
    assert proc.returncode == 0
